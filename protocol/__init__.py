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
    inbox             FairBuffer: bounded per-sender buffers where the heaviest sender loses
    testing           builders of valid and hostile messages (tests, testnet)
    bench             micro-benchmark: verified messages/s through the Ingress (python -m protocol.bench)
    transports/       the Transport interface and every kind of transport (its own docstring lists
                      them): memory, impairment, libp2p/ (py-libp2p on a trio thread) and p2pd/ (the
                      go-libp2p daemon), built from typed options by make_transport
Imports only the stdlib, cryptography, protobuf and `proto` (its stdlib plumbing is protocol/ground.py:
atomic writes, parent death): never torch, policy or node (the on-demand transports add
multiaddr, and py-libp2p + trio; p2pd/ runs hivemind's daemon binary).
"""
from .envelope import PROTOCOL_VERSION, open_envelope, seal, signed_bytes
from .errors import Reason, Rejected
from .identity import IdentityError, NodeIdentity, peer_id_from_public_key
from .inbox import FairBuffer
from .ingress import Ingress, IngressSnapshot, Verified
from .kinds import Kind, kind_of
from .limits import Limits, validate_hint, validate_hint_request, validate_rollout_group
from .outbox import Outbox, Pace, Sequencer
from .ratelimit import RateLimiter, RateLimits
from .replay import ReplayGuard
from .scoring import PeerScoreInfo, PeerScores, ScoreConfig
from .transports import (
    Libp2pOptions,
    MemoryBus,
    MemoryTransport,
    P2pdOptions,
    Received,
    Transport,
    make_transport,
    topic_name,
)

__all__ = [
    "PROTOCOL_VERSION",
    "FairBuffer",
    "IdentityError",
    "Ingress",
    "IngressSnapshot",
    "Kind",
    "Libp2pOptions",
    "Limits",
    "MemoryBus",
    "MemoryTransport",
    "NodeIdentity",
    "Outbox",
    "P2pdOptions",
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
    "make_transport",
    "open_envelope",
    "peer_id_from_public_key",
    "seal",
    "signed_bytes",
    "topic_name",
    "validate_hint",
    "validate_hint_request",
    "validate_rollout_group",
]
