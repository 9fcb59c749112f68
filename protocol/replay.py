"""Replay protection: a per-sender sequence window plus a bounded seen-cache of message ids.

Each sender numbers its messages with a strictly increasing `sequence` (protocol/outbox.py). Gossip
does not preserve order, so a receiver keeps, per sender, the highest sequence seen and a bitmap
of which of the `window` sequences below it were seen (the IPsec/DTLS anti-replay window):

    sequence > highest                  new: slide the window forward, accept
    highest - window < sequence <= highest
                                        accept once (bit clear), then "replay" (bit set)
    sequence <= highest - window        "stale": too far behind to tell, refuse

Memory stays bounded however many senders there are: at most `max_senders` windows (least
recently active evicted first) and at most `seen_capacity` message ids, each expiring after
`seen_ttl_s`. The seen-cache catches replays aimed at a sender whose window was evicted; both
structures are only updated for authenticated messages, so nobody can poison another's window.
What bounded memory costs: if more than `max_senders` keys are active, an evicted sender's
message could be replayed once its id has also left the seen-cache; the Ingress' timestamp
window still refuses it once it is old (Limits.max_age_s = 600 s; the seen-cache TTL the Ingress
sets is max_age_s + max_clock_skew_s = 720 s, so an id is remembered as long as its timestamp
could pass).

A message id is (sender key, sequence), not a hash of the content: a sender that signs two
different bodies under one sequence is equivocating, and the second one is refused as a replay.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from .errors import Reason, Rejected


class SequenceWindow:
    """Anti-replay window for one sender."""

    __slots__ = ("highest", "bits", "size")

    def __init__(self, size: int) -> None:
        self.highest = -1
        self.bits = 0  # bit i set <=> sequence (highest - i) was seen
        self.size = size

    def check_and_record(self, sequence: int) -> None:
        if sequence > self.highest:
            shift = sequence - self.highest
            # Never shift by the raw distance: sequences jump by ~2^22 per ms across restarts.
            self.bits = 1 if shift >= self.size else ((self.bits << shift) | 1) & ((1 << self.size) - 1)
            self.highest = sequence
            return
        behind = self.highest - sequence
        if behind >= self.size:
            raise Rejected(Reason.STALE, f"sequence {sequence} is {behind} behind the newest {self.highest}")
        if self.bits >> behind & 1:
            raise Rejected(Reason.REPLAY, f"sequence {sequence} already seen")
        self.bits |= 1 << behind


class SeenCache:
    """Bounded set of message ids with a time to live (LRU by insertion time)."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def add_if_new(self, message_id: bytes) -> bool:
        """Records `message_id`; False if it was already there (and not expired)."""
        now = self._clock()
        expiry = self._expiry
        # Entries are in insertion order and share one TTL, so expired ones sit at the front.
        while expiry:
            oldest_id, oldest_expiry = next(iter(expiry.items()))
            if oldest_expiry > now:
                break
            del expiry[oldest_id]
        if message_id in expiry:
            return False
        expiry[message_id] = now + self.ttl_s
        if len(expiry) > self.capacity:
            expiry.popitem(last=False)
        return True


class ReplayGuard:
    """Refuses replayed and stale (sender, sequence) pairs. Not thread-safe (the Ingress locks)."""

    def __init__(
        self,
        window: int = 1024,
        max_senders: int = 10_000,
        seen_capacity: int = 65_536,
        seen_ttl_s: float = 720.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1 or max_senders < 1 or seen_capacity < 1:
            raise ValueError("window, max_senders and seen_capacity must be >= 1")
        self.window = window
        self.max_senders = max_senders
        self._windows: OrderedDict[bytes, SequenceWindow] = OrderedDict()
        self.seen = SeenCache(seen_capacity, seen_ttl_s, clock)

    @property
    def senders_tracked(self) -> int:
        return len(self._windows)

    def check_and_record(self, sender_key: bytes, sequence: int) -> None:
        """Raises Rejected("replay" | "stale") unless this (sender, sequence) is new."""
        window = self._windows.get(sender_key)
        if window is None:
            window = self._windows[sender_key] = SequenceWindow(self.window)
            if len(self._windows) > self.max_senders:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(sender_key)
        window.check_and_record(sequence)
        if not self.seen.add_if_new(sender_key + sequence.to_bytes(8, "big")):
            raise Rejected(Reason.REPLAY, f"message id (sender, {sequence}) already seen")
