"""Built-in graded tasks that a tiny from-scratch model can learn with RL alone.

Every answer but "count"'s is one digit, so it is one token for the tiny character-level
tokenizer, whose whole alphabet is ALPHABET. Difficulty is graded (measured with the tiny preset):
"copy" is learned in about 300 rounds, "succ" and "max" in about 1,500, "add" stays near 0.5 after
1,500: the spread that lets a node that cracks a hard task first pass the "aha" on to its peers.
"count" ("3++=" -> "3456") needs four right tokens in a row (a random policy succeeds about once
in 65,000 samples, so from scratch its pass rate stays 0): the family for hints, whose solution
prefixes let a node learn it one token at a time (set sampling.max_new_tokens >= 4).

"rev", "inc" and "rot" map three digits to three digits ("123m=" -> "321", "123+=" -> "234",
"123==" -> "231"): a random policy succeeds about once in 65,000 samples. They are the families of
the tiny-warm preset, whose model is warm-started (node/train/warm_start.py) to solve them now and then.
A wrong answer of the right form (three digits) scores FORMAT_CREDIT: without it, the negative
advantages of a group's failures fall on their end-of-answer token too, after a wrong digit, and RL
taught nodes to stop ending their answers at all (every rollout then ran to the token budget and
scored 0). Their 1,000 questions are split by a hash: a fifth are held-out questions, never drawn for training
and refused as a peer's training ref, so held-out pass rates measure new questions.
"""
from __future__ import annotations

import random
from typing import Callable, Mapping

from .base import (
    Task,
    TaskRef,
    MixtureSource,
    NotConfiguredError,
    UnknownDatasetError,
    UnknownTaskError,
    WeightedChoice,
    check_seed,
    config_digest,
    question_is_heldout,
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


def _digits3(rng: random.Random) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(3))


def _rev(rng: random.Random) -> tuple[str, str]:
    s = _digits3(rng)
    return f"{s}m=", s[::-1]


def _inc(rng: random.Random) -> tuple[str, str]:
    s = _digits3(rng)
    return f"{s}+=", "".join(str((int(c) + 1) % 10) for c in s)


def _rot(rng: random.Random) -> tuple[str, str]:
    s = _digits3(rng)
    return f"{s}==", s[1:] + s[0]


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "copy": _copy,
    "succ": _succ,
    "max": _max,
    "add": _add,
    "count": _count,
    "rev": _rev,
    "inc": _inc,
    "rot": _rot,
}
DIFFICULTY = {"copy": "easy", "succ": "medium", "max": "medium", "add": "hard", "count": "multi-token",
              "rev": "multi-token", "inc": "multi-token", "rot": "multi-token"}
SPLIT_FAMILIES = frozenset({"rev", "inc", "rot"})  # held-out questions disjoint from training ones
FORMAT_CREDIT = 0.1  # reward of a well-formed wrong answer of a split family (correct = 1)
HELDOUT_FRACTION = 0.2
_DIGITS = frozenset("0123456789")
# Indices below this build held-out questions of a split family (TaskSource.heldout uses 0..n-1);
# training draws take indices above it.
HELDOUT_INDICES = 4096


def is_heldout_question(question: str) -> bool:
    """Whether a split family's question is held out: a stable hash, the same on every node."""
    return question_is_heldout(question, HELDOUT_FRACTION)


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

    def _draw_index(self, dataset: str, rng: random.Random) -> int:
        if dataset in SPLIT_FAMILIES:
            return HELDOUT_INDICES + rng.randrange(_INDEX_SPACE - HELDOUT_INDICES)
        return rng.randrange(_INDEX_SPACE)

    def rebuild(self, ref: TaskRef) -> Task:
        # Any synthetic dataset can be rebuilt, even one we do not draw: generation is trivial and
        # has no config beyond the generator version that the digest checks.
        self._check_ref_source(ref)
        if ref.dataset not in GENERATORS:  # a family of another release, perhaps
            raise NotConfiguredError(
                f"task {ref.key}: unknown synthetic dataset {ref.dataset!r}; valid: {sorted(GENERATORS)}"
            )
        expected = dataset_digest(ref.dataset)
        if ref.config_digest != expected:
            raise UnknownTaskError(
                f"task {ref.key}: config digest {ref.config_digest} does not match ours ({expected}, "
                f"generator version {GENERATOR_VERSION}) for {ref.dataset!r}"
            )
        if ref.dataset in SPLIT_FAMILIES and ref.index < HELDOUT_INDICES:
            raise UnknownTaskError(f"task {ref.key}: index {ref.index} is a held-out question of {ref.dataset!r} "
                                   f"(indices below {HELDOUT_INDICES}); nobody trains on those")
        return self._build(ref.dataset, ref.seed, ref.index)

    def score(self, task: Task, completion_text: str) -> float:
        if not isinstance(completion_text, str) or task.answer is None:
            return 0.0
        text = completion_text.strip()
        if text == task.answer:
            return 1.0
        # ASCII digits only: str.isdigit() also accepts "١٢٣" and "²³⁴", which are not this format
        if task.ref.dataset in SPLIT_FAMILIES and len(text) == len(task.answer) and set(text) <= _DIGITS:
            return FORMAT_CREDIT
        return 0.0

    def _build(self, dataset: str, seed: int, index: int) -> Task:
        rng = stable_rng(self.name, dataset, seed, index)
        question, answer = GENERATORS[dataset](rng)
        if dataset in SPLIT_FAMILIES:  # redraw until the question is on the index's side of the split
            while is_heldout_question(question) != (index < HELDOUT_INDICES):
                question, answer = GENERATORS[dataset](rng)
        ref = TaskRef(self.name, dataset, dataset_digest(dataset), seed, index)
        return Task(ref, question, answer, {"difficulty": DIFFICULTY[dataset]})
