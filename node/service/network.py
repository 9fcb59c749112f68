"""The node's side of the network that needs no model: its identity file and the transport that
swarm.transport names (shared by `join` and `relay`; nothing here imports torch)."""
from __future__ import annotations

from pathlib import Path

from node.config.schema import NodeConfig
from protocol import Libp2pOptions, NodeIdentity, make_transport

IDENTITY_FILE = "identity.key"
PEER_CACHE_FILE = "peers.json"


def identity_path(cfg: NodeConfig, run_dir: Path) -> Path:
    return Path(cfg.swarm.identity) if cfg.swarm.identity else Path(run_dir) / IDENTITY_FILE


def build_transport(cfg: NodeConfig, identity: NodeIdentity, run_dir: Path, topics: list[str]):
    """The networked transport that swarm.transport names (imported lazily: each pulls its own stack)."""
    kind, s = cfg.swarm.transport, cfg.swarm
    if kind == "p2pd":
        return make_transport(identity.private_seed(), s.p2pd.to_options(
            listen=s.listen, bootstrap=s.peers, topics=topics,
            peer_cache=run_dir / PEER_CACHE_FILE if s.peer_cache.enabled else None,
            peer_cache_limits=s.peer_cache.to_options(), nat=s.nat.to_options(relays=s.relays, announce=s.announce)))
    if kind == "libp2p":
        return make_transport(identity.private_seed(), Libp2pOptions(listen=s.listen, bootstrap=s.peers, topics=topics))
    raise ValueError(f"swarm.transport={kind!r} cannot join a network (the memory transport is for tests and "
                     "in-process simulations): set swarm.transport=p2pd or libp2p")
