"""GossipSub through the go-libp2p daemon (p2pd from the hivemind wheel), behind protocol.Transport.

Threads (none of them ever the caller's), all sharing one lock and its state (shared.py): the
supervisor starts the daemon, checks it and restarts it with exponential backoff, re-subscribing
every topic (supervisor.py); one reader per subscription fills a bounded per-topic inbox (fair:
the heaviest sender loses its oldest, protocol/inbox.py; reader.py); one writer sends publishes,
paced (writer.py); a discovery thread keeps the connections between `conn_low` and `conn_high`
(bounds.py, trimmer.py: below, it dials bootstrap and cached peers and asks the DHT for more;
above, it closes some), refreshes the peer/topic counts that `peers()` and `stats()` return and
writes the peer cache, and a guard thread disconnects origins cut for flooding (upkeep.py); every few
seconds discovery also reads our current addresses and the daemon's AutoNAT verdict (nat.py). This
module is the public face: P2pdTransport puts them together.

Semantics worth knowing:
* `Received.from_peer` is the GossipSub origin (the message's signed `from`), not the neighbour
  that forwarded it: the daemon does not tell us the latter.
* The daemon silently drops a message above its pubsub limit (1 MiB including headers; measured
  here: a 1,048,376-byte payload arrives, 1,048,576 does not) while publish says OK, so `publish`
  refuses anything above `max_msg_bytes` with ValueError (a caller error: split or shrink it).
* Messages published before a peer's subscription reaches us are lost by GossipSub (and, measured
  here, often the first few hundred ms of messages after it does), so the writer holds a message
  until its topic has had a subscribed peer for `settle_s`, at most `publish_wait_s`, then sends
  it anyway (a lone node still publishes).
* The daemon echoes our own messages to our subscription; they are skipped.
* A flooding origin is cut (dropped, disconnected by the daemon): the daemon's fixed 32-slot
  queues drop honest messages along with a flood (flood_guard.py).
"""
from __future__ import annotations

import collections
import threading
import time

from ...identity import NodeIdentity
from ..base import COUNTER_DROPPED_OUTBOUND_CLOSED, COUNTER_DROPPED_OUTBOUND_FULL, Received
from ..options import P2pdOptions
from .addrs import split_peer_addr
from .daemon import DaemonProcess, DaemonStartError
from .discovery import Dialer
from .peer_cache import PeerCache, PeerCacheLimits
from .reader import TopicReaders
from .relayed import RelayedGossip
from .shared import STATE_CLOSED, STATE_CODES, STATE_RUNNING, Shared, topic_inbox
from .supervisor import Supervisor
from .upkeep import PeerUpkeep
from .writer import Writer


