"""The SAPO wire protocol (torch-free): identity, signed envelopes, validation, transports.

Modules, each doing one thing:
    errors            Rejected and the closed set of rejection reasons (Reason)
    identity          NodeIdentity (Ed25519 key file, libp2p peer id)
    kinds             the closed set of message kinds and their body types / topics
    envelope          seal / open_envelope: signed bytes with domain separation
    limits            Limits and per-kind schema validation
    replay            per-sender sequence windows, bounded by time and admission
    ratelimit         per-peer token buckets (drop over the limit, score only flooding)
    scoring           PeerScores: reputation, decay, temporary bans
    ingress           Ingress: every check above, in order; never raises
    logthrottle       rate-limited logging of per-message events (peers cannot flood our logs)
    outbox            Sequencer + Outbox: sealing and pacing our own messages
    transport         the Transport interface, Received, topic_name
    inbox             FairBuffer: bounded per-sender buffers where the heaviest sender loses
    memory_transport  MemoryBus / MemoryTransport for tests and simulation
    impairment        delay, jitter, loss and partitions on top of any Transport (testnets)
    testing           builders of valid and hostile messages (tests, testnet)
    bench             micro-benchmark: verified messages/s through the Ingress (python -m protocol.bench)
    p2pd/             P2pdTransport: GossipSub + DHT through the go-libp2p daemon (imported on demand)
    transport_libp2p  Libp2pTransport: py-libp2p GossipSub on a background trio thread (imported on demand)
    libp2p_patches    workarounds for py-libp2p 0.8.1 behaviours, used by transport_libp2p
Imports only the stdlib, cryptography, protobuf and `proto`: never torch, node or policy (the
on-demand transports add multiaddr, and py-libp2p + trio; p2pd/ runs hivemind's daemon binary).
"""
from .envelope import PROTOCOL_VERSION, open_envelope, seal, signed_bytes
from .errors import Reason, Rejected
from .identity import IdentityError, NodeIdentity, peer_id_from_public_key
from .inbox import FairBuffer
from .ingress import Ingress, IngressSnapshot, Verified
from .kinds import Kind, kind_of
from .limits import Limits, validate_hint, validate_hint_request, validate_rollout_group
from .memory_transport import MemoryBus, MemoryTransport
from .outbox import Outbox, Pace, Sequencer
from .ratelimit import RateLimiter, RateLimits
from .replay import ReplayGuard
from .scoring import PeerScoreInfo, PeerScores, ScoreConfig
from .transport import Received, Transport, topic_name

__all__ = [
    "PROTOCOL_VERSION",
    "FairBuffer",
    "IdentityError",
    "Ingress",
    "IngressSnapshot",
    "Kind",
    "Limits",
    "MemoryBus",
    "MemoryTransport",
    "NodeIdentity",
    "Outbox",
    "Pace",
    "PeerScoreInfo",
    "PeerScores",
    "RateLimiter",
    "RateLimits",
    "Reason",
    "Received",
    "Rejected",
    "ReplayGuard",
    "ScoreConfig",
    "Sequencer",
    "Transport",
    "Verified",
    "kind_of",
    "open_envelope",
    "peer_id_from_public_key",
    "seal",
    "signed_bytes",
    "topic_name",
    "validate_hint",
    "validate_hint_request",
    "validate_rollout_group",
]
