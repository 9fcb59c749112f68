"""Task addressing, the TaskSource interface, and the stable hashing every source builds on.

A TaskRef is what crosses the network: a receiver rebuilds question and ground truth from it with
its own source and never trusts the sender's copy. So everything here is a pure function of its
inputs: stable hashes (sha256, never Python's salted hash()), no shared RNG state.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import math
import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping

SOURCE_KINDS = ("reasoning_gym", "synthetic")

_DIGEST_RE = re.compile(r"^[0-9a-f]{16}$")
_DATASET_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class UnknownTaskError(ValueError):
    """A TaskRef this source cannot rebuild (wrong source, dataset not configured, digest mismatch)."""


class NotConfiguredError(UnknownTaskError):
    """A TaskRef of a source, dataset or seed this node does not configure: what an honest peer with
    another task mix sends (node/peers/verify.py charges it nothing net), unlike a ref that names a
    configured family wrongly (digest, index, a held-out question)."""


class UnknownDatasetError(ValueError):
    """A dataset name that does not exist in a source's registry."""


# --- stable hashing -------------------------------------------------------------------------------


def _json_fallback(value: Any) -> Any:
    # Only types with a stable text form: a repr() fallback could embed memory addresses.
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date subclass
        return value.isoformat()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=canonical_json)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot canonicalize {type(value).__name__} for a config digest")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and compact separators: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_fallback)


def config_digest(config: Mapping[str, Any]) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of a dataset config."""
    return hashlib.sha256(canonical_json(dict(config)).encode()).hexdigest()[:16]


def stable_rng(*parts: Any) -> random.Random:
    """A fresh random.Random seeded from a sha256 of `parts`: identical on every machine and run."""
    digest = hashlib.sha256(canonical_json(list(parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def heldout_seed(seed: int) -> int:
    """The seed of held-out evaluation tasks of a source whose training seed is `seed`: a stable
    63-bit hash of ("heldout", seed), never equal to `seed`. Training draws use `seed` only."""
    digest = hashlib.sha256(canonical_json(["heldout", seed]).encode()).digest()
    derived = int.from_bytes(digest[:8], "big") >> 1
    return derived if derived != seed else derived ^ 1


def question_is_heldout(question: str, fraction: float) -> bool:
    """Whether `question` is on the held-out side of a split by its TEXT: a stable hash, the same on
    every node, so no training draw of any seed ever repeats a held-out question word for word."""
    return hashlib.sha256(question.encode()).digest()[0] < fraction * 256


# --- task addressing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskRef:
    """Names one task: rebuildable by anyone whose source has the same dataset and config."""

    source: str  # "reasoning_gym" | "synthetic"
    dataset: str
    config_digest: str  # config_digest() of the dataset config the task was generated with
    seed: int
    index: int

    def __post_init__(self) -> None:
        # Refs arrive from untrusted peers: reject malformed ones here, once, with a clear reason.
        for name in ("source", "dataset", "config_digest"):
            if type(getattr(self, name)) is not str:
                raise ValueError(f"TaskRef.{name} must be a str, got {getattr(self, name)!r}")
        for name in ("seed", "index"):
            if type(getattr(self, name)) is not int:  # bool is an int subclass: refuse it too
                raise ValueError(f"TaskRef.{name} must be an int, got {getattr(self, name)!r}")
        if not _DATASET_NAME_RE.match(self.source) or not _DATASET_NAME_RE.match(self.dataset):
            raise ValueError(f"TaskRef source/dataset must match {_DATASET_NAME_RE.pattern}")
        if not _DIGEST_RE.match(self.config_digest):
            raise ValueError(f"TaskRef.config_digest must be 16 lowercase hex digits, got {self.config_digest!r}")
        if self.index < 0:
            raise ValueError(f"TaskRef.index must be >= 0, got {self.index}")
        if not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"TaskRef.seed must fit in 64 bits, got {self.seed}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskRef:
        expected = {f.name for f in dataclasses.fields(cls)}
        if set(data) != expected:
            raise ValueError(f"TaskRef needs exactly the keys {sorted(expected)}, got {sorted(data)}")
        return cls(**data)

    @property
    def key(self) -> str:
        """Compact unique string, e.g. 'synthetic/add/3f2a.../7/123' (for logs, dedup, dict keys)."""
        return f"{self.source}/{self.dataset}/{self.config_digest}/{self.seed}/{self.index}"


@dataclass(frozen=True)
class Task:
    """A question with its ground truth. `answer` is None for reasoning-gym tasks that have no single
    correct answer (their scorer checks a solution instead); `metadata` is whatever the generator
    needs for scoring, kept as generated (JSON-serializable, but scoring uses the original types)."""

    ref: TaskRef
    question: str
    answer: str | None
    metadata: dict = field(default_factory=dict, hash=False)

    @functools.cached_property
    def prompt_key(self) -> str:
        """Identifies the prompt rather than the draw: two refs whose rebuilt questions are equal
        (the tiny families have only 10-100 distinct questions) share one key. Used to merge a
        peer's group with ours (cross-actor), to keep pass-rate posteriors and to match hints.
        Computed once per task (a sha256 of the question; a node asks it thousands of times a round)."""
        digest = hashlib.sha256(self.question.encode("utf-8")).hexdigest()[:16]
        return f"{self.ref.source}/{self.ref.dataset}/{self.ref.config_digest}/{digest}"

    @property
    def reference_answer(self) -> str | None:
        """An answer that scores 1.0: the stored answer, else reasoning-gym's `example_answer`."""
        if self.answer is not None:
            return self.answer
        example = self.metadata.get("example_answer")
        return example if isinstance(example, str) else None


