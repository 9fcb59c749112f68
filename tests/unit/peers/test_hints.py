"""Hints: the leak rule, solution prefixes, the HintBook's life cycle, and two real tiny nodes that
ask for, answer, verify and use hints over the in-process bus."""
from __future__ import annotations

import time

import pytest

from node.train.pass_rates import PassRates
from node.config.schema import load_config
from node.train.groups import HintUse, ScoredGroup, to_train_group
from node.train.hint_writer import solution_prefix
from node.config.sections import HintConfig
from node.train.hints import HintBook, leaks_answer
from node.train.loop import Node
from node.observe.metrics import read_metrics
from node.service.assembly import memory_bus_node
from node.tasks.base import TaskRef
from node.tasks.synthetic import SyntheticSource
from policy.types import Rollout
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, topic_name
from protocol.testing import seal_message
from tests.support.tiny_node import tiny_cfg

COUNT = SyntheticSource({"count": 1.0}, seed=0)


def test_leak_rule_numbers_match_whole_numbers_only():
    assert leaks_answer("so the total is 12.", "12")
    assert not leaks_answer("add 1 and 2 first", "12")
    assert not leaks_answer("it is 4.5 or 14", "4")
    assert leaks_answer("Then x = -3", "-3") and not leaks_answer("Then x = 3", "-3")
    assert leaks_answer("The capital is PARIS", "Paris")
    assert not leaks_answer("anything", None) and not leaks_answer("anything", "  ")


def test_solution_prefix_stops_before_the_answer():
    assert solution_prefix("3456", "3456", 0.75) == "345"
    assert solution_prefix("7 + 5 = 12, so <answer>12</answer>", "12", 0.5) == "7 + 5 = 1"  # not "12"
    assert solution_prefix("12", "12", 0.5) == "1"
    assert solution_prefix("5", "5", 0.75) == ""  # nothing to give without the answer


def scored(task, correct, hint=None, hinted=()):
    rollouts = [Rollout([1], [3], [-1.0], "0", [(0, 1)], True) for _ in correct]
    return ScoredGroup(task, rollouts, [float(c) for c in correct], list(correct), hint=hint, hinted=list(hinted))


def test_hintbook_requests_adapts_help_and_anneals():
    rates = PassRates(decay=1.0)
    cfg = HintConfig(request_every=3, max_requests_per_round=1, ease_threshold=0.5, prefix_step=0.34)
    book = HintBook(cfg, rates, usable_levels=("l1", "prefix"))
    task, other = COUNT.batch(0, 2)
    fail = scored(task, [False] * 4)
    assert book.requests([fail, scored(other, [False] * 4)], 0) == [task]  # at most 1 per round
    assert book.requests([fail], 1) == []  # asked 1 round ago; request_every = 3
    never_failed = next(t for i in range(50) for t in COUNT.batch(10 + i, 1)
                        if t.prompt_key not in (task.prompt_key, other.prompt_key))
    assert not book.add(never_failed, "l1", "x") and book.counters["hints_unsolicited"] == 1
    assert book.add(other, "l1", "y")  # failed too (not asked yet, at most 1 request per round): welcome
    assert book.add(task, "l2", "unusable level") is False and book.counters["hints_unusable"] == 1
    assert book.add(task, "l1", "count up by one") and book.add(task, "prefix", "345")
    assert not book.add(task, "l1", "a second l1")  # first valid text per level wins
    assert book.current(task) == HintUse("l1", "count up by one")
    assert book.revisits(2, exclude={other.prompt_key}) == [task.ref]

    book.observe(scored(task, [False] * 4, HintUse("l1", "count up by one"), [False, True, True, True]))
    assert book.current(task) == HintUse("prefix", "345")  # all hinted failed: more help
    book.observe(scored(task, [False, True, True, False], HintUse("prefix", "345"), [False, True, True, True]))
    assert book.current(task) == HintUse("prefix", "34")  # 2 of 3 hinted right: shorter prefix
    book.observe(scored(task, [False, False, False, False], HintUse("prefix", "34"), [False, True, True, True]))
    assert book.current(task) == HintUse("prefix", "345")  # failing again: the prefix grows back

    restored = HintBook(cfg, rates, usable_levels=("l1", "prefix"))
    restored.load_state_dict(book.state_dict())
    assert restored.current(task) == book.current(task) and restored.counters == book.counters

    rates.observe(task, [True] * 8)  # the unhinted pass rate is now high: stop hinting
    book.observe(scored(task, [True] * 4, HintUse("prefix", "345"), [False, True, True, True]))
    assert book.current(task) is None and book.counters["prompts_annealed"] == 1


