"""The trio side of the py-libp2p transport: one libp2p host (TCP + Noise + Yamux/Mplex, GossipSub)
in its own trio event loop, run on the facade's background thread (facade.py).

It shares with the facade only a `Shared` (bounded queues and counters behind one lock) and a few
trio events that the facade sets through `trio.lowlevel.TrioToken.run_sync_soon`; nothing here ever
runs on the caller's thread. Every py-libp2p 0.8.1 workaround comes from patches.py: this module
builds the host from them, paces its outbound pump under GossipSub's per-topic rate limit and the
per-peer queues, and keeps bootstrap peers connected.
"""
from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio

from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as _new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub as _gossipsub
from libp2p.security.noise.transport import (
    PROTOCOL_ID as NOISE_PROTOCOL_ID,
    Transport as NoiseTransport,
)
from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID, Yamux
from libp2p.tools.anyio_service import background_trio_service

from ...inbox import FairBuffer
from ..base import (
    COUNTER_DROPPED_INBOUND_FULL,
    COUNTER_DROPPED_UNSUBSCRIBED,
    COUNTER_PUBLISHED,
    COUNTER_RECEIVED,
    Received,
)
from ..options import Libp2pOptions
from .patches import (
    PatchedPubsub,
    SelectiveIdontwantGossipSub,
    connection_state,
    disable_swarm_dial_retries,
    is_shutdown_noise,
    lift_dial_block,
    listen_failures,
    memoize_host_addrs,
    short_error,
    trim_equivocation_cache,
)

log = logging.getLogger(__name__)

# Room for what libp2p adds around our bytes in one RPC: from/seqno/topic, the 32-byte key and
# 64-byte signature, and the signed peer record (senderRecord) attached to every RPC.
_RPC_OVERHEAD = 64 * 1024
_GOSSIPSUB_PROTOCOLS = [
    _gossipsub.PROTOCOL_ID_V12,
    _gossipsub.PROTOCOL_ID_V11,
    _gossipsub.PROTOCOL_ID,
]


@dataclass
class Shared:
    """What both threads touch, always under `lock`: the outbound queue, the per-topic inboxes, the
    topics to join and the counters."""

    options: Libp2pOptions
    stat_keys: tuple[str, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)
    outbound: collections.deque[tuple[str, bytes]] = field(default_factory=collections.deque)
    outbound_bytes: int = 0
    inbox: dict[str, FairBuffer[Received]] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        self.stats = dict.fromkeys(self.stat_keys, 0)
        for topic in dict.fromkeys(self.options.topics):
            self.add_topic(topic)

    def add_topic(self, topic: str) -> bool:
        """Collect `topic` from now on (caller holds the lock, or no other thread runs yet); False if
        it already was."""
        if topic in self.inbox:
            return False
        o = self.options
        self.inbox[topic] = FairBuffer(o.inbox_size, max_bytes=o.inbox_max_bytes, size=lambda m: len(m.data))
        self.topics.append(topic)
        return True

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] += n


