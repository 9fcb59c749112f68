"""The p2pd transport's writer: the one thread that hands queued messages to the daemon, paced, each
once its topic has a settled subscriber (or after waiting `publish_wait_s` for one)."""
from __future__ import annotations

import logging
import time

from ..base import COUNTER_PUBLISHED
from ...ratelimit import Pacer
from .control import ControlConnection, ControlError, publish_request, topic_peers_request
from .shared import STATE_CLOSED, Shared

log = logging.getLogger(__name__)

# go-libp2p-pubsub 0.10 in the daemon queues at most 32 RPCs per peer and drops the rest ("queue
# full"), and delivers to a subscription through a 32-message buffer that drops when the daemon's
# pipe to us falls behind ("subscriber too slow"; seen on this loaded 2-core machine with 200
# publishes paced at 1000/s). Measured on loopback: 300 back-to-back publishes lost 4-233; the
# same paced 2 ms apart lost none. The writer paces itself (publish_rate); a burst can still lose
# a few messages when the machine starves the daemon, and nothing tells us (the daemon only logs).
PUBLISH_BURST = 16


class Writer:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._conn: ControlConnection | None = None
        self._conn_generation = -1
        self._peers_checked: dict[str, tuple[float, int]] = {}  # topic -> (when, subscribed peers)
        self._peers_since: dict[str, float] = {}  # topic -> since when it has had subscribed peers

    def run(self) -> None:
        """The thread's target: publishes the queue's head until the transport closes. A message
        leaves the queue only once the daemon took it (a restart keeps it queued)."""
        s = self.shared
        pacer = Pacer(s.options.publish_rate, burst=PUBLISH_BURST)
        held = -1.0  # the queued_at of the last message counted as held
        while (head := self._next()) is not None:
            topic, data, queued_at, generation = head
            try:
                conn = self._connection(generation)
                if conn is None:  # restarting: keep the queue, try again shortly
                    s.stop.wait(0.1)
                    continue
                n_peers = self._subscribed_peers(conn, topic)
                if not self._may_send(topic, n_peers, queued_at):
                    if held != queued_at:
                        held = queued_at
                        s.bump("held_for_subscribers")
                    s.stop.wait(0.02)  # GossipSub would lose it: no peer's subscription has settled yet
                    continue
                pacer.wait(s.stop)
                conn.request(publish_request(topic, data))
            except ControlError as err:
                s.bump("publish_errors")
                log.warning("publish on %s failed (%s); retrying after the daemon recovers", topic, err)
                self._close_connection()
                s.stop.wait(0.2)
                continue
            self._sent(queued_at, n_peers)
        self._close_connection()

    def _next(self) -> tuple[str, bytes, float, int] | None:
        """The queue's head and the current daemon run, once there is one; None once closed."""
        s = self.shared
        with s.lock:
            while not s.outbound and s.state != STATE_CLOSED:
                s.wake_writer.wait()
            if s.state == STATE_CLOSED:
                return None
            topic, data, queued_at = s.outbound[0]
            return topic, data, queued_at, s.generation

    def _connection(self, generation: int) -> ControlConnection | None:
        """A control connection to daemon run `generation` (None while it is not the running one)."""
        if self._conn is not None and self._conn_generation == generation:
            return self._conn
        self._close_connection()
        socket_path = self.shared.socket_for(generation)
        if socket_path is None:
            return None
        self._conn = ControlConnection(socket_path, self.shared.options.control_timeout_s)
        self._conn_generation = generation
        return self._conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _subscribed_peers(self, conn: ControlConnection, topic: str) -> int:
        """How many peers subscribe to `topic`: re-asked often while nobody is subscribed, now and
        then once somebody is (a peer that left or restarted is noticed, and messages wait for it again)."""
        checked_at, n_peers = self._peers_checked.get(topic, (0.0, 0))
        if time.monotonic() - checked_at <= (0.05 if n_peers == 0 else 0.5):
            return n_peers
        n_peers = len(conn.request(topic_peers_request(topic)).pubsub.peerIDs)
        self._peers_checked[topic] = (time.monotonic(), n_peers)
        if n_peers == 0:
            self._peers_since.pop(topic, None)
        else:
            self._peers_since.setdefault(topic, time.monotonic())
        with self.shared.lock:
            self.shared.topic_peers[topic] = n_peers
        return n_peers

    def _may_send(self, topic: str, n_peers: int, queued_at: float) -> bool:
        """Once a subscriber has been there `settle_s`, or the message waited `publish_wait_s` (a lone
        node still publishes)."""
        options, now = self.shared.options, time.monotonic()
        settled = n_peers > 0 and now - self._peers_since.get(topic, now) >= options.settle_s
        with self.shared.lock:  # peers behind a relay got it already (relayed.py): holding it would only
            relayed = bool(self.shared.relayed_peers)  # delay the messages queued behind it
        return settled or (relayed and n_peers == 0) or now - queued_at >= options.publish_wait_s

    def _sent(self, queued_at: float, n_peers: int) -> None:
        s = self.shared
        with s.lock:
            if s.outbound and s.outbound[0][2] == queued_at:
                s.outbound.popleft()
            s.stats[COUNTER_PUBLISHED] += 1
            if n_peers == 0:
                s.stats["published_without_peers"] += 1
