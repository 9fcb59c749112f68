"""Turning a completion into a reward: answer extraction, format reward, scorers, and the Verifier.

The same code scores our own rollouts and re-scores peers' rollouts, so it must never raise on
arbitrary text and never hang: answers shaped like compute bombs are refused first
(node/scoring/answer_filter.py, they score 0), then scorers that parse math (math-verify, reasoning-gym's
sympy-based scorers) run under a wall-clock cap. Peers' text goes to a killable worker process
(a `sandbox`, node/scoring/sandbox.py); our own completions, which no peer chooses, run in a worker
thread as before (a thread cannot be stopped inside a GIL-holding C call, hence the sandbox for
anything a peer wrote). math-verify's own timeouts are disabled because they use signals, which
only work on the main thread.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from typing import Any, Callable, Protocol

from node.config.sections import DEFAULT_SCORER_TIMEOUT_S, AnswerFormat, VerifierConfig
from node.scoring.answer_filter import bomb_reason
from node.tasks.base import Task, TaskSource

log = logging.getLogger(__name__)

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

SYSTEM_PROMPT = (
    "You are a helpful assistant. Think briefly about the problem, then give your final answer "
    "inside <answer></answer> tags, for example <answer>42</answer>. Put only the final answer "
    "inside the tags."
)
# sampling.answer_style = "direct": no reasoning, a few tokens a completion (arithmetic a small model can
# answer at once; a round then costs a fraction of a thinking one)
DIRECT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Reply with only the final answer inside <answer></answer> tags, "
    "for example <answer>42</answer>, and nothing else."
)
SYSTEM_PROMPTS = {"think": SYSTEM_PROMPT, "direct": DIRECT_SYSTEM_PROMPT}

DEFAULT_TIMEOUT_S = DEFAULT_SCORER_TIMEOUT_S  # the verifier section's (node/config/sections.py)
# Longer answers are not worth handing to a symbolic parser (cost grows fast with length).
MAX_MATH_ANSWER_CHARS = 1_000
# A timed-out worker thread cannot be killed and keeps burning CPU; once this many are still
# running, further capped calls score 0 at once instead of piling up more threads.
MAX_ABANDONED_THREADS = 4


# --- extraction and format ------------------------------------------------------------------------


# The last number in a completion: integers, decimals, fractions, with an optional sign.
_LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract_answer(completion: str, fmt: AnswerFormat = "tagged") -> str | None:
    """The answer text, stripped, or None if there is none.

    tagged: from the last <answer> that is followed by a </answer>, up to that first </answer>
    (so an answer never contains a tag); lenient: the tagged answer if there is one, else the
    last number in the text (small models rarely follow the tag format at first; the format
    reward then teaches it); raw: the whole completion. Blank answers count as none."""
    if not isinstance(completion, str):
        return None
    if fmt == "raw":
        answer = completion
    elif fmt in ("tagged", "lenient"):
        answer = _last_tagged_block(completion)
        if answer is None and fmt == "lenient":
            numbers = _LAST_NUMBER.findall(completion[-4096:])  # bounded work on hostile text
            answer = numbers[-1] if numbers else None
        if answer is None:
            return None
    else:
        raise ValueError(f"unknown answer format {fmt!r}; valid: 'tagged', 'lenient', 'raw'")
    answer = answer.strip()
    return answer or None


def _last_tagged_block(text: str) -> str | None:
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    if text.find(ANSWER_CLOSE, start) < 0:
        # The last <answer> is never closed: use the last <answer> before the last </answer>.
        last_close = text.rfind(ANSWER_CLOSE, 0, start)
        start = text.rfind(ANSWER_OPEN, 0, max(last_close, 0))
        if last_close < 0 or start < 0:
            return None
    content_start = start + len(ANSWER_OPEN)
    return text[content_start : text.find(ANSWER_CLOSE, content_start)]


def format_reward(completion: str) -> float:
    """1.0 if the completion has exactly one <answer>...</answer> block with a non-blank answer."""
    if not isinstance(completion, str):
        return 0.0
    if completion.count(ANSWER_OPEN) != 1 or completion.count(ANSWER_CLOSE) != 1:
        return 0.0
    start, end = completion.find(ANSWER_OPEN), completion.find(ANSWER_CLOSE)
    return 1.0 if start < end and completion[start + len(ANSWER_OPEN) : end].strip() else 0.0


# --- bounded execution ----------------------------------------------------------------------------

_lock = threading.Lock()
_abandoned: list[threading.Thread] = []
_timeouts = 0


def timeout_count() -> int:
    """How many capped scorer calls timed out (or were refused because too many threads hung)."""
    return _timeouts


def _count_timeout() -> None:
    global _timeouts
    with _lock:
        _timeouts += 1


def run_with_deadline(fn: Callable[[], float], timeout_s: float) -> float | None:
    """fn() in a daemon worker thread; None if it does not finish within timeout_s. Exceptions
    from fn count as score 0.0."""
    with _lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        overloaded = len(_abandoned) >= MAX_ABANDONED_THREADS
    if overloaded:
        log.warning("%d scorer threads still hung; scoring 0 without running", MAX_ABANDONED_THREADS)
        _count_timeout()
        return None
    result: list[float] = []

    def work() -> None:
        try:
            result.append(fn())
        except Exception as exc:
            log.debug("scorer raised %r; scoring 0", exc)
            result.append(0.0)

    worker = threading.Thread(target=work, name="bounded-scorer", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        with _lock:
            _abandoned.append(worker)
        _count_timeout()
        return None
    return result[0]


# --- scorers --------------------------------------------------------------------------------------


def exact_match(pred: str | None, gold: str | None) -> float:
    """1.0 when both are strings and equal after stripping whitespace."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return 0.0
    return 1.0 if pred.strip() == gold.strip() else 0.0


