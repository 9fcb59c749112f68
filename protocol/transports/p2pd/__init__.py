"""GossipSub through the go-libp2p daemon bundled with hivemind (see transport.py)."""
from ..options import P2PD_MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from .daemon import DaemonStartError
from .transport import P2pdTransport

__all__ = ["DaemonStartError", "MAX_MESSAGE_BYTES", "P2pdTransport"]
