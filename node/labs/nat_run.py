"""Nodes behind real NAT (node/labs/netns.py), three scenarios with real processes:

exchange  two home nodes (`swarm-node join`, tiny preset), each behind its own masquerading router,
          and two public `swarm-node relay` boxes: the bootstrap box, declared public
          (swarm.nat.reachability=public: it answers AutoNAT from the start), and the public node
          under test (reachability auto). Relays on: the homes learn they are private, hold slots
          on both relays, find each other and train on each other's groups through a relay
          (protocol/transports/p2pd/relayed.py). Relays off (the control: relay_service and
          relay_client false everywhere): the homes can dial the public boxes but never each
          other, and the relay boxes forward no gossip, so neither trains a group of the other.
flood     the public node trains (`join`, relay service on) and a flooder in home 1
          (node.hostile.flood_origins on p2pd, holding a relay slot on it) sends it valid groups
          far over swarm.p2pd.flood_cut_rate; home 0 is an honest private node.
latency   node.labs.relay_probe processes: home 0 sends timestamped messages one at a time and
          in bursts, on a topic home 1 hears only through the relay and on one a public host hears
          directly (node/labs/relay_latency.py).

Figures come from each node's node.json (reachability, addresses), metrics.jsonl (groups used per
signer) and `swarm-node status` run inside its namespace (transport counters). Every wait is
bounded; every process is ended by its handle (NatLab.close).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from policy.ground import child_env
from node.service.relay import RELAY_STATUS_FILE
from node.labs.honest_heard import MetricsTail, read_json
from node.labs.netns import NatLab

ROOT = Path(__file__).resolve().parents[2]
PORT = 4001
RELAYS_OFF = ["--set", "swarm.nat.relay_client=false", "--set", "swarm.nat.relay_service=false"]


@dataclass(frozen=True)
class NatPlan:
    relays: bool = True       # the relay feature on (treatment) or off everywhere (control)
    train_s: float = 40.0     # how long the homes train once both are up
    min_round_s: float = 0.5  # pace of the home nodes (a tiny round takes milliseconds)
    start_timeout_s: float = 60.0
    flood_rate: float = 400.0  # flood scenario: messages/s of the flooder (cut above 80/s)


def node_json(run_dir: Path) -> dict:
    return read_json(run_dir / "node.json") or {}


def metrics_rows(run_dir: Path) -> list[dict]:
    return MetricsTail(run_dir / "metrics.jsonl").read()  # complete rows only: one may be being written


def used_from(run_dir: Path, signer: str) -> tuple[int, int | None, int]:
    """(groups trained from `signer`, first round that used one, rounds run)."""
    total, first, rows = 0, None, metrics_rows(run_dir)
    for row in rows:
        n = int((row.get("external_used_by_sender") or {}).get(signer, 0))
        total += n
        if n and first is None:
            first = row.get("round")
    return total, first, len(rows)


def status_counters(lab: NatLab, namespace: str, run_dir: Path) -> dict[str, int]:
    """The transport counters of `swarm-node status`, asked inside the node's namespace."""
    proc = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-m", "node.cli", "status",
                           "--run-dir", str(run_dir), "--json"], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"`swarm-node status` in {namespace} failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return {k: int(v) for k, v in json.loads(proc.stdout).get("transport_counters", {}).items()}


class NatSwarm:
    """Starts and watches the scenario's processes inside `lab`; results under `out`."""

    def __init__(self, lab: NatLab, out: Path, plan: NatPlan) -> None:
        self.lab, self.out, self.plan = lab, Path(out), plan
        self.out.mkdir(parents=True, exist_ok=True)
        self.dirs: dict[str, Path] = {}
        self.spaces: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, namespace: str, argv: list[str]) -> None:
        run_dir = self.dirs[name] = self.out / name
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "node.json").unlink(missing_ok=True)
        log = open(self.out / f"{name}.log", "ab")
        self.spaces[name] = namespace
        self.procs[name] = self.lab.popen(namespace, [sys.executable, "-m", "node.cli", *argv, "--run-dir",
                                                      str(run_dir)], cwd=ROOT, env=child_env(), stdout=log,
                                          stderr=log)

    def wait(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}: "
                                       f"see {self.out / (name + '.log')}")
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (logs in {self.out})")

    def addr(self, name: str) -> str:
        self.wait(lambda: node_json(self.dirs[name]).get("join_addrs"), f"{name} to listen", self.plan.start_timeout_s)
        return node_json(self.dirs[name])["join_addrs"][0]

    def start_publics(self, trains: bool = False) -> list[str]:
        """The bootstrap box (declared public) and the public node under test; their addresses."""
        off = [] if self.plan.relays else RELAYS_OFF
        lab = self.lab
        self._start("bootstrap", lab.public(0), ["relay", "--listen", f"/ip4/{lab.public_ip(0)}/tcp/{PORT}",
                                              "--set", "swarm.nat.reachability=public", *off])
        boot = self.addr("bootstrap")
        public_argv = (["join", *self.home_argv(), "--set", "swarm.min_round_s=0.2"] if trains else ["relay"])
        self._start("public", lab.public(1), [*public_argv, "--listen", f"/ip4/{lab.public_ip(1)}/tcp/{PORT}",
                                           "--peers", boot, *off])
        return [boot, self.addr("public")]

    def home_argv(self) -> list[str]:
        return ["--preset", "tiny", "--rounds", "1000000", "--quiet", "--set", "run.threads=1",
                "--set", f"swarm.min_round_s={self.plan.min_round_s}"]

    def start_home(self, i: int, peers: list[str]) -> None:
        off = [] if self.plan.relays else RELAYS_OFF
        self._start(f"home{i}", self.lab.home(i), ["join", *self.home_argv(), "--listen", f"/ip4/0.0.0.0/tcp/{PORT}",
                                                   "--peers", *peers, *off])

    def facts(self, name: str) -> dict:
        info = node_json(self.dirs[name])
        relay_stats = self.dirs[name] / RELAY_STATUS_FILE
        counters = (json.loads(relay_stats.read_text()) if relay_stats.exists()
                    else status_counters(self.lab, self.spaces[name], self.dirs[name]))
        return {"peer_id": info.get("peer_id"), "reachability": info.get("reachability"),
                "join_addrs": info.get("join_addrs", []),
                "relayed_addrs": sum("/p2p-circuit" in a for a in info.get("listen_addrs", [])),
                "counters": {k: v for k, v in counters.items() if not k.startswith("topic_peers:")}}


