"""Property-based fuzzing of the Ingress: random bytes and mutated genuine envelopes (bit flips,
truncations, splices, field substitutions), plus garbage bodies properly signed by a hostile key
(which must get through authentication to exercise the body decoder and validators). Properties: nothing escapes `accept`, no internal
error is counted, and whatever is accepted is exactly a message its key owner signed, carrying
that owner's signature (a mutated signature is never accepted)."""
from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto import swarm_pb2
from protocol.envelope import seal
from protocol.errors import Reason
from protocol.identity import NodeIdentity
from protocol.ingress import Ingress
from protocol.kinds import Kind
from protocol.limits import validate_body
from protocol.outbox import Outbox, Sequencer
from protocol.ratelimit import RateLimits
from protocol.scoring import ScoreConfig
from protocol.testing import make_hint, make_rollout_group, make_task_ref

NOW = 1_800_000_000.0
IDENTITIES = [NodeIdentity.generate() for _ in range(2)]
HOSTILE = NodeIdentity.generate()  # signs garbage bodies: authenticated, so they reach the validators
_outboxes = [Outbox(identity, clock=lambda: NOW, sequencer=Sequencer(start=1000 * (i + 1))) for i, identity in enumerate(IDENTITIES)]
_bodies = [make_rollout_group(3, 6, seed=1), make_hint(), swarm_pb2.HintRequest(task_ref=make_task_ref(3)), make_rollout_group(1, 2, seed=2)]
GENUINE_RAW = [outbox.seal(body) for outbox in _outboxes for body in _bodies]


def signed_content(envelope: swarm_pb2.Envelope) -> tuple:
    return (envelope.sender_public_key, envelope.kind, envelope.sequence, envelope.timestamp_ms, envelope.body)


GENUINE_SIGNATURES = {}
for _raw in GENUINE_RAW:
    _envelope = swarm_pb2.Envelope.FromString(_raw)
    GENUINE_SIGNATURES[signed_content(_envelope)] = _envelope.signature

OPS = ("random", "none", "bitflip", "signature_bitflip", "truncate", "splice", "append", "substitute", "signed_garbage_body", "signed_extreme_values")
_EXTREME_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-4, 2e-4, 0.5, -1e3, -1e5, 3e38, -3e38, 1e-45)
_GENUINE_ENVELOPES = [swarm_pb2.Envelope.FromString(raw) for raw in GENUINE_RAW]


def _substitute_value(name: str, rng: random.Random):
    """A replacement for Envelope field `name`: random, extreme, or taken from another message."""
    donor = rng.choice(_GENUINE_ENVELOPES)
    if name in ("protocol_version", "kind", "sequence", "timestamp_ms"):
        bits = {"protocol_version": 32, "kind": 31, "sequence": 64, "timestamp_ms": 64}[name]
        return rng.choice([0, 1, 2, 3, (1 << bits) - 1, rng.getrandbits(bits), getattr(donor, name)])
    if name == "sender_public_key":
        return rng.choice([rng.randbytes(rng.randrange(40)), rng.randbytes(32), donor.sender_public_key])
    if name == "body":
        return rng.choice([rng.randbytes(rng.randrange(300)), donor.body])
    return rng.choice([rng.randbytes(64), donor.signature])  # signature


