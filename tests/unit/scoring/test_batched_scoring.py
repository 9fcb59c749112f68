"""Batched verification of a peer's group: Retokenizer.encode_texts, ScorerSandbox.correctness_many
and Verifier.score_many give exactly the per-item results, in one tokenizer call / one sandbox
round-trip, and one hanging answer costs only its own slot. Real tokenizers, real worker processes."""
from __future__ import annotations

import time

import pytest

from node.train.prompts import Retokenizer
from node.scoring.sandbox import ScorerSandbox
from node.tasks import make_source
from node.scoring.verifiers import MAX_MATH_ANSWER_CHARS, Verifier, plain_number_answer_ok
from policy.generation import eos_token_ids
from policy.models import ModelConfig, load_policy

DEADLINE_S = 1.0
SLACK_S = 0.5  # kill + reap + respawn start, on a loaded 2-core machine
BOMB = "9**9**9**9"  # math-verify evaluates it in one C call: hangs a worker (straight to the sandbox)


def retokenizer(name: str) -> Retokenizer:
    policy = load_policy(ModelConfig(name=name))
    return Retokenizer(policy, eos_token_ids(policy.model, policy.tokenizer))


@pytest.fixture(scope="module")
def tiny_retok():
    return retokenizer("tiny")


@pytest.fixture(scope="module")
def smol_retok():
    return retokenizer("smollm2")


@pytest.fixture(scope="module")
def spec(tiny_config):
    cfg = tiny_config()
    return cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed


@pytest.fixture(scope="module")
def source(spec):
    return make_source(*spec)


@pytest.fixture(scope="module")
def tasks(source):
    return source.batch(0, 4)


