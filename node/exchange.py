"""SAPO exchange: publish this node's groups and hints, verify peers', mix verified groups in.

What crosses the network is never trusted (proto/PROTOCOL.md):
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
"""
from __future__ import annotations

import logging
import random
import threading
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

from node.config import SwarmConfig
from node.groups import ScoredGroup
from node.hints import LEVELS, leaks_answer
from node.pool import GroupPool, PoolEntry
from node.prompts import Retokenizer
from node.tasks.base import Task, TaskRef, TaskSource
from node.tiers import assign_tier
from node.verifiers import Verifier
from policy.types import TIERS, Rollout
from proto import swarm_pb2
from protocol import Ingress, Kind, Limits, NodeIdentity, Outbox, Transport, topic_name
from protocol.scoring import HINT_LEAK, UNKNOWN_TASK, WRONG_REWARD

log = logging.getLogger(__name__)

REWARD_TOLERANCE = 1e-3  # claimed rewards travel as float32; honest peers agree far closer than this

# Node-level rejection reasons (after protocol.Ingress accepted the bytes).
UNKNOWN = "unknown_task"          # TaskRef we cannot rebuild (and sender answers not accepted)
MISMATCH = "wrong_reward"         # claimed reward disagrees with our recomputation (same verifier)
DISAGREES = "reward_disagrees"    # another verifier's claim differs from ours: not a rejection (we
                                  # train on our own rewards), counted under `observed`
TIMEOUT = "score_timeout"         # our scorer ran out of time on a completion: cannot verify, no blame
UNTOKENIZABLE = "untokenizable"   # text our tokenizer cannot encode (e.g. outside the tiny vocab)
TOO_LONG = "too_long"             # longer in our tokens than we would ever train on
OWN = "own_message"               # our own message echoed back (gossip relays can do this)
HINTED = "hinted_group"           # completions conditioned on a hint we cannot see: not shared
LEAK = "hint_leaks_answer"        # a hint containing the task's answer
HINT_REQUEST_UNKNOWN = "hint_request_unknown_task"  # a request for a task we cannot build (no blame)

LEVEL_NAMES = {swarm_pb2.Hint.L1: "l1", swarm_pb2.Hint.L2: "l2", swarm_pb2.Hint.L3: "l3",
               swarm_pb2.Hint.PREFIX: "prefix"}
LEVEL_CODES = {name: code for code, name in LEVEL_NAMES.items()}
assert set(LEVEL_CODES) == set(LEVELS)


@dataclass(frozen=True)
class ReceivedHint:
    task: Task
    level: str
    text: str
    sender: str


def wire_task_ref(ref: TaskRef) -> swarm_pb2.TaskRef:
    return swarm_pb2.TaskRef(source=ref.source, dataset=ref.dataset, config_digest=ref.config_digest,
                             seed=ref.seed, index=ref.index)


def local_task_ref(ref: swarm_pb2.TaskRef) -> TaskRef:
    return TaskRef(source=ref.source, dataset=ref.dataset, config_digest=ref.config_digest, seed=ref.seed,
                   index=ref.index)


def to_wire(group: ScoredGroup, round_index: int, model: swarm_pb2.ModelCard,
            sampling: swarm_pb2.SamplingParams, verifier_digest: str = "") -> swarm_pb2.RolloutGroup:
    msg = swarm_pb2.RolloutGroup(
        task_ref=wire_task_ref(group.task.ref), model=model, sampling=sampling,
        policy_version=group.policy_version, round=round_index,
        question=group.task.question, answer=group.task.answer or "", verifier_digest=verifier_digest)
    for rollout, reward in zip(group.rollouts, group.rewards):
        offsets = [x for span in rollout.offsets for x in span]
        msg.completions.add(text=rollout.text, token_ids=rollout.completion_ids,
                            behavior_logprobs=[min(lp, 0.0) for lp in rollout.logprobs or []],
                            char_offsets=offsets, claimed_reward=reward, truncated=rollout.truncated)
    return msg


