"""Built-in graded tasks that a tiny from-scratch model can learn with RL alone.

Every answer but "count"'s is one digit, so it is one token for the tiny character-level
tokenizer, whose whole alphabet is ALPHABET. Difficulty is graded (measured with the tiny preset):
"copy" is learned in about 300 rounds, "succ" and "max" in about 1,500, "add" stays near 0.5 after
1,500: the spread that lets a node that cracks a hard task first pass the "aha" on to its peers.
"count" ("3++=" -> "3456") needs four right tokens in a row (a random policy succeeds about once
in 65,000 samples, so from scratch its pass rate stays 0): the family for hints, whose solution
prefixes let a node learn it one token at a time (set sampling.max_new_tokens >= 4).
"""
from __future__ import annotations

import random
from typing import Callable, Mapping

from .base import (
    Task,
    TaskRef,
    MixtureSource,
    UnknownDatasetError,
    UnknownTaskError,
    WeightedChoice,
    check_seed,
    config_digest,
    stable_rng,
)

ALPHABET = "0123456789+=m"  # every character a question or answer may use

# Bump when a generator changes: the digest then changes and peers on the old version refuse our
# refs instead of silently scoring against different ground truth.
GENERATOR_VERSION = 1

# Index space of batch draws. Only 10 or 100 distinct questions exist per dataset, so this is just
# "large enough that the index is an arbitrary label".
_INDEX_SPACE = 2**31


def _copy(rng: random.Random) -> tuple[str, str]:
    a = rng.randrange(10)
    return f"{a}=", f"{a}"


def _succ(rng: random.Random) -> tuple[str, str]:
    a = rng.randrange(10)
    return f"{a}+1=", f"{(a + 1) % 10}"


def _max(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"m{a}{b}=", f"{max(a, b)}"


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a}+{b}=", f"{(a + b) % 10}"


def _count(rng: random.Random) -> tuple[str, str]:
    a = rng.randrange(10)
    return f"{a}++=", "".join(str((a + k) % 10) for k in range(4))


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "copy": _copy,
    "succ": _succ,
    "max": _max,
    "add": _add,
    "count": _count,
}
DIFFICULTY = {"copy": "easy", "succ": "medium", "max": "medium", "add": "hard", "count": "multi-token"}


def dataset_digest(dataset: str) -> str:
    return config_digest({"dataset": dataset, "generator_version": GENERATOR_VERSION})


class SyntheticSource(MixtureSource):
    """A weighted mixture of the GENERATORS datasets, e.g. SyntheticSource({"succ": 1, "add": 1}, seed=0)."""

    name = "synthetic"
    score_is_bounded = True  # a string comparison

    def __init__(self, datasets: Mapping[str, float], seed: int):
        unknown = sorted(set(datasets) - set(GENERATORS))
        if unknown:
            raise UnknownDatasetError(
                f"unknown synthetic dataset(s) {unknown}; valid: {sorted(GENERATORS)}"
            )
        self.seed = check_seed(seed)
        self.weights = dict(datasets)
        self._choice = WeightedChoice(self.weights)

    def _index_space(self, dataset: str) -> int:
        return _INDEX_SPACE

    def rebuild(self, ref: TaskRef) -> Task:
        # Any synthetic dataset can be rebuilt, even one we do not draw: generation is trivial and
        # has no config beyond the generator version that the digest checks.
        self._check_ref_source(ref)
        if ref.dataset not in GENERATORS:
            raise UnknownTaskError(
                f"task {ref.key}: unknown synthetic dataset {ref.dataset!r}; valid: {sorted(GENERATORS)}"
            )
        expected = dataset_digest(ref.dataset)
        if ref.config_digest != expected:
            raise UnknownTaskError(
                f"task {ref.key}: config digest {ref.config_digest} does not match ours ({expected}, "
                f"generator version {GENERATOR_VERSION}) for {ref.dataset!r}"
            )
        return self._build(ref.dataset, ref.seed, ref.index)

    def score(self, task: Task, completion_text: str) -> float:
        if not isinstance(completion_text, str) or task.answer is None:
            return 0.0
        return 1.0 if completion_text.strip() == task.answer else 0.0

    def _build(self, dataset: str, seed: int, index: int) -> Task:
        question, answer = GENERATORS[dataset](stable_rng(self.name, dataset, seed, index))
        ref = TaskRef(self.name, dataset, dataset_digest(dataset), seed, index)
        return Task(ref, question, answer, {"difficulty": DIFFICULTY[dataset]})
