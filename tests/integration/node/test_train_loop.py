"""End to end on the tiny preset: the real round loop, real checkpoints, real subprocesses."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from node.train.hints import HintState
from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics
from node.observe.report import write_report
from policy.generation import StaleWeightsError

from tests.support.tiny_node import run_node, tiny_cfg
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "node.cli"]



def test_round_metrics_have_the_documented_fields(tmp_path):
    rows = run_node(tiny_cfg("run.rounds=3"), tmp_path, 3)
    assert [r["round"] for r in rows] == [0, 1, 2]
    for key in ("reward_mean", "pass_rate", "loss", "tokens_per_s", "t_generate", "t_score", "t_train",
                "groups_trained", "tasks_digest", "pass_rate_by_dataset", "entropy_mean", "distinct_completions",
                "flat_group_share"):
        assert key in rows[0], key
    for row in rows:
        assert 0.0 < row["entropy_mean"] <= 2.7726  # the tiny model's vocabulary has 16 tokens: at most log 16
        # distinct per group is at most the group's size, so their mean at most the mean size
        assert 1.0 <= row["distinct_completions"] <= row["rollouts_generated"] / row["groups_local"]
        assert 0.0 <= row["flat_group_share"] <= 1.0
    assert (tmp_path / "checkpoints" / "LATEST").read_text().strip() == "round-000002"
    png, txt, text = write_report(tmp_path)
    assert png.stat().st_size > 10_000 and "reward: first 10 rounds" in text
    assert "sampling (last 10 rounds): entropy " in text and " nats/token, distinct completions/group " in text


def test_resume_in_process_is_exact(tmp_path):
    """Run 6 rounds straight vs 3 + resume + 3: identical tasks, rewards and losses."""
    cfg = tiny_cfg("run.checkpoint_every=3", "optim.epochs=2")
    straight = run_node(cfg, tmp_path / "a", 6)
    run_node(cfg, tmp_path / "b", 3)
    resumed = run_node(cfg, tmp_path / "b", 6, resume=True)
    for a, b in zip(straight, resumed, strict=True):
        assert a["tasks_digest"] == b["tasks_digest"]
        assert a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["policy_version"] == b["policy_version"]  # optimizer steps, kept in the checkpoint
    assert resumed[-1]["policy_version"] == 12  # 6 rounds x 2 epochs x 1 minibatch


def test_rollouts_from_unrefreshed_weights_are_refused(tmp_path):
    """Each rollout carries the policy version that sampled it; a generator that was refreshed to
    another version than the learner's (a missed or extra refresh) stops the round loudly."""
    node = Node(tiny_cfg(), tmp_path)
    node.run_one(2)
    assert node.generator.policy_version == node.learner.policy_version > 0
    node.generator.refresh(node.learner.policy_version + 1)
    with pytest.raises(StaleWeightsError, match=r"generator sampled with policy v\[\d+\] but the learner is at v\d+"):
        node.run_one(2)


def test_checkpoint_keeps_pass_rates_and_hint_state(tmp_path):
    cfg = tiny_cfg("run.checkpoint_every=2")
    node = Node(cfg, tmp_path)
    node.run(2, RoundTable("test", quiet=True))
    task = node.source.batch(0, 1)[0]
    node.hints.states[task.prompt_key] = HintState(ref=task.ref.to_dict())  # as if we had asked for hints
    node.hints.add(task, "prefix", "7")
    node.checkpoint(1)
    again = Node(cfg, tmp_path)
    assert again.resume() == 1
    assert again.learner.policy_version == node.learner.policy_version == 2
    assert again.pass_rates.state_dict() == node.pass_rates.state_dict() and again.pass_rates.by_prompt
    assert again.hints.current(task) == node.hints.current(task) is not None


def test_dars_gives_low_accuracy_prompts_more_rollouts(tmp_path):
    from node.train.allocation import dars_extra_rollouts

    node = Node(tiny_cfg("allocation.scheme=equal", "allocation.max_rollouts=24"), tmp_path)
    tasks = node.source.batch(0, 16)
    groups, stats = node.sampler.sample(tasks, [None] * 16, 0)
    extras = [len(g.rollouts) - 8 for g in groups]
    assert stats["dars_extra_rollouts"] == sum(extras) > 0  # an untrained model fails most prompts
    for g, extra in zip(groups, extras):
        base = g.correct[:8]
        assert extra == dars_extra_rollouts(sum(base) / 8, 8, 24, "equal", std_normalized=True)
        assert len(g.rewards) == len(g.correct) == len(g.rollouts)
    row = node.run_round(0)
    assert row["rollouts_generated"] > 16 * 8 and row["dars_extra_rollouts"] > 0


