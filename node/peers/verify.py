"""Verifying a peer's message after protocol.Ingress accepted its bytes: pure steps, in two stages.

A rollout group is checked cheaply first and expensively only if the node may train on it:
  `claims_flat(msg)`  the claimed rewards have no variance (free: a caller may stop here)
  `precheck_group(sender, msg, context)`  rebuild the task from the TaskRef (never the sender's
      copy; cached by ref), bound every completion's length: a `Candidate`, whose rewards are still
      the sender's claims
  `verify_candidate(candidate, context)`  render and tokenize the prompt, re-score every completion
      with our verifier (one sandbox round-trip for the group), re-tokenize the texts (one batched
      call) and pick each completion's behavior tier (node/peers/tiers.py): a `ScoredGroup`; its slow
      step, `score_candidate`, may run first on its own (outside the caller's lock, or under a
      shorter deadline)
`verify_group` is both in a row. `verify_hint` and `verify_hint_request` rebuild the task a hint or
a request is about. Each returns what the message is worth to us, or a `Refusal` naming why not
(node/peers/reasons.py) and whether that is evidence against the signer (`blame`): a TaskRef we cannot
rebuild is `unknown_task`, or `task_not_configured` when it names a source, family or seed this node
does not configure (what an honest peer with another task mix sends: it costs nothing net). Nothing here counts,
logs or reports: node/peers/ledger.py does, in one place, with what these return. `context.timer`, when
given, adds the seconds each expensive step took (rebuild, score, retokenize, tier).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from node.train.groups import ScoredGroup
from node.train.hints import leaks_answer
from node.train.prompts import Retokenizer
from node.peers.reasons import (GROUP_TOO_LONG, HINT_REQUEST_UNKNOWN, HINTED, LEAK, MISMATCH, NOT_CONFIGURED,
                          REFUSED, TIMEOUT, TOO_LONG, UNKNOWN, UNTOKENIZABLE)
from node.tasks.base import NotConfiguredError, Task, TaskSource
from node.peers.tiers import assign_tier
from node.scoring.verifiers import Sandbox, Verifier
from node.peers.wire import local_task_ref
from policy.types import Rollout
from proto import swarm_pb2

REWARD_TOLERANCE = 1e-3  # claimed rewards travel as float32; honest peers agree far closer than this
MAX_CHARS_PER_TOKEN = 256  # no tokenizer's token spans more: longer text is refused untokenized


@dataclass(frozen=True)
class Refusal:
    """Why a message is refused; `blame`: it is evidence against the signer (reported as `reason`).
    `disagreements`: completions whose claimed reward another verifier computed differently from
    ours before the refusal (not a fault: counted under `observed` all the same)."""

    reason: str
    blame: bool = False
    detail: str = ""
    disagreements: int = 0


@dataclass(frozen=True)
class VerifyContext:
    """What verification needs from this node. `max_completion_tokens`: longer peer text is refused;
    `max_group_tokens`: the most tokens a group's completions may hold in all."""

    source: TaskSource
    verifier: Verifier
    retokenizer: Retokenizer
    max_completion_tokens: int
    max_group_tokens: int
    sandbox: Sandbox | None = None  # where peers' text is scored; None: in a thread (trusted callers only)
    accept_sender_answers: bool = False  # score an unknown task against the sender's own answer
    tasks: TaskCache | None = None  # rebuilt tasks by ref: a busy swarm sends the same refs again and again
    timer: Callable[[str, float], None] | None = None  # told the seconds each step took

    def timed(self, step: str):
        return timed(self.timer, step)


@contextmanager
def timed(add: Callable[[str, float], None] | None, step: str):
    """Tells `add(step, seconds)` how long the block took (nothing when `add` is None)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if add is not None:
            add(step, time.perf_counter() - started)


class TaskCache:
    """The last `size` tasks rebuilt from peers' refs, and the refs we could not build (an unknown
    ref costs one failed rebuild, not one per message). Not thread-safe: one per exchange, whose
    verification runs on one thread at a time."""

    def __init__(self, source: TaskSource, size: int = 4096):
        self.source, self.size = source, size
        self._tasks: OrderedDict[str, Task | ValueError] = OrderedDict()  # ref key -> task, or why it is unknown
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()  # question -> our prompt's token ids

    def rebuild(self, ref) -> Task:
        key = ref.key
        hit = self._tasks.get(key)
        if hit is None:
            try:
                hit = self.source.rebuild(ref)
            except ValueError as err:  # UnknownTaskError / UnknownDatasetError, remembered as such
                hit = err
            self._tasks[key] = hit
            if len(self._tasks) > self.size:
                self._tasks.popitem(last=False)
        self._tasks.move_to_end(key)
        if isinstance(hit, ValueError):
            raise type(hit)(*hit.args)  # a fresh one: raising the cached one would grow its traceback
        return hit

    def prompt(self, question: str, retokenizer: Retokenizer) -> list[int]:
        """Our prompt's token ids for `question` (rendered and tokenized once per question)."""
        ids = self._prompts.get(question)
        if ids is None:
            ids = self._prompts[question] = retokenizer.prompt(question)
            if len(self._prompts) > self.size:
                self._prompts.popitem(last=False)
        self._prompts.move_to_end(question)
        return ids


