"""py-libp2p GossipSub on a background trio thread (imported on demand: pulls multiaddr, trio and
py-libp2p). facade.py: Libp2pTransport, the thread-safe API; host.py: the trio host behind it;
patches.py: workarounds for py-libp2p 0.8.1 behaviours."""
from ..options import MiB, Libp2pOptions
from .facade import Libp2pTransport, TransportStartError, keypair_from_seed, peer_id_from_seed

__all__ = ["Libp2pOptions", "Libp2pTransport", "MiB", "TransportStartError", "keypair_from_seed",
           "peer_id_from_seed"]
