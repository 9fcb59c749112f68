"""Per-peer token buckets for messages/s and bytes/s, checked before any decoding or crypto.

Keyed by a transport-level identity (the GossipSub origin, authenticated by the transport, and
the neighbour connection that delivered the bytes where the transport knows it), never by the
key a message claims: claims are not authenticated yet at this point.

Each key has two pairs of buckets, both charged at the message's ARRIVAL time (a queued burst
that the node drains at once is not judged as one burst):
  * the limit (`messages_per_s`, `message_burst`, bytes alike): a message over it is DROPPED,
    counted, and costs the peer nothing. An honest peer that briefly out-sends us is not a
    misbehaving one.
  * the abuse line, `abuse_factor` times the limit (rate and burst): every arriving message is
    charged here, dropped or not. A peer that keeps sending more than that (4x the limit for
    longer than the 4x burst lasts) is FLOODING, which is scored.
Bounded memory: at most `max_peers` keys, least recently used evicted first (an evicted peer
starts again with full buckets, which costs at most one burst).
"""
from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class RateLimits:
    messages_per_s: float = 20.0
    message_burst: float = 200.0    # a node publishing a whole round's groups at once
    bytes_per_s: float = 4.0 * (1 << 20)
    byte_burst: float = 16.0 * (1 << 20)  # must exceed Limits.max_message_bytes or big messages never pass
    abuse_factor: float = 4.0       # arrivals above this many times the limit, sustained, are scored
    max_peers: int = 10_000

    def __post_init__(self) -> None:
        if self.abuse_factor < 1.0:
            raise ValueError("abuse_factor must be >= 1 (the abuse line cannot sit below the limit)")

    def scaled(self, factor: float) -> "RateLimits":
        """The same limits `factor` times higher (e.g. for a relay that carries many origins)."""
        return dataclasses.replace(self, messages_per_s=self.messages_per_s * factor,
                                   message_burst=self.message_burst * factor, bytes_per_s=self.bytes_per_s * factor,
                                   byte_burst=self.byte_burst * factor)


class Verdict(enum.Enum):
    ALLOW = "allow"
    DROP = "drop"        # over the limit: refuse, no blame
    FLOOD = "flood"      # over the abuse line: refuse and score


class TokenBucket:
    """`rate` tokens a second, at most `burst`: the one token bucket of the protocol (rate limits,
    publication pace). Out-of-order times and a clock stepping back refill nothing."""

    __slots__ = ("rate", "burst", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.updated = now

    def refill(self, now: float) -> None:
        elapsed = now - self.updated
        if elapsed <= 0:
            return
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = now

    def take(self, n: float = 1.0) -> bool:
        if self.tokens < n:
            return False
        self.tokens -= n
        return True


class _Bucket:
    """A message bucket and a byte bucket, charged together or not at all."""

    __slots__ = ("messages", "bytes")

    def __init__(self, messages_per_s: float, message_burst: float, bytes_per_s: float, byte_burst: float,
                 now: float) -> None:
        self.messages = TokenBucket(messages_per_s, message_burst, now)
        self.bytes = TokenBucket(bytes_per_s, byte_burst, now)

    def refill(self, now: float) -> None:
        self.messages.refill(now)
        self.bytes.refill(now)

    def take(self, nbytes: int) -> bool:
        if self.messages.tokens < 1.0 or self.bytes.tokens < nbytes:
            return False
        self.messages.tokens -= 1.0
        self.bytes.tokens -= nbytes
        return True


class RateLimiter:
    """`check(peer, nbytes, at)` -> Verdict; `allow(...)` is True only for Verdict.ALLOW."""

    def __init__(self, limits: RateLimits = RateLimits(), clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._peers: OrderedDict[str, tuple[_Bucket, _Bucket]] = OrderedDict()

    @property
    def peers_tracked(self) -> int:
        return len(self._peers)

    def now(self) -> float:
        return self._clock()

    def check(self, peer: str, nbytes: int, at: float | None = None) -> Verdict:
        """Charges a message of `nbytes` that arrived at `at` (this limiter's clock; now if None)."""
        limits = self.limits
        now = self._clock() if at is None else at
        factor = limits.abuse_factor
        buckets = self._peers.get(peer)
        if buckets is None:
            buckets = self._peers[peer] = (
                _Bucket(limits.messages_per_s, limits.message_burst, limits.bytes_per_s, limits.byte_burst, now),
                _Bucket(limits.messages_per_s * factor, limits.message_burst * factor, limits.bytes_per_s * factor,
                        limits.byte_burst * factor, now))
            if len(self._peers) > limits.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
        limit, abuse = buckets
        limit.refill(now)
        abuse.refill(now)
        if not abuse.take(nbytes):
            return Verdict.FLOOD
        return Verdict.ALLOW if limit.take(nbytes) else Verdict.DROP

    def allow(self, peer: str, nbytes: int, at: float | None = None) -> bool:
        return self.check(peer, nbytes, at) is Verdict.ALLOW


class Pacer:
    """Paces a writer (the p2pd transport's publishes): `wait` returns when one more message may go (or at once when `stop` is set)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.bucket = TokenBucket(rate, float(burst), time.monotonic())

    def wait(self, stop: threading.Event) -> None:
        bucket = self.bucket
        bucket.refill(time.monotonic())
        if bucket.tokens < 1.0:
            stop.wait((1.0 - bucket.tokens) / bucket.rate)
            bucket.refill(time.monotonic())
            bucket.tokens = max(bucket.tokens, 1.0)  # woken early by stop: this message still goes
        bucket.take()
