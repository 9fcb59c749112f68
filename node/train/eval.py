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

    def evaluate(self, tasks_per_family: int | None = None, k: int | None = None) -> dict:
        """The metrics of one evaluation: heldout_pass1 / heldout_passk (in-distribution families
        pooled), heldout_k, heldout_by_family (family -> {pass1, passk, tasks}) and t_eval seconds."""
        k = self.cfg.k if k is None else k
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        started = time.perf_counter()
        rows = self.tasks(tasks_per_family)
        prompts = [self.ctx.prompt(task.question) for _, task, _ in rows]
        budget = self.ctx.params.max_new_tokens
        greedy = SamplingParams(temperature=0.0, max_new_tokens=budget, seed=self.sampling_seed)
        sampled = SamplingParams(temperature=self.ctx.params.temperature, max_new_tokens=budget,
                                 seed=self.sampling_seed)
        with preserved_rng(), _quiet_greedy_flags(), self.ctx.autocast():
            firsts = self.ctx.generator.generate(prompts, 1, greedy) if prompts else []
            samples = self.ctx.generator.generate(prompts, k, sampled) if prompts else []
        by_family: dict[str, dict[str, list[bool]]] = {}
        for (family, task, source), first, many in zip(rows, firsts, samples, strict=True):
            slot = by_family.setdefault(family, {"pass1": [], "passk": []})
            slot["pass1"].append(self._correct(task, source, first[0].text))
            slot["passk"].append(any(self._correct(task, source, r.text) for r in many))
        inside = [v for f, v in by_family.items() if not f.startswith(OOD_PREFIX)]
        pooled1 = [c for v in inside for c in v["pass1"]]
        pooledk = [c for v in inside for c in v["passk"]]
        return {
            "heldout_pass1": sum(pooled1) / len(pooled1) if pooled1 else None,
            "heldout_passk": sum(pooledk) / len(pooledk) if pooledk else None,
            "heldout_k": k,
            "heldout_by_family": {f: {"pass1": sum(v["pass1"]) / len(v["pass1"]),
                                      "passk": sum(v["passk"]) / len(v["passk"]),
                                      "tasks": len(v["pass1"])} for f, v in sorted(by_family.items())},
            "t_eval": time.perf_counter() - started,
        }

    def _correct(self, task: Task, source: TaskSource, text: str) -> bool:
        return bool(self.ctx.verifier.score(task, source, text)[1]["correct"])
