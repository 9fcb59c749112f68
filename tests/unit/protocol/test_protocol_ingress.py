"""The Ingress under hostile input: each attack is refused with its reason, counted, charged to the
right peer, and honest traffic keeps flowing."""
from __future__ import annotations

import math
import random

import pytest

from proto import swarm_pb2
from protocol.envelope import seal
from protocol.errors import Reason
from protocol.identity import NodeIdentity
from protocol.ingress import Ingress
from protocol.kinds import Kind
from protocol.limits import Limits
from protocol.outbox import Outbox, Sequencer
from protocol.ratelimit import RateLimits
from protocol.scoring import WRONG_REWARD, ScoreConfig
from protocol.testing import forge, make_hint, make_rollout_group, raw_envelope, seal_message, tamper_body, with_fields

from tests.support.fake_clock import FakeClock

ALICE = NodeIdentity.generate()
MALLORY = NodeIdentity.generate()
GROUP = make_rollout_group(4, 16)
NOW = 1_800_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def ingress(clock) -> Ingress:
    return Ingress(clock=clock)


def outbox_for(identity: NodeIdentity, clock: FakeClock, **kwargs) -> Outbox:
    return Outbox(identity, clock=clock, **kwargs)


def assert_still_accepts(ingress: Ingress, outbox: Outbox, peer: str = "alice-relay") -> None:
    accepted_before = ingress.accepted
    assert ingress.accept(peer, outbox.seal(GROUP)) is not None
    assert ingress.accepted == accepted_before + 1


def test_valid_messages_are_accepted_with_their_sender(ingress, clock):
    outbox = outbox_for(ALICE, clock)
    verified = ingress.accept("relay", outbox.seal(GROUP))
    assert verified is not None
    assert verified.sender == ALICE.peer_id() and verified.from_peer == "relay"
    assert verified.kind == Kind.ROLLOUT_GROUP and verified.body == GROUP
    hint = ingress.accept("relay", outbox.seal(make_hint()))
    assert hint is not None and hint.kind == Kind.HINT
    assert ingress.scores.score(ALICE.peer_id()) > 0


def test_each_hostile_input_is_refused_counted_and_the_door_keeps_working(clock):
    ingress = Ingress(clock=clock, score_config=ScoreConfig(ban_threshold=-1e9))  # bans: tested below
    alice = outbox_for(ALICE, clock)
    mallory = outbox_for(MALLORY, clock, limits=None)  # a hostile peer does not validate
    ts = int(clock.now * 1000)
    valid = alice.seal(GROUP)
    nan_group = make_rollout_group(2, 8)
    nan_group.completions[1].behavior_logprobs[3] = math.nan
    positive_group = make_rollout_group(2, 8)
    positive_group.completions[0].behavior_logprobs[0] = 0.5
    attacks = {
        Reason.BAD_SIGNATURE: forge(valid, claimed=ALICE, signer=MALLORY),
        Reason.MALFORMED: bytes(random.Random(0).randbytes(300)),
        Reason.OVERSIZED: b"\x00" * (Limits().max_message_bytes + 1),
        Reason.UNKNOWN_KIND: raw_envelope(MALLORY, 7, b"", 1, ts),
        Reason.VERSION: raw_envelope(MALLORY, Kind.HINT, make_hint().SerializeToString(), 2, ts, version=9),
        Reason.NONFINITE_LOGPROB: mallory.seal(nan_group),
        Reason.POSITIVE_LOGPROB: mallory.seal(positive_group),
        Reason.TOO_MANY_COMPLETIONS: mallory.seal(make_rollout_group(65, 1)),
        Reason.TOO_MANY_TOKENS: mallory.seal(make_rollout_group(1, 4097)),
        Reason.EXPIRED: seal_message(MALLORY, GROUP, 10**18, ts - 3_600_000),
    }
    for reason, raw in attacks.items():
        before = ingress.rejected[reason]
        assert ingress.accept("mallory", raw) is None, reason
        assert ingress.rejected[reason] == before + 1, (reason, dict(ingress.rejected))
        assert_still_accepts(ingress, alice)
    assert ingress.accept("alice-relay", tamper_body(valid)) is None
    assert ingress.rejected[Reason.BAD_SIGNATURE] == 2
    assert ingress.rejected[Reason.INTERNAL] == 0


