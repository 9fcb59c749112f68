"""The training thread's verification budget: `swarm.verify_budget_s` seconds a round for the mix's
picks and the audit together (node/peers/exchange.py `collect`).

Each verification is given a scorer deadline cut to SCORING_SHARE of what is left (the checks after
scoring take the rest), so a scorer that runs to its deadline cannot stall a round: before the
budget, a peer's groups whose answers ran to the 2 s deadline cost up to ~36 s a round. A group
whose scoring runs past its cut deadline is refused as `score_timeout` (its key benched, never
blamed), as at the whole deadline. Once all but MIN_LEFT_SHARE of the budget is spent nothing more
is verified this round (counted: `deferred`); the pool then takes only groups already verified
(node/peers/pool.py). Not thread-safe: the training thread's alone.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

SCORING_SHARE = 0.8  # of what is left of the budget, the scorer deadlines'; the checks after take the rest
MIN_LEFT_SHARE = 0.1  # with less of the budget left, nothing more starts: a sliver would refuse honest picks

R = TypeVar("R")


class VerifyBudget:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.spent = 0.0  # seconds verifying this round
        self.deferred = 0  # verifications this round left undone: the budget was spent

    def start_round(self) -> None:
        self.spent, self.deferred = 0.0, 0

    def run(self, verify: Callable[[float], R]) -> R | None:
        """`verify(scorer seconds)` if the budget is not spent, its seconds counted; else None, counted."""
        left = self.seconds - self.spent
        if left < MIN_LEFT_SHARE * self.seconds:
            self.deferred += 1
            return None
        started = time.perf_counter()
        try:
            return verify(SCORING_SHARE * left)
        finally:
            self.spent += time.perf_counter() - started
