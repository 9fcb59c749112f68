"""node/peers/verify.py on its own: every refusal reason reachable, blame only where it is evidence.

A real tiny node supplies the task source, verifier and tokenizer; no exchange, transport or
Ingress is involved: verify is a function of the message and its context."""
import pytest

from node.train.groups import ScoredGroup
from node.train.loop import Node
from node.peers.reasons import BLAMED
from node.scoring.sandbox import ScorerSandbox
from node.peers.verify import Refusal, VerifyContext, verify_group, verify_hint, verify_hint_request
from node.peers.wire import LEVEL_CODES, wire_task_ref
from proto import swarm_pb2
from tests.unit.peers.test_exchange import honest_group

SENDER = "peer-a"


@pytest.fixture(scope="module")
def node(tmp_path_factory, tiny_config):
    cfg = tiny_config()
    return Node(cfg, tmp_path_factory.mktemp("verify"))


def context(node, **changes) -> VerifyContext:
    base = dict(source=node.source, verifier=node.verifier, retokenizer=node.retokenizer,
                max_completion_tokens=16, max_group_tokens=256)
    return VerifyContext(**{**base, **changes})


def unknown_ref(msg) -> None:
    msg.task_ref.source = "reasoning_gym"
    msg.task_ref.dataset = "leg_counting"  # not in this node's sources


def bad_digest(msg) -> None:
    msg.task_ref.config_digest = "0" * 16  # a family we configure, named wrongly


def refused(result, reason: str) -> Refusal:
    assert isinstance(result, Refusal), result
    assert result.reason == reason, result
    assert result.blame == (reason in BLAMED), result  # blame only for the three scored reasons
    return result


def test_an_honest_group_is_rescored_and_tiered(node):
    msg = honest_group(node, 0)
    before = msg.SerializeToString()
    group = verify_group(SENDER, msg, context(node))
    assert isinstance(group, ScoredGroup) and group.origin == SENDER
    assert group.rewards == [1.0, 0.0, 1.0, 0.0] and group.correct == [True, False, True, False]
    assert group.meta["tier_reasons"] == ["other_tokenizer"] * 4 and group.meta["reward_disagreements"] == 0
    assert msg.SerializeToString() == before  # the message is not touched
    again = verify_group(SENDER, msg, context(node))
    assert again.rewards == group.rewards and [r.completion_ids for r in again.rollouts] == \
        [r.completion_ids for r in group.rollouts]  # same message, same context: same verdict


def test_a_hinted_group_is_refused_without_blame(node):
    msg = honest_group(node, 0)
    msg.hint_text = "think about the largest digit"
    refused(verify_group(SENDER, msg, context(node)), "hinted_group")


def test_an_unknown_task_is_blamed_unless_sender_answers_are_accepted(node):
    msg = honest_group(node, 0)
    unknown_ref(msg)
    refusal = refused(verify_group(SENDER, msg, context(node)), "task_not_configured")  # a source we lack
    assert refusal.detail  # what the task source said
    group = verify_group(SENDER, msg, context(node, accept_sender_answers=True))
    assert isinstance(group, ScoredGroup) and group.rewards == [1.0, 0.0, 1.0, 0.0]  # the sender's answer
    msg.answer = ""  # nothing to score against: unknown again, blamed
    refused(verify_group(SENDER, msg, context(node, accept_sender_answers=True)), "task_not_configured")
    wrong = honest_group(node, 0)
    bad_digest(wrong)
    refused(verify_group(SENDER, wrong, context(node)), "unknown_task")


def test_a_sender_question_outside_our_vocabulary_is_untokenizable(node):
    msg = honest_group(node, 0)
    unknown_ref(msg)
    msg.question = "é?"
    refusal = refused(verify_group(SENDER, msg, context(node, accept_sender_answers=True)), "untokenizable")
    assert refusal.detail.startswith("question: ")


