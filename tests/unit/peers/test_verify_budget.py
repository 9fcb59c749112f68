"""Verification time on the training thread has a budget (swarm.verify_budget_s, node/peers/exchange.py):
a stalling scorer from established keys cannot slow the rounds down.

A real tiny Node trains on the in-process bus (inline ingest: every verification is on the training
thread). The tiny tasks are scored by a string comparison, which cannot stall, so the receiver's task
source, as the exchange's verification sees it, scores one answer ("99") slowly, through the
capped-scorer path a reasoning-gym scorer takes (a thread under the verifier's deadline; the scorer
sandbox's worker processes would not see the wrapper)."""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time

import pytest

from node.peers.verify_budget import VerifyBudget
from node.scoring.sandbox import ScorerSandbox
from node.service.assembly import memory_bus_node
from node.train.groups import ScoredGroup
from node.peers.wire import to_wire
from policy.types import Rollout
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox
from tests.support.tiny_node import tiny_cfg

SWARM = "budget"
BUDGET_S = 0.1  # the training thread's verification seconds per round (the test's; tiny defaults to 0.5)
DEADLINE_S = 0.2  # the scorer's deadline: a stalling answer costs this much where nothing cuts it
STALL_S = 0.24  # how long the stalling answer scores: past every deadline (and not long, or the hung scorer
# threads would pile up to MAX_ABANDONED_THREADS, past which every capped score is skipped)
STALL = "99"
PACE_S = 0.4  # rounds paced as swarm.min_round_s paces them (node/train/loop.py run): a tiny round takes ~0.07 s
ROUNDS = 10


def test_the_budget_cuts_each_deadline_to_what_is_left_and_then_defers():
    budget = VerifyBudget(1.0)
    deadlines = []

    def verify(deadline):
        deadlines.append(deadline)
        time.sleep(deadline)  # a scorer that runs to its deadline
        return "refused"

    while budget.run(verify) is not None:
        pass
    assert deadlines[0] == 0.8 and all(d < 0.8 * 0.3 for d in deadlines[1:]), deadlines
    assert 0.9 <= budget.spent <= 1.0 + 0.05 and budget.deferred == 1
    budget.start_round()
    assert budget.spent == 0.0 and budget.run(lambda deadline: deadline) == 0.8


class Stalling:
    """The node's task source as the exchange's verification sees it, scoring STALL for longer than
    any deadline through the capped-scorer path (the node's own rollouts are scored as before)."""

    score_is_bounded = False

    def __init__(self, source):
        self.source = source

    def __getattr__(self, name):
        return getattr(self.source, name)

    def score(self, task, answer):
        if answer == STALL:
            time.sleep(STALL_S)
        return self.source.score(task, answer)


def group_msg(node, index: int, texts: list[str], claims: list[float]) -> swarm_pb2.RolloutGroup:
    task = node.source.batch(7000 + index, 1)[0]
    rollouts = [Rollout(prompt_ids=[], completion_ids=[0], logprobs=[-0.7], text=t, offsets=[(0, len(t))],
                        truncated=True) for t in texts]
    group = ScoredGroup(task=task, rollouts=rollouts, rewards=claims, correct=[c == 1.0 for c in claims])
    return to_wire(group, 0, swarm_pb2.ModelCard(name="tiny"), swarm_pb2.SamplingParams(temperature=1.0,
                                                                                       max_new_tokens=1),
                   node.verifier.digest)


def sender(bus, name):
    transport = MemoryTransport(bus, name)
    transport.start()
    return transport, Outbox(NodeIdentity.generate())


