"""The hint half of the SAPO exchange (node/peers/exchange.py): hints and hint requests, both ways.

    out: our hint requests (prompts we failed) and the hints we write for peers' requests
    in:  hints (rebuilt, checked for the answer, node/peers/verify.py) and peers' requests, which wait
         unverified until we can answer one (node/peers/hint_requests.py) and only then meet the Ingress

`HintTraffic` is a mixin of `SwarmExchange`: it uses the exchange's lock, counters, Ingress, task
cache and publishing (`_publish`, `_accept`, `context`, `_refuse`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from node.peers.peek import peek_task_ref
from node.peers.reasons import HINT_REQUEST_UNKNOWN
from node.tasks.base import Task
from node.peers.verify import Refusal, verify_hint, verify_hint_request
from node.peers.wire import LEVEL_CODES, LEVEL_NAMES, wire_task_ref
from proto import swarm_pb2
from protocol import Kind, Verified
from protocol.transports.base import Received

# what the paced outbox sends first when a node produces more than its pace (protocol/outbox.py):
# groups peers can train on, then hints and hint requests, then groups without reward variance. A
# fast node answering a hint request each round (several levels each) spent most of its pace on
# hints, and its paced peer trained its groups in 0.72 of rounds (0.92 without the hints)
TRAINABLE, HINTING, NOTHING_TO_TRAIN = 2, 1, 0
REBUILDS_PER_ROUND = 8  # waiting hint requests whose task is rebuilt per call (the rest wait a round)


@dataclass(frozen=True)
class ReceivedHint:
    task: Task
    level: str
    text: str
    sender: str


class HintTraffic:
    """Hints and hint requests over the exchange's transport (module doc)."""

    def request_hints(self, tasks: list[Task]) -> None:
        for task in tasks:
            self._publish(swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref)), task.ref.key, HINTING)

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        for level, text in levels.items():
            self._publish(swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=LEVEL_CODES[level], text=text),
                          task.ref.key, HINTING)

    def _queue_hint_requests(self, items: list[Received]) -> None:
        """Peeked at, not checked: a request waits until we can answer it (node/peers/hint_requests.py).
        One that does not parse as a request goes through the Ingress now, which says why."""
        for item in items:
            ref = peek_task_ref(item, self.limits)
            if ref is None:
                self._accept(item, {Kind.HINT_REQUEST})  # refused: counted and charged
                continue
            with self._lock:
                self._requests.add(item, ref)

    def _take_hint(self, verified: Verified) -> None:
        if verified.sender == self.peer_id:
            return
        hint = verified.body
        with self._lock:
            task = verify_hint(hint, self.context)
        if isinstance(task, Refusal):
            self._refuse(verified.sender, task)
            return
        with self._lock:
            self._hints.append(ReceivedHint(task, LEVEL_NAMES[hint.level], hint.text, verified.sender))

    def take_hints(self) -> list[ReceivedHint]:
        """Verified hints received since the last call (the caller decides which it wants)."""
        with self._lock:
            hints = list(self._hints)
            self._hints.clear()
            return hints

    def take_hint_requests(self, k: int, answerable: Callable[[Task], bool] = lambda task: True
                           ) -> list[tuple[Task, str]]:
        """Up to k peers' hint requests that `answerable` says we can answer, oldest first, each
        checked by the Ingress and node/peers/verify.py now (the rest keep waiting, node/peers/hint_requests.py).
        At most REBUILDS_PER_ROUND waiting requests have their task rebuilt per call (an 8-node
        swarm asks about 20 new prompts a round): the others are looked at in a later round."""
        served: list[tuple[Task, str]] = []
        rebuilds = 0
        with self._lock:
            for key, waiting in self._requests.waiting(self.clock()):
                if len(served) >= k:
                    break
                if waiting.task is None:
                    if rebuilds == REBUILDS_PER_ROUND:
                        continue
                    rebuilds += 1
                    try:
                        waiting.task = self.tasks.rebuild(waiting.ref)
                    except ValueError:  # a family we lack: not the sender's fault
                        self._requests.pop(key)
                        self.rejected[HINT_REQUEST_UNKNOWN] += 1
                        continue
                if not answerable(waiting.task):
                    continue
                self._requests.pop(key)
                request = self._check_hint_request(waiting.item)
                if request is not None:
                    served.append(request)
        return served

    def _check_hint_request(self, item: Received) -> tuple[Task, str] | None:
        verified = self._accept(item, {Kind.HINT_REQUEST})
        if verified is None or verified.sender == self.peer_id:
            return None
        task = verify_hint_request(verified.body, self.context)
        if isinstance(task, Refusal):
            self._refuse(verified.sender, task)
            return None
        return task, verified.sender