def run_exchange(lab: NatLab, out: Path, plan: NatPlan) -> dict:
    """The exchange scenario (see the module docstring); the figures as a dict."""
    swarm = NatSwarm(lab, out, plan)
    peers = swarm.start_publics()
    for i in (0, 1):
        swarm.start_home(i, peers)
    ids = {f"home{i}": swarm.addr(f"home{i}").rsplit("/p2p/", 1)[1] for i in (0, 1)}
    started = time.monotonic()
    relayed = (lambda h: any("/p2p-circuit" in a for a in node_json(swarm.dirs[h]).get("join_addrs", []))) \
        if plan.relays else (lambda h: True)  # the control waits for the same verdict, without relays
    swarm.wait(lambda: all(node_json(swarm.dirs[h]).get("reachability") == "private" and relayed(h) for h in ids),
               "both homes to learn they are private" + (" and hold relayed addresses" if plan.relays else ""), 90.0)
    reached_s = time.monotonic() - started
    time.sleep(plan.train_s)
    other = {"home0": "home1", "home1": "home0"}
    result = {"relays": plan.relays, "seconds_to_private": round(reached_s, 1),
              "train_s": plan.train_s, "nodes": {}}
    for name in ("bootstrap", "public", "home0", "home1"):
        result["nodes"][name] = swarm.facts(name)
    for home in ids:
        used, first, rounds = used_from(swarm.dirs[home], ids[other[home]])
        result["nodes"][home].update(used_from_other_home=used, first_round_using_other=first, rounds=rounds)
    return result


def run_flood(lab: NatLab, out: Path, plan: NatPlan) -> dict:
    """The flood scenario: the public node trains and relays while a relayed peer floods it."""
    swarm = NatSwarm(lab, out, plan)
    peers = swarm.start_publics(trains=True)
    swarm.start_home(0, peers)
    swarm.addr("home0")
    # home0's AutoNAT verdict first, as run_exchange waits for it: a public node busy with the flood
    # answers dial-back requests late, and the verdict is not what this scenario measures
    swarm.wait(lambda: node_json(swarm.dirs["home0"]).get("reachability") == "private",
               "home0 to learn it is private", 90.0)
    flood_s = plan.train_s
    summary = out / "flooder.json"
    log = open(out / "flooder.log", "ab")
    swarm.procs["flooder"] = lab.popen(lab.home(1), [
        sys.executable, "-m", "node.hostile.flood_origins", "--keys", "1", "--rate", str(plan.flood_rate),
        "--peers", peers[1], "--swarm", "main", "--seconds", str(flood_s), "--transport", "p2pd",
        "--listen", f"/ip4/0.0.0.0/tcp/{PORT}", "--set", "run.threads=1", "--out", str(summary)],
        cwd=ROOT, env=child_env(), stdout=log, stderr=log)
    swarm.wait(lambda: (json.loads(summary.read_text()).get("keys") if summary.exists() else None),
               "the flooder to start", plan.start_timeout_s)
    before = len(metrics_rows(swarm.dirs["public"]))
    time.sleep(flood_s + 5.0)
    flooder = json.loads(summary.read_text())
    key = flooder["keys"][0]
    rows = metrics_rows(swarm.dirs["public"])
    used_flooder = sum(int((r.get("external_used_by_sender") or {}).get(key, 0)) for r in rows)
    public = swarm.facts("public")
    return {"flood_s": flood_s, "flood_rate": plan.flood_rate, "flooder_published": flooder.get("published"),
            "public_rounds_during_flood": len(rows) - before, "public": public,
            "public_groups_from_flooder": used_flooder, "home0": swarm.facts("home0")}
