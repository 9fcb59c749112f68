"""Finding and keeping peers through the daemon (the p2pd transport's discovery thread uses these):
dial bootstrap and cached peers with backoff, ask the DHT, read peers' dialable addresses."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from .addrs import addr_text, peer_id_bytes, split_peer_addr
from .control import ControlConnection, ControlError, connect_request
from .peer_cache import PeerCache
from proto import p2pd_control_pb2 as pb

log = logging.getLogger(__name__)


class Dialer:
    """Dials the bootstrap peers, then the cached peers in the cache's rank order, that we are not
    connected to, each with its own doubling backoff, until `budget` of them answered (the
    connections a bounded node still misses, bounds.py; None = all of them). Bootstrap peers
    (named by the operator) are redialed for as long as they stay down and the node wants peers;
    a cached peer is given up on after `max_cached_failures` failed dials in a row (the cache
    evicts the dead ones), so departed hosts cost a bounded number of redials. `reset()` when a
    new daemon starts (it knows nobody: dial at once, the given-up peers once more)."""

    def __init__(self, own_id: str, bootstrap: dict[str, list[str]], peer_cache: PeerCache | None,
                 control_timeout_s: float, backoff_initial_s: float, backoff_max_s: float,
                 max_cached_failures: int = 3) -> None:
        self.own_id, self.bootstrap, self.peer_cache = own_id, bootstrap, peer_cache
        self.control_timeout_s = control_timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.max_cached_failures = max_cached_failures
        self.backoff: dict[str, tuple[float, float]] = {}  # peer id -> (next attempt, delay)
        self.failures: dict[str, int] = {}  # peer id -> failed dials in a row (this daemon run)

    def reset(self) -> None:
        self.backoff.clear()
        self.failures.clear()

    def dial_missing(self, conn: ControlConnection, connected: set[str], count: Callable[[str], None],
                     skip: frozenset[str] = frozenset(), budget: int | None = None,
                     must: frozenset[str] = frozenset()) -> int:
        """One pass, never dialing `skip` (origins cut for flooding), ending once `budget` dials
        answered (None: no end), except that the `must` peers (whose groups the node uses) are
        dialed first and whatever the budget; `count("dial_attempts" | "dial_failures" |
        "dial_given_up")` for the transport's stats. Returns how many dials answered."""
        now, answered = time.monotonic(), 0
        for pid, addrs in sorted(self._wanted().items(), key=lambda item: item[0] not in must):
            if pid in connected:
                self.backoff.pop(pid, None)
                self.failures.pop(pid, None)
                continue
            if budget is not None and answered >= budget and pid not in must:
                continue  # enough answered: the rest only get their backoff cleared if connected
            if pid in skip or not self._due(pid, now):
                continue
            answered += self._dial(conn, pid, addrs, now, count)
        return answered

    def _wanted(self) -> dict[str, list[str]]:
        """Bootstrap peers first, then cached peers, best-ranked first."""
        wanted = {pid: list(addrs) for pid, addrs in self.bootstrap.items()}
        if self.peer_cache is not None:
            for pid, addrs in self.peer_cache.dial_targets().items():
                if pid != self.own_id:
                    wanted.setdefault(pid, addrs)
        return wanted

    def _due(self, pid: str, now: float) -> bool:
        if pid not in self.bootstrap and self.failures.get(pid, 0) >= self.max_cached_failures:
            return False  # given up on for this run
        return now >= self.backoff.get(pid, (0.0, 0.0))[0]

    def _dial(self, conn: ControlConnection, pid: str, addrs: list[str], now: float,
              count: Callable[[str], None]) -> bool:
        """One CONNECT; True if the peer answered (a failure doubles its backoff)."""
        try:
            request = connect_request(peer_id_bytes(pid), [split_peer_addr(a)[1] for a in addrs],
                                      timeout_s=max(1, int(self.control_timeout_s) - 1))
        except ValueError as err:  # a hand-edited or corrupt peers.json entry: skip it, say so once
            log.warning("not dialing %s: %s", pid, err)
            self.backoff[pid] = (float("inf"), self.backoff_max_s)
            return False
        count("dial_attempts")
        log.debug("dialing %s", pid)
        try:
            conn.request(request)
            self.backoff.pop(pid, None)
            self.failures.pop(pid, None)
            answered = True
        except ControlError as err:
            answered = False
            self._failed(pid, now, err, count)
        if self.peer_cache is not None:
            self.peer_cache.record_dial(pid, answered)
        return answered

    def _failed(self, pid: str, now: float, err: ControlError, count: Callable[[str], None]) -> None:
        count("dial_failures")
        delay = self.backoff.get(pid, (0.0, self.backoff_initial_s))[1]
        failures = self.failures[pid] = self.failures.get(pid, 0) + 1
        self.backoff[pid] = (now + delay, min(2 * delay, self.backoff_max_s))
        if pid not in self.bootstrap and failures >= self.max_cached_failures:
            count("dial_given_up")
            log.info("giving up on cached peer %s after %d failed dials (%s)", pid, failures, err)
        else:
            log.log(logging.DEBUG if failures > 1 else logging.WARNING,
                    "dialing %s failed (%s); retrying in %.1f s", pid, err, delay)


def ask_dht(socket_path: Path, own_id: str, control_timeout_s: float) -> int:
    """A DHT lookup of our own id: the daemon connects to the peers it meets on the way (how a
    swarm stays connected when its first node dies). Returns how many peers it named."""
    request = pb.Request(type=pb.Request.DHT, dht=pb.DHTRequest(
        type=pb.DHTRequest.GET_CLOSEST_PEERS, key=peer_id_bytes(own_id),
        timeout=max(1, int(control_timeout_s) - 1)))
    found = 0
    try:
        with ControlConnection(socket_path, control_timeout_s) as conn:
            response = conn.request(request)
            if response.dht.type == pb.DHTResponse.BEGIN:
                while conn.read(pb.DHTResponse).type != pb.DHTResponse.END:
                    found += 1
    except ControlError as err:  # "failed to find any peer in table": alone, for now
        log.debug("DHT lookup: %s", err)
    return found


def peer_addrs(conn: ControlConnection, connected: list[str]) -> dict[str, list[str]]:
    """Dialable addresses of connected peers: the DHT's/peerstore's (their listen addresses),
    not the connection's (an inbound connection shows the peer's ephemeral port)."""
    out: dict[str, list[str]] = {}
    for pid in connected[:32]:
        request = pb.Request(type=pb.Request.DHT, dht=pb.DHTRequest(type=pb.DHTRequest.FIND_PEER,
                                                                    peer=peer_id_bytes(pid), timeout=2))
        try:
            info = conn.request(request).dht.peer
        except ControlError:
            continue
        addrs = [a for a in map(addr_text, info.addrs) if a and "/p2p-circuit" not in a]
        if addrs:
            out[pid] = addrs
    return out
