"""The compute clock's evaluation grid (node/testnet/memory.py): every node of every mix and seed is
evaluated at the same virtual instants 0, s, 2s, ... and at the budget (an instant within s/2 before
the budget is left out), so the report compares curves point by point and interpolates nothing
(node/testnet/report_clock.py).

The spacing s = eval.every x the nominal silo round: the virtual cost, on the preset's fast device
profile, of a round that generates and trains (I + J) x sampling.group_size completions of
sampling.max_new_tokens tokens each (I + J: the plan's largest update). It depends on the preset and
--set only, so it is known before the first run, even when that run derives the budget, and is the
same for every mix, every seed and separate testnet invocations of one preset. Real completions are
often shorter than max_new_tokens and not every group is trained, so a silo node usually runs more
than eval.every rounds per spacing (tiny-warm: about twice as many). eval.every = 0: only 0 and the
budget. Under this clock the nodes' own every-eval.every-rounds evaluations are off: the grid
replaces them.

Exact weights: a node's point at t is measured with the weights it had at t, those after its last
round that ENDED at or before t. A round [start, end) runs at one instant and its cost is known only
afterwards, so before each round the weights its optimizer updates are copied (a copy of the
trainable tensors: microseconds for the tiny model, ~0.5 GB of float32 for a 135M one), and an
instant inside [start, end) is measured with that copy swapped in. Instants are measured lazily:
when the node's next round starts (every instant before that start is settled then) and at the
end; instants with the same weights share one evaluation (it is deterministic: node/train/eval.py). A node
down (--kill) at an instant is measured with the weights it restarts from (its checkpoint). The
budget's point uses the weights of the last round that ended by the budget: a round that straddles
it counts in the training figures (rounds, reward), not in the held-out ones.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from node.config.schema import load_config
from node.testnet.clock import fast_profile, round_cost


def grid_spacing(plan) -> float | None:
    """Virtual seconds between grid instants (module docstring; plan.grid_s when set: separate
    invocations with different batch shapes share one grid); None when eval.every = 0."""
    if plan.grid_s is not None:
        return plan.grid_s
    cfg = load_config(plan.preset, None, plan.overrides)
    if cfg.eval.every == 0:
        return None
    tokens = max(sum(mix) for mix in plan.mixes) * cfg.sampling.group_size * cfg.sampling.max_new_tokens
    silo_round = {"tokens_generated": tokens, "tokens_trained": tokens, "generate_calls": 1,  # one batched call
                  "optimizer_steps": 1}
    nominal = round_cost(silo_round, fast_profile(plan.preset))
    return cfg.eval.every * nominal


def grid_instants(spacing: float | None, budget: float) -> list[float]:
    """0, s, 2s, ... then the budget itself; an instant less than s/2 before the budget is left out
    (the budget's point stands for it: no near-duplicate point weighs the end twice in the AUC)."""
    if spacing is None:
        return [0.0, budget]
    count = int(budget // spacing) + 1
    return [*(k * spacing for k in range(count) if k == 0 or k * spacing <= budget - spacing / 2), budget]


class WeightCopy:
    """A copy of the tensors a node's optimizer updates (all that a round changes in its model)."""

    def __init__(self, node) -> None:
        self.params = [p for group in node.learner.optimizer.param_groups for p in group["params"]]
        self.saved = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def capture(self) -> None:
        for param, saved in zip(self.params, self.saved):
            saved.copy_(param)

    @contextlib.contextmanager
    def swapped_in(self, node) -> Iterator[None]:
        """The node's model holds the copied weights inside the block, its own ones again after it;
        the generator is refreshed both ways (a sampling copy or vLLM holds its own weights)."""
        with torch.no_grad():
            current = [p.detach().clone() for p in self.params]
            for param, saved in zip(self.params, self.saved):
                param.copy_(saved)
        node.generator.refresh(node.learner.policy_version)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, own in zip(self.params, current):
                    param.copy_(own)
            node.generator.refresh(node.learner.policy_version)


@dataclass
class _Track:
    """One node's grid state: its points, the next instant's index, its latest round."""

    evals: list[dict] = field(default_factory=list)
    next_k: int = 0
    copy: WeightCopy | None = None  # the weights before its latest round
    span: tuple[float, float] | None = None  # [start, end) of its latest round; None: none since (re)start


class GridEvaluator:
    """Held-out points of every node on the shared grid, each with the weights of that instant."""

    def __init__(self, spacing: float | None, nodes: int) -> None:
        self.spacing = spacing
        self.tracks = [_Track() for _ in range(nodes)]

    def evals(self, index: int) -> list[dict]:
        return self.tracks[index].evals

    def restarted(self, index: int) -> None:
        """Node `index` was (re)built: its current weights hold until its next round ends."""
        track = self.tracks[index]
        track.copy, track.span = None, None

    def before_round(self, index: int, node, start: float) -> None:
        """Settle the instants before `start`, then copy the weights this round will change."""
        self._settle(index, node, self._pending(index, start))
        track = self.tracks[index]
        if track.copy is None:
            track.copy = WeightCopy(node)
        else:
            track.copy.capture()

    def after_round(self, index: int, start: float, end: float) -> None:
        self.tracks[index].span = (start, end)

    def down(self, index: int, node, now: float) -> None:
        """Node `index` is killed at `now`: settle the instants before it, let go of its weights."""
        self._settle(index, node, self._pending(index, now))
        self.restarted(index)

    def finish(self, index: int, node, budget: float) -> list[dict]:
        """Settle every grid instant up to and including the budget; returns the node's points. (With a
        derived budget an instant just before it may have been measured before the budget was known.)"""
        grid = grid_instants(self.spacing, budget)
        self._settle(index, node, [*(t for t in self._pending(index, budget) if t in grid), budget], final=True)
        track = self.tracks[index]
        track.copy, track.evals = None, [e for e in track.evals if e["vtime"] in grid]
        return track.evals

    def _pending(self, index: int, before: float) -> list[float]:
        """The grid instants k * spacing not yet measured and earlier than `before` (0 always counts)."""
        track, out = self.tracks[index], []
        while True:
            t = 0.0 if self.spacing is None else track.next_k * self.spacing
            if track.next_k > 0 and (self.spacing is None or t >= before):
                return out
            out.append(t)
            track.next_k += 1

    def _settle(self, index: int, node, instants: list[float], final: bool = False) -> None:
        """Measure `instants` with the weights the node had at each: the copy inside its latest round,
        its current weights at or after that round's end; one evaluation per set of weights. eval.pass_at
        (many samples a task) only when `final`: the budget's point, not every instant of the grid."""
        pass_at = None if final else []
        track = self.tracks[index]
        inside = [t for t in instants if track.span is not None and t < track.span[1]]
        if any(t < track.span[0] for t in inside):
            raise RuntimeError(f"node{index}: grid instant {min(inside)} before its latest round was not measured")
        after = [t for t in instants if t not in inside]
        if inside:
            with track.copy.swapped_in(node):
                self._record(track, inside, node.next_round - 1, node.evaluate(pass_at=pass_at))
        if after:
            self._record(track, after, node.next_round, node.evaluate(pass_at=pass_at))
            node.metrics.last_heldout = track.evals[-1]["heldout_pass1"]  # the live dashboard's column

    @staticmethod
    def _record(track: _Track, instants: list[float], rounds: int, result: dict) -> None:
        track.evals.extend({"vtime": t, "round": rounds, **result} for t in instants)
