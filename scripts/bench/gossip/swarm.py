"""The processes of one scripts/bench/gossip/bench.py swarm.

`Swarm` starts N node processes (`python -m scripts.bench.gossip.node`) on 127.0.0.1 with one transport and
talks to them over their stdin/stdout; scripts/bench/gossip/phases.py drives the measured phases on
it. Every wait has a timeout; nodes also exit at a hard deadline and when their stdin closes; only
processes started here are ended, by their Popen handles.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from scripts.common import ROOT

NODE_MODULE = "scripts.bench.gossip.node"  # run with -m from the repository root


def fmt(x: float | None, digits: int = 1) -> str:
    """A figure for the tables: thousands separated, `digits` decimals, '-' for none."""
    return "-" if x is None else f"{x:,.{digits}f}"


class PhaseTimeout(RuntimeError):
    pass


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no data."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_SS_BYTES = re.compile(r"bytes_received:(\d+)")


def tcp_bytes_received(ports: set[int]) -> dict[tuple[str, str], int]:
    """bytes_received of every established TCP socket on this host with a local or peer port in
    ``ports`` (from `ss -tin`), keyed by (local, peer). Both ends of each connection between our
    nodes are listed, so the sum over sockets is every byte the nodes sent each other, framing,
    encryption and gossip control traffic included. {} when `ss` is unavailable."""
    try:
        out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[tuple[str, str], int] = {}
    key: tuple[str, str] | None = None
    for line in out.splitlines():
        if line and not line[0].isspace():
            fields = line.split()
            key = None
            if len(fields) >= 4:
                local, peer = fields[2], fields[3]
                try:
                    if int(local.rsplit(":", 1)[1]) in ports or int(peer.rsplit(":", 1)[1]) in ports:
                        key = (local, peer)
                except (IndexError, ValueError):
                    key = None
        elif key is not None:
            match = _SS_BYTES.search(line)
            if match:
                found[key] = int(match.group(1))
    return found


def wire_bytes_between(before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]) -> int:
    """Bytes received on our sockets between two snapshots (a socket opened since counts from 0)."""
    return sum(v - before.get(k, 0) for k, v in after.items() if v >= before.get(k, 0))


class Swarm:
    """N worker processes plus the event plumbing to talk to them."""

    def __init__(self, n: int, transport: str, args: argparse.Namespace, workdir: Path, rng: random.Random) -> None:
        from protocol import NodeIdentity

        self.n = n
        self.transport = transport
        self.args = args
        self.workdir = workdir
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.inbox: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self.arrivals: dict[str, dict[int, tuple[float, float]]] = {}
        self.eof: set[int] = set()
        seeds = [os.urandom(32) for _ in range(n)]
        self.peer_ids = [NodeIdentity.from_seed(s).peer_id() for s in seeds]
        ports = free_ports(n)
        self.addrs = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{pid}" for p, pid in zip(ports, self.peer_ids)]
        # Topology: every node dials node 0, and (from node 2 on) one random earlier node.
        self.topology: list[list[int]] = [[]]
        for i in range(1, n):
            dials = [0]
            if i >= 2:
                dials.append(rng.randrange(1, i))
            self.topology.append(dials)
        self.deadline = time.time() + worker_deadline_s(n, args)
        self.seeds = seeds
        self.ports = ports

    # -- processes ---------------------------------------------------------------------------
    def spawn(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for i in range(self.n):
            cfg = {
                "index": i, "transport": self.transport, "seed": self.seeds[i].hex(),
                "listen": f"/ip4/127.0.0.1/tcp/{self.ports[i]}",
                "bootstrap": [self.addrs[j] for j in self.topology[i]], "flood_target": i == 0,
                "poll_ms": self.args.poll_ms, "deadline": self.deadline,
            }
            path = self.workdir / f"node{i}.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds a key seed
            with os.fdopen(fd, "w") as fh:
                json.dump(cfg, fh)
            log_path = self.workdir / f"node{i}.log"
            self.logs.append(log_path)
            with open(log_path, "wb") as log_fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", NODE_MODULE, str(path)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fh, cwd=str(ROOT), env=env,
                )
            self.procs.append(proc)
            threading.Thread(target=self._reader, args=(i, proc), daemon=True).start()

    def _reader(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            self.events.put((i, event))
        self.events.put((i, {"ev": "eof"}))

    def send(self, i: int, **cmd: Any) -> None:
        proc = self.procs[i]
        if proc.poll() is not None or proc.stdin is None:
            return
        try:
            proc.stdin.write((json.dumps(cmd) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def shutdown(self, timeout: float) -> dict[str, Any]:
        t0 = time.time()
        for i in range(len(self.procs)):
            self.send(i, cmd="quit")
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        killed = []
        for i, proc in enumerate(self.procs):
            if proc.poll() is None:
                proc.kill()  # only our own child, by its handle
                killed.append(i)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        for proc in self.procs:
            for fh in (proc.stdin, proc.stdout):
                try:
                    if fh:
                        fh.close()
                except OSError:
                    pass
        self.pump_until(lambda: False, 0.05)
        byes = [e.get("close_s") for (i, kind), evs in self.inbox.items() if kind == "bye" for e in evs]
        return {"shutdown_s": round(time.time() - t0, 2), "killed": killed,
                "exit_codes": [p.returncode for p in self.procs],
                "transport_close_s_max": round(max(byes), 2) if byes else None}

    # -- events ------------------------------------------------------------------------------
    def pump_until(self, cond: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if cond():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                i, event = self.events.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            self._dispatch(i, event)
            while True:  # take everything already queued
                try:
                    i, event = self.events.get_nowait()
                except queue.Empty:
                    break
                self._dispatch(i, event)

    def _dispatch(self, i: int, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "rx":
            self.arrivals.setdefault(event["d"], {})[i] = (event["t"], event["tr"])
        elif kind == "eof":
            self.eof.add(i)
        else:
            self.inbox.setdefault((i, kind), []).append(event)

    def take(self, i: int, kind: str) -> dict[str, Any] | None:
        box = self.inbox.get((i, kind))
        return box.pop(0) if box else None

    def request_all(self, nodes: list[int], cmd: str, reply: str, timeout: float, **kw: Any) -> dict[int, dict]:
        for i in nodes:
            self.inbox.pop((i, reply), None)
            self.send(i, cmd=cmd, **kw)
        ok = self.pump_until(lambda: all(self.inbox.get((i, reply)) or i in self.eof for i in nodes), timeout)
        if not ok:
            missing = [i for i in nodes if not self.inbox.get((i, reply))]
            raise PhaseTimeout(f"no '{reply}' from nodes {missing} within {timeout:.0f} s")
        out = {}
        for i in nodes:
            event = self.take(i, reply)
            if event is None:
                raise PhaseTimeout(f"node {i} exited (see {self.logs[i]})")
            out[i] = event
        return out

    def dead(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is not None]


def start_timeout_s(n: int, args: argparse.Namespace) -> float:
    """N processes import their transport at once on a shared machine: allow time in proportion."""
    return args.start_timeout if args.start_timeout is not None else 60.0 + 3.0 * n


def worker_deadline_s(n: int, args: argparse.Namespace) -> float:
    """A node process exits by itself this long after its swarm started, whatever happens."""
    return args.worker_deadline if args.worker_deadline is not None else 360.0 + 8.0 * n


def mesh_degrees(statuses: dict[int, dict], nodes: list[int], topic: str) -> list[int] | None:
    if not statuses or any(statuses[i]["mesh"] is None for i in nodes):
        return None
    return [statuses[i]["mesh"].get(topic, 0) for i in nodes]


def scan_logs(paths: list[Path]) -> dict[str, Any]:
    """The workers' stderr (libp2p and our logs): distinct messages (peer ids and numbers masked),
    most frequent first, with the nodes that logged them."""
    mask = [(re.compile(r"12D3KooW[1-9A-HJ-NP-Za-km-z]+"), "<peer>"), (re.compile(r"\d+"), "N")]
    counts: dict[str, int] = {}
    nodes: dict[str, set[int]] = {}
    for k, p in enumerate(paths):
        try:
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if not line:
                continue
            # our own format starts with a timestamp and "nodeK": keep from the logger name on
            m = re.match(r"^\S+ \S+ node\d+ (.*)$", line)
            text = m.group(1) if m else line
            for rx, rep in mask:
                text = rx.sub(rep, text)
            text = text[:200]
            counts[text] = counts.get(text, 0) + 1
            nodes.setdefault(text, set()).add(k)
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:12]
    return {"lines": sum(counts.values()),
            "top": [{"count": c, "nodes": sorted(nodes[t]), "message": t} for t, c in top]}
