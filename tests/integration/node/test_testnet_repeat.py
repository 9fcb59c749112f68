"""The in-process memory testnet repeats exactly: two runs of one command (separate processes, other
hash seeds) write the same metrics rows on every node but for the fields that time the machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--transport", "memory", "--preset", "tiny", "--nodes", "3", "--rounds", "20", "--homogeneous", "--quiet"]
CASES = {
    # the rounds clock, with what used to run on the wall clock: bus latency, peer scores and bans
    # (a liar), fresh keys (a sybil's), and every node's own key
    "rounds": ["--mix", "4/4", "--netem", "delay 50ms loss 10%", "--hostile", "1:liar,1:sybil"],
    "compute": ["--clock", "compute", "--compare", "8/0,4/4"],
}


def wall_time_field(key: str) -> bool:
    return key.startswith("t_") or key == "tokens_per_s"


def run(out: Path, args: list[str], hash_seed: str) -> dict[str, list[dict]]:
    """Every node's metrics rows (wall-time fields left out), by run and node directory."""
    subprocess.run([sys.executable, "-m", "node.cli", "testnet", *TINY, *args, "--out", str(out)], cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    rows = {}
    for path in sorted(out.glob("*/node*/metrics.jsonl")):
        lines = path.read_text().splitlines()
        rows[str(path.relative_to(out))] = [{k: v for k, v in json.loads(line).items() if not wall_time_field(k)}
                                            for line in lines]
    return rows


@pytest.fixture(scope="module")
def compute_two_seeds(tmp_path_factory) -> dict[str, list[dict]]:
    """The compute case over seeds 0 and 1, one after another (hash seed 1): both tests below read it
    (a module fixture: tests/conftest.py keeps its tests on one xdist worker, so it runs once)."""
    return run(tmp_path_factory.mktemp("sequential"), [*CASES["compute"], "--seeds", "2"], "1")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_runs_of_the_memory_testnet_write_the_same_metrics(tmp_path, case, compute_two_seeds):
    """The compute case's first run is seed 0 of the shared two-seed run: its rows are that run's own
    (the 8/0 run of seed 0 fixes the budget whatever the number of seeds), so the second run of one
    seed, in another process with another hash seed, must write exactly those."""
    second = run(tmp_path / "b", CASES[case], "2")
    if case == "compute":
        first = {node: rows for node, rows in compute_two_seeds.items() if node.split("/")[0].endswith("-seed0")}
    else:
        first = run(tmp_path / "a", CASES[case], "1")
    assert len(first) == (6 if case == "compute" else 3) and all(len(rows) >= 15 for rows in first.values())
    assert any(row.get("external_used") for rows in first.values() for row in rows)  # the nodes did exchange
    assert first.keys() == second.keys()
    for node, rows in first.items():
        assert rows == second[node], f"{node} differs between two runs of the same {case} testnet"


@pytest.mark.slow
def test_runs_in_parallel_workers_write_what_the_sequential_runner_writes(tmp_path, compute_two_seeds):
    """--workers 2: the 8/0 run of seed 0 fixes the budget alone, then the other three runs go two at a
    time in worker processes, and every node's metrics equal those of the runs made one after another."""
    sequential = compute_two_seeds
    parallel = run(tmp_path / "b", [*CASES["compute"], "--seeds", "2", "--workers", "2"], "1")
    assert len(sequential) == 12 and sequential.keys() == parallel.keys()
    for node, rows in sequential.items():
        assert rows == parallel[node], f"{node} differs between the sequential and the parallel runner"
    runs = json.loads((tmp_path / "b" / "runs.json").read_text())
    assert [(r["mix"], r["seed"]) for r in runs] == [("8/0", 0), ("4/4", 0), ("8/0", 1), ("4/4", 1)]


def test_the_live_table_reads_the_last_complete_row_of_a_file_being_written(tmp_path):
    from node.testnet.parallel import last_row, progress_row

    node = tmp_path / "run" / "node0"
    node.mkdir(parents=True)
    rows = [{"round": k, "reward_mean": k / 10, "external_used": 2} for k in range(200)]
    (node / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"round": 200, "rew')
    assert last_row(node / "metrics.jsonl") == rows[-1]  # the torn line is being written: skipped
    assert last_row(node / "absent.jsonl") is None
    row = progress_row("mix4-4-seed0", tmp_path / "run", "running", None)
    assert row == {"node": "mix4-4-seed0", "state": "running", "round": 199, "reward": 19.9, "ext_used": 2}
