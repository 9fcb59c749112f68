"""scripts/gpu_run.sh in its smoke mode on this CPU (the tiny preset, seconds): the same code path a
CUDA machine runs (only the preset, the sizes and the device differ), through the shell script, in an
environment where the p2p stack is absent (a GPU box has none of it: the memory transport needs none)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.hidden_modules import hiding_source
from tests.support.processes import repo_env

ROOT = Path(__file__).resolve().parents[3]
# Hidden at every interpreter start (the script and each run's spawned process), as sitecustomize.py
ABSENT = ("hivemind", "grpc_tools", "libp2p", "multiaddr")


def gpu_run(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    hide = out / "hide"
    hide.mkdir(parents=True)
    (hide / "sitecustomize.py").write_text(hiding_source(ABSENT))
    env = repo_env(PYTHONPATH=f"{hide}:{ROOT}")
    proc = subprocess.run(["bash", "scripts/gpu_run.sh", "--smoke", "--out", str(out), *extra], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "gpu_run.json").read_text())


def test_smoke_compares_the_arms_and_lists_the_phase_seconds(tmp_path):
    proc, result = gpu_run(tmp_path)
    assert (tmp_path / "gpu_run.png").stat().st_size > 10_000
    runs = {run["arm"]: run for run in result["runs"]}
    assert set(runs) == {"silo", "swarm"} and all(run["state"] == "done" for run in runs.values())
    for arm in runs.values():  # every node-round carries its phases
        assert arm["rows"] and all(row["t_generate"] > 0 and row["t_train"] > 0 for row in arm["rows"])
        assert 0.0 <= arm["heldout"] <= 1.0 and arm["eval_s"] and all(s > 0 for s in arm["eval_s"])
    assert runs["silo"]["peer_groups_used"] == 0 and runs["swarm"]["peer_groups_used"] > 0
    assert 0.0 <= runs["swarm"]["peer_share_correct"] <= 1.0
    # the two arms ran to the same virtual budget on the compute clock; the paired difference is per seed
    assert result["swarm_minus_silo"]["diffs"] == [runs["swarm"]["heldout"] - runs["silo"]["heldout"]]
    assert "seconds per node-round: generate" in proc.stdout and "exchange" in proc.stdout
    assert "could not do: no CUDA GPU seen by torch" in proc.stdout  # this machine has none: said, not hidden
    # every node's grid evaluations were on disk as they happened: the points a finished run reports
    for arm in runs.values():
        assert arm["grid_reached"][0][0] == 0.0
        assert arm["grid_reached"][-1][1] == pytest.approx(arm["curve"]["heldout"][-1])


def test_a_cut_run_reports_the_grid_points_all_its_nodes_reached(tmp_path):
    from scripts.experiments.gpu_run import grid_reached, reached_comparison

    def run_dir(arm: str, tracks: list[list[tuple[float, float]]]) -> dict:
        job = {"dir": str(tmp_path / arm), "nodes": len(tracks)}
        for i, track in enumerate(tracks):
            (tmp_path / arm / f"node{i}").mkdir(parents=True)
            (tmp_path / arm / f"node{i}" / "grid_evals.json").write_text(
                json.dumps([{"vtime": t, "heldout_pass1": v} for t, v in track]))
        return job

    # node1 has not reached t = 20 yet: the run's last common point is t = 10
    silo = grid_reached(run_dir("silo", [[(0, 0.1), (10, 0.2), (20, 0.3)], [(0, 0.1), (10, 0.4)]]))
    swarm = grid_reached(run_dir("swarm", [[(0, 0.1), (10, 0.5)], [(0, 0.1), (10, 0.6)]]))
    assert silo == [[0, 0.1], [10, pytest.approx(0.3)]] and swarm == [[0, 0.1], [10, pytest.approx(0.55)]]
    assert grid_reached(run_dir("short", [[(0, 0.1)], []])) == []  # a node with nothing yet: no figure
    runs = [{"arm": "silo", "seed": 0, "grid_reached": silo}, {"arm": "swarm", "seed": 0, "grid_reached": swarm}]
    reached = reached_comparison(runs, 1)
    assert reached["vtime"] == [10] and reached["swarm"] == [pytest.approx(0.55)] and reached["silo"] == [pytest.approx(0.3)]


def test_runs_past_the_deadline_are_cut_and_reported(tmp_path):
    proc, result = gpu_run(tmp_path, "--minutes", "0.005")  # 0.3 s: before a spawned process has imported torch
    assert {run["state"] for run in result["runs"]} == {"cut"}
    assert all("heldout" not in run for run in result["runs"]) and result["swarm_minus_silo"] is None
    assert "2 run(s) cut at the 0.005-minute deadline" in proc.stdout
