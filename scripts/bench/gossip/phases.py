"""The phases of one scripts/bench/gossip/bench.py run at N nodes over one transport (scripts/bench/gossip/swarm.py
starts and talks to the processes).

`run_one` drives them in order: start, mesh + warm-up, idle, latency one at a time, latency under a
burst, flood ingest, totals; and returns one result dict, with 'error' when a phase timed out. Every
wait has a timeout; the swarm is shut down whatever happens.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.transports.options import Libp2pOptions
from scripts.bench.gossip.conns import connection_figures, dial_target, settle
from scripts.bench.gossip.node import FLOOD_KIND, GROUP_COMPLETIONS, TOKENS_PER_COMPLETION, topics
from scripts.bench.gossip.swarm import (
    PhaseTimeout, Swarm, fmt, mesh_degrees, pct, scan_logs, start_timeout_s, tcp_bytes_received, wire_bytes_between,
)

TOKENS_PER_GROUP = GROUP_COMPLETIONS * TOKENS_PER_COMPLETION
MESH_SETTLE_S = 5.0  # at most this long past the first mesh for it to fill (five heartbeats)


@dataclass
class Bench:
    """What the phases of one run share: the swarm, the settings, the result being filled in, and the
    nodes' latest status replies (each phase measures CPU from the previous one's)."""

    swarm: Swarm
    args: argparse.Namespace
    console: Any
    res: dict[str, Any]
    pubs: list[int]
    senders: list[int]
    t_start: float
    statuses: dict[int, dict] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.swarm.n

    @property
    def everyone(self) -> list[int]:
        return list(range(self.swarm.n))

    def refresh_statuses(self) -> dict[int, dict]:
        self.statuses = self.swarm.request_all(self.everyone, "status", "status", 10.0)
        return self.statuses

    def cpu_now(self) -> dict[int, float]:
        return {i: self.statuses[i]["cpu"] for i in self.everyone}

    def cpu_since(self, cpu0: dict[int, float]) -> float:
        return sum(self.statuses[i]["cpu"] - cpu0[i] for i in self.everyone)


def spread(n: int, count: int) -> list[int]:
    """`count` node indices spread evenly over 1..n-1 (node 0 is the flood target)."""
    return sorted({max(1, min(n - 1, round(k * (n - 1) / max(1, count)))) for k in range(1, count + 1)})


def run_one(n: int, transport: str, args: argparse.Namespace, rng: random.Random, console: Any) -> dict[str, Any]:
    """One full benchmark at N nodes over one transport; the result dict has 'error' on a failed phase."""
    t_start = time.time()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench_gossip_{transport}_n{n}_"))
    swarm = Swarm(n, transport, args, workdir, rng)
    res: dict[str, Any] = {"n": n, "transport": transport, "workdir": str(workdir),
                           "topology": {str(i): d for i, d in enumerate(swarm.topology)},
                           "loadavg_at_start": os.getloadavg()}
    console.print(f"[bold]{transport}, N = {n}[/bold]: topology (node -> bootstrap peers it dials): "
                  + ", ".join(f"{i}->{'/'.join(map(str, d))}" for i, d in enumerate(swarm.topology) if d))
    pubs = spread(n, args.publishers) if n > 1 else [0]
    senders = spread(n, args.flood_senders) if n > 1 else []
    res["publishers"], res["flood_senders"] = pubs, senders
    bench = Bench(swarm, args, console, res, pubs, senders, t_start)
    try:
        swarm.spawn()
        start(bench)
        mesh_and_warm_up(bench)
        idle(bench)
        if args.isolated:
            latency_isolated(bench)
        latency_burst(bench)
        if senders:
            flood(bench)
        totals(bench)
    except PhaseTimeout as e:
        res["error"] = str(e)
        console.print(f"  {transport}, N = {n} failed: {e}", style="red", markup=False)
    finally:
        finish(bench, workdir)
    return res


def start(b: Bench) -> None:
    swarm, res, everyone = b.swarm, b.res, b.everyone
    ok = swarm.pump_until(lambda: all(swarm.inbox.get((i, "ready")) or swarm.inbox.get((i, "error"))
                                      or i in swarm.eof for i in everyone), start_timeout_s(b.n, b.args))
    errors = {i: swarm.take(i, "error") for i in everyone if swarm.inbox.get((i, "error"))}
    if errors or not ok:
        not_ready = [i for i in everyone if not swarm.inbox.get((i, "ready"))]
        raise PhaseTimeout(f"nodes not started: {not_ready}; errors: {errors} (logs in {swarm.workdir})")
    ready = {i: swarm.take(i, "ready") for i in everyone}
    res["start_s"] = round(max(e["t"] for e in ready.values()) - b.t_start, 2)
    res["worker_import_s_max"] = round(max(e["import_s"] for e in ready.values()), 2)
    res["worker_first_line_s_max"] = round(max(e["t_proc"] for e in ready.values()) - b.t_start, 2)
    b.console.print(f"  {b.n} processes listening after {res['start_s']:.1f} s")


def mesh_and_warm_up(b: Bench) -> None:
    res, everyone = b.res, b.everyone
    t_mesh = time.time()
    roll_topic, _ = topics()
    wait_for_mesh(b, roll_topic)
    settle(b)  # bounded p2pd: until every node is within its connection bound
    # warm-up: one message from node 0 and from every publisher must reach every other node
    attempts = warm_up(b)
    if attempts:
        res["warmup_attempts"] = attempts
    res["mesh_s"] = round(time.time() - t_mesh, 2)
    if not attempts:
        raise PhaseTimeout(f"warm-up messages did not reach all {b.n} nodes in 3 attempts")
    statuses = b.refresh_statuses()
    res["peers_per_node"] = [statuses[i]["peers"] for i in everyone]
    res["connections"] = connection_figures(statuses)
    res["mesh_per_node"] = mesh_degrees(statuses, everyone, roll_topic)
    b.console.print(f"  mesh formed and warm-up delivered to all after {res['mesh_s']:.1f} s; connections per node "
                    f"{res['peers_per_node']}; mesh degree per node {res['mesh_per_node']}")


def wait_for_mesh(b: Bench, roll_topic: str) -> None:
    res, everyone = b.res, b.everyone
    t_mesh = time.time()
    statuses: dict[int, dict] = {}
    formed = False
    while time.time() - t_mesh < b.args.mesh_timeout:
        statuses = b.swarm.request_all(everyone, "status", "status", 10.0)
        # libp2p reports its GossipSub mesh; p2pd's daemon does not expose one: connected peers
        if all(s["peers"] >= 1 and (s["mesh"] is None or s["mesh"].get(roll_topic, 0) >= 1)
               for s in statuses.values()):
            formed = True
            break
        time.sleep(0.25)
    if formed:  # a GossipSub mesh fills up to D_lo at heartbeats (1 s): a few more, so the degree read is settled
        statuses = wait_for_full_mesh(b, roll_topic, statuses, deadline=time.time() + MESH_SETTLE_S)
    res["peers_per_node"] = [statuses[i]["peers"] for i in everyone] if statuses else None
    res["mesh_per_node"] = mesh_degrees(statuses, everyone, roll_topic)
    if not formed:
        raise PhaseTimeout(f"mesh not formed within {b.args.mesh_timeout:.0f} s: peers {res['peers_per_node']}, "
                           f"mesh {res['mesh_per_node']}")


def wait_for_full_mesh(b: Bench, roll_topic: str, statuses: dict[int, dict], deadline: float) -> dict[int, dict]:
    """Statuses once every node's mesh holds min(n - 1, D_lo) peers, or at `deadline` (p2pd reports no mesh)."""
    target = min(b.n - 1, Libp2pOptions().degree_low)
    while time.time() < deadline and any(s["mesh"] is not None and s["mesh"].get(roll_topic, 0) < target
                                         for s in statuses.values()):
        time.sleep(0.25)
        statuses = b.swarm.request_all(b.everyone, "status", "status", 10.0)
    return statuses