class TaskSource(ABC):
    """Draws tasks for rounds, rebuilds tasks from refs, and scores answers.

    `batch(r, n)` depends only on the source's configuration, seed, r and n (slot k of a batch does
    not even depend on n), never on call history: a resumed run draws exactly what an uninterrupted
    one would have drawn for round r."""

    name: str  # one of SOURCE_KINDS; also TaskRef.source of every task this source makes
    # True when score() is cheap and bounded for any text, so callers need no wall-clock cap.
    score_is_bounded: bool = False

    @abstractmethod
    def batch(self, round_index: int, n: int) -> list[Task]: ...

    @abstractmethod
    def rebuild(self, ref: TaskRef) -> Task:
        """The exact task `ref` names; UnknownTaskError if this source cannot build it."""

    @abstractmethod
    def score(self, task: Task, completion_text: str) -> float:
        """Correctness of `completion_text`, taken as the final answer, in [0, 1]. Never raises on
        any text; a task from another source is a caller error (UnknownTaskError)."""

    def heldout(self, n_per_dataset: int, seed: int | None = None) -> list[Task]:
        """Held-out tasks: `n_per_dataset` tasks of every dataset with weight > 0 (sorted by name),
        indices 0..n-1 at `seed` (default heldout_seed(self.seed)), never drawn by `batch`."""
        raise NotImplementedError(f"{type(self).__name__} has no held-out tasks")

    def _check_ref_source(self, ref: TaskRef) -> None:
        if ref.source != self.name:
            raise NotConfiguredError(
                f"task {ref.key} comes from source {ref.source!r}; this source builds {self.name!r} tasks"
            )