def test_a_wrong_claim_under_our_verifier_is_blamed_under_another_only_observed(node):
    msg = honest_group(node, 0)
    msg.completions[1].claimed_reward = 1.0  # claims a wrong answer was right
    msg.verifier_digest = node.verifier.digest
    refusal = refused(verify_group(SENDER, msg, context(node)), "wrong_reward")
    assert refusal.detail == "claimed 1, we score 0"
    msg.verifier_digest = "another"
    group = verify_group(SENDER, msg, context(node))
    assert isinstance(group, ScoredGroup) and group.rewards[1] == 0.0  # our reward, never the claim
    assert group.meta["reward_disagreements"] == 1


def test_disagreements_before_a_refusal_are_still_reported(node):
    msg = honest_group(node, 0)
    msg.verifier_digest = "another"
    msg.completions[0].claimed_reward = 0.0  # disagrees (we score 1): observed, not refused
    msg.completions[2].text = "é"  # scores 0, claimed 1: disagrees too, then cannot be tokenized
    refusal = refused(verify_group(SENDER, msg, context(node)), "untokenizable")
    assert refusal.detail.startswith("completion: ") and refusal.disagreements == 2


def test_a_compute_bomb_is_refused_and_a_scorer_timeout_drops_the_group_without_blame(node):
    msg = honest_group(node, 0)
    msg.completions[1].text = "9**9**9**9"
    math = node.verifier.model_copy(update={"scorer": "math"})
    refused(verify_group(SENDER, msg, context(node, verifier=math)), "score_refused")
    # a real scorer sandbox whose worker is still starting when the call may no longer wait: no answer in time
    sandbox = ScorerSandbox(None, workers=1, ready_wait_s=0.0)
    try:
        refused(verify_group(SENDER, honest_group(node, 0), context(node, verifier=math, sandbox=sandbox)),
                "score_timeout")
        assert sandbox.snapshot()["unavailable"] == 1
    finally:
        sandbox.close()


def test_length_limits_refuse_text_completions_and_groups(node):
    msg = honest_group(node, 0)
    msg.completions[1].text = "1" * (2 * 256 + 1)  # longer than 256 characters per allowed token
    refused(verify_group(SENDER, msg, context(node, max_completion_tokens=2)), "too_long")
    msg = honest_group(node, 0)
    answer = msg.completions[0].text
    msg.completions[1].text = "0" * 5  # 5 tokens, scores 0 as claimed
    refused(verify_group(SENDER, msg, context(node, max_completion_tokens=4)), "too_long")
    short = verify_group(SENDER, honest_group(node, 0), context(node, max_group_tokens=4 * len(answer)))
    assert isinstance(short, ScoredGroup)  # exactly at the group limit
    refused(verify_group(SENDER, honest_group(node, 0), context(node, max_group_tokens=4 * len(answer) - 1)),
            "group_too_long")


def hint(task, text: str) -> swarm_pb2.Hint:
    return swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=LEVEL_CODES["l1"], text=text)


def test_hints(node):
    task = node.source.batch(1000, 1)[0]
    assert verify_hint(hint(task, "m="), context(node)).prompt_key == task.prompt_key  # the tiny vocabulary
    refused(verify_hint(hint(task, f"it is {task.answer}"), context(node)), "hint_leaks_answer")
    refused(verify_hint(hint(task, "m" * (16 * 256 + 1)), context(node)), "too_long")
    refused(verify_hint(hint(task, "m" * 17), context(node)), "too_long")  # 17 tokens over a limit of 16
    assert refused(verify_hint(hint(task, "é"), context(node)), "untokenizable").detail.startswith("hint: ")
    unknown = hint(task, "m=")
    unknown_ref(unknown)
    refused(verify_hint(unknown, context(node)), "task_not_configured")
    bad_digest(unknown := hint(task, "m="))
    refused(verify_hint(unknown, context(node)), "unknown_task")


def test_hint_requests_for_unknown_tasks_are_refused_without_blame(node):
    task = node.source.batch(1000, 1)[0]
    request = swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref))
    assert verify_hint_request(request, context(node)).prompt_key == task.prompt_key
    unknown_ref(request)
    refused(verify_hint_request(request, context(node)), "hint_request_unknown_task")
