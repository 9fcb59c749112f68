"""Held-out evaluation (node/train/eval.py): refs never trained on, metrics on the evaluated rounds only,
exact resume untouched, a trained policy scores higher, and `swarm-node eval`."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import main
from node.config.schema import load_config
from node.train.loop import Node
from node.observe.metrics import COLUMNS, RoundTable, _cell, read_metrics
from node.observe.report import write_report
from node.tasks import make_source
from node.tasks.base import TaskRef, heldout_seed

from tests.support.processes import repo_env
from tests.support.tiny_node import run_node, tiny_cfg

ROOT = Path(__file__).resolve().parents[3]
HELDOUT_KEYS = ("heldout_pass1", "heldout_passk", "heldout_k", "heldout_by_family", "t_eval")



def _training_refs(source, rounds, per_round):
    return {t.ref for r in range(rounds) for t in source.batch(r, per_round)}


@pytest.mark.parametrize("preset", ["tiny", "smollm2"])
def test_heldout_refs_are_never_drawn_for_training_and_are_deterministic(preset):
    cfg = load_config(preset)
    source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed)
    heldout = source.heldout(cfg.eval.tasks_per_family)
    trained = _training_refs(source, 200, cfg.tasks.prompts_per_round)
    assert not {t.ref for t in heldout} & trained
    assert len(heldout) == cfg.eval.tasks_per_family * len(cfg.tasks.datasets)
    assert {t.ref.seed for t in heldout} == {heldout_seed(cfg.tasks.seed)} != {cfg.tasks.seed}
    # deterministic, and rebuildable from the refs alone by a fresh source (a peer)
    again = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed)
    assert [(t.ref, t.question, t.answer) for t in again.heldout(cfg.eval.tasks_per_family)] == \
        [(t.ref, t.question, t.answer) for t in heldout]
    for task in heldout[:: max(1, len(heldout) // 6)]:
        rebuilt = again.rebuild(TaskRef.from_dict(json.loads(json.dumps(task.ref.to_dict()))))
        assert (rebuilt.question, rebuilt.answer) == (task.question, task.answer)
    # the OOD families build offline and are not in the training mixture
    ood = make_source(cfg.tasks.source, cfg.eval.ood, cfg.tasks.seed).heldout(2)
    assert ood and not {t.ref.dataset for t in ood} & set(cfg.tasks.datasets)
    with pytest.raises(ValueError, match="training never draws with"):
        source.heldout(4, cfg.tasks.seed)


def test_eval_config_presets_and_ood_replaces_wholesale(tmp_path):
    assert (load_config("tiny").eval.every, load_config("smollm2").eval.every, load_config().eval.every) == (50, 20, 0)
    assert load_config("tiny").eval.ood == {"add": 1.0}
    toml = tmp_path / "eval.toml"
    toml.write_text("[eval]\nood = { succ = 1.0 }\nk = 2\n")
    cfg = load_config("tiny", toml)
    assert cfg.eval.ood == {"succ": 1.0} and cfg.eval.k == 2 and cfg.eval.tasks_per_family == 16


def test_heldout_skips_weight_zero_datasets_and_caps_small_datasets():
    source = make_source("synthetic", {"copy": 1.0, "add": 0.0}, 3)
    assert {t.ref.dataset for t in source.heldout(5)} == {"copy"}
    assert [t.ref.index for t in source.heldout(5)] == list(range(5))
    assert source.heldout(0) == []


def test_eval_keys_appear_exactly_on_evaluated_rounds_and_in_table_and_report(tmp_path):
    rows = run_node(tiny_cfg("eval.every=3", "eval.tasks_per_family=8", "eval.k=3"), tmp_path, 7)
    evaluated = [r["round"] for r in rows if "heldout_pass1" in r]
    assert evaluated == [2, 5]
    for row in rows:
        assert all((key in row) == (row["round"] in evaluated) for key in HELDOUT_KEYS), row["round"]
        cells = {header: _cell(row, key, fmt) for header, key, fmt in COLUMNS}
        assert (cells["held-out"] == "-") == (row["round"] not in evaluated)
    for row in (r for r in rows if r["round"] in evaluated):
        assert row["heldout_k"] == 3 and row["t_eval"] >= 0
        assert sorted(row["heldout_by_family"]) == ["copy", "max", "ood:add", "succ"]
        for family in row["heldout_by_family"].values():
            assert 0 <= family["pass1"] <= 1 and 0 <= family["passk"] <= 1 and family["tasks"] == 8
        inside = [v["pass1"] for f, v in row["heldout_by_family"].items() if not f.startswith("ood:")]
        assert row["heldout_pass1"] == pytest.approx(sum(inside) / len(inside))
        assert 0 <= row["heldout_passk"] <= 1
    png, _, text = write_report(tmp_path)
    assert png.stat().st_size > 10_000
    assert "held-out (last evaluation, round 5): pass@1" in text and "ood:add" in text


def test_no_eval_keys_when_off_and_report_without_them(tmp_path):
    rows = run_node(tiny_cfg("eval.every=0"), tmp_path, 2)
    assert not any(key in row for row in rows for key in HELDOUT_KEYS)
    assert "held-out" not in write_report(tmp_path)[2]


def test_resume_with_eval_is_exact_and_eval_does_not_perturb_training(tmp_path):
    """6 rounds straight vs 3 + resume + 3, evaluating every 2 rounds: identical training and
    identical evaluations; and training is identical to a run that never evaluates."""
    cfg = tiny_cfg("run.checkpoint_every=3", "optim.epochs=2", "eval.every=2", "eval.tasks_per_family=8")
    straight = run_node(cfg, tmp_path / "a", 6)
    run_node(cfg, tmp_path / "b", 3)
    resumed = run_node(cfg, tmp_path / "b", 6, resume=True)
    silent = run_node(tiny_cfg("run.checkpoint_every=3", "optim.epochs=2", "eval.every=0"), tmp_path / "c", 6)
    assert [r["round"] for r in resumed if "heldout_pass1" in r] == [1, 3, 5]
    for a, b, c in zip(straight, resumed, silent, strict=True):
        for other in (b, c):
            assert a["tasks_digest"] == other["tasks_digest"]
            assert a["reward_mean"] == other["reward_mean"]
            assert a["loss"] == pytest.approx(other["loss"], abs=1e-6)
            assert a["policy_version"] == other["policy_version"]
        assert a.get("heldout_by_family") == b.get("heldout_by_family")
        assert a.get("heldout_pass1") == b.get("heldout_pass1")
    assert resumed[-1]["policy_version"] == 12


def test_a_trained_policy_scores_higher_on_heldout_copy(tmp_path):
    cfg = tiny_cfg("tasks.datasets={ copy = 1.0 }", "optim.lr=3e-3", "eval.every=0")
    untrained = Node(cfg, tmp_path / "untrained").evaluate()
    trained_node = Node(cfg, tmp_path / "trained")
    trained_node.run(40, RoundTable("test", quiet=True))
    trained = trained_node.evaluate()
    assert trained["heldout_by_family"]["copy"]["pass1"] >= untrained["heldout_by_family"]["copy"]["pass1"] + 0.5
    assert trained["heldout_pass1"] >= 0.9
    assert trained["heldout_passk"] >= untrained["heldout_passk"]
    # the evaluation is a pure function of the weights: asking again gives the same numbers
    assert trained_node.evaluate()["heldout_by_family"] == trained["heldout_by_family"]
    # distinct_successes: the round's correct completions, each distinct one once (copy has one right answer a task)
    rows = read_metrics(tmp_path / "trained")
    correct = [round(r["correct_per_rollout"] * r["rollouts_generated"]) for r in rows]
    assert all(0 <= r["distinct_successes"] <= min(c, r["groups_local"]) for r, c in zip(rows, correct))
    assert sum(r["distinct_successes"] for r in rows[-10:]) > 0


def test_cli_eval_prints_the_table_and_writes_json(tmp_path, capsys):
    run_node(tiny_cfg("run.checkpoint_every=2"), tmp_path, 3)
    before = (tmp_path / "metrics.jsonl").read_text()
    assert main(["eval", str(tmp_path), "--tasks", "5", "--k", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("family", "pass@1", "pass@2", "tasks", "copy", "ood:add", "all (in-distribution)"):
        assert text in out, text
    result = json.loads((tmp_path / "eval-round-000002.json").read_text())
    assert result["round"] == 2 and result["heldout_k"] == 2 and result["tasks_per_family"] == 5
    assert result["policy_version"] == 3
    assert {v["tasks"] for v in result["heldout_by_family"].values()} == {5}
    assert 0 <= result["heldout_pass1"] <= 1
    assert (tmp_path / "metrics.jsonl").read_text() == before  # evaluating a run leaves it as it was


def test_cli_eval_without_checkpoint_exits_2_without_traceback(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    env = repo_env()
    proc = subprocess.run([sys.executable, "-m", "node.cli", "eval", str(tmp_path)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no checkpoint" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_eval_reads_a_run_saved_with_the_old_flat_swarm_keys(tmp_path, capsys):
    """A checkpoint written before swarm's sections (swarm.pool_max_age_rounds, swarm.ingest as a
    string) still evaluates: saved configs are migrated, only user input is refused."""
    run_node(tiny_cfg("run.checkpoint_every=2"), tmp_path, 3)
    for config_file in (tmp_path / "checkpoints").glob("round-*/config.json"):
        data = json.loads(config_file.read_text())
        swarm = data["swarm"]
        swarm["pool_max_age_rounds"] = swarm.pop("pool")["max_age_rounds"]
        swarm["ingest"] = swarm["ingest"]["mode"]
        config_file.write_text(json.dumps(data))
    assert main(["eval", str(tmp_path), "--tasks", "2", "--k", "1"]) == 0
    assert "pass@1" in capsys.readouterr().out


def test_pass_at_k_is_the_unbiased_estimator():
    from node.train.eval import mean_pass_at, pass_at_k

    # 1 - C(n-c, k) / C(n, k): n=10, c=3, k=5 -> 1 - 21/252; n=32, c=1, k=8 -> 8/32 (one success in a draw of 8)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(32, 1, 8) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 from samples: the success rate
    assert (pass_at_k(4, 0, 4), pass_at_k(4, 1, 4), pass_at_k(8, 5, 4)) == (0.0, 1.0, 1.0)  # n == k: any of k
    assert mean_pass_at([0, 2, 4], 4, 2) == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)
    with pytest.raises(ValueError, match="needs at least 8 samples"):
        pass_at_k(4, 1, 8)


def test_eval_pass_at_estimates_each_k_from_one_set_of_samples(tmp_path):
    cfg = tiny_cfg("eval.every=0", "eval.k=2", "eval.pass_at=[1, 2, 8]", "eval.tasks_per_family=4")
    node = Node(cfg, tmp_path / "node")
    plain = node.evaluate(pass_at=[])
    assert "heldout_pass_at" not in plain  # off: the samples and figures of before (k samples a task)
    result = node.evaluate()
    at = result["heldout_pass_at"]
    assert set(at) == {"1", "2", "8"} and result["heldout_k"] == 2
    assert at["1"] <= at["2"] <= at["8"]  # more tries never pass fewer tasks
    assert result["heldout_passk"] == pytest.approx(at["2"])  # pass@k is the same estimator at k
    for family in result["heldout_by_family"].values():
        assert set(family["pass_at"]) == {"1", "2", "8"}
    with pytest.raises(ValueError, match="must be >= 1"):
        node.evaluate(pass_at=[0])