class MixtureSource(TaskSource):
    """A source that draws each batch slot from a weighted mixture of datasets. Subclasses set
    `seed` and `_choice` (a WeightedChoice) and say how big each dataset is and how to build one."""

    seed: int
    _choice: WeightedChoice

    def batch(self, round_index: int, n: int) -> list[Task]:
        check_batch_args(round_index, n)
        tasks = []
        for slot in range(n):
            rng = stable_rng(self.name, "batch", self.seed, round_index, slot)
            tasks.append(self._draw(self._choice.pick(rng.random()), rng))
        return tasks

    def _draw(self, dataset: str, rng: random.Random) -> Task:
        """A training draw of `dataset` from the slot's stream (a subclass may redraw, e.g. past held-out texts)."""
        return self._build(dataset, self.seed, self._draw_index(dataset, rng))

    def _draw_index(self, dataset: str, rng: random.Random) -> int:
        """The index of a training draw of `dataset` (a subclass may keep some indices for held-out use)."""
        return rng.randrange(self._index_space(dataset))

    def heldout(self, n_per_dataset: int, seed: int | None = None) -> list[Task]:
        """Held-out evaluation tasks: for every dataset with weight > 0 (sorted by name), the tasks
        at indices 0..n_per_dataset-1 (fewer if the dataset is smaller) built with `seed`, by
        default heldout_seed(self.seed). `batch` only ever builds tasks at `self.seed`, so no
        held-out TaskRef is ever drawn for training; the list is a pure function of (mixture,
        seed, n) and each task is rebuildable by a peer from its ref like any other.

        Honest limit: the refs are disjoint, the QUESTIONS not necessarily. The synthetic families
        have only 10 (copy, succ, count) or 100 (max, add) distinct questions, so a held-out ref of
        theirs almost surely repeats a question training has seen: there, held-out pass rates
        measure the policy on the family's question set, not generalisation to new questions (an
        out-of-distribution family the node never trains on, e.g. "add" for the tiny preset, is the
        real check). reasoning-gym datasets built with another seed give new questions when their
        question space is large; a small config repeats some (measured on the smollm2 preset's
        2-term 1-digit basic_arithmetic and 1-2 animal leg_counting: 6 of 32 held-out questions
        occur among the 800 training draws of the first 200 rounds). A reasoning-gym source with a
        text split (tasks.heldout_split) closes that gap: its held-out questions are distinct texts that
        no training draw of any seed can be (ReasoningGymSource)."""
        check_batch_args(0, n_per_dataset)
        seed = heldout_seed(self.seed) if seed is None else check_seed(seed)
        if seed == self.seed:
            raise ValueError(f"held-out tasks need a seed that training never draws with; {seed} is the "
                             "training seed (default: heldout_seed(training seed))")
        return [task for dataset in self._choice.names for task in self._heldout_of(dataset, seed, n_per_dataset)]

    def _heldout_of(self, dataset: str, seed: int, n: int) -> list[Task]:
        """The held-out tasks of one dataset: indices 0..n-1 at `seed` (a subclass may split by text)."""
        return [self._build(dataset, seed, index) for index in range(min(n, self._index_space(dataset)))]

    @abstractmethod
    def _index_space(self, dataset: str) -> int:
        """Indices of `dataset` are drawn from range(this)."""

    @abstractmethod
    def _build(self, dataset: str, seed: int, index: int) -> Task: ...


# --- weighted mixtures ----------------------------------------------------------------------------


def check_seed(seed: int) -> int:
    if type(seed) is not int or not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed must be an int that fits in 64 bits, got {seed!r}")
    return seed


def check_batch_args(round_index: int, n: int) -> None:
    if type(round_index) is not int or round_index < 0:
        raise ValueError(f"round_index must be an int >= 0, got {round_index!r}")
    if type(n) is not int or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")


class WeightedChoice:
    """Picks a dataset name from a uniform draw in [0, 1). Names are sorted so that two nodes with
    the same mixture written in a different order draw the same tasks. Weight 0 is allowed: the
    dataset is never drawn locally but peers' tasks from it can still be rebuilt."""

    def __init__(self, weights: Mapping[str, float]):
        for name, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(f"weight of {name!r} must be a number, got {weight!r}")
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"weight of {name!r} must be finite and >= 0, got {weight!r}")
        self.names = sorted(name for name, weight in weights.items() if weight > 0)
        if not self.names:
            raise ValueError(f"at least one dataset needs a weight > 0, got {dict(weights)}")
        total = float(sum(weights[name] for name in self.names))
        running, self._cumulative = 0.0, []
        for name in self.names:
            running += weights[name] / total
            self._cumulative.append(running)

    def pick(self, u: float) -> str:
        for name, upper in zip(self.names, self._cumulative):
            if u < upper:
                return name
        return self.names[-1]  # u at the top end of float rounding
