"""SAPO exchange: publish this node's groups, verify and re-score peers' groups, mix them in.

What crosses the network is never trusted:
  transport bytes -> protocol.Ingress (signature, limits, replay, rate, bans)
                  -> rebuild question and answer from the TaskRef (never the sender's copy)
                  -> recompute every reward with our own verifier; a claimed reward that
                     disagrees rejects the group and counts against the signer
                  -> re-tokenize the text with our tokenizer (SAPO: trained as on-policy, ratio 1)
                  -> a bounded pool (by age in rounds and by size)
  SAPO mixing: drop groups whose recomputed rewards have zero variance, then sample J groups:
  "uniform" over the pool as in the paper, or "per_sender" (default): senders in random order,
  then a random group of each, so one peer publishing many valid groups cannot own the mix.
"""
from __future__ import annotations

import logging
import random
import threading
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Callable

from node.config import SwarmConfig
from node.loop import ScoredGroup
from node.tasks.base import Task, TaskRef, TaskSource
from node.verifiers import Verifier
from policy.types import Rollout
from proto import swarm_pb2
from protocol import Ingress, Kind, Limits, NodeIdentity, Outbox, Transport, topic_name
from protocol.scoring import UNKNOWN_TASK, WRONG_REWARD

log = logging.getLogger(__name__)

REWARD_TOLERANCE = 1e-3  # claimed rewards travel as float32; honest peers agree far closer than this

# Node-level rejection reasons (after protocol.Ingress accepted the bytes).
UNKNOWN = "unknown_task"          # TaskRef we cannot rebuild (and sender answers not accepted)
MISMATCH = "wrong_reward"         # claimed reward disagrees with our recomputation
UNTOKENIZABLE = "untokenizable"   # text our tokenizer cannot encode (e.g. outside the tiny vocab)
OWN = "own_message"               # our own group echoed back (gossip relays can do this)

# (question, completion text, truncated) -> (prompt ids, completion ids) in the local tokenizer
Retokenize = Callable[[str, str, bool], tuple[list[int], list[int]]]


@dataclass
class PoolEntry:
    group: ScoredGroup
    received_round: int


def to_wire(group: ScoredGroup, round_index: int, policy_version: int, model: swarm_pb2.ModelCard,
            sampling: swarm_pb2.SamplingParams) -> swarm_pb2.RolloutGroup:
    ref = group.task.ref
    msg = swarm_pb2.RolloutGroup(
        task_ref=swarm_pb2.TaskRef(source=ref.source, dataset=ref.dataset, config_digest=ref.config_digest,
                                   seed=ref.seed, index=ref.index),
        model=model, sampling=sampling, policy_version=policy_version, round=round_index,
        question=group.task.question, answer=group.task.answer or "")
    for rollout, reward in zip(group.rollouts, group.rewards):
        offsets = [x for span in rollout.offsets for x in span]
        msg.completions.add(text=rollout.text, token_ids=rollout.completion_ids,
                            behavior_logprobs=[min(lp, 0.0) for lp in rollout.logprobs or []],
                            char_offsets=offsets, claimed_reward=reward, truncated=rollout.truncated)
    return msg


