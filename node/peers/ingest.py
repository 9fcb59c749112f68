"""Ingest off the training thread: staging in two lanes by sender class, a per-round budget, a worker thread.

    transport.drain (every topic) -> Staging: a lane per sender class, a queue per delivering peer
        -> take: established senders first, young ones within their share
        -> the checks (node/peers/intake.py: skim, Ingress, precheck) -> pool
    spare budget -> one pooled group verified ahead of the picks (node/peers/verification.py)

The worker is handed the two stage objects it runs (`checks`, `ahead`) and never calls back into
the exchange. Identities are free, so a checking budget shared round-robin by every origin would go to
whoever has the most origins: 1,000 fresh keys would leave an established peer one turn in a
thousand, and its groups would expire unchecked. Staging therefore keeps two lanes, by what
`sender_class(peer)` says now (node/peers/admission.py: "established", or "young" for young and unknown
origins; the exchange classes a delivering host by the key it was last authenticated publishing for,
node/peers/signers.py), and young senders together get at most `young_share` of each round's checking
budget (messages, bytes, seconds) and of staging capacity; established senders get the rest, and
what young ones leave unused. Within a lane, peers are served round-robin, oldest message first.

When more arrives than the worker may check, a lane drops from its heaviest sender (the peer with
the most staged messages, or past the byte bound the most bytes, loses its oldest; protocol/inbox.py's
FairBuffer, the rule every bounded per-sender buffer follows), never oldest-first across everyone: a
flooder fills only its own queue. Staging is bounded by bytes as well as by count (`staged_max_bytes`):
2,048 messages of up to 1 MiB would be 2 GiB.
A message that waited more than `max_wait_s` seconds is dropped unchecked when its sender's turn
comes, and that same turn checks the sender's next fresh message (protocol/inbox.py
`take_fresh`): an expired message never costs its sender the turn, so a sender served one turn in N
is checked one time in N, not never. The limit is in seconds, not rounds: 5 rounds were 0.1 s at a
node running 50 rounds/s (hundreds of honest messages expired unchecked) and 5 minutes at a slow
one. Drops are counted by reason and sender class ("expired/young").
The budget bounds what the worker checks per round (messages, bytes, and its share of wall time,
since checking holds the GIL the training thread also needs), with one floor: while established
senders have messages waiting, one of theirs is checked at least every `heard_every_s` (1 s)
whatever the budget. Under a flood on a saturated machine (load 16 on 2 cores) a check took
so long that the share of wall time was spent for seconds at a time, and the honest peer went 2-3 s
unheard; the floor costs at most one check a second. "Checked" is what the worker does to a
message (the Ingress and the cheap checks); "verified" is a group's full verification (re-score,
re-tokenize, tier), which the worker does only ahead of the picks (`verified_ahead`).
"""
from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

from protocol import Received, Transport
from protocol.inbox import FULL, QUOTA, FairBuffer

log = logging.getLogger(__name__)

MAX_PEERS_COUNTED, MAX_PEERS_SHOWN = 1024, 64  # checked_by_peer: kept, and shown in status
IDLE_SLEEP_S = 0.02  # nothing to check now: poll again after this long (each wake-up wants the GIL)
ESTABLISHED, YOUNG = "established", "young"  # sender classes (young: young and unknown origins)
CLASSES = (ESTABLISHED, YOUNG)
_REASONS = {QUOTA: "sender_quota", FULL: "staging_full"}  # a FairBuffer's drop reasons, as staging counts them


@dataclass(frozen=True)
class IngestBudget:
    max_messages: int = 64           # checked per round at most
    max_bytes: int = 8 * 1024 * 1024  # of envelopes checked per round at most
    max_share: float = 0.05          # of wall time the worker may spend checking (GIL shared with training)
    staged_per_sender: int = 64      # staged messages per delivering peer
    staged_max: int = 2048           # staged messages in all
    staged_max_bytes: int = 64 * 1024 * 1024  # staged bytes in all (messages of up to 1 MiB)
    young_share: float = 0.25        # of the budget and of staging that young senders share at most
    heard_every_s: float = 1.0       # an established sender's message is checked this often at least, budget or not
    max_wait_s: float = 10.0         # a message staged longer than this is dropped unchecked at its sender's turn

    @classmethod
    def from_config(cls, section) -> IngestBudget:
        """From the config's `swarm.ingest` section (its keys but `mode` are these fields)."""
        return cls(**section.model_dump(exclude={"mode"}))


