"""The node's side of the network that needs no model: its identity file and the transport that
swarm.transport names, its options built from the config's pure-data [swarm] sections (shared by
`join` and `relay`; nothing here imports torch)."""
from __future__ import annotations

from pathlib import Path

from node.config.schema import NodeConfig
from node.config.swarm import SwarmConfig
from protocol import Libp2pOptions, NodeIdentity, make_transport
from protocol.transports.options import NatOptions, P2pdOptions
from protocol.transports.p2pd.peer_cache import PeerCacheLimits

IDENTITY_FILE = "identity.key"
PEER_CACHE_FILE = "peers.json"


def identity_path(cfg: NodeConfig, run_dir: Path) -> Path:
    return Path(cfg.swarm.identity) if cfg.swarm.identity else Path(run_dir) / IDENTITY_FILE


def build_transport(cfg: NodeConfig, identity: NodeIdentity, run_dir: Path, topics: list[str]):
    """The networked transport that swarm.transport names (imported lazily: each pulls its own stack)."""
    kind, s = cfg.swarm.transport, cfg.swarm
    if kind == "p2pd":
        return make_transport(identity.private_seed(), p2pd_options(
            s, topics, peer_cache=run_dir / PEER_CACHE_FILE if s.peer_cache.enabled else None))
    if kind == "libp2p":
        return make_transport(identity.private_seed(), Libp2pOptions(listen=s.listen, bootstrap=s.peers, topics=topics))
    raise ValueError(f"swarm.transport={kind!r} cannot join a network (the memory transport is for tests and "
                     "in-process simulations): set swarm.transport=p2pd or libp2p")


def p2pd_options(s: SwarmConfig, topics: list[str], peer_cache: Path | None = None) -> P2pdOptions:
    """swarm.p2pd's fields (P2pdOptions' own names), the addresses, the peer cache's and NAT's options."""
    return P2pdOptions(listen=s.listen, bootstrap=s.peers, topics=topics, peer_cache=peer_cache,
                       peer_cache_limits=peer_cache_limits(s), nat=nat_options(s), **s.p2pd.model_dump())


def peer_cache_limits(s: SwarmConfig) -> PeerCacheLimits:
    return PeerCacheLimits(**s.peer_cache.model_dump(exclude={"enabled"}))


def nat_options(s: SwarmConfig) -> NatOptions:
    """swarm.nat with the addresses kept at the top of [swarm] (swarm.relays, swarm.announce)."""
    return NatOptions(**s.nat.model_dump(), relays=tuple(s.relays), announce=tuple(s.announce))
