"""Scorer bombs (issue 9 (f)): untrusted text is scored in killable worker processes under a
deadline, after a cheap pre-filter; the node keeps training and `status` keeps answering."""
from __future__ import annotations

import os
import threading
import time

import pytest

import node.scoring.verifiers
from node.scoring.answer_filter import bomb_reason
from node.scoring.sandbox import SandboxBusy, ScorerSandbox
from node.service.assembly import memory_bus_node
from node.tasks import make_source
from node.scoring.verifiers import Verifier
from protocol import MemoryBus, MemoryTransport, topic_name
from protocol.testing import seal_message
from tests.unit.peers.test_exchange import honest_group
from tests.support.waiting import wait_until

DEADLINE_S = 1.0
SLACK_S = 0.5  # kill + reap + respawn start, on a loaded 2-core machine


@pytest.mark.parametrize("answer", ["9**9**9**9", "9^9^9^9", "2^{3^{4}}", "9**(9**9)", "(9**9)**(9**9)",
                                    "10**1000000", "99999!", "(" * 40 + "1" + ")" * 40, "+".join("1" * 100),
                                    "1" * 400])
def test_prefilter_refuses_obvious_bombs(answer):
    assert bomb_reason(answer) is not None


@pytest.mark.parametrize("answer", ["42", "-3/4", "\\frac{1}{2}", "x^2 + 2x + 1", "2^{10}", "8*21 + 35 + 87",
                                    "(3+4)*5", "3.14159", "\\sqrt{2}", "x**2 - y**2", "3, 7", "120!"])
def test_prefilter_passes_honest_answers(answer):
    assert bomb_reason(answer) is None


def ticking(stop: threading.Event, ticks: list) -> threading.Thread:
    """A thread that counts while the caller waits: it stops counting if the process freezes."""
    def run():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_hung_math_scorer_is_killed_at_its_deadline_and_replaced():
    source = make_source("synthetic", {"succ": 1.0}, 0)
    task = source.batch(0, 1)[0]
    sandbox = ScorerSandbox(None, workers=2)
    try:
        assert sandbox.correctness("math", task, task.answer, 30.0) == 1.0  # waits for the first import
        pids = set(sandbox.pids())
        stop, ticks = threading.Event(), []
        ticker = ticking(stop, ticks)
        started = time.monotonic()
        # straight to the sandbox, past the pre-filter: math-verify evaluates this in one C call
        assert sandbox.correctness("math", task, "9**9**9**9", DEADLINE_S) is None
        elapsed = time.monotonic() - started
        stop.set()
        ticker.join()
        print(f"\nmath bomb rejected after {elapsed:.3f} s (deadline {DEADLINE_S} s)")
        assert elapsed < DEADLINE_S + SLACK_S
        assert len(ticks) >= 0.25 * DEADLINE_S / 0.01  # the process never froze meanwhile (a tick per 10 ms)
        assert sandbox.snapshot()["killed"] == 1 and len(set(sandbox.pids()) - pids) == 1  # respawned
        assert sandbox.correctness("math", task, task.answer, 30.0) == 1.0  # and scoring goes on
    finally:
        sandbox.close()


def test_a_caller_that_may_not_wait_is_told_the_sandbox_is_busy():
    """While a bomb holds the sandbox for its deadline, a caller with wait_s (the training thread's
    verification budget) gets SandboxBusy within it, nothing scored, instead of waiting the deadline out."""
    source = make_source("synthetic", {"succ": 1.0}, 0)
    task = source.batch(0, 1)[0]
    sandbox = ScorerSandbox(None, workers=2)
    try:
        assert sandbox.correctness("math", task, task.answer, 30.0) == 1.0  # the workers are up
        bomb = threading.Thread(target=sandbox.correctness, args=("math", task, "9**9**9**9", DEADLINE_S))
        bomb.start()
        time.sleep(0.1)  # the bomb's call holds the sandbox now
        started = time.monotonic()
        with pytest.raises(SandboxBusy, match="busy"):
            sandbox.correctness_many("math", task, [task.answer], 30.0, wait_s=0.05)
        waited = time.monotonic() - started
        bomb.join()
        assert waited < 0.05 + SLACK_S and waited < DEADLINE_S / 2
        assert sandbox.snapshot()["busy"] == 1
        assert sandbox.correctness_many("math", task, [task.answer], 30.0, wait_s=5.0) == [1.0]  # free again
    finally:
        sandbox.close()


