"""The in-process memory testnet repeats exactly: two runs of one command (separate processes, other
hash seeds) write the same metrics rows on every node but for the fields that time the machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_runs_of_the_memory_testnet_write_the_same_metrics(tmp_path, case):
    first, second = run(tmp_path / "a", CASES[case], "1"), run(tmp_path / "b", CASES[case], "2")
    assert len(first) == (6 if case == "compute" else 3) and all(len(rows) >= 15 for rows in first.values())
    assert any(row.get("external_used") for rows in first.values() for row in rows)  # the nodes did exchange
    for node, rows in first.items():
        assert rows == second[node], f"{node} differs between two runs of the same {case} testnet"
