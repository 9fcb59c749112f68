"""Signed envelopes: `seal` on the way out, `open_envelope` on the way in.

Signed bytes (what the Ed25519 signature covers), exactly:

    b"swarm-node/v1/" + KIND_NAME + b"\\0"      KIND_NAME = Kind member name in ASCII, e.g. b"ROLLOUT_GROUP"
    + protocol_version   4 bytes, big-endian unsigned
    + sender_public_key  32 bytes, raw Ed25519
    + sequence           8 bytes, big-endian unsigned
    + timestamp_ms       8 bytes, big-endian unsigned
    + len(body)          8 bytes, big-endian unsigned
    + body               the serialized body message

Why not sign the serialized Envelope: protobuf encoding is not canonical (field order, repeated
or unknown fields), so a signature over it could not be checked after re-encoding. This layout is
fixed-width after the NUL-terminated domain prefix, so no two different header/body combinations
give the same bytes; the prefix makes a signature for one kind (or for anything else the key
might ever sign, e.g. libp2p's own records, which use other prefixes) useless as another.

`open_envelope` checks size, structure, version and kind, verifies the signature and ONLY THEN
decodes the body, so no protobuf parsing of attacker-chosen body bytes happens before the sender
is authenticated. It does not check freshness, replay or limits beyond size: that is the Ingress.
"""
from __future__ import annotations

import struct

from google.protobuf.message import DecodeError, Message

from proto import swarm_pb2

from .errors import Reason, Rejected
from .identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, NodeIdentity, verify_signature
from .kinds import KIND_SPECS, Kind
from .limits import Limits

PROTOCOL_VERSION = 1
DOMAIN_PREFIX = b"swarm-node/v1/"
_HEADER = struct.Struct(">I32sQQQ")  # version, public key, sequence, timestamp_ms, body length
_UINT64_MAX = (1 << 64) - 1
_KIND_PREFIX = {kind: DOMAIN_PREFIX + kind.name.encode("ascii") + b"\0" for kind in Kind}


def signed_bytes(
    kind: Kind, protocol_version: int, sender_public_key: bytes, sequence: int, timestamp_ms: int, body: bytes
) -> bytes:
    """The exact bytes the signature covers (layout in the module docstring)."""
    if len(sender_public_key) != PUBLIC_KEY_BYTES:  # struct's "32s" would pad or cut silently
        raise ValueError(f"sender_public_key must be {PUBLIC_KEY_BYTES} bytes, got {len(sender_public_key)}")
    header = _HEADER.pack(protocol_version, sender_public_key, sequence, timestamp_ms, len(body))
    return _KIND_PREFIX[Kind(kind)] + header + body


def seal(identity: NodeIdentity, kind: Kind, body: bytes, sequence: int, timestamp_ms: int) -> bytes:
    """A serialized, signed Envelope carrying `body` (the serialized body message of `kind`)."""
    kind = Kind(kind)
    if not 0 <= sequence <= _UINT64_MAX or not 0 <= timestamp_ms <= _UINT64_MAX:
        raise ValueError("sequence and timestamp_ms must fit in uint64")
    body = bytes(body)
    public_key = identity.public_key_bytes
    signature = identity.sign(signed_bytes(kind, PROTOCOL_VERSION, public_key, sequence, timestamp_ms, body))
    envelope = swarm_pb2.Envelope(
        protocol_version=PROTOCOL_VERSION,
        kind=int(kind),
        sender_public_key=public_key,
        sequence=sequence,
        timestamp_ms=timestamp_ms,
        body=body,
        signature=signature,
    )
    return envelope.SerializeToString()


def decode_envelope(raw: bytes, limits: Limits) -> swarm_pb2.Envelope:
    """Structural checks only: size, protobuf, version, kind, key and signature lengths."""
    if len(raw) > limits.max_message_bytes:
        raise Rejected(Reason.OVERSIZED, f"{len(raw)} bytes > {limits.max_message_bytes}")
    envelope = swarm_pb2.Envelope()
    try:
        envelope.ParseFromString(raw)
    except (DecodeError, ValueError, TypeError) as exc:
        raise Rejected(Reason.MALFORMED, f"not an Envelope: {exc}") from None
    if envelope.protocol_version != PROTOCOL_VERSION:
        raise Rejected(Reason.VERSION, f"protocol_version {envelope.protocol_version}, we speak {PROTOCOL_VERSION}")
    if envelope.kind not in _KIND_PREFIX:
        raise Rejected(Reason.UNKNOWN_KIND, f"kind {envelope.kind}")
    if len(envelope.sender_public_key) != PUBLIC_KEY_BYTES:
        raise Rejected(Reason.MALFORMED, f"sender_public_key has {len(envelope.sender_public_key)} bytes")
    if len(envelope.signature) != SIGNATURE_BYTES:
        raise Rejected(Reason.MALFORMED, f"signature has {len(envelope.signature)} bytes")
    return envelope


def envelope_signed_bytes(envelope: swarm_pb2.Envelope) -> bytes:
    return signed_bytes(
        Kind(envelope.kind),
        envelope.protocol_version,
        envelope.sender_public_key,
        envelope.sequence,
        envelope.timestamp_ms,
        envelope.body,
    )


def verify_envelope(envelope: swarm_pb2.Envelope) -> None:
    if not verify_signature(envelope.sender_public_key, envelope.signature, envelope_signed_bytes(envelope)):
        raise Rejected(Reason.BAD_SIGNATURE, "signature does not verify for sender_public_key")


def decode_body(envelope: swarm_pb2.Envelope) -> Message:
    """The body as its kind's message type (call only after verify_envelope)."""
    body = KIND_SPECS[Kind(envelope.kind)].body_type()
    try:
        body.ParseFromString(envelope.body)
    except (DecodeError, ValueError, TypeError) as exc:  # e.g. invalid UTF-8 in a string field
        raise Rejected(Reason.SCHEMA, f"body is not a valid {type(body).__name__}: {exc}") from None
    return body


def open_envelope(raw: bytes, limits: Limits) -> tuple[swarm_pb2.Envelope, Message]:
    """Decodes and authenticates `raw`; returns (envelope, decoded body). Raises Rejected."""
    envelope = decode_envelope(raw, limits)
    verify_envelope(envelope)
    return envelope, decode_body(envelope)
