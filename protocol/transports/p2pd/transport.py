"""GossipSub through the go-libp2p daemon (p2pd from the hivemind wheel), behind protocol.Transport.

Threads (none of them ever the caller's): a supervisor starts the daemon, checks it every
`health_interval_s` (process alive, IDENTIFY answered in time) and restarts it with exponential
backoff when it exits or its control socket is stuck, re-subscribing every topic; one reader per
subscription fills a bounded per-topic inbox (fair: the heaviest sender loses its oldest, protocol/inbox.py);
one writer sends publishes; a guard thread disconnects origins cut for flooding
(protocol/transports/p2pd/flood_guard.py); a discovery thread keeps bootstrap and cached peers dialed and asks
the DHT for more (protocol/transports/p2pd/discovery.py), refreshes the peer/topic counts that `peers()` and
`stats()` return, and writes the peer cache.

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
import logging
import threading
import time
from pathlib import Path

from ...identity import NodeIdentity
from ..base import (
    COUNTER_DROPPED_INBOUND_FULL,
    COUNTER_DROPPED_OUTBOUND_CLOSED,
    COUNTER_DROPPED_OUTBOUND_FULL,
    COUNTER_DROPPED_UNSUBSCRIBED,
    COUNTER_PUBLISHED,
    COUNTER_RECEIVED,
    Received,
)
from ..options import P2pdOptions
from ...inbox import FairBuffer
from ...ratelimit import Pacer
from .addrs import peer_id_text, split_peer_addr
from .control import (
    ControlConnection,
    ControlError,
    identify_request,
    list_peers_request,
    publish_request,
    subscribe_request,
    topic_peers_request,
)
from .daemon import DaemonProcess, DaemonStartError
from .discovery import Dialer, ask_dht, peer_addrs
from .flood_guard import FloodGuard, disconnect_origins
from .peer_cache import PeerCache, PeerCacheLimits
from proto._generated import p2pd_control_pb2 as pb

log = logging.getLogger(__name__)

# go-libp2p-pubsub 0.10 in the daemon queues at most 32 RPCs per peer and drops the rest ("queue
# full"), and delivers to a subscription through a 32-message buffer that drops when the daemon's
# pipe to us falls behind ("subscriber too slow"; seen on this loaded 2-core machine with 200
# publishes paced at 1000/s). Measured on loopback: 300 back-to-back publishes lost 4-233; the
# same paced 2 ms apart lost none. The writer paces itself (publish_rate); a burst can still lose
# a few messages when the machine starves the daemon, and nothing tells us (the daemon only logs).
PUBLISH_BURST = 16

STATE_STARTING, STATE_RUNNING, STATE_RESTARTING, STATE_CLOSED = "starting", "running", "restarting", "closed"
_STATE_CODES = {STATE_STARTING: 0, STATE_RUNNING: 1, STATE_RESTARTING: 2, STATE_CLOSED: 3}

STAT_KEYS = (
    COUNTER_PUBLISHED, COUNTER_DROPPED_OUTBOUND_FULL, COUNTER_DROPPED_OUTBOUND_CLOSED,
    "publish_errors",          # the daemon failed a publish (retried after a restart)
    "published_without_peers",  # sent after waiting publish_wait_s with no subscribed peer
    COUNTER_RECEIVED, COUNTER_DROPPED_INBOUND_FULL, COUNTER_DROPPED_UNSUBSCRIBED,
    "dropped_inbound_oversize",
    "daemon_restarts", "daemon_failures",  # exits / stuck sockets seen; failed restart attempts
    "dial_attempts", "dial_failures",
    "dial_given_up",  # cached peers no longer redialed this run (failed max_dial_failures in a row)
    "flooders_cut",              # origins cut for flooding (flood_guard.py)
    "dropped_flooding_origin",   # messages dropped because their origin was cut
    "flood_disconnects",         # DISCONNECTs the daemon carried out for cut origins
)


class P2pdTransport:
    """protocol.Transport over a p2pd child process (GossipSub + Kademlia DHT). Thread-safe.

    :param identity_seed: 32-byte Ed25519 seed; the daemon's peer id is NodeIdentity's.
    :param options: addresses, topics, the peer cache, bounds, pacing and timeouts (P2pdOptions).
    """

    def __init__(self, identity_seed: bytes, options: P2pdOptions) -> None:
        o = self.options = options
        self.identity = NodeIdentity.from_seed(identity_seed)
        self.peer_id = self.identity.peer_id()
        self._seed = bytes(identity_seed)
        self._listen = list(o.listen)
        bootstrap_by_peer: dict[str, list[str]] = {}  # peer id -> full multiaddrs
        for addr in o.bootstrap:  # parsed here, not in the options: they stay stdlib-only
            peer, _ = split_peer_addr(addr)  # ValueError naming the bad address
            if peer != self.peer_id:
                bootstrap_by_peer.setdefault(peer, []).append(addr)
        self.max_msg_bytes = o.max_msg_bytes
        limits = o.peer_cache_limits or PeerCacheLimits()
        self.peer_cache = PeerCache(o.peer_cache, limits) if o.peer_cache else None
        self.start_timeout_s = o.start_timeout_s
        self._inbox_size, self._outbound_size = o.inbox_size, o.outbound_size
        self._publish_wait_s, self._control_timeout_s = o.publish_wait_s, o.control_timeout_s
        self._publish_rate, self._settle_s = o.publish_rate, o.settle_s
        self._health_interval_s, self._discovery_interval_s = o.health_interval_s, o.discovery_interval_s
        self._backoff_initial_s, self._backoff_max_s = o.backoff_initial_s, o.backoff_max_s
        self._dialer = Dialer(self.peer_id, bootstrap_by_peer, self.peer_cache, o.control_timeout_s,
                              o.backoff_initial_s, o.backoff_max_s, limits.max_dial_failures)

        self._lock = threading.Lock()
        self._wake_writer = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stats = dict.fromkeys(STAT_KEYS, 0)
        self._flood_guard = FloodGuard(o.flood_cut_rate, o.flood_cut_burst, o.flood_cut_s)
        self._wake_guard = threading.Event()
        self._inbox: dict[str, FairBuffer[Received]] = {}
        self._outbound: collections.deque[tuple[str, bytes, float]] = collections.deque()
        self._state = STATE_STARTING
        self._daemon: DaemonProcess | None = None
        self._generation = 0  # +1 per daemon run; readers and the writer follow it
        self._listen_addrs: list[str] = []
        self._connected: list[str] = []
        self._topic_peers: dict[str, int] = {}
        self._dht_peers = 0
        self._subscriptions: dict[str, ControlConnection] = {}
        self._threads: list[threading.Thread] = []
        self._started = False
        for topic in o.topics:
            self._inbox[topic] = FairBuffer(o.inbox_size)

    # ------------------------------------------------------------------ Transport API (any thread)

    def start(self) -> None:
        """Starts the daemon (on the supervisor thread) and returns once it listens; raises
        DaemonStartError with the daemon's stderr and what to do on failure or timeout."""
        with self._lock:
            if self._state == STATE_CLOSED:
                raise RuntimeError("transport is closed")
            first = not self._started
            self._started = True
        if first:
            self._spawn_thread(self._supervise, "p2pd-supervisor")
        if not self._ready.wait(self.start_timeout_s + 5.0):
            self.close()
            raise DaemonStartError(f"p2pd did not start within {self.start_timeout_s:.0f} s")
        if self._start_error is not None:
            self.close()
            raise self._start_error

    def subscribe(self, topic: str) -> None:
        with self._lock:
            if topic in self._inbox:
                return
            self._inbox[topic] = FairBuffer(self._inbox_size)
            generation = self._generation if self._state == STATE_RUNNING else None
        if generation is not None:
            self._spawn_thread(lambda: self._read_topic(topic, generation), "p2pd-reader")

    def publish(self, topic: str, data: bytes) -> None:
        """Queues `data`; never blocks. Raises ValueError for a message over `max_msg_bytes`
        (the daemon would drop it silently); a full queue or a closed transport drops and counts."""
        if len(data) > self.max_msg_bytes:
            raise ValueError(f"a {len(data)}-byte message on {topic} exceeds the p2pd transport's limit of "
                             f"{self.max_msg_bytes} bytes (the daemon drops bigger ones silently): "
                             "send fewer or shorter completions per message")
        with self._lock:
            if self._state == STATE_CLOSED:
                self._stats[COUNTER_DROPPED_OUTBOUND_CLOSED] += 1
                return
            if len(self._outbound) >= self._outbound_size:
                self._stats[COUNTER_DROPPED_OUTBOUND_FULL] += 1
                return
            self._outbound.append((topic, bytes(data), time.monotonic()))
            self._wake_writer.notify()

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        with self._lock:
            box = self._inbox.get(topic)
            if not box:
                return []
            return box.take(None if max_items is None else max(0, int(max_items)))

    def dropped_by_sender(self) -> dict[str, int]:
        """Messages each sender lost to a full inbox (all topics)."""
        with self._lock:
            total: collections.Counter[str] = collections.Counter()
            for box in self._inbox.values():
                total.update(box.dropped)
            return dict(total)

    def peers(self) -> list[str]:
        with self._lock:
            return list(self._connected)

    def listen_addrs(self) -> list[str]:
        with self._lock:
            return list(self._listen_addrs)

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._stats)
            out["daemon_pid"] = (self._daemon.pid or 0) if self._daemon else 0
            out["daemon_state"] = _STATE_CODES[self._state]  # 0 starting, 1 running, 2 restarting, 3 closed
            out["connected_peers"] = len(self._connected)
            out["dht_peers"] = self._dht_peers  # peers our last DHT lookup of our own id named
            out["outbound_queued"] = len(self._outbound)
            out["flooders_cut"] = self._flood_guard.cuts
            out["dropped_flooding_origin"] = self._flood_guard.dropped
            for topic, n in self._topic_peers.items():
                out[f"topic_peers:{topic}"] = n
        return out

    def note_useful_peers(self, peer_ids: list[str]) -> None:
        """The node used verified groups signed by these peers: the peer cache ranks them first."""
        if self.peer_cache is not None:
            self.peer_cache.note_useful(peer_ids)

    @property
    def state(self) -> str:
        return self._state

    def close(self) -> None:
        """Stops every thread and the daemon (SIGTERM, then SIGKILL). Idempotent."""
        with self._lock:
            if self._state == STATE_CLOSED:
                return
            self._state = STATE_CLOSED
            self._wake_writer.notify_all()
            subscriptions = list(self._subscriptions.values())
        self._stop.set()
        self._wake_guard.set()
        for conn in subscriptions:
            conn.close()  # unblocks the readers
        if self._daemon is not None:
            self._daemon.stop()  # first: control calls in flight (a DHT lookup) fail at once
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(self._control_timeout_s + 2.0)
        with self._lock:
            daemon = self._daemon  # a restart may have raced the close: it stops its own daemon then
        if daemon is not None:
            daemon.stop()
        if self.peer_cache is not None:
            self.peer_cache.save()
        self._ready.set()

    def __enter__(self) -> P2pdTransport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"P2pdTransport({self.peer_id}, {self._state}, listen={self.listen_addrs() or self._listen})"

    # ------------------------------------------------------------------ internals

    def _spawn_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=f"{name}-{self.peer_id[-6:]}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _bump(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] = self._stats.get(key, 0) + n

    def _launch_daemon(self, listen: list[str]) -> None:
        """Starts one daemon run; on success it is the current one and its readers run."""
        daemon = DaemonProcess(self._seed, listen=listen, expected_peer_id=self.peer_id,
                               control_timeout_s=self._control_timeout_s)
        _, addrs = daemon.start(self.start_timeout_s)
        with self._lock:
            if self._state == STATE_CLOSED:
                daemon.stop()
                return
            self._daemon = daemon
            self._generation += 1
            generation = self._generation
            self._listen_addrs = [f"{a}/p2p/{self.peer_id}" for a in addrs]
            self._state = STATE_RUNNING
            topics = list(self._inbox)
        subscribed = [threading.Event() for _ in topics]
        for topic, event in zip(topics, subscribed):
            self._spawn_thread(lambda t=topic, e=event: self._read_topic(t, generation, e), "p2pd-reader")
        for event in subscribed:  # so that start() returns with every topic collecting
            event.wait(self._control_timeout_s)
        log.info("p2pd (pid %s) runs as %s on %s", daemon.pid, self.peer_id, ", ".join(self._listen_addrs),
                 extra={"event": "daemon_started", "pid": daemon.pid, "generation": generation,
                        "restarts": self._stats["daemon_restarts"], "listen_addrs": list(self._listen_addrs)})

    def _supervise(self) -> None:
        """Owns the daemon: the thread that starts it must outlive it (PR_SET_PDEATHSIG)."""
        try:
            self._launch_daemon(self._listen)
        except BaseException as err:  # noqa: BLE001 - handed to start()
            self._start_error = err
            self._ready.set()
            return
        self._ready.set()
        self._spawn_thread(self._write_loop, "p2pd-writer")
        self._spawn_thread(self._discovery_loop, "p2pd-discovery")
        self._spawn_thread(self._guard_loop, "p2pd-guard")
        # After the first run, restarts reuse its real ports, so peers that know us can redial.
        reuse = [a.split("/p2p/")[0] for a in self._listen_addrs] or self._listen
        while not self._stop.wait(self._health_interval_s):
            try:
                problem = self._health_problem()
                if problem is not None:
                    self._restart(problem, reuse)
            except Exception:  # noqa: BLE001 - a bug here must not end supervision (nor, via PDEATHSIG, the daemon)
                log.exception("p2pd supervisor error (continuing)")

    def _health_problem(self) -> str | None:
        daemon = self._daemon
        if daemon is None or self._stop.is_set():
            return None
        if not daemon.alive():
            return f"p2pd (pid {daemon.pid}) exited with code {daemon.proc.returncode}"
        try:
            with ControlConnection(daemon.socket_path, self._control_timeout_s) as conn:
                conn.request(identify_request())
        except ControlError as err:
            return f"p2pd (pid {daemon.pid}) control socket is stuck or broken ({err})"
        return None

    def _restart(self, problem: str, reuse: list[str]) -> None:
        old = self._daemon
        tail = old.stderr_tail() if old else ""
        with self._lock:
            if self._state == STATE_CLOSED:
                return
            self._state = STATE_RESTARTING
            self._stats["daemon_restarts"] += 1
            restarts = self._stats["daemon_restarts"]
            subscriptions = list(self._subscriptions.values())
            self._subscriptions.clear()
        log.error("%s; restarting it. stderr tail:\n%s", problem, tail or "(empty)",
                  extra={"event": "daemon_restart", "reason": problem, "pid": old.pid if old else None,
                         "restarts": restarts, "stderr_tail": tail})
        for conn in subscriptions:
            conn.close()
        if old is not None:
            old.stop()
        delay = self._backoff_initial_s
        listen = reuse
        while not self._stop.is_set():
            try:
                self._launch_daemon(listen)
                return
            except DaemonStartError as err:
                self._bump("daemon_failures")
                log.error("p2pd restart failed (retrying in %.1f s): %s", delay, err,
                          extra={"event": "daemon_restart_failed", "retry_in_s": delay, "error": str(err)})
                listen = self._listen  # our old ports may be taken: fall back to the configured ones
            if self._stop.wait(delay):
                return
            delay = min(2 * delay, self._backoff_max_s)

    def _socket_for(self, generation: int) -> Path | None:
        with self._lock:
            if self._generation != generation or self._state != STATE_RUNNING or self._daemon is None:
                return None
            return self._daemon.socket_path

    def _read_topic(self, topic: str, generation: int, subscribed: threading.Event | None = None) -> None:
        """Subscribes and reads `topic` for as long as daemon run `generation` is the current one
        (re-subscribing if the daemon drops the subscription while it stays healthy)."""
        key = f"{generation}:{topic}"
        while not self._stop.is_set():
            socket_path = self._socket_for(generation)
            if socket_path is None:
                break
            try:
                conn = ControlConnection(socket_path, self._control_timeout_s)
                conn.request(subscribe_request(topic))
            except ControlError as err:
                log.warning("subscribing to %s failed (%s); retrying", topic, err)
                self._stop.wait(0.5)
                continue
            conn.sock.settimeout(None)  # a quiet topic is normal; close() or a daemon exit ends the read
            with self._lock:
                if self._generation != generation or self._state == STATE_CLOSED:
                    conn.close()
                    break
                self._subscriptions[key] = conn
            if subscribed is not None:
                subscribed.set()
            try:
                while True:
                    self._deliver(topic, conn.read(pb.PSMessage))
            except ControlError as err:
                if not self._stop.is_set() and self._socket_for(generation) is not None:
                    log.warning("subscription to %s ended (%s); subscribing again", topic, err)
                    self._stop.wait(0.2)
            finally:
                conn.close()
                with self._lock:
                    self._subscriptions.pop(key, None)
        if subscribed is not None:
            subscribed.set()

    def _deliver(self, topic: str, message: pb.PSMessage) -> None:
        sender = peer_id_text(getattr(message, "from"))
        if sender == self.peer_id:
            return  # the daemon echoes our own publishes
        data = message.data
        if len(data) > self.max_msg_bytes:
            self._bump("dropped_inbound_oversize")
            return
        item = Received(from_peer=sender, data=data, received_at=time.time())
        with self._lock:
            if not self._flood_guard.arrival(sender, time.monotonic()):
                self._wake_guard.set()  # the guard thread disconnects it: this reader must keep reading
                return
            box = self._inbox.get(topic)
            if box is None:
                self._stats[COUNTER_DROPPED_UNSUBSCRIBED] += 1
                return
            self._stats[COUNTER_DROPPED_INBOUND_FULL] += len(box.put(sender, item))  # the heaviest sender's oldest
            self._stats[COUNTER_RECEIVED] += 1

    def _write_loop(self) -> None:
        conn: ControlConnection | None = None
        conn_generation = -1
        peers_checked: dict[str, tuple[float, int]] = {}  # topic -> (when, subscribed peers)
        peers_since: dict[str, float] = {}  # topic -> since when it has had subscribed peers
        pacer = Pacer(self._publish_rate, burst=PUBLISH_BURST)
        while True:
            with self._lock:
                while not self._outbound and self._state != STATE_CLOSED:
                    self._wake_writer.wait()
                if self._state == STATE_CLOSED:
                    break
                topic, data, queued_at = self._outbound[0]
                generation = self._generation
            try:
                if conn is None or conn_generation != generation:
                    if conn is not None:
                        conn.close()
                        conn = None
                    socket_path = self._socket_for(generation)
                    if socket_path is None:  # restarting: keep the queue, try again shortly
                        self._stop.wait(0.1)
                        continue
                    conn, conn_generation = ControlConnection(socket_path, self._control_timeout_s), generation
                checked_at, n_peers = peers_checked.get(topic, (0.0, 0))
                # re-asked often while nobody is subscribed, now and then once somebody is (a peer
                # that left or restarted is noticed, and its messages wait for it again)
                if time.monotonic() - checked_at > (0.05 if n_peers == 0 else 0.5):
                    n_peers = len(conn.request(topic_peers_request(topic)).pubsub.peerIDs)
                    peers_checked[topic] = (time.monotonic(), n_peers)
                    if n_peers == 0:
                        peers_since.pop(topic, None)
                    else:
                        peers_since.setdefault(topic, time.monotonic())
                    with self._lock:
                        self._topic_peers[topic] = n_peers
                now = time.monotonic()
                settled = n_peers > 0 and now - peers_since.get(topic, now) >= self._settle_s
                if not settled and now - queued_at < self._publish_wait_s:
                    self._stop.wait(0.02)  # GossipSub would lose it: no peer's subscription has settled yet
                    continue
                pacer.wait(self._stop)
                conn.request(publish_request(topic, data))
            except ControlError as err:
                self._bump("publish_errors")
                log.warning("publish on %s failed (%s); retrying after the daemon recovers", topic, err)
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(0.2)
                continue
            with self._lock:
                if self._outbound and self._outbound[0][2] == queued_at:
                    self._outbound.popleft()
                self._stats[COUNTER_PUBLISHED] += 1
                if n_peers == 0:
                    self._stats["published_without_peers"] += 1
        if conn is not None:
            conn.close()

    def _discovery_loop(self) -> None:
        """Keeps bootstrap and cached peers dialed, grows the peer set through the DHT, refreshes
        the counts shown by peers()/stats(), and writes the peer cache."""
        cache_written = 0.0
        remembered: set[str] = set()
        dialed_generation = -1
        while True:
            with self._lock:
                generation = self._generation
            if generation != dialed_generation:  # a new daemon knows nobody: dial everyone at once
                self._dialer.reset()
                dialed_generation = generation
            try:
                self._discovery_round(generation)
                with self._lock:
                    connected = set(self._connected)
                # remembered when we meet somebody new, and refreshed every 10 s (fresh `seen` times)
                if self.peer_cache is not None and (connected - remembered or time.monotonic() - cache_written > 10.0):
                    if self._remember_peers(generation):
                        cache_written, remembered = time.monotonic(), connected
                if self.peer_cache is not None:  # only if something changed: dial outcomes, usefulness, peers
                    self.peer_cache.save()
            except Exception:  # noqa: BLE001 - discovery must go on whatever one round met
                log.exception("p2pd discovery round failed (continuing)")
            if self._stop.wait(self._discovery_interval_s):
                return

    def _discovery_round(self, generation: int) -> None:
        socket_path = self._socket_for(generation)
        if socket_path is None:
            return
        try:
            with ControlConnection(socket_path, self._control_timeout_s) as conn:
                connected = {peer_id_text(p.id) for p in conn.request(list_peers_request()).peers}
                topic_peers = {t: len(conn.request(topic_peers_request(t)).pubsub.peerIDs) for t in self._topics()}
                with self._lock:
                    self._connected = sorted(connected)
                    self._topic_peers.update(topic_peers)
                    now = time.monotonic()
                    self._flood_guard.seen_connected(sorted(connected), now)
                    cut = frozenset(self._flood_guard.cut_origins(now))
                if cut:
                    self._wake_guard.set()
                self._dialer.dial_missing(conn, connected, self._bump, skip=cut)
            dht_peers = ask_dht(socket_path, self.peer_id, self._control_timeout_s)
            with self._lock:
                self._dht_peers = dht_peers
        except ControlError as err:
            log.debug("discovery round failed: %s", err)

    def _guard_loop(self) -> None:
        """Tells the daemon to disconnect cut origins (never on a reader thread: a control call
        there would stall the subscription while the flood fills the daemon's buffer)."""
        while not self._stop.is_set():
            self._wake_guard.wait(1.0)
            self._wake_guard.clear()
            try:
                with self._lock:
                    due = self._flood_guard.take_disconnects(time.monotonic())
                    generation = self._generation
                socket_path = self._socket_for(generation) if due else None
                if socket_path is None:
                    continue  # nothing due, or restarting: a cut origin seen again is due again
                self._bump("flood_disconnects", disconnect_origins(socket_path, due, self._control_timeout_s))
            except Exception:  # noqa: BLE001 - the guard must go on whatever one pass met
                log.exception("p2pd flood guard pass failed (continuing)")
            self._stop.wait(self._flood_guard.redisconnect_s)  # a flooder that redials is cut again after this

    def _remember_peers(self, generation: int) -> bool:
        """Records the connected peers' dialable addresses in the peer cache (True if any)."""
        socket_path = self._socket_for(generation)
        if socket_path is None or self.peer_cache is None:
            return False
        try:
            with ControlConnection(socket_path, self._control_timeout_s) as conn:
                connected = [peer_id_text(p.id) for p in conn.request(list_peers_request()).peers]
                addrs = peer_addrs(conn, connected)
        except ControlError as err:
            log.debug("peer cache update failed: %s", err)
            return False
        if not addrs:
            return False
        self.peer_cache.remember(addrs)
        return True

    def _topics(self) -> list[str]:
        with self._lock:
            return list(self._inbox)
