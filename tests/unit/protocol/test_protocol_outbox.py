"""Outbox pacing: what a node sends fits what its peers accept (protocol/outbox.py)."""
from __future__ import annotations

import pytest

from protocol.ingress import Ingress
from protocol.transports.memory import MemoryBus, MemoryTransport
from protocol.outbox import PACE, Outbox, Pace
from protocol.ratelimit import RateLimits
from protocol.testing import make_rollout_group
from protocol.transports.base import topic_name

from tests.support.fake_clock import FakeClock

NOW = 1_800_000_000.0
TOPIC = topic_name("t", "rollouts")


def pair(clock):
    bus = MemoryBus(clock=clock)
    sender, receiver = MemoryTransport(bus, "sender"), MemoryTransport(bus, "receiver")
    for transport in (sender, receiver):
        transport.subscribe(TOPIC)
        transport.start()
    return sender, receiver


def test_default_pace_sits_safely_below_the_default_rate_limit():
    limits = RateLimits()
    assert PACE.messages_per_s <= limits.messages_per_s / 2 and PACE.burst <= limits.message_burst / 2


def test_tiny_preset_rate_is_paced_and_the_peer_accepts_everything_sent(identity):
    """16 groups a round at 20 rounds/s (the tiny preset) for 30 s: the receiver's Ingress, with
    the default limits and arrival times, refuses nothing, and the excess is dropped at the sender."""
    clock = FakeClock(NOW)
    sender, receiver = pair(clock)
    outbox = Outbox(identity(), clock=clock)
    ingress = Ingress(clock=clock)
    group = make_rollout_group(2, 4)
    accepted = 0
    for _ in range(30 * 20):
        clock.now += 0.05
        for _ in range(16):
            outbox.publish(sender, "t", group)
        accepted += len(ingress.accept_many(receiver.drain(TOPIC)))
    assert ingress.rejected == {} and accepted == outbox.counters["paced_sent"]
    assert PACE.burst + 30 * PACE.messages_per_s - 2 <= accepted <= PACE.burst + 30 * PACE.messages_per_s + 1
    assert outbox.counters["dropped_paced"] == outbox.counters["paced_queued"] - accepted - outbox.queued
    assert outbox.queued == PACE.max_queued
    peer = {p.peer_id: p for p in ingress.snapshot().peers}[outbox.identity.peer_id()]
    assert not peer.banned and peer.score > 0


def test_waiting_messages_leave_on_flush_newest_kept_and_sealed_when_sent(identity):
    clock = FakeClock(NOW)
    sender, receiver = pair(clock)
    outbox = Outbox(identity(), clock=clock, pace=Pace(messages_per_s=1, burst=1, max_queued=2))
    groups = [make_rollout_group(1, 2, index=i) for i in range(4)]
    assert outbox.publish(sender, "t", groups[0]) is not None  # the burst: sent at once
    assert all(outbox.publish(sender, "t", g) is None for g in groups[1:])  # queued; the oldest of them dropped
    assert outbox.counters["dropped_paced"] == 1 and outbox.queued == 2
    assert outbox.flush(sender) == 0  # no token yet
    clock.now += 1.0
    assert outbox.flush(sender) == 1
    clock.now += 5.0
    assert outbox.flush(sender) == 1 and outbox.queued == 0
    ingress = Ingress(clock=clock)
    verified = ingress.accept_many(receiver.drain(TOPIC))
    assert [v.body.task_ref.index for v in verified] == [0, 2, 3]
    assert verified[1].envelope.timestamp_ms == int((NOW + 1.0) * 1000)  # sealed when it left


def test_the_highest_priority_is_sent_first_and_the_lowest_dropped_first(identity):
    """A fast node that solves most tasks offers mostly groups without reward variance (low
    priority): the pace must still carry its trainable ones, whatever their order."""
    clock = FakeClock(NOW)
    sender, receiver = pair(clock)
    outbox = Outbox(identity(), clock=clock, pace=Pace(messages_per_s=2, burst=1, max_queued=4))
    for i in range(40):  # one trainable group in ten, each followed by nine flat ones
        outbox.publish(sender, "t", make_rollout_group(1, 2, index=i), priority=1 if i % 10 == 0 else 0)
    assert outbox.queued == 4 and outbox.counters["dropped_paced"] == 40 - 1 - 4
    for _ in range(4):  # one token every 0.5 s
        clock.now += 0.5
        assert outbox.flush(sender) == 1
    sent = [v.body.task_ref.index for v in Ingress(clock=clock).accept_many(receiver.drain(TOPIC))]
    assert sent[0] == 0 and sent[1:4] == [10, 20, 30]  # every trainable group went out, oldest first
    assert sent[4] == 39  # then the newest flat one: low-priority drops go oldest first too


def test_unpaced_outbox_sends_everything_and_invalid_messages_still_raise(identity):
    clock = FakeClock(NOW)
    sender, receiver = pair(clock)
    outbox = Outbox(identity(), clock=clock, pace=None)
    for i in range(500):
        assert outbox.publish(sender, "t", make_rollout_group(1, 2, index=i)) is not None
    assert len(receiver.drain(TOPIC)) == 500
    bad = make_rollout_group(1, 2)
    bad.completions[0].claimed_reward = float("nan")
    with pytest.raises(ValueError, match="peers would reject"):
        Outbox(identity(), clock=clock).publish(sender, "t", bad)


@pytest.mark.parametrize("bad", [{"messages_per_s": 0}, {"burst": 0.5}, {"max_queued": -1}])
def test_nonsense_pace_is_refused(bad):
    with pytest.raises(ValueError):
        Pace(**bad)
