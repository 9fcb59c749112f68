"""What the p2pd transport's threads share (protocol/transports/p2pd/transport.py): one lock and
everything it guards (queues, inboxes, counters, the current daemon run), plus the events that
stop and wake the threads."""
from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Callable

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
from .control import ControlConnection
from .daemon import DaemonProcess
from .dedup import GOSSIP, CrossPathDedup, digest
from .flood_guard import FloodGuard
from .nat import Reach

TAKEN_IN, TAKEN_UNSUBSCRIBED, TAKEN_CUT, TAKEN_COPY = "in", "unsubscribed", "cut", "copy"  # Shared.take_in's outcomes
STATE_STARTING, STATE_RUNNING, STATE_RESTARTING, STATE_CLOSED = "starting", "running", "restarting", "closed"
STATE_CODES = {STATE_STARTING: 0, STATE_RUNNING: 1, STATE_RESTARTING: 2, STATE_CLOSED: 3}

STAT_KEYS = (
    COUNTER_PUBLISHED, COUNTER_DROPPED_OUTBOUND_FULL, COUNTER_DROPPED_OUTBOUND_CLOSED,
    "publish_errors",          # the daemon failed a publish (retried after a restart)
    "published_without_peers",  # sent after waiting publish_wait_s with no subscribed peer
    "held_for_subscribers",     # messages that waited for a topic's subscribed peer to settle (settle_s)
    COUNTER_RECEIVED, COUNTER_DROPPED_INBOUND_FULL, COUNTER_DROPPED_UNSUBSCRIBED,
    "dropped_inbound_oversize",
    "daemon_restarts", "daemon_failures",  # exits / stuck sockets seen; failed restart attempts
    "dial_attempts", "dial_failures",
    "dial_given_up",  # cached peers no longer redialed this run (failed max_dial_failures in a row)
    "trimmed_by_daemon", "trimmed_by_us",  # connections closed above conn_high (bounds.py)
    "trimmed_after_lookup",  # connections a DHT lookup opened beyond conn_low, closed at once
    "flooders_cut",              # origins cut for flooding (flood_guard.py)
    "dropped_flooding_origin",   # messages dropped because their origin was cut
    "flood_disconnects",         # DISCONNECTs the daemon carried out for cut origins
    "relayed_sent", "relayed_send_failures",  # our messages on streams to relayed-only peers (relayed.py)
    "relayed_received",          # messages such peers brought on streams (delivered like gossip)
    "relayed_refused",           # inbound relayed streams that broke the framing or limits
    "relayed_timed_out",         # inbound relayed streams cut at their deadline (stream_bounds.py)
    "relayed_evicted",           # inbound relayed streams displaced by a newcomer (sender's cap, full table)
    "relayed_dropped_outbound",  # our messages for relayed peers dropped: the queue was full
    "relayed_given_up",          # our messages a relayed peer never acknowledged after SEND_TRIES tries
    "relayed_too_big",           # our messages over MAX_RELAYED_BYTES: no relay carries them
    "direct_sent", "direct_send_failures",  # our messages on streams to direct peers, beside gossip (relayed.py)
    "direct_received",           # messages a directly connected peer brought on a stream
    "direct_given_up",           # our messages a direct peer never acknowledged after SEND_TRIES tries
    "direct_too_big",            # our messages over MAX_RELAYED_BYTES with only direct peers: gossip alone carries them
    "dropped_copies",            # messages already delivered on the other path (gossip / stream: dedup.py)
)


MAX_USEFUL_TRACKED = 256  # peers whose last useful time is kept
VALUED_WINDOW_S = 600.0  # a peer useful within this long is kept connected (up to conn_low of them)

def topic_inbox(options: P2pdOptions) -> FairBuffer[Received]:
    """A topic's fair inbox, bounded by messages and by bytes (protocol/inbox.py)."""
    return FairBuffer(options.inbox_size, max_bytes=options.inbox_max_bytes, size=lambda item: len(item.data))


