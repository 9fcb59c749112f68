"""Workarounds for py-libp2p 0.8.1 behaviours, one patch per upstream behaviour.

``protocol/transports/libp2p/`` (the transport and its thread bridge) builds its host from these;
nothing else in the project touches py-libp2p internals. Each patch names the behaviour it works
around, how it was found (measured on this project's machines or read from the installed source)
and the upstream issue where one was found. They reach into private attributes of py-libp2p, so
this module checks the installed version at import and warns loudly when it is not the one the
patches were written for.

Behaviours handled elsewhere by plain configuration (no patch needed), listed so they are not
rediscovered: GossipSub silently drops more than ``max_messages_per_topic_per_second`` (default
10) per forwarder and topic, our own publishes included (the transport raises it to 1000 and
paces its pump under it); inbound RPCs above ``max_inbound_rpc_size`` (default 1 MiB) reset the
stream (set from ``max_msg_bytes``); the default heartbeat is 120 s and adaptive gossip can
stretch it to 30-60 s (heartbeat 1 s, adaptive gossip off); GossipSub replays its recent-message
cache to a newly subscribed peer, so duplicates across reconnects are possible (consumers dedup:
the replay window does).
"""
from __future__ import annotations

import ipaddress
import logging
import time
import warnings
import weakref
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import multiaddr
import trio

from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub

log = logging.getLogger(__name__)

PATCHED_LIBP2P_VERSION = "0.8.1"


def libp2p_version_problem(installed: str | None) -> str | None:
    """What is wrong with the installed libp2p version for these patches (None: nothing)."""
    if installed == PATCHED_LIBP2P_VERSION:
        return None
    found = "no libp2p distribution metadata" if installed is None else f"libp2p {installed}"
    return (f"protocol/transports/libp2p/patches.py was written for libp2p {PATCHED_LIBP2P_VERSION} (pinned in "
            f"pyproject.toml) but {found} is installed: its patches reach into py-libp2p internals and may "
            f"silently stop working. Reinstall libp2p=={PATCHED_LIBP2P_VERSION}, or re-check every patch in "
            "this module against the new version and run tests/test_protocol_libp2p.py before trusting the "
            "libp2p transport.")


def _check_installed_version() -> None:
    try:
        installed: str | None = version("libp2p")
    except PackageNotFoundError:
        installed = None
    problem = libp2p_version_problem(installed)
    if problem:
        log.warning(problem)
        warnings.warn(problem, RuntimeWarning, stacklevel=3)


_check_installed_version()


# -- GossipSub (router) ----------------------------------------------------------------------


