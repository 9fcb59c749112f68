"""Cutting flooding origins off at the daemon, before its fixed queues drop honest messages.

go-libp2p-pubsub 0.10 inside p2pd drops whatever arrives while one of its 32-slot queues is full
(signature validation, each peer's outbound RPCs, our subscription), honest and flooding alike;
the daemon exposes neither queue sizes, validators nor peer scoring. Measured
(scripts/bench/gossip/flood.py): one origin flooding 3,000 msgs/s cost an honest peer 12-24% of its
messages on a 2-core machine, four fifths of them lost inside the daemons. What the daemon does
expose is DISCONNECT. So the transport counts each GossipSub origin's arrivals (the signed
`from`: a relay cannot frame anyone) and an origin sustaining more than `rate` messages/s beyond
a `burst` is CUT for `cut_s`: its messages are dropped on arrival and the daemon is told to
disconnect it, again whenever it is seen (connected or sending) while cut, and it is not dialed.
Every node running this cuts the flooder from its own side, so the flood stops at its source
instead of filling every relay's queues.

An honest node publishes at most 10 messages/s (burst 100, protocol/outbox.py); the defaults
(80/s: the Ingress's flooding line, 4x its accepted 20/s; burst 200: twice the Outbox's) leave
it a wide margin, and cut a 3,000 msgs/s flooder within ~0.1 s. Not covered: a flood spread over
many keys each below the line (the Ingress's per-origin limits and scores still apply to them).

    guard = FloodGuard(rate=80, burst=200, cut_s=300)   # rate=0: off
    guard.arrival(origin, now)    # False: drop it (origin is cut)
    guard.seen_connected(peers, now)  # cut origins among the daemon's connected peers
    guard.take_disconnects(now)   # cut origins to DISCONNECT now (each at most every `redisconnect_s`)
    guard.is_cut(origin, now)

Not thread-safe: the transport holds its lock around it. Memory: at most `max_origins` buckets
and cut entries (least recently seen evicted first; an evicted origin starts with a full burst).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

from ...ratelimit import TokenBucket
from .addrs import peer_id_bytes
from .control import ControlConnection, ControlError, disconnect_request

log = logging.getLogger(__name__)


class FloodGuard:
    def __init__(self, rate: float = 80.0, burst: float = 200.0, cut_s: float = 300.0,
                 redisconnect_s: float = 0.1, max_origins: int = 10_000) -> None:
        if rate < 0 or burst < 1 or cut_s <= 0:
            raise ValueError(f"FloodGuard needs rate >= 0 (0: off), burst >= 1 and cut_s > 0 "
                             f"(got {rate}, {burst}, {cut_s})")
        self.rate, self.burst, self.cut_s = rate, burst, cut_s
        self.redisconnect_s, self.max_origins = redisconnect_s, max_origins
        self.cuts = 0                     # origins cut (an origin cut again after its cut ended counts again)
        self.dropped = 0                  # messages dropped because their origin was cut
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._cut_until: OrderedDict[str, float] = OrderedDict()
        self._seen_while_cut: set[str] = set()    # cut origins seen since their last DISCONNECT
        self._disconnected_at: dict[str, float] = {}

    def arrival(self, origin: str, now: float) -> bool:
        """Charges one message from `origin`; False when it must be dropped (the origin is cut)."""
        if not self.rate:
            return True  # off
        if self.is_cut(origin, now):
            self.dropped += 1
            self._seen_while_cut.add(origin)
            return False
        bucket = self._buckets.get(origin)
        if bucket is None:
            bucket = self._buckets[origin] = TokenBucket(self.rate, self.burst, now)
            if len(self._buckets) > self.max_origins:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(origin)
        bucket.refill(now)
        if bucket.take():
            return True
        self._cut(origin, now)
        self.dropped += 1
        return False

    def is_cut(self, origin: str, now: float) -> bool:
        until = self._cut_until.get(origin)
        if until is None:
            return False
        if now < until:
            return True
        self._forget_cut(origin)  # served its time: a fresh start
        return False

    def cut_origins(self, now: float) -> list[str]:
        return [origin for origin in list(self._cut_until) if self.is_cut(origin, now)]

    def seen_connected(self, origins: list[str], now: float) -> None:
        """Cut origins found connected (by a peer listing) are disconnected again."""
        for origin in origins:
            if self.is_cut(origin, now):
                self._seen_while_cut.add(origin)

    def take_disconnects(self, now: float) -> list[str]:
        """Cut origins seen since their last DISCONNECT, each at most every `redisconnect_s` (a
        flooder that redials gets no more than that window before it is cut off again)."""
        due = [origin for origin in list(self._seen_while_cut) if self.is_cut(origin, now)  # may forget some
               and now - self._disconnected_at.get(origin, -float("inf")) >= self.redisconnect_s]
        for origin in due:
            self._seen_while_cut.discard(origin)
            self._disconnected_at[origin] = now
        self._seen_while_cut.intersection_update(self._cut_until)
        return due

    def _cut(self, origin: str, now: float) -> None:
        log.warning("cutting %s off for %.0f s: it sends over %g messages/s (beyond a burst of %g)",
                    origin, self.cut_s, self.rate, self.burst)
        self.cuts += 1
        self._buckets.pop(origin, None)
        self._cut_until[origin] = now + self.cut_s
        self._cut_until.move_to_end(origin)
        self._seen_while_cut.add(origin)
        if len(self._cut_until) > self.max_origins:
            self._forget_cut(next(iter(self._cut_until)))

    def _forget_cut(self, origin: str) -> None:
        del self._cut_until[origin]
        self._seen_while_cut.discard(origin)
        self._disconnected_at.pop(origin, None)


def disconnect_origins(socket_path: Path, origins: list[str], timeout_s: float) -> int:
    """DISCONNECTs each origin through the daemon's control socket; how many it carried out."""
    done = 0
    try:
        with ControlConnection(socket_path, timeout_s) as conn:
            for origin in origins:
                conn.request(disconnect_request(peer_id_bytes(origin)))
                done += 1
    except ControlError as err:  # restarting, or not connected: a cut origin seen again is due again
        log.debug("disconnecting a flooding origin failed: %s", err)
    return done
