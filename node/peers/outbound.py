"""What this node publishes to the swarm (node/peers/exchange.py `share`, and hints): signed, paced, counted.

`Publisher.publish` signs a message and hands it to the paced outbox (protocol/outbox.py), counted as
`messages_published` and timed as the `publish` phase in the ledger (node/peers/ledger.py); a message
that breaks a limit peers enforce is skipped, logged and counted (`outbound_invalid`). `share`
publishes a round's groups and remembers what one completion token cost on the wire.
"""
from __future__ import annotations

import logging

from node.peers.ledger import Ledger
from node.peers.reasons import OUTBOUND_INVALID
from node.peers.wire import to_wire
from node.train.groups import ScoredGroup
from proto import swarm_pb2
from protocol import Outbox, Transport

log = logging.getLogger(__name__)

# what the paced outbox sends first when a node produces more than its pace (protocol/outbox.py):
# groups peers can train on, then hints and hint requests, then groups without reward variance. A
# fast node answering a hint request each round (several levels each) spent most of its pace on
# hints, and its paced peer trained its groups in 0.72 of rounds (0.92 without the hints)
TRAINABLE, HINTING, NOTHING_TO_TRAIN = 2, 1, 0


class Publisher:
    """Publishes on `swarm`'s topics through `transport`; `shared` and `local_groups`: the last share's."""

    def __init__(self, transport: Transport, outbox: Outbox, swarm: str, ledger: Ledger):
        self.transport, self.outbox, self.swarm, self.ledger = transport, outbox, swarm, ledger
        self.shared = {"wire_bytes": 0, "wire_tokens": 0}
        self.local_groups = 0

    def share(self, round_index: int, groups: list[ScoredGroup], model: swarm_pb2.ModelCard,
              sampling: swarm_pb2.SamplingParams, verifier_digest: str) -> None:
        """Our round's groups, each but the hinted (conditioned on context peers would not see)."""
        self.local_groups = len(groups)
        self.shared = {"wire_bytes": 0, "wire_tokens": 0}  # what one completion token costs on the wire
        for group in groups:
            if group.hint is not None:
                continue
            wire = to_wire(group, round_index, model, sampling, verifier_digest)
            data = self.publish(wire, group.task.ref.key, NOTHING_TO_TRAIN if group.flat else TRAINABLE)
            if data is not None:
                self.shared["wire_bytes"] += len(data)
                self.shared["wire_tokens"] += sum(len(r.completion_ids) for r in group.rollouts)

    def publish(self, message, what: str, priority: int) -> bytes | None:
        """The signed bytes sent now, or None (it waits in the paced outbox, or breaks a limit peers
        enforce)."""
        self.ledger.count("messages_published")
        try:
            with self.ledger.timed("publish"):
                return self.outbox.publish(self.transport, self.swarm, message, priority=priority)
        except ValueError as err:  # skip it and say why
            log.warning("not sharing a %s for %s: %s", type(message).__name__, what, err)
            self.ledger.reject(OUTBOUND_INVALID)
            return None