@dataclass(frozen=True)
class Staged:
    topic: str
    item: Received
    staged_at: float = 0.0  # time.monotonic() when staged: it expires `max_wait_s` later


def _staged_bytes(staged: Staged) -> int:
    return len(staged.item.data)


class Checks(Protocol):
    """What the worker runs on each staged message (node/peers/intake.py `Intake`)."""

    def check(self, staged: Staged, round_index: int) -> None: ...


class VerifiesAhead(Protocol):
    """What the worker runs in its spare budget (node/peers/verification.py `Verification`): True if
    it verified a pooled group."""

    def verify_ahead(self) -> bool: ...


class Staging:
    """Messages waiting to be checked, in a lane per sender class, each lane a FairBuffer
    (protocol/inbox.py: a per-sender quota, the heaviest sender's oldest goes when full, round-robin
    take). Not thread-safe (one owner). Young senders together hold at most `young_share` of
    `max_total` messages and of `max_bytes` bytes; established senders may use the rest and whatever
    young ones leave free. When the lanes together are full, the lane whose heaviest sender holds
    more (messages, or bytes when the byte bound is what was passed) loses (ties: young pays)."""

    def __init__(self, per_sender: int, max_total: int, sender_class: Callable[[str], str],
                 young_share: float = 1.0, max_bytes: int = IngestBudget.staged_max_bytes):
        self.per_sender = per_sender
        self.max_total, self.max_bytes = max_total, max_bytes
        self.young_max = max(1, math.ceil(young_share * max_total))
        self.young_max_bytes = max(1, math.ceil(young_share * max_bytes))
        self.sender_class = sender_class
        arrivals = itertools.count()  # shared: a queue that changes lanes keeps its age
        self.lanes: dict[str, FairBuffer[Staged]] = {
            ESTABLISHED: FairBuffer(max_total, per_sender, max_bytes=max_bytes, size=_staged_bytes, arrivals=arrivals),
            YOUNG: FairBuffer(self.young_max, per_sender, max_bytes=self.young_max_bytes, size=_staged_bytes,
                              arrivals=arrivals)}
        self.dropped: Counter[str] = Counter()  # "<reason>/<sender class>"

    @property
    def total(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())

    @property
    def nbytes(self) -> int:
        return sum(lane.nbytes for lane in self.lanes.values())

    def staged(self) -> dict[str, int]:
        return {cls: len(lane) for cls, lane in self.lanes.items()}

    def queued(self, peer: str) -> int:
        return sum(lane.queued(peer) for lane in self.lanes.values())

    def add(self, topic: str, items: list[Received], now: float = 0.0) -> None:
        for item in items:
            peer = item.from_peer
            cls = self._classify(peer)
            for reason in self.lanes[cls].put(peer, Staged(topic, item, now)):
                self.dropped[f"{_REASONS[reason]}/{cls}"] += 1
            young = self.lanes[YOUNG]
            while len(young) > self.young_max:  # (a queue that changed lanes can bring several)
                self._evict(YOUNG)
            while young.nbytes > self.young_max_bytes:
                self._evict(YOUNG, by_bytes=True)
            while self.total > self.max_total:
                self._shed()
            while self.nbytes > self.max_bytes:
                self._shed(by_bytes=True)

    def _classify(self, peer: str) -> str:
        """The peer's class now; its queue moves lanes when the class changed since it last sent."""
        cls = self.sender_class(peer)
        for other, lane in self.lanes.items():
            if other != cls and lane.queued(peer):
                self.lanes[cls].attach(peer, lane.detach(peer))
        return cls

    def _shed(self, by_bytes: bool = False) -> None:
        """Full (of messages, or of bytes): the heaviest sender loses, but established senders within
        their reserve never do."""
        def load(cls: str) -> int:
            return self.lanes[cls].nbytes if by_bytes else len(self.lanes[cls])
        reserve = self.max_bytes - self.young_max_bytes if by_bytes else self.max_total - self.young_max
        candidates = [cls for cls in (YOUNG, ESTABLISHED) if len(self.lanes[cls])
                      and (cls == YOUNG or load(cls) > reserve)]
        self._evict(max(candidates, key=lambda c: self.lanes[c].heaviest(by_bytes)[1]), by_bytes)  # ties: young pays

    def _evict(self, cls: str, by_bytes: bool = False) -> None:
        self.lanes[cls].evict(by_bytes)
        self.dropped[f"staging_full/{cls}"] += 1

    def take(self, cls: str, not_before: float = float("-inf")) -> Staged | None:
        """The oldest message staged at or after `not_before` of the `cls` peer whose turn it is;
        that peer's older ones are dropped as expired on the way, in the same turn."""
        staged, expired = self.lanes[cls].take_fresh(lambda s: s.staged_at >= not_before)
        if expired:
            self.dropped[f"expired/{cls}"] += expired
        return staged

    def take_fair(self, not_before: float = float("-inf")) -> Staged | None:
        """Established senders' first, then young ones' (no budget: tests and simple callers)."""
        for cls in CLASSES:
            staged = self.take(cls, not_before)
            if staged is not None:
                return staged
        return None


