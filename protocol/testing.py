"""Builders of valid and hostile messages, for tests and the testnet's adversarial peers.

Nothing here is used on a real node's message path.
"""
from __future__ import annotations

import random

from proto import swarm_pb2

from .envelope import PROTOCOL_VERSION, seal, signed_bytes
from .identity import NodeIdentity
from .kinds import Kind, kind_of


def make_task_ref(index: int = 0) -> swarm_pb2.TaskRef:
    return swarm_pb2.TaskRef(source="synthetic", dataset="add", config_digest="0123456789abcdef", seed=7, index=index)


def make_completion(n_tokens: int = 64, *, seed: int = 0, chars_per_token: int = 4) -> swarm_pb2.Completion:
    """A consistent completion: text, token ids, log-probs <= 0 and monotone char offsets."""
    rng = random.Random(seed)
    pieces = ["".join(rng.choice("abcdefghij 0123456789+=") for _ in range(chars_per_token)) for _ in range(n_tokens)]
    offsets: list[int] = []
    position = 0
    for piece in pieces:
        offsets += [position, position + len(piece)]
        position += len(piece)
    return swarm_pb2.Completion(
        text="".join(pieces),
        token_ids=[rng.randrange(50_000) for _ in range(n_tokens)],
        behavior_logprobs=[-rng.random() * 5 for _ in range(n_tokens)],
        char_offsets=offsets,
        claimed_reward=float(rng.random() < 0.5),
        truncated=False,
    )


def make_rollout_group(n_completions: int = 8, n_tokens: int = 64, *, seed: int = 0, index: int = 0) -> swarm_pb2.RolloutGroup:
    """A realistic, valid RolloutGroup (8 x 64 tokens is about 9 KB on the wire)."""
    return swarm_pb2.RolloutGroup(
        task_ref=make_task_ref(index),
        model=swarm_pb2.ModelCard(name="tiny-test", tokenizer_fingerprint="tok-0123", weights_version="w-0"),
        sampling=swarm_pb2.SamplingParams(temperature=1.0, max_new_tokens=max(n_tokens, 1), top_p=1.0),
        completions=[make_completion(n_tokens, seed=seed * 1000 + i) for i in range(n_completions)],
        policy_version=3,
        round=5,
    )


def make_hint(text: str = "Add the units first.", index: int = 0) -> swarm_pb2.Hint:
    return swarm_pb2.Hint(task_ref=make_task_ref(index), level=swarm_pb2.Hint.L1, text=text)


def seal_message(identity: NodeIdentity, message, sequence: int, timestamp_ms: int) -> bytes:
    """Seals any body message WITHOUT validating it (hostile peers send invalid bodies, signed)."""
    return seal(identity, kind_of(message), message.SerializeToString(), sequence, timestamp_ms)


def forge(raw: bytes, claimed: NodeIdentity | bytes, signer: NodeIdentity) -> bytes:
    """`raw` re-signed by `signer` while claiming to come from `claimed` (an impersonation)."""
    envelope = swarm_pb2.Envelope.FromString(raw)
    claimed_key = claimed if isinstance(claimed, bytes) else claimed.public_key_bytes
    envelope.sender_public_key = claimed_key
    envelope.signature = signer.sign(
        signed_bytes(Kind(envelope.kind), envelope.protocol_version, claimed_key, envelope.sequence, envelope.timestamp_ms, envelope.body)
    )
    return envelope.SerializeToString()


def with_fields(raw: bytes, **changes) -> bytes:
    """`raw` with Envelope fields replaced, signature left as it was (tampering in transit)."""
    envelope = swarm_pb2.Envelope.FromString(raw)
    for name, value in changes.items():
        setattr(envelope, name, value)
    return envelope.SerializeToString()


def tamper_body(raw: bytes) -> bytes:
    """`raw` with one bit of its body flipped, signature unchanged."""
    envelope = swarm_pb2.Envelope.FromString(raw)
    body = bytearray(envelope.body)
    body[len(body) // 2] ^= 0x01
    envelope.body = bytes(body)
    return envelope.SerializeToString()


def raw_envelope(identity: NodeIdentity, kind: int, body: bytes, sequence: int, timestamp_ms: int, version: int = PROTOCOL_VERSION) -> bytes:
    """An Envelope with any kind/version value, signed as well as the layout allows (unknown
    kinds cannot be signed: they have no name, so the signature is left empty)."""
    try:
        signature = identity.sign(signed_bytes(Kind(kind), version, identity.public_key_bytes, sequence, timestamp_ms, body))
    except ValueError:
        signature = b""
    return swarm_pb2.Envelope(
        protocol_version=version,
        kind=kind,
        sender_public_key=identity.public_key_bytes,
        sequence=sequence,
        timestamp_ms=timestamp_ms,
        body=body,
        signature=signature,
    ).SerializeToString()
