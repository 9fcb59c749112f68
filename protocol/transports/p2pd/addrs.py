"""Multiaddr and peer-id conversions between our strings and the daemon's binary fields."""
from __future__ import annotations

import functools

import multiaddr

from ...identity import base58btc

_BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id_bytes(peer_id: str) -> bytes:
    """The binary multihash of a base58 peer id ("12D3KooW..."), as the daemon's `peer` fields want."""
    number = 0
    for char in peer_id:
        index = _BASE58_ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"{peer_id!r} is not a base58 peer id (bad character {char!r})")
        number = number * 58 + index
    zeros = len(peer_id) - len(peer_id.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body


@functools.lru_cache(maxsize=4096)
def peer_id_text(raw: bytes) -> str:
    """Memoized: every received message names its origin, and base58 was a third of the reader's time."""
    return base58btc(raw)


def split_peer_addr(addr: str) -> tuple[str, bytes]:
    """'/ip4/1.2.3.4/tcp/5/p2p/12D3KooW...' -> (peer id, binary transport multiaddr)."""
    try:
        parsed = multiaddr.Multiaddr(addr)
        peer_id = parsed.value_for_protocol("p2p")
        transport = parsed.decapsulate(f"/p2p/{peer_id}")
    except Exception as err:  # noqa: BLE001 - the library raises several types
        raise ValueError(f"peer address {addr!r} is not a multiaddr ending in /p2p/<peer-id> "
                         f"(e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...): {err}") from None
    if not peer_id:
        raise ValueError(f"peer address {addr!r} lacks /p2p/<peer-id>")
    return str(peer_id), transport.to_bytes()


def addr_text(raw: bytes) -> str | None:
    """A binary multiaddr from the daemon as text (None if it cannot be decoded)."""
    try:
        return str(multiaddr.Multiaddr(raw))
    except Exception:  # noqa: BLE001
        return None
