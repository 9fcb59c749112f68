"""SAPO exchange: publish this node's groups and hints, verify peers', mix verified groups in.

What crosses the network is never trusted (proto/PROTOCOL.md); what the Ingress lets through is
verified by node/verify.py, and its refusals are counted, logged and (where they are evidence
against the signer) reported to the Ingress here, in `_refuse`:
  transport bytes -> protocol.Ingress (signature, limits, replay, rate, bans)
  rollout groups  -> rebuild question and answer from the TaskRef (never the sender's copy)
                  -> recompute every reward with our own verifier; a claimed reward that
                     disagrees rejects the group and counts against the signer
                  -> re-tokenize the text with our tokenizer and pick each completion's behavior
                     tier (node/tiers.py): the sender's log-probs exactly, aligned, or our proxy
                  -> a bounded pool (node/pool.py)
  hints           -> rebuild the task; a hint that contains the answer is refused and counted
                     against the signer; the node keeps it only if it asked (node/hints.py)
  hint requests   -> rebuild the task; the node may answer with hints (node/hint_writer.py)
  SAPO mixing: J groups with reward variance from the pool (uniform / per_sender / weak_tasks);
  in cross-actor composition, first every pooled group for a prompt we sampled this round.

Where ingest runs (`ingest`): "background" (`swarm-node join`): a worker thread (node/ingest.py)
drains the transport and verifies under a per-round budget with per-sender staging quotas,
established senders first (young and unknown origins share a bounded remainder), so `collect` only
samples the verified pool and a flood never lengthens a round. "inline" (the
in-process memory testnet, experiments, most tests): `collect` verifies everything that arrived,
on the caller's thread, in swarm time: runs stay deterministic and reproducible.
Peers' completions are scored in killable worker processes (node/scorer_sandbox.py).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Literal

from node.config import SwarmConfig
from node.groups import ScoredGroup
from node.ingest import ESTABLISHED, YOUNG, IngestBudget, IngestWorker, Staged
from node.pool import GroupPool, PoolEntry
from node.prompts import Retokenizer
from node.reasons import DISAGREES, OUTBOUND_INVALID, OWN, VERIFY_ERROR
from node.refusals import Refusals
from node.tasks.base import Task, TaskSource
from node.scorer_sandbox import ScorerSandbox
from node.verifiers import Verifier
from node.verify import Refusal, VerifyContext, verify_group, verify_hint, verify_hint_request
from node.wire import LEVEL_CODES, LEVEL_NAMES, to_wire, wire_task_ref
from policy.types import TIERS
from proto import swarm_pb2
from protocol import Ingress, Kind, Limits, NodeIdentity, Outbox, Transport, Verified, topic_name

log = logging.getLogger(__name__)
MAX_KEYS_SHOWN = 64  # status: the most recently established keys listed
# the exchange work a round row counts, what the compute clock charges (node/testnet/clock.py):
# messages through the Ingress (signature, limits, replay), peer groups re-verified (rebuild,
# re-score, re-tokenize), messages signed and published
EXCHANGE_WORK = ("messages_checked", "groups_verified", "messages_published")
# what the paced outbox sends first when a node produces more than its pace (protocol/outbox.py):
# groups peers can train on, then hints and hint requests, then groups without reward variance. A
# fast node answering a hint request each round (several levels each) spent most of its pace on
# hints, and its paced peer trained its groups in 0.72 of rounds (0.92 without the hints)
TRAINABLE, HINTING, NOTHING_TO_TRAIN = 2, 1, 0

@dataclass(frozen=True)
class ReceivedHint:
    task: Task
    level: str
    text: str
    sender: str


class SwarmExchange:
    """Implements the loop's Exchange over any protocol.Transport; never blocks the loop.

    Thread-safety: `_lock` guards the pool, the hint queues and every counter, and is only ever
    held for a few dict operations; verification itself runs outside it (background mode)."""

    def __init__(self, transport: Transport, identity: NodeIdentity, cfg: SwarmConfig, source: TaskSource,
                 verifier: Verifier, retokenizer: Retokenizer, model: swarm_pb2.ModelCard,
                 sampling: swarm_pb2.SamplingParams, *, seed: int = 0, limits: Limits | None = None,
                 max_completion_tokens: int = 4096, max_group_tokens: int | None = None,
                 weakness: Callable[[ScoredGroup], float] | None = None,
                 ingest: Literal["inline", "background"] = "inline", budget: IngestBudget = IngestBudget(),
                 sandbox: ScorerSandbox | None = None, swarm_clock: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.time, state: dict | None = None):
        self.transport = transport
        self.peer_id = identity.peer_id()
        self.cfg = cfg
        self.source = source
        self.verifier = verifier
        self.retokenizer = retokenizer
        self.model_card = model
        self.sampling = sampling
        self.seed = seed
        self.max_completion_tokens = max_completion_tokens  # ours: longer peer text is refused
        self.max_group_tokens = max_group_tokens or 64 * max_completion_tokens  # all completions of a group
        self.weakness = weakness  # for the weak_tasks sampler: 1 - our pass rate on a group's family
        self.sandbox = sandbox  # where peers' text is scored; None: in a thread (trusted callers only)
        # swarm_clock: the time rate limits and our publication pace run on (default: the wall clock;
        # an in-process simulation passes its swarm time, as its nodes share one CPU); clock: the
        # time messages are stamped and checked on (a compute-clock testnet's virtual time)
        self.ingress = Ingress(limits or Limits(), clock=clock, rate_clock=swarm_clock)
        self.outbox = Outbox(identity, limits=limits or Limits(), clock=clock, pace_clock=swarm_clock)
        self.topics = {kind: topic_name(cfg.name, kind) for kind in ("rollouts", "hints", "hint-requests")}
        self._topic_kinds = {self.topics["rollouts"]: {Kind.ROLLOUT_GROUP}, self.topics["hints"]: {Kind.HINT},
                             self.topics["hint-requests"]: {Kind.HINT_REQUEST}}  # anything else: wrong_topic
        self.rejected: Counter[str] = Counter()  # node-level reasons (Ingress counts its own)
        # windows in time where they protect a real node (background ingest, `join`); the inline
        # in-process testnet runs in virtual time and keeps them in rounds (node/admission.py)
        self.pool = GroupPool.from_config(cfg, self.rejected, time.time if ingest == "background" else None)
        self.observed: Counter[str] = Counter()  # things worth counting that are not rejections
        self.used_by_sender: Counter[str] = Counter()
        self.tiers_used: Counter[str] = Counter()  # behavior tier -> external rollouts trained on
        self.last_round: dict = {}
        self.history: deque[dict] = deque(maxlen=100)  # per-round usage, for `swarm-node status`
        self._hints: deque[ReceivedHint] = deque(maxlen=256)  # bounded: nobody may be taking them
        self._requests: deque[tuple[Task, str]] = deque(maxlen=64)
        self._local_groups = 0
        self._shared = {"wire_bytes": 0, "wire_tokens": 0}
        self._arrived = {"received": 0, "flat": 0}  # verified since the last collect
        self._work: Counter[str] = Counter()  # EXCHANGE_WORK since the last collect
        # optional transport capability (p2pd: its peer cache ranks the peers whose groups we use first)
        self._note_useful: Callable[[list[str]], None] | None = getattr(transport, "note_useful_peers", None)
        self._lock = threading.Lock()
        self.refusals = Refusals(self.rejected, self._lock)  # counted and logged (rate-limited)
        if state is not None:  # before the ingest worker starts: nothing is pooled yet
            self._load_state(state)
        for topic in self.topics.values():
            transport.subscribe(topic)
        self.ingest_mode = ingest
        self._worker = self._make_worker(ingest, budget)
        if self._worker is not None:  # started once assigned: its callback reads self._worker
            self._worker.start()

    def _make_worker(self, ingest: str, budget: IngestBudget) -> IngestWorker | None:
        if ingest == "inline":
            return None
        if ingest != "background":
            raise ValueError(f"ingest must be 'inline' or 'background', got {ingest!r}")
        return IngestWorker(self.transport, list(self.topics.values()), self._verify_staged, budget,
                            self._sender_class, name=f"ingest-{self.peer_id[-8:]}",
                            max_wait_s=self.cfg.ingest_max_wait_s,
                            young_capped=lambda: self.pool.admission.any_established)

    def state_dict(self) -> dict:
        """What a restart must not forget (saved with each checkpoint, node/loop.py): admission's
        key records and dedup memory. The pool and the replay windows are not kept: pooled groups
        are rounds old by then, and a replayed group that was trained is still duplicate_content."""
        with self._lock:
            return {"admission": self.pool.admission.state_dict()}

    def admission_status(self) -> dict:
        """Keys established (with when, unix time; 0 in round-only mode) and how many are young."""
        with self._lock:
            admission = self.pool.admission
            established = admission.established()
            return {"established": [[key, at] for key, at in established[-MAX_KEYS_SHOWN:]],
                    "established_count": len(established), "young_count": len(admission.keys) - len(established)}

    def _load_state(self, state: dict) -> None:
        try:
            self.pool.admission.load_state_dict(state["admission"])
        except (KeyError, TypeError, ValueError) as err:
            log.warning("ignoring the saved admission state (%s): every peer key starts young", err)

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
            data = self._publish(to_wire(group, round_index, self.model_card, self.sampling, self.verifier.digest),
                                 group.task.ref.key, NOTHING_TO_TRAIN if group.flat else TRAINABLE)
            if data is not None:
                self._shared["wire_bytes"] += len(data)
                self._shared["wire_tokens"] += sum(len(r.completion_ids) for r in group.rollouts)

    def request_hints(self, tasks: list[Task]) -> None:
        for task in tasks:
            self._publish(swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref)), task.ref.key, HINTING)

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        for level, text in levels.items():
            self._publish(swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=LEVEL_CODES[level], text=text),
                          task.ref.key, HINTING)

    def _publish(self, message, what: str, priority: int) -> bytes | None:
        """The signed bytes sent now, or None (it waits in the paced outbox, or breaks a limit peers
        enforce)."""
        self._count(self._work, "messages_published")
        try:
            return self.outbox.publish(self.transport, self.cfg.name, message, priority=priority)
        except ValueError as err:  # skip it and say why
            log.warning("not sharing a %s for %s: %s", type(message).__name__, what, err)
            self._count(self.rejected, OUTBOUND_INVALID)
            return None

    # -- inbound: verification (the ingest worker's thread, or collect's in inline mode) ---------
    def _count(self, counter: Counter, key: str, n: int = 1) -> None:
        with self._lock:
            counter[key] += n

    def _sender_class(self, from_peer: str) -> str:
        """Staging's lane for a delivering peer: established at admission, or young (unknown included).
        A host's origin id is its signing key, so an honest peer's earned weight carries over."""
        with self._lock:
            return YOUNG if self.pool.admission.is_young(from_peer) else ESTABLISHED

    def _verify_staged(self, staged: Staged) -> None:
        """One message from the transport, whatever its topic (the background worker's callback)."""
        item = staged.item
        kinds = self._topic_kinds[staged.topic]
        self._count(self._work, "messages_checked")
        self._guarded(item.from_peer, lambda: self._take(staged.topic, self.ingress.accept_received(item, kinds),
                                                         self._worker.round_index))  # ages from verification

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
        elif topic == self.topics["hints"]:
            self._take_hint(verified)
        else:
            self._take_hint_request(verified)

    def _take_rollout(self, verified: Verified, round_index: int) -> None:
        if verified.sender == self.peer_id:
            self._refuse(verified.sender, Refusal(OWN))
            return
        group = self.verify_group(verified.sender, verified.body)
        if group is None:
            return
        with self._lock:
            self._arrived["received"] += 1
            self._arrived["flat"] += group.flat
            self.pool.admission.heard(group.origin)
            if group.flat and self.cfg.composition != "cross_actor" and not self.pool.wants_flat(group.origin):
                return  # SAPO: zero-variance groups carry no signal on their own (a young key's earns it credit)
            if self.pool.add(PoolEntry(group, round_index, self.pool.now())):
                self.observed["pool_sender_cap"] += 1  # the sender's oldest pooled group made room

    def _ingest_inline(self, round_index: int) -> None:
        """Everything that arrived, as every release so far did it: per topic, the Ingress over the
        whole drain first (rate limits see the burst), then node-level verification."""
        for kind in ("hints", "hint-requests", "rollouts"):
            topic = self.topics[kind]
            drained = self.transport.drain(topic)
            self._count(self._work, "messages_checked", len(drained))
            for verified in self.ingress.accept_many(drained, self._topic_kinds[topic]):
                self._guarded(verified.from_peer, lambda: self._take(topic, verified, round_index))

    # -- inbound: what the training loop calls ----------------------------------------------------
    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]:
        """This round's external groups from the verified pool (never waits for anything). Inline
        mode verifies what arrived first; background mode only takes what the worker verified."""
        if self._worker is None:
            self._ingest_inline(round_index)
        else:
            self._worker.new_round(round_index)
        self.refusals.log_round(round_index, self.ingress.rejected_counts())
        with self._lock:
            return self._collect(round_index, local)

    def _collect(self, round_index: int, local: list[ScoredGroup]) -> list[ScoredGroup]:
        received, flat = self._arrived["received"], self._arrived["flat"]
        self._arrived = {"received": 0, "flat": 0}
        rejected_now = sum(self.rejected.values())
        rejected_before, self._rejected_at_last_collect = self._rejected_at_last_collect, rejected_now
        self.pool.evict(round_index)
        chosen = []
        if self.cfg.composition == "cross_actor":  # peers' groups for the prompts we just sampled
            chosen = self.pool.take_matching({g.task.prompt_key for g in local if g.hint is None})
        rng = random.Random(f"{self.seed}/{round_index}")  # own stream: never perturbs training RNG
        chosen += self.pool.sample(self.cfg.external_per_round, self.cfg.sampling_policy, rng, self.weakness)
        tiers = Counter(str(r.tier) for g in chosen for r in g.rollouts)
        reasons = Counter(reason for g in chosen for reason in g.meta["tier_reasons"])
        for group in chosen:
            self.used_by_sender[group.origin] += 1
        useful = sorted({g.origin for g in chosen if not self.pool.admission.is_young(g.origin)})
        if useful and self._note_useful is not None:  # p2pd keeps them connected and first in its cache
            self._note_useful(useful)  # established keys only: a young slot must not buy a flooder that
        self.tiers_used.update(tiers)
        self.history.append({"round": round_index, "local_groups": self._local_groups,
                             "external_groups_received": received, "external_groups_used": len(chosen),
                             "external_groups_dropped": (0 if self.cfg.composition == "cross_actor" else flat)
                                                        + rejected_now - rejected_before,
                             **{f"tier{t}_rollouts": tiers.get(str(t), 0) for t in TIERS}})
        self.last_round = {
            "external_received": received,
            "external_used": len(chosen),
            "external_zero_variance": flat,
            "external_used_by_sender": dict(Counter(g.origin for g in chosen)),
            "external_tiers": {str(t): tiers.get(str(t), 0) for t in TIERS},
            "external_tier_reasons": dict(reasons),
            "external_staleness_rounds": [round_index - g.meta["sender_round"] for g in chosen],
            "pool_size": len(self.pool),
            "peers_connected": len(self.transport.peers()),
            **self._shared,
            **{key: float(self._work[key]) for key in EXCHANGE_WORK},
        }
        self._work.clear()
        return chosen

    _rejected_at_last_collect = 0

    def _context(self) -> VerifyContext:
        return VerifyContext(self.source, self.verifier, self.retokenizer, self.max_completion_tokens,
                             self.max_group_tokens, self.sandbox, self.cfg.accept_sender_answers)

    def _refuse(self, sender: str, refusal: Refusal) -> None:
        """Count and log a refusal; the only place evidence against a signer goes to the Ingress."""
        if refusal.disagreements:
            self._count(self.observed, DISAGREES, refusal.disagreements)
        self.refusals.add(refusal.reason, sender, refusal.detail)
        if refusal.blame:
            self.ingress.report(sender, refusal.reason)

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup) -> ScoredGroup | None:
        """The group verified (node/verify.py), or None, counted, if refused."""
        self._count(self._work, "groups_verified")
        verdict = verify_group(sender, msg, self._context())
        if isinstance(verdict, Refusal):
            self._refuse(sender, verdict)
            return None
        if verdict.meta["reward_disagreements"]:
            self._count(self.observed, DISAGREES, verdict.meta["reward_disagreements"])
        return verdict

    def _take_hint(self, verified: Verified) -> None:
        if verified.sender == self.peer_id:
            return
        hint = verified.body
        task = verify_hint(hint, self._context())
        if isinstance(task, Refusal):
            self._refuse(verified.sender, task)
            return
        with self._lock:
            self._hints.append(ReceivedHint(task, LEVEL_NAMES[hint.level], hint.text, verified.sender))

    def _take_hint_request(self, verified: Verified) -> None:
        if verified.sender == self.peer_id:
            return
        task = verify_hint_request(verified.body, self._context())
        if isinstance(task, Refusal):
            self._refuse(verified.sender, task)
            return
        with self._lock:
            if all(t.prompt_key != task.prompt_key for t, _ in self._requests):
                self._requests.append((task, verified.sender))

    def take_hints(self) -> list[ReceivedHint]:
        """Verified hints received since the last call (the caller decides which it wants)."""
        with self._lock:
            hints = list(self._hints)
            self._hints.clear()
            return hints

    def take_hint_requests(self, k: int) -> list[tuple[Task, str]]:
        """Up to k verified hint requests, oldest first (the rest wait for later rounds)."""
        with self._lock:
            return [self._requests.popleft() for _ in range(min(k, len(self._requests)))]

    def status(self) -> dict:
        """Counters and recent rounds; only ever waits for a few dict copies, never for ingest.
        `accepted` counts messages that passed every check, the Ingress's and this node's (a group
        the Ingress let through and we then refused is not accepted); `ingress_accepted` the former."""
        with self._lock:  # node-level refusals first: each belongs to a message the snapshot below counts
            refused = sum(n for reason, n in self.rejected.items() if reason != OUTBOUND_INVALID)
        snap = self.ingress.snapshot()
        ingest = {"mode": self.ingest_mode}
        if self._worker is not None:
            ingest.update(self._worker.snapshot(), alive=self._worker.alive)
        if self.sandbox is not None:
            ingest["scorer_sandbox"] = self.sandbox.snapshot()
        admission = self.admission_status()
        transport = {"transport": {**self.transport.stats(), **self.outbox.counters}, "connected": self.transport.peers(),
                     "listen_addrs": self.transport.listen_addrs()}
        with self._lock:
            return {
                "peer_id": self.peer_id,
                "swarm": self.cfg.name,
                "accepted": max(0, snap.accepted - refused),
                "ingress_accepted": snap.accepted,
                "rejected_by_reason": {**snap.rejected_by_reason, **self.rejected},
                "peers": snap.peers,
                **transport,
                "rounds": list(self.history),
                "used_by_sender": dict(self.used_by_sender),
                "tiers_used": dict(self.tiers_used),
                "observed": dict(self.observed),
                "ingest": ingest,
                "admission": admission,
            }
