"""Nodes behind real NAT: reachability, relays, relayed gossip and a flood through a relay.

Builds a small internet in Linux network namespaces (node/labs/netns.py: public hosts on one
segment, each home behind its own masquerading router with no port forwards) and runs real
processes in it (node/labs/nat_run.py, node/labs/relay_latency.py):

    exchange   two home `swarm-node join` nodes and two public `swarm-node relay` boxes, relays on:
               reachability each node reports, seconds until both homes hold relayed addresses,
               groups each home trained from the other (they can only meet through a relay)
    control    the same with relays off everywhere (swarm.nat.relay_client/relay_service false)
    flood      the public node trains and relays; a flooder behind NAT (holding a relay slot on it)
               sends it valid groups at --flood-rate; its rounds during the flood and its flood cut
    latency    messages one at a time and in bursts, home to home through the relay and home to a
               public host directly: delivered/sent and one-way latency percentiles per path

Writes <out>/nat.json and nat.png. Needs root, iproute2 and iptables (scripts/setup.sh installs
iptables as root); exits 2 saying what is missing otherwise. Every process is ended by its handle
and every namespace deleted, also on failure or SIGTERM.

    .venv/bin/python -m scripts.experiments.nat           # about 4 minutes on 2 cores
    .venv/bin/python -m scripts.experiments.nat --smoke   # about 2 minutes: shorter phases, fewer messages
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path

from scripts.common import arg_parser, command_line, console as make_console, pyplot, runs_dir, write_result

PHASES = ("exchange", "control", "flood", "latency")


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    p.add_argument("--train-s", type=float, default=40.0, help="seconds the homes train once both are up")
    p.add_argument("--flood-rate", type=float, default=400.0, help="the flooder's messages per second")
    p.add_argument("--messages", type=int, default=100, help="latency: messages one at a time, and again in bursts")
    p.add_argument("--burst", type=int, default=50, help="latency: messages per burst")
    p.add_argument("--size", type=int, default=4096, help="latency: bytes per message")
    p.add_argument("--smoke", action="store_true", help="train 15 s, 20 messages in bursts of 10")
    p.add_argument("--out", default=str(runs_dir("nat")))
    args = p.parse_args(argv)
    if args.smoke:
        args.train_s, args.messages, args.burst = 15.0, 20, 10
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}: use {', '.join(PHASES)}")
    return args


def _terminate(signum, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through NatLab's teardown


def run_phase(name: str, args: argparse.Namespace, out: Path) -> dict:
    from node.labs.nat_run import NatPlan, run_exchange, run_flood
    from node.labs.netns import NatLab
    from node.labs.relay_latency import LatencyPlan, run_latency

    shutil.rmtree(out / name, ignore_errors=True)  # a home node would resume an earlier run's checkpoint
    started = time.time()
    with NatLab(homes=2, public_hosts=2) as lab:
        if name in ("exchange", "control"):
            result = run_exchange(lab, out / name, NatPlan(relays=name == "exchange", train_s=args.train_s))
        elif name == "flood":
            result = run_flood(lab, out / name, NatPlan(train_s=args.train_s, flood_rate=args.flood_rate))
        else:
            result = run_latency(lab, out / name, LatencyPlan(count=args.messages, burst=args.burst, size=args.size))
    result["seconds"] = round(time.time() - started, 1)
    return result


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars, labels = [], []
    for phase in ("exchange", "control"):
        nodes = result["phases"].get(phase, {}).get("nodes", {})
        for home in ("home0", "home1"):
            if home in nodes:
                bars.append(nodes[home].get("used_from_other_home", 0))
                labels.append(f"{phase}\n{home}")
    drawn = left.bar(range(len(bars)), bars, color=["tab:green"] * 2 + ["tab:gray"] * (len(bars) - 2))
    left.bar_label(drawn)  # a control's 0 is a figure too
    left.set_xticks(range(len(bars)), labels)
    left.set_ylabel("groups trained from the other home node")
    left.set_title("two nodes behind NAT: relays on vs off")
    latency = result["phases"].get("latency", {}).get("raw", {})
    for name, colour in (("direct", "tab:blue"), ("relayed", "tab:orange")):
        points = sorted((int(seq), m["latency_s"] * 1000) for seq, m in latency.get(name, {}).items())
        if points:
            right.plot([p[0] for p in points], [p[1] for p in points], ".", color=colour, label=name)
    right.set_yscale("log")
    right.set_xlabel("message (first half one at a time, second half in bursts)")
    right.set_ylabel("one-way latency (ms)")
    right.set_title("home -> home through the relay vs home -> public host")
    if latency:
        right.legend()
    fig.suptitle(f"machine: {result['machine']['cpu_model']} ({result['machine']['cpus']} CPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(result: dict, console) -> None:
    from rich.table import Table

    table = Table(title="nodes behind NAT")
    for col in ("phase", "node", "reachability", "relayed addrs", "from other home", "flood cut", "rounds"):
        table.add_column(col)
    for phase in ("exchange", "control"):
        for name, node in result["phases"].get(phase, {}).get("nodes", {}).items():
            table.add_row(phase, name, str(node["reachability"]), str(node["relayed_addrs"]),
                          str(node.get("used_from_other_home", "-")), "-", str(node.get("rounds", "-")))
    flood = result["phases"].get("flood")
    if flood:
        table.add_row("flood", "public", str(flood["public"]["reachability"]), "-",
                      f"{flood['public_groups_from_flooder']} from flooder",
                      str(flood["public"]["counters"].get("flooders_cut")), str(flood["public_rounds_during_flood"]))
    console.print(table)
    latency = result["phases"].get("latency")
    if latency:
        for path_name, modes in latency["paths"].items():
            for mode, v in modes.items():
                console.print(f"{path_name:8s} {mode:6s} delivered {v['delivered']}/{v['sent']}  p50 {v['p50_ms']} ms  "
                              f"p90 {v['p90_ms']} ms  max {v['max_ms']} ms", highlight=False)
        console.print(f"relay adds (p50): {latency['relay_extra_p50_ms']} ms", highlight=False)


def main(argv=None) -> int:
    from node.labs.netns import unavailable

    args = parse_args(argv)
    console = make_console()
    missing = unavailable()
    if missing:
        console.print(f"[red]cannot build the NAT lab[/]: {missing}")
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    out = Path(args.out)
    result = {"command": command_line(__spec__, argv), "machine": {
        "cpu_model": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("model name")), None), "cpus": os.cpu_count(),
        "platform": platform.platform(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "phases": {}}
    for name in args.phases.split(","):
        console.print(f"[bold]{name}[/] ...")
        result["phases"][name] = run_phase(name, args, out)
        write_result(out, "nat", result, plot)
    summary(result, console)
    console.print(f"wrote {out / 'nat.json'} and {out / 'nat.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
