"""Replay window semantics; the guard is bounded in memory, never full to a newcomer, and forgetting
a window early opens no replay."""
from __future__ import annotations

import sys

import pytest

from protocol.errors import Reason, Rejected
from protocol.replay import ReplayGuard, SequenceWindow
from scripts.bench import sender_lockout

from tests.support.fake_clock import FakeClock


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
    clock = FakeClock(1000.0)
    guard = ReplayGuard(window=64, max_known=2, max_unknown=2, ttl_s=60, clock=clock)
    a, b = b"a" * 32, b"b" * 32
    guard.check_and_record(a, 7, 1)
    guard.check_and_record(b, 7, 1)  # same sequence, other sender: fine
    clock.now += 59
    assert reason(guard, a, 7, 1) == Reason.REPLAY  # still remembered
    clock.now += 59.5
    assert reason(guard, b, 7, 1) is None  # b idle for 118.5 s > ttl: forgotten (its messages expired meanwhile)
    assert reason(guard, a, 7, 1) == Reason.REPLAY  # a was touched at 59 s


def test_full_unknown_table_evicts_the_least_recent_unknown_window_never_a_known_one():
    clock = FakeClock(1000.0)
    guard = ReplayGuard(window=64, max_known=3, max_unknown=2, ttl_s=60, clock=clock)
    honest = b"h" * 32
    guard.check_and_record(honest, 100, 1000)
    assert guard.admit(honest) and guard.is_known(honest)
    guard.check_and_record(b"x" * 32, 1, 1000)
    guard.check_and_record(b"y" * 32, 1, 1000)
    guard.check_and_record(b"x" * 32, 2, 1001)  # x is now the more recent
    assert reason(guard, b"z" * 32, 1, 1002) is None  # no room: y, the least recent unknown, goes
    assert guard.evicted == 1 and guard.senders_tracked == 3
    assert reason(guard, b"x" * 32, 3, 1003) is None and reason(guard, b"x" * 32, 2, 1001) == Reason.REPLAY
    assert reason(guard, honest, 100, 1000) == Reason.REPLAY  # known senders are never evicted early
    # known slots: honest + 2 admitted; a third admission waits for a slot
    assert guard.admit(b"x" * 32) and guard.admit(b"z" * 32)
    guard.check_and_record(b"w" * 32, 1, 1004)
    assert not guard.admit(b"w" * 32) and guard.known_senders == 3
    assert not guard.admit(b"never-seen" * 3)
    clock.now += 61  # everyone idle past the ttl: all forgotten, room again
    assert reason(guard, b"v" * 32, 1, 1005) is None and guard.senders_tracked == 1


def test_a_window_forgotten_early_opens_no_replay_even_after_its_sender_returns():
    """An evicted sender's accepted messages are refused as stale, also once it has a new window
    (whose sequence range would otherwise take the old, unseen-by-it sequences)."""
    guard = ReplayGuard(window=64, max_known=1, max_unknown=1, ttl_s=720, clock=FakeClock(1000.0))
    victim, other = b"v" * 32, b"o" * 32
    guard.check_and_record(victim, 10, 5_000)
    guard.check_and_record(victim, 11, 5_001)
    guard.check_and_record(other, 1, 5_002)  # evicts the victim's window
    assert reason(guard, victim, 11, 5_001) == Reason.STALE  # a replay: its window is gone, its floor is not
    assert reason(guard, victim, 10, 5_000) == Reason.STALE
    assert reason(guard, victim, 12, 5_002) is None  # its next message gets in (and evicts `other`)
    assert reason(guard, victim, 10, 5_000) == Reason.STALE  # inside the new window's range, before its floor
    assert reason(guard, victim, 11, 5_001) == Reason.STALE
    assert reason(guard, victim, 12, 5_002) == Reason.REPLAY
    assert reason(guard, other, 1, 5_002) == Reason.STALE  # `other` was evicted in turn: same rule


def test_newcomers_get_in_while_14100_keys_hold_both_sender_tables():
    """Issue 16: 14,100 keys, one valid signed message each every 714 s (under the 720 s ttl),
    through the real Ingress, fill the 10,000 known and 4,096 unknown windows; 10 honest newcomers
    then join. The old guard refused every newcomer as `busy` (scripts/bench/sender_lockout.py: 0 of 50)."""
    result = sender_lockout.lockout(attackers=14_100, newcomers=10, minutes=6, every_s=30)
    assert result["known_senders"] == 10_000 and result["senders_tracked"] == 10_000 + 4_096, result
    assert result["newcomers_in_at_first_message"] == 10, result
    assert "busy" not in result["rejected"], result


def test_72000_messages_from_12000_fresh_keys_cannot_make_an_accepted_message_acceptable_again():
    """Issue 9, item 5: the count-bounded tables were flushed this way in 63 s. Every attacker
    message is valid and, as the Ingress does on acceptance, its sender admitted."""
    clock = FakeClock(1000.0)
    guard = ReplayGuard(clock=clock)  # the Ingress' defaults
    honest = b"\x01" * 32
    accepted_sequence = 5 << 22
    guard.check_and_record(honest, accepted_sequence, 1_000_000)
    guard.admit(honest)
    for i in range(72_000):  # 6 messages per key, 63 s
        key = (i % 12_000 + 2).to_bytes(32, "big")
        clock.now += 63 / 72_000
        guard.check_and_record(key, (1 << 40) + i, 1_000_000 + i)  # never refused: every key is new or newer
        guard.admit(key)
    assert reason(guard, honest, accepted_sequence, 1_000_000) == Reason.REPLAY
    assert guard.is_known(honest)
    assert guard.known_senders == guard.max_known
    assert guard.senders_tracked <= guard.max_known + guard.max_unknown
    replays = [reason(guard, (i % 12_000 + 2).to_bytes(32, "big"), (1 << 40) + i, 1_000_000 + i) for i in range(72_000)]
    assert None not in replays  # not one attacker message is accepted twice


def retained_bytes(guard: ReplayGuard) -> int:
    """Everything the guard holds per sender (getsizeof, one level deep)."""
    total = 0
    for table in (guard._known.windows, guard._unknown.windows):
        total += sys.getsizeof(table)
        total += sum(sys.getsizeof(k) + sys.getsizeof(w) + sys.getsizeof(w.bits) + sys.getsizeof(w.highest)
                     for k, w in table.items())
    return total


def test_memory_stays_bounded_under_100k_senders():
    guard = ReplayGuard(window=1024, max_known=500, max_unknown=500, clock=FakeClock(1000.0))

    def flood(first: int, last: int) -> None:
        for i in range(first, last):  # huge, scattered sequences: the widest bitmaps possible
            key = i.to_bytes(32, "big")
            try:
                guard.check_and_record(key, (1 << 62) + i, i)
                guard.check_and_record(key, (1 << 62) + i - 1023, i)
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
