"""Peers' hint requests, waiting unverified until this node can answer one.

A node serves at most `hints.serve_per_round` requests a round, and only for prompts it has solved
(node/train/hint_writer.py), yet peers send many (20.7 a round on an 8-node tiny-warm swarm, of which at
most one was served). Checking each on arrival (signature, rebuild, a scan for duplicates) was most
of that cost. So a request is only skimmed on arrival: its envelope and body are decoded, not
authenticated, to learn which task it names, and it waits here, one per task (the first; later
ones for the same task are dropped as duplicates, unchecked). When the node can answer a task,
the request for it goes through the Ingress (signature, limits, replay, rate) and node/peers/verify.py
like any message, with its arrival time, and only then is it served.

What an unauthenticated skim costs an honest peer: a forged request for the same task, queued
first, makes its request a duplicate; the forgery then fails the Ingress when served, and that one
hint is not sent (the peer asks again the next time it fails the task). Nothing else: what is
served is always what the Ingress authenticated.

Bounds: `capacity` requests in all; a delivering peer past `per_sender` loses its oldest; when full,
a delivering peer loses its oldest: one that is not established (`established(peer)`,
node/peers/admission.py) before one that is, then the heaviest (the rule of every per-sender buffer,
protocol/inbox.py), and among equally heavy ones the newest origin (whose oldest waiting request
arrived last). Requests are unauthenticated and origins free: with the oldest origin paying ties,
64 requests from 64 fresh origins pushed out an honest peer's one. A request older than
`max_wait_s` goes unverified.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable

from protocol.transports.base import Received

DUPLICATE, SENDER_QUOTA, FULL, EXPIRED = ("hint_request_duplicate", "hint_request_sender_quota",
                                          "hint_request_full", "hint_request_expired")


@dataclass
class Waiting:
    item: Received  # the bytes as they arrived: the Ingress checks them when the request is served
    ref: object  # the TaskRef the (unauthenticated) body names
    task: object = None  # the task rebuilt from `ref`, once asked (node/peers/exchange_hints.py)


class HintRequestQueue:
    """Waiting requests by task key, oldest first. Not thread-safe: used under the ledger's lock (node/peers/ledger.py)."""

    def __init__(self, capacity: int = 64, per_sender: int = 8, max_wait_s: float = 300.0,
                 established: Callable[[str], bool] = lambda peer: False):
        self.capacity, self.per_sender, self.max_wait_s = capacity, per_sender, max_wait_s
        self.established = established
        self._waiting: OrderedDict[str, Waiting] = OrderedDict()
        self._by_sender: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, item: Received, ref) -> None:
        key = ref.key
        if key in self._waiting:
            self.dropped[DUPLICATE] += 1
            return
        sender = item.from_peer
        if self._by_sender[sender] >= self.per_sender:
            self._drop(self._oldest_of(sender), SENDER_QUOTA)
        self._waiting[key] = Waiting(item, ref)
        self._by_sender[sender] += 1
        while len(self._waiting) > self.capacity:
            self._drop(self._oldest_of(self._to_drop()), FULL)

    def waiting(self, now: float) -> list[tuple[str, Waiting]]:
        """Every request still fresh at `now` (the arrival clock's time), oldest first; the expired
        ones are dropped on the way."""
        for key in [k for k, w in self._waiting.items() if now - w.item.received_at > self.max_wait_s]:
            self._drop(key, EXPIRED)
        return list(self._waiting.items())

    def pop(self, key: str) -> Waiting:
        waiting = self._waiting.pop(key)
        self._forget(waiting.item.from_peer)
        return waiting

    def _to_drop(self) -> str:
        """The delivering peer that loses a request when full (module doc)."""
        arrival = {}  # sender -> the position of its oldest waiting request
        for position, waiting in enumerate(self._waiting.values()):
            arrival.setdefault(waiting.item.from_peer, position)
        return max(self._by_sender, key=lambda s: (not self.established(s), self._by_sender[s], arrival[s]))

    def _oldest_of(self, sender: str) -> str:
        return next(k for k, w in self._waiting.items() if w.item.from_peer == sender)

    def _drop(self, key: str, reason: str) -> None:
        self.pop(key)
        self.dropped[reason] += 1

    def _forget(self, sender: str) -> None:
        self._by_sender[sender] -= 1
        if self._by_sender[sender] <= 0:
            del self._by_sender[sender]