class Shared:
    """The fields below are read and written under `lock` (the events need no lock). `generation`
    counts daemon runs: a reader or connection made for one run stops when it is no longer current."""

    def __init__(self, peer_id: str, options: P2pdOptions) -> None:
        self.peer_id, self.options = peer_id, options
        self.lock = threading.Lock()
        self.wake_writer = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.wake_guard = threading.Event()
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        self.flood_guard = FloodGuard(options.flood_cut_rate, options.flood_cut_burst, options.flood_cut_s)
        self.inbox: dict[str, FairBuffer[Received]] = {t: topic_inbox(options) for t in options.topics}
        self.outbound: collections.deque[tuple[str, bytes, float]] = collections.deque()
        self.state = STATE_STARTING
        self.daemon: DaemonProcess | None = None
        self.generation = 0  # +1 per daemon run; readers and the writer follow it
        self.listen_addrs: list[str] = []  # ours as the daemon announces them (relayed ones once it has a relay)
        self.reach = Reach()  # what AutoNAT and the relays made of us (nat.py), refreshed by upkeep.py
        self.metrics_port: int | None = None  # the daemon's loopback metrics port, once found
        self.connected: list[str] = []
        self.relayed_peers: set[str] = set()  # connected through a relay only: no gossip with them (relayed.py)
        self.peer_groups: dict[str, str] = {}  # peer id -> network group (protocol/netgroups.py), from the census
        self.topic_peers: dict[str, int] = {}
        self.dht_peers = 0
        self.subscriptions: dict[str, ControlConnection] = {}
        self.threads: list[threading.Thread] = []
        self.useful_at: dict[str, float] = {}  # peer id -> monotonic time the node last used its groups
        self.dedup = CrossPathDedup()  # a message gossip and a stream both bring is delivered once

    def spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"{name}-{self.peer_id[-6:]}", daemon=True)
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def socket_for(self, generation: int) -> Path | None:
        """The control socket of daemon run `generation`, or None once it is no longer the running one."""
        with self.lock:
            if self.generation != generation or self.state != STATE_RUNNING or self.daemon is None:
                return None
            return self.daemon.socket_path

    def note_useful(self, peer_ids: list[str], now: float) -> None:
        with self.lock:
            for pid in peer_ids:
                self.useful_at.pop(pid, None)  # re-inserted: the most recently useful last
                self.useful_at[pid] = now
            while len(self.useful_at) > MAX_USEFUL_TRACKED:
                self.useful_at.pop(next(iter(self.useful_at)))

    def valued_peers(self, now: float) -> set[str]:
        """The peers kept connected whatever the bounds (upkeep.py): the `conn_low` most recently
        useful ones, used within `VALUED_WINDOW_S`. A flood of connecting hosts pushed a node over
        `conn_high`, the trimming closed its honest peer's connection, and a node at `conn_low` or
        more dials nobody: both nodes went 15-20 s without each other's groups, twice in 2 minutes."""
        with self.lock:
            return set(self._recently_useful(now)[-self.options.conn_low:])

    def _recently_useful(self, now: float) -> list[str]:
        """Peers used within VALUED_WINDOW_S, least recently used first (called under the lock)."""
        return [pid for pid, at in self.useful_at.items() if now - at <= VALUED_WINDOW_S]

    def topics(self) -> list[str]:
        with self.lock:
            return list(self.inbox)

    def direct_targets(self, now: float) -> set[str]:
        """The peers our own messages also go to on a stream (relayed.py): the `direct_peers` most
        recently useful peers (the node trains on their groups, so they likely train on ours) that
        are connected directly; relayed-only peers get every message on a stream anyway."""
        n = self.options.direct_peers
        if n <= 0:
            return set()
        with self.lock:
            connected = set(self.connected) - self.relayed_peers
            return set([pid for pid in self._recently_useful(now) if pid in connected][-n:])

    def take_in(self, sender: str, topic: str, data: bytes, path: str = GOSSIP) -> str:
        """A peer's message into `topic`'s inbox, as gossip (reader.py) and streams (relayed.py) both
        deliver: a copy the other path brought already is dropped (dedup.py), then the flood cut under
        `sender`, then the topic, then the fair inbox. TAKEN_IN, TAKEN_COPY, TAKEN_UNSUBSCRIBED, or
        TAKEN_CUT (the sender is cut for flooding)."""
        item = Received(from_peer=sender, data=data, received_at=time.time())
        key = digest(sender, topic, data)  # outside the lock: hashing a 1 MiB message takes a while
        with self.lock:
            if self.dedup.is_copy(key, path):
                self.stats["dropped_copies"] += 1
                return TAKEN_COPY
            if not self.flood_guard.arrival(sender, time.monotonic()):
                self.wake_guard.set()  # the guard thread disconnects it: the caller must keep reading
                return TAKEN_CUT
            box = self.inbox.get(topic)
            if box is None:
                self.stats[COUNTER_DROPPED_UNSUBSCRIBED] += 1
                return TAKEN_UNSUBSCRIBED
            self.stats[COUNTER_DROPPED_INBOUND_FULL] += len(box.put(sender, item))  # the heaviest sender's oldest
            self.stats[COUNTER_RECEIVED] += 1
            return TAKEN_IN
