"""The p2pd transport's readers: one thread per subscribed topic and daemon run, delivering into
the topic's FairBuffer inbox (fair: the heaviest sender loses its oldest, protocol/inbox.py)."""
from __future__ import annotations

import logging
import threading

from .addrs import peer_id_text
from .control import ControlConnection, ControlError, subscribe_request
from .shared import STATE_CLOSED, Shared
from proto import p2pd_control_pb2 as pb

log = logging.getLogger(__name__)


class TopicReaders:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def spawn(self, topic: str, generation: int, subscribed: threading.Event | None = None) -> None:
        """Reads `topic` on a thread of its own for daemon run `generation`; `subscribed` is set once
        the daemon took the subscription (or the reader gave up)."""
        self.shared.spawn(lambda: self.read(topic, generation, subscribed), "p2pd-reader")

    def read(self, topic: str, generation: int, subscribed: threading.Event | None = None) -> None:
        """Subscribes and reads `topic` for as long as daemon run `generation` is the current one
        (re-subscribing if the daemon drops the subscription while it stays healthy)."""
        s = self.shared
        key = f"{generation}:{topic}"
        while not s.stop.is_set():
            socket_path = s.socket_for(generation)
            if socket_path is None:
                break
            try:
                conn = ControlConnection(socket_path, s.options.control_timeout_s)
                conn.request(subscribe_request(topic))
            except ControlError as err:
                log.warning("subscribing to %s failed (%s); retrying", topic, err)
                s.stop.wait(0.5)
                continue
            conn.sock.settimeout(None)  # a quiet topic is normal; close() or a daemon exit ends the read
            with s.lock:
                if s.generation != generation or s.state == STATE_CLOSED:
                    conn.close()
                    break
                s.subscriptions[key] = conn
            if subscribed is not None:
                subscribed.set()
            try:
                while True:
                    self.deliver(topic, conn.read(pb.PSMessage))
            except ControlError as err:
                if not s.stop.is_set() and s.socket_for(generation) is not None:
                    log.warning("subscription to %s ended (%s); subscribing again", topic, err)
                    s.stop.wait(0.2)
            finally:
                conn.close()
                with s.lock:
                    s.subscriptions.pop(key, None)
        if subscribed is not None:
            subscribed.set()

    def deliver(self, topic: str, message: pb.PSMessage) -> None:
        s = self.shared
        sender = peer_id_text(getattr(message, "from"))
        if sender == s.peer_id:
            return  # the daemon echoes our own publishes
        data = message.data
        if len(data) > s.options.max_msg_bytes:
            s.bump("dropped_inbound_oversize")
            return
        s.take_in(sender, topic, data)
