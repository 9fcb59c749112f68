"""What arrived, through the inbound stages in order (node/peers/exchange.py wires them):

    rollout group:  Skim -> Gate (the Ingress) -> Precheck -> Pooling   (skim.py, gate.py, precheck.py)
    hint:           Gate -> HintTraffic.take_hint                       (exchange_hints.py)
    hint request:   HintTraffic.queue_requests (skimmed; the Ingress when answered)

Each stage takes a value and passes one forward, or None to stop; the ledger (node/peers/ledger.py)
counts and blames on the way. `Intake.check` runs one staged message (the ingest worker's thread,
node/peers/ingest.py, which stages them first); `Intake.drain` everything that arrived at once
(inline mode: collect's thread, in swarm time). Our code breaking on a peer's data drops that
message, counted as `verify_error`, and goes on.
"""
from __future__ import annotations

import logging
from typing import Callable

from node.peers.exchange_hints import HintTraffic
from node.peers.gate import Gate
from node.peers.ingest import Staged
from node.peers.ledger import Ledger
from node.peers.precheck import Pooling, Precheck
from node.peers.reasons import VERIFY_ERROR
from node.peers.skim import Skim
from protocol import Kind, Transport, Verified

log = logging.getLogger(__name__)

TOPIC_KINDS = {"rollouts": {Kind.ROLLOUT_GROUP}, "hints": {Kind.HINT}, "hint-requests": {Kind.HINT_REQUEST}}


class Intake:
    """`topics`: kind ("rollouts", "hints", "hint-requests") -> this swarm's topic name."""

    def __init__(self, transport: Transport, topics: dict[str, str], ledger: Ledger, skim: Skim, gate: Gate,
                 precheck: Precheck, pooling: Pooling, hints: HintTraffic):
        self.transport, self.topics, self.ledger = transport, topics, ledger
        self.skim, self.gate, self.precheck, self.pooling, self.hints = skim, gate, precheck, pooling, hints
        self.kinds = {topic: TOPIC_KINDS[kind] for kind, topic in topics.items()}  # anything else: wrong_topic

    def check(self, staged: Staged, round_index: int) -> None:
        """One staged message, whatever its topic (the ingest worker's)."""
        item, topic = staged.item, staged.topic
        if topic == self.topics["hint-requests"]:
            self.hints.queue_requests([item])
            return
        if topic == self.topics["rollouts"] and self.skim.skim(item) is None:
            return
        verified = self.gate.accept(item, self.kinds[topic])
        if verified is not None:
            self._guarded(verified.from_peer, lambda: self._take(topic, verified, round_index))

    def drain(self, round_index: int) -> None:
        """Everything that arrived, as every release so far did it: per topic, the Ingress over the
        whole drain first (rate limits see the burst), then node-level checks. Hint requests only
        wait (node/peers/hint_requests.py)."""
        self.hints.queue_requests(self.transport.drain(self.topics["hint-requests"]))
        for kind in ("hints", "rollouts"):
            topic = self.topics[kind]
            drained = self.transport.drain(topic)
            if kind == "rollouts":
                drained = [item for item in drained if self.skim.skim(item) is not None]
            for verified in self.gate.accept_many(drained, self.kinds[topic]):
                self._guarded(verified.from_peer, lambda: self._take(topic, verified, round_index))

    def _take(self, topic: str, verified: Verified, round_index: int) -> None:
        if topic != self.topics["rollouts"]:
            self.hints.take_hint(verified)
            return
        candidate = self.precheck.check(verified)
        if candidate is not None:
            self.pooling.put(candidate, verified, round_index)

    def _guarded(self, from_peer: str, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:  # our code broke on peer data: drop that message, count it, go on
            log.warning("dropping a message from %s: %r", from_peer, err, exc_info=True,
                        extra={"event": "verify_error", "peer_id": from_peer, "error": repr(err)})
            self.ledger.reject(VERIFY_ERROR)
