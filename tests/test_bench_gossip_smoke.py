"""Smoke test of scripts/bench_gossip.py: 3 node processes per variant on 127.0.0.1 (p2pd bounded,
p2pd unbounded and py-libp2p, those this checkout can run), few messages, every figure present and
plausible, and the ratios between the variants."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libp2p")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gossip_node import available_transports  # noqa: E402


@pytest.mark.slow
def test_bench_gossip_every_variant_three_nodes(tmp_path: Path) -> None:
    transports = available_transports()
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_gossip.py"), "--transports", ",".join(transports),
           "--nodes", "3", "--publishers", "2", "--messages", "3", "--isolated", "3", "--flood", "40",
           "--flood-senders", "2", "--idle-s", "0.3", "--micro-messages", "100", "--worker-deadline", "100",
           "--shutdown-timeout", "8", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60 + 50 * len(transports))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench_gossip.json").read_text())
    assert (tmp_path / "bench_gossip.png").stat().st_size > 0
    text = (tmp_path / "bench_gossip.txt").read_text()
    assert "reach-all p95" in text and "load 1m at start" in text
    envelope_per_token = result["wire"]["envelope_bytes_per_token"]
    assert [r["transport"] for r in result["runs"]] == transports
    for run in result["runs"]:
        assert run["n"] == 3 and "error" not in run, run.get("error")
        iso, burst, flood = run["latency_isolated"], run["latency"], run["flood"]
        assert iso["deliveries"] == iso["deliveries_expected"] == 3 * 2 and iso["delivery_ratio"] == 1.0
        assert burst["deliveries"] == burst["deliveries_expected"] == 2 * 3 * 2
        assert 0 < burst["reach_all_ms"]["p50"] <= burst["reach_all_ms"]["p95"]
        assert burst["cpu_s_per_delivery"] > 0
        # every delivery crossed at least one TCP hop carrying the whole signed envelope
        assert burst["wire_bytes_per_delivered_token"] >= envelope_per_token
        assert burst["wire_copies_per_delivery"] >= 1.0
        assert flood["verified"] == flood["messages"] == 40 and 3000 < flood["envelope_bytes"] < 5000
        assert flood["ingest_msgs_per_s"] > 0 and flood["transport_rx_msgs_per_s"] > 0
        assert run["connections"]["max"] == 2 and run["connections_end"]["max"] == 2  # 3 nodes: each knows both
        assert run["shutdown"]["killed"] == [] and not run["dead_before_shutdown"]
        assert len(run["loadavg_at_start"]) == 3
    if "p2pd" in transports and "p2pd-unbounded" in transports:
        ratios = result["ratios"]["bounded/unbounded"]["3"]
        assert ratios["connections per node: max"] == 1.0  # below the bound both hold every peer
        assert ratios["burst: reach-all p50 ms"] > 0 and ratios["flood: delivery ratio"] == pytest.approx(1.0)
    assert result["conditions"]["p2pd_bounds"]["conn_high"] == 12
    assert 0 < result["wire"]["ratio_envelope_to_json"] < 1