def warm_up(b: Bench) -> int | None:
    """The attempt (1 to 3) in which every warm-up message reached every other node, else None."""
    swarm, n = b.swarm, b.n
    for attempt in range(1, 4):
        swarm.inbox.clear()
        warm_from = sorted(set([0] + b.pubs))
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
            b.args.warmup_timeout)
        if done:
            return attempt
    return None


def idle(b: Bench) -> None:
    """(0) what N nodes cost doing nothing."""
    cpu_idle0, t_idle = b.cpu_now(), time.time()
    time.sleep(b.args.idle_s)
    b.refresh_statuses()
    idle_wall = time.time() - t_idle
    cpu_idle = b.cpu_since(cpu_idle0)
    b.res["idle"] = {"wall_s": round(idle_wall, 2), "cpu_s_all_nodes": round(cpu_idle, 2),
                     "cores_busy": round(cpu_idle / idle_wall, 3), "loadavg_1m": os.getloadavg()[0]}
    b.console.print(f"  idle: {b.n} nodes use {b.res['idle']['cores_busy']:.2f} cores doing nothing "
                    f"(heartbeats + {b.args.poll_ms:g} ms drain polling); 1-min load average {os.getloadavg()[0]:.1f}")


def latency_stats(swarm: Swarm, published: dict[str, tuple[int, float]], wall: float, cpu: float,
                  wire_bytes: int, envelope_bytes: int) -> dict[str, Any]:
    """Delivery, reach-all and per-delivery latencies, CPU and wire bytes of the messages `published`
    (digest -> (source node, publish time), each `envelope_bytes` long)."""
    n = swarm.n
    reach_all, per_delivery, per_delivery_transport, incomplete = [], [], [], 0
    slowest: list[list] = []  # [reach-all ms, publisher, last node, ms until its transport had it, median node's ms]
    for d, (src, t_pub) in published.items():
        arr = {i: v for i, v in swarm.arrivals.get(d, {}).items() if i != src}
        per_delivery += [(t - t_pub) * 1e3 for t, _ in arr.values()]
        per_delivery_transport += [(tr - t_pub) * 1e3 for _, tr in arr.values()]
        if len(arr) == n - 1:
            reach_all.append(max(t for t, _ in arr.values()) * 1e3 - t_pub * 1e3)
            last = max(arr, key=lambda i: arr[i][0])  # who was last, when its transport had it, the median node
            median = sorted(t for t, _ in arr.values())[len(arr) // 2]
            slowest.append([round(reach_all[-1], 1), src, last, round((arr[last][1] - t_pub) * 1e3, 1),
                            round((median - t_pub) * 1e3, 1)])
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
        "wire_bytes_per_delivered_token": (wire_bytes / (deliveries * TOKENS_PER_GROUP)
                                           if deliveries and wire_bytes else None),
        # received copies per delivery, estimated from `ss`: wire bytes / delivered envelope bytes
        # (framing, encryption, gossip control and DHT traffic count too: an upper bound)
        "wire_copies_per_delivery": (wire_bytes / (deliveries * envelope_bytes)
                                     if deliveries and wire_bytes and envelope_bytes else None),
        "reach_all_ms": {"p50": pct(reach_all, 50), "p95": pct(reach_all, 95),
                         "max": max(reach_all, default=None)},
        "per_delivery_ms": {"p50": pct(per_delivery, 50), "p95": pct(per_delivery, 95),
                            "max": max(per_delivery, default=None)},
        # received_at stamped by the transport (before Ingress) for comparison
        "per_delivery_transport_ms": {"p50": pct(per_delivery_transport, 50),
                                      "p95": pct(per_delivery_transport, 95)},
        "reach_all_samples_ms": sorted(round(x, 3) for x in reach_all),
        "slowest_messages": sorted(slowest, reverse=True)[:5],
        "per_delivery_samples_ms": sorted(round(x, 3) for x in per_delivery),
        "wall_s": round(wall, 2), "cpu_s_all_nodes": round(cpu, 2),
        "cores_busy": round(cpu / wall, 2) if wall > 0 else None,
        "loadavg_1m": os.getloadavg()[0],
    }