class SwarmExchange:
    """Implements the loop's Exchange over any protocol.Transport; never blocks the loop."""

    def __init__(self, transport: Transport, identity: NodeIdentity, cfg: SwarmConfig, source: TaskSource,
                 verifier: Verifier, retokenizer: Retokenizer, model: swarm_pb2.ModelCard,
                 sampling: swarm_pb2.SamplingParams, *, seed: int = 0, limits: Limits | None = None,
                 max_completion_tokens: int = 4096, weakness: Callable[[ScoredGroup], float] | None = None):
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
        self.weakness = weakness  # for the weak_tasks sampler: 1 - our pass rate on a group's family
        self.ingress = Ingress(limits or Limits())
        self.outbox = Outbox(identity, limits=limits or Limits())
        self.topics = {kind: topic_name(cfg.name, kind) for kind in ("rollouts", "hints", "hint-requests")}
        self.rejected: Counter[str] = Counter()  # node-level reasons (Ingress counts its own)
        self.pool = GroupPool.from_config(cfg, rejected=self.rejected)  # counts duplicate_content there
        self.observed: Counter[str] = Counter()  # things worth counting that are not rejections
        self.used_by_sender: Counter[str] = Counter()
        self.tiers_used: Counter[str] = Counter()  # behavior tier -> external rollouts trained on
        self.last_round: dict = {}
        self.history: deque[dict] = deque(maxlen=100)  # per-round usage, for `swarm-node status`
        self._hints: deque[ReceivedHint] = deque(maxlen=256)  # bounded: nobody may be taking them
        self._requests: deque[tuple[Task, str]] = deque(maxlen=64)
        self._local_groups = 0
        self._shared = {"wire_bytes": 0, "wire_tokens": 0}
        self._lock = threading.Lock()  # the control service reads counters from its own thread
        for topic in self.topics.values():
            transport.subscribe(topic)

    # -- outbound ----------------------------------------------------------------------------
    def share(self, round_index: int, groups: list[ScoredGroup]) -> None:
        self._local_groups = len(groups)
        self._shared = {"wire_bytes": 0, "wire_tokens": 0}  # what one completion token costs on the wire
        for group in groups:
            if group.hint is not None:  # conditioned on context peers would not see
                continue
            data = self._publish(to_wire(group, round_index, self.model_card, self.sampling, self.verifier.digest),
                                 group.task.ref.key)
            if data is not None:
                self._shared["wire_bytes"] += len(data)
                self._shared["wire_tokens"] += sum(len(r.completion_ids) for r in group.rollouts)

    def request_hints(self, tasks: list[Task]) -> None:
        for task in tasks:
            self._publish(swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref)), task.ref.key)

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        for level, text in levels.items():
            self._publish(swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=LEVEL_CODES[level], text=text),
                          task.ref.key)

    def _publish(self, message, what: str) -> bytes | None:
        """The signed bytes sent, or None when our own message breaks a limit peers enforce."""
        try:
            return self.outbox.publish(self.transport, self.cfg.name, message)
        except ValueError as err:  # skip it and say why
            log.warning("not sharing a %s for %s: %s", type(message).__name__, what, err)
            self.rejected["outbound_invalid"] += 1
            return None

    # -- inbound -----------------------------------------------------------------------------
    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]:
        """Verify what arrived, then this round's external groups (never waits for anything)."""
        with self._lock:
            self._drain_hint_traffic()
            return self._collect(round_index, local)

    def _collect(self, round_index: int, local: list[ScoredGroup]) -> list[ScoredGroup]:
        received = flat = 0
        rejected_before = sum(self.rejected.values())
        for verified in self.ingress.accept_many(self.transport.drain(self.topics["rollouts"]), {Kind.ROLLOUT_GROUP}):
            if verified.kind != Kind.ROLLOUT_GROUP:
                continue
            if verified.sender == self.peer_id:
                self.rejected[OWN] += 1
                continue
            group = self.verify_group(verified.sender, verified.body)
            if group is None:
                continue
            received += 1
            flat += group.flat
            if group.flat and self.cfg.composition != "cross_actor":
                continue  # SAPO: zero-variance groups carry no advantage signal on their own
            if self.pool.add(PoolEntry(group, round_index)):
                self.observed["pool_sender_cap"] += 1  # the sender's oldest pooled group made room
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
        self.tiers_used.update(tiers)
        self.history.append({"round": round_index, "local_groups": self._local_groups,
                             "external_groups_received": received, "external_groups_used": len(chosen),
                             "external_groups_dropped": (0 if self.cfg.composition == "cross_actor" else flat)
                                                        + sum(self.rejected.values()) - rejected_before,
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
        }
        return chosen

    def _rebuild(self, sender: str, msg_ref: swarm_pb2.TaskRef, blame: bool) -> Task | None:
        try:
            return self.source.rebuild(local_task_ref(msg_ref))
        except ValueError as err:  # UnknownTaskError / UnknownDatasetError: we cannot check it
            log.debug("unknown task from %s: %s", sender, err)
            if blame:
                self.rejected[UNKNOWN] += 1
                self.ingress.report(sender, UNKNOWN_TASK)
            return None

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup) -> ScoredGroup | None:
        """Rebuild the task, re-score every completion, re-tokenize and pick each completion's
        behavior tier; None (counted) if refused."""
        if msg.hint_text:
            self.rejected[HINTED] += 1
            return None
        verifier = self.verifier
        use_sender_answer = bool(self.cfg.accept_sender_answers and msg.question and msg.answer)
        task = self._rebuild(sender, msg.task_ref, blame=not use_sender_answer)
        if task is None:
            if not use_sender_answer:
                return None
            # opt-in, as rl-swarm does: score against the sender's own answer
            task = Task(ref=local_task_ref(msg.task_ref), question=msg.question, answer=msg.answer, metadata={})
            verifier = verifier.model_copy(update={"scorer": "math"})
        try:
            prompt_ids = self.retokenizer.prompt(task.question)
        except Exception as err:  # only a sender-supplied question can be outside our vocabulary
            self.rejected[UNTOKENIZABLE] += 1
            log.debug("cannot tokenize the question from %s: %s", sender, err)
            return None
        same_verifier = msg.verifier_digest == verifier.digest
        rewards, correct, rollouts, reasons = [], [], [], []
        for completion in msg.completions:
            reward, info = verifier.score(task, self.source, completion.text)
            if info["timed_out"]:
                self.rejected[TIMEOUT] += 1
                return None
            if abs(reward - completion.claimed_reward) > REWARD_TOLERANCE:
                if same_verifier:  # it must have computed exactly our reward: a lie
                    self.rejected[MISMATCH] += 1
                    self.ingress.report(sender, WRONG_REWARD)
                    return None
                self.observed[DISAGREES] += 1
            try:
                text_ids, offsets = self.retokenizer.encode_text(completion.text)
            except Exception as err:  # a tokenizer's error on foreign text is not the sender's fault
                self.rejected[UNTOKENIZABLE] += 1
                log.debug("cannot tokenize a completion from %s: %s", sender, err)
                return None
            if len(text_ids) > self.max_completion_tokens:
                self.rejected[TOO_LONG] += 1  # would blow up our padded batch; not a protocol fault
                return None
            behavior = assign_tier(completion, msg.model.tokenizer_fingerprint, text_ids, offsets, self.retokenizer)
            rewards.append(reward)
            correct.append(bool(info["correct"]))
            reasons.append(behavior.reason)
            rollouts.append(Rollout(prompt_ids=prompt_ids, completion_ids=behavior.completion_ids,
                                    logprobs=behavior.logprobs, text=completion.text, offsets=[],
                                    truncated=completion.truncated, tier=behavior.tier, alignment=behavior.alignment))
        return ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=correct, origin=sender,
                           policy_version=msg.policy_version,
                           meta={"sender_round": msg.round, "tokenizer": msg.model.tokenizer_fingerprint,
                                 "tier_reasons": reasons})

    def _drain_hint_traffic(self) -> None:
        for verified in self.ingress.accept_many(self.transport.drain(self.topics["hints"]), {Kind.HINT}):
            if verified.kind != Kind.HINT or verified.sender == self.peer_id:
                continue
            hint = verified.body
            task = self._rebuild(verified.sender, hint.task_ref, blame=True)
            if task is None:
                continue
            if leaks_answer(hint.text, task.reference_answer):
                self.rejected[LEAK] += 1
                self.ingress.report(verified.sender, HINT_LEAK)
                continue
            if not self._encodable(hint.text):  # it would be fed to our model: check it fits now
                continue
            self._hints.append(ReceivedHint(task, LEVEL_NAMES[hint.level], hint.text, verified.sender))
        for verified in self.ingress.accept_many(self.transport.drain(self.topics["hint-requests"]), {Kind.HINT_REQUEST}):
            if verified.kind != Kind.HINT_REQUEST or verified.sender == self.peer_id:
                continue
            task = self._rebuild(verified.sender, verified.body.task_ref, blame=False)
            if task is None:  # a peer with a task family we lack: not its fault
                self.rejected[HINT_REQUEST_UNKNOWN] += 1
                continue
            if all(t.prompt_key != task.prompt_key for t, _ in self._requests):
                self._requests.append((task, verified.sender))

    def _encodable(self, text: str) -> bool:
        """Peer text our tokenizer can encode within our length cap; refusals are counted, never
        blamed (another model's alphabet is not a fault)."""
        try:
            ids, _ = self.retokenizer.encode_text(text)
        except Exception as err:  # e.g. a character outside the tiny vocabulary
            self.rejected[UNTOKENIZABLE] += 1
            log.debug("cannot tokenize peer text: %s", err)
            return False
        if len(ids) > self.max_completion_tokens:
            self.rejected[TOO_LONG] += 1
            return False
        return True

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
        snap = self.ingress.snapshot()
        with self._lock:
            return {
                "peer_id": self.peer_id,
                "swarm": self.cfg.name,
                "accepted": snap.accepted,
                "rejected_by_reason": {**snap.rejected_by_reason, **self.rejected},
                "peers": snap.peers,
                "transport": {**self.transport.stats(), **self.outbox.counters},
                "connected": self.transport.peers(),
                "listen_addrs": self.transport.listen_addrs(),
                "rounds": list(self.history),
                "used_by_sender": dict(self.used_by_sender),
                "tiers_used": dict(self.tiers_used),
                "observed": dict(self.observed),
            }
