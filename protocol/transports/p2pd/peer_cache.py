"""`<run_dir>/peers.json`: the peers a restarted node dials first, kept by usefulness so that hosts
which connect and leave (free for an attacker) cannot fill it.

Per peer it records when it was last connected (`seen`), when a dial of ours last reached it
(`answered`), when the node last used a verified group it signed (`useful`) and in how many rounds
it did (`useful_marks`: one per `note_useful` call, halved every `useful_half_life_s` (a day)
without a new one), and its consecutive failed dials. An entry is
dead once `max_dial_failures` dials in a row failed (nothing since then reached it or connected);
until then it is live, whatever its age: a peer we are connected to, or have not tried, is not
known to be gone. Ranking (the file's order, and the dial order): live entries before dead ones;
within each, useful peers first, the one with the most marks first (a host that was useful once
during an attack does not outrank a peer useful for hours, nor one useful for hours last month a
peer useful today), then peers that answered a dial,
then the rest; ties go to the most recently in contact. Bounds, as Bitcoin's address manager keeps
them: at most `max_per_group` entries per address group (/16 of IPv4, /32 of IPv6), of which at
most `dead_per_group` (half of it, at least 1) dead, at most `max_unproven` entries that were never
useful nor answered, at most `max_peers` in all; the best-ranked win. A dead entry is evicted at
once if it never proved anything, else once it has also been silent `proven_grace_s` (a short
outage on either side must not erase the peers worth having) or is beyond its group's dead bound
(a wave of short-lived hosts, each useful or answering once, cannot hold a group's slots for the
grace); any entry silent `max_age_s` goes. Written atomically and durably (protocol/ground.py); a
missing or corrupt file is an empty cache, never an error (a file without `useful_marks` counts one
mark per useful peer). Thread-safe: the discovery thread and the node's thread both use it."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from protocol.ground import atomic_write_bytes
from ...netgroups import network_group

log = logging.getLogger(__name__)

MAX_ADDRS_PER_PEER = 8
MAX_PENDING_USEFUL = 256  # useful marks for peers not (yet) cached, kept until they connect


@dataclasses.dataclass(frozen=True)
class PeerCacheLimits:
    max_peers: int = 64            # entries in all
    max_per_group: int = 8         # entries per address group
    max_unproven: int = 8          # entries never useful nor answering
    max_dial_failures: int = 3     # failed dials in a row that make an entry dead
    proven_grace_s: float = 3600.0  # how long a dead useful/answering entry is kept after its last contact
    max_age_s: float = 7 * 24 * 3600.0  # any entry silent this long goes
    ipv4_prefix: int = 16          # leading bits that make an IPv4 address group
    ipv6_prefix: int = 32
    useful_half_life_s: float = 24 * 3600.0  # usefulness marks halve every this long without a new one

    @property
    def dead_per_group(self) -> int:
        """Dead entries an address group may hold: half its slots, at least one (a lone proven peer
        survives an outage)."""
        return max(1, self.max_per_group // 2)


@dataclasses.dataclass
class PeerRecord:
    addrs: list[str]
    seen: float = 0.0      # last time it was connected to us (either direction)
    answered: float = 0.0  # last time one of our dials reached it (0: never)
    useful: float = 0.0    # last time the node used a verified group it signed (0: never)
    failures: int = 0      # failed dials since it last answered or was seen connected
    useful_marks: float = 0.0  # rounds in which the node used its verified groups, decayed to `useful`

    @property
    def proven(self) -> bool:
        return self.useful > 0 or self.answered > 0

    @property
    def last_contact(self) -> float:
        return max(self.seen, self.answered)

    def dead(self, max_dial_failures: int) -> bool:
        return self.failures >= max_dial_failures

    def marks_at(self, now: float, half_life_s: float) -> float:
        """Its usefulness marks as of `now`: halved every `half_life_s` since it was last useful, so
        a peer useful for hours last month does not outrank one useful today."""
        return self.useful_marks * 0.5 ** (max(0.0, now - self.useful) / half_life_s)

    def rank_key(self, limits: PeerCacheLimits, now: float) -> tuple:
        return (not self.dead(limits.max_dial_failures), self.useful > 0,
                self.marks_at(now, limits.useful_half_life_s), self.answered > 0, max(self.last_contact, self.useful))


def _parse_record(entry: dict, now: float) -> PeerRecord:
    def when(key: str) -> float:  # a time from the future, or not a time, would rank it forever
        value = float(entry.get(key, 0.0))
        if not math.isfinite(value):
            raise ValueError(f"{key} is {value}")
        return min(max(value, 0.0), now)

    addrs = entry["addrs"]
    if not isinstance(addrs, list):
        raise TypeError("addrs is not a list")
    useful = when("useful")  # a file from before `useful_marks` existed: one mark per useful peer
    marks = max(1.0, float(entry.get("useful_marks", 1))) if useful > 0 else 0.0
    if not math.isfinite(marks):
        raise ValueError(f"useful_marks is {marks}")
    return PeerRecord([str(a) for a in addrs][:MAX_ADDRS_PER_PEER], when("seen"), when("answered"),
                      useful, max(0, int(entry.get("failures", 0))), marks)


def _full(counts: dict[str, int], groups: set[str], bound: int) -> bool:
    return any(counts.get(g, 0) >= bound for g in groups)


class PeerCache:
    def __init__(self, path: Path, limits: PeerCacheLimits = PeerCacheLimits(),
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer at a time: the newest state is written last
        self._peers: dict[str, PeerRecord] | None = None  # read on first use
        self._pending_useful: dict[str, tuple[float, int]] = {}  # peer id -> (last mark, marks)
        self._changed = False

    # ------------------------------------------------------------------ reading

    def load(self) -> dict[str, PeerRecord]:
        """peer id -> record, best first (a copy)."""
        with self._lock:
            return {pid: dataclasses.replace(rec) for pid, rec in self._records().items()}

    def dial_targets(self) -> dict[str, list[str]]:
        """peer id -> full multiaddrs (…/p2p/<id>) to dial, best-ranked peers first."""
        with self._lock:
            return {pid: [f"{a}/p2p/{pid}" for a in rec.addrs if "/p2p/" not in a]
                    for pid, rec in self._records().items()}

    def _records(self) -> dict[str, PeerRecord]:
        if self._peers is None:
            self._peers = self._prune(self._read())
        return self._peers

    def _read(self) -> dict[str, PeerRecord]:
        try:
            entries = json.loads(self.path.read_text())["peers"].items()
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("ignoring unreadable peer cache %s (%s)", self.path, err)
            return {}
        now, peers, bad = self.clock(), {}, 0
        for pid, entry in entries:
            try:
                peers[str(pid)] = _parse_record(entry, now)
            except (ValueError, OverflowError, KeyError, TypeError, AttributeError):
                bad += 1  # a hand-edited or torn entry: the others still count
        if bad:
            log.warning("ignored %d unreadable entries of the peer cache %s", bad, self.path)
        return peers

    # ------------------------------------------------------------------ what happened

    def remember(self, seen_now: dict[str, list[str]]) -> None:
        """Peers connected now (peer id -> their dialable multiaddrs): alive, whoever dialed."""
        now = self.clock()
        with self._lock:
            peers = self._records()
            for pid, addrs in seen_now.items():
                if not addrs:
                    continue
                rec = peers.get(pid) or PeerRecord([])
                rec.addrs = list(dict.fromkeys(addrs))[:MAX_ADDRS_PER_PEER]
                rec.seen, rec.failures = now, 0
                useful, marks = self._pending_useful.pop(pid, (0.0, 0))
                rec.useful, rec.useful_marks = max(rec.useful, useful), rec.useful_marks + marks
                peers[pid] = rec
            self._settle()

    def record_dial(self, peer_id: str, answered: bool) -> None:
        """The outcome of one of our dials of a cached peer."""
        with self._lock:
            rec = self._records().get(peer_id)
            if rec is None:
                return
            if answered:
                rec.answered, rec.failures = self.clock(), 0
            else:
                rec.failures += 1
            self._settle()

    def note_useful(self, peer_ids: Iterable[str]) -> None:
        """The node used verified groups these peers signed (plain peer ids)."""
        now = self.clock()
        with self._lock:
            peers = self._records()
            for pid in dict.fromkeys(peer_ids):  # one mark per peer per call (a round)
                if pid in peers:
                    rec = peers[pid]
                    rec.useful_marks, rec.useful = rec.marks_at(now, self.limits.useful_half_life_s) + 1, now
                else:  # re-inserted: the newest survive the bound
                    marks = self._pending_useful.pop(pid, (0.0, 0))[1]
                    self._pending_useful[pid] = (now, marks + 1)
            while len(self._pending_useful) > MAX_PENDING_USEFUL:
                self._pending_useful.pop(next(iter(self._pending_useful)))
            self._settle()

    # ------------------------------------------------------------------ keeping it small

    def _settle(self) -> None:
        self._peers = self._prune(self._records())
        self._changed = True

    def _prune(self, peers: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
        """Evicts dead and silent entries, then keeps the best-ranked within every bound."""
        lim, now = self.limits, self.clock()
        alive = {pid: rec for pid, rec in peers.items()
                 if now - rec.last_contact <= lim.max_age_s
                 and not (rec.dead(lim.max_dial_failures)
                          and (not rec.proven or now - rec.last_contact > lim.proven_grace_s))}
        kept: dict[str, PeerRecord] = {}
        per_group: dict[str, int] = {}
        dead_per_group: dict[str, int] = {}
        unproven = 0
        ranked = sorted(alive.items(), key=lambda pr: pr[1].rank_key(lim, now), reverse=True)
        for pid, rec in ranked:
            if len(kept) >= lim.max_peers:
                break
            # an entry counts against the group of every address it gives (more addresses cost more)
            groups = {network_group(a, lim.ipv4_prefix, lim.ipv6_prefix) for a in rec.addrs}
            dead = rec.dead(lim.max_dial_failures)
            if not groups or _full(per_group, groups, lim.max_per_group) \
                    or (dead and _full(dead_per_group, groups, lim.dead_per_group)):
                continue
            if not rec.proven:
                if unproven >= lim.max_unproven:
                    continue
                unproven += 1
            for counts in (per_group, dead_per_group) if dead else (per_group,):
                for g in groups:
                    counts[g] = counts.get(g, 0) + 1
            kept[pid] = rec
        return kept

    def save(self) -> bool:
        """Writes the file if anything changed since the last write (True if written). A write
        that fails is logged and retried at the next save, never raised: the cache is a hint."""
        with self._write_lock:
            with self._lock:
                if not self._changed:
                    return False
                body = {"peers": {pid: dataclasses.asdict(rec) for pid, rec in self._records().items()}}
                self._changed = False
            try:
                self._write(body)
            except OSError as err:
                log.warning("cannot write the peer cache %s: %s", self.path, err)
                return False
        return True

    def _write(self, body: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write_bytes(self.path, json.dumps(body, indent=1).encode(), mode=0o600)  # addresses: ours only
        except BaseException:
            with self._lock:
                self._changed = True
            raise
