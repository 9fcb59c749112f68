"""Task sources: determinism, rebuild from refs, mixtures, errors, and reasoning-gym scoring."""
from __future__ import annotations

import collections
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.tasks import make_source
from node.tasks.base import (
    Task,
    TaskRef,
    UnknownDatasetError,
    UnknownTaskError,
    canonical_json,
    config_digest,
    heldout_seed,
)
from node.tasks.synthetic import ALPHABET, GENERATORS, SyntheticSource

from tests.support.processes import repo_env

REPO_ROOT = Path(__file__).resolve().parents[3]
ALL_SYNTHETIC = {"copy": 1.0, "succ": 1.0, "max": 1.0, "add": 1.0, "count": 1.0, "rev": 1.0, "inc": 1.0, "rot": 1.0}
RG_MIX = {"basic_arithmetic": 1.0, "leg_counting": 1.0, "chain_sum": 1.0}


def _triples(tasks: list[Task]) -> list[tuple[str, str, str | None]]:
    return [(t.ref.key, t.question, t.answer) for t in tasks]


# --- TaskRef and digests --------------------------------------------------------------------------


def test_task_ref_round_trips_through_dict_and_has_a_compact_key():
    ref = TaskRef("synthetic", "add", "0123456789abcdef", 7, 42)
    assert TaskRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref
    assert ref.key == "synthetic/add/0123456789abcdef/7/42"


@pytest.mark.parametrize(
    "changes",
    [
        {"config_digest": "XYZ"},
        {"config_digest": "0123456789ABCDEF"},
        {"index": -1},
        {"seed": True},
        {"index": "3"},
        {"dataset": "a/b"},
        {"dataset": ""},
        {"seed": 2**64},
    ],
)
def test_malformed_task_refs_are_rejected(changes):
    data = {"source": "synthetic", "dataset": "add", "config_digest": "0123456789abcdef", "seed": 1, "index": 0}
    with pytest.raises(ValueError):
        TaskRef.from_dict({**data, **changes})


def test_from_dict_requires_exactly_the_ref_fields():
    data = TaskRef("synthetic", "add", "0123456789abcdef", 1, 0).to_dict()
    with pytest.raises(ValueError, match="exactly the keys"):
        TaskRef.from_dict({**data, "extra": 1})
    del data["seed"]
    with pytest.raises(ValueError, match="exactly the keys"):
        TaskRef.from_dict(data)


def test_config_digest_is_order_independent_and_handles_dates():
    assert config_digest({"a": 1, "b": [1, 2]}) == config_digest({"b": [1, 2], "a": 1})
    assert config_digest({"a": 1}) != config_digest({"a": 2})
    assert len(config_digest({"a": 1})) == 16
    assert canonical_json({"d": datetime.date(2020, 1, 2)}) == '{"d":"2020-01-02"}'
    with pytest.raises(TypeError, match="cannot canonicalize"):
        canonical_json({"x": object()})


# --- synthetic ------------------------------------------------------------------------------------


def test_synthetic_batches_depend_only_on_seed_and_round():
    a, b = SyntheticSource(ALL_SYNTHETIC, seed=3), SyntheticSource(dict(reversed(ALL_SYNTHETIC.items())), seed=3)
    for _ in range(3):  # a resumed run draws the same as an uninterrupted one, in any order
        b.batch(9, 5)
    assert a.batch(4, 16) == b.batch(4, 16)
    assert _triples(a.batch(4, 16)) != _triples(a.batch(5, 16))
    assert _triples(a.batch(4, 16)) != _triples(SyntheticSource(ALL_SYNTHETIC, seed=4).batch(4, 16))
    assert a.batch(4, 8) == a.batch(4, 16)[:8]  # slot k does not depend on n


def test_synthetic_rebuild_reproduces_tasks_exactly():
    local, peer = SyntheticSource({"copy": 1.0}, seed=0), SyntheticSource(ALL_SYNTHETIC, seed=11)
    for task in peer.batch(2, 64):
        assert local.rebuild(TaskRef.from_dict(task.ref.to_dict())) == task  # any synthetic dataset