class Libp2pHost:
    """The host's life on the trio thread: `run()` is the thread's target; the `set_*`,
    `request_stop` and `hard_cancel` callbacks run on the trio thread (via the trio token)."""

    def __init__(self, shared: Shared, key_pair: KeyPair, peer_id: str, bootstrap: list[tuple[str, Any]],
                 eclipse_protection: bool) -> None:
        self.shared, self.options = shared, shared.options
        self._key_pair, self.peer_id, self._bootstrap = key_pair, peer_id, bootstrap
        self._eclipse_protection = eclipse_protection
        self._listen_maddrs = [multiaddr.Multiaddr(a) for a in self.options.listen]
        self.ready = threading.Event()
        self.start_error: BaseException | None = None
        self.trio_token: trio.lowlevel.TrioToken | None = None
        self.host: Any = None
        self.router: Any = None  # the GossipSub router while serving (the facade's mesh_peers reads it)
        self.listen_addrs: list[str] = []
        self._stop_event: trio.Event | None = None
        self._root_scope: trio.CancelScope | None = None
        self._wake_event: trio.Event | None = None
        self._sub_event: trio.Event | None = None

    # ------------------------------------------------------------------ callbacks (trio thread)

    def set_wake(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    def set_sub_wake(self) -> None:
        if self._sub_event is not None:
            self._sub_event.set()

    def request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    def hard_cancel(self) -> None:
        if self._root_scope is not None:
            self._root_scope.cancel()

    # ------------------------------------------------------------------ the thread

    def run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - the thread must never die noisily
            if not self.ready.is_set():
                self.start_error = e
            elif is_shutdown_noise(e):
                log.debug("libp2p shutdown noise ignored: %r", e)
            else:
                log.exception("libp2p thread crashed")
        finally:
            self.trio_token = None
            self.host = None
            self.router = None
            with self.shared.lock:
                self.shared.closed = True
            self.ready.set()

    def _on_message(self, topic: str, msg: Any) -> None:  # from PatchedPubsub's notify_subscriptions
        data = msg.data
        if len(data) > self.options.max_msg_bytes:
            self.shared.bump("dropped_inbound_oversize")
            return
        # from_id is the origin, authenticated by libp2p's own message signature (strict
        # signing), not the neighbour that forwarded it.
        sender = ID(msg.from_id).to_base58()
        item = Received(from_peer=sender, data=bytes(data), received_at=time.time())
        shared = self.shared
        with shared.lock:
            box = shared.inbox.get(topic)
            if box is None:
                shared.stats[COUNTER_DROPPED_UNSUBSCRIBED] += 1
                return
            shared.stats[COUNTER_DROPPED_INBOUND_FULL] += len(box.put(sender, item))
            shared.stats[COUNTER_RECEIVED] += 1

    def _build(self) -> tuple[Any, Any, Any]:
        """The libp2p host, its GossipSub router and the pubsub on top (nothing runs yet)."""
        o = self.options
        noise_key = _new_x25519_key_pair().private_key
        host = new_host(
            key_pair=self._key_pair,
            listen_addrs=self._listen_maddrs,
            sec_opt={NOISE_PROTOCOL_ID: NoiseTransport(self._key_pair, noise_privkey=noise_key)},
            muxer_opt={
                TProtocol(YAMUX_PROTOCOL_ID): Yamux,
                TProtocol(MPLEX_PROTOCOL_ID): Mplex,
            },
        )
        disable_swarm_dial_retries(host)  # our reconnect loop owns retries and backoff
        memoize_host_addrs(host)
        router = SelectiveIdontwantGossipSub(
            protocols=_GOSSIPSUB_PROTOCOLS,
            idontwant_min_bytes=o.idontwant_min_bytes,
            degree=o.degree,
            degree_low=o.degree_low,
            degree_high=o.degree_high,
            heartbeat_initial_delay=0.1,
            heartbeat_interval=o.heartbeat_interval,  # type: ignore[arg-type]
            adaptive_gossip_enabled=False,
            spam_protection_enabled=True,
            max_messages_per_topic_per_second=o.max_messages_per_topic_per_second,
            eclipse_protection_enabled=self._eclipse_protection,
            min_mesh_diversity_ips=3 if self._eclipse_protection else 1,
        )
        limit = o.max_msg_bytes + _RPC_OVERHEAD
        pubsub = PatchedPubsub(
            host,
            router,
            strict_signing=True,
            max_inbound_rpc_size=limit,
            on_message=self._on_message,
            peer_queue_limits=(limit, o.peer_queue_rpcs),
            on_bad_stream=lambda: self.shared.bump("bad_streams"),
        )
        return host, router, pubsub

    async def _main(self) -> None:
        self.trio_token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        self._wake_event = trio.Event()
        host, router, pubsub = self._build()
        with trio.CancelScope() as root:
            self._root_scope = root
            async with host.run(listen_addrs=self._listen_maddrs):
                try:
                    failed = listen_failures(host, self._listen_maddrs)
                    if failed:
                        raise OSError(f"could not listen on {', '.join(failed)} (address in "
                                      "use or not available; see the libp2p log line above)")
                    self.host, self.router = host, router
                    async with background_trio_service(pubsub):
                        async with background_trio_service(router):
                            await self._serve(host, router, pubsub)
                        log.debug("gossipsub stopped")
                    log.debug("pubsub stopped")
                finally:
                    await self._close_host(host)

    async def _serve(self, host: Any, router: Any, pubsub: Any) -> None:
        """Join the topics, say we are ready, then run our own tasks until asked to stop."""
        await pubsub.wait_until_ready()
        with self.shared.lock:
            topics = list(self.shared.topics)
        for topic in topics:
            await pubsub.subscribe(topic)
        self.listen_addrs = self._resolve_listen_addrs(host)
        log.info("libp2p %s listening on %s", self.peer_id, ", ".join(self.listen_addrs))
        self.ready.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, pubsub)
            nursery.start_soon(self._subscriber, pubsub)
            nursery.start_soon(self._maintenance, router)
            for addr, info in self._bootstrap:
                nursery.start_soon(self._keep_connected, host, addr, info)
            await self._stop_event.wait()
            log.debug("stop requested")
            nursery.cancel_scope.cancel()
        log.debug("own tasks done")

    async def _close_host(self, host: Any) -> None:
        # Close connections and listeners explicitly so the port is released and peers see the
        # disconnect at once; bounded and shielded from cancellation.
        with trio.move_on_after(max(1.0, self.options.close_timeout * 0.5)) as cs:
            cs.shield = True
            try:
                log.debug("closing host")
                await host.close()
                log.debug("host closed")
            except Exception as e:  # noqa: BLE001
                log.debug("error while closing libp2p host: %r", e)

    def _resolve_listen_addrs(self, host: Any) -> list[str]:
        out: list[str] = []
        p2p = f"/p2p/{self.peer_id}"
        for addr in host.get_transport_addrs():
            candidates = [addr]
            s = str(addr)
            if s.startswith("/ip4/0.0.0.0/") or s.startswith("/ip6/::/"):
                try:
                    from libp2p.utils.address_validation import expand_wildcard_address

                    candidates = expand_wildcard_address(addr) or [addr]
                except Exception:  # noqa: BLE001
                    candidates = [addr]
            if s.startswith("/ip4/0.0.0.0/"):  # a local peer can always use loopback
                candidates = [*candidates, multiaddr.Multiaddr(s.replace("/ip4/0.0.0.0/",
                                                                         "/ip4/127.0.0.1/", 1))]
            for c in candidates:
                full = str(c) if "/p2p/" in str(c) else str(c) + p2p
                if full not in out:
                    out.append(full)
        return out

    def _next_outbound(self) -> tuple[str, bytes] | None:
        """Pop the next queued publish; None (with a fresh wake event armed) when there is none."""
        shared = self.shared
        with shared.lock:
            item = shared.outbound.popleft() if shared.outbound else None
            if item is None:
                self._wake_event = trio.Event()
            else:
                shared.outbound_bytes -= len(item[1])
        return item

    async def _pump(self, pubsub: Any) -> None:
        """Move queued publishes into GossipSub, pacing under its rate limit and peer queues."""
        window: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        per_second = max(1, int(math.floor(self.options.max_messages_per_topic_per_second)) - 1)
        room = PeerQueueRoom(pubsub, high_water=max(1, self.options.peer_queue_rpcs - 8))
        while True:
            item = self._next_outbound()
            if item is None:
                await self._wake_event.wait()
                continue
            topic, data = item
            # Local rate window: GossipSub would silently drop our own message above the limit.
            stamps = window[topic]
            now = time.time()
            while stamps and stamps[0] <= now - 1.0:
                stamps.popleft()
            if len(stamps) >= per_second:
                await trio.sleep(max(0.0, stamps[0] + 1.0 - now) + 0.001)
            await room.wait()
            try:
                await pubsub.publish(topic, data)
                stamps.append(time.time())
                self.shared.bump(COUNTER_PUBLISHED)
            except Exception as e:  # noqa: BLE001
                self.shared.bump("dropped_outbound_error")
                log.warning("libp2p publish on %s failed: %r", topic, e)
            await trio.sleep(0)

    async def _subscriber(self, pubsub: Any) -> None:
        """Join topics added by ``subscribe()`` after start."""
        while True:
            self._sub_event = trio.Event()
            with self.shared.lock:
                topics = list(self.shared.topics)
            for topic in topics:
                if topic not in pubsub.topic_ids:
                    await pubsub.subscribe(topic)
            await self._sub_event.wait()

    async def _maintenance(self, router: Any) -> None:
        while True:
            await trio.sleep(0.5)
            try:
                trim_equivocation_cache(router)
            except Exception:  # noqa: BLE001 - best effort; the router may be shutting down
                pass

    async def _keep_connected(self, host: Any, addr: str, info: Any) -> None:
        """Keep one bootstrap peer connected: dial, and re-dial with backoff forever."""
        network, o = host.get_network(), self.options
        delay, attempts, warned = o.backoff_initial, 0, False
        closing_since: float | None = None
        while True:
            state = connection_state(network, info.peer_id)
            if state == "live":
                closing_since, delay = None, o.backoff_initial
                await trio.sleep(0.25)
                continue
            if state == "closing":  # wait (bounded) for the swarm to finish tearing it down
                now = time.monotonic()
                closing_since = closing_since or now
                if now - closing_since < 5.0:
                    await trio.sleep(0.05)
                    continue
                await _force_close(network, info.peer_id, addr)
            closing_since = None
            attempts += 1
            self.shared.bump("dial_attempts")
            if attempts > 1:
                self.shared.bump("reconnects")
            reason = await self._dial(host, network, addr, info)
            if reason is None:
                warned, delay = False, o.backoff_initial
                await trio.sleep(0.05)
                continue
            self.shared.bump("dial_failures")
            log.log(logging.DEBUG if warned else logging.WARNING,
                    "dial %s failed (%s); retrying in %.1f s", addr, reason, delay)
            warned = True
            await trio.sleep(delay * random.uniform(0.75, 1.25))
            delay = min(delay * 2.0, o.backoff_max)

    async def _dial(self, host: Any, network: Any, addr: str, info: Any) -> str | None:
        """One dial attempt: None when connected, else why it failed (never raises)."""
        try:
            lift_dial_block(network, info.peer_id)
            with trio.fail_after(self.options.dial_timeout):
                await host.connect(info)
        except trio.TooSlowError:
            return f"timed out after {self.options.dial_timeout:.1f} s"
        except Exception as e:  # noqa: BLE001 - dial failures are expected; never crash
            return short_error(e)
        self.shared.bump("connects")
        log.info("libp2p %s connected to bootstrap peer %s", self.peer_id, addr)
        return None