class IngestWorker:
    """Drains `topics` of `transport` into staging and checks within `budget` per round, on its own
    thread. `checks.check(staged, round_index)` does the work; an exception from it drops that message
    (counted). `sender_class(peer)` says ESTABLISHED or YOUNG; a message staged more than `max_wait_s`
    seconds ago is dropped unchecked. `young_capped()` says whether young senders are held to their
    share: only once some key is established is there anyone to protect. In a new swarm every peer
    is young, and a quarter of the budget let whole rounds of honest groups expire unchecked, so
    peers could not earn the credits that would establish them (a demo node used 2 peer groups in
    200 rounds). `ahead.verify_ahead()`, when given, runs while nothing staged waits and the budget
    allows: it verifies one pooled group before the training thread picks it, its seconds counted in
    the budget like a message's."""

    def __init__(self, transport: Transport, topics: list[str], checks: Checks,
                 budget: IngestBudget, sender_class: Callable[[str], str], name: str = "ingest",
                 young_capped: Callable[[], bool] = lambda: True, ahead: VerifiesAhead | None = None):
        self.transport = transport
        self.ahead = ahead  # spare time: one pooled group verified ahead of the picks
        self.topics = topics
        self.checks = checks
        self.budget = budget
        self.max_wait_s = budget.max_wait_s
        self.young_capped = young_capped
        self.staging = Staging(budget.staged_per_sender, budget.staged_max, sender_class, budget.young_share,
                               budget.staged_max_bytes)
        self.counters: Counter[str] = Counter()
        self.checked_by_peer: Counter[str] = Counter()  # delivering peer -> messages checked (bounded)
        self._lock = threading.Lock()  # guards counters and the round's budget, read by status()
        self._round_started = time.monotonic()
        self._round = self._fresh_usage()
        self._established_heard_at = float("-inf")  # when an established sender's message was last checked
        self.round_index = 0  # the training loop's current round
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @staticmethod
    def _fresh_usage() -> dict[str, Counter]:
        return {cls: Counter(messages=0, bytes=0, seconds=0.0) for cls in CLASSES}

    def start(self) -> None:
        self._thread.start()

    def new_round(self, round_index: int) -> None:
        """The training loop started collecting round `round_index`: the budget starts over."""
        with self._lock:
            self.round_index = round_index
            self._round_started = time.monotonic()
            self._round = self._fresh_usage()

    def snapshot(self) -> dict:
        with self._lock:
            return {**self.counters, "staged": self.staging.total, "staged_bytes": self.staging.nbytes,
                    "staged_by_class": self.staging.staged(),
                    "dropped": dict(self.staging.dropped),
                    "checked_by_peer": dict(self.checked_by_peer.most_common(MAX_PEERS_SHOWN))}

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
        """Drain, stage, check what the budget allows (then verify ahead); True if it did anything."""
        with self._lock:
            now = time.monotonic()
            for topic in self.topics:
                self.staging.add(topic, self.transport.drain(topic), now)
        checked_any = False
        while not self._stop.is_set():
            with self._lock:
                cls = self._class_to_serve()
                staged = None if cls is None else self.staging.take(cls, time.monotonic() - self.max_wait_s)
            if staged is None:
                break
            started = time.monotonic()
            try:
                self.checks.check(staged, self.round_index)
            except Exception as err:  # peer data broke our code: drop that message, never the worker
                log.warning("dropping a message from %s: checking raised %r", staged.item.from_peer, err,
                            extra={"event": "verify_error", "peer_id": staged.item.from_peer, "error": repr(err)})
                with self._lock:
                    self.counters["verify_error"] += 1
            spent = time.monotonic() - started
            with self._lock:
                self._round[cls].update(messages=1, bytes=len(staged.item.data), seconds=spent)
                self.counters["checked"] += 1
                self.counters[f"checked/{cls}"] += 1
                if cls == ESTABLISHED:
                    self._established_heard_at = time.monotonic()
                self._count_peer(staged.item.from_peer)
            checked_any = True
        return self._step_ahead() or checked_any

    def _step_ahead(self) -> bool:
        """One verification ahead of the picks, if there is spare budget and anything to verify."""
        with self._lock:
            if self.ahead is None or self._stop.is_set() or not self._within_budget():
                return False
        started = time.monotonic()
        try:
            worked = self.ahead.verify_ahead()
        except Exception:  # our bug or peer data breaking it: the picks verify that group instead
            log.exception("verifying ahead failed")
            worked = False
        with self._lock:
            if worked:
                self._round[ESTABLISHED].update(messages=1, seconds=time.monotonic() - started)
                self.counters["verified_ahead"] += 1
        return worked

    def _count_peer(self, peer: str) -> None:
        """Per-peer check counts for status; bounded: past the bound the least-checked half is
        forgotten (a flood of fresh origins cannot grow it)."""
        self.checked_by_peer[peer] += 1
        if len(self.checked_by_peer) > MAX_PEERS_COUNTED:
            self.checked_by_peer = Counter(dict(self.checked_by_peer.most_common(MAX_PEERS_COUNTED // 2)))

    def _limits(self) -> dict[str, float]:
        return {"messages": self.budget.max_messages, "bytes": self.budget.max_bytes,
                "seconds": self.budget.max_share * (time.monotonic() - self._round_started)}

    def _within_budget(self) -> bool:
        """The round's budget (messages, bytes, share of wall time) is not spent yet."""
        used = self._round[ESTABLISHED] + self._round[YOUNG]
        return all(used[k] < limit or (k == "seconds" and used[k] <= limit) for k, limit in self._limits().items())

    def _class_to_serve(self) -> str | None:
        """Which lane the next message comes from, or None: the round's budget is spent (or nothing
        is staged). Young senders get at most their share of every limit (all of it while
        `young_capped()` is False), and while both lanes wait, of the messages checked so far (so
        they are served early in a round, not only last)."""
        limits = self._limits()
        used = self._round[ESTABLISHED] + self._round[YOUNG]
        if not self._within_budget():
            if (len(self.staging.lanes[ESTABLISHED])
                    and time.monotonic() - self._established_heard_at >= self.budget.heard_every_s):
                self.counters["heard_floor"] += 1  # beyond the budget: established peers are heard every second
                return ESTABLISHED
            self.counters["budget_waits"] += 1
            return None
        share = self.budget.young_share if self.young_capped() else 1.0
        young = self._round[YOUNG]
        young_ok = (len(self.staging.lanes[YOUNG]) > 0
                    and all(young[k] < share * limit or (k == "seconds" and young[k] <= share * limit)
                            for k, limit in limits.items()))
        waiting = len(self.staging.lanes[ESTABLISHED]) > 0
        if young_ok and (not waiting or young["messages"] < share * (used["messages"] + 1)):
            return YOUNG
        if waiting:
            return ESTABLISHED
        if len(self.staging.lanes[YOUNG]):
            self.counters["young_budget_waits"] += 1
        return None
