"""Typed options of each networked transport, one frozen dataclass per kind (stdlib only: a caller
can build them without importing the transport's network stack; protocol/transports/factory.py
turns one into its transport)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .p2pd.peer_cache import PeerCacheLimits

MiB = 1024 * 1024
LOOPBACK_ANY_PORT = "/ip4/127.0.0.1/tcp/0"

# The go-libp2p daemon's pubsub limit is 1 MiB for the whole message (payload + from, seqno, topic,
# key and signature); 16 KiB of headroom keeps every topic name and signature well inside it.
P2PD_MAX_MESSAGE_BYTES = (1 << 20) - 16 * 1024


def _freeze_addresses(options: Libp2pOptions | P2pdOptions) -> None:
    """Lists are welcome (config values are lists); kept as tuples so the options stay immutable.
    No listen address means loopback on a free port."""
    for name in ("listen", "bootstrap", "topics"):
        object.__setattr__(options, name, tuple(getattr(options, name) or ()))
    if not options.listen:
        object.__setattr__(options, "listen", (LOOPBACK_ANY_PORT,))


REACHABILITY_MODES = ("auto", "public", "private")
REACHABILITY_NAMES = {0: "unknown", 1: "public", 2: "private"}  # go-libp2p network.Reachability codes


@dataclass(frozen=True)
class NatOptions:
    """Being reachable from outside on the p2pd transport (protocol/transports/p2pd/nat.py).

    reachability: "auto": AutoNAT (peers that serve it dial us back) decides whether we are public
        or private; "public" / "private": skip the test (a rented box with a public address, a
        node that knows it sits behind NAT).
    autonat_service: dial peers back when they ask whether they are reachable, and upgrade relayed
        connections to direct ones by hole punching (DCUtR); the daemon couples the two (-autonat).
    relay_client: once private, reserve a slot on relays, advertise the relayed addresses (so peers
        can dial us through them), and dial peers' relayed addresses.
    relays: relay multiaddrs ending in /p2p/<peer-id>; empty = the bootstrap peers.
    relay_service: once public, serve relay slots to private peers (with go-libp2p's default
        limits whatever else is set: 128 KiB each way and 2 minutes per relayed connection; see
        protocol/transports/p2pd/nat.py).
    announce: addresses announced instead of the listen ones (a public address the host does not
        see, e.g. a rented box's behind a provider's 1:1 NAT).
    port_map: ask the home router for a port mapping (UPnP / NAT-PMP).
    """

    reachability: str = "auto"
    autonat_service: bool = True
    relay_client: bool = True
    relays: tuple[str, ...] = ()
    relay_service: bool = True
    announce: tuple[str, ...] = ()
    port_map: bool = False

    def __post_init__(self) -> None:
        for name in ("relays", "announce"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        if self.reachability not in REACHABILITY_MODES:
            raise ValueError(f"reachability={self.reachability!r}: use one of {', '.join(REACHABILITY_MODES)}")


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
        _freeze_addresses(self)
        if self.max_msg_bytes <= 0:
            raise ValueError("max_msg_bytes must be positive")


@dataclass(frozen=True)
class P2pdOptions:
    """GossipSub + Kademlia DHT through the go-libp2p daemon (protocol/transports/p2pd/).

    listen: libp2p listen multiaddrs (``/ip4/127.0.0.1/tcp/0`` picks a free port).
    bootstrap: peers to dial (``.../p2p/<peer-id>``), re-dialed with backoff while down.
    topics: topics subscribed at start.
    peer_cache: JSON file of the peers worth redialing (protocol/transports/p2pd/peer_cache.py):
        dialed at start in rank order, kept up to date; ``note_useful_peers`` feeds its ranking.
    peer_cache_limits: its bounds (entries per address group, never-useful entries, dials);
        ``None`` = PeerCacheLimits' defaults.
    max_msg_bytes: largest payload ``publish`` accepts and readers deliver (at most
        P2PD_MAX_MESSAGE_BYTES: the daemon drops bigger ones silently).
    inbox_size, outbound_size: per-topic inbox and outbound queue lengths.
    inbox_max_bytes: per-topic inbox bytes (beyond them the sender holding the most bytes loses its
        oldest): 4,096 messages of up to 1 MiB would be 4 GiB a topic.
    publish_rate: messages per second the writer hands the daemon at most (in small bursts);
        faster overflows the daemon's per-peer queues.
    publish_wait_s: how long a message waits for its topic's first subscribed peer.
    settle_s: how long a topic must have had subscribed peers before messages go out (the first
        messages to a peer that just appeared are often lost without it).
    start_timeout_s: how long ``start`` waits for the daemon before raising DaemonStartError.
    control_timeout_s: how long one control-socket call may take (longer = a stuck daemon).
    health_interval_s, discovery_interval_s: supervisor and discovery periods.
    backoff_initial_s, backoff_max_s: restart and redial backoff (doubling).
    flood_cut_rate, flood_cut_burst, flood_cut_s: an origin sending more than ``flood_cut_rate``
        messages/s beyond a burst of ``flood_cut_burst`` is cut (dropped and disconnected) for
        ``flood_cut_s`` seconds; ``flood_cut_rate=0`` turns that off.
    nat: reachability from outside: AutoNAT, relays, announced and mapped addresses (NatOptions).
    conn_low, conn_high, conn_grace_s: bounded connections (protocol/transports/p2pd/bounds.py).
        Below ``conn_low`` connections the node looks for more (dials bootstrap and cached peers,
        asks the DHT); from ``conn_low`` on it does neither. Above ``conn_high`` connections are
        closed down to ``conn_low`` (gossip-only peers first, by the daemon's connection manager,
        then the newest), never one younger than ``conn_grace_s``. ``conn_high=0`` = unbounded:
        every discovered peer stays connected, every bootstrap and cached peer is dialed and the
        DHT asked every round.
    relayed_streams, relayed_streams_per_sender: inbound relayed streams read at once, in all and
        from one sender; a newcomer displaces the sender's own oldest, or in a full table the
        heaviest sender's oldest (protocol/transports/p2pd/stream_bounds.py).
    relayed_stream_grace_s, relayed_min_rate: an inbound relayed stream is cut unless it ends within
        ``relayed_stream_grace_s`` + (bytes it delivered) / ``relayed_min_rate`` (bytes/s) of opening.
    direct_peers: our own messages also go on streams to this many of the peers whose groups the
        node used most recently, beside gossip, so that a flood filling the daemons' queues cannot
        cut them off (protocol/transports/p2pd/relayed.py); 0 = gossip only.
    """

    listen: tuple[str, ...] = (LOOPBACK_ANY_PORT,)
    bootstrap: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    peer_cache: Path | None = None
    peer_cache_limits: PeerCacheLimits | None = None
    max_msg_bytes: int = P2PD_MAX_MESSAGE_BYTES
    inbox_size: int = 4096
    inbox_max_bytes: int = 64 * MiB
    outbound_size: int = 4096
    publish_rate: float = 500.0
    publish_wait_s: float = 2.0
    settle_s: float = 0.5
    start_timeout_s: float = 20.0
    control_timeout_s: float = 5.0
    health_interval_s: float = 1.0
    discovery_interval_s: float = 2.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    flood_cut_rate: float = 80.0
    flood_cut_burst: float = 200.0
    flood_cut_s: float = 300.0
    conn_low: int = 6
    conn_high: int = 12
    conn_grace_s: float = 20.0
    relayed_streams: int = 16
    relayed_streams_per_sender: int = 2
    relayed_stream_grace_s: float = 5.0
    relayed_min_rate: float = 4096.0
    direct_peers: int = 4
    nat: NatOptions = NatOptions()

    def __post_init__(self) -> None:
        _freeze_addresses(self)
        if self.conn_high and not 1 <= self.conn_low <= self.conn_high:
            raise ValueError(f"conn_low={self.conn_low}, conn_high={self.conn_high}: bounded connections need "
                             "1 <= conn_low <= conn_high (conn_high=0 for unbounded)")
        if self.conn_high < 0 or self.conn_grace_s < 0:
            raise ValueError(f"conn_high={self.conn_high} and conn_grace_s={self.conn_grace_s} must not be negative")
        if self.relayed_streams < 1 or self.relayed_streams_per_sender < 1:
            raise ValueError(f"relayed_streams={self.relayed_streams} and relayed_streams_per_sender="
                             f"{self.relayed_streams_per_sender} must be at least 1")
        if self.direct_peers < 0:
            raise ValueError(f"direct_peers={self.direct_peers} must not be negative (0 = gossip only)")
        if self.relayed_stream_grace_s <= 0 or self.relayed_min_rate < 0:
            raise ValueError(f"relayed_stream_grace_s={self.relayed_stream_grace_s} must be positive and "
                             f"relayed_min_rate={self.relayed_min_rate} not negative")
        if not 0 < self.max_msg_bytes <= P2PD_MAX_MESSAGE_BYTES:
            raise ValueError(f"max_msg_bytes={self.max_msg_bytes} must be positive and at most what the daemon "
                             f"delivers ({P2PD_MAX_MESSAGE_BYTES})")
