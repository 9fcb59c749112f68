"""Smoke runs of the experiment scripts (seconds each): they run end to end and write JSON + PNG.
The full tables come from running the scripts themselves (see their docstrings)."""
from __future__ import annotations

import json
import subprocess
import sys
from statistics import mean
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run_script(module: str, stem: str, out: Path, *extra: str) -> dict:
    """`python -m <module> --quick --out <out>` from the repository root; its <stem>.json (with <stem>.png beside)."""
    proc = subprocess.run([sys.executable, "-m", module, "--quick", "--out", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / f"{stem}.png").stat().st_size > 10_000
    return json.loads((out / f"{stem}.json").read_text())


def test_exp_hints_quick(tmp_path):
    result = run_script("scripts.experiments.hints", "exp_hints", tmp_path)
    runs = {r["condition"]: r for r in result["runs"]}
    assert runs["hints_on"]["strong_greedy_pass_after_warm_start"] > 0.5  # the warm start took
    assert runs["hints_on"]["hints_accepted"] > 0 and runs["hints_on"]["hinted_groups"] > 0
    assert runs["hints_off"]["hinted_groups"] == 0 and runs["hints_off"]["hint_counters"] == {}
    assert all(len(r["rows"]) == result["rounds"] for r in result["runs"])


def test_exp_offpolicy_quick(tmp_path):
    result = run_script("scripts.experiments.offpolicy", "exp_offpolicy", tmp_path)
    runs = {(r["source"], r["correction"]): r for r in result["runs"]}
    assert set(runs) == {("stale4", "default"), ("stale4", "minpro"), ("other", "default"), ("other", "minpro")}
    for (source, correction), run in runs.items():
        used = sum(r["external_used"] for r in run["rows"])
        assert used > 0, (source, correction)  # peer groups went through the wire path and were trained
        if correction == "default":  # ratio 1: every peer sample is tier 2
            assert all(not r["ext_t0_samples"] for r in run["rows"])
        else:  # same tokenizer: tier 0 with real behavior ratios
            assert sum(r["ext_t0_samples"] or 0 for r in run["rows"]) > 0 and run["ratio_mean"] != 1.0
    stale = runs[("stale4", "minpro")]["rows"]
    assert max(max(r["external_staleness_rounds"] or [0]) for r in stale) == 0  # pool keeps only fresh groups


def test_exp_hostile_quick(tmp_path):
    result = run_script("scripts.experiments.hostile", "exp_hostile", tmp_path)
    runs = {r["kind"]: r for r in result["runs"]}
    assert set(runs) == {"none", "liar", "sybil"}
    assert all(r["invalid_used"] == 0 for r in runs.values())  # nothing invalid ever trained
    assert runs["liar"]["rejected"].get("wrong_reward", 0) > 0 and runs["none"]["relative_reward"] == 1.0
    assert runs["sybil"]["hostile_used"] > 0  # sybil groups are valid: they can be trained (issue: identities)
    resumed = run_script("scripts.experiments.hostile", "exp_hostile", tmp_path, "--resume")  # every kind kept
    assert [r["seconds"] for r in resumed["runs"]] == [r["seconds"] for r in result["runs"]]


def test_exp_peer_influence_quick(tmp_path):
    result = run_script("scripts.experiments.peer_influence", "exp_peer_influence", tmp_path)
    for row in result["weights"]:  # a liar's tokens weigh no more than the ratio-1 treatment's
        for liar in ("liar_low", "liar_under"):
            assert row[liar]["peer_weight_mean"] <= row["tier2"]["peer_weight_mean"] + 1e-4, row
            assert row[liar]["grad_norm"] <= row["tier2"]["grad_norm"] * 1.001, row
    sizes = result["group_sizes"]  # eight copies of a group weigh what the group weighs
    assert sizes["copies_64"]["peer_grad_share"] == pytest.approx(sizes["eight_of_8"]["peer_grad_share"], rel=1e-3)


def test_exp_peer_failures_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))  # its 20-step warm model stays out of ~/.cache
    result = run_script("scripts.experiments.peer_failures", "exp_peer_failures", tmp_path)
    by = {r["condition"]: r for r in result["results"]}
    assert set(by) == {"silo8", "own4+own4", "peer4-minpro", "peer4-train", "peer4-drop"}
    assert by["silo8"]["peer_weight_mean"] is None and by["own4+own4"]["peer_weight_mean"] is None
    assert by["peer4-train"]["peer_weight_mean"] == pytest.approx(1.0)  # ratio 1: full weight
    assert by["peer4-minpro"]["peer_weight_mean"] < 1.0  # weighted to the sender's policy
    assert all(len(r["pass_rate_by_window"]) == 1 for r in result["results"])
    assert len(list((tmp_path / "cache").glob("tiny-warm-*/warm_start.json"))) == 1  # one warm model, built once


