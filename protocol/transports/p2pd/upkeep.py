"""The p2pd transport's peer upkeep, two threads: discovery keeps the connections within their
bounds (bounds.py: it trims above `conn_high`; below `conn_low` it dials bootstrap and cached
peers and asks the DHT for more, discovery.py) except for the peers whose groups the node uses
(shared.py `valued_peers`: never trimmed, tagged for the daemon's connection manager, redialed at
once when they drop, whatever the bounds), refreshes the peer/topic counts that `peers()` and
`stats()` return and writes the peer cache; the guard disconnects origins cut for flooding
(flood_guard.py)."""
from __future__ import annotations

import dataclasses
import logging
import re
import time

from protocol.netgroups import peer_group

from .addrs import addr_text, peer_id_text
from .bounds import ConnectionBounds
from .control import ControlConnection, ControlError, identify_request, list_peers_request, topic_peers_request
from .discovery import Dialer, ask_dht, peer_addrs
from .flood_guard import disconnect_origins
from .nat import metrics_port, read_reach
from .relayed import relayed_only
from .peer_cache import PeerCache
from .shared import Shared
from .trimmer import Trimmer, connected_peers

log = logging.getLogger(__name__)
REACH_INTERVAL_S = 5.0  # how often our addresses and the daemon's AutoNAT verdict are read (nat.py)


MAX_GROUPS_KEPT = 4096  # network groups of peers seen; beyond it only the connected ones are kept