@pytest.mark.slow
@pytest.mark.serial
def test_a_countdown_answer_that_hangs_sympy_is_rejected_within_the_deadline():
    spec = ("reasoning_gym", {"countdown": 1.0}, 0)
    source = make_source(*spec)
    task = source.batch(0, 1)[0]
    verifier = Verifier(fmt="raw", timeout_s=DEADLINE_S)
    sandbox = ScorerSandbox(spec, workers=2)
    try:
        sandbox.start()
        assert verifier.score(task, source, task.answer, sandbox)[0] == 1.0  # honest: same reward as in-process
        assert verifier.score(task, source, task.answer)[0] == 1.0
        started = time.monotonic()
        reward, info = verifier.score(task, source, "factorial(99999999)", sandbox)  # passes the pre-filter
        elapsed = time.monotonic() - started
        print(f"\ncountdown bomb rejected after {elapsed:.3f} s (deadline {DEADLINE_S} s)")
        assert info["timed_out"] and reward == 0.0 and elapsed < DEADLINE_S + SLACK_S
        refused = verifier.score(task, source, "9**9**9**9", sandbox)[1]
        assert refused["refused"] == "power_tower" and not refused["timed_out"]
        assert sandbox.snapshot()["killed"] == 1
    finally:
        sandbox.close()
    assert sandbox.pids_seen and not any(pid_alive(pid) for pid in sandbox.pids_seen)  # none outlives close


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is not alive
        return fh.read().split()[2] != "Z"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("prefilter", [True, False], ids=["prefilter", "sandbox_only"])
def test_node_rejects_math_bombs_keeps_training_and_answers_status(tmp_path, monkeypatch, prefilter, tiny_config,
                                                                   identity):
    if not prefilter:  # the last defence on its own: every bomb reaches a worker and is killed
        monkeypatch.setattr(node.scoring.verifiers, "bomb_reason", lambda answer: None)
        monkeypatch.setattr(node.scoring.verifiers, "plain_number_answer_ok", lambda answer, gold: True)
    swarm = "bomb"
    cfg = tiny_config(f"swarm.name={swarm}", "verifier.scorer=math", f"verifier.timeout_s={DEADLINE_S}")
    receiver = memory_bus_node(cfg, tmp_path, MemoryBus(), "receiver", ingest="background")
    exchange = receiver.exchange
    bus = exchange.transport.bus
    peer = MemoryTransport(bus, "attacker")
    peer.start()
    key, now_ms = identity(), int(time.time() * 1000)
    topic = topic_name(swarm, "rollouts")
    peer.publish(topic, seal_message(key, honest_group(receiver, 0), 1, now_ms))
    # the first math score starts the workers: importing math-verify on a loaded machine
    wait_until(lambda: len(exchange.pool), "the first group scored", 90)
    assert len(exchange.pool) == 1, exchange.status()
    bombs = 3
    reason = "score_refused" if prefilter else "score_timeout"
    answered, started = [], time.monotonic()

    def rejected() -> int:
        return exchange.status()["rejected_by_reason"].get(reason, 0)

    def poll_status():  # one bomb at a time (a backlog older than the pool's age limit is dropped unscored)
        published = 0
        while rejected() < bombs and time.monotonic() - started < 30:
            if published == rejected() < bombs:
                bomb = honest_group(receiver, 10 + published)
                bomb.completions[1].text = "9**9**9**9"  # a wrong answer: claimed 0, as an honest scorer says
                # a key of its own each: a key whose pick failed sits out a few rounds (node/peers/bench.py)
                peer.publish(topic, seal_message(identity(), bomb, 1, now_ms))
                published += 1
            asked = time.monotonic()
            exchange.status()
            answered.append(time.monotonic() - asked)
            time.sleep(0.02)

    poller = threading.Thread(target=poll_status, daemon=True)
    poller.start()
    rounds = 0
    while poller.is_alive() and rounds < 400:
        receiver.run_one(10_000)
        rounds += 1
    poller.join(5)
    elapsed = time.monotonic() - started
    after = [receiver.run_one(10_000)["round"] for _ in range(3)]  # and rounds go on afterwards
    status = exchange.status()
    exchange.close()
    print(f"\n{bombs} math bombs ({reason}) rejected within {elapsed:.2f} s while {rounds} rounds ran; "
          f"status answered {len(answered)} times, slowest {max(answered) * 1e3:.1f} ms; "
          f"sandbox {status['ingest'].get('scorer_sandbox')}")
    assert status["rejected_by_reason"].get(reason, 0) == bombs
    assert rounds >= 1 and after == [rounds + i for i in range(3)] and max(answered) < 0.5
    if not prefilter:
        assert status["ingest"]["scorer_sandbox"]["killed"] == bombs
        assert elapsed < bombs * (DEADLINE_S + SLACK_S) + 5.0  # each within its deadline (+ respawn overlap)