def test_exp_precision_quick(tmp_path):
    result = run_script("scripts.experiments.precision", "exp_precision", tmp_path)
    summary = result["summary"]["arms"]
    assert {arm: s["objective"] for arm, s in summary.items()} == {
        "fp32": "grpo", "int8_tis": "tis(grpo)", "int8_uncorrected": "grpo"}
    assert set(result["summary"]["within_one_std_of_fp32"]) == {"int8_tis", "int8_uncorrected"}
    assert summary["fp32"]["mean_sampler_logp_diff"] < 1e-5 < summary["int8_tis"]["mean_sampler_logp_diff"]
    assert summary["int8_tis"]["mean_tis_weight_ess"] > 0 and summary["int8_uncorrected"]["mean_tis_weight_ess"] is None
    assert all(len(r["rows"]) == result["rounds"] and 0 <= r["final_pass1"] <= 1 for r in result["runs"])


def test_exp_skeptic_quick(tmp_path, monkeypatch):
    """Every stage end to end: budget, tuning on training reward, every arm on paired seeds, the
    comparisons with CIs, the confirmation on a fresh seed; a second run reuses every saved run."""
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    result = run_script("scripts.experiments.skeptic", "exp_skeptic", tmp_path)
    tuning = result["tuning"]
    assert result["best_silo"] == max(tuning, key=lambda name: tuning[name]["mean_train_reward"])
    arms = result["final"]["arms"]
    assert set(arms) == {"silo-best", "silo", "swarm", "self-replay", "positive-only", "frozen-peers",
                         "entropy-silo", "join-old", "sapo", "swarm-positive"}
    assert all(len(row["heldout"]["by_seed"]) == 2 for row in arms.values())  # both paired seeds
    assert all(row["charged_over_wall"]["mean"] > 0 for row in arms.values())
    assert arms["entropy-silo"]["distinct_completions"]["mean"] > arms["silo"]["distinct_completions"]["mean"]
    # pass@8 and pass@32 at the budget (32 samples a task), distinct successes per virtual second
    assert all(row["pass32"]["mean"] >= row["pass8"]["mean"] >= 0 for row in arms.values())
    assert all(row["successes_per_s"]["mean"] >= 0 for row in arms.values())  # 5 warm-up steps: few or none
    assert set(result["final"]["vs_best_silo"]["pass8"]) == set(arms) - {"silo-best"}
    versus = result["final"]["vs_best_silo"]["heldout"]
    assert set(versus) == set(arms) - {"silo-best"} and all(len(c["diffs"]) == 2 for c in versus.values())
    swarm = arms["swarm"]["heldout"]["by_seed"]
    frozen = result["final"]["swarm_vs"]["heldout"]["frozen-peers"]
    assert frozen["diffs"] == pytest.approx([s - f for s, f in zip(swarm, arms["frozen-peers"]["heldout"]["by_seed"])])
    confirm = result["confirm"]
    positive = confirm["positive_tuning"]
    assert confirm["best_positive"] == max(positive, key=lambda name: positive[name]["mean_train_reward"])
    assert set(confirm["arms"]) == {"silo-best", "positive-best", "swarm-positive", "frozen-positive",
                                    "self-replay-positive"} and confirm["seeds"] == [2]
    assert all(len(c["heldout"]["diffs"]) == 1 for c in confirm["pairs"].values())  # fresh seed 2 only
    # 9 arms against each silo, swarm against 6, 3 named pairs, 4 confirmation pairs: one verdict each
    assert (tmp_path / "summary.txt").read_text().count("-> ") == 9 + 9 + 6 + 3 + 4
    again = subprocess.run([sys.executable, "-m", "scripts.experiments.skeptic", "--quick", "--out", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "running" not in again.stdout  # every run was kept


def test_exp_swarm_size_quick(tmp_path, monkeypatch):
    """Both curves end to end: a silo and a swarm per point on paired seeds, the point on both curves
    (N = 2, J = 4 in the smoke) run once, each gain the paired difference of the runs' figures."""
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    result = run_script("scripts.experiments.swarm_size", "exp_swarm_size", tmp_path)
    curves = {(p["curve"], p["x"]): p for p in result["points"]}
    assert set(curves) == {("N", 2), ("N", 4), ("J", 2), ("J", 4), ("weak", 2)}
    assert curves[("N", 4)]["nodes"] == 4 and curves[("J", 2)]["mix"] == [6, 2]
    for point in result["points"]:
        for key in ("heldout", "pass8"):
            assert len(point["swarm"][key]) == len(point["silo"][key]) == 2
            assert point["gain"][key]["diffs"] == pytest.approx([a - b for a, b in zip(point["swarm"][key],
                                                                                      point["silo"][key])])
    assert curves[("N", 2)]["swarm"] == curves[("J", 4)]["swarm"]  # the same runs: N = 2 at 4/4
    assert len(list(tmp_path.glob("swarm-n*/seed*.json"))) == 4 * 2  # 3 distinct swarms + weak x 2 seeds, none twice
    # weak peers (N = 2 in the smoke): node 0 the preset's 64x2, node 1 a 32x1, in the swarm and in its silo
    weak = curves[("weak", 2)]
    assert set(weak["by_size"]) == {"64x2", "32x1"}
    for folder in ("silo-n2-weak", "swarm-n2-4-4-weak"):
        for seed in result["seeds"]:
            figures = json.loads((tmp_path / folder / f"seed{seed}.json").read_text())
            assert figures["heldout"] == pytest.approx(mean(s["heldout"] for s in figures["by_size"].values()))
            shapes = [json.loads(next((tmp_path / folder / f"seed{seed}/node{i}/checkpoints").glob(
                "round-*/model/config.json")).read_text()) for i in (0, 1)]
            assert [(c["hidden_size"], c["num_hidden_layers"]) for c in shapes] == [(64, 2), (32, 1)]
    for shape in ("64x2", "32x1"):
        mine = weak["by_size"][shape]
        assert mine["gain"]["heldout"]["diffs"] == pytest.approx([a - b for a, b in zip(mine["swarm"]["heldout"],
                                                                                        mine["silo"]["heldout"])])
    among_strong = weak["strong_vs_strong_peers"]["heldout"]["diffs"]
    assert among_strong == pytest.approx([a - b for a, b in zip(weak["by_size"]["64x2"]["swarm"]["heldout"],
                                                                curves[("N", 2)]["swarm"]["heldout"])])


def test_bench_round_cost_quick(tmp_path):
    result = run_script("scripts.bench.round_cost", "bench_round_cost", tmp_path)
    table = {row["mix"]: row for row in result["table"]}
    assert set(table) == {"8/0", "4/4"} and all(row["rounds"] == 2 * 2 for row in table.values())  # warm-up left out
    silo, swarm = table["8/0"], table["4/4"]
    assert silo["groups_verified"] == 0 and silo["t_exchange"] < 1e-3 and silo["round_vs_silo"] == 1.0
    assert swarm["external_received"] > 0 and swarm["t_exchange"] > 0 and swarm["round_vs_silo"] > 0
    assert swarm["generate_calls"] == 1.0  # hinted prompts ride in the round's one generate call
    assert swarm["groups_verified"] <= swarm["external_used"] + 2  # picks (all used here) and the audit


def test_exp_regime_quick(tmp_path):
    result = run_script("scripts.experiments.regime", "exp_regime", tmp_path)
    assert set(result["candidates"]) == {"lr1e-3", "lr3e-3"} and len(result["runs"]) == 4
    best = max(result["candidates"], key=lambda name: result["candidates"][name]["train_reward_late"])
    assert result["chosen"] == best  # chosen on training reward, whatever held-out says
    for run in result["runs"]:
        assert run["curve"][0][0] == 0 and [r for r, _ in run["curve"][1:]] == [2, 4]  # before training, then every 2
        assert len(run["reward"]) == result["rounds"] == 4