def test_synthetic_questions_use_only_the_tiny_alphabet_and_answers_are_right():
    tasks = SyntheticSource(ALL_SYNTHETIC, seed=1).batch(0, 400)
    assert {t.ref.dataset for t in tasks} == set(GENERATORS)
    for t in tasks:
        assert set(t.question + t.answer) <= set(ALPHABET), t
        length = {"count": 4, "rev": 3, "inc": 3, "rot": 3}.get(t.ref.dataset, 1)
        assert len(t.answer) == length and t.question.endswith("=")
        body = t.question[:-1]
        expected = {
            "copy": lambda: int(body),
            "succ": lambda: (int(body[0]) + 1) % 10,
            "max": lambda: max(int(body[1]), int(body[2])),
            "add": lambda: (int(body[0]) + int(body[2])) % 10,
            "count": lambda: "".join(str((int(body[0]) + k) % 10) for k in range(4)),
            "rev": lambda: body[2::-1],
            "inc": lambda: "".join(str((int(c) + 1) % 10) for c in body[:3]),
            "rot": lambda: body[1:3] + body[0],
        }[t.ref.dataset]()
        assert t.answer == str(expected)


def test_synthetic_mixture_weights_are_respected():
    source = SyntheticSource({"copy": 1.0, "add": 3.0, "max": 0.0}, seed=5)
    counts = collections.Counter(t.ref.dataset for r in range(100) for t in source.batch(r, 40))
    assert counts["max"] == 0  # weight 0: never drawn ...
    assert abs(counts["add"] / 4000 - 0.75) < 0.03
    max_ref = SyntheticSource({"max": 1.0}, seed=5).batch(0, 1)[0].ref
    assert source.rebuild(max_ref).ref == max_ref  # ... but still rebuildable


def test_synthetic_errors_name_the_valid_options():
    with pytest.raises(UnknownDatasetError, match="valid: \\['add', 'copy', 'count', 'inc', 'max', 'rev', 'rot', 'succ'\\]"):
        SyntheticSource({"mul": 1.0}, seed=0)
    source = SyntheticSource(ALL_SYNTHETIC, seed=0)
    ref = source.batch(0, 1)[0].ref
    with pytest.raises(UnknownTaskError, match="unknown synthetic dataset"):
        source.rebuild(TaskRef("synthetic", "mul", ref.config_digest, 0, 0))
    with pytest.raises(UnknownTaskError, match="config digest"):
        source.rebuild(TaskRef("synthetic", ref.dataset, "0" * 16, 0, 0))
    with pytest.raises(UnknownTaskError, match="source 'reasoning_gym'"):
        source.rebuild(TaskRef("reasoning_gym", ref.dataset, ref.config_digest, 0, 0))
    with pytest.raises(ValueError, match="weight"):
        SyntheticSource({"copy": -1.0}, seed=0)
    with pytest.raises(ValueError, match="at least one"):
        SyntheticSource({"copy": 0.0}, seed=0)
    with pytest.raises(ValueError, match="round_index"):
        source.batch(-1, 4)


def test_synthetic_score_is_exact_match_after_strip():
    source = SyntheticSource({"add": 1.0}, seed=0)
    task = source.batch(0, 1)[0]
    assert source.score(task, f" {task.answer}\n") == 1.0
    assert source.score(task, str((int(task.answer) + 1) % 10)) == 0.0
    assert source.score(task, "") == 0.0


# --- reasoning-gym --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rg():
    from node.tasks import reasoning_gym_source

    return reasoning_gym_source


def test_reasoning_gym_batches_are_deterministic(rg):
    a, b = rg.ReasoningGymSource(RG_MIX, seed=0), rg.ReasoningGymSource(RG_MIX, seed=0)
    b.batch(3, 10)
    assert a.batch(1, 16) == b.batch(1, 16)
    assert _triples(a.batch(1, 16)) != _triples(a.batch(2, 16))
    assert a.batch(1, 4) == a.batch(1, 16)[:4]


def test_reasoning_gym_rebuild_reproduces_peer_tasks_at_the_peer_seed(rg):
    local = rg.ReasoningGymSource({**RG_MIX, "chain_sum": 0.0}, seed=0, peer_seeds=[12345])
    peer = rg.ReasoningGymSource(RG_MIX, seed=12345)
    for task in peer.batch(7, 24):
        rebuilt = local.rebuild(TaskRef.from_dict(task.ref.to_dict()))
        assert rebuilt == task  # question, answer and metadata
        json.dumps(rebuilt.metadata)


def test_reasoning_gym_mixture_weights_are_respected(rg):
    source = rg.ReasoningGymSource({"leg_counting": 1.0, "chain_sum": 4.0}, seed=0)
    counts = collections.Counter(t.ref.dataset for r in range(50) for t in source.batch(r, 40))
    assert abs(counts["chain_sum"] / 2000 - 0.8) < 0.03