def count_node(tmp_path, name, bus, extra=()):
    cfg = tiny_cfg("swarm.name=h", "tasks.datasets={count = 1.0}",
                   "tasks.prompts_per_round=4", "sampling.max_new_tokens=4",
                   "hints.revisits_per_round=4", *extra)
    node = memory_bus_node(cfg, tmp_path / name, bus, name)
    return node


def test_two_nodes_ask_answer_and_train_with_prefix_hints(tmp_path):
    bus = MemoryBus()
    weak = count_node(tmp_path, "weak", bus)
    strong = count_node(tmp_path, "strong", bus, ["tasks.seed=1"])
    for a in range(10):  # the strong node has solved every count question before
        task = next(t for i in range(200) for t in strong.source.batch(i, 1) if t.question == f"{a}++=")
        strong.hint_writer.solutions[task.prompt_key] = task.answer
    for round_index in range(6):
        weak.metrics.append(weak.run_round(round_index))
        strong.metrics.append(strong.run_round(round_index))
    rows = read_metrics(tmp_path / "weak")
    assert sum(r.get("hint_requests_served", 0) for r in read_metrics(tmp_path / "strong")) >= 1
    assert sum(r["hints_accepted"] for r in rows) >= 1 and weak.hints.counters["requests_sent"] >= 1
    assert sum(r["groups_hinted"] for r in rows) >= 1
    assert any(r["hinted_pass_rate"] is not None for r in rows)

    # the next hinted group: G-1 completions start with the prefix, which the loss never sees
    task = next(weak.source.rebuild(ref) for ref in weak.hints.revisits(99, set()))
    hint = weak.hints.current(task)
    assert hint is not None and hint.level == "prefix" and task.answer.startswith(hint.text)
    groups, _ = weak.sampler.sample([task], [hint], weak.learner.policy_version)
    hinted = [r for r, h in zip(groups[0].rollouts, groups[0].hinted) if h]
    assert len(hinted) == weak.cfg.sampling.group_size - 1 and not groups[0].hinted[0]
    prefix_ids = weak.policy.tokenizer(hint.text, add_special_tokens=False)["input_ids"]
    for r in hinted:
        assert r.completion_ids[: len(prefix_ids)] == prefix_ids and r.hint_tokens == len(prefix_ids)
        assert r.text.startswith(hint.text)
    sample = to_train_group(groups[0]).samples[1]
    assert sample.loss_mask[: len(prefix_ids)] == [0] * len(prefix_ids) and sum(sample.loss_mask) > 0


