"""Per-peer token buckets with an injected clock."""
from __future__ import annotations

from protocol.ratelimit import RateLimiter, RateLimits, Verdict

from tests.support.fake_clock import FakeClock


def test_message_bucket_allows_a_burst_then_the_rate():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(messages_per_s=10, message_burst=5), clock)
    assert [limiter.allow("p", 100) for _ in range(7)] == [True] * 5 + [False] * 2
    clock.now += 0.1  # one token back
    assert limiter.allow("p", 100) and not limiter.allow("p", 100)
    assert limiter.allow("q", 100)  # other peers have their own bucket
    clock.now += 100  # refills to the burst, no further
    assert sum(limiter.allow("p", 1) for _ in range(10)) == 5


def test_byte_bucket_and_all_or_nothing_charging():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(messages_per_s=1000, message_burst=1000, bytes_per_s=1000, byte_burst=3000), clock)
    assert limiter.allow("p", 2500)
    assert not limiter.allow("p", 1000)  # refused: charges no message token either
    assert limiter.allow("p", 500)
    clock.now += 1.0
    assert limiter.allow("p", 1000) and not limiter.allow("p", 1)


def test_clock_stepping_back_refills_nothing_and_memory_is_bounded():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(messages_per_s=1, message_burst=1, max_peers=100), clock)
    assert limiter.allow("p", 1)
    clock.now -= 50
    assert not limiter.allow("p", 1)
    for i in range(10_000):
        limiter.allow(f"peer-{i}", 1)
    assert limiter.peers_tracked == 100


def test_overflow_is_dropped_and_only_sustained_arrivals_past_the_abuse_line_are_flooding():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(messages_per_s=10, message_burst=10, abuse_factor=4), clock)
    verdicts = [limiter.check("p", 1) for _ in range(50)]
    assert verdicts == [Verdict.ALLOW] * 10 + [Verdict.DROP] * 30 + [Verdict.FLOOD] * 10  # abuse burst: 40
    # arrivals at 30/s (3x the limit) for 10 s, judged at their arrival times: dropped, never flooding
    clock.now = 100.0
    verdicts = [limiter.check("q", 1, at=100.0 + i / 30) for i in range(300)]
    assert Verdict.FLOOD not in verdicts and verdicts.count(Verdict.ALLOW) >= 100
    # the same arrivals judged at drain time (all at once) would have been one burst
    assert [limiter.check("r", 1, at=110.0) for _ in range(300)].count(Verdict.FLOOD) == 260


def test_scaled_limits_for_a_relay():
    limits = RateLimits().scaled(8)
    assert limits.messages_per_s == 160 and limits.message_burst == 1600 and limits.abuse_factor == 4