def test_reasoning_gym_config_overrides_are_applied_and_digested(rg):
    config = {"min_terms": 2, "max_terms": 3}
    custom = rg.ReasoningGymSource({"basic_arithmetic": {"weight": 1.0, "config": config}}, seed=0)
    default = rg.ReasoningGymSource({"basic_arithmetic": 1.0}, seed=0)
    assert custom.digest("basic_arithmetic") != default.digest("basic_arithmetic")
    assert default.digest("basic_arithmetic") != default.digest("basic_arithmetic", seed=1)
    assert default.digest("basic_arithmetic") != rg.ReasoningGymSource(
        {"basic_arithmetic": 1.0}, seed=0, size=500).digest("basic_arithmetic")
    assert all(t.metadata["num_terms"] <= 3 for t in custom.batch(0, 30))
    with pytest.raises(UnknownTaskError, match="config digest"):
        custom.rebuild(default.batch(0, 1)[0].ref)


def test_reasoning_gym_bad_configs_fail_at_construction(rg):
    with pytest.raises(ValueError, match="remove 'seed'"):
        rg.ReasoningGymSource({"chain_sum": {"config": {"seed": 3}}}, seed=0)
    with pytest.raises(ValueError, match="invalid config for reasoning-gym dataset 'chain_sum'"):
        rg.ReasoningGymSource({"chain_sum": {"config": {"no_such_option": 3}}}, seed=0)
    with pytest.raises(ValueError, match="unknown keys"):
        rg.ReasoningGymSource({"chain_sum": {"wieght": 2.0}}, seed=0)


def test_unknown_reasoning_gym_dataset_suggests_close_names(rg):
    with pytest.raises(UnknownDatasetError, match="Did you mean 'basic_arithmetic'") as info:
        rg.ReasoningGymSource({"basic_arithmetc": 1.0}, seed=0)
    assert "leg_counting" in str(info.value)  # the full list follows


def test_reasoning_gym_rebuild_refuses_what_it_cannot_build(rg):
    source = rg.ReasoningGymSource({"leg_counting": 1.0, "acre": 0.0}, seed=0)
    ref = source.batch(0, 1)[0].ref
    with pytest.raises(UnknownTaskError, match="not in this node's reasoning-gym mixture"):
        source.rebuild(TaskRef("reasoning_gym", "chain_sum", ref.config_digest, 0, 0))
    with pytest.raises(UnknownTaskError, match="config digest"):
        source.rebuild(TaskRef("reasoning_gym", "leg_counting", "f" * 16, 0, 0))
    acre_digest = source.digest("acre")  # acre is capped at size 1,000 (its construction is eager)
    with pytest.raises(UnknownTaskError, match="index 1000 >= dataset size 1000"):
        source.rebuild(TaskRef("reasoning_gym", "acre", acre_digest, 0, 1000))
    small = rg.ReasoningGymSource({"acre": 1.0}, seed=0, size=10)  # the cap only ever lowers size
    with pytest.raises(UnknownTaskError, match="index 10 >= dataset size 10"):
        small.rebuild(TaskRef("reasoning_gym", "acre", small.digest("acre"), 0, 10))
    with pytest.raises(ValueError, match="seed must be an int"):
        rg.ReasoningGymSource({"acre": 1.0}, seed="0")


def test_reasoning_gym_rebuilds_only_the_swarms_task_seeds_and_never_builds_a_dataset_for_others(rg):
    source = rg.ReasoningGymSource({"acre": 1.0}, seed=0, peer_seeds=[7])
    source.rebuild(source.batch(0, 1)[0].ref)
    built = source._dataset.cache_info().currsize
    for seed in range(100, 120):  # the digest right for each seed, as an attacker computes it
        ref = TaskRef("reasoning_gym", "acre", source.digest("acre", seed), seed, 3)
        started = time.perf_counter()
        with pytest.raises(UnknownTaskError, match=f"seed {seed} is not one of this node's task seeds"):
            source.rebuild(ref)
        assert time.perf_counter() - started < 0.05  # a dataset build takes 0.2-0.8 s
    assert source._dataset.cache_info().currsize == built  # no dataset built for them
    peer_task = rg.ReasoningGymSource({"acre": 1.0}, seed=7).batch(0, 1)[0]
    assert source.rebuild(peer_task.ref) == peer_task  # a listed peer seed is rebuilt