def latency_isolated(b: Bench) -> None:
    """(1a) latency, one message in flight at a time."""
    swarm, pubs, our_ports = b.swarm, b.pubs, set(b.swarm.ports)
    size = 0
    cpu0, t_iso = b.cpu_now(), time.time()
    tcp0 = tcp_bytes_received(our_ports)
    published_iso: dict[str, tuple[int, float]] = {}
    for k in range(b.args.isolated):
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
        swarm.pump_until(lambda: len(set(swarm.arrivals.get(d, {})) - {src}) >= b.n - 1, b.args.isolated_timeout)
        time.sleep(0.02)
    iso_wall = time.time() - t_iso
    wire_iso = wire_bytes_between(tcp0, tcp_bytes_received(our_ports))
    b.refresh_statuses()
    cpu_iso = b.cpu_since(cpu0)
    b.res["latency_isolated"] = {"publishers": len(pubs), "envelope_bytes": size,
                                 **latency_stats(swarm, published_iso, iso_wall, cpu_iso, wire_iso, size)}
    li = b.res["latency_isolated"]
    b.console.print(f"  latency, one message at a time: {li['deliveries']}/{li['deliveries_expected']} deliveries, "
                    f"reach-all p50 {fmt(li['reach_all_ms']['p50'])} ms p95 {fmt(li['reach_all_ms']['p95'])} ms")


