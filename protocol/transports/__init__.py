"""Transports: what moves the protocol's bytes between nodes, one module per kind.

    base        the Transport interface, Received, topic_name and the shared counter names
    options     Libp2pOptions, P2pdOptions: each networked transport's typed options (stdlib only)
    factory     make_transport(seed, options): the transport that the options describe
    memory      MemoryBus / MemoryTransport: in-process, for tests and simulation
    impairment  delay, jitter, loss and partitions on top of any Transport (testnets)
    libp2p/     py-libp2p GossipSub: the thread-safe facade and its trio host (imported on demand)
    p2pd/       GossipSub + DHT through the go-libp2p daemon (imported on demand)

Every per-topic inbox is a protocol/inbox.py FairBuffer; that module stays in protocol/ because the
node's staging (node/peers/ingest.py) and pool use the same fairness rule.
"""
from .base import Received, Transport, topic_name
from .factory import make_transport
from .memory import MemoryBus, MemoryTransport
from .options import Libp2pOptions, P2pdOptions

__all__ = ["Libp2pOptions", "MemoryBus", "MemoryTransport", "P2pdOptions", "Received", "Transport",
           "make_transport", "topic_name"]
