"""Held-out evaluation: how well a node's policy answers tasks it never trains on.

Every `eval.every` rounds (after that round's update) the node answers a fixed held-out set:

    in-distribution  `eval.tasks_per_family` tasks of every training family (weight > 0), built
                     with heldout_seed(tasks.seed), a seed training never draws with
                     (TaskSource.heldout): no held-out TaskRef is ever a training draw
    out-of-dist.     the same number of tasks of every `eval.ood` family (never in the training
                     mixture), reported as "ood:<name>"

and scores two numbers per family with the node's own verifier:

    pass@1  greedy decoding (temperature 0), one completion: correct or not
    pass@k  k completions at the sampling temperature; the task passes if any is correct
    pass@k' for each k' in `eval.pass_at` (optional): n = max(k, every k') completions per task and
            the unbiased estimator 1 - C(n - c, k') / C(n, k') of Chen et al. 2021 ("Evaluating Large
            Language Models Trained on Code", c correct of n); pass@k is that estimator too, which
            is "any of k correct" when n = k

Both use a FIXED SamplingParams.seed (and every global RNG is restored afterwards), so evaluating
never consumes or perturbs the training RNG: a run with evaluation trains exactly like one
without, and `--resume` stays exact. The set is the same at every evaluation and on every node
with the same task config, so pass rates are comparable across rounds and across nodes.

Caveat (see TaskSource.heldout): held-out REFS are never trained on, held-out QUESTIONS can be.
The synthetic families have only 10-100 distinct questions, so their held-out refs repeat training
questions; for the tiny preset the OOD family ("add") is the real generalisation check.
reasoning-gym held-out tasks are new questions unless a config's question space is small (the
smollm2 preset's small configs: about 1 in 5 already seen after 200 rounds). OOD families are
never trained, whatever their size.
"""
from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch

from node.config.sections import EvalConfig
from node.tasks.base import Task, TaskSource, heldout_seed, stable_rng
from policy.types import SamplingParams

if TYPE_CHECKING:
    from node.train.assembly import SamplingContext

OOD_PREFIX = "ood:"


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Every global RNG (torch CPU and CUDA, python, numpy) is put back as it was on exit."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _quiet_greedy_flags() -> Iterator[None]:
    """HF warns that greedy decoding ignores top_k (pinned to 0 by HFGenerator for sampling): noise."""
    hf_log = logging.getLogger("transformers.generation.configuration_utils")
    drop = lambda record: "generation flags are not valid" not in record.getMessage()  # noqa: E731
    hf_log.addFilter(drop)
    try:
        yield
    finally:
        hf_log.removeFilter(drop)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task from n samples of which c are correct (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k), as a stable product; exactly 1.0 or 0.0 ("any of k") when n == k."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at(correct: list[int], n: int, k: int) -> float:
    """pass@k over tasks: the mean of each task's estimate (correct: c per task, of n samples)."""
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)


@dataclass
class Evaluator:
    """Greedy pass@1 and sampled pass@k of the node's policy on the held-out set (module docstring)."""

    cfg: EvalConfig
    ctx: SamplingContext  # the training mixture's source gives held-out tasks of its families
    ood_source: TaskSource | None  # the eval.ood families (None when there are none)
    _cache: dict[int, list[tuple[str, Task, TaskSource]]] = field(default_factory=dict, repr=False)

    @property
    def seed(self) -> int:
        """The held-out task seed: derived from the training seed, never equal to it."""
        return heldout_seed(self.ctx.source.seed)

    @property
    def sampling_seed(self) -> int:
        """The fixed generation seed of every evaluation (the same set of samples for the same weights)."""
        return stable_rng("eval-sampling", self.seed).randrange(2**31)

    def due(self, round_index: int) -> bool:
        return self.cfg.every > 0 and (round_index + 1) % self.cfg.every == 0

    def tasks(self, tasks_per_family: int | None = None) -> list[tuple[str, Task, TaskSource]]:
        """(family, task, scoring source) of the whole held-out set; OOD families as "ood:<name>"."""
        n = self.cfg.tasks_per_family if tasks_per_family is None else tasks_per_family
        if n not in self._cache:
            rows = [(t.ref.dataset, t, self.ctx.source) for t in self.ctx.source.heldout(n, self.seed)]
            if self.ood_source is not None:
                rows += [(OOD_PREFIX + t.ref.dataset, t, self.ood_source)
                         for t in self.ood_source.heldout(n, self.seed)]
            self._cache[n] = rows
        return self._cache[n]

    def evaluate(self, tasks_per_family: int | None = None, k: int | None = None,
                 pass_at: list[int] | None = None) -> dict:
        """The metrics of one evaluation: heldout_pass1 / heldout_passk (in-distribution families
        pooled), heldout_k, heldout_by_family (family -> {pass1, passk, tasks}) and t_eval seconds;
        with `pass_at` (default eval.pass_at) also heldout_pass_at {k': pooled estimate} and each
        family's pass_at."""
        k = self.cfg.k if k is None else k
        pass_at = list(self.cfg.pass_at if pass_at is None else pass_at)
        if k < 1 or any(x < 1 for x in pass_at):
            raise ValueError(f"every k of pass@k must be >= 1, got k={k}, pass_at={pass_at}")
        n = max([k, *pass_at])
        started = time.perf_counter()
        rows = self.tasks(tasks_per_family)
        prompts = [self.ctx.prompt(task.question) for _, task, _ in rows]
        budget = self.ctx.params.max_new_tokens
        greedy = SamplingParams(temperature=0.0, max_new_tokens=budget, seed=self.sampling_seed)
        sampled = SamplingParams(temperature=self.ctx.params.temperature, max_new_tokens=budget,
                                 seed=self.sampling_seed)
        with preserved_rng(), _quiet_greedy_flags(), self.ctx.autocast():
            firsts = self.ctx.generator.generate(prompts, 1, greedy) if prompts else []
            samples = self.ctx.generator.generate(prompts, n, sampled) if prompts else []
        by_family: dict[str, dict[str, list]] = {}
        for (family, task, source), first, many in zip(rows, firsts, samples, strict=True):
            slot = by_family.setdefault(family, {"pass1": [], "correct": []})
            slot["pass1"].append(self._correct(task, source, first[0].text))
            slot["correct"].append(sum(self._correct(task, source, r.text) for r in many))  # c of n
        inside = [v for f, v in by_family.items() if not f.startswith(OOD_PREFIX)]
        pooled = {key: [c for v in inside for c in v[key]] for key in ("pass1", "correct")}

        def at(v: dict, k_: int) -> float | None:
            return mean_pass_at(v["correct"], n, k_) if v["correct"] else None

        return {
            "heldout_pass1": sum(pooled["pass1"]) / len(pooled["pass1"]) if pooled["pass1"] else None,
            "heldout_passk": at(pooled, k),
            "heldout_k": k,
            **({"heldout_pass_at": {str(x): at(pooled, x) for x in pass_at}} if pass_at else {}),
            "heldout_by_family": {f: {"pass1": sum(v["pass1"]) / len(v["pass1"]), "passk": at(v, k),
                                      "tasks": len(v["pass1"]),
                                      **({"pass_at": {str(x): at(v, x) for x in pass_at}} if pass_at else {})}
                                  for f, v in sorted(by_family.items())},
            "t_eval": time.perf_counter() - started,
        }

    def _correct(self, task: Task, source: TaskSource, text: str) -> bool:
        return bool(self.ctx.verifier.score(task, source, text)[1]["correct"])
