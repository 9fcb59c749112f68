"""Replay window semantics; the guard is bounded by time and admission, not by a count an attacker fills."""
from __future__ import annotations

import sys

import pytest

from protocol.errors import Reason, Rejected
from protocol.replay import ReplayGuard, SequenceWindow


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


def test_guard_separates_senders_and_forgets_only_after_the_ttl():
    clock = FakeClock()
    guard = ReplayGuard(window=64, max_known=2, max_unknown=2, ttl_s=60, clock=clock)
    a, b = b"a" * 32, b"b" * 32
    guard.check_and_record(a, 7)
    guard.check_and_record(b, 7)  # same sequence, other sender: fine
    clock.now += 59
    assert reason(guard, a, 7) == Reason.REPLAY  # still remembered
    clock.now += 59.5
    assert reason(guard, b, 7) is None  # b idle for 118.5 s > ttl: forgotten (its messages expired meanwhile)
    assert reason(guard, a, 7) == Reason.REPLAY  # a was touched at 59 s


def test_full_unknown_table_refuses_newcomers_and_never_evicts_known_senders():
    clock = FakeClock()
    guard = ReplayGuard(window=64, max_known=3, max_unknown=2, ttl_s=60, clock=clock)
    honest = b"h" * 32
    guard.check_and_record(honest, 100)
    assert guard.admit(honest) and guard.is_known(honest)
    guard.check_and_record(b"x" * 32, 1)
    guard.check_and_record(b"y" * 32, 1)
    assert reason(guard, b"z" * 32, 1) == Reason.BUSY  # two unknown senders active: no room, no eviction
    assert reason(guard, b"x" * 32, 2) is None  # the ones already in keep working
    assert reason(guard, honest, 100) == Reason.REPLAY
    # known slots: honest + 2 admitted; a third admission waits for a slot
    assert guard.admit(b"x" * 32) and guard.admit(b"y" * 32)
    guard.check_and_record(b"w" * 32, 1)
    assert not guard.admit(b"w" * 32) and guard.known_senders == 3
    assert not guard.admit(b"never-seen" * 3)
    clock.now += 61  # everyone idle past the ttl: all forgotten, room again
    assert reason(guard, b"z" * 32, 1) is None and guard.senders_tracked == 1


def test_72000_messages_from_12000_fresh_keys_cannot_make_an_accepted_message_acceptable_again():
    """Issue 9, item 5: the count-bounded tables were flushed this way in 63 s. Every attacker
    message is valid and, as the Ingress does on acceptance, its sender admitted."""
    clock = FakeClock()
    guard = ReplayGuard(clock=clock)  # the Ingress' defaults
    honest = b"\x01" * 32
    accepted_sequence = 5 << 22
    guard.check_and_record(honest, accepted_sequence)
    guard.admit(honest)
    refused = 0
    for i in range(72_000):  # 6 messages per key, 63 s
        key = (i % 12_000 + 2).to_bytes(32, "big")
        clock.now += 63 / 72_000
        try:
            guard.check_and_record(key, (1 << 40) + i)
        except Rejected as rejection:
            assert rejection.reason == Reason.BUSY
            refused += 1
            continue
        guard.admit(key)
    assert reason(guard, honest, accepted_sequence) == Reason.REPLAY
    assert guard.is_known(honest)
    assert guard.known_senders == guard.max_known  # the attacker filled every slot it could, evicting nobody
    assert guard.senders_tracked <= guard.max_known + guard.max_unknown
    print(f"refused as busy: {refused}")


def retained_bytes(guard: ReplayGuard) -> int:
    """Everything the guard holds per sender (getsizeof, one level deep)."""
    total = 0
    for table in (guard._known.windows, guard._unknown.windows):
        total += sys.getsizeof(table)
        total += sum(sys.getsizeof(k) + sys.getsizeof(w) + sys.getsizeof(w.bits) + sys.getsizeof(w.highest)
                     for k, w in table.items())
    return total


def test_memory_stays_bounded_under_100k_senders():
    guard = ReplayGuard(window=1024, max_known=500, max_unknown=500, clock=FakeClock())

    def flood(first: int, last: int) -> None:
        for i in range(first, last):  # huge, scattered sequences: the widest bitmaps possible
            key = i.to_bytes(32, "big")
            try:
                guard.check_and_record(key, (1 << 62) + i)
                guard.check_and_record(key, (1 << 62) + i - 1023)
            except Rejected:
                continue
            guard.admit(key)

    flood(0, 20_000)
    after_20k = retained_bytes(guard)
    flood(20_000, 100_000)
    after_100k = retained_bytes(guard)
    assert guard.senders_tracked == 1000
    assert after_100k <= after_20k * 1.01  # 80k more senders, no growth
    assert after_100k < 2 * 2**20, f"{after_100k / 2**20:.1f} MiB"


@pytest.mark.parametrize("bad", [0, -1])
def test_guard_refuses_nonsense_configuration(bad):
    with pytest.raises(ValueError):
        ReplayGuard(window=bad)
