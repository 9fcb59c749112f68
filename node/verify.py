"""Verifying a peer's message after protocol.Ingress accepted its bytes: a pure step.

`verify_group(sender, msg, context)` rebuilds the task from the TaskRef (never the sender's copy),
re-scores every completion with our verifier, re-tokenizes the text and picks each completion's
behavior tier (node/tiers.py); `verify_hint` and `verify_hint_request` rebuild the task a hint or
a request is about. Each returns what the message is worth to us, or a `Refusal` naming why not
(node/reasons.py) and whether that is evidence against the signer (`blame`). Nothing here counts,
logs or reports: node/exchange.py does, in one place, with what these return.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from node.groups import ScoredGroup
from node.hints import leaks_answer
from node.prompts import Retokenizer
from node.reasons import (GROUP_TOO_LONG, HINT_REQUEST_UNKNOWN, HINTED, LEAK, MISMATCH, REFUSED, TIMEOUT,
                          TOO_LONG, UNKNOWN, UNTOKENIZABLE)
from node.tasks.base import Task, TaskSource
from node.tiers import assign_tier
from node.verifiers import Sandbox, Verifier
from node.wire import local_task_ref
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


@dataclass(frozen=True)
class _Checked:
    """One completion that passed: our reward and its text in our tokens."""

    reward: float
    correct: bool
    text_ids: list[int]
    offsets: list[tuple[int, int]]
    disagrees: bool


def _rebuild(msg_ref: swarm_pb2.TaskRef, context: VerifyContext) -> Task | Refusal:
    try:
        return context.source.rebuild(local_task_ref(msg_ref))
    except ValueError as err:  # UnknownTaskError / UnknownDatasetError: we cannot check it
        return Refusal(UNKNOWN, blame=True, detail=str(err))


def _too_long_text(text: str, context: VerifyContext) -> bool:
    """Length first: it is free, and it bounds every later step (scoring, tokenizing, memory)."""
    return len(text) > context.max_completion_tokens * MAX_CHARS_PER_TOKEN


def verify_group(sender: str, msg: swarm_pb2.RolloutGroup, context: VerifyContext) -> ScoredGroup | Refusal:
    """The group scored, re-tokenized and tiered by us, or why it is refused."""
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
    try:
        prompt_ids = context.retokenizer.prompt(task.question)
    except Exception as err:  # only a sender-supplied question can be outside our vocabulary
        return Refusal(UNTOKENIZABLE, detail=f"question: {err}")
    if any(_too_long_text(c.text, context) for c in msg.completions):
        return Refusal(TOO_LONG)
    return _score_group(sender, msg, task, verifier, prompt_ids, context)


def _score_group(sender: str, msg: swarm_pb2.RolloutGroup, task: Task, verifier: Verifier,
                 prompt_ids: list[int], context: VerifyContext) -> ScoredGroup | Refusal:
    same_verifier = msg.verifier_digest == verifier.digest
    rewards, correct, rollouts, reasons = [], [], [], []
    group_tokens = disagreements = 0
    for completion in msg.completions:
        checked = _check_completion(completion, task, verifier, same_verifier, context)
        if isinstance(checked, Refusal):
            return dataclasses.replace(checked, disagreements=disagreements + checked.disagreements)
        disagreements += checked.disagrees
        group_tokens += len(checked.text_ids)
        if group_tokens > context.max_group_tokens:
            return Refusal(GROUP_TOO_LONG, disagreements=disagreements)
        behavior = assign_tier(completion, msg.model.tokenizer_fingerprint, checked.text_ids, checked.offsets,
                               context.retokenizer)
        rewards.append(checked.reward)
        correct.append(checked.correct)
        reasons.append(behavior.reason)
        rollouts.append(Rollout(prompt_ids=prompt_ids, completion_ids=behavior.completion_ids,
                                logprobs=behavior.logprobs, text=completion.text, offsets=[],
                                truncated=completion.truncated, tier=behavior.tier, alignment=behavior.alignment))
    return ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=correct, origin=sender,
                       policy_version=msg.policy_version,
                       meta={"sender_round": msg.round, "tokenizer": msg.model.tokenizer_fingerprint,
                             "tier_reasons": reasons, "reward_disagreements": disagreements})


def _check_completion(completion: swarm_pb2.Completion, task: Task, verifier: Verifier, same_verifier: bool,
                      context: VerifyContext) -> _Checked | Refusal:
    reward, info = verifier.score(task, context.source, completion.text, context.sandbox)
    if info["refused"]:
        return Refusal(REFUSED)
    if info["timed_out"]:
        return Refusal(TIMEOUT)
    disagrees = abs(reward - completion.claimed_reward) > REWARD_TOLERANCE
    if disagrees and same_verifier:  # it must have computed exactly our reward: a lie
        return Refusal(MISMATCH, blame=True, detail=f"claimed {completion.claimed_reward:g}, we score {reward:g}")
    try:
        text_ids, offsets = context.retokenizer.encode_text(completion.text)
    except Exception as err:  # a tokenizer's error on foreign text is not the sender's fault
        return Refusal(UNTOKENIZABLE, detail=f"completion: {err}", disagreements=int(disagrees))
    if len(text_ids) > context.max_completion_tokens:  # would blow up our padded batch; not a protocol fault
        return Refusal(TOO_LONG, disagreements=int(disagrees))
    return _Checked(reward, bool(info["correct"]), text_ids, offsets, disagrees)


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
