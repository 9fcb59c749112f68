"""Replay window semantics and bounded memory of the replay caches."""
from __future__ import annotations

import sys

import pytest

from protocol.errors import Reason, Rejected
from protocol.replay import ReplayGuard, SeenCache, SequenceWindow


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reason(window_or_guard, *args) -> Reason | None:
    try:
        window_or_guard.check_and_record(*args)
    except Rejected as rejection:
        return rejection.reason
    return None


def test_window_accepts_increasing_and_out_of_order_within_the_window():
    window = SequenceWindow(1024)
    for sequence in (100, 101, 105, 103, 102, 104):
        assert reason(window, sequence) is None
    assert reason(window, 2000) is None  # a jump forward is fine
    assert reason(window, 2000 - 1023) is None  # the oldest slot still in the window
    assert reason(window, 1999) is None


def test_window_rejects_duplicates_and_too_old():
    window = SequenceWindow(1024)
    for sequence in (10, 12, 11):
        window.check_and_record(sequence)
    for sequence in (10, 11, 12):
        assert reason(window, sequence) == Reason.REPLAY
    window.check_and_record(5000)
    assert reason(window, 5000) == Reason.REPLAY
    assert reason(window, 5000 - 1024) == Reason.STALE
    assert reason(window, 12) == Reason.STALE


def test_window_survives_huge_jumps_without_huge_memory():
    window = SequenceWindow(1024)
    window.check_and_record(1)
    window.check_and_record(1 << 62)  # a restart: sequence = start_ms << 22
    assert window.bits == 1 and window.highest == 1 << 62
    assert reason(window, (1 << 62) - 1) is None
    assert window.bits.bit_length() <= 1024


def test_guard_separates_senders_and_catches_replay_after_window_eviction():
    clock = FakeClock()
    guard = ReplayGuard(window=64, max_senders=2, seen_capacity=100, seen_ttl_s=60, clock=clock)
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    guard.check_and_record(a, 7)
    guard.check_and_record(b, 7)  # same sequence, other sender: fine
    guard.check_and_record(c, 1)  # evicts a's window (max_senders=2)
    assert guard.senders_tracked == 2
    assert reason(guard, a, 7) == Reason.REPLAY  # the seen-cache still remembers it
    clock.now += 61
    assert reason(guard, b, 8) is None  # expired ids do not stop new messages


def test_seen_cache_capacity_and_ttl():
    clock = FakeClock()
    cache = SeenCache(capacity=3, ttl_s=10, clock=clock)
    assert all(cache.add_if_new(bytes([i])) for i in range(5))
    assert len(cache) == 3
    assert not cache.add_if_new(bytes([4]))
    assert cache.add_if_new(bytes([0]))  # evicted by capacity, so new again
    clock.now += 11
    assert cache.add_if_new(bytes([4])) and len(cache) == 1  # everything else expired


def retained_bytes(guard: ReplayGuard) -> int:
    """Everything the guard holds per sender and per message id (getsizeof, one level deep)."""
    windows, seen = guard._windows, guard.seen._expiry
    total = sys.getsizeof(windows) + sys.getsizeof(seen)
    total += sum(sys.getsizeof(k) + sys.getsizeof(w) + sys.getsizeof(w.bits) + sys.getsizeof(w.highest) for k, w in windows.items())
    total += sum(sys.getsizeof(k) + sys.getsizeof(t) for k, t in seen.items())
    return total


def test_memory_stays_bounded_under_100k_senders():
    guard = ReplayGuard(window=1024, max_senders=1000, seen_capacity=5000, clock=FakeClock())

    def flood(first: int, last: int) -> None:
        for i in range(first, last):  # huge, scattered sequences: the widest bitmaps possible
            key = i.to_bytes(32, "big")
            guard.check_and_record(key, (1 << 62) + i)
            guard.check_and_record(key, (1 << 62) + i - 1023)

    flood(0, 20_000)
    after_20k = retained_bytes(guard)
    flood(20_000, 100_000)
    after_100k = retained_bytes(guard)
    assert guard.senders_tracked == 1000
    assert len(guard.seen) == 5000
    assert after_100k <= after_20k * 1.01  # 80k more senders, no growth
    assert after_100k < 2 * 2**20, f"{after_100k / 2**20:.1f} MiB"


@pytest.mark.parametrize("bad", [0, -1])
def test_guard_refuses_nonsense_configuration(bad):
    with pytest.raises(ValueError):
        ReplayGuard(window=bad)
