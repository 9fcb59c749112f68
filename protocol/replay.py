"""Replay protection: a per-sender sequence window, kept as long as the sender's messages could
still pass the timestamp check, and a compact memory of the windows it had to forget.

Each sender numbers its messages with a strictly increasing `sequence` (protocol/outbox.py). Gossip
does not preserve order, so a receiver keeps, per sender, the highest sequence seen and a bitmap
of which of the `window` sequences below it were seen (the IPsec/DTLS anti-replay window):

    sequence > highest                  new: slide the window forward, accept
    highest - window < sequence <= highest
                                        accept once (bit clear), then "replay" (bit set)
    sequence <= highest - window        "stale": too far behind to tell, refuse

Bounded in memory, and never full to a newcomer (a table that refused new senders when full let
14,100 keys sending one valid message every 12 minutes lock every new honest node out as "busy"):
  * a window is dropped after `ttl_s` without a message from its sender. The Ingress sets
    ttl_s = Limits.max_age_s + max_clock_skew_s (720 s): by then every message the sender could
    have signed before going quiet fails the timestamp check ("expired"), so forgetting it opens
    no replay.
  * KNOWN senders (`admit`: the Ingress admits a sender once one of its messages was accepted)
    have their own table of up to `max_known`; nothing evicts them early. When it is full,
    admission waits until a slot frees (the sender keeps its unknown window meanwhile).
  * UNKNOWN senders share `max_unknown` windows. When those are full, a message from yet another
    sender evicts the least recently active unknown window, and the evicted sender's newest
    timestamp goes into the FORGOTTEN table: `forgotten_slots` timestamps indexed by a keyed hash
    of the sender key (the hash key is random per process, so nobody can aim at a slot). A sender
    without a window must sign after the timestamp in its slot, and the window it then gets keeps
    that floor: every message of a forgotten window is refused as "stale", so eviction opens no
    replay. Its cost: a sender evicted while some of its messages were still in flight loses
    those, and a newcomer whose slot holds a recent eviction waits until it signs after it (at most
    max_clock_skew_s past that eviction, as the evicted timestamp was checked against our clock).
Memory: (max_known + max_unknown) windows of `window` bits (about 400 bytes each at 1024), plus
8 bytes per forgotten slot (2 MiB at the default 2^18).

A message id is (sender key, sequence), not a hash of the content: a sender that signs two
different bodies under one sequence is equivocating, and the second one is refused as a replay.
"""
from __future__ import annotations

import hashlib
import os
import time
from array import array
from collections import OrderedDict
from typing import Callable

from .errors import Reason, Rejected


class SequenceWindow:
    """Anti-replay window for one sender."""

    __slots__ = ("highest", "bits", "size", "last_seen", "floor_ms", "newest_ms")

    def __init__(self, size: int, now: float = 0.0, floor_ms: int = 0) -> None:
        self.highest = -1
        self.bits = 0  # bit i set <=> sequence (highest - i) was seen
        self.size = size
        self.last_seen = now
        self.floor_ms = floor_ms  # older timestamps may be replays of a forgotten window: "stale"
        self.newest_ms = 0        # newest timestamp recorded: the floor this window leaves when forgotten

    def check_and_record(self, sequence: int, timestamp_ms: int = 0) -> None:
        if timestamp_ms < self.floor_ms:
            raise Rejected(Reason.STALE, f"signed at {timestamp_ms} ms, before this sender's window was forgotten")
        if sequence > self.highest:
            shift = sequence - self.highest
            # Never shift by the raw distance: sequences jump by ~2^22 per ms across restarts.
            self.bits = 1 if shift >= self.size else ((self.bits << shift) | 1) & ((1 << self.size) - 1)
            self.highest = sequence
        else:
            behind = self.highest - sequence
            if behind >= self.size:
                raise Rejected(Reason.STALE, f"sequence {sequence} is {behind} behind the newest {self.highest}")
            if self.bits >> behind & 1:
                raise Rejected(Reason.REPLAY, f"sequence {sequence} already seen")
            self.bits |= 1 << behind
        self.newest_ms = max(self.newest_ms, timestamp_ms)


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


class _ForgottenFloors:
    """Per hashed slot, the newest timestamp (+1 ms) of any window forgotten early into it. Slots are
    shared, so a collision only makes a sender wait; it never lets a replay through."""

    def __init__(self, slots: int) -> None:
        self.floors = array("q", bytes(8 * slots))
        self._hash_key = os.urandom(16)

    def _slot(self, sender_key: bytes) -> int:
        digest = hashlib.blake2b(sender_key, key=self._hash_key, digest_size=8).digest()
        return int.from_bytes(digest, "little") % len(self.floors)

    def floor(self, sender_key: bytes) -> int:
        return self.floors[self._slot(sender_key)]

    def forget(self, sender_key: bytes, window: SequenceWindow) -> None:
        slot = self._slot(sender_key)
        self.floors[slot] = max(self.floors[slot], window.floor_ms, window.newest_ms + 1)


class ReplayGuard:
    """Refuses replayed and stale (sender, sequence, timestamp) triples; never refuses a newcomer
    for want of room. Not thread-safe (the Ingress locks)."""

    def __init__(
        self,
        window: int = 1024,
        *,
        max_known: int = 10_000,
        max_unknown: int = 4_096,
        ttl_s: float = 720.0,
        forgotten_slots: int = 1 << 18,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1 or max_known < 1 or max_unknown < 1 or forgotten_slots < 1 or ttl_s <= 0:
            raise ValueError("window, max_known, max_unknown and forgotten_slots must be >= 1 and ttl_s > 0")
        self.window = window
        self.max_known = max_known
        self.max_unknown = max_unknown
        self._clock = clock
        self._known = _ExpiringTable(ttl_s)
        self._unknown = _ExpiringTable(ttl_s)
        self._forgotten = _ForgottenFloors(forgotten_slots)
        self.evicted = 0  # unknown windows forgotten early to make room

    @property
    def senders_tracked(self) -> int:
        return len(self._known) + len(self._unknown)

    @property
    def known_senders(self) -> int:
        return len(self._known)

    def is_known(self, sender_key: bytes) -> bool:
        return sender_key in self._known.windows

    def check_and_record(self, sender_key: bytes, sequence: int, timestamp_ms: int) -> None:
        """Raises Rejected("replay" | "stale") unless this (sender, sequence) is new. `timestamp_ms`
        must already have passed the Ingress' timestamp check."""
        now = self._clock()
        self._known.expire(now)
        self._unknown.expire(now)
        window = self._known.touch(sender_key, now) or self._unknown.touch(sender_key, now)
        if window is None:
            floor_ms = self._forgotten.floor(sender_key)
            if timestamp_ms < floor_ms:
                raise Rejected(Reason.STALE, f"signed at {timestamp_ms} ms, before a window in its slot was forgotten")
            if len(self._unknown) >= self.max_unknown:
                self._evict_least_recent()
            window = self._unknown.windows[sender_key] = SequenceWindow(self.window, now, floor_ms)
        window.check_and_record(sequence, timestamp_ms)

    def _evict_least_recent(self) -> None:
        key, window = self._unknown.windows.popitem(last=False)
        self._forgotten.forget(key, window)
        self.evicted += 1

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