class SwarmExchange:
    """Implements node.loop.Exchange over any protocol.Transport; never blocks the loop."""

    def __init__(self, transport: Transport, identity: NodeIdentity, cfg: SwarmConfig, source: TaskSource,
                 verifier: Verifier, retokenize: Retokenize, model: swarm_pb2.ModelCard,
                 sampling: swarm_pb2.SamplingParams, *, seed: int = 0, limits: Limits | None = None):
        self.transport = transport
        self.peer_id = identity.peer_id()
        self.cfg = cfg
        self.source = source
        self.verifier = verifier
        self.retokenize = retokenize
        self.model_card = model
        self.sampling = sampling
        self.seed = seed
        self.pool: deque[PoolEntry] = deque()
        self.ingress = Ingress(limits or Limits())
        self.outbox = Outbox(identity, limits=limits or Limits())
        self.topic = topic_name(cfg.name, "rollouts")
        self.rejected: Counter[str] = Counter()  # node-level reasons (Ingress counts its own)
        self.used_by_sender: Counter[str] = Counter()
        self.policy_version = 0
        self.last_round: dict = {}
        self.history: deque[dict] = deque(maxlen=100)  # per-round usage, for `swarm-node status`
        self._local_groups = 0
        self._lock = threading.Lock()  # the control service reads counters from its own thread
        transport.subscribe(self.topic)

    # -- outbound ----------------------------------------------------------------------------
    def share(self, round_index: int, groups: list[ScoredGroup]) -> None:
        self._local_groups = len(groups)
        for group in groups:
            msg = to_wire(group, round_index, self.policy_version, self.model_card, self.sampling)
            try:
                self.outbox.publish(self.transport, self.cfg.name, msg)
            except ValueError as err:  # our own group breaks a limit peers enforce: skip, say why
                log.warning("not sharing a group of %s: %s", group.task.ref.key, err)
                self.rejected["outbound_invalid"] += 1

    # -- inbound -----------------------------------------------------------------------------
    def collect(self, round_index: int) -> list[ScoredGroup]:
        with self._lock:
            return self._collect(round_index)

    def _collect(self, round_index: int) -> list[ScoredGroup]:
        received = dropped_flat = 0
        rejected_before = sum(self.rejected.values())
        for verified in self.ingress.accept_many(self.transport.drain(self.topic)):
            if verified.kind != Kind.ROLLOUT_GROUP:
                continue
            if verified.sender == self.peer_id:
                self.rejected[OWN] += 1
                continue
            group = self.verify_group(verified.sender, verified.body)
            if group is None:
                continue
            received += 1
            if len(set(group.rewards)) > 1:  # SAPO: zero-variance groups carry no advantage signal
                self._add(PoolEntry(group, round_index))
            else:
                dropped_flat += 1
        self._evict(round_index)
        chosen = self._sample(round_index)
        for group in chosen:
            self.used_by_sender[group.origin] += 1
        self.policy_version += 1  # one update per round follows collect()
        self.history.append({"round": round_index, "local_groups": self._local_groups,
                             "external_groups_received": received, "external_groups_used": len(chosen),
                             "external_groups_dropped": dropped_flat + sum(self.rejected.values()) - rejected_before})
        self.last_round = {
            "external_received": received,
            "external_used": len(chosen),
            "external_dropped_zero_variance": dropped_flat,
            "external_used_by_sender": dict(Counter(g.origin for g in chosen)),
            "pool_size": len(self.pool),
            "peers_connected": len(self.transport.peers()),
        }
        return chosen

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup) -> ScoredGroup | None:
        """Rebuild the task, re-score every completion, re-tokenize; None (counted) if refused."""
        ref = TaskRef(source=msg.task_ref.source, dataset=msg.task_ref.dataset,
                      config_digest=msg.task_ref.config_digest, seed=msg.task_ref.seed, index=msg.task_ref.index)
        verifier = self.verifier
        try:
            task = self.source.rebuild(ref)
        except ValueError as err:  # UnknownTaskError / UnknownDatasetError: we cannot check it
            if not (self.cfg.accept_sender_answers and msg.question and msg.answer):
                self.rejected[UNKNOWN] += 1
                self.ingress.report(sender, UNKNOWN_TASK)
                log.debug("unknown task from %s: %s", sender, err)
                return None
            # opt-in, as rl-swarm does: score against the sender's own answer
            task = Task(ref=ref, question=msg.question, answer=msg.answer, metadata={})
            verifier = verifier.model_copy(update={"scorer": "math"})
        rewards, correct, rollouts = [], [], []
        for completion in msg.completions:
            reward, info = verifier.score(task, self.source, completion.text)
            if abs(reward - completion.claimed_reward) > REWARD_TOLERANCE:
                self.rejected[MISMATCH] += 1
                self.ingress.report(sender, WRONG_REWARD)
                return None
            try:
                prompt_ids, completion_ids = self.retokenize(task.question, completion.text, completion.truncated)
            except Exception as err:  # a tokenizer's error on foreign text is not the sender's fault
                self.rejected[UNTOKENIZABLE] += 1
                log.debug("cannot tokenize a completion from %s: %s", sender, err)
                return None
            rewards.append(reward)
            correct.append(bool(info["correct"]))
            # SAPO: peer text re-tokenized and trained as on-policy (behavior log-probs unknown)
            rollouts.append(Rollout(prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=None,
                                    text=completion.text, offsets=[], truncated=completion.truncated))
        return ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=correct, origin=sender,
                           meta={"sender_round": msg.round, "tokenizer": msg.model.tokenizer_fingerprint})

    def _add(self, entry: PoolEntry) -> None:
        mine = [e for e in self.pool if e.group.origin == entry.group.origin]
        if len(mine) >= self.cfg.pool_max_per_sender:
            self.pool.remove(mine[0])  # the sender's oldest: no peer holds more than its share
            self.rejected["pool_sender_cap"] += 1
        self.pool.append(entry)

    def _evict(self, round_index: int) -> None:
        while self.pool and round_index - self.pool[0].received_round > self.cfg.pool_max_age_rounds:
            self.pool.popleft()
        while len(self.pool) > self.cfg.pool_max_groups:
            self.pool.popleft()  # oldest first

    def _sample(self, round_index: int) -> list[ScoredGroup]:
        rng = random.Random(f"{self.seed}/{round_index}")  # own stream: never perturbs training RNG
        k = min(self.cfg.external_per_round, len(self.pool))
        if self.cfg.sampling_policy == "uniform":
            chosen = rng.sample(list(self.pool), k)
        else:
            by_sender: dict[str, list[PoolEntry]] = defaultdict(list)
            for entry in self.pool:
                by_sender[entry.group.origin].append(entry)
            chosen = []
            while len(chosen) < k:
                senders = sorted(by_sender)
                rng.shuffle(senders)
                for sender in senders[: k - len(chosen)]:
                    entries = by_sender[sender]
                    chosen.append(entries.pop(rng.randrange(len(entries))))
                    if not entries:
                        del by_sender[sender]
        for entry in chosen:
            self.pool.remove(entry)  # a group is trained on once
        return [e.group for e in chosen]

    def status(self) -> dict:
        snap = self.ingress.snapshot()
        with self._lock:
            return {
                "peer_id": self.peer_id,
                "swarm": self.cfg.name,
                "policy_version": self.policy_version,
                "accepted": snap.accepted,
                "rejected_by_reason": {**snap.rejected_by_reason, **self.rejected},
                "peers": snap.peers,
                "transport": self.transport.stats(),
                "connected": self.transport.peers(),
                "listen_addrs": self.transport.listen_addrs(),
                "rounds": list(self.history),
                "used_by_sender": dict(self.used_by_sender),
            }
