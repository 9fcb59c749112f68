"""Typed options of each networked transport, one frozen dataclass per kind (stdlib only: a caller
can build them without importing the transport's network stack; protocol/transports/factory.py
turns one into its transport)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .p2pd.peer_cache import PeerCacheLimits

MiB = 1024 * 1024
LOOPBACK_ANY_PORT = "/ip4/127.0.0.1/tcp/0"


@dataclass(frozen=True)
class Libp2pOptions:
    """py-libp2p GossipSub (protocol/transports/libp2p/).

    listen: multiaddrs to listen on (``/ip4/127.0.0.1/tcp/0`` picks a free port).
    bootstrap: ``/ip4/.../tcp/.../p2p/<peer-id>`` multiaddrs to dial and keep dialing.
    topics: topics subscribed at start (``drain`` serves these).
    max_msg_bytes: largest payload accepted by ``publish`` and from peers.
    inbox_size, inbox_max_bytes: per-topic inbox bounds (beyond them the sender holding the most
        messages, or bytes, loses its oldest).
    outbound_size, outbound_max_bytes: outbound queue bounds (``publish`` drops beyond).
    peer_queue_rpcs: py-libp2p's per-peer outbound RPC queue length (its default is 32).
    degree, degree_low, degree_high: GossipSub mesh degree D, D_lo, D_hi (go defaults: a swarm
        smaller than D_lo + 1 is a full mesh).
    heartbeat_interval: GossipSub heartbeat seconds (py-libp2p's default is 120).
    idontwant_min_bytes: send GossipSub IDONTWANT only for messages at least this big.
    max_messages_per_topic_per_second: GossipSub's per-forwarder, per-topic rate limit (py-libp2p's
        default, 10, silently drops the rest).
    eclipse_protection: GossipSub IP-diversity protection; ``None`` = off when a listen or bootstrap
        address is loopback (a local swarm: every peer shares 127.0.0.1), else on.
    dial_timeout: seconds per dial attempt.
    backoff_initial, backoff_max: reconnect backoff (doubling, with +-25% jitter).
    start_timeout: seconds ``start()`` waits for the host to listen.
    close_timeout: seconds ``close()`` waits for the thread.
    """

    listen: tuple[str, ...] = (LOOPBACK_ANY_PORT,)
    bootstrap: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    max_msg_bytes: int = 4 * MiB
    inbox_size: int = 4096
    outbound_size: int = 4096
    inbox_max_bytes: int = 256 * MiB
    outbound_max_bytes: int = 256 * MiB
    peer_queue_rpcs: int = 64
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval: float = 1.0
    idontwant_min_bytes: int = 16 * 1024
    max_messages_per_topic_per_second: float = 1000.0
    eclipse_protection: bool | None = None
    dial_timeout: float = 10.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    start_timeout: float = 20.0
    close_timeout: float = 10.0

    def __post_init__(self) -> None:
        # Lists are welcome (config values are lists); kept as tuples so the options stay immutable.
        for name in ("listen", "bootstrap", "topics"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        if not self.listen:
            object.__setattr__(self, "listen", (LOOPBACK_ANY_PORT,))
        if self.max_msg_bytes <= 0:
            raise ValueError("max_msg_bytes must be positive")


@dataclass(frozen=True)
class P2pdOptions:
    """GossipSub + DHT through the go-libp2p daemon (protocol/transports/p2pd/; each field is the
    P2pdTransport keyword of the same name, documented there). peer_cache_limits None = its defaults."""

    listen: tuple[str, ...] = (LOOPBACK_ANY_PORT,)
    bootstrap: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    peer_cache: Path | None = None
    peer_cache_limits: PeerCacheLimits | None = None
    flood_cut_rate: float = 80.0
    flood_cut_burst: float = 200.0
    flood_cut_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("listen", "bootstrap", "topics"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))

    def keywords(self) -> dict:
        """P2pdTransport's keyword arguments (the unset peer_cache_limits left to its default)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["listen"], out["bootstrap"], out["topics"] = list(self.listen), list(self.bootstrap), list(self.topics)
        if self.peer_cache_limits is None:
            del out["peer_cache_limits"]
        return out
