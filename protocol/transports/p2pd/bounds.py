"""Bounded connections for the p2pd transport: a node keeps about `low`..`high` connections
whatever the size of the swarm.

GossipSub only needs a mesh of D = 6 peers (go-libp2p-pubsub 0.10 in the daemon: D=6, D_lo=5,
D_hi=12, D_lazy=6, gossip factor 0.25, flood publishing off; p2pd sets none of them), so a
connection beyond about 2D carries IHAVE gossip, DHT traffic and keep-alives, not messages. Three
parts keep the count bounded:

* Looking for peers only while short of them: below `low` connections the discovery thread dials
  bootstrap and cached peers (at most as many as are missing) and asks the DHT; at `low` or more
  it does neither, so it never dials back the peers a trimmer just closed (a bootstrap node that
  everybody dials first does not end up holding everybody). A DHT lookup connects to every peer
  it asks (about 20); of those it keeps as many as are missing, at random, and lets the rest go
  at once (trimmer.py), before they push the peers at the other end over their bound.
* The daemon's connection manager (`-connManager`): once `high` connections are open it closes
  the least valuable ones older than `grace_s`. GossipSub protects its mesh peers there, so it
  closes gossip-only peers first. It keeps `daemon_low` unprotected connections.
* A hard bound: the Kademlia DHT also protects every peer in its two nearest buckets (up to 40
  peers), which the manager then never closes. Above `high`, the transport disconnects the
  connections the manager left, down to `low`: peers that subscribe to none of our topics first,
  then the most recently connected (the mesh forms on the older ones), never one younger than
  `grace_s` (a newcomer gets time to subscribe and be grafted).

`high = 0` turns all of it off: every discovered peer stays connected, every bootstrap and cached
peer is dialed, the DHT is asked every round (the transport before bounds; kept to compare).
"""
from __future__ import annotations

from typing import Iterable

from ..options import P2pdOptions

GOSSIPSUB_D = 6  # the daemon's mesh degree (not settable through p2pd 0.5's flags)


class ConnectionBounds:
    """Which peers to look for and which to let go. Not thread-safe (the discovery thread owns it)."""

    def __init__(self, low: int, high: int, grace_s: float) -> None:
        self.low, self.high, self.grace_s = low, high, grace_s
        self._first_seen: dict[str, float] = {}  # connected peer -> when we first saw it connected

    @classmethod
    def from_options(cls, options: P2pdOptions) -> ConnectionBounds:
        return cls(options.conn_low, options.conn_high, options.conn_grace_s)

    @property
    def bounded(self) -> bool:
        return self.high > 0

    def daemon_flags(self) -> list[str]:
        """The daemon's connection manager: it trims at `high`, down to `daemon_low` unprotected
        connections (mesh and near-DHT peers are protected, so they stay on top of those)."""
        if not self.bounded:
            return []
        daemon_low = max(1, self.low - GOSSIPSUB_D)
        return ["-connManager", f"-connLo={daemon_low}", f"-connHi={self.high}", f"-connGrace={self.grace_s:g}s"]

    def reset(self) -> None:
        """A new daemon run: nobody is connected yet."""
        self._first_seen.clear()

    def observe(self, connected: Iterable[str], now: float) -> None:
        """The peers connected now (a peer that left and came back starts a new grace period)."""
        connected = set(connected)
        self._first_seen = {pid: self._first_seen.get(pid, now) for pid in connected}

    def wants_more(self, n_connected: int) -> bool:
        """Whether to dial and ask the DHT: always when unbounded, else only below `low`."""
        return not self.bounded or n_connected < self.low

    def dial_budget(self, n_connected: int) -> int | None:
        """How many peers one discovery pass may connect: None = no limit (unbounded)."""
        return None if not self.bounded else max(0, self.low - n_connected)

    def over(self, n_connected: int) -> bool:
        return self.bounded and n_connected > self.high

    def victims(self, connected: Iterable[str], on_our_topics: set[str], now: float,
                keep: frozenset[str] = frozenset()) -> list[str]:
        """The peers to disconnect now: none at or below `high`; above it, down to `low`, the
        peers off our topics first, then the newest, each connected for at least `grace_s`, never
        one of `keep` (the peers whose groups the node uses)."""
        connected = list(connected)
        if not self.over(len(connected)):
            return []
        eligible = [pid for pid in connected
                    if pid not in keep and now - self._first_seen.get(pid, now) >= self.grace_s]
        eligible.sort(key=lambda pid: (pid in on_our_topics, -self._first_seen[pid]))
        return eligible[:len(connected) - self.low]