class CountingSandbox(ScorerSandbox):
    """A real sandbox that records the size of each correctness_many round-trip."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def correctness_many(self, scorer, task, answers, timeout_s, **kwargs):
        self.batches.append(len(answers))
        return super().correctness_many(scorer, task, answers, timeout_s, **kwargs)


@pytest.fixture(scope="module")
def sandbox(spec, tasks):
    box = CountingSandbox(spec, workers=2)
    try:
        assert box.correctness("math", tasks[0], tasks[0].answer, 30.0) == 1.0  # waits for the first import
        yield box
    finally:
        box.close()


def per_item(retok: Retokenizer, text: str):
    try:
        return retok.encode_text(text)
    except Exception as err:
        return err


def same_item(batched, single) -> bool:
    if isinstance(single, Exception):
        return type(batched) is type(single) and str(batched) == str(single)
    return batched == single


# --- encode_texts ---------------------------------------------------------------------------------

TINY_TEXTS = ["12+3=15", "", "m02=2", "9" * 300, "0=0\n", "5<eos>", "<eos>", "7"]
SMOL_TEXTS = ["a<|im_end|>b", "<|im_start|>user", "5<eos>", "", "héllo wörld 日本 🙂", "  two  spaces\n\ttab",
              "<answer>42</answer>", "x" * 500]


@pytest.mark.parametrize("name,texts", [("tiny", TINY_TEXTS), ("smol", SMOL_TEXTS)])
def test_encode_texts_equals_encode_text_item_by_item(name, texts, tiny_retok, smol_retok):
    retok = tiny_retok if name == "tiny" else smol_retok
    batched = retok.encode_texts(texts)
    assert len(batched) == len(texts)
    for text, item in zip(texts, batched):
        assert same_item(item, per_item(retok, text)), text
    clean = [t for t, item in zip(texts, batched) if not isinstance(item, Exception)]
    assert retok.encode_texts(clean) == [retok.encode_text(t) for t in clean]  # the one-call path


def test_a_literal_special_token_stays_text_in_a_batch(smol_retok):
    ids, offsets = smol_retok.encode_texts(["a<|im_end|>b", "ok"])[0]
    assert smol_retok.eos_id not in ids and len(ids) > 3 and offsets[-1] == (11, 12)


def test_one_untokenizable_text_does_not_lose_the_others(tiny_retok):
    texts = ["12", "5<eos>", "3=3", "é", "m"]
    batched = tiny_retok.encode_texts(texts)
    assert [isinstance(item, Exception) for item in batched] == [False, True, False, True, False]
    assert [batched[i] for i in (0, 2, 4)] == [tiny_retok.encode_text(texts[i]) for i in (0, 2, 4)]
    with pytest.raises(Exception) as raised:
        tiny_retok.encode_text("5<eos>")
    assert same_item(batched[1], raised.value)
    assert tiny_retok.encode_texts([]) == []


# --- correctness_many -----------------------------------------------------------------------------


def answers_for(task) -> list[str]:
    return [task.answer, " " + task.answer, "1", "x^2", "\\frac{1}{2}", f"${task.answer}$", "", "9.0", "abc"]


@pytest.mark.parametrize("scorer", ["math", "dataset", "exact"])
def test_correctness_many_equals_correctness_item_by_item(scorer, sandbox, tasks):
    for task in tasks:
        answers = answers_for(task)
        before = sandbox.snapshot()
        batched = sandbox.correctness_many(scorer, task, answers, 5.0)
        assert sandbox.snapshot()["scored"] - before["scored"] == len(answers)
        assert batched == [sandbox.correctness(scorer, task, a, 5.0) for a in answers]
        assert None not in batched and batched[0] == 1.0
    assert sandbox.correctness_many("math", tasks[0], [], 5.0) == []


@pytest.mark.parametrize("position,workers", [(0, 2), (2, 2), (4, 2), (2, 1)],
                         ids=["first", "middle", "last", "middle_one_worker"])
def test_a_hanging_answer_costs_only_its_own_slot(spec, tasks, position, workers):
    task = tasks[1]
    answers = [task.answer, "1", task.answer, "\\frac{1}{2}", task.answer]
    expected = [1.0, 0.0, 1.0, 0.0, 1.0]
    answers[position], expected[position] = BOMB, None
    box = ScorerSandbox(spec, workers=workers)
    try:
        box.start()
        assert box.correctness("math", task, task.answer, 30.0) == 1.0  # the workers are ready
        first = set(box.pids())
        started = time.monotonic()
        assert box.correctness_many("math", task, answers, DEADLINE_S) == expected
        elapsed = time.monotonic() - started
        counts = box.snapshot()
        print(f"\nbatch with a bomb at {position} ({workers} worker(s)) scored in {elapsed:.3f} s")
        # one deadline for the bomb (killed == 1: no other answer timed out) plus the honest answers,
        # scored while a replacement imports beside them on a loaded machine; with a single worker,
        # that replacement must be ready before the rest are scored
        assert elapsed < DEADLINE_S + SLACK_S + (1.5 if workers > 1 else 10.0)
        assert counts["killed"] == 1 and counts["scored"] == 1 + len(answers) - 1
        assert counts.get("unavailable", 0) == 0 and len(set(box.pids()) - first) == 1  # replaced
        assert box.correctness_many("math", task, [task.answer, "1"], 30.0) == [1.0, 0.0]  # scoring goes on
    finally:
        box.close()


def test_stop_at_timeout_scores_nothing_after_the_hanging_answer(spec, tasks):
    """node/peers/verify.py refuses a group at its first timeout: the answers after it are not worth a
    replacement worker's start-up."""
    task = tasks[1]
    answers = [task.answer, BOMB, task.answer, "1"]
    box = ScorerSandbox(spec, workers=1)
    try:
        box.start()
        assert box.correctness("math", task, task.answer, 30.0) == 1.0  # the worker is ready
        started = time.monotonic()
        assert box.correctness_many("math", task, answers, DEADLINE_S, stop_at_timeout=True) == [1.0, None, None, None]
        elapsed = time.monotonic() - started
        counts = box.snapshot()
        assert elapsed < DEADLINE_S + SLACK_S  # no wait for the replacement to import
        assert counts["killed"] == 1 and counts["scored"] == 2  # the warm-up answer and the first one
    finally:
        box.close()


def test_each_answer_has_its_own_deadline(spec, tasks):
    """A batch that takes three deadlines in all is not cut short: the deadline is per answer."""
    task = tasks[2]
    answers = [f"\\frac{{{i}}}{{{i + 1}}}" for i in range(200)] + [task.answer]
    box = ScorerSandbox(spec, workers=1)
    try:
        box.correctness("math", task, task.answer, 30.0)  # warm: no first-call cost inside the batch
        started = time.monotonic()
        expected = box.correctness_many("math", task, answers, 30.0)
        total = time.monotonic() - started
        assert box.correctness_many("math", task, answers, total / 3) == expected
    finally:
        box.close()
    assert expected[-1] == 1.0 and None not in expected and box.snapshot().get("killed", 0) == 0
    print(f"\n{len(answers)} answers in {total:.3f} s; again under a {total / 3:.3f} s per-answer deadline")


