"""One copy of each message, when two paths bring it: gossip and our own streams (relayed.py).

A peer that uses our groups gets each of them twice, by GossipSub and on a direct stream, so that a
flood filling the daemons' fixed queues cannot cut it off from us. The receiving transport keeps a
bounded memory of recent messages (a 16-byte BLAKE2b digest of sender, topic and payload, and the
path that brought it first) and drops a copy that arrives on the *other* path, counted. The sender
is in the digest (gossip's signed origin, a stream's authenticated remote peer): otherwise a peer
that forwarded an honest envelope on a stream first would have the honest origin's own gossip copy
dropped, and the message delivered under the forwarder's name. A copy on the same
path is passed on: resending a message is the node's replay checks' business (proto/PROTOCOL.md),
not the transport's. The digest covers the signed envelope's bytes, so two copies are the same
message from the same signer; dropping one takes nothing from anyone."""
from __future__ import annotations

import collections
import hashlib

GOSSIP, STREAM = "gossip", "stream"  # the two paths a message can arrive on
REMEMBERED = 16384  # recent messages whose digest is kept: 40 s of a 400 msg/s flood, 1 MiB or so


def digest(sender: str, topic: str, data: bytes) -> bytes:
    return hashlib.blake2b(f"{sender}\0{topic}\0".encode() + data, digest_size=16).digest()


class CrossPathDedup:
    """Not thread-safe: the caller holds the transport's lock."""

    def __init__(self, capacity: int = REMEMBERED) -> None:
        self.capacity = capacity
        self._first_path: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def is_copy(self, key: bytes, path: str) -> bool:
        """True if the message `key` already came on the other path (drop it); else remembers it."""
        first = self._first_path.get(key)
        if first is not None:
            return first != path
        self._first_path[key] = path
        if len(self._first_path) > self.capacity:
            self._first_path.popitem(last=False)
        return False
