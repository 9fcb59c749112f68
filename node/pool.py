"""The bounded pool of verified peer groups, and the samplers that pick the J external groups.

Bounds: age in rounds, total size, and groups per sender (a flooding peer evicts only its own).
Samplers (swarm.sampling_policy):
    uniform     uniform over the pool's groups, as in the SAPO paper
    per_sender  senders in random order, one group each, repeat: fair across senders (default)
    weak_tasks  informed: weighted by how badly this node does on the group's task family
                (1 - its pass-rate posterior mean), with each sender held to its fair share
A group is trained on once: sampling removes it from the pool.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Literal

from node.groups import ScoredGroup

SamplingPolicy = Literal["uniform", "per_sender", "weak_tasks"]
MIN_WEIGHT = 0.05  # weak_tasks: a family we already master still gets an occasional look


@dataclass
class PoolEntry:
    group: ScoredGroup
    received_round: int


class GroupPool:
    def __init__(self, max_groups: int, max_age_rounds: int, max_per_sender: int):
        self.max_groups = max_groups
        self.max_age_rounds = max_age_rounds
        self.max_per_sender = max_per_sender
        self.entries: deque[PoolEntry] = deque()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: PoolEntry) -> bool:
        """Adds `entry`; returns True when the sender's oldest group had to go to make room."""
        mine = [e for e in self.entries if e.group.origin == entry.group.origin]
        evicted = len(mine) >= self.max_per_sender
        if evicted:
            self.entries.remove(mine[0])  # no peer holds more than its share
        self.entries.append(entry)
        return evicted

    def evict(self, round_index: int) -> None:
        while self.entries and round_index - self.entries[0].received_round > self.max_age_rounds:
            self.entries.popleft()
        while len(self.entries) > self.max_groups:
            self.entries.popleft()  # oldest first

    def take_matching(self, prompt_keys: set[str]) -> list[ScoredGroup]:
        """Cross-actor: the newest pooled group for each of `prompt_keys`, removed from the pool."""
        newest: dict[str, PoolEntry] = {}
        for entry in self.entries:
            if entry.group.task.prompt_key in prompt_keys:
                newest[entry.group.task.prompt_key] = entry
        for entry in newest.values():
            self.entries.remove(entry)
        return [e.group for e in newest.values()]

    def sample(self, k: int, policy: SamplingPolicy, rng: random.Random,
               weakness: Callable[[ScoredGroup], float] | None = None) -> list[ScoredGroup]:
        """Up to k groups with reward variance, removed from the pool (flat groups stay: they are
        only useful merged into one of our groups)."""
        eligible = [e for e in self.entries if not e.group.flat]
        k = min(k, len(eligible))
        if policy == "uniform":
            chosen = rng.sample(eligible, k)
        elif policy == "per_sender":
            chosen = _round_robin(eligible, k, rng)
        elif policy == "weak_tasks":
            chosen = _weighted_fair(eligible, k, rng, weakness or (lambda g: 0.5))
        else:
            raise ValueError(f"unknown sampling policy {policy!r}: valid are uniform, per_sender, weak_tasks")
        for entry in chosen:
            self.entries.remove(entry)
        return [e.group for e in chosen]


def _round_robin(entries: list[PoolEntry], k: int, rng: random.Random) -> list[PoolEntry]:
    by_sender: dict[str, list[PoolEntry]] = defaultdict(list)
    for entry in entries:
        by_sender[entry.group.origin].append(entry)
    chosen: list[PoolEntry] = []
    while len(chosen) < k:
        senders = sorted(by_sender)
        rng.shuffle(senders)
        for sender in senders[: k - len(chosen)]:
            mine = by_sender[sender]
            chosen.append(mine.pop(rng.randrange(len(mine))))
            if not mine:
                del by_sender[sender]
    return chosen


def _weighted_fair(entries: list[PoolEntry], k: int, rng: random.Random,
                   weakness: Callable[[ScoredGroup], float]) -> list[PoolEntry]:
    """Weighted sampling without replacement (Efraimidis-Spirakis keys u^(1/w)), each sender capped
    at ceil(k / senders) so that weighting cannot hand the mix to one peer; slots left by senders
    with fewer groups than their share go to the next keys."""
    senders = {e.group.origin for e in entries}
    quota = math.ceil(k / max(1, len(senders)))
    keyed = sorted(entries, key=lambda e: rng.random() ** (1.0 / max(MIN_WEIGHT, weakness(e.group))), reverse=True)
    taken: dict[str, int] = defaultdict(int)
    chosen = []
    for entry in keyed:
        if len(chosen) < k and taken[entry.group.origin] < quota:
            taken[entry.group.origin] += 1
            chosen.append(entry)
    leftover = [e for e in keyed if e not in chosen]  # senders with few groups left slots unused
    return chosen + leftover[: k - len(chosen)]
