"""The control-socket side of bounded connections (the policy is bounds.py): closing connections
above the bound, and letting go at once what a DHT lookup connected beyond what we were missing."""
from __future__ import annotations

import logging
import random
import time

from .addrs import peer_id_bytes, peer_id_text
from .bounds import ConnectionBounds
from .control import (ControlConnection, ControlError, disconnect_request, list_peers_request, tag_request,
                      trim_request)
from .shared import Shared

log = logging.getLogger(__name__)
KEEP_TAG, KEEP_WEIGHT = "swarm-node/useful", 1000  # the daemon's connection manager keeps these longest


def connected_peers(conn: ControlConnection) -> set[str]:
    return {peer_id_text(p.id) for p in conn.request(list_peers_request()).peers}


class Trimmer:
    """Used by the discovery thread only."""

    def __init__(self, shared: Shared, bounds: ConnectionBounds) -> None:
        self.shared, self.bounds = shared, bounds
        self._rng = random.Random()

    def trim(self, conn: ControlConnection, connected: set[str], members: dict[str, set[str]],
             keep: frozenset[str] = frozenset()) -> set[str]:
        """Above the bound: the daemon's connection manager trims first (it knows the GossipSub
        mesh; the `keep` peers are tagged so that it values them above any other), then we
        disconnect what it could not (bounds.victims), never a `keep` peer. Returns the peers let go."""
        now = time.monotonic()
        self.bounds.observe(connected, now)
        for pid in sorted(keep & connected):  # every pass: the daemon forgets a peer's tags when it leaves
            conn.request(tag_request(peer_id_bytes(pid), KEEP_TAG, KEEP_WEIGHT))
        if not self.bounds.over(len(connected)):
            return set()
        conn.request(trim_request())
        left = connected_peers(conn) & connected
        victims = self.bounds.victims(left, set().union(*members.values()), now, keep)
        self._disconnect(conn, victims)
        self.shared.bump("trimmed_by_daemon", len(connected - left))
        self.shared.bump("trimmed_by_us", len(victims))
        return (connected - left) | set(victims)

    def after_lookup(self, conn: ControlConnection, before: set[str]) -> None:
        """A DHT lookup connects to every peer it asks (about 20): of the peers it connected we keep
        as many as we were missing, picked at random (the XOR-closest alone could split the swarm
        into prefix clusters), and let the rest go at once, before they count against the bounds
        of the peers at the other end (which would close their newest connection: ours)."""
        if not self.bounds.bounded:
            return
        new = sorted(connected_peers(conn) - before)
        self._rng.shuffle(new)
        surplus = new[max(0, self.bounds.low - len(before)):]
        self._disconnect(conn, surplus)
        self.shared.bump("trimmed_after_lookup", len(surplus))

    def _disconnect(self, conn: ControlConnection, peers: list[str]) -> None:
        for pid in peers:
            try:
                conn.request(disconnect_request(peer_id_bytes(pid)))
            except ControlError as err:  # gone meanwhile
                log.debug("disconnecting %s failed: %s", pid, err)
