"""A testnet of real processes: every honest node is `swarm-node join` over libp2p on 127.0.0.1 with
its own identity, run dir, log and free ports; hostile peers are `python -m node.hostile.process`.

Faults: SIGKILL and restart from the run dir (checkpoint + same identity), partitions and delay /
loss through each node's fault file (protocol/transports/impairment.py: this machine's kernel has no netem).
Only processes this harness started are ever signalled, by their Popen handles. Every wait has a
timeout; a run that does not finish within the plan's timeout is stopped and reported as such.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from policy.ground import child_env
from node.observe.control import fetch_status
from node.testnet.plan import Plan, halves, node_overrides, node_rounds, restart_event, slowdown
from policy.checkpoint import latest_round
from protocol.transports.impairment import Impairment, parse_netem, write_impairment

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
STARTUP_S_PER_WAVE = 10.0  # what a node takes to import and listen on 2 busy cores: 7-15 s measured (libp2p)
STARTUP_S_PER_NODE = 1.5
POLL_S = 0.5
STATUS_EVERY_S = 3.0


def start_waves(n: int) -> list[list[int]]:
    """Node 0, then waves that double: [0], [1, 2], [3..6], [7..14], ...; each wave dials up to three
    nodes of the earlier waves, so the swarm is a mesh rather than a star around node 0."""
    waves, start, size = [[0]] if n else [], 1, 2
    while start < n:
        waves.append(list(range(start, min(n, start + size))))
        start, size = start + size, size * 2
    return waves


class MetricsTail:
    """Reads the rows a node appends to its metrics.jsonl, incrementally."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rows = path, 0, []

    def poll(self) -> None:
        if not self.path.is_file():
            return
        size = self.path.stat().st_size
        if size < self.offset:  # a restarted node truncated rounds after its checkpoint
            self.offset, self.rows = 0, []
        with self.path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return
        self.offset += len(complete) + 1
        for line in complete.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.rows = [r for r in self.rows if r["round"] < row["round"]] + [row]

    @property
    def round(self) -> int:
        return self.rows[-1]["round"] + 1 if self.rows else 0


