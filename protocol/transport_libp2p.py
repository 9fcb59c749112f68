"""libp2p GossipSub transport (py-libp2p 0.8.1) for real networks.

The training loop is plain synchronous code; py-libp2p is trio-based. This module runs one
libp2p host in its **own trio event loop on a background daemon thread** and talks to callers
only through thread-safe, bounded queues:

* ``publish(topic, data)`` appends to a bounded outbound deque and returns at once (a full
  queue or an oversized message is dropped and counted, never raised, never blocking).
* ``drain(topic)`` pops whatever arrived on that topic (bounded per-topic inbox, drop-oldest).
* Bootstrap peers are dialed with a timeout and re-dialed forever with exponential backoff and
  jitter whenever they are not connected; failures are logged and counted, never raised.

Bytes only: signing/validation of our own envelopes lives elsewhere in ``protocol/``. libp2p's
own pubsub signing is on (``strict_signing``), so ``Received.from_peer`` is the authenticated
origin peer id of the message, which equals the signer identity because the host key is built
from the same 32-byte Ed25519 seed.

py-libp2p 0.8.1 behaviours handled here (measured / read from the installed source):

* GossipSub drops more than ``max_messages_per_topic_per_second`` (default 10) per forwarder and
  topic, silently, **including our own publishes**: raised to 1000 and the outbound pump paces
  itself under that limit so a burst is delayed, not lost.
* Pubsub delivers to a 32-slot subscription channel and drops when it is full, and the
  publisher also receives its own messages: ``_InboxPubsub.notify_subscriptions`` hands messages
  straight to our inbox (synchronously, no 32-slot channel) and skips our own.
* The per-peer outbound ``RpcQueue`` holds only 32 RPCs of at most 1 MiB (both silently drop) and
  is created without size arguments: ``_SizedQueues`` resizes every queue as it is registered,
  and the pump waits (bounded) while a peer queue is nearly full.
* Inbound RPCs above ``max_inbound_rpc_size`` (default 1 MiB) reset the stream: set from
  ``max_msg_bytes``.
* Eclipse protection (IP-diversity grafting/pruning) misbehaves when every peer is 127.0.0.1:
  ``eclipse_protection_enabled`` is turned off automatically when a listen or bootstrap
  address is loopback.
* Adaptive gossip can stretch the heartbeat to 30-60 s and the default heartbeat is 120 s: the
  heartbeat is set to 1 s and adaptive gossip is off.
* ``Swarm.listen`` logs a failed bind (port in use) and returns normally: ``start()`` checks
  the listeners and raises ``TransportStartError`` naming the address.
* The swarm's negative dial cache blocks a peer for 60 s after one failed dial, and the swarm
  retries each dial 3 times itself: our reconnect loop owns retries (swarm retries off) and
  lifts the block (``unblock_peer``) before each of its own backed-off attempts.
* While a dropped connection is being torn down it stays in ``swarm.connections`` and
  ``host.connect()`` returns at once without a checkpoint; a naive re-dial loop spins and
  starves the event loop (close() then hangs): the loop waits for the teardown instead.
* Throughput: py-libp2p builds ``host.get_addrs()`` (about 1 ms of multiaddr work) for the
  signed peer record attached to every RPC, and sends IDONTWANT to every mesh peer for every
  message (our own and tiny ones included). ``get_addrs`` is memoised per host (2 s) and
  IDONTWANT is limited to received messages of at least ``idontwant_min_bytes``: 1 KiB
  messages between two processes went from about 60 to about 450 per second.
* ``equivocation_detection`` keeps up to 1000 full messages: trimmed periodically.
* GossipSub replays its recent-message cache (a few heartbeats) to a newly subscribed peer: a
  message published while nobody was connected may still arrive a few seconds later, and
  duplicates across reconnects are possible. Consumers dedup (the replay window does).
* Several tasks write RPCs to the same peer stream concurrently and yamux locks only per
  frame, so two large RPCs interleave and the receiver cannot parse them (seen with a 1 MB
  message published right after connecting: the pending-queue flush and the recent-message
  replay both sent it): ``write_msg`` is serialised per stream.
* A protobuf ``DecodeError`` on an inbound pubsub stream is not caught upstream and crashes the
  whole host (one malformed RPC from any peer would kill the node): ``stream_handler`` drops
  that peer's stream instead and counts it (``bad_streams``).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import math
import random
import threading
import time
import weakref
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
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import (
    PROTOCOL_ID as NOISE_PROTOCOL_ID,
    Transport as NoiseTransport,
)
from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID, Yamux
from libp2p.tools.anyio_service import background_trio_service

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
    COUNTER_DROPPED_INBOUND_FULL,  # oldest inbox entry evicted by a newer one
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


def _is_loopback_maddr(addr: str) -> bool:
    try:
        ma = multiaddr.Multiaddr(addr)
    except Exception:
        return False
    for proto in ("ip4", "ip6"):
        try:
            value = ma.value_for_protocol(proto)
        except Exception:
            value = None
        if value:
            try:
                return ipaddress.ip_address(value).is_loopback
            except ValueError:
                return False
    return False


class _SizedQueues(dict):  # type: ignore[type-arg]
    """``Pubsub.peer_queues`` replacement: resize each per-peer ``RpcQueue`` as it is added.

    py-libp2p creates ``RpcQueue()`` with its defaults (32 RPCs, 1 MiB) inside
    ``Pubsub._handle_new_peer``; both limits drop silently.
    """

    def __init__(self, max_message_size: int, max_rpcs: int) -> None:
        super().__init__()
        self.max_message_size = max_message_size
        self.max_rpcs = max_rpcs

    def __setitem__(self, key: Any, queue: Any) -> None:
        try:
            queue.max_message_size = self.max_message_size
            queue._queue.max_size = self.max_rpcs
        except AttributeError:  # pragma: no cover - a different py-libp2p layout
            log.warning("libp2p RpcQueue layout changed; outbound queue limits not raised")
        super().__setitem__(key, queue)


class _Router(GossipSub):
    """GossipSub that sends IDONTWANT only where it can save bandwidth.

    py-libp2p 0.8.1 sends IDONTWANT to every v1.2 mesh peer for every message, tiny ones and
    our own publishes included (nobody can have those yet): with its per-RPC costs (a signed
    peer record is attached to, and verified on, every RPC) that multiplies the work per
    message. go-libp2p only does it for messages above a size threshold (1 KiB).
    """

    def __init__(self, *args: Any, idontwant_min_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idontwant_min_bytes = idontwant_min_bytes
        self._skip_idontwant: set[bytes] = set()

    async def publish(self, msg_forwarder: ID, pubsub_msg: Any) -> None:
        msg_id = None
        if self.pubsub is not None and (
            len(pubsub_msg.data) < self._idontwant_min_bytes
            or pubsub_msg.from_id == self.pubsub.my_id.to_bytes()
        ):
            msg_id = self.pubsub.get_message_id(pubsub_msg)
            self._skip_idontwant.add(msg_id)
        try:
            await super().publish(msg_forwarder, pubsub_msg)
        finally:
            if msg_id is not None:
                self._skip_idontwant.discard(msg_id)

    async def _emit_idontwant_for_message(self, msg_id: bytes, topic_ids: Any) -> None:
        if msg_id in self._skip_idontwant:
            return
        await super()._emit_idontwant_for_message(msg_id, topic_ids)


def _cache_host_addrs(host: Any, ttl: float = 2.0) -> None:
    """Memoise ``host.get_addrs()`` on this host object for ``ttl`` seconds.

    py-libp2p rebuilds the signed peer record check from ``get_addrs()`` (multiaddr parsing,
    about 1 ms) for every pubsub RPC it sends; addresses change rarely.
    """
    original = host.get_addrs
    cache: list[Any] = [0.0, None]

    def get_addrs() -> Any:
        now = time.monotonic()
        if cache[1] is None or now - cache[0] > ttl:
            cache[1] = original()
            cache[0] = now
        return list(cache[1])

    host.get_addrs = get_addrs


class _InboxPubsub(Pubsub):
    """Pubsub with the py-libp2p 0.8.1 fixes this transport needs.

    * Validated messages go straight to a callback, replacing the 32-slot per-topic trio
      channel (which drops when a reader falls behind); our own publishes are skipped.
    * One writer at a time per peer stream; bad inbound RPCs drop the peer, not the host.
    * Per-peer outbound queues resized (``_SizedQueues``).
    """

    def __init__(self, *args: Any, on_message: Any, peer_queue_limits: tuple[int, int],
                 on_bad_stream: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_message = on_message
        self._my_id_bytes = self.host.get_id().to_bytes()
        self.peer_queues = _SizedQueues(*peer_queue_limits)
        self._on_bad_stream = on_bad_stream
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        # py-libp2p writes to one peer stream from several tasks (the per-peer sender loop,
        # flush_pending_messages, replay of recent messages) and yamux only locks per frame:
        # two large RPCs interleave and the receiver fails to parse. One writer per stream.
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    async def stream_handler(self, stream: Any) -> None:
        # Upstream catches only stream/parse errors here; a protobuf DecodeError from a peer's
        # garbage bubbles up through the connection nursery and takes the whole host down.
        try:
            await super().stream_handler(stream)
        except Exception as e:  # noqa: BLE001 - any bad input from one peer drops that peer
            peer_id = stream.muxed_conn.peer_id
            log.warning("dropping pubsub stream from %s: %s", peer_id, _short_error(e))
            if self._on_bad_stream is not None:
                self._on_bad_stream()
            try:
                await stream.reset()
            except Exception:  # noqa: BLE001
                pass
            self._handle_dead_peer(peer_id)

    def notify_subscriptions(self, publish_message: Any) -> None:
        if publish_message.from_id == self._my_id_bytes:
            return
        for topic in publish_message.topicIDs:
            if topic in self.subscribed_topics_receive:
                self._on_message(topic, publish_message)


class Libp2pTransport:
    """GossipSub over py-libp2p (TCP + Noise + Yamux/Mplex) on a background trio thread.

    :param seed: 32-byte raw Ed25519 private key; the peer id is derived from it.
    :param listen: multiaddrs to listen on (``/ip4/127.0.0.1/tcp/0`` picks a free port).
    :param bootstrap: ``/ip4/.../tcp/.../p2p/<peer-id>`` multiaddrs to dial and keep dialing.
    :param topics: topics subscribed at start (``drain`` serves these).
    :param max_msg_bytes: largest payload accepted by ``publish`` and from peers.
    :param inbox_size, inbox_max_bytes: per-topic inbox bounds (oldest evicted beyond them).
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
        self._inbox_bytes: dict[str, int] = {t: 0 for t in self._topics}
        self._peer_queue_rpcs = int(peer_queue_rpcs)
        self._degree = (int(degree), int(degree_low), int(degree_high))
        self._heartbeat_interval = heartbeat_interval
        self._idontwant_min_bytes = int(idontwant_min_bytes)
        self._rate_limit = float(max_messages_per_topic_per_second)
        if eclipse_protection is None:
            eclipse_protection = not any(
                _is_loopback_maddr(a) for a in [*self._listen, *(b for b, _ in self._bootstrap)]
            )
        self._eclipse_protection = bool(eclipse_protection)
        self._dial_timeout = float(dial_timeout)
        self._backoff_initial = float(backoff_initial)
        self._backoff_max = float(backoff_max)
        self._start_timeout = float(start_timeout)
        self._close_timeout = float(close_timeout)

        self._lock = threading.Lock()
        self._outbound: collections.deque[tuple[str, bytes]] = collections.deque()
        self._inbox: dict[str, collections.deque[Received]] = {
            t: collections.deque() for t in self._topics
        }
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
                f"libp2p host failed to listen on {self._listen}: {_short_error(err)}"
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
            self._inbox[topic] = collections.deque()
            self._inbox_bytes[topic] = 0
            self._topics.append(topic)
        self._call_soon(self._set_sub_wake)

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        """Pop what arrived on ``topic`` (oldest first). Arrival order only; no global order."""
        with self._lock:
            box = self._inbox.get(topic)
            if not box:
                return []
            n = len(box) if max_items is None else max(0, min(int(max_items), len(box)))
            out = [box.popleft() for _ in range(n)]
            self._inbox_bytes[topic] -= sum(len(m.data) for m in out)
            return out

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
            elif _only_shutdown_noise(e):
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
            while box and (len(box) >= self._inbox_size
                           or self._inbox_bytes[topic] + len(data) > self._inbox_max_bytes):
                self._inbox_bytes[topic] -= len(box.popleft().data)
                self._stats[COUNTER_DROPPED_INBOUND_FULL] += 1
            box.append(item)
            self._inbox_bytes[topic] += len(data)
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
        # Our reconnect loop owns retries/backoff; the swarm's own 3 quick retries only delay it.
        try:
            host.get_network().retry_config.max_retries = 0
        except AttributeError:  # pragma: no cover
            pass
        d, d_lo, d_hi = self._degree
        _cache_host_addrs(host)
        router = _Router(
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
        pubsub = _InboxPubsub(
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
                    # Swarm.listen logs a failed bind (port in use, bad address) and carries on.
                    listening = set(host.get_network().listeners)
                    failed = [str(m) for m in self._listen_maddrs if str(m) not in listening]
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
                eq = router.equivocation_detection
                if len(eq) > 256:
                    for key in list(eq.keys())[:-128]:
                        eq.pop(key, None)
            except Exception:  # noqa: BLE001
                pass

    async def _keep_connected(self, host: Any, addr: str, info: Any) -> None:
        """Keep one bootstrap peer connected: dial, and re-dial with backoff forever."""
        network = host.get_network()
        delay = self._backoff_initial
        attempts = 0
        warned = False
        closing_since: float | None = None
        while True:
            conns = list(network.connections.get(info.peer_id) or ())
            if any(not getattr(c, "is_closed", False) for c in conns):
                closing_since = None
                delay = self._backoff_initial
                await trio.sleep(0.25)
                continue
            if conns:
                # A connection is closing but not yet removed from the swarm. host.connect()
                # would "succeed" on it at once without a checkpoint (a busy loop that starves
                # trio), so wait for the swarm to finish tearing it down (bounded).
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
                try:
                    network.unblock_peer(info.peer_id)  # lift the swarm's 60 s negative cache
                except AttributeError:  # pragma: no cover
                    pass
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
                reason = _short_error(e)
            self._bump("dial_failures")
            log.log(logging.DEBUG if warned else logging.WARNING,
                    "dial %s failed (%s); retrying in %.1f s", addr, reason, delay)
            warned = True
            await trio.sleep(delay * random.uniform(0.75, 1.25))
            delay = min(delay * 2.0, self._backoff_max)


def _short_error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) < 300 else msg[:297] + "..."


def _first_leaf(e: BaseException) -> BaseException:
    """The first real exception inside (nested) trio exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _only_shutdown_noise(e: BaseException) -> bool:
    """True for the errors py-libp2p can raise while tearing down (nothing to report)."""
    if isinstance(e, BaseExceptionGroup):
        return all(_only_shutdown_noise(x) for x in e.exceptions)
    if isinstance(e, trio.Cancelled):
        return True
    if isinstance(e, RuntimeError) and "closed to new arrivals" in str(e):
        return True
    return False


__all__ = [
    "Libp2pTransport",
    "Received",
    "TransportStartError",
    "keypair_from_seed",
    "peer_id_from_seed",
    "MiB",
]
