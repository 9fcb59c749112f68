"""swarm.v1 wire messages, generated from proto/swarm.proto.

The generated modules live in proto/_generated/ (git-ignored, never edited by hand). Importing this
package rebuilds them first if they are missing or older than swarm.proto, so a fresh checkout
works even when scripts/gen_proto.sh was never run.

    from proto import swarm_pb2                 # all messages
    from proto import Envelope, RolloutGroup    # the common ones, re-exported
    from proto import swarm_pb2_grpc            # NodeControl stubs (imports grpc: loaded lazily)
    from proto import p2pd_control_pb2          # the p2pd daemon's control messages (built on first use
                                                # from the installed hivemind's p2pd.proto)

Neither grpcio-tools nor hivemind is needed to import this package where the code is already built.
"""
from __future__ import annotations

from typing import Any

from ._codegen import ensure_daemon_generated, ensure_generated

ensure_generated()

from ._generated import swarm_pb2  # noqa: E402  (must follow ensure_generated)

Envelope = swarm_pb2.Envelope
TaskRef = swarm_pb2.TaskRef
ModelCard = swarm_pb2.ModelCard
SamplingParams = swarm_pb2.SamplingParams
Completion = swarm_pb2.Completion
RolloutGroup = swarm_pb2.RolloutGroup
Hint = swarm_pb2.Hint
HintRequest = swarm_pb2.HintRequest
StatusRequest = swarm_pb2.StatusRequest
StatusReply = swarm_pb2.StatusReply
PeerInfo = swarm_pb2.PeerInfo
RoundUsage = swarm_pb2.RoundUsage

__all__ = [
    "swarm_pb2",
    "swarm_pb2_grpc",
    "p2pd_control_pb2",
    "Envelope",
    "TaskRef",
    "ModelCard",
    "SamplingParams",
    "Completion",
    "RolloutGroup",
    "Hint",
    "HintRequest",
    "StatusRequest",
    "StatusReply",
    "PeerInfo",
    "RoundUsage",
]


def __getattr__(name: str) -> Any:
    # The gRPC stubs import grpc (~0.2 s); the wire protocol never needs them.
    if name == "swarm_pb2_grpc":
        from ._generated import swarm_pb2_grpc

        return swarm_pb2_grpc
    if name == "p2pd_control_pb2":  # only the p2pd transport needs it; generated where hivemind is installed
        ensure_daemon_generated()
        from ._generated import p2pd_control_pb2

        return p2pd_control_pb2
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