def _wait_for_round(run_dir: Path, round_index: int, proc, timeout=120.0):
    def reached() -> bool:
        rows = read_metrics(run_dir)
        return bool(rows) and rows[-1]["round"] >= round_index

    wait_until(reached, f"the trainer to reach round {round_index}", timeout, procs=[proc])


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_continues_exactly(tmp_path):
    args = ["train", "--preset", "tiny", "--rounds", "40", "--quiet", "--set", "run.checkpoint_every=5",
            "--set", "run.threads=1"]
    env = repo_env()
    reference = tmp_path / "reference"
    subprocess.run(CLI + args + ["--run-dir", str(reference)], check=True, env=env, cwd=ROOT, timeout=300)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(CLI + args + ["--run-dir", str(killed)], env=env, cwd=ROOT)
    try:
        _wait_for_round(killed, 17, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    last_ckpt = (killed / "checkpoints" / "LATEST").read_text().strip()
    assert last_ckpt in {"round-000014", "round-000019"}  # whichever was complete at the kill

    subprocess.run(CLI + args + ["--run-dir", str(killed), "--resume"], check=True, env=env, cwd=ROOT, timeout=300)
    ref_rows, resumed_rows = read_metrics(reference), read_metrics(killed)
    assert [r["round"] for r in resumed_rows] == list(range(40))  # no duplicate or missing rounds
    for a, b in zip(ref_rows, resumed_rows, strict=True):
        assert a["tasks_digest"] == b["tasks_digest"], a["round"]
        assert a["reward_mean"] == b["reward_mean"], a["round"]


def test_cli_refuses_to_overwrite_a_run_and_names_bad_config(tmp_path):
    env = repo_env()
    bad = subprocess.run(CLI + ["train", "--set", "optim.learning_rate=1", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "valid keys" in bad.stderr
    bad = subprocess.run(CLI + ["train", "--set", 'tasks.datasets={ nope = 1.0 }', "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "nope" in bad.stderr and "copy" in bad.stderr
    bad = subprocess.run(CLI + ["train", "--set", "loss.name=grpoo", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "unknown objective 'grpoo'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any model was built


def test_a_node_killed_before_its_first_checkpoint_starts_its_metrics_over(tmp_path):
    run_node(tiny_cfg("run.checkpoint_every=50"), tmp_path, 3)  # 3 rounds: no checkpoint before round 49...
    (tmp_path / "checkpoints" / "LATEST").unlink()  # ...as after a SIGKILL at round 3 (the final one is gone)
    rows = run_node(tiny_cfg("run.checkpoint_every=50"), tmp_path, 5, resume=True)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]  # no round logged twice


def test_both_exchanges_implement_the_loops_exchange_protocol(identity):
    """node/train/loop.py Exchange declares everything the loop calls, optional capabilities
    included (state_dict, last_round): the swarm's exchange and the self-replay silo both implement
    all of it, with the protocol's parameter names, and the loop asks neither what it can do."""
    import inspect

    from node.config.schema import load_config
    from node.peers.exchange import SwarmExchange
    from node.peers.exchange_options import ExchangeOptions
    from node.peers.self_replay import SelfReplay
    from node.peers.verify import VerifyContext
    from node.scoring.verifiers import Verifier
    from node.tasks import make_source
    from node.train.loop import Exchange
    from protocol import MemoryBus, MemoryTransport

    cfg = load_config("tiny")
    source = make_source("synthetic", {"copy": 1.0}, 0)
    context = VerifyContext(source, Verifier(), retokenizer=None, max_completion_tokens=4, max_group_tokens=64)
    swarm = SwarmExchange(MemoryTransport(MemoryBus(), "a"), identity(), context, ExchangeOptions())
    silo = SelfReplay(cfg.swarm)
    methods = [name for name, member in vars(Exchange).items() if callable(member) and not name.startswith("_")]
    assert {"share", "collect", "state_dict", "status", "close", "take_hint_requests"} <= set(methods)
    for exchange in (swarm, silo):
        assert isinstance(exchange, Exchange), type(exchange).__name__
        assert exchange.last_round == {}
        for name in methods:
            wanted = list(inspect.signature(getattr(Exchange, name)).parameters)[1:]
            assert list(inspect.signature(getattr(exchange, name)).parameters) == wanted, (type(exchange), name)
    assert isinstance(swarm.state_dict(), dict) and silo.state_dict() is None
    assert len(inspect.signature(SwarmExchange.__init__).parameters) - 1 <= 8  # self aside
    source_text = (ROOT / "node" / "train" / "loop.py").read_text()
    assert "getattr(self.exchange" not in source_text
    swarm.close()
    with pytest.raises(TypeError, match="is not an Exchange"):
        Node(tiny_cfg(), Path("unused"), exchange=object())