class PeerQueueRoom:
    """Back-pressure on py-libp2p's per-peer RpcQueues: a full one drops silently, so the pump waits
    (bounded) for room. A peer that stays full for a whole second is left to drop until it recovers
    (below half the high-water mark), so one slow peer cannot throttle what everybody else gets."""

    def __init__(self, pubsub: Any, high_water: int) -> None:
        self._pubsub, self._high_water = pubsub, high_water
        self._stuck: set[Any] = set()  # peers whose queue stayed full: not waited for again

    def full_peers(self) -> list[Any]:
        out = []
        for pid, q in list(self._pubsub.peer_queues.items()):
            n = len(q)
            if pid in self._stuck:
                if n < self._high_water // 2:
                    self._stuck.discard(pid)
            elif n >= self._high_water:
                out.append(pid)
        return out

    async def wait(self) -> None:
        if not self.full_peers():
            return
        with trio.move_on_after(1.0) as cs:
            while self.full_peers():
                await trio.sleep(0.002)
        if cs.cancelled_caught:
            slow = self.full_peers()
            self._stuck.update(slow)
            log.warning("peer(s) %s not keeping up; not waiting for them", ", ".join(str(p) for p in slow))


async def _force_close(network: Any, peer_id: Any, addr: str) -> None:
    """Close a connection stuck half torn down (bounded), so the peer can be dialed again."""
    with trio.move_on_after(2.0):
        try:
            await network.close_peer(peer_id)
        except Exception as e:  # noqa: BLE001
            log.debug("close_peer(%s) failed: %r", addr, e)
