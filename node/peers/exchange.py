"""SAPO exchange: publish this node's groups and hints, verify peers', mix verified groups in.

What crosses the network is never trusted (proto/PROTOCOL.md); what the Ingress lets through is
verified by node/peers/verify.py, and its refusals are counted, logged and (where they are evidence
against the signer) reported to the Ingress here, in `_refuse`:
  transport bytes -> protocol.Ingress (signature, limits, replay, rate, bans)
  rollout groups  -> the cheap checks (node/peers/verify.py precheck_group): the task rebuilt from the
                     TaskRef (never the sender's copy), lengths bounded; a group whose claimed
                     rewards have no variance goes no further (SAPO would not train it)
                  -> a bounded pool (node/peers/pool.py), still unverified
                  -> when the mix picks it (or the worker verifies it ahead): every reward recomputed
                     by our verifier (a disagreeing claim counts against the signer), the text
                     re-tokenized, each completion's behavior tier picked (node/peers/tiers.py); a
                     group that fails leaves the pool and benches its key (node/peers/bench.py)
                  -> an audit: each round a latest unverified group of `swarm.audit_per_round`
                     random senders is verified all the same: a liar is caught even if never picked
  An established key's own zero-variance claim is dropped after a peek (node/peers/peek.py).
  hints           -> rebuild the task; one containing the answer counts against the signer; kept
                     only if we asked (node/train/hints.py)
  hint requests   -> wait unverified until we can answer one (node/peers/hint_requests.py)
  SAPO mixing: J groups with reward variance from the pool (uniform / per_sender / weak_tasks;
  cross-actor: every pooled group for a prompt we sampled first). The round's row has every phase's
  seconds (`t_exchange_<phase>`) beside the counts the compute clock charges (EXCHANGE_WORK).

Where ingest runs (swarm.ingest.mode): "background" (`join`): a worker thread (node/peers/ingest.py)
runs the cheap checks under a per-round budget, established senders first, and verifies pooled
groups ahead of the picks in its spare budget. "inline" (the in-process testnet, most tests):
`collect` checks what arrived, on the caller's thread, in swarm time (deterministic). Either way
`collect` verifies the picks not verified yet, and the audit, within a budget
(node/peers/verify_budget.py). Peers' completions are scored in killable worker processes
(node/scoring/sandbox.py), started with the exchange when our scorers may need them.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import Counter, deque
from typing import Callable

from node.peers.audit import Unaudited, audit_size
from node.peers.exchange_hints import NOTHING_TO_TRAIN, TRAINABLE, HintTraffic, ReceivedHint
from node.peers.exchange_options import ExchangeOptions
from node.peers.exchange_status import EXCHANGE_WORK, exchange_status, round_row
from node.train.groups import ScoredGroup
from node.peers.hint_requests import HintRequestQueue
from node.peers.operator import OperatorDecisions, OperatorWatch, apply_decisions
from node.peers.peek import flat_claim_of_origin
from node.peers.ingest import ESTABLISHED, YOUNG, IngestWorker, Staged
from node.peers.pool import GroupPool, PoolEntry
from node.peers.reasons import DISAGREES, OUTBOUND_INVALID, OWN, VERIFY_ERROR
from node.peers.refusals import Refusals
from node.peers.signers import SEVERAL, HostSigners
from node.peers.verify_budget import VerifyBudget
from node.peers.verify import (Candidate, Refusal, TaskCache, VerifyContext, claims_flat, precheck_group,
                               score_candidate, timed, verify_candidate)
from node.peers.wire import to_wire
from policy.types import TIERS
from proto import swarm_pb2
from protocol import Ingress, Kind, NodeIdentity, Outbox, Transport, Verified, topic_name
from protocol.transports.base import Received

log = logging.getLogger(__name__)
# the exchange work a round row counts, what the compute clock charges (node/testnet/clock.py):
# messages through the Ingress (signature, limits, replay), peer groups re-verified (re-score,
# re-tokenize, tier), messages signed and published, and zero-variance groups of established
# senders dropped after a peek (node/peers/peek.py), never checked
# where the exchange's seconds go, each a `t_exchange_<phase>` of the round's row (no two overlap):
# the peek that drops established senders' zero-variance claims (skim), the Ingress, the cheap
# checks (precheck, less the task rebuild, which is its own phase), the expensive ones (score, retokenize, tier: the mix's picks and the audit), signing and publishing.
# In background mode ingress and precheck run on the worker thread; node/train/loop.py adds
# `t_exchange_hints` (answering peers' requests).
EXCHANGE_PHASES = ("skim", "ingress", "precheck", "rebuild", "score", "retokenize", "tier", "publish")
# what `status` sums over every round: the work, groups received / used / audited / verified unused,
# and each phase's seconds
TOTALED = (*EXCHANGE_WORK, "external_received", "external_used", "groups_audited", "groups_verified_unused",
           *(f"t_exchange_{phase}" for phase in EXCHANGE_PHASES))
YOUNG_FLAT_POOLED = 2  # a young key's pooled groups beyond which its zero-variance claims are skimmed


class SwarmExchange(HintTraffic):
    """Implements the loop's Exchange over any protocol.Transport; never blocks the loop.

    Thread-safety: `_lock` guards the pool, the hint queues, every counter and verification's
    tokenizer and task cache. The ingest worker holds it for the cheap checks of one message at a
    time; `collect` holds it while it verifies its picks (J groups, bounded), so `status` may wait
    that long. The Ingress runs outside it (it has its own lock)."""

    def __init__(self, transport: Transport, identity: NodeIdentity, context: VerifyContext,
                 options: ExchangeOptions = ExchangeOptions(), *,
                 weakness: Callable[[ScoredGroup], float] | None = None, state: dict | None = None,
                 operator: OperatorWatch | None = None):
        """`context`: what verifying peers' messages needs (node/peers/verify.py); `options`: how the
        exchange runs (node/peers/exchange_options.py); `weakness`: for the weak_tasks sampler, 1 - our
        pass rate on a group's family; `state`: what `state_dict` saved (a restarted node's)."""
        self.transport = transport
        self.peer_id = identity.peer_id()
        self.options = options
        self.weakness = weakness
        # the context is built once, here: nothing in it changes per message. Its task cache (rebuilt
        # tasks by ref; not thread-safe: used under _lock alone) and its phase timer are this exchange's
        self.context = dataclasses.replace(context, tasks=TaskCache(context.source), timer=self._add_seconds)
        self.tasks, self.verifier, self.sandbox = self.context.tasks, context.verifier, context.sandbox
        self.clock, self.limits = options.clock, options.limits
        self.ingress = Ingress(self.limits, clock=options.clock, rate_clock=options.swarm_clock)
        self.outbox = Outbox(identity, limits=self.limits, clock=options.clock, pace_clock=options.swarm_clock)
        self.topics = {kind: topic_name(options.swarm, kind) for kind in ("rollouts", "hints", "hint-requests")}
        self._topic_kinds = {self.topics["rollouts"]: {Kind.ROLLOUT_GROUP}, self.topics["hints"]: {Kind.HINT},
                             self.topics["hint-requests"]: {Kind.HINT_REQUEST}}  # anything else: wrong_topic
        self.rejected: Counter[str] = Counter()  # node-level reasons (Ingress counts its own)
        # windows in time for `join` (background ingest); the inline testnet keeps them in rounds
        self.ingest_mode = options.ingest
        self.pool = GroupPool.from_config(options.pool, options.admission, self.rejected,
                                          time.time if self.ingest_mode == "background" else None,
                                          options.trusted_keys)
        self._init_counters()
        self.verify_budget = VerifyBudget(options.verify_budget_s)  # the training thread's, per round
        self._hints: deque[ReceivedHint] = deque(maxlen=256)  # bounded: nobody may be taking them
        self._signers = HostSigners()  # the key each delivering host publishes for (node/peers/signers.py)
        # unverified until we can answer one (node/peers/hint_requests.py); established origins' kept first
        self._requests = HintRequestQueue(established=lambda peer: self._sender_class(peer) == ESTABLISHED)
        # each sender's latest groups not verified (a candidate, a zero-variance claim, or skimmed bytes)
        self._unaudited: Unaudited[Candidate | swarm_pb2.RolloutGroup | Received] = Unaudited(
            audit_size, max_bytes=options.audit_max_bytes)
        # optional transport capabilities: p2pd's peer cache ranks useful peers first; network groups for admission
        self._note_useful: Callable[[list[str]], None] | None = getattr(transport, "note_useful_peers", None)
        self._network_group: Callable[[str], str] = getattr(transport, "network_group", lambda peer_id: "")
        # re-entrant: collect verifies its picks holding it (the pool's callback counts under it too);
        # verification's tokenizer and task cache are used under it alone, from either thread
        self._lock = threading.RLock()
        self.refusals = Refusals(self.rejected, self._lock)  # counted and logged (rate-limited)
        if state is not None:  # before the ingest worker starts: nothing is pooled yet
            self._load_state(state)
        self.operator, self.decisions = operator, OperatorDecisions()  # node/peers/operator.py, read each round
        self._apply_operator()
        for topic in self.topics.values():
            transport.subscribe(topic)
        if self.sandbox is not None and (context.accept_sender_answers
                                         or self.verifier.may_need_sandbox(context.source)):
            self.sandbox.start()  # its workers import for a second or two: now, not in our first round
        self._worker = None if self.ingest_mode == "inline" else IngestWorker(
            transport, list(self.topics.values()), self._verify_staged, options.budget, self._sender_class,
            name=f"ingest-{self.peer_id[-8:]}", young_capped=lambda: self.pool.admission.any_established,
            ahead=self._verify_ahead)
        if self._worker is not None:  # started once assigned: its callback reads self._worker
            self._worker.start()

    def _init_counters(self) -> None:
        self.observed: Counter[str] = Counter()  # things worth counting that are not rejections
        self.used_by_sender: Counter[str] = Counter()
        self.tiers_used: Counter[str] = Counter()  # behavior tier -> external rollouts trained on
        self.last_round: dict = {}
        self.history: deque[dict] = deque(maxlen=100)  # per-round usage, for `swarm-node status`
        self.totals: Counter[str] = Counter()  # TOTALED over every round, for `swarm-node status`
        self._local_groups = 0
        self._shared = {"wire_bytes": 0, "wire_tokens": 0}
        self._arrived = {"received": 0, "flat": 0}  # since the last collect
        self._work: Counter[str] = Counter()  # EXCHANGE_WORK since the last collect
        self._seconds: Counter[str] = Counter()  # EXCHANGE_PHASES since the last collect
        self._rejected_at_last_collect = 0

    def state_dict(self) -> dict:
        """What a restart must not forget (saved with each checkpoint, node/train/loop.py): admission's
        key records and dedup memory, and the bench. Not the pool (rounds old by then) nor the replay
        windows (a replayed group that was trained is still duplicate_content)."""
        with self._lock:
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
        if self._worker is not None:
            self._worker.stop()
        if self.sandbox is not None:
            self.sandbox.close()

    # -- outbound ----------------------------------------------------------------------------
    def share(self, round_index: int, groups: list[ScoredGroup]) -> None:
        self._local_groups = len(groups)
        self._shared = {"wire_bytes": 0, "wire_tokens": 0}  # what one completion token costs on the wire
        for group in groups:
            if group.hint is not None:  # conditioned on context peers would not see
                continue
            wire = to_wire(group, round_index, self.options.model, self.options.sampling, self.verifier.digest)
            data = self._publish(wire, group.task.ref.key, NOTHING_TO_TRAIN if group.flat else TRAINABLE)
            if data is not None:
                self._shared["wire_bytes"] += len(data)
                self._shared["wire_tokens"] += sum(len(r.completion_ids) for r in group.rollouts)

    def _publish(self, message, what: str, priority: int) -> bytes | None:
        """The signed bytes sent now, or None (it waits in the paced outbox, or breaks a limit peers
        enforce)."""
        self._count(self._work, "messages_published")
        try:
            with self._timed("publish"):
                return self.outbox.publish(self.transport, self.options.swarm, message, priority=priority)
        except ValueError as err:  # skip it and say why
            log.warning("not sharing a %s for %s: %s", type(message).__name__, what, err)
            self._count(self.rejected, OUTBOUND_INVALID)
            return None

    # -- inbound: checks on arrival (the ingest worker's thread, or collect's in inline mode) -----
    def _count(self, counter: Counter, key: str, n: int = 1) -> None:
        with self._lock:
            counter[key] += n

    def _timed(self, phase: str):
        return timed(self._add_seconds, phase)

    def _add_seconds(self, phase: str, seconds: float) -> None:
        self._count(self._seconds, phase, seconds)

    def _accept(self, item: Received, kinds: set[Kind]) -> Verified | None:
        """One message through the Ingress, counted (messages_checked) and timed."""
        self._count(self._work, "messages_checked")
        with self._timed("ingress"):
            verified = self.ingress.accept_received(item, kinds)
        self._note_signers([verified] if verified is not None else [])
        return verified

    def _note_signers(self, accepted: list[Verified]) -> None:
        with self._lock:
            for verified in accepted:
                self._signers.authenticated(verified.from_peer, verified.sender)

    def _sender_class(self, from_peer: str) -> str:
        """Staging's lane (and the hint-request queue's class) for a delivering host: that of the key
        it was last authenticated publishing for (node/peers/signers.py; its own id until then),
        established at admission, or young (unknown, and a host delivering for several keys, included)."""
        with self._lock:
            signer = self._signers.signer_of(from_peer)
            return YOUNG if signer == SEVERAL or self.pool.admission.is_young(signer) else ESTABLISHED

    def _verify_staged(self, staged: Staged) -> None:
        """One message from the transport, whatever its topic (the background worker's callback)."""
        item = staged.item
        if staged.topic == self.topics["hint-requests"]:
            self._queue_hint_requests([item])
            return
        if staged.topic == self.topics["rollouts"] and self._skimmed(item):
            return
        verified = self._accept(item, self._topic_kinds[staged.topic])
        self._guarded(item.from_peer, lambda: self._take(staged.topic, verified, self._worker.round_index))

    def _guarded(self, from_peer: str, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:  # our code broke on peer data: drop that message, count it, go on
            log.warning("dropping a message from %s: %r", from_peer, err, exc_info=True,
                        extra={"event": "verify_error", "peer_id": from_peer, "error": repr(err)})
            self._count(self.rejected, VERIFY_ERROR)

    def _take(self, topic: str, verified: Verified | None, round_index: int) -> None:
        if verified is None:
            return
        if topic == self.topics["rollouts"]:
            self._take_rollout(verified, round_index)
        else:
            self._take_hint(verified)

    def _take_rollout(self, verified: Verified, round_index: int) -> None:
        """A signed group: the cheap checks now; pooled unverified (verified if the mix picks it)."""
        sender, msg = verified.sender, verified.body
        if sender == self.peer_id:
            self._refuse(sender, Refusal(OWN))
            return
        with self._lock:
            self._arrived["received"] += 1
            self.pool.admission.heard(sender)
            flat = claims_flat(msg)  # as its sender claims: only a pick or the audit checks it
            self._arrived["flat"] += flat
            if flat and self.options.composition != "cross_actor" and not self.pool.wants_flat(sender):
                self._unaudited.remember(sender, msg)
                return  # SAPO: zero-variance groups carry no signal on their own (a young key's earns it credit)
            with self._timed("precheck"):
                candidate = precheck_group(sender, msg, self.context)
        if isinstance(candidate, Refusal):
            self._refuse(sender, candidate)
            return
        with self._lock:
            self._unaudited.remember(sender, candidate)
            if self.pool.add(PoolEntry(candidate, round_index, self.pool.now())):
                self.observed["pool_sender_cap"] += 1  # the sender's oldest pooled group made room
            self.pool.admission.place(sender, self._delivering_group(verified))

    def _apply_operator(self) -> None:
        """The operator file's decisions, if it changed (node/peers/operator.py)."""
        if self.operator is not None and (decisions := self.operator.changed_or_none()) is not None:
            with self._lock:
                apply_decisions(decisions, self.ingress, self.pool)
                self.decisions = decisions

    def _delivering_group(self, verified: Verified) -> str:
        """The network group admission counts a signer in: its own host's where we are (or were)
        connected to it, else that of the neighbour that delivered the group."""
        return self._network_group(verified.sender) or (verified.neighbour and self._network_group(verified.neighbour))

    def _skimmed(self, item: Received) -> bool:
        """An unbanned origin's own zero-variance claim that the pool has no use for: dropped
        unchecked (node/peers/peek.py), kept as the origin's latest for the audit. An established key's
        always; a young key's once YOUNG_FLAT_POOLED of its groups wait in the pool (a young slot
        credits one a round at most). Cross-actor composition merges such groups: none."""
        origin = item.from_peer
        if self.options.composition == "cross_actor" or self.ingress.is_banned(origin):
            return False
        with self._lock:
            if self.pool.admission.is_young(origin) and self.pool.held_by(origin) < YOUNG_FLAT_POOLED:
                return False
        with self._timed("skim"):
            flat = flat_claim_of_origin(item, self.limits)
        if flat:
            with self._lock:
                self._arrived["received"] += 1
                self._arrived["flat"] += 1
                self._work["messages_skimmed"] += 1
                self._unaudited.remember(origin, item)
        return flat

    def _ingest_inline(self, round_index: int) -> None:
        """Everything that arrived, as every release so far did it: per topic, the Ingress over the
        whole drain first (rate limits see the burst), then node-level checks. Hint requests only
        wait (node/peers/hint_requests.py)."""
        self._queue_hint_requests(self.transport.drain(self.topics["hint-requests"]))
        for kind in ("hints", "rollouts"):
            topic = self.topics[kind]
            drained = self.transport.drain(topic)
            if kind == "rollouts":
                drained = [item for item in drained if not self._skimmed(item)]
            self._count(self._work, "messages_checked", len(drained))
            with self._timed("ingress"):
                accepted = self.ingress.accept_many(drained, self._topic_kinds[topic])
            self._note_signers(accepted)
            for verified in accepted:
                self._guarded(verified.from_peer, lambda: self._take(topic, verified, round_index))

    # -- inbound: what the training loop calls ----------------------------------------------------
    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]:
        """This round's external groups from the pool, verified as they are picked (never waits on
        the network). Inline mode first checks what arrived; background mode only takes what the
        worker checked."""
        self._apply_operator()
        if self._worker is None:
            self._ingest_inline(round_index)
        else:
            self._worker.new_round(round_index)
        with self._lock:
            chosen = self._collect(round_index, local)
        self.refusals.log_round(round_index, self.ingress.rejected_counts())  # the picks' refusals too
        return chosen

    def _collect(self, round_index: int, local: list[ScoredGroup]) -> list[ScoredGroup]:
        received, flat = self._arrived["received"], self._arrived["flat"]
        self._arrived = {"received": 0, "flat": 0}
        rejected_before = self._rejected_at_last_collect
        self.verify_budget.start_round()
        self.pool.evict(round_index)
        rng = random.Random(f"{self.options.seed}/{round_index}")  # own stream: never perturbs training RNG
        chosen = []
        if self.options.composition == "cross_actor":  # peers' groups for the prompts we just sampled
            chosen = self.pool.take_matching({g.task.prompt_key for g in local if g.hint is None}, self._verify_picked)
        chosen += self.pool.sample(self.options.external_per_round, self.options.sampling_policy, rng, self.weakness,
                                   self._verify_picked)
        audited = self._audit(rng)
        rejected_now = sum(self.rejected.values())
        self._rejected_at_last_collect = rejected_now
        tiers = Counter(str(r.tier) for g in chosen for r in g.rollouts)
        reasons = Counter(reason for g in chosen for reason in g.meta["tier_reasons"])
        for group in chosen:
            self.used_by_sender[group.origin] += 1
        useful = sorted({g.origin for g in chosen if not self.pool.admission.is_young(g.origin)})
        if useful and self._note_useful is not None:  # p2pd keeps them connected and first in its cache
            self._note_useful(useful)  # established keys only: a young slot must not buy a flooder that
        self.tiers_used.update(tiers)
        seconds = self._phase_seconds()
        self.history.append({"round": round_index, "local_groups": self._local_groups,
                             "external_groups_received": received, "external_groups_used": len(chosen),
                             "external_groups_dropped": (0 if self.options.composition == "cross_actor" else flat)
                                                        + rejected_now - rejected_before,
                             "groups_verified": self._work["groups_verified"], "groups_audited": audited,
                             "exchange_s": round(sum(seconds.values()), 6),
                             **{f"tier{t}_rollouts": tiers.get(str(t), 0) for t in TIERS}})
        self.last_round = round_row(self, received, flat, audited, chosen, tiers, reasons, round_index, seconds)
        self.totals.update({key: self.last_round[key] for key in TOTALED})
        self._work.clear()
        self._seconds.clear()
        return chosen

    def _phase_seconds(self) -> dict[str, float]:
        """Seconds per EXCHANGE_PHASES since the last collect, none twice (the precheck times the rebuild)."""
        seconds = {phase: self._seconds[phase] for phase in EXCHANGE_PHASES}
        seconds["precheck"] = max(0.0, seconds["precheck"] - seconds["rebuild"])
        return seconds

    def _verify_picked(self, group: Candidate | ScoredGroup) -> ScoredGroup | str | None:
        """The pool's callback: a pick verified within the round's budget, its refusal, or None (spent)."""
        if isinstance(group, ScoredGroup):  # verified ahead (the ingest worker) or by an audit
            return group
        verdict = self.verify_budget.run(lambda left: self._verify_candidate(group, left))
        return verdict.reason if isinstance(verdict, Refusal) else verdict

    def _audit(self, rng: random.Random) -> int:
        """Verify one of the latest unverified groups of `audit_per_round` senders chosen at random
        (within the round's budget): a sender whose groups are never picked is still checked. One that
        passes stays verified in the pool; one that fails leaves it and benches its key (a benched
        liar is still audited, and banned by its score). Returns how many were verified."""
        audited = 0
        for sender, group in self._unaudited.draw(rng, self.options.audit_per_round):
            if isinstance(group, Received):  # skimmed: the Ingress first
                verified = self._accept(group, {Kind.ROLLOUT_GROUP})
                if verified is None or verified.sender == self.peer_id:
                    continue
                sender, group = verified.sender, verified.body
            if isinstance(group, Candidate):
                verdict = self.verify_budget.run(lambda left: self._verify_candidate(group, left))
            else:  # a zero-variance claim, never prechecked: both stages now
                verdict = self.verify_budget.run(lambda left: self._verify_group(sender, group, left))
            if verdict is None:
                continue
            audited += 1
            if isinstance(verdict, Refusal):
                self.pool.failed(sender, verdict.reason, group)
            elif isinstance(group, Candidate):
                self.pool.replace_unverified(group, verdict)
        return audited

    def _verify_ahead(self) -> bool:
        """The ingest worker's spare time: one pooled group verified before a pick asks, scored outside
        the lock (a slow scorer never holds up collect; picks skip it meanwhile), while under 2 J wait."""
        with self._lock:
            candidate = self.pool.next_unverified(most_verified=2 * max(1, self.options.external_per_round))
            if candidate is None:
                return False
            self._work.update(groups_verified=1, groups_verified_ahead=1)
            self._unaudited.forget(candidate.origin, candidate)
            self.pool.verifying.add(id(candidate))
        try:
            scores = score_candidate(candidate, self.context)
        finally:
            self.pool.verifying.discard(id(candidate))  # one set operation: atomic, no lock needed
        with self._lock:
            verdict = self._verdict(candidate.origin, verify_candidate(candidate, self.context, scores))
            if isinstance(verdict, Refusal):
                self.pool.failed(candidate.origin, verdict.reason, candidate)
            else:
                self.pool.replace_unverified(candidate, verdict)
        return True

    def _refuse(self, sender: str, refusal: Refusal) -> None:
        """Count and log a refusal; the only place evidence against a signer goes to the Ingress."""
        if refusal.disagreements:
            self._count(self.observed, DISAGREES, refusal.disagreements)
        self.refusals.add(refusal.reason, sender, refusal.detail)
        if refusal.blame:
            self.ingress.report(sender, refusal.reason)

    def _verify_candidate(self, candidate: Candidate, timeout_s: float | None = None) -> ScoredGroup | Refusal:
        """The expensive checks of a prechecked group (node/peers/verify.py), refusals counted;
        `timeout_s`: a scorer deadline shorter than the verifier's (what is left of the budget)."""
        with self._lock:
            self._work["groups_verified"] += 1
            self._unaudited.forget(candidate.origin, candidate)
            scores = score_candidate(candidate, self.context, timeout_s)
            verdict = verify_candidate(candidate, self.context, scores)
        return self._verdict(candidate.origin, verdict)

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup) -> ScoredGroup | None:
        """A peer's group through both stages of node/peers/verify.py now, or None, counted, if refused."""
        verdict = self._verify_group(sender, msg)
        return None if isinstance(verdict, Refusal) else verdict

    def _verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup,
                      timeout_s: float | None = None) -> ScoredGroup | Refusal:
        with self._lock:
            candidate = precheck_group(sender, msg, self.context)
        if isinstance(candidate, Refusal):
            return self._verdict(sender, candidate)
        return self._verify_candidate(candidate, timeout_s)

    def _verdict(self, sender: str, verdict: ScoredGroup | Refusal) -> ScoredGroup | Refusal:
        if isinstance(verdict, Refusal):
            self._refuse(sender, verdict)
            return verdict
        if verdict.meta["reward_disagreements"]:
            self._count(self.observed, DISAGREES, verdict.meta["reward_disagreements"])
        return verdict

    def status(self) -> dict:
        """Counters and recent rounds for `swarm-node status` (node/peers/exchange_status.py)."""
        return exchange_status(self)
