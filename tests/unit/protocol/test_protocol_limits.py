"""Schema validation: every limit refuses with its own reason; realistic messages pass."""
from __future__ import annotations

import math

import pytest

from proto import swarm_pb2
from protocol.errors import Reason, Rejected
from protocol.limits import Limits, validate_hint, validate_hint_request, validate_rollout_group
from protocol.testing import make_hint, make_rollout_group, make_task_ref

LIMITS = Limits()


def reason_of(fn, msg, limits=LIMITS) -> Reason:
    with pytest.raises(Rejected) as caught:
        fn(msg, limits)
    return caught.value.reason


def group_with(mutate) -> swarm_pb2.RolloutGroup:
    group = make_rollout_group(n_completions=4, n_tokens=16)
    mutate(group)
    return group


def test_realistic_messages_pass():
    validate_rollout_group(make_rollout_group(), LIMITS)
    validate_rollout_group(make_rollout_group(64, 1), LIMITS)  # at the limits exactly
    validate_rollout_group(make_rollout_group(1, 4096), LIMITS)
    validate_hint(make_hint(), LIMITS)
    validate_hint_request(swarm_pb2.HintRequest(task_ref=make_task_ref()), LIMITS)
    bare = make_rollout_group(2, 8)  # log-probs and offsets are optional
    for completion in bare.completions:
        del completion.behavior_logprobs[:]
        del completion.char_offsets[:]
    validate_rollout_group(bare, LIMITS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nonfinite_logprob(value):
    group = group_with(lambda g: g.completions[2].behavior_logprobs.__setitem__(5, value))
    assert reason_of(validate_rollout_group, group) == Reason.NONFINITE_LOGPROB


def test_positive_logprob_beyond_rounding_slack():
    assert reason_of(validate_rollout_group, group_with(lambda g: g.completions[0].behavior_logprobs.__setitem__(0, 0.01))) == Reason.POSITIVE_LOGPROB
    # float32 rounding of log p ~ 0 is tolerated up to Limits.logprob_max (1e-4)
    validate_rollout_group(group_with(lambda g: g.completions[0].behavior_logprobs.__setitem__(0, 5e-5)), LIMITS)


def test_absurdly_negative_logprob():
    group = group_with(lambda g: g.completions[0].behavior_logprobs.__setitem__(0, -1e6))
    assert reason_of(validate_rollout_group, group) == Reason.FLOAT_RANGE


def test_counts_and_lengths():
    assert reason_of(validate_rollout_group, make_rollout_group(65, 1)) == Reason.TOO_MANY_COMPLETIONS
    assert reason_of(validate_rollout_group, make_rollout_group(1, 4097)) == Reason.TOO_MANY_TOKENS
    assert reason_of(validate_rollout_group, make_rollout_group(0, 1)) == Reason.SCHEMA
    long_text = group_with(lambda g: setattr(g.completions[1], "text", "x" * (LIMITS.max_text_chars + 1)))
    assert reason_of(validate_rollout_group, long_text) == Reason.TEXT_TOO_LONG
    over_budget = group_with(lambda g: setattr(g.sampling, "max_new_tokens", 8))
    assert reason_of(validate_rollout_group, over_budget) == Reason.TOO_MANY_TOKENS


def test_length_mismatches():
    assert reason_of(validate_rollout_group, group_with(lambda g: g.completions[0].behavior_logprobs.append(-1.0))) == Reason.LENGTH_MISMATCH
    assert reason_of(validate_rollout_group, group_with(lambda g: g.completions[0].char_offsets.append(1))) == Reason.LENGTH_MISMATCH


def test_char_offsets_must_be_monotone_spans_within_the_text():
    def set_offset(i, value):
        return group_with(lambda g: g.completions[0].char_offsets.__setitem__(i, value))

    def two_tokens(text, offsets):
        group = make_rollout_group(1, 2)
        group.completions[0].text = text
        group.completions[0].char_offsets[:] = offsets
        return group

    assert reason_of(validate_rollout_group, set_offset(4, 0)) == Reason.BAD_OFFSETS  # start goes back
    assert reason_of(validate_rollout_group, set_offset(31, 10_000)) == Reason.BAD_OFFSETS  # past the text
    assert reason_of(validate_rollout_group, two_tokens("abcd", [0, 1, 3, 2])) == Reason.BAD_OFFSETS  # end < start
    assert reason_of(validate_rollout_group, two_tokens("abcd", [0, 3, 1, 2])) == Reason.BAD_OFFSETS  # end goes back
    # Overlapping spans (byte-level tokens of one character) and empty spans are legitimate.
    validate_rollout_group(two_tokens("é", [0, 1, 0, 1]), LIMITS)
    validate_rollout_group(two_tokens("ab", [0, 0, 0, 2]), LIMITS)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda g: setattr(g.completions[0], "claimed_reward", 1e9),
        lambda g: setattr(g.completions[0], "claimed_reward", math.nan),
        lambda g: setattr(g.sampling, "temperature", -0.5),
        lambda g: setattr(g.sampling, "temperature", math.inf),
        lambda g: setattr(g.sampling, "top_p", 1.5),
    ],
)
def test_float_ranges(mutate):
    assert reason_of(validate_rollout_group, group_with(mutate)) == Reason.FLOAT_RANGE


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda g: g.ClearField("task_ref"), Reason.SCHEMA),
        (lambda g: setattr(g.task_ref, "config_digest", "XYZ"), Reason.SCHEMA),
        (lambda g: setattr(g.task_ref, "dataset", "../../etc"), Reason.SCHEMA),
        (lambda g: setattr(g.task_ref, "index", 1 << 63), Reason.SCHEMA),
        (lambda g: setattr(g.model, "name", "m" * 300), Reason.TEXT_TOO_LONG),
        (lambda g: setattr(g, "hint_text", "h" * 9000), Reason.TEXT_TOO_LONG),
    ],
)
def test_task_ref_and_labels(mutate, reason):
    assert reason_of(validate_rollout_group, group_with(mutate)) == reason


def test_hints():
    assert reason_of(validate_hint, swarm_pb2.Hint(task_ref=make_task_ref(), level=swarm_pb2.Hint.L2)) == Reason.SCHEMA  # empty
    assert reason_of(validate_hint, swarm_pb2.Hint(task_ref=make_task_ref(), text="x")) == Reason.SCHEMA  # no level
    assert reason_of(validate_hint, swarm_pb2.Hint(task_ref=make_task_ref(), level=9, text="x")) == Reason.SCHEMA
    assert reason_of(validate_hint, make_hint(text="x" * 9000)) == Reason.TEXT_TOO_LONG
    assert reason_of(validate_hint_request, swarm_pb2.HintRequest()) == Reason.SCHEMA


def test_limits_refuse_inconsistent_configuration():
    with pytest.raises(ValueError):
        Limits(logprob_min=1.0)
    with pytest.raises(ValueError):
        Limits(reward_min=2.0, reward_max=1.0)
