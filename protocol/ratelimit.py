"""Per-peer token buckets for messages/s and bytes/s, checked before any decoding or crypto.

Keyed by the transport peer that handed us the bytes (authenticated by the transport's secure
channel), never by the key a message claims: claims are not authenticated yet at this point.
Bounded memory: at most `max_peers` buckets, least recently used evicted first (an evicted peer
starts again with a full bucket, which costs at most one burst).
"""
from __future__ import annotations

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
    max_peers: int = 10_000


class _Buckets:
    __slots__ = ("messages", "bytes", "updated")

    def __init__(self, limits: RateLimits, now: float) -> None:
        self.messages = limits.message_burst
        self.bytes = limits.byte_burst
        self.updated = now


class RateLimiter:
    """`allow(peer, nbytes)`: True and charge both buckets, or False and charge nothing."""

    def __init__(self, limits: RateLimits = RateLimits(), clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._peers: OrderedDict[str, _Buckets] = OrderedDict()

    @property
    def peers_tracked(self) -> int:
        return len(self._peers)

    def allow(self, peer: str, nbytes: int) -> bool:
        limits = self.limits
        now = self._clock()
        buckets = self._peers.get(peer)
        if buckets is None:
            buckets = self._peers[peer] = _Buckets(limits, now)
            if len(self._peers) > limits.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
            elapsed = max(0.0, now - buckets.updated)  # a clock stepping back refills nothing
            buckets.messages = min(limits.message_burst, buckets.messages + elapsed * limits.messages_per_s)
            buckets.bytes = min(limits.byte_burst, buckets.bytes + elapsed * limits.bytes_per_s)
            buckets.updated = now
        if buckets.messages < 1.0 or buckets.bytes < nbytes:
            return False
        buckets.messages -= 1.0
        buckets.bytes -= nbytes
        return True