class SelectiveIdontwantGossipSub(GossipSub):
    """Behaviour: GossipSub v1.2 IDONTWANT is sent to every mesh peer for every message, tiny ones
    and our own publishes included (nobody can have those yet). With py-libp2p's per-RPC costs (a
    signed peer record attached to and verified on every RPC) that multiplies the work per
    message. go-libp2p and rust-libp2p send it only above a size threshold (rust: libp2p/rust-libp2p
    #6356). Here: only for received messages of at least ``idontwant_min_bytes``.
    """

    def __init__(self, *args: Any, idontwant_min_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idontwant_min_bytes = idontwant_min_bytes
        self._skip_idontwant: set[bytes] = set()

    async def publish(self, msg_forwarder: Any, pubsub_msg: Any) -> None:
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


def trim_equivocation_cache(router: Any, keep: int = 128, above: int = 256) -> None:
    """Behaviour: ``GossipSub.equivocation_detection`` keeps up to 1000 full messages (read from
    the source): with 4 MiB messages that is gigabytes. Called periodically, it keeps the newest
    ``keep`` entries once there are more than ``above``."""
    eq = getattr(router, "equivocation_detection", None)
    if eq is None or len(eq) <= above:
        return
    for key in list(eq.keys())[:-keep]:
        eq.pop(key, None)


def eclipse_protection_for(addrs: list[str]) -> bool:
    """Behaviour: GossipSub's eclipse protection (IP-diversity grafting/pruning) keeps the mesh
    from forming when every peer shares 127.0.0.1 (measured). Returns whether to enable it: off
    when any listen or bootstrap address is loopback (a local swarm), on otherwise."""
    return not any(_is_loopback_maddr(a) for a in addrs)


def _is_loopback_maddr(addr: str) -> bool:
    try:
        ma = multiaddr.Multiaddr(addr)
    except Exception:  # noqa: BLE001 - an unparseable address is not loopback
        return False
    for proto in ("ip4", "ip6"):
        try:
            value = ma.value_for_protocol(proto)
        except Exception:  # noqa: BLE001 - the address has no such component
            value = None
        if value:
            try:
                return ipaddress.ip_address(value).is_loopback
            except ValueError:
                return False
    return False


# -- Pubsub: one mixin per behaviour, composed in PatchedPubsub --------------------------------


class DirectInboxDelivery(Pubsub):
    """Behaviour: validated messages go to a 32-slot trio channel per subscription that drops when
    a reader falls behind (the same design as go-libp2p-pubsub's, libp2p/go-libp2p-pubsub#197),
    and a publisher also receives its own messages. Here ``notify_subscriptions`` hands each
    message synchronously to ``on_message(topic, msg)`` and skips our own."""

    def __init__(self, *args: Any, on_message: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_message = on_message
        self._my_id_bytes = self.host.get_id().to_bytes()

    def notify_subscriptions(self, publish_message: Any) -> None:
        if publish_message.from_id == self._my_id_bytes:
            return
        for topic in publish_message.topicIDs:
            if topic in self.subscribed_topics_receive:
                self._on_message(topic, publish_message)


class SerializedStreamWrites(Pubsub):
    """Behaviour: several tasks write RPCs to the same peer stream concurrently (the per-peer
    sender loop, the pending-queue flush, the recent-message replay) and yamux locks only per
    frame, so two large RPCs interleave and the receiver cannot parse them (seen with a 1 MB
    message published right after connecting). Here: one writer at a time per stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)


class BadStreamDropsPeer(Pubsub):
    """Behaviour: a protobuf ``DecodeError`` on an inbound pubsub stream is not caught upstream; it
    bubbles up through the connection nursery and takes the whole host down, so one malformed RPC
    from any peer kills the node (the same class of bug as libp2p/py-libp2p#910, an unhandled
    per-peer error stopping the pubsub service). Here: that peer's stream is reset and the peer
    dropped, and ``on_bad_stream()`` counts it."""

    def __init__(self, *args: Any, on_bad_stream: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_bad_stream = on_bad_stream

    async def stream_handler(self, stream: Any) -> None:
        try:
            await super().stream_handler(stream)
        except Exception as e:  # noqa: BLE001 - any bad input from one peer drops that peer
            peer_id = stream.muxed_conn.peer_id
            log.warning("dropping pubsub stream from %s: %s", peer_id, short_error(e))
            if self._on_bad_stream is not None:
                self._on_bad_stream()
            try:
                await stream.reset()
            except Exception:  # noqa: BLE001 - the stream may already be gone
                pass
            self._handle_dead_peer(peer_id)


class _SizedQueues(dict):  # type: ignore[type-arg]
    """``Pubsub.peer_queues`` replacement that resizes each per-peer ``RpcQueue`` as it is added."""

    def __init__(self, max_message_size: int, max_rpcs: int) -> None:
        super().__init__()
        self.max_message_size = max_message_size
        self.max_rpcs = max_rpcs

    def __setitem__(self, key: Any, queue: Any) -> None:
        try:
            queue.max_message_size = self.max_message_size
            queue._queue.max_size = self.max_rpcs
        except AttributeError:  # pragma: no cover - a different py-libp2p layout
            log.warning("libp2p RpcQueue layout changed; outbound queue limits not raised "
                        "(see protocol/transports/libp2p/patches.py)")
        super().__setitem__(key, queue)


class SizedPeerQueues(Pubsub):
    """Behaviour: the per-peer outbound ``RpcQueue`` holds only 32 RPCs of at most 1 MiB (both drop
    silently) and ``Pubsub._handle_new_peer`` creates it without size arguments. Here every queue
    is resized to ``peer_queue_limits = (max RPC bytes, max RPCs)`` as it is registered."""

    def __init__(self, *args: Any, peer_queue_limits: tuple[int, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer_queues = _SizedQueues(*peer_queue_limits)


class PatchedPubsub(DirectInboxDelivery, SerializedStreamWrites, BadStreamDropsPeer, SizedPeerQueues):
    """py-libp2p's Pubsub with every pubsub patch above; keyword arguments: ``on_message``,
    ``on_bad_stream``, ``peer_queue_limits`` (plus Pubsub's own)."""


# -- host and swarm ------------------------------------------------------------------------


def memoize_host_addrs(host: Any, ttl: float = 2.0) -> None:
    """Behaviour: py-libp2p rebuilds ``host.get_addrs()`` (about 1 ms of multiaddr work) for the
    signed peer record it attaches to every pubsub RPC. Memoised on this host for ``ttl``
    seconds (addresses change rarely); with the IDONTWANT patch, 1 KiB messages between two
    processes went from about 60 to about 450 per second."""
    original = host.get_addrs
    cache: list[Any] = [0.0, None]

    def get_addrs() -> Any:
        now = time.monotonic()
        if cache[1] is None or now - cache[0] > ttl:
            cache[1] = original()
            cache[0] = now
        return list(cache[1])

    host.get_addrs = get_addrs


def disable_swarm_dial_retries(host: Any) -> None:
    """Behaviour: the swarm retries every dial 3 times itself, which only delays a caller that
    owns retries and backoff (our reconnect loop does)."""
    try:
        host.get_network().retry_config.max_retries = 0
    except AttributeError:  # pragma: no cover - a different py-libp2p layout
        log.warning("libp2p swarm retry_config not found; swarm dial retries stay on")


def lift_dial_block(network: Any, peer_id: Any) -> None:
    """Behaviour: the swarm's negative dial cache blocks a peer for 60 s after one failed dial, so
    a bootstrap peer that comes up later is not dialed again for a minute. Called before each of
    our own backed-off attempts."""
    try:
        network.unblock_peer(peer_id)
    except AttributeError:  # pragma: no cover - a different py-libp2p layout
        pass


def connection_state(network: Any, peer_id: Any) -> str:
    """"live", "closing" or "none" for our connections to ``peer_id``.

    Behaviour: while a dropped connection is being torn down it stays in ``swarm.connections`` and
    ``host.connect()`` returns at once without a trio checkpoint, so a re-dial loop that trusts
    ``connect()`` spins and starves the event loop (``close()`` then hangs). A caller waits while
    this says "closing" instead of dialing."""
    conns = list(network.connections.get(peer_id) or ())
    if any(not getattr(c, "is_closed", False) for c in conns):
        return "live"
    return "closing" if conns else "none"


def listen_failures(host: Any, listen_maddrs: list[Any]) -> list[str]:
    """Behaviour: ``Swarm.listen`` logs a failed bind (port in use, address not available) and
    returns normally, so a host can run listening on nothing. Returns the addresses that are not
    listening, for the caller to raise on (related: libp2p/py-libp2p#863, other listen bugs)."""
    listening = set(host.get_network().listeners)
    return [str(m) for m in listen_maddrs if str(m) not in listening]


def is_shutdown_noise(e: BaseException) -> bool:
    """Behaviour: tearing a host down raises cancellations and ``Nursery is closed to new
    arrivals`` (measured, often with 16+ hosts) although nothing went wrong. True for those."""
    if isinstance(e, BaseExceptionGroup):
        return all(is_shutdown_noise(x) for x in e.exceptions)
    if isinstance(e, trio.Cancelled):
        return True
    return isinstance(e, RuntimeError) and "closed to new arrivals" in str(e)


def short_error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) < 300 else msg[:297] + "..."