def latency_burst(b: Bench) -> None:
    """(1b) latency under a burst: P publishers x M messages, spacing s."""
    swarm, args, pubs, our_ports = b.swarm, b.args, b.pubs, set(b.swarm.ports)
    cpu0 = b.cpu_now()
    tcp0 = tcp_bytes_received(our_ports)
    t_lat = time.time()
    published, size = publish_burst(b)
    expected = len(published) * (b.n - 1)

    def delivered() -> int:
        return sum(len(set(swarm.arrivals.get(d, {})) - {src}) for d, (src, _) in published.items())

    swarm.pump_until(lambda: delivered() >= expected, args.delivery_timeout)
    lat_wall = time.time() - t_lat
    wire_lat = wire_bytes_between(tcp0, tcp_bytes_received(our_ports))
    b.refresh_statuses()
    cpu_lat = b.cpu_since(cpu0)
    b.res["latency"] = lat = {
        "publishers": len(pubs), "messages_per_publisher": args.messages, "spacing_ms": args.spacing_ms,
        "offered_msgs_per_s": len(pubs) * 1000.0 / args.spacing_ms if args.spacing_ms else None,
        "envelope_bytes": size, **latency_stats(swarm, published, lat_wall, cpu_lat, wire_lat, size),
    }
    lat["cpu_ms_per_delivery_above_idle"] = (
        (cpu_lat - b.res["idle"]["cores_busy"] * lat_wall) * 1e3 / lat["deliveries"] if lat["deliveries"] else None)
    b.console.print(f"  latency, burst ({len(pubs)} publishers x {args.messages} every {args.spacing_ms:g} ms): "
                    f"{lat['deliveries']}/{expected} deliveries, reach-all p50 "
                    f"{fmt(lat['reach_all_ms']['p50'])} ms p95 {fmt(lat['reach_all_ms']['p95'])} ms; "
                    f"{lat['cores_busy']} cores busy, {fmt(lat['cpu_ms_per_delivery_above_idle'])} ms CPU per delivery "
                    f"above idle")


def publish_burst(b: Bench) -> tuple[dict[str, tuple[int, float]], int]:
    """Every publisher sends its burst; (digest -> (publisher, publish time), envelope bytes)."""
    swarm, args, pubs = b.swarm, b.args, b.pubs
    size = 0
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
    return published, size


