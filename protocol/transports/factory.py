"""One transport from its typed options: Libp2pOptions -> py-libp2p, P2pdOptions -> the go-libp2p
daemon. Each network stack is imported only when its transport is built."""
from __future__ import annotations

from .base import Transport
from .options import Libp2pOptions, P2pdOptions


def make_transport(seed: bytes, options: Libp2pOptions | P2pdOptions) -> Transport:
    """The transport that `options` describe, with the peer id of the 32-byte Ed25519 `seed`."""
    if isinstance(options, P2pdOptions):
        from .p2pd import P2pdTransport

        return P2pdTransport(seed, options)
    if isinstance(options, Libp2pOptions):
        from .libp2p import Libp2pTransport

        return Libp2pTransport(seed, options)
    raise TypeError(f"no transport for options of type {type(options).__name__}: "
                    "pass Libp2pOptions or P2pdOptions")