# serial: it holds the training thread's verification to 0.1 s of wall time a round; beside the serial
# pass, at nice 19, a starved round verified for 0.27 s
@pytest.mark.serial
def test_a_stalling_scorer_from_established_keys_stays_within_the_budget_and_the_pace(tmp_path):
    bus = MemoryBus()
    cfg = tiny_cfg(f"swarm.name={SWARM}", f"swarm.verify_budget_s={BUDGET_S}", f"verifier.timeout_s={DEADLINE_S}",
                   f"swarm.min_round_s={PACE_S}",
                   "swarm.admission.young_groups=0", "swarm.admission.young_rounds=0")  # every key established
    node = memory_bus_node(cfg, tmp_path, bus, "receiver")
    exchange = node.exchange
    exchange.verification.context = dataclasses.replace(exchange.context, source=Stalling(node.source), sandbox=None)
    honest, stallers = sender(bus, "honest"), [sender(bus, f"staller-{i}") for i in range(2)]
    index = 0

    def honest_groups():
        nonlocal index
        for _ in range(2):
            index += 1
            task = node.source.batch(7000 + index, 1)[0]
            wrong = str((int(task.answer) + 1) % 10)
            honest[1].publish(honest[0], SWARM, group_msg(node, index, [task.answer, wrong], [1.0, 0.0]))

    def stalling_groups():
        nonlocal index
        for transport, out in stallers:
            for _ in range(6):
                index += 1
                task = node.source.batch(7000 + index, 1)[0]
                out.publish(transport, SWARM, group_msg(node, index, [task.answer, STALL], [1.0, 0.0]))

    def rounds(first: int, stall: bool) -> tuple[list[float], list[dict]]:
        seconds, rows = [], []
        for round_index in range(first, first + ROUNDS):
            honest_groups()
            if stall:
                stalling_groups()
            started = time.perf_counter()
            rows.append(node.run_round(round_index))
            time.sleep(max(0.0, PACE_S - (time.perf_counter() - started)))  # as Node.run waits out min_round_s
            seconds.append(time.perf_counter() - started)
        return seconds[2:], rows  # the first rounds warm up

    calm, _ = rounds(0, stall=False)
    stalled, rows = rounds(ROUNDS, stall=True)
    verify_s = [row.get("t_verify", row["t_exchange_score"]) for row in rows]
    pace = statistics.median(stalled) / statistics.median(calm)
    used = sum(row["external_used"] for row in rows)
    print(f"t_verify max {max(verify_s):.3f} s (budget {BUDGET_S} s); median round {statistics.median(calm):.3f} s "
          f"calm, {statistics.median(stalled):.3f} s stalled: pace x{pace:.2f}; {used} honest groups trained")
    assert exchange.rejected["score_timeout"] > 0  # the stalling groups were met
    # scorer deadlines cut to what is left; the rest is thread scheduling on a loaded 2-core machine (20 ms
    # more seen at load 6); without the budget a stalled round verified for 1.8 s
    assert max(verify_s) <= BUDGET_S * 1.2 + 0.02, verify_s
    assert pace <= 1.10, (calm, stalled)
    assert max(row["keys_benched"] for row in rows) == len(stallers)  # their failed picks cost them their turns
    assert used >= ROUNDS // 2  # the honest sender's groups (2 a round) are still trained


class Unbounded:
    """The node's task source as the exchange's verification sees it, its scores sent through the
    capped-scorer path, hence to the scorer sandbox (whose workers score with the real source)."""

    score_is_bounded = False

    def __init__(self, source):
        self.source = source

    def __getattr__(self, name):
        return getattr(self.source, name)


def test_a_pick_waits_for_a_busy_scorer_sandbox_no_longer_than_the_budget(tmp_path):
    """The ingest worker's verification ahead holds the sandbox (here: a math bomb under a 2 s
    deadline, in a thread of its own): a pick on the training thread waits at most what is left of the
    budget, then leaves the group pooled, unblamed and unbenched; once the sandbox is free it is verified."""
    bus = MemoryBus()
    budget_s = 0.2
    cfg = tiny_cfg(f"swarm.name={SWARM}", f"swarm.verify_budget_s={budget_s}",
                   "swarm.admission.young_groups=0", "swarm.admission.young_rounds=0")
    node = memory_bus_node(cfg, tmp_path, bus, "receiver")
    exchange = node.exchange
    sandbox = ScorerSandbox((cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed), workers=1)
    try:
        task = node.source.batch(0, 1)[0]
        assert sandbox.correctness("math", task, task.answer, 30.0) == 1.0  # its worker is up
        exchange.verification.context = dataclasses.replace(exchange.context, source=Unbounded(node.source),
                                                            sandbox=sandbox)
        transport, out = sender(bus, "honest")
        for index in range(2):
            task = node.source.batch(7000 + index, 1)[0]
            wrong = str((int(task.answer) + 1) % 10)
            out.publish(transport, SWARM, group_msg(node, index, [task.answer, wrong], [1.0, 0.0]))
        bomb = threading.Thread(target=sandbox.correctness, args=("math", task, "9**9**9**9", 2.0))
        bomb.start()
        time.sleep(0.2)  # the bomb holds the sandbox now
        busy = node.run_round(0)
        bomb.join()
        assert sandbox.correctness("math", task, task.answer, 30.0) == 1.0  # the bomb's worker is replaced and up
        free = node.run_round(1)
    finally:
        sandbox.close()
    print(f"busy sandbox: t_verify {busy['t_verify']:.3f} s (budget {budget_s} s), used {busy['external_used']}; "
          f"free: used {free['external_used']}")
    assert busy["t_verify"] <= budget_s * 1.2 + 0.02 and busy["external_used"] == 0  # 2.6 s without the wait bound
    assert exchange.observed["verify_sandbox_busy"] >= 1 and not exchange.rejected  # nobody blamed
    assert busy["keys_benched"] == 0
    assert free["external_used"] >= 1  # verified once the sandbox was free: it stayed pooled
