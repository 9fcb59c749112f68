"""Honest delivery under a flood, through real go-libp2p daemons (p2pd) on 127.0.0.1.

Roles, each a separate process with its own daemon: one RECEIVER (this process: a P2pdTransport
drained every `--drain-ms` like a node's ingest loop), one HONEST publisher (`--honest` messages at
`--honest-rate`/s), one FLOODER (`--flood` messages at `--flood-rate`/s, starting with the honest
stream; it redials at once whoever disconnects it) and
`--relays` idle subscribers (they forward, as every GossipSub peer does). The same honest traffic
runs twice, without and with the flood; the figure is the fraction of honest messages the receiver
drained. Where messages are lost is counted from the daemons' own logs (go-libp2p-pubsub logs
each drop; the daemons run with GOLOG_LOG_LEVEL=pubsub=debug for that):

* `validation_queue_full`: the receiver's daemon dropped an arriving message before checking its
  signature (its validation queue holds 32);
* `subscriber_too_slow`: the receiver's daemon dropped a message because its 32-message buffer
  towards our control socket was full (our client did not read fast enough);
* `peer_queue_full`: a sending or relaying daemon dropped an RPC to a peer (32 queued per peer);
* `inbox_full`: our inbox (a FairBuffer) dropped one, the heaviest sender's oldest (counted by the transport);
* `dropped_flooding_origin`: the flood guard dropped one from a cut origin (protocol/transports/p2pd/flood_guard.py).
These count honest and flood messages alike; `--probe` splits the HONEST losses into "in the
daemons" and "in our client" with a second subscription at the receiver.

    .venv/bin/python -m scripts.bench.gossip.flood               # 400 honest at 40/s, 12,000 flood at 3,000/s
    .venv/bin/python -m scripts.bench.gossip.flood --smoke       # seconds: what the test runs

Writes <out>/bench_flood.json and <out>/bench_flood.png (default out runs/bench-flood).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scripts.common import ROOT, arg_parser, pyplot, runs_dir, write_json

TOPIC = "swarm-node/bench-flood/rollouts/v1"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
HONEST_TAG, FLOOD_TAG = b"H", b"F"
# what go-libp2p-pubsub 0.10 logs when it drops (the daemon's stderr, pubsub logger at debug)
DAEMON_DROP_LINES = {
    "validation_queue_full": "message validation throttled",
    "subscriber_too_slow": "subscriber too slow",
    "peer_queue_full": "queue full",
}
_LOG_ENV = {"GOLOG_LOG_LEVEL": "error,pubsub=debug", "GOLOG_LOG_FMT": "nocolor"}


SMOKE = {"honest": 90, "honest_rate": 30.0, "flood": 6000, "flood_rate": 3000.0, "settle_s": 1.5, "quiet_s": 1.0,
         "run_deadline_s": 30.0}


def payload(tag: bytes, seq: int, size: int) -> bytes:
    head = tag + seq.to_bytes(4, "big")
    return head + bytes(max(0, size - len(head)))


def parse_payload(data: bytes) -> tuple[bytes, int] | None:
    if len(data) < 5:
        return None
    return data[:1], int.from_bytes(data[1:5], "big")


def daemon_drops(transport: Any) -> dict[str, int]:
    """Drop lines in this transport's daemon log (read before close: close removes the file)."""
    daemon = transport.daemon
    text = daemon.stderr_path.read_text(errors="replace") if daemon is not None else ""
    counts = {key: text.count(line) for key, line in DAEMON_DROP_LINES.items()}
    counts["peer_queue_full"] -= counts["validation_queue_full"]  # its line says "queue full" too
    return counts


def cut_knobs(args: argparse.Namespace) -> dict[str, float]:
    """The flood guard's knobs (protocol/transports/p2pd/flood_guard.py) every node of the run gets."""
    knobs = {"flood_cut_rate": args.cut_rate, "flood_cut_burst": args.cut_burst}
    return {k: v for k, v in knobs.items() if v is not None}


