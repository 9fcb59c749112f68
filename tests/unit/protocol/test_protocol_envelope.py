"""Envelopes: exact signed-bytes layout, seal/open round trip, and what open_envelope refuses."""
from __future__ import annotations

import struct

import pytest

from proto import swarm_pb2
from protocol.envelope import PROTOCOL_VERSION, open_envelope, seal, signed_bytes
from protocol.errors import Reason, Rejected
from protocol.identity import NodeIdentity
from protocol.kinds import Kind
from protocol.limits import Limits
from protocol.testing import forge, make_hint, make_rollout_group, raw_envelope, tamper_body, with_fields

ALICE = NodeIdentity.generate()
MALLORY = NodeIdentity.generate()
LIMITS = Limits()


def sealed_group(identity=ALICE, sequence=1, timestamp_ms=1_700_000_000_000) -> bytes:
    return seal(identity, Kind.ROLLOUT_GROUP, make_rollout_group().SerializeToString(), sequence, timestamp_ms)


def reason_of(raw: bytes, limits: Limits = LIMITS) -> Reason:
    with pytest.raises(Rejected) as caught:
        open_envelope(raw, limits)
    return caught.value.reason


def test_signed_bytes_layout_is_exactly_as_documented():
    key = bytes(range(32))
    got = signed_bytes(Kind.HINT, 1, key, 0x0102030405060708, 0x1112131415161718, b"BODY")
    expected = (
        b"swarm-node/v1/HINT\0"
        + b"\x00\x00\x00\x01"
        + key
        + bytes.fromhex("0102030405060708")
        + bytes.fromhex("1112131415161718")
        + struct.pack(">Q", 4)
        + b"BODY"
    )
    assert got == expected
    # Domain separation: the same header and body under another kind signs different bytes.
    assert signed_bytes(Kind.HINT_REQUEST, 1, key, 1, 1, b"B") != signed_bytes(Kind.HINT, 1, key, 1, 1, b"B")


def test_seal_open_round_trip():
    group = make_rollout_group()
    raw = seal(ALICE, Kind.ROLLOUT_GROUP, group.SerializeToString(), 42, 1_700_000_000_123)
    envelope, body = open_envelope(raw, LIMITS)
    assert body == group
    assert (envelope.protocol_version, envelope.kind, envelope.sequence, envelope.timestamp_ms) == (
        PROTOCOL_VERSION, Kind.ROLLOUT_GROUP, 42, 1_700_000_000_123,
    )
    assert envelope.sender_public_key == ALICE.public_key_bytes
    _, hint = open_envelope(seal(ALICE, Kind.HINT, make_hint().SerializeToString(), 43, 1), LIMITS)
    assert isinstance(hint, swarm_pb2.Hint) and hint.text == make_hint().text


def test_forged_signature_claiming_another_sender_is_refused():
    assert reason_of(forge(sealed_group(), claimed=ALICE, signer=MALLORY)) == Reason.BAD_SIGNATURE


def test_any_tampering_with_signed_fields_is_refused():
    raw = sealed_group()
    assert reason_of(tamper_body(raw)) == Reason.BAD_SIGNATURE
    assert reason_of(with_fields(raw, sequence=2)) == Reason.BAD_SIGNATURE
    assert reason_of(with_fields(raw, timestamp_ms=1)) == Reason.BAD_SIGNATURE
    assert reason_of(with_fields(raw, sender_public_key=MALLORY.public_key_bytes)) == Reason.BAD_SIGNATURE
    assert reason_of(with_fields(raw, kind=Kind.HINT)) == Reason.BAD_SIGNATURE  # kind is signed


def test_structural_rejections():
    raw = sealed_group()
    assert reason_of(raw, Limits(max_message_bytes=len(raw) - 1)) == Reason.OVERSIZED
    assert reason_of(b"\xff\xff\xff\xff") == Reason.MALFORMED
    assert reason_of(with_fields(raw, protocol_version=2)) == Reason.VERSION
    assert reason_of(with_fields(raw, kind=99)) == Reason.UNKNOWN_KIND
    assert reason_of(with_fields(raw, kind=0)) == Reason.UNKNOWN_KIND
    assert reason_of(with_fields(raw, sender_public_key=b"\x01" * 31)) == Reason.MALFORMED
    assert reason_of(with_fields(raw, signature=b"\x01" * 63)) == Reason.MALFORMED
    assert reason_of(b"") == Reason.VERSION  # an empty Envelope decodes to all defaults


def test_body_is_decoded_only_after_the_signature_verifies():
    garbage_body = b"\x0a\xff\xff"  # not a valid RolloutGroup
    unsigned = raw_envelope(ALICE, Kind.ROLLOUT_GROUP, garbage_body, 1, 1)
    assert reason_of(with_fields(unsigned, signature=b"\x00" * 64)) == Reason.BAD_SIGNATURE
    # Signed by its sender, the same garbage is the sender's schema error.
    assert reason_of(unsigned) == Reason.SCHEMA


def test_invalid_utf8_in_a_signed_body_is_a_schema_error():
    body = swarm_pb2.Hint(text="x").SerializeToString().replace(b"x", b"\xff")
    assert reason_of(seal(ALICE, Kind.HINT, body, 1, 1)) == Reason.SCHEMA


def test_seal_rejects_out_of_range_header_values():
    with pytest.raises(ValueError):
        seal(ALICE, Kind.HINT, b"", -1, 0)
    with pytest.raises(ValueError):
        seal(ALICE, Kind.HINT, b"", 0, 1 << 64)
