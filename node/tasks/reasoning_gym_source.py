"""Tasks from reasoning-gym: a weighted mixture of its procedural datasets, each optionally configured.

reasoning-gym datasets are index-addressable and deterministic per (config, seed, index), so a
TaskRef (dataset, config digest, seed, index) is enough for any peer with the same mixture to
rebuild question and ground truth. The digest covers the full config object reasoning-gym actually
uses (our overrides, the seed and size we pass, and the library's own defaults), so peers whose
config or library version differ refuse each other's refs instead of scoring against different
ground truth.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import math
import random
from typing import Any, Iterable, Mapping

import reasoning_gym
from reasoning_gym.factory import DATASETS

from .base import (
    Task,
    TaskRef,
    MixtureSource,
    NotConfiguredError,
    UnknownDatasetError,
    UnknownTaskError,
    WeightedChoice,
    check_seed,
    heldout_seed,
    config_digest,
    question_is_heldout,
)
from .hash_seed import HASH_SEED_DEPENDENT
from .hash_seed import hash_randomization_off as _hash_randomization_off  # patched in tests

log = logging.getLogger(__name__)

# Questions per dataset. Most datasets generate entries lazily, so size costs nothing; a few
# precompute everything at construction (acre: 0.3 s at 1,000, 2.7 s at 10,000, over 60 s at
# 100,000) and word_ladder refuses more than 20,000. The source's size is capped per dataset
# (an explicit "size" in a dataset's config is used as given).
DEFAULT_SIZE = 10_000
_SIZE_CAPS = {"acre": 1_000, "word_ladder": 20_000}  # acre: keeps construction near 0.3 s

# Built-in scorers that are known to be wrong. game_of_life_halting compares bool(answer) with
# bool("True"/"False"), so any non-empty text scores 1.0: a reward a policy would learn to hack.
_STRICT_MATCH_DATASETS = frozenset({"game_of_life_halting"})

_DATASET_CACHE_SIZE = 32  # constructed datasets kept per source (a few eager ones hold word lists)
# A text split redraws a training index whose question is held out (a fraction f of draws, f <= 0.5)
# and scans held-out indices for new held-out texts; both give up, with a clear error, after this many.
_SPLIT_TRIES = 64


class NondeterministicDatasetError(ValueError):
    """A dataset whose tasks peers could not reproduce in this process."""


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def unknown_dataset_message(name: str) -> str:
    close = difflib.get_close_matches(name, dataset_names(), n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return f"unknown reasoning-gym dataset {name!r}.{hint} Valid names: {', '.join(dataset_names())}"


def _jsonable(value: Any) -> Any:
    """Same structure with non-JSON leaves (e.g. gsm_symbolic's Fraction) turned into str. Tuples
    stay tuples: arc_agi and rearc compare them in score_answer and a list fails (1.0 -> 0.05)."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, float, bool)) or k is None else str(k): _jsonable(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_jsonable(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _json_safe_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(metadata)
        return metadata  # the common case: keep the generator's objects untouched
    except (TypeError, ValueError):
        return _jsonable(metadata)


def _parse_mixture_entry(name: str, value: float | Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """A plain number is a weight; a mapping is {"weight": w (default 1.0), "config": {...}}."""
    if not isinstance(value, Mapping):
        return value, {}
    extra = set(value) - {"weight", "config"}
    if extra:
        raise ValueError(f"dataset {name!r}: unknown keys {sorted(extra)}; use 'weight' and 'config'")
    config = dict(value.get("config") or {})
    if "seed" in config:
        raise ValueError(f"dataset {name!r}: remove 'seed' from its config; the source seed is used")
    return value.get("weight", 1.0), config


class ReasoningGymSource(MixtureSource):
    """E.g. ReasoningGymSource({"leg_counting": 1.0, "basic_arithmetic": {"weight": 2.0,
    "config": {"min_terms": 2, "max_terms": 3}}}, seed=0).

    Only datasets in the mixture can be rebuilt (weight 0 = rebuild peers' tasks, never draw), and
    only at the swarm's task seeds (`seed` and `peer_seeds`, and their held-out seeds): a peer's ref for another dataset or
    config has no config we could trust, and every new seed means constructing a dataset (0.2-0.8 s
    for acre), so building datasets at any seed a peer names would be a cheap way to make us burn
    CPU. Constructed datasets are cached (at most _DATASET_CACHE_SIZE)."""

    name = "reasoning_gym"

    def __init__(self, datasets: Mapping[str, float | Mapping[str, Any]], seed: int, size: int = DEFAULT_SIZE,
                 peer_seeds: Iterable[int] = (), heldout_split: float = 0.0):
        if not 0.0 <= heldout_split <= 0.5:
            raise ValueError(f"heldout_split must be in [0, 0.5] (the fraction of question texts kept for "
                             f"held-out evaluation; 0 = off), got {heldout_split!r}")
        self.heldout_split = heldout_split
        self.seed = check_seed(seed)
        seeds = {self.seed, *(check_seed(s) for s in peer_seeds)}
        self.task_seeds = frozenset(seeds | {heldout_seed(s) for s in seeds})  # held-out evals rebuild too
        self._overrides: dict[str, dict[str, Any]] = {}
        weights = {}
        for name, value in datasets.items():
            if name not in DATASETS:
                raise UnknownDatasetError(unknown_dataset_message(name))
            if name in HASH_SEED_DEPENDENT and not _hash_randomization_off():
                raise NondeterministicDatasetError(
                    f"reasoning-gym dataset {name!r} generates different tasks under different "
                    "PYTHONHASHSEED values, so peers could not verify them; start the node with "
                    "PYTHONHASHSEED=0 to use it, or pick another dataset"
                )
            weights[name], config = _parse_mixture_entry(name, value)
            config.setdefault("size", min(size, _SIZE_CAPS.get(name, size)))
            self._overrides[name] = config
        self._choice = WeightedChoice(weights)
        self.weights = weights
        # Per-source caches (a fresh source shares nothing with another one).
        self._resolved = functools.lru_cache(maxsize=256)(self._resolve_config)
        self._dataset = functools.lru_cache(maxsize=_DATASET_CACHE_SIZE)(self._construct)
        for name in self._overrides:  # validate configs now (cheap): fail at startup, not mid-run
            self._resolved(name, seed)

    # --- TaskSource -------------------------------------------------------------------------------

    def _index_space(self, dataset: str) -> int:
        return self._resolved(dataset, self.seed)[0].size

    def rebuild(self, ref: TaskRef) -> Task:
        self._check_ref_source(ref)
        if ref.dataset not in self._overrides:
            raise NotConfiguredError(
                f"task {ref.key}: dataset {ref.dataset!r} is not in this node's reasoning-gym mixture "
                f"{sorted(self._overrides)}"
            )
        if ref.seed not in self.task_seeds:  # refused before any config or dataset is built
            raise NotConfiguredError(
                f"task {ref.key}: seed {ref.seed} is not one of this node's task seeds {sorted(self.task_seeds)}; "
                "list a peer's tasks.seed in tasks.peer_seeds to rebuild its tasks"
            )
        config, digest = self._resolved(ref.dataset, ref.seed)
        if ref.config_digest != digest:
            raise UnknownTaskError(
                f"task {ref.key}: config digest {ref.config_digest} does not match ours ({digest}) for "
                f"{ref.dataset!r} at seed {ref.seed}: different config, size or reasoning-gym version"
            )
        if ref.index >= config.size:  # a same-digest peer never sends this: the size is in the digest
            raise UnknownTaskError(f"task {ref.key}: index {ref.index} >= dataset size {config.size}")
        task = self._build(ref.dataset, ref.seed, ref.index)
        if self._is_heldout(task):  # at any seed: a peer's group on a held-out question would train us on it
            raise UnknownTaskError(f"task {ref.key}: its question is held out (tasks.heldout_split = "
                                   f"{self.heldout_split}): nobody trains on it")
        return task

    def score(self, task: Task, completion_text: str) -> float:
        """reasoning-gym's score_answer on `completion_text` (partial credit allowed). Any exception
        from a dataset scorer counts as 0.0. Some scorers run sympy on the answer and can hang on
        hostile text ("9**9**9**9"): callers scoring untrusted text must cap the wall time
        (the Verifier does)."""
        if not isinstance(completion_text, str):
            return 0.0
        if task.ref.dataset in _STRICT_MATCH_DATASETS:
            gold = task.reference_answer
            return float(gold is not None and completion_text.strip().lower() == gold.strip().lower())
        dataset = self._dataset_for(task.ref)
        # Metadata as generated (see _json_safe_metadata): a JSON round trip would break scoring.
        entry = {"question": task.question, "answer": task.answer, "metadata": task.metadata}
        try:
            score = float(dataset.score_answer(answer=completion_text, entry=entry))
        except Exception as exc:  # e.g. prime_factorization raises ValueError on non-numbers
            log.debug("score_answer of %s raised %r; scoring 0", task.ref.key, exc)
            return 0.0
        return min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0

    # --- the text split -----------------------------------------------------------------------------

    def _is_heldout(self, task: Task) -> bool:
        return self.heldout_split > 0 and question_is_heldout(task.question, self.heldout_split)

    def _draw(self, dataset: str, rng: random.Random) -> Task:
        """A training task whose question is not held out (redrawn from the same stream, so every node
        draws the same one)."""
        for _ in range(_SPLIT_TRIES):
            task = self._build(dataset, self.seed, rng.randrange(self._index_space(dataset)))
            if not self._is_heldout(task):
                return task
        raise ValueError(f"reasoning-gym dataset {dataset!r}: {_SPLIT_TRIES} draws in a row were held-out "
                         f"questions; lower tasks.heldout_split ({self.heldout_split})")

    def _heldout_of(self, dataset: str, seed: int, n: int) -> list[Task]:
        """With a text split: the first n DISTINCT held-out questions at `seed`, scanning indices in order
        (questions training can never draw); without one, indices 0..n-1 as any mixture source."""
        if not self.heldout_split:
            return super()._heldout_of(dataset, seed, n)
        tasks: dict[str, Task] = {}
        misses = 0
        for index in range(self._resolved(dataset, seed)[0].size):
            task = self._build(dataset, seed, index)
            if self._is_heldout(task) and task.question not in tasks:
                tasks[task.question], misses = task, 0
                if len(tasks) == n:
                    break
            else:
                misses += 1
            if misses > _SPLIT_TRIES * 4:  # a small question space has run out of new held-out texts
                break
        return list(tasks.values())

    # --- helpers ----------------------------------------------------------------------------------

    def digest(self, dataset: str, seed: int | None = None) -> str:
        """The config digest of `dataset` in this mixture at `seed` (default: the source seed)."""
        return self._resolved(dataset, self.seed if seed is None else seed)[1]

    def _resolve_config(self, dataset: str, seed: int) -> tuple[Any, str]:
        config_cls = DATASETS[dataset][1]
        try:
            config = config_cls(seed=seed, **self._overrides[dataset])
            if hasattr(config, "validate"):
                config.validate()
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"invalid config for reasoning-gym dataset {dataset!r}: {exc}") from exc
        return config, config_digest(dataclasses.asdict(config))

    def _construct(self, dataset: str, digest: str, seed: int):  # digest: part of the cache key
        return reasoning_gym.create_dataset(dataset, seed=seed, **self._overrides[dataset])

    def _dataset_for(self, ref: TaskRef):
        if ref.dataset not in self._overrides:
            raise NotConfiguredError(f"task {ref.key} is not from this node's reasoning-gym mixture")
        return self._dataset(ref.dataset, self._resolved(ref.dataset, ref.seed)[1], ref.seed)

    def _build(self, dataset: str, seed: int, index: int) -> Task:
        digest = self._resolved(dataset, seed)[1]
        entry = self._dataset(dataset, digest, seed)[index]
        answer = entry["answer"]
        return Task(
            TaskRef(self.name, dataset, digest, seed, index),
            entry["question"],
            answer if answer is None else str(answer),
            _json_safe_metadata(entry["metadata"]),
        )
