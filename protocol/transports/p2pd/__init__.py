"""GossipSub through the go-libp2p daemon bundled with hivemind (see transport.py).

The transport and its daemon (which need multiaddr and the daemon's control code) load on first use,
so a module that needs only a light helper here (nat.py's address rules) imports without them: a
memory-transport machine without libp2p's dependencies (scripts/gpu_run.sh on a GPU box) still runs."""
from __future__ import annotations

from typing import Any

from ..options import P2PD_MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES

__all__ = ["DaemonStartError", "MAX_MESSAGE_BYTES", "P2pdTransport"]


def __getattr__(name: str) -> Any:
    if name == "DaemonStartError":
        from .daemon import DaemonStartError

        return DaemonStartError
    if name == "P2pdTransport":
        from .transport import P2pdTransport

        return P2pdTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
