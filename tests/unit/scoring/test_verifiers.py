"""Verifiers: answer extraction, format reward, scorers, time caps, and the Verifier reward."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from node.scoring import verifiers
from node.tasks.base import Task, TaskRef, TaskSource
from node.tasks.synthetic import SyntheticSource
from node.scoring.verifiers import (
    SYSTEM_PROMPT,
    Verifier,
    exact_match,
    extract_answer,
    format_reward,
)


def math_verify_match(pred: str | None, gold: str | None,
                      timeout_s: float = verifiers.DEFAULT_TIMEOUT_S) -> float:
    """The Verifier's capped math scorer on its own: 1.0 if math-verify finds pred equivalent to
    gold ("0.5" == "1/2" == "\\frac{1}{2}"); 0.0 otherwise, including on timeout (counted in
    timeout_count())."""
    return verifiers._math_verify_bounded(pred, gold, timeout_s) or 0.0


@pytest.fixture(scope="module")
def synthetic():
    source = SyntheticSource({"add": 1.0}, seed=0)
    return source, source.batch(0, 1)[0]


@pytest.fixture(scope="module")
def arithmetic():
    from node.tasks.reasoning_gym_source import ReasoningGymSource

    source = ReasoningGymSource({"basic_arithmetic": 1.0}, seed=0)
    return source, source.batch(0, 1)[0]


class _BlockingSource(TaskSource):
    """A source whose scorer hangs until released: stands in for sympy on hostile text."""

    name = "synthetic"

    def __init__(self):
        self.release = threading.Event()

    def batch(self, round_index, n):
        return []

    def rebuild(self, ref):
        raise NotImplementedError

    def score(self, task, completion_text):
        self.release.wait(10)
        return 1.0


@pytest.fixture
def blocking_source():
    source = _BlockingSource()
    yield source
    source.release.set()  # let abandoned worker threads finish so later tests are not refused


# --- extraction and format ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("the answer is 4", None),  # no tag
        ("<answer>4</answer>", "4"),
        ("think <answer>  4 \n</answer> done", "4"),  # whitespace stripped
        ("<answer>1</answer> wait, no <answer>2</answer>", "2"),  # the last block wins
        ("<answer>a<answer>b</answer>", "b"),  # nested: innermost closed block
        ("<answer>x</answer></answer>", "x"),  # stray close: never part of the answer
        ("<answer>1</answer> then <answer>2", "1"),  # unclosed last block is ignored
        ("</answer>5<answer>", None),  # close before open
        ("<answer>   </answer>", None),  # blank
        ("<ANSWER>4</ANSWER>", None),  # one format, exactly
        ("", None),
    ],
)
def test_extract_answer_tagged(completion, expected):
    assert extract_answer(completion, "tagged") == expected


def test_extract_answer_raw_and_bad_format():
    assert extract_answer("  7\n", "raw") == "7"
    assert extract_answer(" \n ", "raw") is None
    assert extract_answer("<answer>7</answer>", "raw") == "<answer>7</answer>"
    with pytest.raises(ValueError, match="valid: 'tagged', 'lenient', 'raw'"):
        extract_answer("7", "boxed")


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("reasoning... <answer>12</answer>", 1.0),
        ("<answer>12</answer>\n", 1.0),
        ("12", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("<answer>12", 0.0),
        ("</answer>12<answer>", 0.0),
        ("<answer><answer>12</answer>", 0.0),
    ],
)
def test_format_reward(completion, expected):
    assert format_reward(completion) == expected


def test_system_prompt_asks_for_the_answer_tags():
    assert "<answer></answer>" in SYSTEM_PROMPT


# --- scorers --------------------------------------------------------------------------------------


def test_exact_match():
    assert exact_match(" 5 ", "5") == 1.0
    assert exact_match("5.0", "5") == 0.0
    assert exact_match(None, "5") == 0.0


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("1/2", "0.5", 1.0),
        ("0.5", "1/2", 1.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("$\\frac{1}{2}$", "1/2", 1.0),
        ("-5333622", "-5333622", 1.0),
        ("0.6", "1/2", 0.0),
        ("banana", "1/2", 0.0),
        (None, "1/2", 0.0),
        ("1" * (verifiers.MAX_MATH_ANSWER_CHARS + 1), "1", 0.0),
    ],
)
def test_math_verify_match(pred, gold, expected):
    assert math_verify_match(pred, gold) == expected


@pytest.mark.parametrize("pred", ["7^{2}", "3, 7", "7, 7", "x = 7", "7 legs", "7\\%", "{7}", "$$", "7 or 8"])
def test_a_plain_number_gold_refuses_anything_but_one_number(pred):
    """math-verify extracts some expression from a prediction: without this rule 7^{2} and 3, 7
    scored 1.0 against 7 (a reward hack a real tokenizer can express)."""
    assert math_verify_match(pred, "7") == 0.0


@pytest.mark.parametrize("pred, gold", [("7", "7"), ("$7$", "7"), ("\\boxed{7}", "7"), ("\\(7\\)", "7"),
                                        ("7.0", "7"), ("14/2", "7"), ("1,000", "1000"), ("-3.5", "-7/2"),
                                        ("\\frac{7}{2}", "3.5"), ("49", "7^2")])
def test_honest_numeric_and_expression_answers_still_verify(pred, gold):
    assert math_verify_match(pred, gold) == 1.0


def test_math_scorer_still_scores_honest_reasoning_gym_answers():
    from node.tasks.reasoning_gym_source import ReasoningGymSource

    source = ReasoningGymSource({"basic_arithmetic": 1.0, "leg_counting": 1.0, "chain_sum": 1.0}, seed=3)
    verifier = Verifier(scorer="math", fmt="tagged")
    tasks = source.batch(0, 12)
    assert all(verifier.score(t, source, f"<answer>{t.answer}</answer>")[1]["correct"] for t in tasks)
    assert not any(verifier.score(t, source, f"<answer>{t.answer}^{{2}}</answer>")[1]["correct"]
                   for t in tasks if t.answer not in ("0", "1"))


def test_math_verify_timeout_scores_zero_and_is_counted(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(verifiers, "_math_verify_unbounded", lambda pred, gold: release.wait(10) or 1.0)
    before = verifiers.timeout_count()
    try:
        assert math_verify_match("1/2", "0.5", timeout_s=0.05) == 0.0
        assert verifiers.timeout_count() == before + 1
    finally:
        release.set()


def test_hung_scorer_threads_are_capped(monkeypatch, blocking_source, synthetic):
    monkeypatch.setattr(verifiers, "MAX_ABANDONED_THREADS", 1)
    verifier = Verifier(fmt="raw", timeout_s=0.05)
    task = synthetic[1]
    assert verifier.score(task, blocking_source, "5")[1]["timed_out"]  # abandons one thread
    before = verifiers.timeout_count()
    reward, info = verifier.score(task, blocking_source, "5")  # refused at once: one is still hung
    assert (reward, info["timed_out"], verifiers.timeout_count()) == (0.0, True, before + 1)


# --- Verifier -------------------------------------------------------------------------------------


def test_verifier_raw_for_the_tiny_model(synthetic):
    source, task = synthetic
    verifier = Verifier(fmt="raw")
    reward, info = verifier.score(task, source, task.answer + "\n")
    assert reward == 1.0
    assert info == {"correct": True, "correctness": 1.0, "extracted": task.answer, "format_ok": True,
                    "scorer": "dataset", "timed_out": False, "refused": None}
    wrong = str((int(task.answer) + 1) % 10)
    assert verifier.score(task, source, wrong)[0] == 0.0


def test_verifier_tagged_with_format_weight(arithmetic):
    source, task = arithmetic
    verifier = Verifier(format_weight=0.25)
    assert verifier.score(task, source, f"easy. <answer>{task.answer}</answer>")[0] == 1.25
    reward, info = verifier.score(task, source, "<answer>nope</answer>")
    assert reward == 0.25 and info["format_ok"] and not info["correct"]
    reward, info = verifier.score(task, source, f"{task.answer}")  # right, but untagged
    assert reward == 0.0 and info["extracted"] is None and not info["format_ok"]


def test_verifier_math_scorer_accepts_equivalent_forms():
    ref = TaskRef("synthetic", "copy", "0123456789abcdef", 0, 0)
    task = Task(ref, "What is 1/2 as a decimal?", "0.5")
    source = SyntheticSource({"copy": 1.0}, seed=0)
    assert Verifier(scorer="math").score(task, source, "<answer>\\frac{1}{2}</answer>")[1]["correct"]
    assert not Verifier(scorer="exact").score(task, source, "<answer>\\frac{1}{2}</answer>")[1]["correct"]


def test_verifier_falls_back_to_the_dataset_scorer_without_a_reference_answer(synthetic):
    source, task = synthetic
    no_gold = Task(task.ref, task.question, None)
    assert Verifier(scorer="exact", fmt="raw").score(no_gold, source, "3")[1]["scorer"] == "dataset"


def test_verifier_caps_slow_dataset_scorers(blocking_source, synthetic):
    reward, info = Verifier(fmt="raw", timeout_s=0.05).score(synthetic[1], blocking_source, "5")
    assert reward == 0.0 and info["timed_out"] and not info["correct"]


@pytest.mark.parametrize(
    "config", [{"fmt": "boxed"}, {"format_weight": -0.1}, {"scorer": "llm"}, {"timeout_s": 0}, {"typo": 1}]
)
def test_verifier_config_is_validated(config):
    with pytest.raises(ValidationError):
        Verifier(**config)


# --- never raise on arbitrary text ----------------------------------------------------------------

_TAGGY_TEXT = st.lists(
    st.one_of(st.sampled_from(["<answer>", "</answer>", "<answer", "1/2", "\\frac{", "}", " ", "\n", "7"]),
              st.text(max_size=20)),
    max_size=12,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.text(), _TAGGY_TEXT))
def test_extraction_and_scoring_never_raise(text, synthetic, arithmetic):
    for fmt in ("tagged", "raw"):
        answer = extract_answer(text, fmt)
        assert answer is None or (answer == answer.strip() and answer)
    assert format_reward(text) in (0.0, 1.0)
    for source, task in (synthetic, arithmetic):
        for verifier in (Verifier(), Verifier(fmt="raw", format_weight=0.5), Verifier(scorer="math")):
            reward, info = verifier.score(task, source, text)
            assert 0.0 <= reward <= 1.0 + verifier.format_weight
            assert isinstance(info["correct"], bool)


@pytest.mark.parametrize("text, expected", [
    ("so 7 * 4 = 28 legs", "28"),
    ("the answer is -5.", "-5"),
    ("ratio 3/4 then 1.5", "1.5"),
    ("I think <answer>12</answer> but maybe 13", "12"),  # a tag always wins
    ("no numbers here", None),
    ("", None),
])
def test_lenient_format_falls_back_to_the_last_number(text, expected):
    assert extract_answer(text, "lenient") == expected
    if "<answer>" not in text:
        assert extract_answer(text, "tagged") is None  # tagged stays strict