class P2pdTransport:
    """protocol.Transport over a p2pd child process (GossipSub + Kademlia DHT). Thread-safe.

    :param identity_seed: 32-byte Ed25519 seed; the daemon's peer id is NodeIdentity's.
    :param options: addresses, topics, the peer cache, bounds, pacing and timeouts (P2pdOptions).
    """

    def __init__(self, identity_seed: bytes, options: P2pdOptions) -> None:
        o = self.options = options
        self.identity = NodeIdentity.from_seed(identity_seed)
        self.peer_id = self.identity.peer_id()
        bootstrap_by_peer: dict[str, list[str]] = {}  # peer id -> full multiaddrs
        for addr in o.bootstrap:  # parsed here, not in the options: they stay stdlib-only
            peer, _ = split_peer_addr(addr)  # ValueError naming the bad address
            if peer != self.peer_id:
                bootstrap_by_peer.setdefault(peer, []).append(addr)
        for addr in o.nat.relays:  # the daemon panics on a relay address it cannot parse
            split_peer_addr(addr)
        self.max_msg_bytes = o.max_msg_bytes
        self.start_timeout_s = o.start_timeout_s
        limits = o.peer_cache_limits or PeerCacheLimits()
        self.peer_cache = PeerCache(o.peer_cache, limits) if o.peer_cache else None
        dialer = Dialer(self.peer_id, bootstrap_by_peer, self.peer_cache, o.control_timeout_s,
                        o.backoff_initial_s, o.backoff_max_s, limits.max_dial_failures)
        self._shared = Shared(self.peer_id, o)
        self._readers = TopicReaders(self._shared)
        self._relayed = RelayedGossip(self._shared)
        upkeep = PeerUpkeep(self._shared, dialer, self.peer_cache)
        loops = [(Writer(self._shared).run, "p2pd-writer"), (upkeep.discovery_loop, "p2pd-discovery"),
                 (upkeep.guard_loop, "p2pd-guard"), (self._relayed.run_sender, "p2pd-relayed-out")]
        self._supervisor = Supervisor(self._shared, identity_seed, self._readers, loops, self._relayed)
        self._started = False

    # ------------------------------------------------------------------ Transport API (any thread)

    def start(self) -> None:
        """Starts the daemon (on the supervisor thread) and returns once it listens; raises
        DaemonStartError with the daemon's stderr and what to do on failure or timeout."""
        s = self._shared
        with s.lock:
            if s.state == STATE_CLOSED:
                raise RuntimeError("transport is closed")
            first = not self._started
            self._started = True
        if first:
            s.spawn(self._supervisor.run, "p2pd-supervisor")
        if not self._supervisor.ready.wait(self.start_timeout_s + 5.0):
            self.close()
            raise DaemonStartError(f"p2pd did not start within {self.start_timeout_s:.0f} s")
        if self._supervisor.start_error is not None:
            self.close()
            raise self._supervisor.start_error

    def subscribe(self, topic: str) -> None:
        s = self._shared
        with s.lock:
            if topic in s.inbox:
                return
            s.inbox[topic] = topic_inbox(self.options)
            generation = s.generation if s.state == STATE_RUNNING else None
        if generation is not None:
            self._readers.spawn(topic, generation)

    def publish(self, topic: str, data: bytes) -> None:
        """Queues `data`; never blocks. Raises ValueError for a message over `max_msg_bytes`
        (the daemon would drop it silently); a full queue or a closed transport drops and counts."""
        if len(data) > self.max_msg_bytes:
            raise ValueError(f"a {len(data)}-byte message on {topic} exceeds the p2pd transport's limit of "
                             f"{self.max_msg_bytes} bytes (the daemon drops bigger ones silently): "
                             "send fewer or shorter completions per message")
        s = self._shared
        with s.lock:
            if s.state == STATE_CLOSED:
                s.stats[COUNTER_DROPPED_OUTBOUND_CLOSED] += 1
                return
            if len(s.outbound) >= self.options.outbound_size:
                s.stats[COUNTER_DROPPED_OUTBOUND_FULL] += 1
                return
            s.outbound.append((topic, bytes(data), time.monotonic()))
            s.wake_writer.notify()
        self._relayed.offer(topic, bytes(data))  # peers we reach through a relay only get no gossip (relayed.py)

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        with self._shared.lock:
            box = self._shared.inbox.get(topic)
            if not box:
                return []
            return box.take(None if max_items is None else max(0, int(max_items)))

    def dropped_by_sender(self) -> dict[str, int]:
        """Messages each sender lost to a full inbox (all topics)."""
        with self._shared.lock:
            total: collections.Counter[str] = collections.Counter()
            for box in self._shared.inbox.values():
                total.update(box.dropped)
            return dict(total)

    def peers(self) -> list[str]:
        with self._shared.lock:
            return list(self._shared.connected)

    def network_group(self, peer_id: str) -> str:
        """The network group of a peer we are or were connected to, from the daemon's view of its
        connections (protocol/netgroups.py; refreshed every discovery round); "" if unknown."""
        with self._shared.lock:
            return self._shared.peer_groups.get(peer_id, "")

    def listen_addrs(self) -> list[str]:
        with self._shared.lock:
            return list(self._shared.listen_addrs)

    def reachability(self) -> str:
        """unknown / public / private: what AutoNAT concluded (or swarm.nat.reachability forced)."""
        with self._shared.lock:
            return self._shared.reach.reachability

    def stats(self) -> dict[str, int]:
        s = self._shared
        with s.lock:
            out = dict(s.stats)
            out["daemon_pid"] = (s.daemon.pid or 0) if s.daemon else 0
            out["daemon_state"] = STATE_CODES[s.state]  # 0 starting, 1 running, 2 restarting, 3 closed
            out["connected_peers"] = len(s.connected)
            out["dht_peers"] = s.dht_peers  # peers our last DHT lookup of our own id named
            out["outbound_queued"] = len(s.outbound)
            out.update(s.reach.counters())  # reachability 0 unknown, 1 public, 2 private; relay slots (nat.py)
            out["relayed_addrs"] = sum("/p2p-circuit" in a for a in s.listen_addrs)
            out["relayed_peers"] = len(s.relayed_peers)
            out["flooders_cut"] = s.flood_guard.cuts
            out["dropped_flooding_origin"] = s.flood_guard.dropped
            for topic, n in s.topic_peers.items():
                out[f"topic_peers:{topic}"] = n
        return out

    def note_useful_peers(self, peer_ids: list[str]) -> None:
        """The node used verified groups signed by these peers: they are kept connected (upkeep.py)
        and the peer cache ranks them first."""
        self._shared.note_useful(peer_ids, time.monotonic())
        if self.peer_cache is not None:
            self.peer_cache.note_useful(peer_ids)

    @property
    def state(self) -> str:
        return self._shared.state

    @property
    def daemon(self) -> DaemonProcess | None:
        """The running go-libp2p daemon (None before start, after close, or between restarts): its log
        (stderr_path) and control socket (socket_path), which benchmarks and tests read."""
        return self._shared.daemon

    def close(self) -> None:
        """Stops every thread and the daemon (SIGTERM, then SIGKILL). Idempotent."""
        s = self._shared
        with s.lock:
            if s.state == STATE_CLOSED:
                return
            s.state = STATE_CLOSED
            s.wake_writer.notify_all()
            subscriptions = list(s.subscriptions.values())
        s.stop.set()
        s.wake_guard.set()
        for conn in subscriptions:
            conn.close()  # unblocks the readers
        self._relayed.close()
        if s.daemon is not None:
            s.daemon.stop()  # first: control calls in flight (a DHT lookup) fail at once
        for thread in s.threads:
            if thread is not threading.current_thread():
                thread.join(self.options.control_timeout_s + 2.0)
        with s.lock:
            daemon = s.daemon  # a restart may have raced the close: it stops its own daemon then
        if daemon is not None:
            daemon.stop()
        if self.peer_cache is not None:
            self.peer_cache.save()
        self._supervisor.ready.set()

    def __enter__(self) -> P2pdTransport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"P2pdTransport({self.peer_id}, {self.state}, listen={self.listen_addrs() or list(self.options.listen)})"
