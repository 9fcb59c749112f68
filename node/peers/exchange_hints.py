"""The hint half of the SAPO exchange (node/peers/exchange.py): hints and hint requests, both ways.

    out: our hint requests (prompts we failed) and the hints we write for peers' requests
    in:  hints (authenticated by the Ingress stage, rebuilt and checked for the answer,
         node/peers/verify.py) and peers' requests, which are skimmed (node/peers/skim.py) and wait
         unchecked until we can answer one (node/peers/hint_requests.py), and only then meet the Ingress

`HintTraffic` is a stage object the exchange wires: it publishes through the Publisher
(node/peers/outbound.py), authenticates through the Gate (node/peers/gate.py) and hands refusals to
the ledger (node/peers/ledger.py), under whose lock its queues live.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from node.peers.gate import Gate
from node.peers.hint_requests import HintRequestQueue
from node.peers.ingest import ESTABLISHED
from node.peers.ledger import Ledger
from node.peers.outbound import HINTING, Publisher
from node.peers.reasons import HINT_REQUEST_UNKNOWN
from node.peers.skim import skim_task_ref
from node.tasks.base import Task
from node.peers.verify import Refusal, VerifyContext, verify_hint, verify_hint_request
from node.peers.wire import LEVEL_CODES, LEVEL_NAMES, wire_task_ref
from proto import swarm_pb2
from protocol import Kind, Limits, Verified
from protocol.transports.base import Received

REBUILDS_PER_ROUND = 8  # waiting hint requests whose task is rebuilt per call (the rest wait a round)


@dataclass(frozen=True)
class ReceivedHint:
    task: Task
    level: str
    text: str
    sender: str


class HintTraffic:
    """Hints and hint requests over the exchange's transport (module doc). Stage: a Verified hint ->
    kept for `take_hints`; a Received hint request -> waiting (`queue_requests`) until
    `take_hint_requests` checks it."""

    def __init__(self, peer_id: str, publisher: Publisher, gate: Gate, ledger: Ledger, context: VerifyContext,
                 limits: Limits, clock: Callable[[], float]):
        self.peer_id, self.publisher, self.gate, self.ledger = peer_id, publisher, gate, ledger
        self.context, self.limits, self.clock = context, limits, clock
        self.hints: deque[ReceivedHint] = deque(maxlen=256)  # bounded: nobody may be taking them
        # unchecked until we can answer one (node/peers/hint_requests.py); established origins' kept first
        self.requests = HintRequestQueue(established=lambda host: gate.sender_class(host) == ESTABLISHED)

    def request_hints(self, tasks: list[Task]) -> None:
        for task in tasks:
            self.publisher.publish(swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref)), task.ref.key, HINTING)

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        for level, text in levels.items():
            hint = swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=LEVEL_CODES[level], text=text)
            self.publisher.publish(hint, task.ref.key, HINTING)

    def queue_requests(self, items: list[Received]) -> None:
        """Skimmed, not checked: a request waits until we can answer it (node/peers/hint_requests.py).
        One that does not parse as a request goes through the Ingress now, which says why."""
        for item in items:
            ref = skim_task_ref(item, self.limits)
            if ref is None:
                self.gate.accept(item, {Kind.HINT_REQUEST})  # refused: counted and charged
                continue
            with self.ledger.lock:
                self.requests.add(item, ref)

    def take_hint(self, verified: Verified) -> None:
        """An authenticated hint: kept if its task rebuilds and it does not give the answer away."""
        if verified.sender == self.peer_id:
            return
        hint = verified.body
        with self.ledger.lock:
            task = verify_hint(hint, self.context)
        if isinstance(task, Refusal):
            self.ledger.refuse(verified.sender, task)
            return
        with self.ledger.lock:
            self.hints.append(ReceivedHint(task, LEVEL_NAMES[hint.level], hint.text, verified.sender))

    def take_hints(self) -> list[ReceivedHint]:
        """Verified hints received since the last call (the caller decides which it wants)."""
        with self.ledger.lock:
            hints = list(self.hints)
            self.hints.clear()
            return hints

    def take_hint_requests(self, k: int, answerable: Callable[[Task], bool] = lambda task: True
                           ) -> list[tuple[Task, str]]:
        """Up to k peers' hint requests that `answerable` says we can answer, oldest first, each
        checked by the Ingress and node/peers/verify.py now (the rest keep waiting, node/peers/hint_requests.py).
        At most REBUILDS_PER_ROUND waiting requests have their task rebuilt per call (an 8-node
        swarm asks about 20 new prompts a round): the others are looked at in a later round."""
        served: list[tuple[Task, str]] = []
        rebuilds = 0
        with self.ledger.lock:
            for key, waiting in self.requests.waiting(self.clock()):
                if len(served) >= k:
                    break
                if waiting.task is None:
                    if rebuilds == REBUILDS_PER_ROUND:
                        continue
                    rebuilds += 1
                    try:
                        waiting.task = self.context.tasks.rebuild(waiting.ref)
                    except ValueError:  # a family we lack: not the sender's fault
                        self.requests.pop(key)
                        self.ledger.reject(HINT_REQUEST_UNKNOWN)
                        continue
                if not answerable(waiting.task):
                    continue
                self.requests.pop(key)
                request = self._check_hint_request(waiting.item)
                if request is not None:
                    served.append(request)
        return served

    def _check_hint_request(self, item: Received) -> tuple[Task, str] | None:
        verified = self.gate.accept(item, {Kind.HINT_REQUEST})
        if verified is None or verified.sender == self.peer_id:
            return None
        task = verify_hint_request(verified.body, self.context)
        if isinstance(task, Refusal):
            self.ledger.refuse(verified.sender, task)
            return None
        return task, verified.sender