class ProcessTestnet:
    def __init__(self, plan: Plan, mix: tuple[int, int], seed: int, out: Path, dashboard=None):
        self.plan, self.mix, self.seed, self.out = plan, mix, seed, Path(out)
        self.dashboard = dashboard
        self.procs: dict[int, subprocess.Popen] = {}
        self.hostile_procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.tails = {i: MetricsTail(self.run_dir(i) / "metrics.jsonl") for i in range(plan.nodes)}
        self.info: dict[int, dict] = {}
        self.status: dict[int, dict] = {}
        self.down_until: dict[int, int] = {}
        self.starting: dict[int, float] = {}  # restarted node -> deadline to be listening again
        self._status_at = 0.0
        self.events: list[dict] = []
        self.baseline = parse_netem(plan.netem) if plan.netem else Impairment()
        self.partitioned = False
        self.start_at = 0.0  # Unix time of every node's first round (set when the run starts)
        self.restarted_at: dict[int, float] = {}  # restarted node -> when (monotonic), until it listens

    def run_dir(self, index: int) -> Path:
        return self.out / f"node{index}"

    # -- processes ---------------------------------------------------------------------------
    def _command(self, index: int, peers: list[str]) -> list[str]:
        sets = [*node_overrides(self.plan, index, self.seed, self.mix),
                f"swarm.min_round_s={self.plan.min_round_s * slowdown(self.plan, index):g}",
                f"swarm.fault_file={self.run_dir(index) / 'faults.json'}", f"run.start_at={self.start_at:.3f}",
                f"swarm.transport={self.plan.transport}"]  # the hostile peers speak py-libp2p too
        cmd = [sys.executable, "-m", "node.cli", "join", "--preset", self.plan.preset, "--quiet",
               "--listen", "/ip4/127.0.0.1/tcp/0", "--swarm", f"testnet{self.seed}", "--run-dir", str(self.run_dir(index))]
        for item in sets:
            cmd += ["--set", item]
        return cmd + (["--peers", *peers] if peers else [])

    def _spawn(self, index: int, peers: list[str]) -> None:
        run_dir = self.run_dir(index)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_impairment(run_dir / "faults.json", self._impairment_for(index))
        (run_dir / "node.json").unlink(missing_ok=True)
        log = open(run_dir / "node.log", "ab")
        self.procs[index] = subprocess.Popen(self._command(index, peers), cwd=ROOT, stdout=log, stderr=log,
                                             env=child_env(), start_new_session=True)

    def _wait_listening(self, index: int) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = self.run_dir(index) / "node.json"
        while time.monotonic() < deadline:
            if path.is_file():
                info = json.loads(path.read_text())
                if info.get("pid") == self.procs[index].pid or self.procs[index].poll() is None:
                    self.info[index] = info
                    return info
            if self.procs[index].poll() is not None:
                raise RuntimeError(f"node{index} exited with {self.procs[index].returncode} while starting; "
                                   f"see {self.run_dir(index) / 'node.log'}")
            time.sleep(0.2)
        raise TimeoutError(f"node{index} did not listen within {START_TIMEOUT_S:.0f} s; "
                           f"see {self.run_dir(index) / 'node.log'}")

    def _live_addrs(self, limit: int | None = None) -> list[str]:
        addrs = [a for i, info in sorted(self.info.items()) if i in self.procs and self.procs[i].poll() is None
                 and i not in self.starting for a in info["listen_addrs"][:1]]
        return addrs[-limit:] if limit else addrs

    def _start_hostile(self) -> None:
        for count, kind in self.plan.hostile:
            for j in range(count):
                out = self.out / f"hostile-{kind}-{j}.json"
                cmd = [sys.executable, "-m", "node.hostile.process", "--kind", kind, "--peers", *self._live_addrs(3),
                       "--swarm", f"testnet{self.seed}", "--preset", self.plan.preset,
                       "--rounds", str(10**6), "--period-s", str(self.plan.min_round_s), "--out", str(out),
                       "--listen", "/ip4/127.0.0.1/tcp/0"]
                for item in self.plan.overrides:
                    cmd += ["--set", item]
                log = open(self.out / f"hostile-{kind}-{j}.log", "ab")
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
                                        env=child_env(PYTHONHASHSEED="0"))
                self.hostile_procs.append((kind, proc, out))

    def _stop(self, proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 15.0) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)

    # -- faults ------------------------------------------------------------------------------
    def _impairment_for(self, index: int) -> Impairment:
        blocked: frozenset[str] = frozenset()
        if self.partitioned:
            a, b = halves(self.plan.nodes)
            other = b if index in a else a
            blocked = frozenset(self.info[i]["peer_id"] for i in other if i in self.info)
        return Impairment(self.baseline.delay_s, self.baseline.jitter_s, self.baseline.loss, blocked)

    def _apply_schedule(self, clock: int, last_clock: int) -> None:
        for event in self.plan.kills:
            if last_clock < event.at_round <= clock:
                for index in event.nodes:
                    proc = self.procs.get(index)
                    if proc is not None and proc.poll() is None:
                        self._stop(proc, signal.SIGKILL)
                        self.down_until[index] = clock + event.down_rounds
                        self.events.append({"clock": clock, "event": f"node{index} SIGKILLed at round "
                                                                      f"{self.tails[index].round}"})
        training = any(self.tails[i].round < node_rounds(self.plan) for i, p in self.procs.items()
                       if p.poll() is None and i not in self.down_until)
        for index, until in list(self.down_until.items()):
            if clock >= until or not training:  # nobody left to advance the clock: restart now
                del self.down_until[index]
                self._spawn(index, self._live_addrs(3))  # not waited for: the schedule keeps its pace
                self.starting[index] = time.monotonic() + START_TIMEOUT_S
                self.restarted_at[index] = time.monotonic()
                self.events.append({"clock": clock, "event": restart_event(index, latest_round(self.run_dir(index)))})
        for part in self.plan.partitions:
            for at, state, label in ((part.start, True, "partition"), (part.end, False, "healed")):
                if last_clock < at <= clock:
                    self.partitioned = state
                    for index in range(self.plan.nodes):
                        write_impairment(self.run_dir(index) / "faults.json", self._impairment_for(index))
                    a, b = halves(self.plan.nodes)
                    self.events.append({"clock": clock, "event": f"{label} {a} | {b}",  # each node's own round too
                                        "rounds": {str(i): t.round for i, t in self.tails.items()}})

    # -- the run -----------------------------------------------------------------------------
    def _poll(self) -> int:
        for index, deadline in list(self.starting.items()):  # restarted nodes: listening yet?
            path = self.run_dir(index) / "node.json"
            if path.is_file():
                self.info[index] = json.loads(path.read_text())
                del self.starting[index]
                took = time.monotonic() - self.restarted_at.pop(index)
                self.events.append({"clock": self._clock(), "event": f"node{index} listening again after {took:.0f} s"})
            elif self.procs[index].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node{index} did not come back after its restart; see "
                                   f"{self.run_dir(index) / 'node.log'}")
        ask = time.monotonic() - self._status_at >= STATUS_EVERY_S  # gRPC status: less often than metrics
        if ask:
            self._status_at = time.monotonic()
        for index, tail in self.tails.items():
            tail.poll()
            info = self.info.get(index)
            proc = self.procs.get(index)
            if ask and info and index not in self.starting and proc is not None and proc.poll() is None:
                try:
                    self.status[index] = _status_dict(fetch_status(info["control"], timeout_s=1.0))
                except ConnectionError:
                    pass  # busy or just exiting: keep the last snapshot
        return self._clock()

    def _clock(self) -> int:
        """The swarm clock: the most advanced node's round."""
        return max((t.round for t in self.tails.values()), default=0)

    def run(self) -> dict:
        started = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        timed_out = False
        try:
            waves = start_waves(self.plan.nodes)
            # every node's first round starts at the same moment, once the slowest wave can be up
            self.start_at = time.time() + STARTUP_S_PER_WAVE * len(waves) + STARTUP_S_PER_NODE * self.plan.nodes
            for wave in waves:  # few waves: nodes start within seconds of each other
                known = self._live_addrs()
                for index in wave:  # each dials up to 3 earlier nodes, a different 3 per node
                    self._spawn(index, [known[(index + k) % len(known)] for k in range(min(3, len(known)))])
                for index in wave:
                    self._wait_listening(index)
            self._start_hostile()
            last_clock = -1
            while True:
                clock = self._poll()
                self._apply_schedule(clock, last_clock)
                last_clock = max(last_clock, clock)
                if self.dashboard is not None:
                    self.dashboard.update(self.snapshot())
                finished = [i for i in range(self.plan.nodes) if self.tails[i].round >= self.plan.rounds]
                if self.plan.duration_s is None and len(finished) == self.plan.nodes and not self.down_until \
                        and not self.starting:
                    break
                if self.plan.duration_s is not None and time.time() >= self.start_at + self.plan.duration_s:
                    break  # --duration: every node stops at the same wall time, whatever its round
                crashed = [i for i, p in self.procs.items() if p.poll() not in (None, 0) and i not in self.down_until
                           and p.returncode != -signal.SIGKILL]
                if crashed:
                    raise RuntimeError(f"node(s) {crashed} exited with an error; see their node.log")
                if time.monotonic() - started > self.plan.timeout_s:
                    timed_out = True
                    break
                time.sleep(POLL_S)
        finally:
            for _, proc, _ in self.hostile_procs:
                self._stop(proc)
            for proc in self.procs.values():
                self._stop(proc)
        hostile = []
        for kind, _, path in self.hostile_procs:
            summary = json.loads(path.read_text()) if path.is_file() else {"kind": kind, "identities": [], "counters": {}}
            hostile.append(summary)
        return {
            "transport": self.plan.transport, "mix": f"{self.mix[0]}/{self.mix[1]}", "seed": self.seed, "timed_out": timed_out,
            "nodes": [{"index": i, "run_dir": str(self.run_dir(i)), "peer_id": self.info.get(i, {}).get("peer_id"),
                       "slowdown": slowdown(self.plan, i), "overrides": node_overrides(self.plan, i, self.seed, self.mix),
                       "status": self.status.get(i, {})} for i in range(self.plan.nodes)],
            "hostile": hostile, "events": self.events, "seconds": time.monotonic() - started,
        }

    def snapshot(self) -> list[dict]:
        rows = []
        for index in range(self.plan.nodes):
            tail, status = self.tails[index], self.status.get(index, {})
            proc = self.procs.get(index)
            state = "killed" if index in self.down_until else "up" if proc and proc.poll() is None else "done"
            last = tail.rows[-1] if tail.rows else {}
            heldout = next((r["heldout_pass1"] for r in reversed(tail.rows) if "heldout_pass1" in r), None)
            rows.append({"node": index, "state": state, "round": tail.round, "reward": last.get("reward_mean"),
                         "heldout": heldout, "peers": len(status.get("connected", [])),
                         "accepted": status.get("accepted"), "rejected": sum(status.get("rejected_by_reason", {}).values())
                         if status else None, "ext_used": last.get("external_used")})
        return rows


def _status_dict(reply) -> dict:
    return {"peer_id": reply.peer_id, "accepted": reply.accepted, "connected": list(reply.connected_peers),
            "rejected_by_reason": dict(reply.rejected_by_reason), "observed": dict(reply.observed),
            "tiers_used": dict(reply.tier_rollouts), "transport": dict(reply.transport_counters),
            "hints": dict(reply.hint_counters),
            "peers": [{"peer_id": p.peer_id, "score": p.score, "banned": p.banned, "accepted": p.accepted,
                       "rejected": p.rejected} for p in reply.peers]}