@dataclass(frozen=True)
class Candidate:
    """A peer's group that passed the cheap checks (signed, within limits, a task we can build, every
    text within our length cap). Its rewards are the sender's claims until `verify_candidate`."""

    origin: str  # its signer, as a ScoredGroup's
    msg: swarm_pb2.RolloutGroup
    task: Task
    verifier: Verifier = field(repr=False)  # ours, or its math-scorer copy (accept_sender_answers)
    flat: bool = False  # claims_flat(msg): alone, the group would carry no signal (if the claims are true)

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.msg.completions]


@dataclass(frozen=True)
class _Checked:
    """One completion that passed: our reward and its text in our tokens."""

    reward: float
    correct: bool
    text_ids: list[int]
    offsets: list[tuple[int, int]]
    disagrees: bool


def _rebuild(msg_ref: swarm_pb2.TaskRef, context: VerifyContext) -> Task | Refusal:
    rebuild = context.tasks.rebuild if context.tasks is not None else context.source.rebuild
    try:
        with context.timed("rebuild"):
            return rebuild(local_task_ref(msg_ref))
    except NotConfiguredError as err:  # a family or seed we lack: an honest peer's, perhaps
        return Refusal(NOT_CONFIGURED, blame=True, detail=str(err))
    except ValueError as err:  # UnknownTaskError / UnknownDatasetError: we cannot check it
        return Refusal(UNKNOWN, blame=True, detail=str(err))


def _too_long_text(text: str, context: VerifyContext) -> bool:
    """Length first: it is free, and it bounds every later step (scoring, tokenizing, memory)."""
    return len(text) > context.max_completion_tokens * MAX_CHARS_PER_TOKEN


def claims_flat(msg: swarm_pb2.RolloutGroup) -> bool:
    """The group's claimed rewards are all equal (the first thing to look at: it costs nothing)."""
    return len({round(c.claimed_reward, 6) for c in msg.completions}) <= 1


def verify_group(sender: str, msg: swarm_pb2.RolloutGroup, context: VerifyContext) -> ScoredGroup | Refusal:
    """The group scored, re-tokenized and tiered by us, or why it is refused (both stages)."""
    candidate = precheck_group(sender, msg, context)
    return candidate if isinstance(candidate, Refusal) else verify_candidate(candidate, context)


def precheck_group(sender: str, msg: swarm_pb2.RolloutGroup, context: VerifyContext) -> Candidate | Refusal:
    """The cheap checks: no hint, a task we can build, texts within our cap."""
    if msg.hint_text:
        return Refusal(HINTED)
    verifier = context.verifier
    task = _rebuild(msg.task_ref, context)
    if isinstance(task, Refusal):
        if not (context.accept_sender_answers and msg.question and msg.answer):
            return task
        # opt-in, as rl-swarm does: score against the sender's own answer, nobody blamed
        task = Task(ref=local_task_ref(msg.task_ref), question=msg.question, answer=msg.answer, metadata={})
        verifier = verifier.model_copy(update={"scorer": "math"})
    if any(_too_long_text(c.text, context) for c in msg.completions):
        return Refusal(TOO_LONG)
    return Candidate(sender, msg, task, verifier, claims_flat(msg))


Scores = list[tuple[float, dict]]  # a group's completions scored by its verifier (Verifier.score_many)


def score_candidate(candidate: Candidate, context: VerifyContext, timeout_s: float | None = None) -> Scores:
    """Every completion scored (one batch; after a timeout the rest are not): the slow step, which
    touches neither the tokenizer nor the task cache, so a caller may run it outside its lock.
    `timeout_s`: a deadline per scorer call shorter than the verifier's (the training thread's
    remaining verification budget), shared among the completions so that the whole group fits in
    it, and the longest it waits for a sandbox busy with another caller (SandboxBusy past it); the
    claims are still compared with the verifier's digest."""
    verifier = candidate.verifier
    if timeout_s is not None:
        per_answer = timeout_s / max(1, len(candidate.msg.completions))
        if per_answer < verifier.timeout_s:
            verifier = verifier.model_copy(update={"timeout_s": max(per_answer, 1e-3)})
    with context.timed("score"):
        return verifier.score_many(candidate.task, context.source, candidate.texts, context.sandbox,
                                   stop_at_timeout=True, wait_s=timeout_s)


