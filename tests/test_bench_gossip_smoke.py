"""Smoke test of scripts/bench_gossip.py: 3 node processes over real libp2p on 127.0.0.1, few messages."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libp2p")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_gossip_three_nodes(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_gossip.py"), "--nodes", "3", "--publishers", "2",
           "--messages", "3", "--isolated", "3", "--flood", "40", "--flood-senders", "2", "--idle-s", "0.5",
           "--micro-messages", "200", "--worker-deadline", "60", "--shutdown-timeout", "8", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=38)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench_gossip.json").read_text())
    assert (tmp_path / "bench_gossip.png").stat().st_size > 0
    run = result["runs"][0]
    assert run["n"] == 3 and "error" not in run
    assert run["latency_isolated"]["deliveries"] == run["latency_isolated"]["deliveries_expected"] == 3 * 2
    assert run["latency"]["deliveries"] == run["latency"]["deliveries_expected"] == 2 * 3 * 2
    assert run["latency"]["reach_all_ms"]["p50"] > 0
    assert run["flood"]["verified"] == run["flood"]["messages"] == 40
    assert run["shutdown"]["killed"] == [] and not run["dead_before_shutdown"]
    wire = result["wire"]
    assert 0 < wire["ratio_envelope_to_json"] < 1
