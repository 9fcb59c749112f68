"""Network faults at the application level: delay, jitter, loss and partitions on top of any Transport.

For testnets on machines where kernel-level emulation (tc netem in network namespaces) is not
available. The impairment is read from a small JSON control file, re-read whenever it changes, so a
harness can start and heal a partition while the node runs:

    {"delay_s": 0.05, "jitter_s": 0.01, "loss": 0.01, "blocked": ["12D3KooW...", ...]}

Inbound only, which is enough on every node: a message whose author (`Received.from_peer`) is
blocked never arrives; the rest arrive `delay_s` (+ uniform jitter) later, or not at all with
probability `loss`. Both sides of a partition block each other, so nothing crosses it.
"""
from __future__ import annotations

import heapq
import itertools
import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from protocol.ground import atomic_write_bytes
from .base import Received, Transport

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class Impairment:
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    blocked: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0 or not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"need delay_s, jitter_s >= 0 and 0 <= loss <= 1, got {self}")

    def to_json(self) -> dict:
        return {"delay_s": self.delay_s, "jitter_s": self.jitter_s, "loss": self.loss,
                "blocked": sorted(self.blocked)}

    @classmethod
    def from_json(cls, data: dict) -> Impairment:
        return cls(float(data.get("delay_s", 0.0)), float(data.get("jitter_s", 0.0)), float(data.get("loss", 0.0)),
                   frozenset(data.get("blocked", ())))


def parse_netem(spec: str) -> Impairment:
    """The tc-netem subset testnets use: "delay 50ms [10ms] loss 1%" (words in any order)."""
    words, out = spec.split(), {"delay_s": 0.0, "jitter_s": 0.0, "loss": 0.0}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "delay" and i + 1 < len(words):
            out["delay_s"] = _seconds(words[i + 1])
            if i + 2 < len(words) and _DURATION.match(words[i + 2]):
                out["jitter_s"] = _seconds(words[i + 2])
                i += 1
            i += 2
        elif word == "loss" and i + 1 < len(words) and _PERCENT.match(words[i + 1]):
            out["loss"] = float(_PERCENT.match(words[i + 1]).group(1)) / 100
            i += 2
        else:
            raise ValueError(f"cannot read netem spec {spec!r} at {word!r}: expected 'delay 50ms [10ms]' "
                             "and/or 'loss 1%'")
    return Impairment(**out)


def _seconds(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 50ms, 0.5s or 200us")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def write_impairment(path: Path, impairment: Impairment) -> None:
    """Atomically replace the control file a node polls (readable by all, as before)."""
    atomic_write_bytes(path, json.dumps(impairment.to_json()).encode(), mode=0o644)


class ImpairedTransport:
    """A Transport that applies the impairment in `control_file` to everything `inner` delivers."""

    def __init__(self, inner: Transport, control_file: Path, *, seed: int = 0) -> None:
        self.inner = inner
        self.control_file = Path(control_file)
        self.impairment = Impairment()
        self._mtime: float | None = None
        self._rng = random.Random(seed)
        self._held: dict[str, list[tuple[float, int, Received]]] = {}
        self._order = itertools.count()
        self.counters: Counter[str] = Counter()

    def _refresh(self) -> None:
        try:
            mtime = self.control_file.stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self.impairment = Impairment() if mtime is None else \
                Impairment.from_json(json.loads(self.control_file.read_text()))
        except (ValueError, TypeError, OSError) as err:  # a torn or bad file: keep the last good one
            log.warning("ignoring impairment file %s: %s", self.control_file, err)

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        self._refresh()
        imp = self.impairment
        held = self._held.setdefault(topic, [])
        for item in self.inner.drain(topic):
            if item.from_peer in imp.blocked:
                self.counters["impaired_blocked"] += 1
            elif imp.loss and self._rng.random() < imp.loss:
                self.counters["impaired_lost"] += 1
            else:
                due = item.received_at + imp.delay_s + (self._rng.uniform(0, imp.jitter_s) if imp.jitter_s else 0.0)
                heapq.heappush(held, (due, next(self._order), item))
        now = time.time()
        out: list[Received] = []
        while held and held[0][0] <= now and (max_items is None or len(out) < max_items):
            out.append(heapq.heappop(held)[2])
        return out

    def stats(self) -> dict[str, int]:
        return {**self.inner.stats(), **self.counters}

    # everything else is the inner transport's
    def start(self) -> None:
        self.inner.start()

    def subscribe(self, topic: str) -> None:
        self.inner.subscribe(topic)

    def publish(self, topic: str, data: bytes) -> None:
        self.inner.publish(topic, data)

    def peers(self) -> list[str]:
        return self.inner.peers()

    def network_group(self, peer_id: str) -> str:
        group = getattr(self.inner, "network_group", None)
        return group(peer_id) if group is not None else ""

    def listen_addrs(self) -> list[str]:
        return self.inner.listen_addrs()

    def note_useful_peers(self, peer_ids: list[str]) -> None:
        note = getattr(self.inner, "note_useful_peers", None)
        if note is not None:
            note(peer_ids)

    def close(self) -> None:
        self.inner.close()
