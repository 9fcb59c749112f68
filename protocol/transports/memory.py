"""In-process transport: a `MemoryBus` that every `MemoryTransport` on it shares.

For tests and in-process simulation. Thread-safe. Faults can be injected on the bus: message loss,
duplication, latency with jitter (which also reorders, as gossip does), network partitions and
one-way mutes (`mute`: a listener deaf to some authors).
Delivery is "every started transport subscribed to the topic, except the publisher". A message is
on the wire until its latency has passed (not in any inbox: what senders published within one
latency), then enters its topic's inbox, a FairBuffer (protocol/inbox.py): when full, the heaviest
sender loses its oldest. `forward` models a gossip relay: receivers see the message's origin as
`from_peer` and the relay as `neighbour`.
"""
from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import Counter
from typing import Callable, Iterable

from ..inbox import FairBuffer
from ..netgroups import network_group
from .base import (
    COUNTER_DROPPED_INBOUND_FULL,
    COUNTER_DROPPED_OUTBOUND_CLOSED,
    COUNTER_DROPPED_UNSUBSCRIBED,
    COUNTER_PUBLISHED,
    COUNTER_RECEIVED,
    Received,
)


class MemoryBus:
    """The shared medium.

    loss, duplicate: probability that one recipient loses / gets a second copy of a message.
    latency_s: (min, max) delivery delay, uniform; a message is invisible to `drain` until then.
    """

    def __init__(
        self,
        *,
        loss: float = 0.0,
        duplicate: float = 0.0,
        latency_s: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (0.0 <= loss <= 1.0 and 0.0 <= duplicate <= 1.0 and 0.0 <= latency_s[0] <= latency_s[1]):
            raise ValueError("need 0 <= loss, duplicate <= 1 and 0 <= min latency <= max latency")
        self.loss = loss
        self.duplicate = duplicate
        self.latency_s = latency_s
        self.clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._members: dict[str, MemoryTransport] = {}
        self._partitioned = False
        self._group_of: dict[str, int] = {}  # peer -> partition group, while partitioned
        self._muted: dict[str, set[str]] = {}  # listener -> authors whose messages it never receives
        self.counters: Counter[str] = Counter()

    def partition(self, *groups: Iterable[str]) -> None:
        """Only peers in the same group reach each other (peers in no group reach nobody)."""
        with self._lock:
            self._group_of = {peer: i for i, group in enumerate(groups) for peer in group}
            self._partitioned = True

    def heal(self) -> None:
        with self._lock:
            self._group_of = {}
            self._partitioned = False

    def mute(self, listener: str, authors: Iterable[str]) -> None:
        """`listener` never receives what `authors` publish or is relayed for them, while they still
        hear it: a one-way block (a partition cuts both ways), e.g. a testnet's learners hearing
        only their frozen peers."""
        with self._lock:
            self._muted.setdefault(listener, set()).update(authors)

    def _reachable(self, a: str, b: str) -> bool:
        if not self._partitioned:
            return True
        group = self._group_of.get(a)
        return group is not None and group == self._group_of.get(b)

    def _attach(self, transport: MemoryTransport) -> None:
        with self._lock:
            if transport.peer_id in self._members:
                raise ValueError(f"peer id {transport.peer_id} is already on this bus")
            self._members[transport.peer_id] = transport

    def _detach(self, transport: MemoryTransport) -> None:
        with self._lock:
            if self._members.get(transport.peer_id) is transport:
                del self._members[transport.peer_id]

    def _peers_of(self, peer_id: str) -> list[str]:
        with self._lock:
            return sorted(p for p in self._members if p != peer_id and self._reachable(peer_id, p))

    def _deliver(self, sender: str, topic: str, data: bytes, origin: str | None = None) -> None:
        now = self.clock()
        plan: list[tuple[MemoryTransport, float]] = []
        with self._lock:  # decide every fault under one lock: runs are reproducible per seed
            for peer, member in self._members.items():
                if peer == sender or not self._reachable(sender, peer):
                    continue
                if self._muted and {sender, origin or sender} & self._muted.get(peer, set()):
                    self.counters["muted"] += 1
                    continue
                if self.loss and self._rng.random() < self.loss:
                    self.counters["lost"] += 1
                    continue
                copies = 2 if self.duplicate and self._rng.random() < self.duplicate else 1
                self.counters["duplicated"] += copies - 1
                for _ in range(copies):
                    plan.append((member, now + self._rng.uniform(*self.latency_s)))
        for member, deliver_at in plan:
            member._receive(topic, Received(origin or sender, data, deliver_at, neighbour=sender))


class MemoryTransport:
    """One peer on a MemoryBus (implements protocol.transports.base.Transport)."""

    def __init__(self, bus: MemoryBus, peer_id: str, *, inbox_capacity: int = 10_000,
                 inbox_max_bytes: int = 64 * 1024 * 1024, address: str = "") -> None:
        self.bus = bus
        self.peer_id = peer_id
        self.address = address  # a simulated multiaddr, for network groups (protocol/netgroups.py); "": a host of its own
        self.inbox_capacity, self.inbox_max_bytes = inbox_capacity, inbox_max_bytes
        self._lock = threading.Lock()
        self._inboxes: dict[str, FairBuffer[Received]] = {}
        self._on_the_wire: list[tuple[float, int, str, Received]] = []  # heap: (arrives at, order, topic, item)
        self._order = itertools.count()
        self._started = False
        self._closed = False
        self._counters: Counter[str] = Counter()

    def start(self) -> None:
        if self._closed:
            raise RuntimeError(f"MemoryTransport {self.peer_id} was closed; make a new one")
        if not self._started:
            self.bus._attach(self)
            self._started = True

    def subscribe(self, topic: str) -> None:
        with self._lock:
            if topic not in self._inboxes:
                self._inboxes[topic] = FairBuffer(self.inbox_capacity, max_bytes=self.inbox_max_bytes,
                                                  size=lambda item: len(item.data))

    def publish(self, topic: str, data: bytes) -> None:
        self.forward(topic, data, self.peer_id)

    def forward(self, topic: str, data: bytes, origin: str) -> None:
        """Relays `data` as a message that `origin` published (a gossip relay, or a replay of a
        captured message under its original origin)."""
        # Like the libp2p transport: publishing before start works, after close drops and counts.
        with self._lock:
            if self._closed:
                self._counters[COUNTER_DROPPED_OUTBOUND_CLOSED] += 1
                return
            self._counters[COUNTER_PUBLISHED] += 1
        self.bus._deliver(self.peer_id, topic, bytes(data), origin)

    def _receive(self, topic: str, item: Received) -> None:
        now = self.bus.clock()
        with self._lock:
            if topic not in self._inboxes:
                self._counters[COUNTER_DROPPED_UNSUBSCRIBED] += 1
                return
            self._counters[COUNTER_RECEIVED] += 1
            heapq.heappush(self._on_the_wire, (item.received_at, next(self._order), topic, item))
            self._arrive(now)

    def _arrive(self, now: float) -> None:
        """Moves what has arrived by `now` off the wire into its inbox, in arrival order."""
        wire = self._on_the_wire
        while wire and wire[0][0] <= now:
            _, _, topic, item = heapq.heappop(wire)
            if self._inboxes[topic].put(item.from_peer, item):
                self._counters[COUNTER_DROPPED_INBOUND_FULL] += 1  # one drop per put: no byte bound here

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        now = self.bus.clock()
        with self._lock:
            self._arrive(now)
            inbox = self._inboxes.get(topic)
            return [] if inbox is None else inbox.take(max_items)

    def peers(self) -> list[str]:
        return self.bus._peers_of(self.peer_id) if self._started else []

    def network_group(self, peer_id: str) -> str:
        """A member's network group: its simulated `address`'s, else its own (`host:<name>`: each
        member is one machine, however many keys it signs with); "" for no such member."""
        member = self.bus._members.get(peer_id)
        if member is None:
            return ""
        return network_group(member.address) if member.address else f"host:{peer_id}"

    def listen_addrs(self) -> list[str]:
        return [f"/memory/{self.peer_id}"]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def dropped_by_sender(self) -> dict[str, int]:
        """Messages each sender lost to a full inbox (all topics)."""
        with self._lock:
            total: Counter[str] = Counter()
            for inbox in self._inboxes.values():
                total.update(inbox.dropped)
            return dict(total)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        if self._started:
            self.bus._detach(self)
            self._started = False