def mutate(op: str, index: int, seed: int) -> tuple[str, bytes]:
    """A hostile input: genuine message `index` mutated by `op`, details drawn from `seed`.
    (Hypothesis draws op/index/seed and shrinks them; bulk bytes come from the seeded rng,
    which keeps generation cheap enough for thousands of inputs in a few seconds.)"""
    rng = random.Random(seed)
    raw = GENUINE_RAW[index]
    if op == "random":
        return op, rng.randbytes(rng.randrange(600))
    if op == "signed_garbage_body":  # a genuine body, mangled, then properly signed by HOSTILE
        body = bytearray(swarm_pb2.Envelope.FromString(raw).body)
        for _ in range(rng.randint(1, 4)):
            if body:
                body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        body = bytes(body[: rng.randrange(len(body) + 1)]) if rng.random() < 0.3 else bytes(body)
        kind = rng.choice(list(Kind))
        return op, seal(HOSTILE, kind, body, rng.getrandbits(64), int(NOW * 1000))
    if op == "signed_extreme_values":  # well-formed protobuf, hostile numbers, properly signed
        group = make_rollout_group(rng.randint(0, 3), rng.randint(0, 5), seed=seed)
        for completion in group.completions:
            for values in (completion.behavior_logprobs, completion.char_offsets, completion.token_ids):
                if values and rng.random() < 0.5:
                    i = rng.randrange(len(values))
                    values[i] = rng.choice(_EXTREME_FLOATS) if values is completion.behavior_logprobs else rng.getrandbits(32)
                if rng.random() < 0.2:
                    values.append(rng.getrandbits(31) if values is not completion.behavior_logprobs else -1.0)
            if rng.random() < 0.2:
                completion.claimed_reward = rng.choice(_EXTREME_FLOATS)
        if rng.random() < 0.2:
            group.sampling.temperature = rng.choice(_EXTREME_FLOATS)
        if rng.random() < 0.2:
            group.sampling.top_p = rng.choice(_EXTREME_FLOATS)
        return op, seal(HOSTILE, Kind.ROLLOUT_GROUP, group.SerializeToString(), rng.getrandbits(64), int(NOW * 1000))
    if op == "none":
        return op, raw
    if op in ("bitflip", "signature_bitflip"):
        data = bytearray(raw)
        low = len(raw) - 64 if op == "signature_bitflip" else 0  # the signature is the last field
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(low, len(raw))] ^= 1 << rng.randrange(8)
        return (op if data != raw else "none"), bytes(data)  # two flips of one bit cancel out
    if op == "truncate":
        return op, raw[: rng.randrange(len(raw))]
    if op == "splice":
        other = rng.choice(GENUINE_RAW)
        return op, raw[: rng.randrange(len(raw) + 1)] + other[rng.randrange(len(other) + 1) :]
    if op == "append":
        return op, raw + rng.randbytes(rng.randint(1, 64))
    envelope = swarm_pb2.Envelope.FromString(raw)
    fields = ("protocol_version", "kind", "sender_public_key", "sequence", "timestamp_ms", "body", "signature")
    for name in rng.sample(fields, rng.randint(1, 3)):
        setattr(envelope, name, _substitute_value(name, rng))
    return op, envelope.SerializeToString()


hostile_cases = st.tuples(st.sampled_from(OPS), st.integers(0, len(GENUINE_RAW) - 1), st.integers(0, 2**32 - 1))


def permissive_ingress() -> Ingress:
    # No rate limits or bans: every input must reach the deepest check it can.
    return Ingress(
        clock=lambda: NOW,
        rate_limits=RateLimits(messages_per_s=1e9, message_burst=1e9, bytes_per_s=1e15, byte_burst=1e15),
        score_config=ScoreConfig(ban_threshold=-1e18),
    )


STATEFUL = permissive_ingress()  # sees every input: replay windows and seen-cache fill up
DEFAULTS = Ingress(clock=lambda: NOW)  # production settings: rate limits and bans kick in


def check_accepted_is_genuine(ingress: Ingress, data: bytes, from_peer: str = "fuzzer") -> bool:
    verified = ingress.accept(from_peer, data)
    assert ingress.rejected[Reason.INTERNAL] == 0, list(ingress.recent_rejections)[-1:]
    if verified is None:
        return False
    validate_body(verified.kind, verified.body, ingress.limits)  # accepted => within every limit
    if verified.envelope.sender_public_key == HOSTILE.public_key_bytes:
        return True  # its own (signed) message: fine, as long as it is within limits
    content = signed_content(verified.envelope)
    assert content in GENUINE_SIGNATURES, "accepted a message nobody signed"
    assert verified.envelope.signature == GENUINE_SIGNATURES[content], "accepted a mutated signature"
    return True


BATCH = 8


@settings(max_examples=260, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_cases, min_size=BATCH, max_size=BATCH))  # 260 x 8 = 2080 inputs
def test_ingress_survives_hostile_inputs_and_accepts_only_genuine_messages(cases):
    for case in cases:
        op, data = mutate(*case)
        accepted = check_accepted_is_genuine(permissive_ingress(), data)  # fresh: no replay state
        if op in ("signature_bitflip", "random"):
            assert not accepted, op
        if op == "none":
            assert accepted
        from_peer = f"peer-{case[2] % 8}"
        check_accepted_is_genuine(STATEFUL, data, from_peer)
        check_accepted_is_genuine(DEFAULTS, data, from_peer)
