"""Issue 31, "an honest peer is always heard", with real processes on 127.0.0.1 (tiny preset): two
README-default `join` nodes on p2pd, A unpaced and B paced to one round a second, then a flood of
valid, unique, trainable groups from 8 keys (each its own libp2p host) over 2 attacker processes.

One run of scripts/experiments/honest_heard.py (the module fixture: under 2 minutes on 2 shared cores)
serves the three tests, each reading its JSON:
  (a) no attack: B trains A's groups in >= 90% of its rounds over 30 s after the warm-up (both at
      the script's learning rate, at which A keeps offering groups with reward variance);
  (b) the flood (30 s): B verifies A's messages in every 1-s interval after 5 s, trains them in
      >= 90% of its rounds; A and B give the attacker keys at most the young share of their mix,
      and establish none of them (swarm.admission.young_seconds is 300 s);
  (c) the script's smoke: JSON and PNG written, the flood sent what it was asked to.
The flood's rate, 20 messages/s a key, is the Ingress's per-origin limit (protocol/ratelimit.py):
every message a key sends passes it, so 8 keys send B 160 messages/s against A's 10 (A's Outbox
pace), ten times what B may verify of young senders a round (swarm.ingest.young_share 0.25 of
swarm.ingest.max_messages 64); the script's full run (60 a key, 32 keys) costs the attackers 2 cores.
Each test prints one `FIGURES {...}` line (pytest -s). Only processes the script starts are ended,
by their Popen handles (the script ends its own children on SIGTERM)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.labs.honest_heard_run import LEARNING_SETS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # paced windows under a flood

QUIET_S, FLOOD_S, SETTLE_S, KEYS, PROCS, RATE = 30, 30, 5, 8, 2, 20
# A is not told B's address (B dials A), so in the new swarm's bootstrap window A establishes B only
# after swarm.admission.bootstrap_young_fraction of young_seconds: 75 s at the default 0.25, of a
# warm-up that measures nothing. At 0.1 it is 30 s; the window is over once each holds the other
# established, so the flood meets the defaults (young_seconds 300 s) either way.
NODE_SETS = (*LEARNING_SETS, "swarm.admission.bootstrap_young_fraction=0.1")
TRAINED_MIN = 0.9
# Young keys earn share / (1 - share) of a slot per established group trained (node/peers/admission.py
# Admission.split; rounds without an established group earn nothing while the established peer is
# heard from), and a window may open with up to one slot of young credit carried over: the share
# may exceed young_share_max by 1 / groups trained, capped here.
SHARE_TOLERANCE_CAP = 0.05


@pytest.fixture(scope="module")
def heard(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("honest-heard")
    cmd = [sys.executable, "-m", "scripts.experiments.honest_heard", "--smoke", "--out", str(out),
           "--quiet-s", str(QUIET_S), "--flood-s", str(FLOOD_S), "--settle-s", str(SETTLE_S), "--keys", str(KEYS),
           "--procs", str(PROCS), "--rate", str(RATE), "--swarm", "honest-heard-test",
           *(arg for kv in NODE_SETS for arg in ("--node-set", kv))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script stops the nodes and attackers it started
        try:
            output, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate(timeout=30)
        pytest.fail(f"scripts.experiments.honest_heard ran over 420 s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    return {"out": out, "result": json.loads((out / "exp_honest_heard.json").read_text()), "output": output}


def figures(result: dict, phase: str, node: str) -> dict:
    return result["phases"][phase]["figures"][node]


def share_tolerance(f: dict) -> float:
    return min(SHARE_TOLERANCE_CAP, 1 / max(1, f["groups_used"]))


def test_a_paced_node_trains_its_honest_peer_in_nine_rounds_of_ten(heard):
    result = heard["result"]
    b = figures(result, "quiet", "b")
    print("FIGURES", json.dumps({"warmup": result["warmup"], "quiet_b": b, "quiet_a": figures(result, "quiet", "a")}))
    assert result["warmup"]["met"], result["warmup"]  # A verified at B (and established) before phase 1
    assert b["rounds"] >= 0.7 * QUIET_S, b  # paced at 1 round/s (the machine may stretch a few)
    assert b["honest_trained_fraction"] >= TRAINED_MIN, b


def test_a_flood_of_many_keys_leaves_the_honest_peer_heard(heard):
    result = heard["result"]
    b, est = figures(result, "flood", "b"), result["phases"]["flood"]["establishment"]
    attackers = result["phases"]["flood"]["attackers"]
    print("FIGURES", json.dumps({"flood_b": b, "flood_a": figures(result, "flood", "a"), "establishment": est,
                                 "attackers": attackers, "limits": result["limits"]}))
    sent = sum(a["messages"] or 0 for a in attackers)
    assert all(a["connected_at_start"] for a in attackers) and sent >= 0.7 * KEYS * RATE * FLOOD_S, attackers
    assert b["verified_source"] == "ingest.checked_by_peer", result["missing"]
    assert b["honest_verified_every_second"], b  # every ~1-s poll interval after the first SETTLE_S
    assert b["honest_trained_fraction"] >= TRAINED_MIN, b
    young = result["limits"]["young_share_max"]
    for f in (b, figures(result, "flood", "a")):  # the paced node and the fast one
        assert f["attacker_share"] <= young + share_tolerance(f), (f, young, share_tolerance(f))
    for node in ("a", "b"):
        assert est[node]["available"], result["missing"]
        assert est[node]["attacker_established"] == 0, est  # none sooner than young_seconds (300 s)


def test_exp_honest_heard_smoke_writes_its_figures(heard):
    result, out = heard["result"], heard["out"]
    assert (out / "exp_honest_heard.png").stat().st_size > 10_000
    assert result["machine"]["cpus"] and result["machine"]["cpu_model"]
    assert result["plan"]["keys"] == KEYS and result["plan"]["procs"] == PROCS
    assert len(result["attacker_keys"]) == KEYS and not set(result["attacker_keys"]) & set(result["ids"].values())
    assert set(result["acceptance"]) >= {"quiet.b.honest_trained_fraction>=0.9", "flood.b.establish_rate_ok"}
    for node in ("a", "b"):
        assert len(result["series"][node]) >= 0.8 * (QUIET_S + FLOOD_S), node  # a poll a second
        assert figures(result, "quiet", node)["rounds"] > 0 and figures(result, "flood", node)["rounds"] > 0
        assert figures(result, "quiet", node)["attacker_share"] in (0.0, None)  # nobody else before the flood
    assert figures(result, "flood", "a")["rounds_per_s"] > 2 * figures(result, "flood", "b")["rounds_per_s"]