def flood(b: Bench) -> None:
    """(2) flood ingest on node 0: the senders' prepared messages as fast as they go."""
    swarm, senders = b.swarm, b.senders
    per_sender = max(1, b.args.flood // len(senders))
    dial_target(b, senders)
    flood_warm_up(b)
    prepared = swarm.request_all(senders, "flood_prepare", "flood_ready", 60.0, n=per_sender)
    swarm.request_all([0], "flood_reset", "flood_reset", 10.0)
    statuses = b.refresh_statuses()
    cpu1 = b.cpu_now()
    stats0 = statuses[0]["stats"]
    t_flood = time.time()
    for i in senders:
        swarm.send(i, cmd="flood_go")
    total = per_sender * len(senders)
    swarm.pump_until(lambda: all(swarm.inbox.get((i, "flood_sent")) for i in senders), b.args.flood_timeout)
    sent = {i: swarm.take(i, "flood_sent") for i in senders}
    rep = wait_for_flood_report(b, total)
    flood_wall = time.time() - t_flood
    statuses = b.refresh_statuses()
    b.res["flood"] = f = flood_result(rep, sent, prepared, total, len(senders))
    cpu_flood, cpu_target = b.cpu_since(cpu1), statuses[0]["cpu"] - cpu1[0]
    f.update({
        "target_inbox_dropped": statuses[0]["stats"].get("dropped_inbound_full", 0)
        - stats0.get("dropped_inbound_full", 0),
        "wall_s": round(flood_wall, 2), "cpu_s_all_nodes": round(cpu_flood, 2),
        "cpu_s_target": round(cpu_target, 2),
        "cpu_s_target_per_verified": cpu_target / rep["ok"] if rep.get("ok") else None,
        "cores_busy": round(cpu_flood / flood_wall, 2) if flood_wall > 0 else None,
    })
    b.console.print(f"  flood: node 0 verified {f['verified']}/{total} ({f['envelope_bytes']} B each) at "
                    f"{fmt(f['ingest_msgs_per_s'], 0)} msg/s end to end; transport alone "
                    f"{fmt(f['transport_rx_msgs_per_s'], 0)} msg/s; Ingress alone (busy-verify rate) "
                    f"{fmt(f['verify_msgs_per_s_busy'], 0)} msg/s")


def flood_warm_up(b: Bench) -> None:
    """Warm the fanout route: one message from each sender must reach node 0."""
    swarm, senders = b.swarm, b.senders
    swarm.request_all([0], "flood_reset", "flood_reset", 10.0)
    for i in senders:
        swarm.send(i, cmd="publish", topic=FLOOD_KIND, n=1, spacing=0, tag="flood-warm")
    warm = False
    deadline = time.monotonic() + b.args.warmup_timeout
    while time.monotonic() < deadline:
        rep = swarm.request_all([0], "flood_report", "flood_report", 10.0)[0]
        if rep["ok"] >= len(senders):
            warm = True
            break
        time.sleep(0.2)
    b.res["flood_warmup_verified"] = f"{rep['ok']}/{len(senders)}"
    if not warm:  # measured anyway: the delivery ratio shows what the cold routes lose
        b.console.print(f"  flood warm-up incomplete: node 0 verified {rep['ok']}/{len(senders)} senders' "
                        f"first message within {b.args.warmup_timeout:.0f} s", style="yellow")


def wait_for_flood_report(b: Bench, total: int) -> dict[str, Any]:
    """Node 0's flood report once all `total` messages are verified or refused, nothing new came for
    5 s (the rest was lost), or the flood timeout passed."""
    last_ok, last_change = -1, time.monotonic()
    rep: dict[str, Any] = {}
    deadline = time.monotonic() + b.args.flood_timeout
    while time.monotonic() < deadline:
        rep = b.swarm.request_all([0], "flood_report", "flood_report", 10.0)[0]
        if rep["ok"] + rep["bad"] >= total:
            break
        if rep["ok"] != last_ok:
            last_ok, last_change = rep["ok"], time.monotonic()
        elif time.monotonic() - last_change > 5.0:
            break  # nothing new for 5 s: the rest was lost
        time.sleep(0.1)
    return rep


def flood_result(rep: dict[str, Any], sent: dict[int, dict | None], prepared: dict[int, dict], total: int,
                 senders: int) -> dict[str, Any]:
    """The flood's figures from node 0's report and the senders' replies (CPU and wall time apart)."""
    span = (rep["last_done"] - rep["first_rx"]) if rep.get("last_done") and rep.get("first_rx") else None
    rx_span = (rep["last_rx"] - rep["first_rx"]) if rep.get("last_rx") and rep.get("first_rx") else None
    send_done = max((e["t_pumped"] for e in sent.values() if e), default=None)
    send_start = min((e["t0"] for e in sent.values() if e), default=None)
    return {
        "target": 0, "senders": senders, "messages": total, "verified": rep.get("ok", 0),
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
    }


def totals(b: Bench) -> None:
    """Transport counters, Ingress rejections and negotiated muxers summed over the nodes."""
    reports = b.swarm.request_all(b.everyone, "report", "report", 10.0)
    keys = ("published", "received", "dropped_inbound", "dropped_outbound", "bad_streams",
            "dial_failures", "reconnects", "trimmed_by_daemon", "trimmed_by_us", "trimmed_after_lookup",
            "held_for_subscribers")
    b.res["transport_totals"] = {k: sum(r["stats"].get(k, 0) for r in reports.values()) for k in keys}
    b.res["connections_end"] = connection_figures(reports)  # after the flood: did the bound hold?
    b.res["held_for_subscribers"] = {i: r["stats"].get("held_for_subscribers", 0) for i, r in reports.items()
                                     if r["stats"].get("held_for_subscribers")}
    rej: dict[str, int] = {}
    for r in reports.values():
        for k, v in r["rejected"].items():
            rej[k] = rej.get(k, 0) + v
    b.res["ingress_rejected_latency_topic"] = rej
    mux: dict[str, int] = {}
    for r in reports.values():
        for k, v in (r.get("muxers") or {}).items():
            mux[k] = mux.get(k, 0) + v
    b.res["muxers_negotiated"] = mux  # connection ends, both sides counted


def finish(b: Bench, workdir: Path) -> None:
    """Shut the swarm down (whatever happened), read its logs, remove the key seeds and, unless kept
    or failed, the worker logs."""
    res = b.res
    res["dead_before_shutdown"] = b.swarm.dead()
    res["shutdown"] = b.swarm.shutdown(b.args.shutdown_timeout)
    res["log_findings"] = scan_logs(b.swarm.logs)
    res["wall_s"] = round(time.time() - b.t_start, 2)
    for cfg_file in workdir.glob("node*.json"):  # they hold (throwaway) key seeds
        cfg_file.unlink(missing_ok=True)
    if b.args.keep_logs or res.get("error"):
        b.console.print(f"  worker logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        res["workdir"] = None