def test_hints_are_verified_like_every_message(tmp_path, identity):
    """A hint that leaks the answer is refused and charged to its signer; one for a task we never
    asked about is dropped without blame; a hint request for an unknown task blames nobody."""
    bus = MemoryBus()
    node = count_node(tmp_path, "node", bus)
    node.metrics.append(node.run_round(0))  # all wrong from scratch: asks for hints
    asked = next(iter(node.hints.states.values()))
    task = node.source.rebuild(TaskRef.from_dict(asked.ref))
    hostile, honest = identity(), identity()
    sender = MemoryTransport(bus, "sender")
    sender.start()
    now = int(time.time() * 1000)
    ref = swarm_pb2.TaskRef(**task.ref.to_dict())
    hints_topic, requests_topic = topic_name("h", "hints"), topic_name("h", "hint-requests")
    sender.publish(hints_topic, seal_message(hostile, swarm_pb2.Hint(task_ref=ref, level=swarm_pb2.Hint.PREFIX,
                                                                     text=task.answer), 1, now))
    other = next(t for i in range(100) for t in node.source.batch(50 + i, 1) if t.prompt_key not in node.hints.states)
    sender.publish(hints_topic, seal_message(honest, swarm_pb2.Hint(
        task_ref=swarm_pb2.TaskRef(**other.ref.to_dict()), level=swarm_pb2.Hint.PREFIX, text="1"), 2, now))
    # another model's prefix, in words: the tiny tokenizer cannot encode it (it once crashed a node)
    sender.publish(hints_topic, seal_message(honest, swarm_pb2.Hint(task_ref=ref, level=swarm_pb2.Hint.PREFIX,
                                                                    text="The first digit is"), 3, now))
    sender.publish(hints_topic, seal_message(honest, swarm_pb2.Hint(task_ref=ref, level=swarm_pb2.Hint.PREFIX,
                                                                    text=task.answer[:2]), 4, now))
    unknown = swarm_pb2.TaskRef(source="reasoning_gym", dataset="leg_counting", config_digest="0" * 16, seed=0, index=1)
    sender.publish(requests_topic, seal_message(honest, swarm_pb2.HintRequest(task_ref=unknown), 5, now))
    node.metrics.append(node.run_round(1))
    status = node.exchange.status()
    assert status["rejected_by_reason"]["hint_leaks_answer"] == 1
    assert status["rejected_by_reason"]["hint_request_unknown_task"] == 1
    assert status["rejected_by_reason"]["untokenizable"] == 1  # words: not in the tiny vocabulary, no blame
    assert node.hints.counters["hints_unsolicited"] == 1 and node.hints.counters["hints_accepted"] == 1
    scores = {p.peer_id: p.score for p in status["peers"]}
    assert scores[hostile.peer_id()] < 0 < scores[honest.peer_id()]
    assert node.hints.current(task) == HintUse("prefix", task.answer[:2])
    node.metrics.append(node.run_round(2))  # and the node trains with the hint it kept


def test_prefix_curriculum_ends_then_a_failing_prompt_starts_over():
    rates = PassRates(decay=1.0)
    book = HintBook(HintConfig(prefix_step=0.5), rates, usable_levels=("prefix",))
    task = COUNT.batch(0, 1)[0]
    book.requests([scored(task, [False] * 4)], 0)
    book.add(task, "prefix", "34")
    ok = [False, True, True, True]
    book.observe(scored(task, ok, HintUse("prefix", "34"), [False, True, True, True]))
    assert book.current(task) == HintUse("prefix", "3")
    book.observe(scored(task, ok, HintUse("prefix", "3"), [False, True, True, True]))
    assert book.current(task) is None and book.counters["prefixes_used_up"] == 1  # on its own now
    rates.observe(task, [False] * 8)
    assert book.requests([scored(task, [False] * 4)], 1) == []  # no request: it still holds the hint
    assert book.current(task) == HintUse("prefix", "34") and book.counters["prompts_reengaged"] == 1


@pytest.mark.slow
def test_smollm2_writes_abstract_levels_that_never_give_the_answer_away(tmp_path):
    """A chat model writes l1-l3 from a correct solution; every level it keeps is answer-free."""
    cfg = load_config("smollm2", None, ["tasks.source=synthetic", "tasks.datasets={add = 1.0}",
                                        "hints.max_hint_tokens=48"])
    node = Node(cfg, tmp_path)
    task = node.source.batch(0, 1)[0]
    solution = f"{task.question[0]} plus {task.question[2]} is {int(task.question[0]) + int(task.question[2])}, " \
               f"and the last digit of that is the answer: <answer>{task.answer}</answer>"
    levels = node.hint_writer.write(task, solution)
    leaked = sum(v for k, v in node.hint_writer.counters.items() if k.startswith("rejected_leak_"))
    assert len(levels) + leaked >= 3  # each abstract level was written, and kept or refused
    assert all(not leaks_answer(text, task.answer) for text in levels.values())
    assert levels.get("prefix") and solution.startswith(levels["prefix"])
    assert set(levels) <= {"l1", "l2", "l3", "prefix"}