class ProbeSubscription:
    """A second, raw subscription to the receiver's daemon on its own thread, recording honest
    sequence numbers: an honest message it got that the transport did not was lost on our
    client's side (the daemon's buffer towards the transport's subscription, our reading, our
    inbox); one neither got was lost inside the daemons before delivery."""

    def __init__(self, socket_path: Path) -> None:
        from protocol.transports.p2pd.control import ControlConnection, subscribe_request

        self.honest: set[int] = set()
        self.conn = ControlConnection(socket_path, 5.0)
        self.conn.request(subscribe_request(TOPIC))
        self.conn.sock.settimeout(None)  # close() ends the read
        self.thread = threading.Thread(target=self._read, name="probe-subscription", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        from protocol.transports.p2pd.control import ControlError
        from proto import p2pd_control_pb2 as pb

        try:
            while True:
                parsed = parse_payload(self.conn.read(pb.PSMessage).data)
                if parsed and parsed[0] == HONEST_TAG:
                    self.honest.add(parsed[1])
        except ControlError:
            return

    def close(self) -> None:
        self.conn.close()
        self.thread.join(5.0)


def seed_for(name: str) -> bytes:
    return (name.encode() * 32)[:32]


# ------------------------------------------------------------------------ a child: one publisher

def child_main(args: argparse.Namespace) -> int:
    from protocol import P2pdOptions
    from protocol.transports.p2pd import P2pdTransport

    def say(**event: Any) -> None:
        print(json.dumps(event), flush=True)

    knobs: dict[str, Any] = {"publish_rate": args.rate, **cut_knobs(args)}
    if args.role == "flooder":  # as fast as its daemon takes them, and it redials whoever disconnects it
        knobs.update(publish_rate=1e6, discovery_interval_s=0.1, backoff_initial_s=0.05, backoff_max_s=0.1)
    transport = P2pdTransport(seed_for(args.name), P2pdOptions(
        listen=[LOOPBACK], bootstrap=args.bootstrap, topics=[TOPIC], start_timeout_s=30.0,
        outbound_size=max(4096, args.count + 1), settle_s=0.0, publish_wait_s=0.0, **knobs))
    deadline = time.monotonic() + args.deadline_s  # never outlive the benchmark
    try:
        transport.start()
        say(event="up", addrs=transport.listen_addrs())
        for line in sys.stdin:  # "go" / "drops" / "exit"
            command = line.strip()
            if command == "go":
                tag = FLOOD_TAG if args.role == "flooder" else HONEST_TAG
                started = time.monotonic()
                for seq in range(args.count):  # paced by the publisher itself (sleeping 5 ms+ at a time)
                    ahead = started + seq / args.rate - time.monotonic()
                    if ahead > 0.005:
                        time.sleep(ahead)
                    transport.publish(TOPIC, payload(tag, seq, args.size))
                while transport.stats()["outbound_queued"] and time.monotonic() < deadline:
                    time.sleep(0.01)
                say(event="sent", seconds=time.monotonic() - started, stats=transport.stats())
            elif command == "peers":
                say(event="peers", n=transport.stats().get(f"topic_peers:{TOPIC}", 0))
            elif command == "drops":
                say(event="drops", drops=daemon_drops(transport), stats=transport.stats())
            elif command == "exit" or time.monotonic() > deadline:
                break
    finally:
        transport.close()
    return 0


# ------------------------------------------------------------------------ the receiver and the runs

class Child:
    def __init__(self, role: str, name: str, count: int, rate: float, size: int, bootstrap: list[str],
                 deadline_s: float, cut_args: list[str]) -> None:
        cmd = [sys.executable, "-m", __spec__.name, "--role", role, "--name", name, "--count", str(count),
               "--rate", str(rate), "--size", str(size), "--deadline-s", str(deadline_s), *cut_args,
               "--bootstrap", *bootstrap]
        env = dict(os.environ, **_LOG_ENV)
        self.role = role
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def tell(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.role} exited ({self.proc.wait()}) before '{event}'")
            message = json.loads(line)
            if message.get("event") == event:
                return message
        raise TimeoutError(f"{self.role} sent no '{event}' within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.tell("exit")
            except OSError:
                pass
            try:
                self.proc.wait(15.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)


def run_once(args: argparse.Namespace, flood: int, label: str) -> dict[str, Any]:
    """One run: the receiver here, relays, the honest publisher and the flooder as children; the
    honest stream measured at the receiver, and where messages were dropped."""
    from protocol import P2pdOptions
    from protocol.transports.p2pd import P2pdTransport

    os.environ.update(_LOG_ENV)
    receiver = P2pdTransport(seed_for(f"receiver-{label}"), P2pdOptions(
        listen=[LOOPBACK], topics=[TOPIC], start_timeout_s=30.0, inbox_size=args.inbox, **cut_knobs(args)))
    children: list[Child] = []
    probe: ProbeSubscription | None = None
    try:
        receiver.start()
        if args.probe:
            probe = ProbeSubscription(receiver.daemon.socket_path)
        start_children(args, receiver, flood, label, children)
        wait_for_subscriptions(receiver, children)
        time.sleep(args.settle_s)  # GossipSub grafts its mesh on heartbeats (1 s)
        seen = receive(args, receiver, [c for c in children if c.role != "relay"])
        drops, stats = collect_drops(receiver, children)
    finally:
        if probe is not None:
            probe.close()
        for child in children:
            child.stop()
        receiver.close()
    return run_figures(args, flood, label, seen, drops, stats, probe)


def start_children(args: argparse.Namespace, receiver: Any, flood: int, label: str, children: list[Child]) -> None:
    """Relays, then the honest publisher, then the flooder, each bootstrapped to all before it (appended
    to `children` as they start, so the caller stops every one that did)."""
    known = list(receiver.listen_addrs())
    roles = [("relay", 0, 1.0)] * args.relays + [("honest", args.honest, args.honest_rate),
                                                  ("flooder", flood, args.flood_rate)]
    for role, count, rate in roles:
        child = Child(role, f"{role}-{len(children)}-{label}", count, rate, args.size, known, args.run_deadline_s,
                      [f"--{k.replace('flood_', '').replace('_', '-')}={v}" for k, v in cut_knobs(args).items()])
        children.append(child)
        known += child.expect("up", 40.0)["addrs"]


def wait_for_subscriptions(receiver: Any, children: list[Child]) -> None:
    """Until the receiver, and then every child, sees every other peer subscribed (30 s at most)."""
    n_peers = len(children)
    wait_deadline = time.monotonic() + 30.0
    while receiver.stats().get(f"topic_peers:{TOPIC}", 0) < n_peers:
        if time.monotonic() > wait_deadline:
            raise TimeoutError(f"the receiver saw {receiver.stats().get(f'topic_peers:{TOPIC}', 0)} "
                               f"of {n_peers} subscribed peers within 30 s")
        time.sleep(0.1)
    for child in children:  # every publisher sees the whole swarm before anything is sent
        while True:
            child.tell("peers")
            if child.expect("peers", 10.0)["n"] >= n_peers or time.monotonic() > wait_deadline:
                break
            time.sleep(0.2)


def receive(args: argparse.Namespace, receiver: Any, publishers: list[Child]) -> dict[str, Any]:
    """Start the publishers and drain the receiver every --drain-ms until both reported 'sent' and
    nothing arrived for --quiet-s (or the run's deadline): what arrived, what they said, how long."""
    receiver.drain(TOPIC)
    honest_seen: set[int] = set()
    flood_seen = 0
    started = time.monotonic()
    for child in publishers:
        child.tell("go")
    sent: dict[str, dict[str, Any]] = {}
    last_arrival = time.monotonic()
    end_by = started + args.run_deadline_s
    while time.monotonic() < end_by:
        items = receiver.drain(TOPIC)
        for item in items:
            parsed = parse_payload(item.data)
            if parsed and parsed[0] == HONEST_TAG:
                honest_seen.add(parsed[1])
            elif parsed and parsed[0] == FLOOD_TAG:
                flood_seen += 1
        if items:
            last_arrival = time.monotonic()
        for child in publishers:
            ready, _, _ = select.select([child.proc.stdout], [], [], 0)
            if ready and child.role not in sent:
                sent[child.role] = child.expect("sent", 1.0)
        if len(sent) == len(publishers) and time.monotonic() - last_arrival > args.quiet_s:
            break
        time.sleep(args.drain_ms / 1000.0)
    return {"honest": honest_seen, "flood": flood_seen, "sent": sent, "elapsed": time.monotonic() - started}


def collect_drops(receiver: Any, children: list[Child]) -> tuple[dict[str, dict], dict[str, dict]]:
    """Every daemon's drop counts and every transport's counters, by role."""
    drops = {"receiver": daemon_drops(receiver)}
    stats = {"receiver": receiver.stats()}
    for child in children:
        child.tell("drops")
        reply = child.expect("drops", 10.0)
        drops[child.role] = reply["drops"]
        stats[child.role] = reply["stats"]
    return drops, stats


def run_figures(args: argparse.Namespace, flood: int, label: str, seen: dict[str, Any], drops: dict[str, dict],
                stats: dict[str, dict], probe: ProbeSubscription | None) -> dict[str, Any]:
    """One run's figures: honest delivery, the flood's, and where messages were lost."""
    honest_seen = seen["honest"]
    if probe is not None:
        honest_where = {"honest_lost_in_daemons": args.honest - len(honest_seen | probe.honest),
                        "honest_lost_in_our_client": len(probe.honest - honest_seen)}
    else:
        honest_where = {}
    return {
        "label": label, "honest_sent": args.honest, "honest_delivered": len(honest_seen),
        "honest_delivery": len(honest_seen) / args.honest if args.honest else None,
        "flood_sent": flood, "flood_delivered": seen["flood"],
        "flood_publish_s": seen["sent"].get("flooder", {}).get("seconds"),
        "seconds": round(seen["elapsed"], 2),
        "where_lost": {
            "receiver_validation_queue_full": drops["receiver"]["validation_queue_full"],
            "receiver_subscriber_too_slow": drops["receiver"]["subscriber_too_slow"],
            "peer_queue_full_all_daemons": sum(d["peer_queue_full"] for d in drops.values()),
            "receiver_inbox_full": stats["receiver"].get("dropped_inbound_full", 0),
            "receiver_dropped_flooding_origin": stats["receiver"].get("dropped_flooding_origin", 0),
        },
        "honest_where_lost": honest_where,
        "flooders_cut": {role: counters.get("flooders_cut", 0) for role, counters in stats.items()},
        "daemon_drops": drops, "stats": stats,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.4]})
    left.bar([r["label"] for r in runs], [r["honest_delivery"] for r in runs],
             color=[f"C{i}" for i in range(len(runs))])
    left.set_ylim(0, 1.05)
    left.set_ylabel("honest messages delivered (fraction)")
    config = result["config"]
    left.set_title(f"{config['honest']} honest at {config['honest_rate']:g}/s, "
                   f"flood {config['flood']} at {config['flood_rate']:g}/s")
    for i, run in enumerate(runs):
        left.text(i, run["honest_delivery"] + 0.01, f"{run['honest_delivered']}/{run['honest_sent']}", ha="center")
    flood_run = runs[-1]
    places = list(flood_run["where_lost"])
    right.barh(places, [flood_run["where_lost"][p] for p in places], color="C1")
    right.set_xlabel("messages dropped, honest and flood (the flood run)")
    right.set_title("where they were dropped")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arg_parser(__spec__, __doc__)
    parser.add_argument("--honest", type=int, default=400, help="honest messages")
    parser.add_argument("--honest-rate", type=float, default=40.0, help="honest messages per second")
    parser.add_argument("--flood", type=int, default=12000, help="flood messages (all from one origin)")
    parser.add_argument("--flood-rate", type=float, default=3000.0, help="flood messages per second (the flood "
                        "starts with the honest stream; the rate is what its daemon takes at most)")
    parser.add_argument("--size", type=int, default=4096, help="bytes per message (a rollout group is ~4-8 KB)")
    parser.add_argument("--relays", type=int, default=1, help="idle subscribers that forward (GossipSub peers)")
    parser.add_argument("--inbox", type=int, default=4096, help="the receiver's inbox size")
    parser.add_argument("--drain-ms", type=float, default=20.0, help="the receiver drains its inbox this often")
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after every peer is subscribed")
    parser.add_argument("--quiet-s", type=float, default=1.5, help="a run ends this long after the last arrival")
    parser.add_argument("--run-deadline-s", type=float, default=90.0, help="hard limit of one run")
    parser.add_argument("--cut-rate", type=float, help="every node's flood_cut_rate (0: off; default: the transport's)")
    parser.add_argument("--cut-burst", type=float, help="every node's flood_cut_burst (default: the transport's)")
    parser.add_argument("--probe", action="store_true", help="a second raw subscription at the receiver tells "
                        "honest messages lost in the daemons from those lost in our client (it adds a reader)")
    parser.add_argument("--skip-baseline", action="store_true", help="only the run with the flood")
    parser.add_argument("--smoke", action="store_true", help="seconds-long: 90 honest at 30/s, 6,000 flood at 3,000/s")
    parser.add_argument("--out", type=Path, default=runs_dir("bench-flood"))
    # a child's arguments (internal)
    parser.add_argument("--role", choices=["honest", "flooder", "relay"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--deadline-s", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", nargs="*", default=[], help=argparse.SUPPRESS)
    if parser.parse_args(argv).smoke:  # the smoke run's defaults; flags given still win
        parser.set_defaults(**SMOKE)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        return child_main(args)
    runs = [] if args.skip_baseline else [run_once(args, 0, "no flood")]
    if args.flood:
        runs.append(run_once(args, args.flood, "flood"))
    result = {
        "config": {k: v for k, v in vars(args).items() if k in (
            "honest", "honest_rate", "flood", "flood_rate", "size", "relays", "inbox", "drain_ms", "smoke",
            "cut_rate", "cut_burst")},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(), "platform": platform.platform()},
        "runs": runs,
    }
    write_json(args.out / "bench_flood.json", result, indent=2)
    plot(result, args.out / "bench_flood.png")
    for run in runs:
        print(f"{run['label']:>9}: honest delivered {run['honest_delivered']}/{run['honest_sent']} "
              f"({run['honest_delivery']:.3f}); flood delivered {run['flood_delivered']}/{run['flood_sent']} "
              f"in {run['seconds']} s; dropped: " + ", ".join(f"{k} {v}" for k, v in run["where_lost"].items())
              + f"; flooders cut: {run['flooders_cut']}"
              + "".join(f"; {k} {v}" for k, v in run["honest_where_lost"].items()))
    print(f"wrote {args.out / 'bench_flood.json'} and bench_flood.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
