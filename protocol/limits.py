"""Hard limits on what a peer may send, and the schema validation of every body kind.

Everything that reaches training must be bounded and finite: a single NaN log-prob or a 10^30
reward poisons a gradient step, a 100 MB message (genrl accepted those) exhausts memory. The
validators only check what can be checked without the task: shape, sizes and ranges. Whether the
task ref is known and the claimed reward is right is for node/ to decide (it regenerates both).

Log-prob slack: behavior log-probs are log p <= 0 in exact arithmetic, but the sender's
log_softmax runs in float32 (error ~1e-6 for logits of magnitude ~30). We accept values up to
`logprob_max = 1e-4` (50x that rounding error, still meaning p <= 1.0001) instead of rejecting an
honest node over rounding; consumers clamp with min(logprob, 0.0). Anything larger is a lie or a
bug ("positive_logprob"). Values below `logprob_min` are refused ("float_range"): a sampled token
with p < e^-1000 does not exist in float32, and such values overflow importance ratios.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from google.protobuf.message import Message

from proto import swarm_pb2

from .errors import Reason, Rejected
from .kinds import Kind

MiB = 1 << 20

# Same rules as node/tasks/base.py TaskRef (duplicated: protocol/ must not import node/).
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class Limits:
    # whole Envelope as received; at most the p2pd transport's limit (P2PD_MAX_MESSAGE_BYTES, protocol/transports/options.py:
    # the go-libp2p daemon silently drops pubsub messages over 1 MiB, headers included)
    max_message_bytes: int = MiB - 16 * 1024
    max_completions: int = 64                   # per RolloutGroup
    max_tokens_per_completion: int = 4096
    max_text_chars: int = 32 * 1024             # per completion text
    max_hint_chars: int = 8 * 1024              # hint text, and RolloutGroup.hint_text
    max_label_chars: int = 256                  # model name, fingerprints, weights version
    logprob_max: float = 1e-4                   # rounding slack above 0 (see module docstring)
    logprob_min: float = -1000.0
    reward_min: float = -10.0                   # claimed rewards (binary or partial credit, penalties)
    reward_max: float = 10.0
    temperature_max: float = 10.0               # [0, max]; 0 is greedy
    max_clock_skew_s: float = 120.0             # how far in the future a timestamp may be
    max_age_s: float = 600.0                    # how old a message may be (genrl's expiry)

    def __post_init__(self) -> None:
        if self.logprob_max < 0 or self.logprob_min >= 0:
            raise ValueError("need logprob_min < 0 <= logprob_max")
        if self.reward_min > self.reward_max:
            raise ValueError("need reward_min <= reward_max")


def _reject(reason: Reason, detail: str) -> None:
    raise Rejected(reason, detail)


def validate_task_ref(ref: swarm_pb2.TaskRef, where: str) -> None:
    if not _NAME_RE.match(ref.source) or not _NAME_RE.match(ref.dataset):
        _reject(Reason.SCHEMA, f"{where}.task_ref source/dataset must match {_NAME_RE.pattern}")
    if not _DIGEST_RE.match(ref.config_digest):
        _reject(Reason.SCHEMA, f"{where}.task_ref.config_digest must be 16 lowercase hex digits")
    if ref.index >= 1 << 63:
        _reject(Reason.SCHEMA, f"{where}.task_ref.index must be < 2^63")


def _check_label(value: str, name: str, limits: Limits) -> None:
    if len(value) > limits.max_label_chars:
        _reject(Reason.TEXT_TOO_LONG, f"{name} has {len(value)} chars > {limits.max_label_chars}")


def _check_float(value: float, low: float, high: float, name: str) -> None:
    if not low <= value <= high:  # False for NaN too
        _reject(Reason.FLOAT_RANGE, f"{name}={value!r} outside [{low}, {high}]")


def validate_completion(completion: swarm_pb2.Completion, limits: Limits, where: str) -> None:
    if len(completion.text) > limits.max_text_chars:
        _reject(Reason.TEXT_TOO_LONG, f"{where}.text has {len(completion.text)} chars > {limits.max_text_chars}")
    n_tokens = len(completion.token_ids)
    if n_tokens > limits.max_tokens_per_completion:
        _reject(Reason.TOO_MANY_TOKENS, f"{where} has {n_tokens} tokens > {limits.max_tokens_per_completion}")
    _check_float(completion.claimed_reward, limits.reward_min, limits.reward_max, f"{where}.claimed_reward")

    logprobs = completion.behavior_logprobs
    if logprobs:
        if len(logprobs) != n_tokens:
            _reject(Reason.LENGTH_MISMATCH, f"{where} has {len(logprobs)} log-probs for {n_tokens} tokens")
        values = list(logprobs)
        # One C-speed pass finds any NaN/inf: they propagate through the sum, and |float32| <
        # 3.4e38 times 4096 values cannot overflow a float64 sum on its own.
        if not math.isfinite(sum(values)):
            _reject(Reason.NONFINITE_LOGPROB, f"{where} has a NaN or infinite log-prob")
        if max(values) > limits.logprob_max:
            _reject(Reason.POSITIVE_LOGPROB, f"{where} has log-prob {max(values)!r} > {limits.logprob_max}")
        if min(values) < limits.logprob_min:
            _reject(Reason.FLOAT_RANGE, f"{where} has log-prob {min(values)!r} < {limits.logprob_min}")

    offsets = completion.char_offsets
    if offsets:
        if len(offsets) != 2 * n_tokens:
            _reject(Reason.LENGTH_MISMATCH, f"{where} has {len(offsets)} char offsets for {n_tokens} tokens (need 2 each)")
        starts, ends = offsets[0::2], offsets[1::2]
        # Spans may overlap (byte-level tokens splitting one character share its span), so check
        # starts and ends separately; sorted() on sorted input is one C-speed pass.
        if starts != sorted(starts) or ends != sorted(ends) or not all(map(operator.le, starts, ends)):
            _reject(Reason.BAD_OFFSETS, f"{where} char offsets are not monotone spans")
        if ends[-1] > len(completion.text):
            _reject(Reason.BAD_OFFSETS, f"{where} char offset {ends[-1]} beyond text length {len(completion.text)}")


def validate_rollout_group(msg: swarm_pb2.RolloutGroup, limits: Limits) -> None:
    """Raises Rejected unless `msg` is within every limit."""
    if not msg.HasField("task_ref"):
        _reject(Reason.SCHEMA, "RolloutGroup.task_ref missing")
    validate_task_ref(msg.task_ref, "RolloutGroup")
    model = msg.model
    _check_label(model.name, "model.name", limits)
    _check_label(model.tokenizer_fingerprint, "model.tokenizer_fingerprint", limits)
    _check_label(model.weights_version, "model.weights_version", limits)
    _check_label(msg.verifier_digest, "verifier_digest", limits)
    if len(msg.hint_text) > limits.max_hint_chars:
        _reject(Reason.TEXT_TOO_LONG, f"RolloutGroup.hint_text has {len(msg.hint_text)} chars > {limits.max_hint_chars}")

    for name in ("question", "answer"):
        if len(getattr(msg, name)) > limits.max_text_chars:
            _reject(Reason.TEXT_TOO_LONG, f"RolloutGroup.{name} has {len(getattr(msg, name))} chars > {limits.max_text_chars}")

    sampling = msg.sampling
    _check_float(sampling.temperature, 0.0, limits.temperature_max, "sampling.temperature")
    _check_float(sampling.top_p, 0.0, 1.0, "sampling.top_p")

    n = len(msg.completions)
    if n == 0:
        _reject(Reason.SCHEMA, "RolloutGroup has no completions")
    if n > limits.max_completions:
        _reject(Reason.TOO_MANY_COMPLETIONS, f"RolloutGroup has {n} completions > {limits.max_completions}")
    for i, completion in enumerate(msg.completions):
        where = f"completions[{i}]"
        validate_completion(completion, limits, where)
        if sampling.max_new_tokens and len(completion.token_ids) > sampling.max_new_tokens:
            _reject(Reason.TOO_MANY_TOKENS, f"{where} has more tokens than sampling.max_new_tokens")


def validate_hint(msg: swarm_pb2.Hint, limits: Limits) -> None:
    if not msg.HasField("task_ref"):
        _reject(Reason.SCHEMA, "Hint.task_ref missing")
    validate_task_ref(msg.task_ref, "Hint")
    if msg.level not in swarm_pb2.Hint.Level.values() or msg.level == swarm_pb2.Hint.LEVEL_UNSPECIFIED:
        _reject(Reason.SCHEMA, f"Hint.level {msg.level} is not a known level")
    if not msg.text:
        _reject(Reason.SCHEMA, "Hint.text is empty")
    if len(msg.text) > limits.max_hint_chars:
        _reject(Reason.TEXT_TOO_LONG, f"Hint.text has {len(msg.text)} chars > {limits.max_hint_chars}")


def validate_hint_request(msg: swarm_pb2.HintRequest, limits: Limits) -> None:
    if not msg.HasField("task_ref"):
        _reject(Reason.SCHEMA, "HintRequest.task_ref missing")
    validate_task_ref(msg.task_ref, "HintRequest")


VALIDATORS = {
    Kind.ROLLOUT_GROUP: validate_rollout_group,
    Kind.HINT: validate_hint,
    Kind.HINT_REQUEST: validate_hint_request,
}


def validate_body(kind: Kind, body: Message, limits: Limits) -> None:
    """Raises Rejected unless `body` (already decoded as `kind`'s type) is within every limit."""
    VALIDATORS[kind](body, limits)
