"""Replay protection: a per-sender sequence window, kept as long as the sender's messages could
still pass the timestamp check, for the senders we admitted.

Each sender numbers its messages with a strictly increasing `sequence` (protocol/outbox.py). Gossip
does not preserve order, so a receiver keeps, per sender, the highest sequence seen and a bitmap
of which of the `window` sequences below it were seen (the IPsec/DTLS anti-replay window):

    sequence > highest                  new: slide the window forward, accept
    highest - window < sequence <= highest
                                        accept once (bit clear), then "replay" (bit set)
    sequence <= highest - window        "stale": too far behind to tell, refuse

Bounded by time and by admission, never by a count an attacker can fill (a count-bounded LRU let
72,000 messages from 12,000 fresh keys evict an honest sender's window, after which one of its
accepted messages was accepted again):
  * a window is dropped only after `ttl_s` without a message from its sender. The Ingress sets
    ttl_s = Limits.max_age_s + max_clock_skew_s (720 s): by then every message the sender could
    have signed before going quiet fails the timestamp check ("expired"), so forgetting it opens
    no replay.
  * KNOWN senders (`admit`: the Ingress admits a sender once one of its messages was accepted)
    have their own table of up to `max_known`; nothing evicts them early.
  * UNKNOWN senders share `max_unknown` windows. When those are full, a message from yet another
    unknown sender is refused as "busy" (no blame: it may be honest, and it can retry) rather than
    evicting anyone's window. When the known table is full, admission waits until a slot frees.
Memory: (max_known + max_unknown) windows of `window` bits (about 400 bytes each at 1024).

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

    __slots__ = ("highest", "bits", "size", "last_seen")

    def __init__(self, size: int, now: float = 0.0) -> None:
        self.highest = -1
        self.bits = 0  # bit i set <=> sequence (highest - i) was seen
        self.size = size
        self.last_seen = now

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


class _ExpiringTable:
    """Windows by sender key, oldest activity first; entries idle for `ttl_s` are dropped."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.windows: OrderedDict[bytes, SequenceWindow] = OrderedDict()

    def __len__(self) -> int:
        return len(self.windows)

    def expire(self, now: float) -> None:
        windows = self.windows
        while windows:
            key, window = next(iter(windows.items()))
            if now - window.last_seen < self.ttl_s:
                return
            del windows[key]

    def touch(self, key: bytes, now: float) -> SequenceWindow | None:
        window = self.windows.get(key)
        if window is not None:
            window.last_seen = max(window.last_seen, now)
            self.windows.move_to_end(key)
        return window


class ReplayGuard:
    """Refuses replayed, stale and (when full) unadmitted (sender, sequence) pairs.
    Not thread-safe (the Ingress locks)."""

    def __init__(
        self,
        window: int = 1024,
        *,
        max_known: int = 10_000,
        max_unknown: int = 4_096,
        ttl_s: float = 720.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1 or max_known < 1 or max_unknown < 1 or ttl_s <= 0:
            raise ValueError("window, max_known and max_unknown must be >= 1 and ttl_s > 0")
        self.window = window
        self.max_known = max_known
        self.max_unknown = max_unknown
        self._clock = clock
        self._known = _ExpiringTable(ttl_s)
        self._unknown = _ExpiringTable(ttl_s)

    @property
    def senders_tracked(self) -> int:
        return len(self._known) + len(self._unknown)

    @property
    def known_senders(self) -> int:
        return len(self._known)

    def is_known(self, sender_key: bytes) -> bool:
        return sender_key in self._known.windows

    def check_and_record(self, sender_key: bytes, sequence: int) -> None:
        """Raises Rejected("replay" | "stale" | "busy") unless this (sender, sequence) is new."""
        now = self._clock()
        self._known.expire(now)
        self._unknown.expire(now)
        window = self._known.touch(sender_key, now) or self._unknown.touch(sender_key, now)
        if window is None:
            if len(self._unknown) >= self.max_unknown:
                raise Rejected(Reason.BUSY, f"{self.max_unknown} unadmitted senders are active; try again later")
            window = self._unknown.windows[sender_key] = SequenceWindow(self.window, now)
        window.check_and_record(sequence)

    def admit(self, sender_key: bytes) -> bool:
        """Moves a sender whose message was accepted to the known table; False if it is full."""
        if sender_key in self._known.windows:
            return True
        window = self._unknown.windows.get(sender_key)
        if window is None:
            return False
        self._known.expire(self._clock())
        if len(self._known) >= self.max_known:
            return False
        del self._unknown.windows[sender_key]
        self._known.windows[sender_key] = window
        return True