# A plain number: what most gold answers are. math-verify extracts SOME expression from a prediction
# ("7^{2}" and "3, 7" both verify against 7), so against such a gold only one numeric literal counts.
_PLAIN_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\d+/\d+|-?\\d?frac\{\d+\}\{\d+\}")
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\boxed{", "}"))


def plain_number_answer_ok(pred: str, gold: str) -> bool:
    """False when `gold` is a plain number and `pred` is anything but one numeric literal (an
    integer, decimal, 1,000-grouped number, a/b or \\frac{a}{b}, optionally in $...$, \\(...\\) or
    \\boxed{...}): math-verify then decides whether the two numbers are equal."""
    if not _PLAIN_NUMBER.fullmatch(gold.strip()):
        return True  # an expression, a set, a word: math-verify's own rules apply
    pred = pred.strip()
    for opening, closing in _WRAPPERS:
        if pred.startswith(opening) and pred.endswith(closing) and len(pred) > len(opening) + len(closing):
            pred = pred[len(opening):-len(closing)].strip()
            break
    return _PLAIN_NUMBER.fullmatch(pred) is not None


def _math_verify_unbounded(pred: str, gold: str) -> float:
    from math_verify import parse, verify  # about 1 s: a node whose tasks never need it never pays it

    # Timeouts off: math-verify implements them with signals (main thread only); we cap instead.
    gold_parsed = parse(gold, parsing_timeout=None)
    pred_parsed = parse(pred, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=None) else 0.0


def _math_verify_bounded(pred: str | None, gold: str | None, timeout_s: float) -> float | None:
    if not isinstance(pred, str) or not isinstance(gold, str) or len(pred) > MAX_MATH_ANSWER_CHARS:
        return 0.0
    if not plain_number_answer_ok(pred, gold):
        return 0.0
    import math_verify  # noqa: F401  (imported here, not in the worker: the import takes ~1 s)

    return run_with_deadline(lambda: _math_verify_unbounded(pred, gold), timeout_s)


# --- the verifier ---------------------------------------------------------------------------------


class Sandbox(Protocol):
    """Runs capped correctness checks out of process (node/scoring/sandbox.py ScorerSandbox): one
    answer, or several answers of one task in one round-trip (None: that answer timed out)."""

    def correctness(self, scorer: str, task: Task, answer: str, timeout_s: float) -> float | None: ...

    def correctness_many(self, scorer: str, task: Task, answers: list[str], timeout_s: float, *,
                         stop_at_timeout: bool = False, wait_s: float | None = None) -> list[float | None]: ...


# _screen's correctness for an answer only a capped scorer can decide (None already means timed out)
_PENDING: Any = object()


