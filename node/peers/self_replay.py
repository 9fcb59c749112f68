"""The self-replay silo (`swarm.self_replay`): a control for the swarm against the silo.

A node that shares nothing and hears nobody, whose J external slots are filled with its OWN groups
of earlier rounds instead of peers' groups. If a swarm's gain came only from training J extra
groups with reward variance a round (free dynamic sampling, replay of past successes), this
node would gain as much; what it cannot have is its peers' knowledge
(docs/testnets-and-experiments.md "Controls: is it the peers' knowledge?").

It mirrors the real exchange (node/peers/exchange.py `collect`) in every choice that does not need a
peer: a group enters the buffer when it was sampled (a peer's is pooled when verified) and is
never offered in the round that trained it; the buffer is the same bounded GroupPool
(node/peers/pool.py, swarm.pool: max_age_rounds, max_groups, max_per_sender); only groups with
reward variance are kept (all of them in cross-actor composition, which merges them into our
group for the same prompt first); `sampling_policy` picks the J, from an RNG of its own; a picked
group is trained once. Hinted groups are never replayed (they are never shared either).

A replayed group is what a peer running our model would deliver: origin not "local", every
completion tier 0 with its sampling log-probs (node/peers/tiers.py: a same-tokenizer peer's exact
ids), so the learner treats it exactly as a peer's group: `loss.off_policy` (sender_logprobs =
false makes it tier 2, ratio 1), peer_failures, the external objective, the group-size weight.
It generates nothing (tokens_generated counts our own groups only); the learner charges its
trained tokens (tokens_trained) as it does any peer's.
"""
from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Callable

from node.config.schema import NodeConfig, SwarmConfig
from node.train.groups import ScoredGroup
from node.train.pass_rates import PassRates
from node.peers.pool import GroupPool, PoolEntry
from node.tasks.base import Task
from node.peers.tiers import EXACT, NO_LOGPROBS
from policy.types import TIER_EXACT, TIER_PROXY, TIERS

ORIGIN = "self-replay"  # the sender of every replayed group (never "local": the learner would train it as ours)


def replayed(group: ScoredGroup, round_index: int) -> ScoredGroup:
    """`group` (sampled by this node in round `round_index`) as a peer's group: new Rollout objects
    (the originals stay our own), each tier 0 with its log-probs, or tier 2 without."""
    rollouts = [dataclasses.replace(r, tier=TIER_EXACT if r.logprobs is not None else TIER_PROXY)
                for r in group.rollouts]
    reasons = [EXACT if r.logprobs is not None else NO_LOGPROBS for r in group.rollouts]
    return dataclasses.replace(group, rollouts=rollouts, origin=ORIGIN,
                               meta={"sender_round": round_index, "tier_reasons": reasons, "reward_disagreements": 0})


class SelfReplay:
    """The loop's Exchange (node/train/loop.py) for a self-replay silo: no transport, no hints (its
    hint methods do nothing), nothing a restart must keep (its buffer holds rounds-old groups)."""

    def __init__(self, cfg: SwarmConfig, seed: int = 0, weakness: Callable[[ScoredGroup], float] | None = None):
        self.cfg = cfg
        self.seed = seed
        self.weakness = weakness  # the weak_tasks sampler: 1 - our pass rate on a group's family
        self.pool = GroupPool.from_config(cfg.pool)  # no admission: every group is our own
        self.keeps_flat = cfg.composition == "cross_actor"
        self._sampled: list[ScoredGroup] = []  # this round's, buffered after this round's choice
        self.used = 0
        self.tiers_used: Counter[str] = Counter()
        self.last_round: dict = {}

    def share(self, round_index: int, groups: list[ScoredGroup]) -> None:
        self._sampled = [replayed(g, round_index) for g in groups
                         if g.hint is None and (self.keeps_flat or not g.flat)]

    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]:
        """Up to J of our groups of earlier rounds (then this round's join the buffer)."""
        self.pool.evict(round_index)
        chosen = []
        if self.keeps_flat:  # cross-actor: our earlier group for a prompt we sampled again merges first
            chosen = self.pool.take_matching({g.task.prompt_key for g in local if g.hint is None})
        rng = random.Random(f"{self.seed}/{round_index}")  # own stream: never perturbs training RNG
        chosen += self.pool.sample(self.cfg.external_per_round, self.cfg.sampling_policy, rng, self.weakness)
        for group in self._sampled:
            self.pool.add(PoolEntry(group, round_index))
        tiers = Counter(str(r.tier) for g in chosen for r in g.rollouts)
        self.used += len(chosen)
        self.tiers_used.update(tiers)
        self.last_round = {
            "external_received": len(self._sampled), "external_used": len(chosen),
            "external_samples_used": sum(len(g.correct) for g in chosen),
            "external_correct_used": sum(sum(g.correct) for g in chosen),
            "external_used_by_sender": dict(Counter(g.origin for g in chosen)),
            "external_tiers": {str(t): tiers.get(str(t), 0) for t in TIERS},
            "external_tier_reasons": dict(Counter(reason for g in chosen for reason in g.meta["tier_reasons"])),
            "external_staleness_rounds": [round_index - g.meta["sender_round"] for g in chosen],
            "pool_size": len(self.pool),
        }
        self._sampled = []
        return chosen

    def request_hints(self, tasks: list[Task]) -> None:
        pass  # nobody to ask

    def take_hints(self) -> list:
        return []

    def take_hint_requests(self, k: int, answerable=None) -> list[tuple[Task, str]]:
        return []

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None:
        pass

    def state_dict(self) -> None:
        return None  # nothing to save with a checkpoint

    def status(self) -> dict:
        """The fields of SwarmExchange.status() a testnet reports, for a node with no peers."""
        return {"peer_id": None, "accepted": 0, "rejected_by_reason": {}, "used_by_sender": {ORIGIN: self.used},
                "tiers_used": dict(self.tiers_used), "transport": "none (self-replay silo)", "peers": [],
                "connected": []}

    def close(self) -> None:
        pass


def silo_exchange(cfg: NodeConfig, pass_rates: PassRates) -> SelfReplay | None:
    """The exchange of a node that trains alone: a SelfReplay with swarm.self_replay and J > 0, else None."""
    if not (cfg.swarm.self_replay and cfg.swarm.external_per_round > 0):
        return None
    return SelfReplay(cfg.swarm, cfg.run.seed, pass_rates.weakness)  # as the real exchange's (node/service/assembly.py)
