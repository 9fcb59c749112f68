"""Ingest off the training thread: staging with per-sender quotas, a per-round budget, a worker thread.

    transport.drain (every topic) -> Staging (a queue per delivering peer)
        -> fair take (one message per peer in turn) -> verify (the exchange's callback) -> pool

When more arrives than the worker may verify, staging drops from the heaviest sender (the peer with
the most staged messages), never oldest-first across everyone: a flooder fills only its own queue.
Drops are counted by reason and by sender class ("known": a peer that already delivered a verified
group, "new": any other). The budget bounds what the worker verifies per round (messages, bytes,
and its share of wall time, since verification holds the GIL the training thread also needs).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

from protocol import Received, Transport

log = logging.getLogger(__name__)

IDLE_SLEEP_S = 0.02  # nothing to verify now: poll again after this long (each wake-up wants the GIL)


@dataclass(frozen=True)
class IngestBudget:
    max_messages: int = 64           # verified per round at most
    max_bytes: int = 8 * 1024 * 1024  # of envelopes verified per round at most
    max_share: float = 0.05          # of wall time the worker may spend verifying (GIL shared with training)
    per_sender_staged: int = 64      # staged messages per delivering peer
    max_staged: int = 2048           # staged messages in all


@dataclass(frozen=True)
class Staged:
    topic: str
    item: Received
    round_index: int  # the round during which it arrived: pooled groups age from there


class Staging:
    """Messages waiting for verification, one queue per delivering peer. Not thread-safe (one owner)."""

    def __init__(self, per_sender: int, max_total: int, sender_class: Callable[[str], str]):
        self.per_sender = per_sender
        self.max_total = max_total
        self.sender_class = sender_class
        self.queues: dict[str, deque[Staged]] = {}
        self.total = 0
        self.dropped: Counter[str] = Counter()  # "<reason>/<sender class>"

    def add(self, topic: str, items: list[Received], round_index: int = 0) -> None:
        for item in items:
            queue = self.queues.setdefault(item.from_peer, deque())
            queue.append(Staged(topic, item, round_index))
            self.total += 1
            if len(queue) > self.per_sender:
                self._drop_oldest(item.from_peer, "sender_quota")
            if self.total > self.max_total:
                heaviest = max(self.queues, key=lambda peer: len(self.queues[peer]))
                self._drop_oldest(heaviest, "staging_full")

    def _drop_oldest(self, peer: str, reason: str) -> None:
        queue = self.queues[peer]
        queue.popleft()  # the freshest rollouts are worth the most
        self.total -= 1
        if not queue:
            del self.queues[peer]
        self.dropped[f"{reason}/{self.sender_class(peer)}"] += 1

    def take_fair(self) -> Staged | None:
        """The oldest staged message of the peer that has waited longest for its turn."""
        if not self.queues:
            return None
        peer = next(iter(self.queues))
        queue = self.queues.pop(peer)
        staged = queue.popleft()
        self.total -= 1
        if queue:
            self.queues[peer] = queue  # re-inserted last: the next peer goes first next time
        return staged


class IngestWorker:
    """Drains `topics` of `transport` into staging and verifies within `budget` per round, on its own
    thread. `verify(staged)` does the work; an exception from it drops that message (counted)."""

    def __init__(self, transport: Transport, topics: list[str], verify: Callable[[Staged], None],
                 budget: IngestBudget, sender_class: Callable[[str], str], name: str = "ingest"):
        self.transport = transport
        self.topics = topics
        self.verify = verify
        self.budget = budget
        self.staging = Staging(budget.per_sender_staged, budget.max_staged, sender_class)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()  # guards counters and the round's budget, read by status()
        self._round_started = time.monotonic()
        self._round = {"messages": 0, "bytes": 0, "seconds": 0.0}
        self.round_index = 0  # the training loop's current round
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def new_round(self, round_index: int) -> None:
        """The training loop started collecting round `round_index`: the budget starts over."""
        with self._lock:
            self.round_index = round_index
            self._round_started = time.monotonic()
            self._round = {"messages": 0, "bytes": 0, "seconds": 0.0}

    def snapshot(self) -> dict:
        with self._lock:
            return {**self.counters, "staged": self.staging.total,
                    "dropped": dict(self.staging.dropped)}

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("ingest worker still busy after %.1f s; it is a daemon thread and ends with "
                            "the process", timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.step()
            except Exception:  # our bug, not a peer's: keep ingesting, say so loudly
                log.exception("ingest worker step failed")
                worked = False
            if not worked:
                self._stop.wait(IDLE_SLEEP_S)

    def step(self) -> bool:
        """Drain, stage, verify what the budget allows; True if it verified anything."""
        with self._lock:
            for topic in self.topics:
                self.staging.add(topic, self.transport.drain(topic), self.round_index)
        verified_any = False
        while not self._stop.is_set() and self._within_budget():
            with self._lock:
                staged = self.staging.take_fair()
            if staged is None:
                break
            started = time.monotonic()
            try:
                self.verify(staged)
            except Exception as err:  # peer data broke our code: drop that message, never the worker
                log.warning("dropping a message from %s: verification raised %r", staged.item.from_peer, err)
                with self._lock:
                    self.counters["verify_error"] += 1
            spent = time.monotonic() - started
            with self._lock:
                self._round["messages"] += 1
                self._round["bytes"] += len(staged.item.data)
                self._round["seconds"] += spent
                self.counters["verified"] += 1
            verified_any = True
        return verified_any

    def _within_budget(self) -> bool:
        with self._lock:
            used = self._round
            elapsed = time.monotonic() - self._round_started
            ok = (used["messages"] < self.budget.max_messages and used["bytes"] < self.budget.max_bytes
                  and used["seconds"] <= self.budget.max_share * elapsed)
            if not ok:
                self.counters["budget_waits"] += 1
            return ok