def test_replayed_message_is_refused(ingress, clock):
    raw = outbox_for(ALICE, clock).seal(GROUP)
    assert ingress.accept("a", raw) is not None
    assert ingress.accept("b", raw) is None
    # Re-encoding the envelope (extra unknown field, different bytes) does not make it new.
    reencoded = raw + bytes([0xF8, 0x01, 0x01])  # field 31, varint 1: unknown to Envelope
    assert ingress.accept("c", reencoded) is None
    assert ingress.rejected[Reason.REPLAY] == 2


def test_forgery_is_charged_to_the_forwarder_not_to_the_impersonated_key(clock):
    ingress = Ingress(clock=clock, score_config=ScoreConfig(ban_threshold=-10))
    alice = outbox_for(ALICE, clock)
    for _ in range(5):
        assert ingress.accept("mallory", forge(alice.seal(GROUP), claimed=ALICE, signer=MALLORY)) is None
    assert ingress.scores.is_banned("mallory")
    assert not ingress.scores.is_banned(ALICE.peer_id())
    assert ingress.scores.score(ALICE.peer_id()) == 0.0
    assert_still_accepts(ingress, alice)


def test_signed_invalid_content_is_charged_to_the_signer_whoever_relays_it(ingress, clock):
    bad = make_rollout_group(1, 4)
    bad.completions[0].behavior_logprobs[0] = math.inf
    mallory = outbox_for(MALLORY, clock, limits=None)
    for _ in range(4):
        assert ingress.accept("honest-relay", mallory.seal(bad)) is None
    assert ingress.scores.is_banned(MALLORY.peer_id())
    assert not ingress.scores.is_banned("honest-relay")
    # Now even a valid message signed by the banned key is refused.
    assert ingress.accept("honest-relay", outbox_for(MALLORY, clock).seal(GROUP)) is None
    assert ingress.rejected[Reason.BANNED] == 1


def test_flood_beyond_the_rate_limit(clock):
    ingress = Ingress(clock=clock, rate_limits=RateLimits(messages_per_s=10, message_burst=20))
    alice = outbox_for(ALICE, clock)
    messages = [alice.seal(GROUP) for _ in range(100)]
    accepted = sum(ingress.accept("alice", raw) is not None for raw in messages[:30])
    assert accepted == 20
    assert ingress.rejected[Reason.RATE_LIMITED] == 10
    clock.now += 1.0  # ten more tokens
    assert sum(ingress.accept("alice", raw) is not None for raw in messages[30:50]) == 10
    assert ingress.accept("someone-else", alice.seal(GROUP)) is not None  # per-peer buckets


def test_banned_after_repeated_invalid_messages_and_unbanned_after_expiry(clock):
    ingress = Ingress(clock=clock, score_config=ScoreConfig(ban_base_s=60, half_life_s=600))
    mallory = outbox_for(MALLORY, clock)
    for i in range(3):  # -3 each for malformed bytes: banned below -10 on the 4th
        assert ingress.accept("mallory", b"\xff" * (i + 1)) is None
    assert not ingress.scores.is_banned("mallory")
    assert ingress.accept("mallory", b"\xff\xff\xff\xff") is None
    assert ingress.scores.is_banned("mallory")
    assert ingress.accept("mallory", mallory.seal(GROUP)) is None  # even valid messages
    assert ingress.rejected[Reason.BANNED] == 1
    clock.now += 61
    assert not ingress.scores.is_banned("mallory")
    assert ingress.accept("mallory", mallory.seal(GROUP)) is not None


def test_node_layer_evidence_feeds_the_score(ingress):
    for _ in range(6):  # -2 each, banned below -10
        ingress.report(ALICE.peer_id(), WRONG_REWARD)
    assert ingress.scores.is_banned(ALICE.peer_id())


def test_restarted_sender_is_accepted_again(ingress, clock):
    first_run = Outbox(ALICE, clock=clock)
    for _ in range(3):
        assert ingress.accept("a", first_run.seal(GROUP)) is not None
    clock.now += 5.0  # restart: new process, same key, no state on disk
    second_run = Outbox(ALICE, clock=clock)
    assert ingress.accept("a", second_run.seal(GROUP)) is not None
    assert ingress.accept("a", first_run.seal(GROUP)) is None  # the old run is now far behind
    assert ingress.rejected[Reason.STALE] == 1


