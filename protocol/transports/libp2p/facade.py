"""libp2p GossipSub transport (py-libp2p 0.8.1) for real networks: the thread-safe facade.

The training loop is plain synchronous code; py-libp2p is trio-based. The host (host.py) runs in
its **own trio event loop on a background daemon thread**; this facade talks to it only through
thread-safe, bounded queues (host.Shared):

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
caches, throughput) lives in patches.py, one patch per behaviour.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import multiaddr
import trio

from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from ..base import (
    COUNTER_DROPPED_INBOUND_FULL,
    COUNTER_DROPPED_OUTBOUND_FULL,
    COUNTER_DROPPED_UNSUBSCRIBED,
    COUNTER_PUBLISHED,
    COUNTER_RECEIVED,
    Received,
)
from ..options import Libp2pOptions
from .host import Libp2pHost, Shared
from .patches import eclipse_protection_for, short_error

log = logging.getLogger(__name__)

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


def dialable_bootstrap(addrs: tuple[str, ...], own: ID) -> list[tuple[str, Any]]:
    """(address, PeerInfo) for each bootstrap address but our own; ValueError naming a bad one."""
    out = []
    for addr in addrs:
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as e:
            raise ValueError(
                f"bootstrap address {addr!r} is not a dialable multiaddr ending in "
                f"/p2p/<peer-id>: {e}"
            ) from e
        if info.peer_id == own:
            log.info("skipping bootstrap address %s: it is this node", addr)
            continue
        out.append((addr, info))
    return out


class Libp2pTransport:
    """GossipSub over py-libp2p (TCP + Noise + Yamux/Mplex) on a background trio thread.

    :param seed: 32-byte raw Ed25519 private key; the peer id is derived from it.
    :param options: listen and bootstrap addresses, topics, bounds and timeouts (Libp2pOptions).
    """

    def __init__(self, seed: bytes, options: Libp2pOptions | None = None) -> None:
        o = self.options = options or Libp2pOptions()
        key_pair = keypair_from_seed(seed)
        self._peer_id = ID.from_pubkey(key_pair.public_key)
        self.max_msg_bytes = int(o.max_msg_bytes)
        bootstrap = dialable_bootstrap(o.bootstrap, self._peer_id)
        eclipse = o.eclipse_protection
        if eclipse is None:
            eclipse = eclipse_protection_for([*o.listen, *(b for b, _ in bootstrap)])
        self._shared = Shared(o, STAT_KEYS)
        self._trio = Libp2pHost(self._shared, key_pair, self.peer_id, bootstrap, bool(eclipse))
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API (any thread)

    @property
    def peer_id(self) -> str:
        return self._peer_id.to_base58()

    @property
    def running(self) -> bool:
        """True while the libp2p thread is up and serving."""
        t = self._thread
        return bool(t is not None and t.is_alive() and self._trio.ready.is_set() and not self._shared.closed)

    def start(self) -> None:
        """Start the host thread; return once it listens (never waits for peers)."""
        listen, timeout = list(self.options.listen), self.options.start_timeout
        with self._shared.lock:
            if self._shared.closed:
                raise RuntimeError("transport is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._trio.run, name=f"libp2p-{self.peer_id[-8:]}",
                                                daemon=True)
                self._thread.start()
        if not self._trio.ready.wait(timeout):
            self.close()
            raise TransportStartError(
                f"libp2p host did not start listening on {listen} within {timeout:.0f} s"
            )
        if self._trio.start_error is not None:
            err = _first_leaf(self._trio.start_error)
            self.close()
            raise TransportStartError(
                f"libp2p host failed to listen on {listen}: {short_error(err)}"
            ) from self._trio.start_error

    def publish(self, topic: str, data: bytes) -> None:
        """Queue ``data`` for ``topic``; never blocks. Full queue / oversized / closed: dropped."""
        data, shared, o = bytes(data), self._shared, self.options
        with shared.lock:
            if shared.closed:
                shared.stats["dropped_outbound_closed"] += 1
                return
            if len(data) > self.max_msg_bytes:
                shared.stats["dropped_outbound_oversize"] += 1
                log.warning("dropping %d-byte message on %s: over max_msg_bytes=%d",
                            len(data), topic, self.max_msg_bytes)
                return
            if (len(shared.outbound) >= o.outbound_size
                    or shared.outbound_bytes + len(data) > o.outbound_max_bytes):
                shared.stats[COUNTER_DROPPED_OUTBOUND_FULL] += 1
                return
            was_empty = not shared.outbound
            shared.outbound.append((topic, data))
            shared.outbound_bytes += len(data)
        if was_empty:
            self._call_soon(self._trio.set_wake)

    def subscribe(self, topic: str) -> None:
        """Collect ``topic`` for ``drain`` from now on (before or after ``start``; idempotent)."""
        with self._shared.lock:
            if not self._shared.add_topic(topic):
                return
        self._call_soon(self._trio.set_sub_wake)

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        """Pop what arrived on ``topic``: round-robin across senders, returned oldest first."""
        with self._shared.lock:
            box = self._shared.inbox.get(topic)
            return [] if box is None else box.take(None if max_items is None else int(max_items))

    def dropped_by_sender(self) -> dict[str, int]:
        """Messages each sender lost to a full inbox (all topics)."""
        with self._shared.lock:
            total: collections.Counter[str] = collections.Counter()
            for box in self._shared.inbox.values():
                total.update(box.dropped)
            return dict(total)

    def peers(self) -> list[str]:
        """Peer ids we currently hold a live connection to."""
        host = self._trio.host
        if host is None or self._shared.closed:
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

    def mesh_peers(self, topic: str) -> list[str]:
        """Peer ids in our GossipSub mesh for ``topic`` (read-only; [] before start, after close or
        for a topic we have not joined): whom a message of ours on ``topic`` goes to first."""
        router = self._trio.router
        if router is None or self._shared.closed:
            return []
        for _ in range(3):
            try:
                return sorted(pid.to_base58() for pid in list(router.mesh.get(topic, ())))
            except RuntimeError:  # set or dict mutated by the trio thread mid-copy; retry
                continue
        return []

    def connection_muxers(self) -> dict[str, int]:
        """Live connections per negotiated stream muxer (yamux or mplex), read-only; {} when not running."""
        host = self._trio.host
        if host is None or self._shared.closed:
            return {}
        for _ in range(3):
            try:
                conns = [c for cs in list(host.get_network().connections.values()) for c in list(cs)]
            except RuntimeError:  # dict mutated by the trio thread mid-copy; retry
                continue
            counts: collections.Counter[str] = collections.Counter(
                str(getattr(getattr(c, "muxed_conn", c), "negotiated_muxer_protocol", "?"))
                for c in conns if not getattr(c, "is_closed", False))
            return dict(counts)
        return {}

    def listen_addrs(self) -> list[str]:
        """Dialable multiaddrs with the real port and ``/p2p/<peer-id>`` (after ``start``)."""
        return list(self._trio.listen_addrs)

    def stats(self) -> dict[str, int]:
        with self._shared.lock:
            out = dict(self._shared.stats)
        out["dropped_outbound"] = sum(v for k, v in out.items() if k.startswith("dropped_outbound_"))
        out["dropped_inbound"] = (
            out[COUNTER_DROPPED_INBOUND_FULL] + out["dropped_inbound_oversize"]
            + out[COUNTER_DROPPED_UNSUBSCRIBED]
        )
        return out

    def close(self) -> None:
        """Stop the trio loop, close connections and listeners, join the thread. Idempotent."""
        with self._shared.lock:
            already = self._shared.closed
            self._shared.closed = True
            thread = self._thread
        if thread is None or already and not thread.is_alive():
            return
        timeout = self.options.close_timeout
        self._call_soon(self._trio.request_stop)
        thread.join(timeout * 0.7)
        if thread.is_alive():  # graceful shutdown stuck: cancel everything
            self._call_soon(self._trio.hard_cancel)
            thread.join(timeout * 0.3)
        if thread.is_alive():
            log.warning("libp2p thread did not exit within %.1f s (daemon; left behind)", timeout)

    def __enter__(self) -> Libp2pTransport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Libp2pTransport({self.peer_id}, listen={self.listen_addrs() or list(self.options.listen)})"

    def _call_soon(self, fn: Any) -> None:
        """Run `fn` on the trio thread (dropped when it is not running)."""
        token = self._trio.trio_token
        if token is None:
            return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass


def _first_leaf(e: BaseException) -> BaseException:
    """The first real exception inside (nested) trio exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
