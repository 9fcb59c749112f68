"""SAPO exchange: publish this node's groups and hints, check peers', mix verified groups in.

`SwarmExchange` is a facade: it wires the stages of the inbound path and implements the training
loop's Exchange (share / collect / hints / status / state_dict / close). What crosses the network
is never trusted (proto/PROTOCOL.md); each stage takes a value and passes one forward:
  rollout groups  -> Skim (node/peers/skim.py): an established key's own zero-variance claim is
                     dropped unchecked, kept for the audit
                  -> Gate (node/peers/gate.py): protocol.Ingress (signature, limits, replay, rate, bans)
                  -> Precheck (node/peers/precheck.py): the task rebuilt from the TaskRef (never the
                     sender's copy), lengths bounded; a group whose claimed rewards have no variance
                     goes no further (SAPO would not train it)
                  -> Pooling: a bounded pool (node/peers/pool.py), still unverified
                  -> Verification (node/peers/verification.py), when the mix picks it or the worker
                     verifies it ahead: every reward recomputed by our verifier, the text
                     re-tokenized, each completion's behavior tier picked (node/peers/tiers.py); a
                     group that fails leaves the pool and benches its key (node/peers/bench.py)
                  -> Audit (node/peers/audit.py): each round a latest unverified group of
                     `swarm.audit_per_round` random senders is verified all the same
  hints, hint requests -> HintTraffic (node/peers/exchange_hints.py)
node/peers/intake.py runs a message through them in order. One owner counts and blames: every
stage hands its counts and refusals to the Ledger (node/peers/ledger.py), which alone reports
evidence against a signer to the Ingress. The pool and the ingest worker are handed the stage
objects they run (the Verification, the Intake); nothing calls back up into this class.
  SAPO mixing: J groups with reward variance from the pool (uniform / per_sender / weak_tasks;
  cross-actor: every pooled group for a prompt we sampled first). The round's row has every phase's
  seconds (`t_exchange_<phase>`) beside the counts the compute clock charges (EXCHANGE_WORK).

Where ingest runs (swarm.ingest.mode): "background" (`join`): a worker thread (node/peers/ingest.py)
stages what arrives and runs the checks under a per-round budget, established senders first, and
verifies pooled groups ahead of the picks in its spare budget. "inline" (the in-process testnet,
most tests): `collect` checks what arrived, on the caller's thread, in swarm time (deterministic).
Either way `collect` verifies the picks not verified yet, and the audit, within a budget
(node/peers/verify_budget.py). Peers' completions are scored in killable worker processes
(node/scoring/sandbox.py), started with the exchange when our scorers may need them.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter
from typing import Callable

from node.peers.audit import Audit, Unaudited, audit_size
from node.peers.exchange_hints import HintTraffic, ReceivedHint
from node.peers.exchange_options import ExchangeOptions
from node.peers.exchange_status import RoundBook, exchange_status
from node.peers.gate import Gate
from node.peers.intake import Intake
from node.peers.ingest import IngestWorker
from node.peers.ledger import Ledger
from node.peers.operator import OperatorDecisions, OperatorWatch, apply_decisions
from node.peers.outbound import Publisher
from node.peers.pool import GroupPool
from node.peers.precheck import Pooling, Precheck
from node.peers.skim import Skim
from node.peers.verification import Verification
from node.peers.verify import Refusal, TaskCache, VerifyContext
from node.peers.verify_budget import VerifyBudget
from node.tasks.base import Task
from node.train.groups import ScoredGroup
from proto import swarm_pb2
from protocol import Ingress, NodeIdentity, Outbox, Transport, topic_name

log = logging.getLogger(__name__)


class SwarmExchange:
    """Implements the loop's Exchange over any protocol.Transport; never blocks the loop.

    Thread-safety: one re-entrant lock, the ledger's (node/peers/ledger.py), guards the pool, the
    audit memory, the hint queues, every counter and verification's tokenizer and task cache. The
    ingest worker holds it for the checks of one message at a time (and around, not during, the
    scoring of a group it verifies ahead); `collect` holds it while it verifies its picks and the
    audit (within the verification budget), so `status` may wait that long. The Ingress runs
    outside it (it has its own lock)."""

    def __init__(self, transport: Transport, identity: NodeIdentity, context: VerifyContext,
                 options: ExchangeOptions = ExchangeOptions(), *,
                 weakness: Callable[[ScoredGroup], float] | None = None, state: dict | None = None,
                 operator: OperatorWatch | None = None):
        """`context`: what verifying peers' messages needs (node/peers/verify.py); `options`: how the
        exchange runs (node/peers/exchange_options.py); `weakness`: for the weak_tasks sampler, 1 - our
        pass rate on a group's family; `state`: what `state_dict` saved (a restarted node's)."""
        self.transport, self.peer_id, self.options, self.weakness = transport, identity.peer_id(), options, weakness
        self.clock, self.limits, self.ingest_mode = options.clock, options.limits, options.ingest
        self.ingress = Ingress(self.limits, clock=options.clock, rate_clock=options.swarm_clock)
        self.ledger = Ledger(self.ingress)
        # the context is built once, here: nothing in it changes per message. Its task cache (rebuilt
        # tasks by ref; not thread-safe: used under the ledger's lock alone) and its phase timer are ours
        self.context = dataclasses.replace(context, tasks=TaskCache(context.source), timer=self.ledger.add_seconds)
        self.tasks, self.verifier, self.sandbox = self.context.tasks, context.verifier, context.sandbox
        self.topics = {kind: topic_name(options.swarm, kind) for kind in ("rollouts", "hints", "hint-requests")}
        # windows in time for `join` (background ingest); the inline testnet keeps them in rounds
        self.pool = GroupPool.from_config(options.pool, options.admission, self.ledger.rejected,
                                          time.time if self.ingest_mode == "background" else None,
                                          options.trusted_keys)
        self.verify_budget = VerifyBudget(options.verify_budget_s)  # the training thread's, per round
        # each sender's latest groups not verified (a candidate, a zero-variance claim, or skimmed bytes)
        self.unaudited: Unaudited[object] = Unaudited(audit_size, max_bytes=options.audit_max_bytes)
        # an optional transport capability: p2pd's peer cache ranks useful peers first
        self.note_useful: Callable[[list[str]], None] | None = getattr(transport, "note_useful_peers", None)
        self.rounds = RoundBook()
        self._wire_stages(identity)
        if state is not None:  # before the ingest worker starts: nothing is pooled yet
            self._load_state(state)
        self.operator, self.decisions = operator, OperatorDecisions()  # node/peers/operator.py, read each round
        self._apply_operator()
        for topic in self.topics.values():
            transport.subscribe(topic)
        if self.sandbox is not None and (context.accept_sender_answers
                                         or self.verifier.may_need_sandbox(context.source)):
            self.sandbox.start()  # its workers import for a second or two: now, not in our first round
        admission = self.pool.admission  # young senders are held to their share once a key is established
        self.worker = None if self.ingest_mode == "inline" else IngestWorker(
            transport, list(self.topics.values()), self.intake, options.budget, self.gate.sender_class,
            name=f"ingest-{self.peer_id[-8:]}", young_capped=lambda: admission.any_established,
            ahead=self.verification)
        if self.worker is not None:
            self.worker.start()

    def _wire_stages(self, identity: NodeIdentity) -> None:
        """The stages of the inbound path (module doc), each handed what it needs and nothing above it."""
        options, ledger, pool, unaudited = self.options, self.ledger, self.pool, self.unaudited
        cross_actor = options.composition == "cross_actor"
        self.outbox = Outbox(identity, limits=self.limits, clock=options.clock, pace_clock=options.swarm_clock)
        self.publisher = Publisher(self.transport, self.outbox, options.swarm, ledger)
        self.gate = Gate(self.ingress, ledger, pool)
        self.skim = Skim(ledger, self.ingress, pool, unaudited, self.limits, enabled=not cross_actor)
        self.precheck = Precheck(self.peer_id, ledger, pool, unaudited, self.context, keep_flat=cross_actor)
        # network groups for admission, where the transport knows them
        self.pooling = Pooling(ledger, pool, unaudited, getattr(self.transport, "network_group", lambda peer_id: ""))
        self.hint_traffic = HintTraffic(self.peer_id, self.publisher, self.gate, ledger, self.context, self.limits,
                                        self.clock)
        self.intake = Intake(self.transport, self.topics, ledger, self.skim, self.gate, self.precheck, self.pooling,
                             self.hint_traffic)
        self.verification = Verification(ledger, pool, unaudited, self.context, self.verify_budget,
                                         ahead_until=2 * max(1, options.external_per_round))
        self.audit = Audit(unaudited, self.gate, self.verification, pool, self.peer_id, options.audit_per_round)

    @property
    def rejected(self) -> Counter:
        """Node-level refusals by reason (the Ingress counts its own)."""
        return self.ledger.rejected

    @property
    def observed(self) -> Counter:
        """Things worth counting that are not rejections."""
        return self.ledger.observed

    @property
    def last_round(self) -> dict:
        """What the last collect adds to the round's metrics row."""
        return self.rounds.last_round

    def state_dict(self) -> dict:
        """What a restart must not forget (saved with each checkpoint, node/train/loop.py): admission's
        key records and dedup memory, and the bench. Not the pool (rounds old by then) nor the replay
        windows (a replayed group that was trained is still duplicate_content)."""
        with self.ledger.lock:
            return {"admission": self.pool.admission.state_dict(), "bench": self.pool.bench.state_dict()}

    def _load_state(self, state: dict) -> None:
        try:
            self.pool.admission.load_state_dict(state["admission"])
        except (KeyError, TypeError, ValueError) as err:
            log.warning("ignoring the saved admission state (%s): every peer key starts young", err)
        try:
            self.pool.bench.load_state_dict(state.get("bench", []))  # none before the bench existed
        except ValueError as err:
            log.warning("ignoring the saved bench (%s): no key starts benched", err)

    def close(self) -> None:
        """Stop the ingest worker and the scorer processes (idempotent); the transport is the caller's."""
        if self.worker is not None:
            self.worker.stop()
        if self.sandbox is not None:
            self.sandbox.close()

    # -- outbound ----------------------------------------------------------------------------
    def share(self, round_index: int, groups: list[ScoredGroup]) -> None:
        self.publisher.share(round_index, groups, self.options.model, self.options.sampling, self.verifier.digest)

    def request_hints(self, tasks: list[Task]) -> None:
        self.hint_traffic.request_hints(tasks)

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        self.hint_traffic.publish_hints(task, levels)

    # -- inbound: what the training loop calls ----------------------------------------------------
    def take_hints(self) -> list[ReceivedHint]:
        """Verified hints received since the last call (the caller decides which it wants)."""
        return self.hint_traffic.take_hints()

    def take_hint_requests(self, k: int, answerable: Callable[[Task], bool] = lambda task: True
                           ) -> list[tuple[Task, str]]:
        """Up to k peers' hint requests we can answer, checked now (node/peers/exchange_hints.py)."""
        return self.hint_traffic.take_hint_requests(k, answerable)

    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]:
        """This round's external groups from the pool, verified as they are picked (never waits on
        the network). Inline mode first checks what arrived; background mode only takes what the
        worker checked."""
        self._apply_operator()
        if self.worker is None:
            self.intake.drain(round_index)
        else:
            self.worker.new_round(round_index)
        with self.ledger.lock:
            chosen = self._mix(round_index, local)
        self.ledger.log_round(round_index)  # the picks' refusals too
        return chosen

    def _mix(self, round_index: int, local: list[ScoredGroup]) -> list[ScoredGroup]:
        """The picks (verified by the Verification stage as the pool picks them) and the audit."""
        received, flat = self.ledger.take_arrived()
        self.verify_budget.start_round()
        self.pool.evict(round_index)
        rng = random.Random(f"{self.options.seed}/{round_index}")  # own stream: never perturbs training RNG
        chosen = []
        if self.options.composition == "cross_actor":  # peers' groups for the prompts we just sampled
            chosen = self.pool.take_matching({g.task.prompt_key for g in local if g.hint is None}, self.verification)
        chosen += self.pool.sample(self.options.external_per_round, self.options.sampling_policy, rng, self.weakness,
                                   self.verification)
        audited = self.audit.run(rng)
        work, seconds, refused = self.ledger.take_round()
        useful = sorted({g.origin for g in chosen if not self.pool.admission.is_young(g.origin)})
        if useful and self.note_useful is not None:  # p2pd keeps them connected and first in its cache
            self.note_useful(useful)  # established keys only: a young slot must not buy a flooder that
        self.rounds.record(self, round_index, received, flat, audited, chosen, work, seconds, refused)
        return chosen

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup) -> ScoredGroup | None:
        """A peer's group through both stages of node/peers/verify.py now, or None, counted, if refused."""
        verdict = self.verification.verify_group(sender, msg)
        return None if isinstance(verdict, Refusal) else verdict

    def _apply_operator(self) -> None:
        """The operator file's decisions, if it changed (node/peers/operator.py)."""
        if self.operator is not None and (decisions := self.operator.changed_or_none()) is not None:
            with self.ledger.lock:
                apply_decisions(decisions, self.ingress, self.pool)
                self.decisions = decisions

    def status(self) -> dict:
        """Counters and recent rounds for `swarm-node status` (node/peers/exchange_status.py)."""
        return exchange_status(self)
