"""The sending side: sequence numbers that survive restarts, and sealing body messages.

Sequence numbers: `sequence = (start_ms << 22) + n`, where start_ms is the wall clock (Unix ms)
when this process started sending and n counts its messages since. Why this shape:
  * dense within a run (+1 per message), so a receiver's 1024-wide replay window spans 1024
    messages and tolerates gossip reordering. A purely time-based sequence (now_ms * 1000)
    would jump ~1000 per millisecond and make the window a millisecond wide.
  * strictly increasing across restarts with no state on disk: a restarted node (same key)
    starts above anything it sent before, and peers accept it at once. The only assumptions
    are that its clock does not step backwards across the restart and that it sends fewer than
    2^22 (4 million) messages per millisecond of uptime.
  * fits uint64 until the year 2109 (42 bits of milliseconds).
One key, one running process: two processes sharing a key would refuse each other's sequences.

Pacing: what a node sends must fit what its peers accept (protocol/ratelimit.py: 20 messages/s
per origin, 200 burst). The tiny preset produces about 320 groups/s (16 a round, ~20 rounds/s),
so the Outbox sends through its own token bucket, `PACE` (10 messages/s, 100 burst: half the
peers' limit, leaving room for hints and clock jitter). What does not fit waits in a short queue
(`max_queued`) and goes out on a later `publish` or `flush`; when the queue is full the OLDEST
waiting message is dropped (counted as `dropped_paced`): fresh rollouts are worth more. Each
message has a `priority` (higher first): the pace sends the oldest message of the highest priority
waiting, and a full queue drops the oldest of the lowest. The node (node/peers/exchange.py) ranks the
groups peers can train on first, hints and hint requests next, and groups without reward variance
(nothing to train) last: a fast node that solved most of its tasks spent its pace on 397 such
groups of 400 and on hints, and its paced peer had almost nothing of it to train. Messages
are sealed when they leave, so their timestamps and sequence numbers are those of sending.
Pacing rather than batching several groups into one message: no wire change, and it holds for any
preset whatever it produces.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Iterable

from google.protobuf.message import Message

from .envelope import seal
from .errors import Rejected
from .identity import NodeIdentity
from .kinds import KIND_SPECS, kind_of
from .limits import Limits, validate_body
from .ratelimit import TokenBucket
from .transports.base import Transport, topic_name

SEQUENCE_COUNTER_BITS = 22


class Sequencer:
    """Thread-safe source of strictly increasing sequence numbers (see module docstring)."""

    def __init__(self, start: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self._next = int(clock() * 1000) << SEQUENCE_COUNTER_BITS if start is None else start
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            return value


@dataclass(frozen=True)
class Pace:
    messages_per_s: float = 10.0
    burst: float = 100.0
    max_queued: int = 64

    def __post_init__(self) -> None:
        if self.messages_per_s <= 0 or self.burst < 1 or self.max_queued < 0:
            raise ValueError("need messages_per_s > 0, burst >= 1 and max_queued >= 0")


PACE = Pace()
UNPACED = None  # Outbox(pace=UNPACED): send everything at once (benchmarks, hostile test peers)


class Outbox:
    """Seals body messages as this node, with its sequence numbers and wall-clock timestamps.

    By default it validates outgoing messages against `limits` first: a message our peers would
    refuse (and score us down for) is our bug, better raised here. `limits=None` skips that
    (hostile test peers). `publish` paces (module docstring); `seal` does not."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        limits: Limits | None = Limits(),
        pace: Pace | None = PACE,
        clock: Callable[[], float] = time.time,
        pace_clock: Callable[[], float] | None = None,
        sequencer: Sequencer | None = None,
    ) -> None:
        """`clock` stamps messages (peers check it against theirs); `pace_clock` (default `clock`)
        is the time the pace runs on: an in-process simulation passes its swarm time."""
        self.identity = identity
        self.limits = limits
        self.pace = pace
        self._clock = clock
        self._pace_clock = pace_clock or clock
        self.sequencer = sequencer or Sequencer(clock=clock)
        self.counters: Counter[str] = Counter()  # paced_queued, paced_sent, dropped_paced
        self._bucket = TokenBucket(pace.messages_per_s, pace.burst, self._pace_clock()) if pace else None
        self._queue: deque[tuple[str, Message, int]] = deque()  # (topic, message, priority)
        self._lock = threading.Lock()

    def _validate(self, message: Message) -> None:
        kind = kind_of(message)
        if self.limits is not None:
            try:
                validate_body(kind, message, self.limits)
            except Rejected as rejection:
                raise ValueError(f"peers would reject this {kind.name}: {rejection}") from rejection

    def seal(self, message: Message) -> bytes:
        """A signed Envelope for `message` (a RolloutGroup, Hint or HintRequest)."""
        self._validate(message)
        return self._seal_valid(message)

    def _seal_valid(self, message: Message) -> bytes:
        return seal(self.identity, kind_of(message), message.SerializeToString(), self.sequencer.next(),
                    int(self._clock() * 1000))

    def publish(self, transport: Transport, swarm: str, message: Message, *, priority: int = 0) -> bytes | None:
        """Validates `message` (ValueError if peers would refuse it) and queues it for its kind's
        topic of `swarm`, then sends what the pace allows: the highest priority first, oldest first
        within one. Returns the bytes sent for `message` if it went out now, else None (it waits,
        or was dropped by the pace later: the oldest of the lowest priority first)."""
        self._validate(message)
        topic = topic_name(swarm, KIND_SPECS[kind_of(message)].topic)
        with self._lock:
            if self.pace is None:
                return self._send(transport, topic, message)
            self._queue.append((topic, message, priority))
            self.counters["paced_queued"] += 1
            sent = self._release(transport)
            while len(self._queue) > self.pace.max_queued:
                del self._queue[self._oldest_of(min)]
                self.counters["dropped_paced"] += 1
            return sent.get(id(message))

    def _oldest_of(self, pick: Callable[[Iterable[int]], int]) -> int:
        """Index of the oldest waiting message whose priority is `pick` (min or max) of those waiting."""
        wanted = pick(priority for _, _, priority in self._queue)
        return next(i for i, (_, _, priority) in enumerate(self._queue) if priority == wanted)

    def flush(self, transport: Transport) -> int:
        """Sends whatever waiting messages the pace allows now; returns how many."""
        with self._lock:
            return len(self._release(transport)) if self.pace is not None else 0

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def _release(self, transport: Transport) -> dict[int, bytes]:
        self._bucket.refill(self._pace_clock())
        sent: dict[int, bytes] = {}
        while self._queue and self._bucket.take():
            index = self._oldest_of(max)
            topic, message, _ = self._queue[index]
            del self._queue[index]
            sent[id(message)] = self._send(transport, topic, message)
        return sent

    def _send(self, transport: Transport, topic: str, message: Message) -> bytes:
        data = self._seal_valid(message)
        transport.publish(topic, data)
        self.counters["paced_sent"] += 1
        return data
