"""Issue 9 with real processes on 127.0.0.1 (tiny preset): (a) two nodes started as the README says
never ban each other and use each other's groups; (b) an attacker flooding through an honest relay
gets the relay nobody's blame, and the node behind it keeps training, its rounds under attack within
25% of quiet ones.

Each test prints one `FIGURES {...}` line (pytest -s) with what it measured. Only processes these
tests start are ended, by their Popen handles."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.observe.control import control_address, fetch_status
from node.observe.metrics import read_metrics
from tests.support.processes import repo_env, stop
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # round-time ratio and a 30 s window

# README "Joining a swarm": `join --identity node.key --run-dir runs/a`, then on the others
# `join --peers ... --mix 4/4 --run-dir runs/b`; here on 127.0.0.1 with free ports, enough rounds,
# one torch thread each (2 shared cores) and a swarm name of their own.
JOIN = ["join", "--preset", "tiny", "--rounds", "1000000", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
        "--set", "run.threads=1"]


def start(run_dir: Path, *args: str) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
    cmd = [sys.executable, "-m", "node.cli", *JOIN, "--run-dir", str(run_dir), "--identity", str(run_dir / "node.key"),
           *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=repo_env(), stdout=log, stderr=log)


def start_attacker(tmp_path: Path, kind: str, peers: list[str], swarm: str, seconds: float, period_s: float,
                   per_step: int) -> subprocess.Popen:
    log = open(tmp_path / f"attacker-{kind}.log", "ab")
    cmd = [sys.executable, "-m", "node.hostile.process", "--kind", kind, "--peers", *peers, "--swarm", swarm,
           "--preset", "tiny", "--set", "run.threads=1", "--rounds", str(int(seconds / period_s)),
           "--period-s", str(period_s), "--per-step", str(per_step), "--out", str(tmp_path / f"attacker-{kind}.json"),
           "--connect-timeout-s", "20"]
    return subprocess.Popen(cmd, cwd=ROOT, env=repo_env(), stdout=log, stderr=log)



def run_for(seconds: float, procs) -> None:
    """Lets them run `seconds`, failing at once if one exits."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, f"{seconds:g} s of running", seconds + 30, procs=procs, step=0.5)



def info(run_dir: Path) -> dict:
    return json.loads((run_dir / "node.json").read_text())


def status(run_dir: Path):
    return fetch_status(control_address(run_dir), timeout_s=20)


def peer_info(reply, peer_id: str):
    return next((p for p in reply.peers if p.peer_id == peer_id), None)


def used_from(run_dir: Path, sender: str, rounds=None) -> int:
    rows = read_metrics(run_dir) if rounds is None else rounds
    return sum(r.get("external_used_by_sender", {}).get(sender, 0) for r in rows)


def listening(*dirs: Path):
    return lambda: all((d / "node.json").exists() for d in dirs)


def accepted_from(reply, peer_id: str) -> int:
    record = peer_info(reply, peer_id)
    return record.accepted if record else 0


