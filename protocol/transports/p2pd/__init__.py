"""GossipSub through the go-libp2p daemon bundled with hivemind (see transport.py)."""
from .daemon import DaemonStartError
from .transport import MAX_MESSAGE_BYTES, P2pdTransport

__all__ = ["DaemonStartError", "MAX_MESSAGE_BYTES", "P2pdTransport"]
