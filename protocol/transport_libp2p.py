"""libp2p GossipSub transport (py-libp2p 0.8.1) for real networks.

The training loop is plain synchronous code; py-libp2p is trio-based. This module runs one
libp2p host in its **own trio event loop on a background daemon thread** and talks to callers
only through thread-safe, bounded queues:

* ``publish(topic, data)`` appends to a bounded outbound deque and returns at once (a full
  queue or an oversized message is dropped and counted, never raised, never blocking).
* ``drain(topic)`` pops whatever arrived on that topic (a bounded per-topic inbox, fair between
  senders: when full, the heaviest sender loses its oldest; protocol/inbox.py).
* Bootstrap peers are dialed with a timeout and re-dialed forever with exponential backoff and
  jitter whenever they are not connected; failures are logged and counted, never raised.

Bytes only: signing/validation of our own envelopes lives elsewhere in ``protocol/``. libp2p's
own pubsub signing is on (``strict_signing``), so ``Received.from_peer`` is the authenticated
origin peer id of the message, which equals the signer identity because the host key is built
from the same 32-byte Ed25519 seed.

Every workaround of a py-libp2p 0.8.1 behaviour (dropped messages, crashes on bad input, dial
caches, throughput) lives in ``protocol/libp2p_patches.py``, one patch per behaviour; this module
only builds the host from them, paces its outbound pump under GossipSub's per-topic rate limit and
the per-peer queues, and bridges threads.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time
from typing import Any

import multiaddr
import trio

from libp2p import new_host
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as _new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub import gossipsub as _gossipsub
from libp2p.security.noise.transport import (
    PROTOCOL_ID as NOISE_PROTOCOL_ID,
    Transport as NoiseTransport,
)
from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID, Yamux
from libp2p.tools.anyio_service import background_trio_service

from .inbox import FairBuffer
from .libp2p_patches import (
    PatchedPubsub,
    SelectiveIdontwantGossipSub,
    connection_state,
    disable_swarm_dial_retries,
    eclipse_protection_for,
    is_shutdown_noise,
    lift_dial_block,
    listen_failures,
    memoize_host_addrs,
    short_error,
    trim_equivocation_cache,
)
from .transport import (
    COUNTER_DROPPED_INBOUND_FULL,
    COUNTER_DROPPED_OUTBOUND_FULL,
    COUNTER_DROPPED_UNSUBSCRIBED,
    COUNTER_PUBLISHED,
    COUNTER_RECEIVED,
    Received,
)


log = logging.getLogger(__name__)

MiB = 1024 * 1024
# Room for what libp2p adds around our bytes in one RPC: from/seqno/topic, the 32-byte key and
# 64-byte signature, and the signed peer record (senderRecord) attached to every RPC.
_RPC_OVERHEAD = 64 * 1024
_GOSSIPSUB_PROTOCOLS = [
    _gossipsub.PROTOCOL_ID_V12,
    _gossipsub.PROTOCOL_ID_V11,
    _gossipsub.PROTOCOL_ID,
]
# Counters kept by the transport; stats() adds the totals "dropped_outbound" (every outbound
# drop) and "dropped_inbound" (every inbound drop).
STAT_KEYS = (
    COUNTER_PUBLISHED,  # handed to GossipSub
    COUNTER_DROPPED_OUTBOUND_FULL,  # publish() while the outbound queue was full
    "dropped_outbound_oversize",  # publish() of more than max_msg_bytes
    "dropped_outbound_closed",  # publish() after close()
    "dropped_outbound_error",  # GossipSub's publish raised
    COUNTER_RECEIVED,  # put in an inbox
    COUNTER_DROPPED_INBOUND_FULL,  # inbox entry evicted by a newer one (the heaviest sender's oldest)
    "dropped_inbound_oversize",  # a peer sent more than max_msg_bytes
    COUNTER_DROPPED_UNSUBSCRIBED,  # arrived for a topic we do not collect
    "dial_attempts",  # bootstrap dials started
    "dial_failures",  # ... that failed or timed out
    "connects",  # ... that succeeded
    "reconnects",  # bootstrap dials after the first one to that peer (retries, re-dials)
    "bad_streams",  # peer pubsub streams dropped for unparseable input
)


class TransportStartError(RuntimeError):
    """The libp2p host did not come up (listen failed or timed out)."""


def keypair_from_seed(seed: bytes) -> KeyPair:
    """libp2p Ed25519 key pair from the 32-byte raw private seed (same key as our signer)."""
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != 32:
        raise ValueError("seed must be the 32-byte raw Ed25519 private key")
    priv = Ed25519PrivateKey.from_bytes(bytes(seed))
    return KeyPair(priv, priv.get_public_key())


def peer_id_from_seed(seed: bytes) -> str:
    """The libp2p peer id (12D3KooW...) that a transport built from ``seed`` will have."""
    return ID.from_pubkey(keypair_from_seed(seed).public_key).to_base58()


class Libp2pTransport:
    """GossipSub over py-libp2p (TCP + Noise + Yamux/Mplex) on a background trio thread.

    :param seed: 32-byte raw Ed25519 private key; the peer id is derived from it.
    :param listen: multiaddrs to listen on (``/ip4/127.0.0.1/tcp/0`` picks a free port).
    :param bootstrap: ``/ip4/.../tcp/.../p2p/<peer-id>`` multiaddrs to dial and keep dialing.
    :param topics: topics subscribed at start (``drain`` serves these).
    :param max_msg_bytes: largest payload accepted by ``publish`` and from peers.
    :param inbox_size, inbox_max_bytes: per-topic inbox bounds (beyond them the sender holding the
        most messages, or bytes, loses its oldest).
    :param outbound_size, outbound_max_bytes: outbound queue bounds (``publish`` drops beyond).
    :param peer_queue_rpcs: py-libp2p's per-peer outbound RPC queue length (its default is 32).
    :param degree, degree_low, degree_high: GossipSub mesh degree D, D_lo, D_hi (go defaults:
        a swarm smaller than D_lo + 1 is a full mesh).
    :param heartbeat_interval: GossipSub heartbeat seconds (py-libp2p's default is 120).
    :param idontwant_min_bytes: send GossipSub IDONTWANT only for messages at least this big.
    :param max_messages_per_topic_per_second: GossipSub's per-forwarder, per-topic rate limit
        (py-libp2p's default, 10, silently drops the rest).
    :param eclipse_protection: GossipSub IP-diversity protection; ``None`` = off when a listen or
        bootstrap address is loopback (a local swarm: every peer shares 127.0.0.1), else on.
    :param dial_timeout: seconds per dial attempt.
    :param backoff_initial, backoff_max: reconnect backoff (doubling, with +-25% jitter).
    :param start_timeout: seconds ``start()`` waits for the host to listen.
    :param close_timeout: seconds ``close()`` waits for the thread.
    """

    def __init__(
        self,
        seed: bytes,
        listen: list[str] | None = None,
        bootstrap: list[str] | None = None,
        topics: list[str] | None = None,
        max_msg_bytes: int = 4 * MiB,
        *,
        inbox_size: int = 4096,
        outbound_size: int = 4096,
        inbox_max_bytes: int = 256 * MiB,
        outbound_max_bytes: int = 256 * MiB,
        peer_queue_rpcs: int = 64,
        degree: int = 6,
        degree_low: int = 4,
        degree_high: int = 12,
        heartbeat_interval: float = 1.0,
        idontwant_min_bytes: int = 16 * 1024,
        max_messages_per_topic_per_second: float = 1000.0,
        eclipse_protection: bool | None = None,
        dial_timeout: float = 10.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        start_timeout: float = 20.0,
        close_timeout: float = 10.0,
    ) -> None:
        self._key_pair = keypair_from_seed(seed)
        self._peer_id = ID.from_pubkey(self._key_pair.public_key)
        self._listen = list(listen) if listen else ["/ip4/127.0.0.1/tcp/0"]
        self._listen_maddrs = [multiaddr.Multiaddr(a) for a in self._listen]
        self._topics = list(dict.fromkeys(topics or []))
        if max_msg_bytes <= 0:
            raise ValueError("max_msg_bytes must be positive")
        self.max_msg_bytes = int(max_msg_bytes)
        self._bootstrap: list[tuple[str, Any]] = []
        for addr in bootstrap or []:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
            except Exception as e:
                raise ValueError(
                    f"bootstrap address {addr!r} is not a dialable multiaddr ending in "
                    f"/p2p/<peer-id>: {e}"
                ) from e
            if info.peer_id == self._peer_id:
                log.info("skipping bootstrap address %s: it is this node", addr)
                continue
            self._bootstrap.append((addr, info))

        self._inbox_size = int(inbox_size)
        self._outbound_size = int(outbound_size)
        self._inbox_max_bytes = int(inbox_max_bytes)
        self._outbound_max_bytes = int(outbound_max_bytes)
        self._outbound_bytes = 0
        self._peer_queue_rpcs = int(peer_queue_rpcs)
        self._degree = (int(degree), int(degree_low), int(degree_high))
        self._heartbeat_interval = heartbeat_interval
        self._idontwant_min_bytes = int(idontwant_min_bytes)
        self._rate_limit = float(max_messages_per_topic_per_second)
        if eclipse_protection is None:
            eclipse_protection = eclipse_protection_for([*self._listen, *(b for b, _ in self._bootstrap)])
        self._eclipse_protection = bool(eclipse_protection)
        self._dial_timeout = float(dial_timeout)
        self._backoff_initial = float(backoff_initial)
        self._backoff_max = float(backoff_max)
        self._start_timeout = float(start_timeout)
        self._close_timeout = float(close_timeout)

        self._lock = threading.Lock()
        self._outbound: collections.deque[tuple[str, bytes]] = collections.deque()
        self._inbox: dict[str, FairBuffer[Received]] = {t: self._new_inbox() for t in self._topics}
        self._stats = dict.fromkeys(STAT_KEYS, 0)

        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._closed = False
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._stop_event: trio.Event | None = None
        self._root_scope: trio.CancelScope | None = None
        self._wake_event: trio.Event | None = None
        self._sub_event: trio.Event | None = None
        self._host: Any = None
        self._pubsub: Any = None
        self._router: Any = None
        self._listen_addrs: list[str] = []

    # ------------------------------------------------------------------ public API (any thread)

    @property
    def peer_id(self) -> str:
        return self._peer_id.to_base58()

    @property
    def running(self) -> bool:
        """True while the libp2p thread is up and serving."""
        t = self._thread
        return bool(t is not None and t.is_alive() and self._ready.is_set() and not self._closed)

    def start(self) -> None:
        """Start the host thread; return once it listens (never waits for peers)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("transport is closed")
            if self._thread is not None:
                thread = self._thread
            else:
                thread = threading.Thread(
                    target=self._thread_main, name=f"libp2p-{self.peer_id[-8:]}", daemon=True
                )
                self._thread = thread
                thread.start()
        if not self._ready.wait(self._start_timeout):
            self.close()
            raise TransportStartError(
                f"libp2p host did not start listening on {self._listen} within "
                f"{self._start_timeout:.0f} s"
            )
        if self._start_error is not None:
            err = _first_leaf(self._start_error)
            self.close()
            raise TransportStartError(
                f"libp2p host failed to listen on {self._listen}: {short_error(err)}"
            ) from self._start_error

    def publish(self, topic: str, data: bytes) -> None:
        """Queue ``data`` for ``topic``; never blocks. Full queue / oversized / closed: dropped."""
        data = bytes(data)
        with self._lock:
            if self._closed:
                self._stats["dropped_outbound_closed"] += 1
                return
            if len(data) > self.max_msg_bytes:
                self._stats["dropped_outbound_oversize"] += 1
                log.warning("dropping %d-byte message on %s: over max_msg_bytes=%d",
                            len(data), topic, self.max_msg_bytes)
                return
            if (len(self._outbound) >= self._outbound_size
                    or self._outbound_bytes + len(data) > self._outbound_max_bytes):
                self._stats[COUNTER_DROPPED_OUTBOUND_FULL] += 1
                return
            was_empty = not self._outbound
            self._outbound.append((topic, data))
            self._outbound_bytes += len(data)
        if was_empty:
            self._wake_pump()

    def subscribe(self, topic: str) -> None:
        """Collect ``topic`` for ``drain`` from now on (before or after ``start``; idempotent)."""
        with self._lock:
            if topic in self._inbox:
                return
            self._inbox[topic] = self._new_inbox()
            self._topics.append(topic)
        self._call_soon(self._set_sub_wake)

    def _new_inbox(self) -> FairBuffer[Received]:
        return FairBuffer(self._inbox_size, max_bytes=self._inbox_max_bytes, size=lambda m: len(m.data))

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        """Pop what arrived on ``topic``: round-robin across senders, returned oldest first."""
        with self._lock:
            box = self._inbox.get(topic)
            return [] if box is None else box.take(None if max_items is None else int(max_items))

    def dropped_by_sender(self) -> dict[str, int]:
        """Messages each sender lost to a full inbox (all topics)."""
        with self._lock:
            total: collections.Counter[str] = collections.Counter()
            for box in self._inbox.values():
                total.update(box.dropped)
            return dict(total)

    def peers(self) -> list[str]:
        """Peer ids we currently hold a live connection to."""
        host = self._host
        if host is None or self._closed:
            return []
        for _ in range(3):
            try:
                conns = dict(host.get_network().connections)
                return sorted(
                    pid.to_base58() for pid, cs in conns.items()
                    if cs and any(not getattr(c, "is_closed", False) for c in cs)
                )
            except RuntimeError:  # dict mutated by the trio thread mid-copy; retry
                continue
        return []

    def listen_addrs(self) -> list[str]:
        """Dialable multiaddrs with the real port and ``/p2p/<peer-id>`` (after ``start``)."""
        return list(self._listen_addrs)

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._stats)
        out["dropped_outbound"] = sum(v for k, v in out.items() if k.startswith("dropped_outbound_"))
        out["dropped_inbound"] = (
            out[COUNTER_DROPPED_INBOUND_FULL] + out["dropped_inbound_oversize"]
            + out[COUNTER_DROPPED_UNSUBSCRIBED]
        )
        return out

    def close(self) -> None:
        """Stop the trio loop, close connections and listeners, join the thread. Idempotent."""
        with self._lock:
            already = self._closed
            self._closed = True
            thread = self._thread
        if thread is None or already and not thread.is_alive():
            return
        self._call_soon(self._request_stop)
        thread.join(self._close_timeout * 0.7)
        if thread.is_alive():  # graceful shutdown stuck: cancel everything
            self._call_soon(self._hard_cancel)
            thread.join(self._close_timeout * 0.3)
        if thread.is_alive():
            log.warning("libp2p thread did not exit within %.1f s (daemon; left behind)",
                        self._close_timeout)

    def __enter__(self) -> Libp2pTransport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Libp2pTransport({self.peer_id}, listen={self.listen_addrs() or self._listen})"

    # ------------------------------------------------------------------ cross-thread helpers

    def _call_soon(self, fn: Any) -> None:
        token = self._trio_token
        if token is None:
            return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    def _wake_pump(self) -> None:
        self._call_soon(self._set_wake)

    def _set_wake(self) -> None:  # trio thread
        if self._wake_event is not None:
            self._wake_event.set()

    def _set_sub_wake(self) -> None:  # trio thread
        if self._sub_event is not None:
            self._sub_event.set()

    def _request_stop(self) -> None:  # trio thread
        if self._stop_event is not None:
            self._stop_event.set()

    def _hard_cancel(self) -> None:  # trio thread
        if self._root_scope is not None:
            self._root_scope.cancel()

    def _bump(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    # ------------------------------------------------------------------ trio thread

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - the thread must never die noisily
            if not self._ready.is_set():
                self._start_error = e
            elif is_shutdown_noise(e):
                log.debug("libp2p shutdown noise ignored: %r", e)
            else:
                log.exception("libp2p thread crashed")
        finally:
            self._trio_token = None
            self._host = None
            with self._lock:
                self._closed = True
            self._ready.set()

    def _on_message(self, topic: str, msg: Any) -> None:  # trio thread, from notify_subscriptions
        data = msg.data
        if len(data) > self.max_msg_bytes:
            self._bump("dropped_inbound_oversize")
            return
        # from_id is the origin, authenticated by libp2p's own message signature (strict
        # signing), not the neighbour that forwarded it.
        sender = ID(msg.from_id).to_base58()
        item = Received(from_peer=sender, data=bytes(data), received_at=time.time())
        with self._lock:
            box = self._inbox.get(topic)
            if box is None:
                self._stats[COUNTER_DROPPED_UNSUBSCRIBED] += 1
                return
            self._stats[COUNTER_DROPPED_INBOUND_FULL] += len(box.put(sender, item))
            self._stats[COUNTER_RECEIVED] += 1

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        self._wake_event = trio.Event()
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
        d, d_lo, d_hi = self._degree
        router = SelectiveIdontwantGossipSub(
            protocols=_GOSSIPSUB_PROTOCOLS,
            idontwant_min_bytes=self._idontwant_min_bytes,
            degree=d,
            degree_low=d_lo,
            degree_high=d_hi,
            heartbeat_initial_delay=0.1,
            heartbeat_interval=self._heartbeat_interval,  # type: ignore[arg-type]
            adaptive_gossip_enabled=False,
            spam_protection_enabled=True,
            max_messages_per_topic_per_second=self._rate_limit,
            eclipse_protection_enabled=self._eclipse_protection,
            min_mesh_diversity_ips=3 if self._eclipse_protection else 1,
        )
        limit = self.max_msg_bytes + _RPC_OVERHEAD
        pubsub = PatchedPubsub(
            host,
            router,
            strict_signing=True,
            max_inbound_rpc_size=limit,
            on_message=self._on_message,
            peer_queue_limits=(limit, self._peer_queue_rpcs),
            on_bad_stream=lambda: self._bump("bad_streams"),
        )
        self._router, self._pubsub = router, pubsub
        with trio.CancelScope() as root:
            self._root_scope = root
            async with host.run(listen_addrs=self._listen_maddrs):
                try:
                    failed = listen_failures(host, self._listen_maddrs)
                    if failed:
                        raise OSError(f"could not listen on {', '.join(failed)} (address in "
                                      "use or not available; see the libp2p log line above)")
                    self._host = host
                    async with background_trio_service(pubsub):
                        async with background_trio_service(router):
                            await pubsub.wait_until_ready()
                            with self._lock:
                                topics = list(self._topics)
                            for topic in topics:
                                await pubsub.subscribe(topic)
                            self._listen_addrs = self._resolve_listen_addrs(host)
                            log.info("libp2p %s listening on %s", self.peer_id,
                                     ", ".join(self._listen_addrs))
                            self._ready.set()
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
                        log.debug("gossipsub stopped")
                    log.debug("pubsub stopped")
                finally:
                    # Close connections and listeners explicitly so the port is released and
                    # peers see the disconnect at once; bounded and shielded from cancellation.
                    with trio.move_on_after(max(1.0, self._close_timeout * 0.5)) as cs:
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

    async def _pump(self, pubsub: Any) -> None:
        """Move queued publishes into GossipSub, pacing under its rate limit and peer queues."""
        window: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        per_second = max(1, int(math.floor(self._rate_limit)) - 1)
        high_water = max(1, self._peer_queue_rpcs - 8)
        stuck: set[Any] = set()  # peers whose queue stayed full: not waited for again

        def full_peers() -> list[Any]:
            out = []
            for pid, q in list(pubsub.peer_queues.items()):
                n = len(q)
                if pid in stuck:
                    if n < high_water // 2:
                        stuck.discard(pid)
                elif n >= high_water:
                    out.append(pid)
            return out

        while True:
            with self._lock:
                item = self._outbound.popleft() if self._outbound else None
                if item is None:
                    self._wake_event = trio.Event()
                else:
                    self._outbound_bytes -= len(item[1])
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
            # Back-pressure: a full per-peer RpcQueue drops silently, so wait (bounded) for room.
            # A peer that stays full for a whole second is left to drop until it recovers, so
            # one slow peer cannot throttle what everybody else gets.
            if full_peers():
                with trio.move_on_after(1.0) as cs:
                    while full_peers():
                        await trio.sleep(0.002)
                if cs.cancelled_caught:
                    slow = full_peers()
                    stuck.update(slow)
                    log.warning("peer(s) %s not keeping up; not waiting for them",
                                ", ".join(str(p) for p in slow))
            try:
                await pubsub.publish(topic, data)
                stamps.append(time.time())
                self._bump(COUNTER_PUBLISHED)
            except Exception as e:  # noqa: BLE001
                self._bump("dropped_outbound_error")
                log.warning("libp2p publish on %s failed: %r", topic, e)
            await trio.sleep(0)

    async def _subscriber(self, pubsub: Any) -> None:
        """Join topics added by ``subscribe()`` after start."""
        while True:
            self._sub_event = trio.Event()
            with self._lock:
                topics = list(self._topics)
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
        network = host.get_network()
        delay = self._backoff_initial
        attempts = 0
        warned = False
        closing_since: float | None = None
        while True:
            state = connection_state(network, info.peer_id)
            if state == "live":
                closing_since = None
                delay = self._backoff_initial
                await trio.sleep(0.25)
                continue
            if state == "closing":  # wait (bounded) for the swarm to finish tearing it down
                now = time.monotonic()
                closing_since = closing_since or now
                if now - closing_since < 5.0:
                    await trio.sleep(0.05)
                    continue
                with trio.move_on_after(2.0):
                    try:
                        await network.close_peer(info.peer_id)
                    except Exception as e:  # noqa: BLE001
                        log.debug("close_peer(%s) failed: %r", addr, e)
            closing_since = None
            attempts += 1
            self._bump("dial_attempts")
            if attempts > 1:
                self._bump("reconnects")
            try:
                lift_dial_block(network, info.peer_id)
                with trio.fail_after(self._dial_timeout):
                    await host.connect(info)
                self._bump("connects")
                log.info("libp2p %s connected to bootstrap peer %s", self.peer_id, addr)
                warned = False
                delay = self._backoff_initial
                await trio.sleep(0.05)
                continue
            except trio.TooSlowError:
                reason = f"timed out after {self._dial_timeout:.1f} s"
            except Exception as e:  # noqa: BLE001 - dial failures are expected; never crash
                reason = short_error(e)
            self._bump("dial_failures")
            log.log(logging.DEBUG if warned else logging.WARNING,
                    "dial %s failed (%s); retrying in %.1f s", addr, reason, delay)
            warned = True
            await trio.sleep(delay * random.uniform(0.75, 1.25))
            delay = min(delay * 2.0, self._backoff_max)


def _first_leaf(e: BaseException) -> BaseException:
    """The first real exception inside (nested) trio exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


__all__ = [
    "Libp2pTransport",
    "Received",
    "TransportStartError",
    "keypair_from_seed",
    "peer_id_from_seed",
    "MiB",
]
