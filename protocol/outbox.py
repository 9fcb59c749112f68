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
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from google.protobuf.message import Message

from .envelope import seal
from .errors import Rejected
from .identity import NodeIdentity
from .kinds import KIND_SPECS, kind_of
from .limits import Limits, validate_body
from .transport import Transport, topic_name

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


class Outbox:
    """Seals body messages as this node, with its sequence numbers and wall-clock timestamps.

    By default it validates outgoing messages against `limits` first: a message our peers would
    refuse (and score us down for) is our bug, better raised here. `limits=None` skips that
    (hostile test peers)."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        limits: Limits | None = Limits(),
        clock: Callable[[], float] = time.time,
        sequencer: Sequencer | None = None,
    ) -> None:
        self.identity = identity
        self.limits = limits
        self._clock = clock
        self.sequencer = sequencer or Sequencer(clock=clock)

    def seal(self, message: Message) -> bytes:
        """A signed Envelope for `message` (a RolloutGroup, Hint or HintRequest)."""
        kind = kind_of(message)
        if self.limits is not None:
            try:
                validate_body(kind, message, self.limits)
            except Rejected as rejection:
                raise ValueError(f"peers would reject this {kind.name}: {rejection}") from rejection
        return seal(self.identity, kind, message.SerializeToString(), self.sequencer.next(), int(self._clock() * 1000))

    def publish(self, transport: Transport, swarm: str, message: Message) -> bytes:
        """Seals `message` and publishes it on its kind's topic of `swarm`; returns the bytes sent."""
        data = self.seal(message)
        transport.publish(topic_name(swarm, KIND_SPECS[kind_of(message)].topic), data)
        return data