def test_make_source_passes_peer_seeds_to_reasoning_gym_only():
    seeds = make_source("reasoning_gym", {"leg_counting": 1.0}, 3, peer_seeds=[5]).task_seeds
    assert seeds == {3, 5, heldout_seed(3), heldout_seed(5)}  # held-out evals rebuild their refs too
    synthetic = make_source("synthetic", {"copy": 1.0}, 3, peer_seeds=[5])
    peer_ref = make_source("synthetic", {"copy": 1.0}, 99).batch(0, 1)[0].ref
    assert synthetic.rebuild(peer_ref).ref == peer_ref  # no dataset to build: any seed


def test_hash_seed_dependent_datasets_need_pythonhashseed_zero(rg, monkeypatch):
    monkeypatch.setattr(rg, "_hash_randomization_off", lambda: False)
    with pytest.raises(rg.NondeterministicDatasetError, match="PYTHONHASHSEED=0"):
        rg.ReasoningGymSource({"ransom_note": 1.0}, seed=0)
    monkeypatch.setattr(rg, "_hash_randomization_off", lambda: True)
    rg.ReasoningGymSource({"ransom_note": 1.0}, seed=0)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting"])
def test_reasoning_gym_gold_answers_score_one_and_wrong_answers_less(rg, dataset):
    source = rg.ReasoningGymSource({dataset: 1.0}, seed=2)
    for task in source.batch(0, 20):
        assert source.score(task, task.answer) == 1.0
        assert source.score(task, str(int(task.answer) + 1)) < 1.0
        assert source.score(task, "no idea") < 1.0


def test_reasoning_gym_scoring_survives_odd_datasets(rg):
    source = rg.ReasoningGymSource(
        {"prime_factorization": 1.0, "game_of_life_halting": 1.0, "propositional_logic": 1.0}, seed=0
    )
    by_dataset = {t.ref.dataset: t for t in source.batch(0, 40)}
    assert source.score(by_dataset["prime_factorization"], "not a number") == 0.0  # its scorer raises
    halting = by_dataset["game_of_life_halting"]  # its built-in scorer rewards any non-empty text
    assert source.score(halting, halting.answer) == 1.0 and source.score(halting, "banana") == 0.0
    logic = by_dataset["propositional_logic"]  # no stored answer: score the example answer
    assert logic.answer is None and source.score(logic, logic.reference_answer) == 1.0


def test_reasoning_gym_metadata_is_json_serializable(rg):
    source = rg.ReasoningGymSource({"gsm_symbolic": 1.0}, seed=3)  # its metadata holds Fractions
    for task in source.batch(0, 10):
        json.dumps(task.metadata)
        assert source.score(task, task.answer) == 1.0


def test_make_source_builds_both_kinds_and_names_valid_kinds():
    assert make_source("synthetic", {"copy": 1.0}, seed=0).name == "synthetic"
    assert make_source("reasoning_gym", {"chain_sum": 1.0}, seed=0).name == "reasoning_gym"
    with pytest.raises(ValueError, match="valid: reasoning_gym, synthetic"):
        make_source("gsm8k", {}, seed=0)


_DUMP_TASKS = """
import json
from node.tasks import make_source
out = []
for kind, mix in [("synthetic", {"copy": 1, "succ": 1, "max": 1, "add": 1, "count": 1, "rev": 1, "inc": 1, "rot": 1}),
                  ("reasoning_gym", {"basic_arithmetic": 1, "leg_counting": 1, "chain_sum": 1})]:
    for t in make_source(kind, mix, seed=21).batch(5, 24):
        out.append([t.ref.key, t.question, t.answer])
print(json.dumps(out))
"""


def test_tasks_are_identical_across_processes_with_different_hash_seeds():
    # What a peer does: rebuild in another interpreter, whose str hashing is salted differently.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DUMP_TASKS],
            cwd=REPO_ROOT,
            env=repo_env(PYTHONHASHSEED=hash_seed),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for hash_seed in ("1", "2")
    ]
    outputs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        outputs.append(json.loads(stdout))
    assert outputs[0] == outputs[1]
    local = [
        _triples(make_source("synthetic", ALL_SYNTHETIC, seed=21).batch(5, 24)),
        _triples(make_source("reasoning_gym", RG_MIX, seed=21).batch(5, 24)),
    ]
    assert [tuple(x) for x in outputs[0]] == local[0] + local[1]