class PeerUpkeep:
    def __init__(self, shared: Shared, dialer: Dialer, peer_cache: PeerCache | None) -> None:
        self.shared, self.dialer, self.peer_cache = shared, dialer, peer_cache
        self.bounds = ConnectionBounds.from_options(shared.options)
        self.trimmer = Trimmer(shared, self.bounds)

    def discovery_loop(self) -> None:
        """Keeps the connections within bounds (dialing bootstrap and cached peers and asking the
        DHT while short of peers), refreshes the counts shown by peers()/stats(), and writes the
        peer cache."""
        s = self.shared
        cache_written = 0.0
        remembered: set[str] = set()
        dialed_generation = -1
        reach_read = 0.0
        while True:
            with s.lock:
                generation = s.generation
            if generation != dialed_generation:  # a new daemon knows nobody: dial at once
                self.dialer.reset()
                self.bounds.reset()
                dialed_generation = generation
            try:
                if time.monotonic() - reach_read >= REACH_INTERVAL_S:
                    self._refresh_reach(generation)
                    reach_read = time.monotonic()
                self._discovery_round(generation)
                with s.lock:
                    connected = set(s.connected)
                # remembered when we meet somebody new, and refreshed every 10 s (fresh `seen` times)
                if self.peer_cache is not None and (connected - remembered or time.monotonic() - cache_written > 10.0):
                    if self._remember_peers(generation):
                        cache_written, remembered = time.monotonic(), connected
                if self.peer_cache is not None:  # only if something changed: dial outcomes, usefulness, peers
                    self.peer_cache.save()
            except Exception:  # noqa: BLE001 - discovery must go on whatever one round met
                log.exception("p2pd discovery round failed (continuing)")
            if s.stop.wait(s.options.discovery_interval_s):
                return

    def _discovery_round(self, generation: int) -> None:
        s = self.shared
        socket_path = s.socket_for(generation)
        if socket_path is None:
            return
        timeout = s.options.control_timeout_s
        try:
            with ControlConnection(socket_path, timeout) as conn:
                connected, relayed, members, groups = self._census(conn)
                keep = frozenset(s.valued_peers(time.monotonic()))
                connected -= self.trimmer.trim(conn, connected, members, keep)
                with s.lock:
                    s.connected = sorted(connected)
                    s.relayed_peers = relayed & connected
                    s.peer_groups.update(groups)  # kept after a peer leaves: its queued messages still name it
                    if len(s.peer_groups) > MAX_GROUPS_KEPT:
                        s.peer_groups = {pid: groups.get(pid, g) for pid, g in s.peer_groups.items() if pid in connected}
                    s.topic_peers.update({topic: len(peers) for topic, peers in members.items()})
                    now = time.monotonic()
                    s.flood_guard.seen_connected(sorted(connected), now)
                    cut = frozenset(s.flood_guard.cut_origins(now))
                if cut:
                    s.wake_guard.set()
                dialed = self.dialer.dial_missing(conn, connected, s.bump, skip=cut,
                                                  budget=self.bounds.dial_budget(len(connected)), must=keep)
                if not self.bounds.wants_more(len(connected) + dialed):
                    return  # a bounded node with enough peers asks nobody
                before = connected_peers(conn) if self.bounds.bounded else set()
            dht_peers = ask_dht(socket_path, s.peer_id, timeout)
            with s.lock:
                s.dht_peers = dht_peers
            with ControlConnection(socket_path, timeout) as conn:
                self.trimmer.after_lookup(conn, before)
        except ControlError as err:
            log.debug("discovery round failed: %s", err)

    def _refresh_reach(self, generation: int) -> None:
        """Our addresses as the daemon now announces them (relayed ones appear once a relay holds a
        slot for us) and what AutoNAT concluded (nat.py), both kept for listen_addrs() and stats()."""
        s = self.shared
        socket_path = s.socket_for(generation)
        with s.lock:
            daemon, port, before = s.daemon, s.metrics_port, s.reach
        if socket_path is None or daemon is None or daemon.pid is None:
            return
        timeout = s.options.control_timeout_s
        try:
            with ControlConnection(socket_path, timeout) as conn:
                raw = conn.request(identify_request()).identify.addrs
        except ControlError as err:
            log.debug("identify failed: %s", err)
            return
        addrs = [f"{a}/p2p/{s.peer_id}" for a in (addr_text(r) for r in raw) if a]
        if port is None:
            port = metrics_port(daemon.pid, {int(p) for p in re.findall(r"/tcp/(\d+)", " ".join(addrs))})
        reach = None
        if port is not None:
            try:
                reach = read_reach(port, timeout)
            except (OSError, ValueError) as err:
                log.debug("daemon metrics unreadable on port %s: %s", port, err)
                port = None  # found again next time
        with s.lock:
            if s.generation != generation:
                return
            s.listen_addrs = addrs or s.listen_addrs
            s.metrics_port = port
            if reach is not None and s.options.nat.reachability != "auto":  # forced: AutoNAT does not run
                reach = dataclasses.replace(reach, reachability=s.options.nat.reachability)
            s.reach = reach or s.reach
        if reach is not None and reach.reachability != before.reachability:
            log.info("reachability: %s (relay slots held: %d; relay service: %s); addresses: %s", reach.reachability,
                     reach.relay_reservations, "on" if reach.relay_serving else "off", ", ".join(addrs),
                     extra={"event": "reachability", "reachability": reach.reachability, "listen_addrs": addrs})

    def _census(self, conn: ControlConnection) -> tuple[set[str], set[str], dict[str, set[str]], dict[str, str]]:
        """The connected peers, those of them reached through a relay only (relayed.py), the peers
        subscribed to each of our topics, and each connected peer's network group (protocol/netgroups.py)."""
        members = {t: {peer_id_text(p) for p in conn.request(topic_peers_request(t)).pubsub.peerIDs}
                   for t in self.shared.topics()}
        peers = conn.request(list_peers_request()).peers
        groups = {peer_id_text(p.id): peer_group([a for a in map(addr_text, p.addrs) if a]) for p in peers}
        return {peer_id_text(p.id) for p in peers}, relayed_only(peers), members, groups

    def _remember_peers(self, generation: int) -> bool:
        """Records the connected peers' dialable addresses in the peer cache (True if any)."""
        socket_path = self.shared.socket_for(generation)
        if socket_path is None or self.peer_cache is None:
            return False
        try:
            with ControlConnection(socket_path, self.shared.options.control_timeout_s) as conn:
                connected = [peer_id_text(p.id) for p in conn.request(list_peers_request()).peers]
                addrs = peer_addrs(conn, connected)
        except ControlError as err:
            log.debug("peer cache update failed: %s", err)
            return False
        if not addrs:
            return False
        self.peer_cache.remember(addrs)
        return True

    def guard_loop(self) -> None:
        """Tells the daemon to disconnect cut origins (never on a reader thread: a control call
        there would stall the subscription while the flood fills the daemon's buffer)."""
        s = self.shared
        while not s.stop.is_set():
            s.wake_guard.wait(1.0)
            s.wake_guard.clear()
            try:
                with s.lock:
                    due = s.flood_guard.take_disconnects(time.monotonic())
                    generation = s.generation
                socket_path = s.socket_for(generation) if due else None
                if socket_path is None:
                    continue  # nothing due, or restarting: a cut origin seen again is due again
                s.bump("flood_disconnects", disconnect_origins(socket_path, due, s.options.control_timeout_s))
            except Exception:  # noqa: BLE001 - the guard must go on whatever one pass met
                log.exception("p2pd flood guard pass failed (continuing)")
            s.stop.wait(s.flood_guard.redisconnect_s)  # a flooder that redials is cut again after this
