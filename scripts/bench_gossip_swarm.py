"""The processes of one scripts/bench_gossip.py swarm and the phases measured on it.

`Swarm` starts N node processes (scripts/bench_gossip_node.py) on 127.0.0.1 with one transport and
talks to them over their stdin/stdout; `run_one` drives the phases (start, mesh + warm-up, idle,
latency one at a time, latency under a burst, flood ingest) and returns one result dict. Every wait
has a timeout; nodes also exit at a hard deadline and when their stdin closes; only processes
started here are ended, by their Popen handles.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench_gossip_node import FLOOD_KIND, GROUP_COMPLETIONS, TOKENS_PER_COMPLETION, topics

NODE_SCRIPT = Path(__file__).resolve().parent / "bench_gossip_node.py"
ROOT = NODE_SCRIPT.parents[1]


def _fmt(x: float | None, digits: int = 1) -> str:
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
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
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
                    [sys.executable, str(NODE_SCRIPT), str(path)],
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


def run_one(n: int, transport: str, args: argparse.Namespace, rng: random.Random, console: Any) -> dict[str, Any]:
    """One full benchmark at N nodes over one transport; the result dict has 'error' on a failed phase."""
    t_start = time.time()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench_gossip_{transport}_n{n}_"))
    swarm = Swarm(n, transport, args, workdir, rng)
    res: dict[str, Any] = {"n": n, "transport": transport, "workdir": str(workdir),
                           "topology": {str(i): d for i, d in enumerate(swarm.topology)},
                           "loadavg_at_start": os.getloadavg()}
    our_ports = set(swarm.ports)
    tokens_per_group = GROUP_COMPLETIONS * TOKENS_PER_COMPLETION
    console.print(f"[bold]{transport}, N = {n}[/bold]: topology (node -> bootstrap peers it dials): "
                  + ", ".join(f"{i}->{'/'.join(map(str, d))}" for i, d in enumerate(swarm.topology) if d))
    everyone = list(range(n))
    pubs = sorted({max(1, min(n - 1, round(k * (n - 1) / max(1, args.publishers)))) for k in range(1, args.publishers + 1)}) if n > 1 else [0]
    senders = sorted({max(1, min(n - 1, round(k * (n - 1) / max(1, args.flood_senders)))) for k in range(1, args.flood_senders + 1)}) if n > 1 else []
    res["publishers"], res["flood_senders"] = pubs, senders
    cpu0: dict[int, float] = {}
    try:
        swarm.spawn()
        # ---- start -------------------------------------------------------------------------
        ok = swarm.pump_until(lambda: all(swarm.inbox.get((i, "ready")) or swarm.inbox.get((i, "error"))
                                          or i in swarm.eof for i in everyone), start_timeout_s(n, args))
        errors = {i: swarm.take(i, "error") for i in everyone if swarm.inbox.get((i, "error"))}
        if errors or not ok:
            not_ready = [i for i in everyone if not swarm.inbox.get((i, "ready"))]
            raise PhaseTimeout(f"nodes not started: {not_ready}; errors: {errors} (logs in {workdir})")
        ready = {i: swarm.take(i, "ready") for i in everyone}
        res["start_s"] = round(max(e["t"] for e in ready.values()) - t_start, 2)
        res["worker_import_s_max"] = round(max(e["import_s"] for e in ready.values()), 2)
        res["worker_first_line_s_max"] = round(max(e["t_proc"] for e in ready.values()) - t_start, 2)
        console.print(f"  {n} processes listening after {res['start_s']:.1f} s")
        # ---- mesh --------------------------------------------------------------------------
        t_mesh = time.time()
        roll_topic, flood_topic = topics()
        statuses: dict[int, dict] = {}
        formed = False
        while time.time() - t_mesh < args.mesh_timeout:
            statuses = swarm.request_all(everyone, "status", "status", 10.0)
            # libp2p reports its GossipSub mesh; p2pd's daemon does not expose one: connected peers
            if all(s["peers"] >= 1 and (s["mesh"] is None or s["mesh"].get(roll_topic, 0) >= 1)
                   for s in statuses.values()):
                formed = True
                break
            time.sleep(0.25)
        res["peers_per_node"] = [statuses[i]["peers"] for i in everyone] if statuses else None
        res["mesh_per_node"] = mesh_degrees(statuses, everyone, roll_topic)
        if not formed:
            raise PhaseTimeout(f"mesh not formed within {args.mesh_timeout:.0f} s: peers {res['peers_per_node']}, "
                               f"mesh {res['mesh_per_node']}")
        # warm-up: one message from node 0 and from every publisher must reach every other node
        warm_ok = False
        for attempt in range(1, 4):
            swarm.inbox.clear()
            warm_from = sorted(set([0] + pubs))
            for i in warm_from:
                swarm.send(i, cmd="publish", n=1, spacing=0, tag="warm")
            swarm.pump_until(lambda: all(swarm.inbox.get((i, "published")) for i in warm_from), 10.0)
            digests = {}
            for i in warm_from:
                event = swarm.take(i, "published")
                if event:
                    digests[event["items"][0][0]] = i
            done = swarm.pump_until(lambda: len(digests) == len(warm_from) and all(
                len(set(swarm.arrivals.get(d, {})) - {src}) >= n - 1 for d, src in digests.items()),
                args.warmup_timeout)
            if done:
                warm_ok = True
                res["warmup_attempts"] = attempt
                break
        res["mesh_s"] = round(time.time() - t_mesh, 2)
        if not warm_ok:
            raise PhaseTimeout(f"warm-up messages did not reach all {n} nodes in 3 attempts")
        statuses = swarm.request_all(everyone, "status", "status", 10.0)
        res["peers_per_node"] = [statuses[i]["peers"] for i in everyone]
        res["mesh_per_node"] = mesh_degrees(statuses, everyone, roll_topic)
        console.print(f"  mesh formed and warm-up delivered to all after {res['mesh_s']:.1f} s; connections per node "
                      f"{res['peers_per_node']}; mesh degree per node {res['mesh_per_node']}")

        # ---- (0) idle cost ----------------------------------------------------------------
        cpu_idle0, t_idle = {i: statuses[i]["cpu"] for i in everyone}, time.time()
        time.sleep(args.idle_s)
        statuses = swarm.request_all(everyone, "status", "status", 10.0)
        idle_wall = time.time() - t_idle
        cpu_idle = sum(statuses[i]["cpu"] - cpu_idle0[i] for i in everyone)
        res["idle"] = {"wall_s": round(idle_wall, 2), "cpu_s_all_nodes": round(cpu_idle, 2),
                       "cores_busy": round(cpu_idle / idle_wall, 3), "loadavg_1m": os.getloadavg()[0]}
        console.print(f"  idle: {n} nodes use {res['idle']['cores_busy']:.2f} cores doing nothing "
                      f"(heartbeats + {args.poll_ms:g} ms drain polling); 1-min load average {os.getloadavg()[0]:.1f}")

        def latency_stats(published: dict[str, tuple[int, float]], wall: float, cpu: float,
                          wire_bytes: int) -> dict[str, Any]:
            reach_all, per_delivery, per_delivery_transport, incomplete = [], [], [], 0
            for d, (src, t_pub) in published.items():
                arr = {i: v for i, v in swarm.arrivals.get(d, {}).items() if i != src}
                per_delivery += [(t - t_pub) * 1e3 for t, _ in arr.values()]
                per_delivery_transport += [(tr - t_pub) * 1e3 for _, tr in arr.values()]
                if len(arr) == n - 1:
                    reach_all.append(max(t for t, _ in arr.values()) * 1e3 - t_pub * 1e3)
                else:
                    incomplete += 1
            expected = len(published) * (n - 1)
            deliveries = len(per_delivery)
            return {
                "messages": len(published), "deliveries_expected": expected,
                "deliveries": deliveries, "messages_incomplete": incomplete,
                "delivery_ratio": deliveries / expected if expected else None,
                # CPU of every node process and its children (the p2pd daemons), idle share included
                "cpu_s_per_delivery": cpu / deliveries if deliveries else None,
                # every TCP byte between the nodes (framing, encryption, gossip control, duplicates)
                "wire_bytes": wire_bytes,
                "wire_bytes_per_delivered_token": (wire_bytes / (deliveries * tokens_per_group)
                                                   if deliveries and wire_bytes else None),
                "reach_all_ms": {"p50": pct(reach_all, 50), "p95": pct(reach_all, 95),
                                 "max": max(reach_all, default=None)},
                "per_delivery_ms": {"p50": pct(per_delivery, 50), "p95": pct(per_delivery, 95),
                                    "max": max(per_delivery, default=None)},
                # received_at stamped by the transport (before Ingress) for comparison
                "per_delivery_transport_ms": {"p50": pct(per_delivery_transport, 50),
                                              "p95": pct(per_delivery_transport, 95)},
                "reach_all_samples_ms": sorted(round(x, 3) for x in reach_all),
                "per_delivery_samples_ms": sorted(round(x, 3) for x in per_delivery),
                "wall_s": round(wall, 2), "cpu_s_all_nodes": round(cpu, 2),
                "cores_busy": round(cpu / wall, 2) if wall > 0 else None,
                "loadavg_1m": os.getloadavg()[0],
            }

        def reached_all(d: str, src: int) -> bool:
            return len(set(swarm.arrivals.get(d, {})) - {src}) >= n - 1

        # ---- (1a) latency, one message in flight at a time ---------------------------------
        size = 0
        if args.isolated:
            cpu0, t_iso = {i: statuses[i]["cpu"] for i in everyone}, time.time()
            tcp0 = tcp_bytes_received(our_ports)
            published_iso: dict[str, tuple[int, float]] = {}
            for k in range(args.isolated):
                src = pubs[k % len(pubs)]
                swarm.inbox.pop((src, "published"), None)
                swarm.send(src, cmd="publish", n=1, spacing=0, tag="iso")
                swarm.pump_until(lambda: bool(swarm.inbox.get((src, "published"))), 10.0)
                event = swarm.take(src, "published")
                if event is None:
                    raise PhaseTimeout(f"publisher {src} did not report its publish")
                d, t = event["items"][0]
                size = event["size"]
                published_iso[d] = (src, t)
                swarm.pump_until(lambda: reached_all(d, src), args.isolated_timeout)
                time.sleep(0.02)
            iso_wall = time.time() - t_iso
            wire_iso = wire_bytes_between(tcp0, tcp_bytes_received(our_ports))
            statuses = swarm.request_all(everyone, "status", "status", 10.0)
            cpu_iso = sum(statuses[i]["cpu"] - cpu0[i] for i in everyone)
            res["latency_isolated"] = {"publishers": len(pubs), "envelope_bytes": size,
                                       **latency_stats(published_iso, iso_wall, cpu_iso, wire_iso)}
            li = res["latency_isolated"]
            console.print(f"  latency, one message at a time: {li['deliveries']}/{li['deliveries_expected']} deliveries, "
                          f"reach-all p50 {_fmt(li['reach_all_ms']['p50'])} ms p95 {_fmt(li['reach_all_ms']['p95'])} ms")

        # ---- (1b) latency under a burst: P publishers x M messages, spacing s ---------------
        cpu0 = {i: statuses[i]["cpu"] for i in everyone}
        tcp0 = tcp_bytes_received(our_ports)
        t_lat = time.time()
        swarm.inbox.clear()
        for i in pubs:
            swarm.send(i, cmd="publish", n=args.messages, spacing=args.spacing_ms / 1000.0, tag="lat")
        pub_window = args.messages * args.spacing_ms / 1000.0
        swarm.pump_until(lambda: all(swarm.inbox.get((i, "published")) for i in pubs), pub_window + 30.0)
        published: dict[str, tuple[int, float]] = {}
        for i in pubs:
            event = swarm.take(i, "published")
            if event is None:
                raise PhaseTimeout(f"publisher {i} did not report its publishes")
            size = event["size"]
            for d, t in event["items"]:
                published[d] = (i, t)
        expected = len(published) * (n - 1)

        def delivered() -> int:
            return sum(len(set(swarm.arrivals.get(d, {})) - {src}) for d, (src, _) in published.items())

        swarm.pump_until(lambda: delivered() >= expected, args.delivery_timeout)
        lat_wall = time.time() - t_lat
        wire_lat = wire_bytes_between(tcp0, tcp_bytes_received(our_ports))
        statuses = swarm.request_all(everyone, "status", "status", 10.0)
        cpu_lat = sum(statuses[i]["cpu"] - cpu0[i] for i in everyone)
        res["latency"] = {
            "publishers": len(pubs), "messages_per_publisher": args.messages, "spacing_ms": args.spacing_ms,
            "offered_msgs_per_s": len(pubs) * 1000.0 / args.spacing_ms if args.spacing_ms else None,
            "envelope_bytes": size, **latency_stats(published, lat_wall, cpu_lat, wire_lat),
        }
        lat = res["latency"]
        lat["cpu_ms_per_delivery_above_idle"] = (
            (cpu_lat - res["idle"]["cores_busy"] * lat_wall) * 1e3 / lat["deliveries"] if lat["deliveries"] else None)
        console.print(f"  latency, burst ({len(pubs)} publishers x {args.messages} every {args.spacing_ms:g} ms): "
                      f"{lat['deliveries']}/{expected} deliveries, reach-all p50 "
                      f"{_fmt(lat['reach_all_ms']['p50'])} ms p95 {_fmt(lat['reach_all_ms']['p95'])} ms; "
                      f"{lat['cores_busy']} cores busy, {_fmt(lat['cpu_ms_per_delivery_above_idle'])} ms CPU per delivery "
                      f"above idle")

        # ---- (2) flood ingest on node 0 ----------------------------------------------------
        if senders:
            per_sender = max(1, args.flood // len(senders))
            # warm the fanout route: one message from each sender must reach node 0
            swarm.request_all([0], "flood_reset", "flood_reset", 10.0)
            for i in senders:
                swarm.send(i, cmd="publish", topic=FLOOD_KIND, n=1, spacing=0, tag="flood-warm")
            warm = False
            deadline = time.monotonic() + args.warmup_timeout
            while time.monotonic() < deadline:
                rep = swarm.request_all([0], "flood_report", "flood_report", 10.0)[0]
                if rep["ok"] >= len(senders):
                    warm = True
                    break
                time.sleep(0.2)
            res["flood_warmup_verified"] = f"{rep['ok']}/{len(senders)}"
            if not warm:  # measured anyway: the delivery ratio shows what the cold routes lose
                console.print(f"  flood warm-up incomplete: node 0 verified {rep['ok']}/{len(senders)} senders' "
                              f"first message within {args.warmup_timeout:.0f} s", style="yellow")
            prepared = swarm.request_all(senders, "flood_prepare", "flood_ready", 60.0, n=per_sender)
            swarm.request_all([0], "flood_reset", "flood_reset", 10.0)
            statuses = swarm.request_all(everyone, "status", "status", 10.0)
            cpu1 = {i: statuses[i]["cpu"] for i in everyone}
            stats0 = statuses[0]["stats"]
            t_flood = time.time()
            for i in senders:
                swarm.send(i, cmd="flood_go")
            total = per_sender * len(senders)
            swarm.pump_until(lambda: all(swarm.inbox.get((i, "flood_sent")) for i in senders), args.flood_timeout)
            sent = {i: swarm.take(i, "flood_sent") for i in senders}
            last_ok, last_change = -1, time.monotonic()
            rep = {}
            deadline = time.monotonic() + args.flood_timeout
            while time.monotonic() < deadline:
                rep = swarm.request_all([0], "flood_report", "flood_report", 10.0)[0]
                if rep["ok"] + rep["bad"] >= total:
                    break
                if rep["ok"] != last_ok:
                    last_ok, last_change = rep["ok"], time.monotonic()
                elif time.monotonic() - last_change > 5.0:
                    break  # nothing new for 5 s: the rest was lost
                time.sleep(0.1)
            flood_wall = time.time() - t_flood
            statuses = swarm.request_all(everyone, "status", "status", 10.0)
            cpu_flood = sum(statuses[i]["cpu"] - cpu1[i] for i in everyone)
            cpu_target = statuses[0]["cpu"] - cpu1[0]
            stats0b = statuses[0]["stats"]
            span = (rep["last_done"] - rep["first_rx"]) if rep.get("last_done") and rep.get("first_rx") else None
            rx_span = (rep["last_rx"] - rep["first_rx"]) if rep.get("last_rx") and rep.get("first_rx") else None
            send_done = max((e["t_pumped"] for e in sent.values() if e), default=None)
            send_start = min((e["t0"] for e in sent.values() if e), default=None)
            res["flood"] = {
                "target": 0, "senders": len(senders), "messages": total, "verified": rep.get("ok", 0),
                "envelope_bytes": max(e["size"] for e in prepared.values()),
                "rejected": rep.get("rejected"), "lost": total - rep.get("ok", 0) - rep.get("bad", 0),
                "delivery_ratio": rep.get("ok", 0) / total if total else None,
                # end to end: first arrival at node 0's transport -> last verified by its Ingress
                "ingest_msgs_per_s": (rep["ok"] / span) if span else None,
                # the transport alone: messages handed to node 0's inbox per second of arrivals
                "transport_rx_msgs_per_s": (rep.get("rx", 0) / rx_span) if rx_span else None,
                "verify_busy_s": round(rep.get("busy_s", 0.0), 3),
                "verify_msgs_per_s_busy": (rep["ok"] / rep["busy_s"]) if rep.get("busy_s") else None,
                "max_backlog": rep.get("max_backlog"), "drain_batches": rep.get("batches"),
                "senders_pumped_msgs_per_s": (total / (send_done - send_start)) if send_done and send_start
                and send_done > send_start else None,
                "target_inbox_dropped": stats0b.get("dropped_inbound_full", 0) - stats0.get("dropped_inbound_full", 0),
                "wall_s": round(flood_wall, 2), "cpu_s_all_nodes": round(cpu_flood, 2),
                "cpu_s_target": round(cpu_target, 2),
                "cpu_s_target_per_verified": cpu_target / rep["ok"] if rep.get("ok") else None,
                "cores_busy": round(cpu_flood / flood_wall, 2) if flood_wall > 0 else None,
            }
            f = res["flood"]
            console.print(f"  flood: node 0 verified {f['verified']}/{total} ({f['envelope_bytes']} B each) at "
                          f"{_fmt(f['ingest_msgs_per_s'], 0)} msg/s end to end; transport alone "
                          f"{_fmt(f['transport_rx_msgs_per_s'], 0)} msg/s; Ingress alone (busy-verify rate) "
                          f"{_fmt(f['verify_msgs_per_s_busy'], 0)} msg/s")

        # ---- totals ------------------------------------------------------------------------
        reports = swarm.request_all(everyone, "report", "report", 10.0)
        keys = ("published", "received", "dropped_inbound", "dropped_outbound", "bad_streams",
                "dial_failures", "reconnects")
        res["transport_totals"] = {k: sum(r["stats"].get(k, 0) for r in reports.values()) for k in keys}
        rej: dict[str, int] = {}
        for r in reports.values():
            for k, v in r["rejected"].items():
                rej[k] = rej.get(k, 0) + v
        res["ingress_rejected_latency_topic"] = rej
        mux: dict[str, int] = {}
        for r in reports.values():
            for k, v in (r.get("muxers") or {}).items():
                mux[k] = mux.get(k, 0) + v
        res["muxers_negotiated"] = mux  # connection ends, both sides counted
    except PhaseTimeout as e:
        res["error"] = str(e)
        console.print(f"  {transport}, N = {n} failed: {e}", style="red", markup=False)
    finally:
        res["dead_before_shutdown"] = swarm.dead()
        res["shutdown"] = swarm.shutdown(args.shutdown_timeout)
        res["log_findings"] = scan_logs(swarm.logs)
        res["wall_s"] = round(time.time() - t_start, 2)
        for cfg_file in workdir.glob("node*.json"):  # they hold (throwaway) key seeds
            cfg_file.unlink(missing_ok=True)
        if args.keep_logs or res.get("error"):
            console.print(f"  worker logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            res["workdir"] = None
    return res


def scan_logs(paths: list[Path]) -> dict[str, Any]:
    """The workers' stderr (libp2p and our logs): distinct messages (peer ids and numbers masked),
    most frequent first, with the nodes that logged them."""
    import re

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