def test_out_of_order_delivery_within_the_window_is_accepted(ingress, clock):
    outbox = Outbox(ALICE, clock=clock, sequencer=Sequencer(start=1 << 50))
    messages = [outbox.seal(GROUP) for _ in range(200)]
    random.Random(1).shuffle(messages)
    assert all(ingress.accept("a", raw) is not None for raw in messages)


def test_never_raises_on_junk_types(ingress):
    for junk in (None, 12, "text", [b"x"], bytearray(b"\x08\x01"), memoryview(b"\x00")):
        assert ingress.accept("p", junk) is None  # type: ignore[arg-type]
    assert ingress.rejected[Reason.INTERNAL] == 0


def test_status_snapshot(ingress, clock):
    ingress.accept("a", outbox_for(ALICE, clock).seal(GROUP))
    ingress.accept("m", b"\x01")
    snapshot = ingress.snapshot()
    assert snapshot.accepted == 1
    assert snapshot.rejected_by_reason == {"malformed": 1}
    peers = {info.peer_id: info for info in snapshot.peers}
    assert peers[ALICE.peer_id()].accepted == 1 and peers["m"].rejected == 1
    reply = swarm_pb2.StatusReply(
        accepted=snapshot.accepted,
        rejected_by_reason=snapshot.rejected_by_reason,
        peers=[swarm_pb2.PeerInfo(peer_id=i.peer_id, score=i.score, banned=i.banned) for i in snapshot.peers],
    )
    assert reply.rejected_by_reason["malformed"] == 1


def test_outbox_refuses_to_send_what_peers_would_reject(clock):
    bad = make_rollout_group(1, 4)
    bad.completions[0].behavior_logprobs[0] = 1.0
    with pytest.raises(ValueError, match="positive_logprob"):
        Outbox(ALICE, clock=clock).seal(bad)
    with pytest.raises(TypeError):
        Outbox(ALICE, clock=clock).seal(swarm_pb2.TaskRef())


def test_hint_request_round_trip(ingress, clock):
    request = swarm_pb2.HintRequest(task_ref=GROUP.task_ref)
    verified = ingress.accept("a", Outbox(ALICE, clock=clock).seal(request))
    assert verified is not None and verified.kind == Kind.HINT_REQUEST and verified.body == request


def test_equivocation_same_sequence_other_body_is_refused(ingress, clock):
    ts = int(clock.now * 1000)
    assert ingress.accept("a", seal(ALICE, Kind.HINT, make_hint("one").SerializeToString(), 77, ts)) is not None
    assert ingress.accept("a", seal(ALICE, Kind.HINT, make_hint("two").SerializeToString(), 77, ts)) is None
    assert ingress.rejected[Reason.REPLAY] == 1
    # and a field swap in transit is a bad signature, not a replay
    assert ingress.accept("a", with_fields(seal(ALICE, Kind.HINT, b"", 78, ts), sequence=79)) is None
    assert ingress.rejected[Reason.BAD_SIGNATURE] == 1


def test_replaying_a_victims_messages_never_hurts_the_victim():
    """Anyone can re-send signed bytes, and GossipSub re-publishes a captured message under its
    original origin once its seen-cache forgot it: a replay is nobody's proven fault."""
    clock = FakeClock(NOW)
    ingress = Ingress(Limits(), clock=clock)
    raw = seal_message(ALICE, GROUP, 10, int(NOW * 1000))
    assert ingress.accept(ALICE.peer_id(), raw) is not None
    for i in range(200):  # as the victim's own origin, and as others
        ingress.accept(ALICE.peer_id() if i % 2 else f"mallory-{i % 3}", raw, neighbour=f"relay-{i % 4}")
    assert ingress.rejected[Reason.REPLAY] == 200
    assert not ingress.scores.is_banned(ALICE.peer_id()) and ingress.scores.score(ALICE.peer_id()) > 0
    assert not any(ingress.scores.is_banned(p) for p in [*(f"mallory-{i}" for i in range(3)), *(f"relay-{i}" for i in range(4))])
    clock.now += 700  # replayed after the window: expired, still nobody's fault
    ingress.accept(ALICE.peer_id(), raw)
    assert ingress.rejected[Reason.EXPIRED] == 1 and ingress.scores.score(ALICE.peer_id()) > 0


