"""What the protocol core needs from a network: topic-based publish and a non-blocking drain.

A transport moves opaque bytes. It authenticates nothing above its own channel and validates
nothing: everything it hands out goes through the Ingress. It must never block the training
loop: `publish` enqueues (dropping with a counter when its outbound queue is full) and `drain`
returns whatever has arrived. Backends:
  * protocol/transports/memory.py: in-process bus for tests and simulation.
  * protocol/transports/libp2p/: py-libp2p GossipSub, on its own trio thread.
  * protocol/transports/p2pd/: GossipSub + DHT through the go-libp2p daemon (hivemind's p2pd), a child process.
  * a hivemind backend fits the same shape: `publish` stores the message in the DHT under a
    (topic, time bucket) key with our peer id as subkey, a background poller fills the queues
    that `drain` empties; `peers` are the DHT's routing-table peers.

Contract for implementers: every method may be called from any thread; `subscribe` before
`start` or after; messages a node publishes are never delivered back to it; each topic's inbox is
a FairBuffer (protocol/inbox.py): when full, its HEAVIEST sender loses its oldest message, so
nobody who out-sends the others can push their messages out, and `drain(topic, n)` takes
round-robin across senders; `publish` never raises for network reasons (after `close` it drops
and counts); counters in `stats()` use the COUNTER_* names below where they apply. Optional:
`note_useful_peers(peer_ids)`, through which the node names the peers whose verified groups it
used (the p2pd transport's peer cache keeps those first); `dropped_by_sender()`, the messages each
sender lost to a full inbox (every backend above has it).
"""
from __future__ import annotations

import re
from typing import NamedTuple, Protocol, runtime_checkable

TOPIC_ROOT = "swarm-node"
TOPIC_VERSION = "v1"
_SWARM_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# Shared counter names (a backend may add its own).
COUNTER_PUBLISHED = "published"
COUNTER_DROPPED_OUTBOUND_FULL = "dropped_outbound_full"
COUNTER_DROPPED_OUTBOUND_CLOSED = "dropped_outbound_closed"
COUNTER_RECEIVED = "received"
COUNTER_DROPPED_INBOUND_FULL = "dropped_inbound_full"
COUNTER_DROPPED_UNSUBSCRIBED = "dropped_unsubscribed"


class Received(NamedTuple):
    from_peer: str      # origin: libp2p peer id that published the bytes (GossipSub's from_id)
    data: bytes
    received_at: float  # time.time() when the transport received it
    neighbour: str = ""  # peer id of the connection that delivered them (a relay, or the origin
                         # itself); "" where the transport cannot tell


@runtime_checkable
class Transport(Protocol):
    def start(self) -> None:
        """Starts networking (returns once listening; raises on failure, with a timeout)."""

    def subscribe(self, topic: str) -> None:
        """Starts collecting messages on `topic` for `drain` (idempotent)."""

    def publish(self, topic: str, data: bytes) -> None:
        """Queues `data` for every subscriber of `topic` but us. Never blocks."""

    def drain(self, topic: str, max_items: int | None = None) -> list[Received]:
        """Removes and returns up to `max_items` (all if None) received messages, picked
        round-robin across senders and returned oldest first. Never blocks."""

    def peers(self) -> list[str]:
        """Peer ids currently connected."""

    def listen_addrs(self) -> list[str]:
        """Addresses others can dial us at (multiaddrs for libp2p)."""

    def stats(self) -> dict[str, int]:
        """Counters (published, dropped_outbound_full, ...)."""

    def close(self) -> None:
        """Stops networking and releases every resource (idempotent)."""


def topic_name(swarm: str, kind: str) -> str:
    """e.g. topic_name("demo", "rollouts") == "swarm-node/demo/rollouts/v1"."""
    for label, value in (("swarm", swarm), ("kind", kind)):
        if not _SWARM_NAME_RE.match(value):
            raise ValueError(f"{label} name {value!r} must match {_SWARM_NAME_RE.pattern}")
    return f"{TOPIC_ROOT}/{swarm}/{kind}/{TOPIC_VERSION}"
