"""FairBuffer: the one fairness rule of every bounded per-sender buffer (protocol/inbox.py): a
per-sender quota, the heaviest sender's oldest item goes when full (ties: the sender whose oldest
item is older), round-robin take, counted drops."""
from __future__ import annotations

import itertools
import random
import time

import pytest

from protocol.inbox import FULL, QUOTA, FairBuffer, heaviest_first


def test_quota_drops_the_senders_own_oldest():
    buffer = FairBuffer(capacity=100, per_sender=3)
    assert [buffer.put("a", f"a{i}") for i in range(5)] == [[], [], [], [QUOTA], [QUOTA]]
    buffer.put("b", "b0")
    assert buffer.take() == ["a2", "a3", "a4", "b0"] and buffer.dropped == {"a": 2}


def test_full_buffer_drops_the_heaviest_senders_oldest():
    buffer = FairBuffer(capacity=6)
    for i in range(3):
        buffer.put("honest-1", f"h1-{i}")
        buffer.put("honest-2", f"h2-{i}")
    assert buffer.put("honest-1", "h1-3") == [FULL]  # honest-1 is now the heaviest: its oldest goes
    for i in range(50):
        buffer.put("flood", f"f-{i}")
    # the flooder took slots only while the others held more than it (the first tie, 3 each: honest-2
    # held the older item), two each, then its own go
    assert buffer.take() == ["h2-1", "h1-2", "h2-2", "h1-3", "f-48", "f-49"]
    assert buffer.dropped == {"flood": 48, "honest-1": 2, "honest-2": 1}


def test_ties_go_to_the_sender_whose_oldest_item_is_older_and_are_independent_of_names():
    for first, second in (("a", "z"), ("z", "a")):
        buffer = FairBuffer(capacity=4)
        buffer.put(first, "first-0")
        buffer.put(second, "second-0")
        buffer.put(second, "second-1")
        buffer.put(first, "first-1")  # two each, `first` holds the older item
        assert buffer.heaviest() == (first, 2)
        assert buffer.put("late", "late-0") == [FULL]
        assert buffer.take() == ["second-0", "second-1", "first-1", "late-0"]
        assert buffer.dropped == {first: 1}


def test_take_is_round_robin_across_senders_and_returns_arrival_order():
    buffer = FairBuffer(capacity=100)
    for i in range(10):
        buffer.put("flood", f"f{i}")
    buffer.put("a", "a0")
    buffer.put("a", "a1")
    buffer.put("b", "b0")
    assert buffer.take(3) == ["f0", "a0", "b0"]  # one each, oldest first
    assert buffer.take(2) == ["f1", "a1"]  # the turn carried over: flood, then a (b has none left)
    buffer.put("c", "c0")  # a new sender joins the line at the back (behind flood, the only one left)
    assert buffer.take(2) == ["f2", "c0"] and buffer.take(1) == ["f3"]
    assert buffer.take(0) == [] and len(buffer) == 6 and buffer.take() == [f"f{i}" for i in range(4, 10)]
    assert len(buffer) == 0 and buffer.take() == [] and buffer.heaviest() is None


def test_counters_and_the_byte_bound_drop_from_the_sender_holding_the_most_bytes():
    buffer = FairBuffer(capacity=100, max_bytes=1000, size=len)
    for i in range(20):
        buffer.put("small", b"s%02d" % i)  # 60 bytes in 20 messages
    assert buffer.put("big", b"B" * 600) == [] and buffer.nbytes == 660
    assert buffer.put("big", b"b" * 600) == [FULL]  # the big sender's first 600 bytes go, not 20 small ones
    assert buffer.dropped == {"big": 1} and buffer.nbytes == 660 and len(buffer) == 21
    assert buffer.queued("small") == 20 and buffer.queued("big") == 1 and buffer.queued("nobody") == 0


def test_detach_and_attach_keep_ages_comparable_across_buffers_sharing_arrivals():
    arrivals = itertools.count()
    young, established = FairBuffer(10, arrivals=arrivals), FairBuffer(10, arrivals=arrivals)
    young.put("peer", "p0")
    established.put("other", "o0")
    young.put("peer", "p1")
    established.put("other", "o1")
    established.attach("peer", young.detach("peer"))  # the peer became established
    assert len(young) == 0 and young.dropped == {} and len(established) == 4
    assert established.heaviest() == ("peer", 2)  # two each; peer's oldest (p0) arrived first
    assert established.take() == ["p0", "o0", "p1", "o1"]