def test_delivery_faults_charge_a_validating_neighbour_only():
    clock = FakeClock(NOW)
    ingress = Ingress(Limits(), clock=clock, blame_neighbours=True)
    raw = seal_message(ALICE, GROUP, 10, int(NOW * 1000))
    assert ingress.accept(ALICE.peer_id(), raw, neighbour=ALICE.peer_id()) is not None
    for _ in range(100):
        ingress.accept(ALICE.peer_id(), raw, neighbour="relay")
    assert ingress.scores.is_banned("relay")  # it claims to validate what it forwards: it forwarded replays
    assert not ingress.scores.is_banned(ALICE.peer_id()) and ingress.scores.score(ALICE.peer_id()) > 0
    # and once banned, nothing it relays is read, not even fresh messages of honest origins
    assert ingress.accept(ALICE.peer_id(), seal_message(ALICE, GROUP, 11, int(NOW * 1000)), neighbour="relay") is None
    assert ingress.rejected[Reason.BANNED] >= 1


def test_rate_limit_is_judged_at_arrival_and_overflow_is_not_misbehaviour():
    clock = FakeClock(NOW)
    ingress = Ingress(Limits(), clock=clock, rate_limits=RateLimits(messages_per_s=10, message_burst=10))
    outbox = Outbox(ALICE, clock=clock, pace=None)
    # 100 messages that arrived at 10/s over 10 s, drained at once: none over the limit
    arrivals = [(outbox.seal(GROUP), NOW + i * 0.1) for i in range(100)]
    clock.now += 10
    assert all(ingress.accept(ALICE.peer_id(), raw, received_at=at) for raw, at in arrivals)
    # a burst of 3x the limit (after a quiet spell that refilled the bucket): the excess is
    # dropped and counted, and costs nothing
    clock.now += 10
    for _ in range(30):
        ingress.accept(ALICE.peer_id(), outbox.seal(GROUP), received_at=clock.now)
    assert ingress.rejected[Reason.RATE_LIMITED] == 20 and ingress.scores.score(ALICE.peer_id()) > 0
    # sustained far above it (past the 4x abuse line) is flooding, scored until banned
    for _ in range(300):
        ingress.accept(ALICE.peer_id(), outbox.seal(GROUP), received_at=clock.now)
    assert ingress.rejected[Reason.FLOODING] > 0 and ingress.scores.is_banned(ALICE.peer_id())


def test_a_relay_carrying_many_origins_is_limited_per_connection_too():
    clock = FakeClock(NOW)
    ingress = Ingress(Limits(), clock=clock, rate_limits=RateLimits(messages_per_s=10, message_burst=10),
                      neighbour_rate_limits=RateLimits(messages_per_s=20, message_burst=20))
    for i in range(60):  # 60 fresh origins, one message each, all through one relay
        ingress.accept(f"origin-{i}", seal_message(ALICE, GROUP, 100 + i, int(NOW * 1000)), received_at=NOW,
                       neighbour="relay")
    assert ingress.accepted == 20 and ingress.rejected[Reason.RATE_LIMITED] == 40
    assert not ingress.scores.is_banned("relay") and ingress.scores.score("relay") == 0  # dropped, never blamed


def test_a_kind_on_the_wrong_topic_is_refused():
    clock = FakeClock(NOW)
    ingress = Ingress(Limits(), clock=clock)
    hint = seal(ALICE, Kind.HINT, make_hint("look closer").SerializeToString(), 5, int(NOW * 1000))
    assert ingress.accept("mallory", hint, expected_kinds={Kind.ROLLOUT_GROUP}) is None
    assert ingress.rejected[Reason.WRONG_TOPIC] == 1
    assert ingress.scores.score("mallory") < 0 and ingress.scores.score(ALICE.peer_id()) == 0  # the publisher chose the topic
    assert ingress.accept("a", hint, expected_kinds={Kind.HINT}) is not None