def test_two_nodes_with_the_readme_defaults_never_ban_each_other(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    swarm = ["--swarm", "defaults"]
    procs = [start(a, *swarm)]
    try:
        wait_until(listening(a), "A to listen", procs=procs, timeout=180, step=0.25)
        procs.append(start(b, *swarm, "--peers", *info(a)["listen_addrs"], "--mix", "4/4"))
        wait_until(listening(b), "B to listen", procs=procs, timeout=180, step=0.25)
        ids = {a: info(a)["peer_id"], b: info(b)["peer_id"]}
        wait_until(lambda: all(accepted_from(status(d), ids[o]) > 0 for d, o in ((a, b), (b, a))),
                   "both to hear from each other", procs=procs, timeout=180, step=0.25)
        before = {d: (status(d), len(read_metrics(d))) for d in (a, b)}  # the 30 s window starts here
        run_for(30, procs)
        after = {d: status(d) for d in (a, b)}
    finally:
        stop(procs)

    figures = {}
    for me, other in ((a, b), (b, a)):
        reply, (reply_before, first_row) = after[me], before[me]
        record = peer_info(reply, ids[other])
        published = (after[other].transport_counters.get("published", 0)
                     - before[other][0].transport_counters.get("published", 0))
        accepted = accepted_from(reply, ids[other]) - accepted_from(reply_before, ids[other])
        rows = read_metrics(me)[first_row:]
        received = sum(r.get("external_received", 0) for r in rows)
        flat = sum(r.get("external_zero_variance", 0) for r in rows)
        used = used_from(me, ids[other], rows)
        rejected = {k: v - reply_before.rejected_by_reason.get(k, 0) for k, v in reply.rejected_by_reason.items()}
        figures[me.name] = {
            "rounds": len(rows), "other_published": published, "accepted_from_other": accepted,
            "accepted_fraction": round(accepted / max(1, published), 3),
            "groups_received": received, "groups_zero_variance": flat, "groups_used_from_other": used,
            "used_fraction_of_usable": round(used / max(1, received - flat), 3),
            "other_banned": record.banned, "other_ban_count": record.ban_count, "other_score": round(record.score, 2),
            "rejected_by_reason": {k: v for k, v in rejected.items() if v},
            "dropped_inbound_full": reply.transport_counters.get("dropped_inbound_full", 0),
        }
    print("FIGURES", json.dumps(figures, sort_keys=True))
    for me in ("a", "b"):
        f = figures[me]
        assert f["other_ban_count"] == 0 and not f["other_banned"] and f["other_score"] > 0, figures
        assert f["accepted_fraction"] >= 0.8, figures  # nearly all the other sent
        assert f["groups_used_from_other"] > 0, figures


def round_times(rows) -> float:
    return statistics.median(r["t_round"] for r in rows)


def test_a_flood_through_an_honest_relay_does_not_get_the_relay_banned(tmp_path):
    relay, victim = tmp_path / "relay", tmp_path / "victim"
    swarm = "relayed"
    procs = [start(relay, "--swarm", swarm)]
    try:
        wait_until(listening(relay), "the relay to listen", procs=procs, timeout=180, step=0.25)
        relay_addrs = info(relay)["listen_addrs"]
        procs.append(start(victim, "--swarm", swarm, "--peers", *relay_addrs, "--mix", "4/4"))
        wait_until(listening(victim), "the victim to listen", procs=procs, timeout=180, step=0.25)
        relay_id = info(relay)["peer_id"]
        wait_until(lambda: used_from(victim, relay_id) > 0, "the victim to use the relay's groups",
                   procs=procs, timeout=180, step=0.25)

        quiet_from = len(read_metrics(victim))
        run_for(15, procs)
        quiet = read_metrics(victim)[quiet_from:]
        # 160 valid groups every 0.5 s from one key, as fast as its libp2p host sends them
        procs.append(start_attacker(tmp_path, "flood", relay_addrs, swarm, seconds=300, period_s=0.5, per_step=8))
        victim_id = info(victim)["peer_id"]
        wait_until(lambda: any(p.peer_id not in (victim_id, relay_id) for p in status(relay).peers),
                   "the flood to reach the relay", procs=procs, timeout=240, step=0.25)
        attack_from = len(read_metrics(victim))
        relay_accepted_before = peer_info(status(victim), relay_id).accepted
        run_for(15, procs)
        attack = read_metrics(victim)[attack_from:]
        replies = {d: status(d) for d in (relay, victim)}
    finally:
        stop(procs)

    summary = json.loads((tmp_path / "attacker-flood.json").read_text())
    attacker_id = summary["peer_id"]
    at_victim, at_relay = replies[victim], replies[relay]
    relay_record = peer_info(at_victim, relay_id)
    attacker_record = peer_info(at_victim, attacker_id)
    figures = {
        "attacker_messages": summary["counters"].get("messages", 0),
        "quiet_rounds": len(quiet), "attack_rounds": len(attack),
        "quiet_t_round_median_s": round(round_times(quiet), 4), "attack_t_round_median_s": round(round_times(attack), 4),
        "t_round_ratio": round(round_times(attack) / round_times(quiet), 3),
        "relay_banned_at_victim": relay_record.banned, "relay_ban_count": relay_record.ban_count,
        "relay_score_at_victim": round(relay_record.score, 2),
        "attacker_banned_at_victim": bool(attacker_record and attacker_record.banned),
        "attacker_accepted_at_victim": attacker_record.accepted if attacker_record else 0,
        "relay_groups_used_during_attack": used_from(victim, relay_id, attack),
        "relay_messages_accepted_during_attack": relay_record.accepted - relay_accepted_before,
        "attacker_groups_used_during_attack": used_from(victim, attacker_id, attack),
        "attacker_rejected_at_victim": attacker_record.rejected if attacker_record else 0,
        "victim_rejected": dict(at_victim.rejected_by_reason), "relay_rejected": dict(at_relay.rejected_by_reason),
        "victim_dropped_inbound_full": at_victim.transport_counters.get("dropped_inbound_full", 0),
    }
    print("FIGURES", json.dumps(figures, sort_keys=True))
    assert summary["connected_at_start"] and figures["attacker_messages"] > 1000, figures
    assert attacker_record is not None, figures  # the flood reached the victim, through the relay
    assert not relay_record.banned and relay_record.ban_count == 0 and relay_record.score > 0, figures
    # the relay's own messages kept getting through (once its model solves every task its groups
    # are zero-variance and not trained on, so "used" alone would not say so)
    assert figures["relay_messages_accepted_during_attack"] > 0, figures
    assert len(attack) >= 3, figures  # the victim kept training
    # Issue 9: the victim's rounds under attack within 25% of quiet ones (verification runs on the
    # background ingest thread under a budget; on 2 shared cores the attacker's process competes too)
    assert figures["t_round_ratio"] <= 1.25, figures
