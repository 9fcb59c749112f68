"""Bounds on the inbound relayed streams a node reads (relayed.py), so that a few peers trickling
bytes cannot keep an honest relayed peer out (16 streams from one peer, each sending a byte per
read deadline, once held every reader: 0 of 24 honest batches acknowledged).

* StreamDeadline: a whole stream must end by `grace_s` + (bytes it delivered) / `min_rate` after it
  opened. A batch arriving at any reasonable speed keeps pushing that out; a stream trickling a
  byte now and then is cut after about `grace_s`, however it times its reads.
* StreamTable: at most `capacity` streams are read at once, at most `per_sender` from one sender.
  A newcomer is never refused: a sender over its cap loses its own oldest stream, and a full table
  the heaviest sender's oldest (among equally heavy senders, the one whose oldest came first), as
  the fair inbox drops messages (protocol/inbox.py).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


class StreamDeadline:
    """A stream's socket whose reads all end by one deadline (socket.timeout past it). Stands in
    for the socket under ControlConnection.on_socket; `cut` ends its reads from another thread."""

    def __init__(self, sock: socket.socket, grace_s: float, min_rate: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock, self.grace_s, self.min_rate, self.clock = sock, grace_s, min_rate, clock
        self.opened_at = clock()
        self.received = 0
        self.timed_out = False

    def remaining(self) -> float:
        earned = self.received / self.min_rate if self.min_rate > 0 else 0.0
        return self.opened_at + self.grace_s + earned - self.clock()

    def recv(self, size: int) -> bytes:
        left = self.remaining()
        if left <= 0:
            self.timed_out = True
            raise socket.timeout("the stream ran past its deadline")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(size)
        except socket.timeout:
            self.timed_out = True
            raise
        self.received += len(chunk)
        return chunk

    def settimeout(self, _timeout: float | None) -> None:
        """Ignored: the deadline sets each read's timeout."""

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(max(self.remaining(), 0.1))  # (our one-byte ACK: never blocks for long)
        self.sock.sendall(data)

    def cut(self) -> None:
        """Ends the stream now: a read blocked in another thread returns at once."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()


@dataclass(eq=False)
class TableEntry:
    """One stream in the table; `cut` ends it (StreamDeadline.cut)."""

    sender: str
    cut: Callable[[], None]
    evicted: bool = False
    order: int = field(default=0, init=False)  # admission order: lower = older


class StreamTable:
    """Which inbound streams are read now (thread-safe)."""

    def __init__(self, capacity: int, per_sender: int) -> None:
        if capacity < 1 or per_sender < 1:
            raise ValueError(f"capacity={capacity} and per_sender={per_sender} must be at least 1")
        self.capacity, self.per_sender = capacity, per_sender
        self._lock = threading.Lock()
        self._streams: list[TableEntry] = []  # oldest first
        self._admitted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def senders(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for entry in self._streams:
                counts[entry.sender] = counts.get(entry.sender, 0) + 1
            return counts

    def admit(self, newcomer: TableEntry) -> list[TableEntry]:
        """Takes `newcomer` in and returns the streams it displaced (marked evicted, out of the
        table): the caller cuts them. Never `newcomer` itself."""
        with self._lock:
            self._admitted += 1
            newcomer.order = self._admitted
            self._streams.append(newcomer)
            own = [e for e in self._streams if e.sender == newcomer.sender]
            out = own[:len(own) - self.per_sender] if len(own) > self.per_sender else []
            for entry in out:
                self._streams.remove(entry)
            while len(self._streams) > self.capacity:
                victim = self._heaviest_oldest()
                self._streams.remove(victim)
                out.append(victim)
            for entry in out:
                entry.evicted = True
            return out

    def release(self, entry: TableEntry) -> None:
        """`entry` ended (done, refused, timed out or evicted)."""
        with self._lock:
            if entry in self._streams:
                self._streams.remove(entry)

    def _heaviest_oldest(self) -> TableEntry:
        oldest: dict[str, TableEntry] = {}
        counts: dict[str, int] = {}
        for entry in self._streams:  # oldest first: the first seen of a sender is its oldest
            oldest.setdefault(entry.sender, entry)
            counts[entry.sender] = counts.get(entry.sender, 0) + 1
        sender = max(counts, key=lambda s: (counts[s], -oldest[s].order))
        return oldest[sender]