def test_a_batch_that_finds_no_worker_scores_none_and_counts_one_wait(spec, tasks):
    box = ScorerSandbox(spec, workers=1, ready_wait_s=0.0)  # its worker is still importing: no answer in time
    try:
        assert box.correctness_many("math", tasks[0], ["1", "2", tasks[0].answer], 5.0) == [None] * 3
        assert box.snapshot() == {"started": 1, "unavailable": 1}  # one wait given up; nothing killed
    finally:
        box.close()


# --- score_many -----------------------------------------------------------------------------------

VERIFIERS = [Verifier(fmt="raw"), Verifier(fmt="tagged", scorer="math", format_weight=0.5),
             Verifier(fmt="lenient", scorer="math"), Verifier(fmt="lenient", scorer="exact", format_weight=0.1),
             Verifier(fmt="tagged", scorer="dataset")]


def completions_for(task) -> list[str]:
    tag = "<answer>{}</answer>".format
    return [tag(task.answer), tag("7"), "no tags here", tag(BOMB), tag("x^2"), tag("\\frac{18}{2}"),
            tag("1" * 1200), tag(f"${task.answer}$"), tag("1") + tag("2"), f"so it is {task.answer}",
            task.answer, tag(" "), tag("9.0")]


@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda v: f"{v.fmt}-{v.scorer}")
def test_score_many_equals_score_item_by_item(verifier, sandbox, source, tasks):
    for task in tasks:
        completions = completions_for(task)
        alone = [verifier.score(task, source, c) for c in completions]
        assert verifier.score_many(task, source, completions) == alone
        assert [verifier.score(task, source, c, sandbox) for c in completions] == alone
        sandbox.batches.clear()
        assert verifier.score_many(task, source, completions, sandbox) == alone
        # one round-trip for the answers only a capped scorer decides (math here); none otherwise
        assert sandbox.batches == ([sum(needs_math(info, task) for _, info in alone)]
                                   if verifier.scorer == "math" else [])
        if verifier.scorer == "math":  # the group mixes all three: refused, decided here, sent to a worker
            assert any(info["refused"] for _, info in alone) and 0 < sandbox.batches[0] < len(completions)


def needs_math(info: dict, task) -> bool:
    """Mirrors Verifier._decided for the math scorer: a plain-number literal that was not refused."""
    answer = info["extracted"]
    return (answer is not None and not info["refused"] and len(answer) <= MAX_MATH_ANSWER_CHARS
            and plain_number_answer_ok(answer, task.reference_answer))


@pytest.mark.slow
@pytest.mark.serial
def test_score_many_times_out_only_the_hanging_answer_of_a_countdown_group():
    spec = ("reasoning_gym", {"countdown": 1.0}, 0)
    source = make_source(*spec)
    task = source.batch(0, 1)[0]
    verifier = Verifier(fmt="raw", timeout_s=DEADLINE_S)
    completions = [task.answer, "factorial(99999999)", "1+1", BOMB, task.answer]  # the second passes the pre-filter
    box = ScorerSandbox(spec, workers=2)
    try:
        box.start()
        honest = [task.answer, "1+1"]
        assert verifier.score_many(task, source, honest, box) == [verifier.score(task, source, c) for c in honest]
        started = time.monotonic()
        batched = verifier.score_many(task, source, completions, box)
        elapsed = time.monotonic() - started
        assert batched == [verifier.score(task, source, c, box) for c in completions]
    finally:
        box.close()
    print(f"\ncountdown group with one hanging answer scored in {elapsed:.3f} s")
    assert [info["timed_out"] for _, info in batched] == [False, True, False, False, False]
    assert batched[3][1]["refused"] == "power_tower" and batched[0][0] == batched[4][0] == 1.0
    assert elapsed < DEADLINE_S + SLACK_S + 1.0
    assert box.snapshot()["killed"] == 2  # once in the batch, once item by item