def verify_candidate(candidate: Candidate, context: VerifyContext, scores: Scores | None = None) -> ScoredGroup | Refusal:
    """The expensive checks of a prechecked group: our rewards, our tokens, each completion's tier;
    `scores`: what score_candidate gave (scored now when None)."""
    msg, task = candidate.msg, candidate.task
    try:
        with context.timed("retokenize"):
            prompt_ids = (context.tasks.prompt(task.question, context.retokenizer) if context.tasks is not None
                          else context.retokenizer.prompt(task.question))
    except Exception as err:  # only a sender-supplied question can be outside our vocabulary
        return Refusal(UNTOKENIZABLE, detail=f"question: {err}")
    checked = _check_completions(candidate, context, scores if scores is not None else score_candidate(candidate, context))
    if isinstance(checked, Refusal):
        return checked
    rewards, correct, rollouts, reasons = [], [], [], []
    group_tokens = 0
    disagreements = sum(c.disagrees for c in checked)
    with context.timed("tier"):
        for completion, check in zip(msg.completions, checked):
            group_tokens += len(check.text_ids)
            if group_tokens > context.max_group_tokens:
                return Refusal(GROUP_TOO_LONG, disagreements=disagreements)
            behavior = assign_tier(completion, msg.model.tokenizer_fingerprint, check.text_ids, check.offsets,
                                   context.retokenizer)
            rewards.append(check.reward)
            correct.append(check.correct)
            reasons.append(behavior.reason)
            rollouts.append(Rollout(prompt_ids=prompt_ids, completion_ids=behavior.completion_ids,
                                    logprobs=behavior.logprobs, text=completion.text, offsets=[],
                                    truncated=completion.truncated, tier=behavior.tier,
                                    alignment=behavior.alignment))
    return ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=correct, origin=candidate.origin,
                       policy_version=msg.policy_version,
                       meta={"sender_round": msg.round, "tokenizer": msg.model.tokenizer_fingerprint,
                             "tier_reasons": reasons, "reward_disagreements": disagreements})


def _check_completions(candidate: Candidate, context: VerifyContext, scores: Scores) -> list[_Checked] | Refusal:
    """Every completion's score checked and its text re-tokenized (one batch), in order; the first
    that fails refuses the group, with the disagreements counted up to it."""
    msg, verifier = candidate.msg, candidate.verifier
    texts = candidate.texts
    same_verifier = msg.verifier_digest == verifier.digest
    with context.timed("retokenize"):
        encoded = context.retokenizer.encode_texts(texts)
    checked: list[_Checked] = []
    disagreements = 0
    for completion, (reward, info), tokens in zip(msg.completions, scores, encoded):
        if info["refused"]:
            return Refusal(REFUSED, disagreements=disagreements)
        if info["timed_out"]:
            return Refusal(TIMEOUT, disagreements=disagreements)
        disagrees = abs(reward - completion.claimed_reward) > REWARD_TOLERANCE
        if disagrees and same_verifier:  # it must have computed exactly our reward: a lie
            return Refusal(MISMATCH, blame=True, detail=f"claimed {completion.claimed_reward:g}, we score {reward:g}",
                           disagreements=disagreements)
        disagreements += disagrees
        if isinstance(tokens, Exception):  # a tokenizer's error on foreign text is not the sender's fault
            return Refusal(UNTOKENIZABLE, detail=f"completion: {tokens}", disagreements=disagreements)
        text_ids, offsets = tokens
        if len(text_ids) > context.max_completion_tokens:  # would blow up our padded batch; not a protocol fault
            return Refusal(TOO_LONG, disagreements=disagreements)
        checked.append(_Checked(reward, bool(info["correct"]), text_ids, offsets, disagrees))
    return checked


def verify_hint(msg: swarm_pb2.Hint, context: VerifyContext) -> Task | Refusal:
    """The task a hint is for, or why the hint is refused: a hint that gives the answer away is
    the signer's fault; text our tokenizer cannot take within our length cap is not (another
    model's alphabet is not a fault), but it would be fed to our model, so it is checked now."""
    task = _rebuild(msg.task_ref, context)
    if isinstance(task, Refusal):
        return task
    if leaks_answer(msg.text, task.reference_answer):
        return Refusal(LEAK, blame=True)
    if _too_long_text(msg.text, context):
        return Refusal(TOO_LONG)
    try:
        ids, _ = context.retokenizer.encode_text(msg.text)
    except Exception as err:  # e.g. a character outside the tiny vocabulary
        return Refusal(UNTOKENIZABLE, detail=f"hint: {err}")
    if len(ids) > context.max_completion_tokens:
        return Refusal(TOO_LONG)
    return task


def verify_hint_request(msg: swarm_pb2.HintRequest, context: VerifyContext) -> Task | Refusal:
    """The task a peer asks hints for; one we cannot build is a task family we lack: not its fault."""
    task = _rebuild(msg.task_ref, context)
    return Refusal(HINT_REQUEST_UNKNOWN) if isinstance(task, Refusal) else task
