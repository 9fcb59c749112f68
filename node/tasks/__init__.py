"""Task sources. Every task is addressed by a TaskRef from which question and answer are rebuilt."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .base import SOURCE_KINDS, NotConfiguredError, Task, TaskRef, TaskSource, UnknownDatasetError, UnknownTaskError

__all__ = ["SOURCE_KINDS", "NotConfiguredError", "Task", "TaskRef", "TaskSource", "UnknownDatasetError",
           "UnknownTaskError", "make_source"]


def make_source(kind: str, datasets: Mapping[str, Any], seed: int, peer_seeds: Sequence[int] = (),
                heldout_split: float = 0.0, **options: Any) -> TaskSource:
    """Build a task source: kind "synthetic" (weights over copy/succ/max/add) or "reasoning_gym"
    (weights or {"weight", "config"} per dataset; options: size). `peer_seeds`: peers' task seeds a
    reasoning-gym source also rebuilds (synthetic tasks need no dataset: any seed is rebuilt).
    `heldout_split` (reasoning_gym): the fraction of question texts kept for held-out evaluation only."""
    # Imported here: reasoning-gym takes about 2 s to import and synthetic runs never need it.
    if kind == "synthetic":
        from .synthetic import SyntheticSource  # (see above)

        if heldout_split:
            raise ValueError("tasks.heldout_split is for reasoning_gym sources; the synthetic families split "
                             "their own questions (node/tasks/synthetic.py SPLIT_FAMILIES): leave it at 0")
        return SyntheticSource(datasets, seed, **options)
    if kind == "reasoning_gym":
        from .reasoning_gym_source import ReasoningGymSource  # about 2 s

        return ReasoningGymSource(datasets, seed, peer_seeds=peer_seeds, heldout_split=heldout_split, **options)
    raise ValueError(f"unknown task source kind {kind!r}; valid: {', '.join(SOURCE_KINDS)}")
