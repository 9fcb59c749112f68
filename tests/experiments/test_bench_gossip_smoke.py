"""Smoke test of scripts/bench/gossip/bench.py: 3 node processes per variant on 127.0.0.1 (p2pd bounded,
p2pd unbounded and py-libp2p, those this checkout can run), few messages, every figure present and
plausible (py-libp2p's GossipSub mesh really read), and the ratios between the variants; and the node
process's status read of a py-libp2p mesh on its own, in seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libp2p")

from scripts.bench.gossip import node as gossip_node  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Emitted:
    """Stands in for the node process's ControlChannel: keeps what it would send the coordinator."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, **event) -> None:
        self.events.append(event)


def test_status_reads_the_libp2p_mesh_and_muxers() -> None:
    """Two bench nodes on py-libp2p: each one's status gives its GossipSub mesh size per topic (not
    None: the mesh-ready wait must not pass on connected peers alone) and the connection's muxer."""
    from protocol import NodeIdentity

    roll_topic, _ = gossip_node.topics()
    made, nodes = [], []
    try:
        for i in range(2):
            identity = NodeIdentity.from_seed(os.urandom(32))
            bootstrap = made[0].listen_addrs() if made else []
            transport = gossip_node.make_transport("libp2p", identity.private_seed(), "/ip4/127.0.0.1/tcp/0",
                                                   bootstrap, [roll_topic])
            made.append(transport)
            transport.start()
            cfg = {"index": i, "transport": "libp2p", "flood_target": False, "poll_ms": 2.0}
            nodes.append(gossip_node.BenchNode(cfg, transport, identity, Emitted()))

        def meshed() -> list[dict] | None:  # every status, once each node's mesh has the topic
            statuses = [node.status() for node in nodes]
            return statuses if all((s["mesh"] or {}).get(roll_topic) for s in statuses) else None

        statuses = wait_until(meshed, "each node in the other's mesh", 15.0, step=0.1)
        for status in statuses:
            assert status["mesh"] == {roll_topic: 1}, status["mesh"]  # each in the other's mesh
            assert status["peers"] == 1 and sum(status["muxers"].values()) >= 1, status
    finally:
        for transport in made:
            transport.close()


@pytest.mark.slow
def test_bench_gossip_every_variant_three_nodes(tmp_path: Path) -> None:
    transports = gossip_node.available_transports()
    cmd = [sys.executable, "-m", "scripts.bench.gossip.bench", "--transports", ",".join(transports),
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
        if run["transport"] == "libp2p":  # its mesh is read, not assumed: 3 nodes, each in both others' mesh
            assert run["mesh_per_node"] == [2, 2, 2], run["mesh_per_node"]
            assert sum(run["muxers_negotiated"].values()) >= 3 * 2, run["muxers_negotiated"]  # both ends
        else:  # the p2pd daemon exposes no mesh
            assert run["mesh_per_node"] is None
    if "p2pd" in transports and "p2pd-unbounded" in transports:
        ratios = result["ratios"]["bounded/unbounded"]["3"]
        assert ratios["connections per node: max"] == 1.0  # below the bound both hold every peer
        assert ratios["burst: reach-all p50 ms"] > 0 and ratios["flood: delivery ratio"] == pytest.approx(1.0)
    assert result["conditions"]["p2pd_bounds"]["conn_high"] == 12
    assert 0 < result["wire"]["ratio_envelope_to_json"] < 1