# --- the three-digit families of tiny-warm: rev / inc / rot, the held-out split, format credit ---

from node.tasks.synthetic import (  # noqa: E402
    FORMAT_CREDIT,
    HELDOUT_FRACTION,
    HELDOUT_INDICES,
    SPLIT_FAMILIES,
    dataset_digest,
    is_heldout_question,
)

import random  # noqa: E402


class Digits(random.Random):
    """A real Random whose randrange yields the given digits in order (a fixed question)."""

    def __init__(self, digits: str):
        super().__init__(0)
        self._digits = iter(int(d) for d in digits)

    def randrange(self, *args, **kwargs):
        return next(self._digits)


@pytest.mark.parametrize("family, digits, question, answer", [
    ("rev", "123", "123m=", "321"), ("rev", "907", "907m=", "709"),
    ("inc", "123", "123+=", "234"), ("inc", "909", "909+=", "010"),
    ("rot", "123", "123==", "231"), ("rot", "056", "056==", "560"),
])
def test_three_digit_generators_on_fixed_questions(family, digits, question, answer):
    assert GENERATORS[family](Digits(digits)) == (question, answer)
    assert set(question + answer) <= set(ALPHABET)


def test_heldout_questions_of_the_split_families_are_never_training_questions():
    source = SyntheticSource({name: 1.0 for name in SPLIT_FAMILIES}, seed=3)
    heldout = source.heldout(100)
    assert {t.ref.dataset for t in heldout} == SPLIT_FAMILIES and len(heldout) == 300
    assert all(is_heldout_question(t.question) and t.ref.index < HELDOUT_INDICES for t in heldout)
    training = [t for r in range(200) for t in source.batch(r, 16)]
    assert not any(is_heldout_question(t.question) for t in training)
    assert all(t.ref.index >= HELDOUT_INDICES for t in training)
    assert not {t.question for t in heldout} & {t.question for t in training}
    assert len({t.question for t in training}) > 1000  # the split keeps most of the 3,000 questions
    # the split is about HELDOUT_FRACTION of each family's 1,000 questions
    for family in SPLIT_FAMILIES:
        questions = {GENERATORS[family](Digits(f"{n:03d}"))[0] for n in range(1000)}
        share = sum(map(is_heldout_question, questions)) / 1000
        assert abs(share - HELDOUT_FRACTION) < 0.05, (family, share)


def test_rebuild_refuses_a_heldout_index_of_a_split_family_and_rebuilds_a_training_ref():
    source = SyntheticSource({"rev": 1.0, "copy": 1.0}, seed=0)
    for family in sorted(SPLIT_FAMILIES):
        for index in (0, HELDOUT_INDICES - 1):
            ref = TaskRef("synthetic", family, dataset_digest(family), 0, index)
            with pytest.raises(UnknownTaskError, match="held-out question"):
                source.rebuild(ref)
        ref = TaskRef("synthetic", family, dataset_digest(family), 0, HELDOUT_INDICES)
        task = source.rebuild(ref)
        assert task.ref == ref and not is_heldout_question(task.question)
    drawn = source.batch(7, 16)
    assert [source.rebuild(t.ref) for t in drawn] == drawn
    # a non-split family's low index is an ordinary training ref
    assert source.rebuild(TaskRef("synthetic", "copy", dataset_digest("copy"), 0, 0)).question.endswith("=")


def test_score_gives_format_credit_only_to_well_formed_wrong_answers_of_split_families():
    source = SyntheticSource({"rev": 1.0, "copy": 1.0}, seed=0)
    task = source.rebuild(TaskRef("synthetic", "rev", dataset_digest("rev"), 0, HELDOUT_INDICES + 5))
    wrong = next(a for a in ("000", "111") if a != task.answer)
    assert source.score(task, task.answer) == 1.0
    assert source.score(task, f" {task.answer}\n") == 1.0
    assert source.score(task, wrong) == FORMAT_CREDIT
    for bad in ("12", "1234", "", "12a", "1 2", "-12", "+12", "m12", "١٢٣", "²³⁴", None):
        assert source.score(task, bad) == 0.0, bad
    copy = source.rebuild(TaskRef("synthetic", "copy", dataset_digest("copy"), 0, 1))
    assert source.score(copy, copy.answer) == 1.0
    assert source.score(copy, str((int(copy.answer) + 1) % 10)) == 0.0  # no format credit outside the split
