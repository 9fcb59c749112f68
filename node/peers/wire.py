"""Between this node's types and the wire's (proto/swarm.proto): task refs, rollout groups, hint levels."""
from __future__ import annotations

from node.train.groups import ScoredGroup
from node.train.hints import LEVELS
from node.tasks.base import TaskRef
from proto import swarm_pb2

LEVEL_NAMES = {swarm_pb2.Hint.L1: "l1", swarm_pb2.Hint.L2: "l2", swarm_pb2.Hint.L3: "l3",
               swarm_pb2.Hint.PREFIX: "prefix"}
LEVEL_CODES = {name: code for code, name in LEVEL_NAMES.items()}
assert set(LEVEL_CODES) == set(LEVELS)


def wire_task_ref(ref: TaskRef) -> swarm_pb2.TaskRef:
    return swarm_pb2.TaskRef(source=ref.source, dataset=ref.dataset, config_digest=ref.config_digest,
                             seed=ref.seed, index=ref.index)


def local_task_ref(ref: swarm_pb2.TaskRef) -> TaskRef:
    return TaskRef(source=ref.source, dataset=ref.dataset, config_digest=ref.config_digest, seed=ref.seed,
                   index=ref.index)


def to_wire(group: ScoredGroup, round_index: int, model: swarm_pb2.ModelCard,
            sampling: swarm_pb2.SamplingParams, verifier_digest: str = "") -> swarm_pb2.RolloutGroup:
    msg = swarm_pb2.RolloutGroup(
        task_ref=wire_task_ref(group.task.ref), model=model, sampling=sampling,
        policy_version=group.policy_version, round=round_index,
        question=group.task.question, answer=group.task.answer or "", verifier_digest=verifier_digest)
    for rollout, reward in zip(group.rollouts, group.rewards):
        offsets = [x for span in rollout.offsets for x in span]
        msg.completions.add(text=rollout.text, token_ids=rollout.completion_ids,
                            behavior_logprobs=[min(lp, 0.0) for lp in rollout.logprobs or []],
                            char_offsets=offsets, claimed_reward=reward, truncated=rollout.truncated)
    return msg