class Verifier(VerifierConfig):
    """Scores one completion of one task, by the settings of a VerifierConfig (the config's pure-data
    `verifier` section: node/config/sections.py), whose fields it has: `Verifier.from_config`.

    reward = correctness + format_weight * format, where correctness is in [0, 1] (1 = correct;
    reasoning-gym may give partial credit) and format is 0 or 1, so reward is in
    [0, 1 + format_weight].

    scorer: "auto" and "dataset" use the task source's own scorer (reasoning-gym's score_answer,
    exact match for synthetic tasks); "exact" and "math" compare with the task's reference answer
    and fall back to the source's scorer for tasks that have none."""

    @classmethod
    def from_config(cls, section: VerifierConfig) -> Verifier:
        return cls(**section.model_dump())

    @property
    def digest(self) -> str:
        """16 hex digits naming these settings: peers with equal digests compute equal rewards."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def score(self, task: Task, source: TaskSource, completion: str,
              sandbox: Sandbox | None = None) -> tuple[float, dict[str, Any]]:
        """(reward, info). `sandbox`: where to run capped scorers on untrusted (peer) text; None runs
        them in a worker thread. info["refused"] names a compute bomb refused before scoring (it
        scores 0); info["timed_out"] is True when the scorer ran out of time (it scores 0)."""
        info, correctness = self._screen(task, source, completion)
        if correctness is _PENDING:
            correctness = self._capped(info["scorer"], task, source, info["extracted"], sandbox)
        return self._finish(info, correctness)

    def score_many(self, task: Task, source: TaskSource, completions: list[str], sandbox: Sandbox | None = None,
                   stop_at_timeout: bool = False, wait_s: float | None = None) -> list[tuple[float, dict[str, Any]]]:
        """[self.score(task, source, c, sandbox) for c in completions], with one sandbox round-trip
        (correctness_many) for all the answers that need a capped scorer: a group shares its task,
        so it is sent once. Without a sandbox this is exactly that loop. stop_at_timeout: once an
        answer timed out, the capped ones after it are not scored (timed out too): for a caller
        that refuses the whole group at its first timeout. wait_s: how long to wait for a sandbox busy
        with another caller (node/scoring/sandbox.py SandboxBusy past it)."""
        if sandbox is None:
            return [self.score(task, source, c) for c in completions]
        screened = [self._screen(task, source, c) for c in completions]
        pending = [i for i, (_, correctness) in enumerate(screened) if correctness is _PENDING]
        if pending:  # every completion has the same task, hence the same scorer
            answers = [screened[i][0]["extracted"] for i in pending]
            values = sandbox.correctness_many(self._scorer_for(task), task, answers, self.timeout_s,
                                              stop_at_timeout=stop_at_timeout, wait_s=wait_s)
            for i, value in zip(pending, values, strict=True):
                screened[i] = (screened[i][0], value)
        return [self._finish(info, correctness) for info, correctness in screened]

    def _screen(self, task: Task, source: TaskSource, completion: str) -> tuple[dict[str, Any], Any]:
        """What is known before any capped scorer runs: (partial info, correctness), correctness
        being _PENDING when only a capped scorer can decide it."""
        extracted = extract_answer(completion, self.fmt)
        format_ok = extracted is not None if self.fmt == "raw" else format_reward(completion) == 1.0
        scorer = self._scorer_for(task)
        correctness: float | None = 0.0
        refused = None
        if extracted is not None:
            refused = None if self._is_cheap(scorer, source) else bomb_reason(extracted)
            if refused is None:
                correctness = self._decided(scorer, task, source, extracted)
        info = {"extracted": extracted, "format_ok": format_ok, "scorer": scorer, "refused": refused}
        return info, correctness

    def _finish(self, screened: dict[str, Any], correctness: float | None) -> tuple[float, dict[str, Any]]:
        timed_out = correctness is None
        correctness = correctness or 0.0
        reward = correctness + self.format_weight * float(screened["format_ok"])
        info = {
            "correct": correctness >= 1.0,
            "correctness": correctness,
            "extracted": screened["extracted"],
            "format_ok": screened["format_ok"],
            "scorer": screened["scorer"],
            "timed_out": timed_out,
            "refused": screened["refused"],
        }
        return reward, info

    def _scorer_for(self, task: Task) -> str:
        if self.scorer in ("exact", "math") and task.reference_answer is not None:
            return self.scorer
        return "dataset"

    def may_need_sandbox(self, source: TaskSource) -> bool:
        """Whether some answer to `source`'s tasks may need a capped scorer (not a string comparison)."""
        return not self._is_cheap("dataset" if self.scorer == "auto" else self.scorer, source)

    @staticmethod
    def _is_cheap(scorer: str, source: TaskSource) -> bool:
        """A string comparison: bounded on any text, needs no cap."""
        return scorer == "exact" or (scorer == "dataset" and source.score_is_bounded)

    @staticmethod
    def _decided(scorer: str, task: Task, source: TaskSource, answer: str) -> Any:
        """The correctness when no capped scorer is needed to tell, else _PENDING."""
        if scorer == "exact":
            return exact_match(answer, task.reference_answer)
        if scorer == "math" and (not isinstance(task.reference_answer, str) or len(answer) > MAX_MATH_ANSWER_CHARS
                                 or not plain_number_answer_ok(answer, task.reference_answer)):
            return 0.0  # decided here, before any scorer runs (the sandbox's workers only run math-verify)
        if scorer == "dataset" and source.score_is_bounded:
            return source.score(task, answer)
        return _PENDING

    def _capped(self, scorer: str, task: Task, source: TaskSource, answer: str,
                sandbox: Sandbox | None) -> float | None:
        if sandbox is not None:
            return sandbox.correctness(scorer, task, answer, self.timeout_s)
        if scorer == "math":
            return _math_verify_bounded(answer, task.reference_answer, self.timeout_s)
        return run_with_deadline(lambda: source.score(task, answer), self.timeout_s)
