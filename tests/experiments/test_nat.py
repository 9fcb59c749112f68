"""Nodes behind a real NAT (node/labs/netns.py: Linux network namespaces, each home behind its
own iptables-masquerading router with no port forwards) running real `swarm-node join` / `relay`
processes. Skips where namespaces or iptables are unavailable (needs root; scripts/setup.sh installs
iptables as root). Each test tears its namespaces down, also when it fails."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.labs.nat_run import NatPlan, run_exchange, run_flood
from node.labs.netns import NatLab, unavailable

ROOT = Path(__file__).resolve().parents[2]
WHY = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.skipif(WHY is not None, reason=f"NAT lab: {WHY}")]


@pytest.fixture
def lab():
    with NatLab(homes=2, public_hosts=2) as built:
        yield built
    assert not built.exists(), "the lab's namespaces outlived it"


def test_home_nodes_learn_they_are_private_and_train_on_each_other_through_a_relay(lab, tmp_path):
    result = run_exchange(lab, tmp_path / "on", NatPlan(relays=True, train_s=20.0))
    nodes = result["nodes"]
    assert nodes["bootstrap"]["reachability"] == "public"  # declared (swarm.nat.reachability=public)
    assert nodes["public"]["reachability"] == "public"     # learned: the bootstrap box dialed it back
    for home, other in (("home0", "home1"), ("home1", "home0")):
        node = nodes[home]
        assert node["reachability"] == "private", home
        assert node["relayed_addrs"] >= 1 and all("/p2p-circuit" in a for a in node["join_addrs"]), node["join_addrs"]
        assert node["counters"]["relayed_peers"] == 1  # the other home, through a relay only
        assert node["counters"]["relayed_received"] > 0
        assert node["used_from_other_home"] > 0, f"{home} never trained on {other}'s groups"


def test_without_relays_the_home_nodes_never_exchange_a_group(lab, tmp_path):
    result = run_exchange(lab, tmp_path / "off", NatPlan(relays=False, train_s=20.0))
    for home in ("home0", "home1"):
        node = result["nodes"][home]
        assert node["reachability"] == "private" and node["relayed_addrs"] == 0
        assert node["rounds"] >= 20  # it trained all along, alone
        assert node["used_from_other_home"] == 0
        assert node["counters"]["relayed_peers"] == 0 and node["counters"]["relayed_received"] == 0


def test_a_relay_node_flooded_by_a_relayed_peer_keeps_training_and_cuts_it(lab, tmp_path):
    result = run_flood(lab, tmp_path / "flood", NatPlan(train_s=15.0, flood_rate=400.0))
    public = result["public"]
    assert public["reachability"] == "public" and public["counters"]["relay_serving"] == 1
    assert result["flooder_published"] > 2000
    assert public["counters"]["flooders_cut"] >= 1
    assert result["public_rounds_during_flood"] >= 20  # paced at 0.2 s: it kept training through the flood
    # the flooder's groups are valid: some are trained before the cut, never more than a fraction
    assert result["public_groups_from_flooder"] < 0.05 * result["flooder_published"]
    assert result["home0"]["reachability"] == "private"


def test_relayed_gossip_delivers_every_message_one_at_a_time_and_in_bursts(tmp_path):
    """The experiment script's smoke mode, latency phase (its own lab): every message arrives on
    both paths, and the JSON reports the relay's extra latency."""
    out = tmp_path / "nat"
    proc = subprocess.run([sys.executable, "-m", "scripts.experiments.nat", "--smoke", "--phases", "latency",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latency = json.loads((out / "nat.json").read_text())["phases"]["latency"]
    for path in ("relayed", "direct"):
        for mode in ("single", "burst"):
            v = latency["paths"][path][mode]
            assert v["delivered"] == v["sent"] == 20, (path, mode, v)
    assert latency["relayed_via_stream"] >= 40 and set(latency["relay_extra_p50_ms"]) == {"single", "burst"}
    assert (out / "nat.png").stat().st_size > 10_000