def test_heaviest_first_names_what_the_rule_would_drop():
    items = [("a", "a0"), ("b", "b0"), ("a", "a1"), ("c", "c0"), ("a", "a2"), ("b", "b1")]
    assert heaviest_first(items, 3) == ["a0", "b0", "a1"]  # a (3), then a and b tie at 2: b's b0 is older
    # then one each: the oldest item of the three goes first
    assert heaviest_first(items, 99) == ["a0", "b0", "a1", "c0", "a2", "b1"] and heaviest_first([], 2) == []


def test_flood_cannot_push_out_a_peer_that_sends_no_more_than_its_share():
    buffer = FairBuffer(100)
    rng = random.Random(0)
    honest_sent = 0
    for step in range(20_000):
        if rng.random() < 0.002:  # a peer sending 1 message to the flooder's ~500
            buffer.put("honest", ("honest", step))
            honest_sent += 1
        else:
            buffer.put("flood", ("flood", step))
    kept = buffer.take()
    assert sum(sender == "honest" for sender, _ in kept) == honest_sent and buffer.dropped["honest"] == 0
    assert len(kept) == 100


def fill_with_fresh_senders(capacity: int, messages: int) -> float:
    """Seconds to put one message from each of `messages` fresh senders into a full buffer."""
    buffer = FairBuffer(capacity)
    started = time.perf_counter()
    for i in range(messages):
        buffer.put(f"sybil-{i}", i)
    seconds = time.perf_counter() - started
    assert len(buffer) == capacity and sum(buffer.dropped.values()) == messages - capacity
    assert len(buffer._by_items.heap) <= 2 * capacity + 64  # stale entries do not pile up
    assert len(buffer.take()) == capacity
    return seconds


def test_many_senders_stay_fast_and_bounded():
    # O(log n) per put, not a scan of every sender: a 10x larger buffer costs about the same per
    # message (a scan would cost ~10x). Medians of 3 runs, both sizes in the same run.
    small = sorted(fill_with_fresh_senders(500, 10_000) for _ in range(3))[1]
    large = sorted(fill_with_fresh_senders(5_000, 10_000) for _ in range(3))[1]
    assert large < 3 * small, (small, large)


def test_a_buffer_that_is_never_full_keeps_its_heap_bounded():
    buffer = FairBuffer(capacity=10_000)
    for i in range(50_000):
        buffer.put("one", i)
        if i % 100 == 99:
            buffer.take(50)
    assert len(buffer._by_items.heap) <= 2 + 64


def test_nonsense_bounds_are_refused():
    for kwargs in ({"capacity": 0}, {"capacity": 5, "per_sender": 0}, {"capacity": 5, "max_bytes": 0, "size": len}):
        with pytest.raises(ValueError, match="capacity, per_sender and max_bytes"):
            FairBuffer(**kwargs)
    with pytest.raises(ValueError, match="max_bytes needs size"):
        FairBuffer(5, max_bytes=100)


def test_take_fresh_drops_a_senders_expired_items_and_takes_its_next_fresh_one_in_the_same_turn():
    buffer = FairBuffer(capacity=100)
    for i in range(3):
        buffer.put("slow", ("old", i))
    buffer.put("slow", ("new", 3))
    buffer.put("other", ("new", 0))
    item, expired = buffer.take_fresh(lambda it: it[0] == "new")
    assert (item, expired) == (("new", 3), 3)  # the expired ones did not cost "slow" its turn
    assert buffer.take_fresh(lambda it: it[0] == "new") == (("new", 0), 0)  # then the next sender
    assert buffer.take_fresh(lambda it: True) == (None, 0) and len(buffer) == 0 and not buffer.dropped


def test_take_fresh_passes_the_turn_on_from_a_sender_with_nothing_fresh():
    buffer = FairBuffer(capacity=100)
    buffer.put("stale", "s0")
    buffer.put("stale", "s1")
    buffer.put("live", "l0")
    assert buffer.take_fresh(lambda it: it.startswith("l")) == ("l0", 2)
    assert len(buffer) == 0
