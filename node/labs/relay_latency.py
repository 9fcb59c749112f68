"""Relayed gossip against direct gossip, in a NatLab (node/labs/netns.py): does every message
arrive, one at a time and in bursts, and what does the relay add to the latency?

    public 0  `swarm-node relay` (declared public): bootstrap peer and circuit relay
    public 1  receiver of topic "direct": gossip straight from the sender (a direct TCP connection)
    home 1    receiver of topic "relayed": behind its NAT, reachable only through public 0's relay
    home 0    sender, behind its NAT: every message on both topics, `count` one at a time, `count`
              in bursts of `burst`

The processes are node/labs/relay_probe.py; latency is one-way (the namespaces share the host's
clock). Each message crosses its path once: relayed messages as a stream through the relay
(protocol/transports/p2pd/relayed.py), direct ones as GossipSub over a direct connection.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from policy.ground import child_env
from node.labs.nat_run import PORT, ROOT, node_json
from node.labs.netns import NatLab


@dataclass(frozen=True)
class LatencyPlan:
    count: int = 100      # messages one at a time, and as many again in bursts
    burst: int = 50
    size: int = 4096      # bytes per message
    gap_s: float = 0.05   # between single messages
    timeout_s: float = 120.0


def _probe(lab: NatLab, namespace: str, out: Path, name: str, argv: list[str]):
    log = open(out / f"{name}.log", "ab")
    return lab.popen(namespace, [sys.executable, "-m", "node.labs.relay_probe", *argv, "--out",
                                 str(out / f"{name}.json"), "--info", str(out / f"{name}.info.json")],
                     cwd=ROOT, env=child_env(), stdout=log, stderr=log)


def _wait_file(path: Path, procs: list, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"a probe failed before writing {path} (logs beside it)")
        time.sleep(0.3)
    raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")


def summarize(received: dict, sent_per_mode: int) -> dict:
    out = {}
    for mode in ("single", "burst"):
        lat = sorted(m["latency_s"] for m in received.get("messages", {}).values() if m["mode"] == mode)
        out[mode] = {"delivered": len(lat), "sent": sent_per_mode,
                     "p50_ms": round(1000 * statistics.median(lat), 2) if lat else None,
                     "p90_ms": round(1000 * lat[int(0.9 * (len(lat) - 1))], 2) if lat else None,
                     "max_ms": round(1000 * lat[-1], 2) if lat else None}
    return out


def run_latency(lab: NatLab, out: Path, plan: LatencyPlan) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    relay_dir = out / "relay"
    log = open(out / "relay.log", "ab")
    relay = lab.popen(lab.public(0), [sys.executable, "-m", "node.cli", "relay", "--listen",
                                      f"/ip4/{lab.public_ip(0)}/tcp/{PORT}", "--set", "swarm.nat.reachability=public",
                                      "--run-dir", str(relay_dir)], cwd=ROOT, env=child_env(), stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while not node_json(relay_dir).get("join_addrs"):
        if time.monotonic() > deadline or relay.poll() is not None:
            raise RuntimeError(f"the relay did not start (see {out / 'relay.log'})")
        time.sleep(0.3)
    boot = node_json(relay_dir)["join_addrs"][0]
    total = 2 * plan.count
    common = ["--expect", str(total), "--seconds", str(plan.timeout_s)]
    direct = _probe(lab, lab.public(1), out, "direct", ["receive", "--topics", "direct", "--listen",
                                                        f"/ip4/{lab.public_ip(1)}/tcp/{PORT}", *common])
    direct_addr = _wait_file(out / "direct.info.json", [direct], 60)["listen_addrs"][0]
    relayed = _probe(lab, lab.home(1), out, "relayed", ["receive", "--topics", "relayed", "--relay-client",
                                                        "--peers", boot, *common])
    sender = _probe(lab, lab.home(0), out, "sender", [
        "send", "--topics", "relayed,direct", "--relay-client", "--peers", boot, direct_addr, "--count",
        str(plan.count), "--burst", str(plan.burst), "--size", str(plan.size), "--gap-s", str(plan.gap_s),
        "--wait-relayed", "1", "--wait-subscribed", "direct", "--seconds", str(plan.timeout_s)])
    procs = [direct, relayed, sender]
    sent = _wait_file(out / "sender.json", procs, plan.timeout_s + 60)
    got = {name: _wait_file(out / f"{name}.json", procs, plan.timeout_s + 60) for name in ("relayed", "direct")}
    paths = {name: summarize(got[name], plan.count) for name in got}
    extra = {mode: (None if None in (paths["relayed"][mode]["p50_ms"], paths["direct"][mode]["p50_ms"])
                    else round(paths["relayed"][mode]["p50_ms"] - paths["direct"][mode]["p50_ms"], 2))
             for mode in ("single", "burst")}
    return {"plan": plan.__dict__, "sender": {"sent": sent.get("sent"), "error": sent.get("error"),
                                              "relayed_sent": sent.get("stats", {}).get("relayed_sent")},
            "paths": paths, "relay_extra_p50_ms": extra,
            "relayed_via_stream": got["relayed"]["stats"].get("relayed_received", 0),
            "raw": {name: got[name]["messages"] for name in got}}
