"""`swarm-node testnet`: its arguments and the command (the harness itself: node/testnet/runner.py)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from node.observe.logs import configure as configure_logs


def add_parser(sub: argparse._SubParsersAction, presets: list[str]) -> None:
    testnet = sub.add_parser("testnet", help="run N nodes on this machine with faults and hostile peers; report")
    testnet.add_argument("--nodes", type=int, default=3)
    testnet.add_argument("--rounds", type=int, default=200, help="rounds every honest node trains")
    testnet.add_argument("--preset", choices=presets, default="tiny")
    testnet.add_argument("--mix", default="4/4", metavar="I/J", help="I local + J external groups per update")
    testnet.add_argument("--compare", metavar="I/J,...", help="run each mix (e.g. 8/0,6/2,4/4,2/6) and compare")
    testnet.add_argument("--seeds", type=int, default=1, help="repeat every configuration with K seeds")
    testnet.add_argument("--hostile", metavar="K:KIND,...", help="hostile peers, e.g. 2:liar (kinds: node/hostile/peer.py)")
    testnet.add_argument("--kill", metavar="ROUND:NODES[:DOWN]", help="e.g. 150:1,2,3:40 (';' separates events)")
    testnet.add_argument("--partition", metavar="START-END", help="split the swarm in two halves, e.g. 100-200")
    testnet.add_argument("--netem", metavar="SPEC", help='network delay/loss, e.g. "delay 50ms loss 1%%"')
    testnet.add_argument("--transport", choices=["p2pd", "libp2p", "memory"], default="p2pd",
                         help="p2pd (the default, as for `join`) or libp2p: one `join` process per node on 127.0.0.1 "
                              "over that transport (hostile peers always speak py-libp2p); memory: all nodes in this "
                              "process")
    testnet.add_argument("--homogeneous", action="store_true", help="identical nodes (default: heterogeneous "
                         "seeds, learning rates, task emphasis and speed)")
    testnet.add_argument("--model-sizes", metavar="WxL,...", help="tiny: nodes of these widths x layers in turn, "
                         "e.g. 64x2,96x3 (default: every node the preset's size)")
    testnet.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key on every node")
    testnet.add_argument("--frozen-peers", action="store_true", help="memory, a control: the second half of the "
                         "nodes are warm-start copies that never update (lr 0, yet they generate, share and run "
                         "every update); the first half hear only them and alone are measured")
    testnet.add_argument("--min-round-s", type=float, default=0.25, help="p2pd/libp2p: pace each node's rounds")
    testnet.add_argument("--timeout", type=float, default=1800.0, help="p2pd/libp2p: stop a run after this many seconds")
    testnet.add_argument("--clock", choices=["compute", "rounds"],
                         help="memory: compute = rounds cost virtual time on each node's device profile and nodes "
                              "run in virtual-time order until --budget (default with --compare); rounds = one "
                              "round per node per tick until --rounds (default otherwise)")
    testnet.add_argument("--budget", metavar="TIME", help="compute clock: virtual time every node runs, e.g. 900s, "
                         "30m, 2h (default: what a fast node of the first mix needs for --rounds rounds)")
    testnet.add_argument("--grid", metavar="TIME", help="compute clock: held-out evaluation every TIME of virtual "
                         "time (default: eval.every nominal silo rounds; give it to compare runs of other batch shapes)")
    testnet.add_argument("--charge", choices=["profile", "wall"], default="profile",
                         help="compute clock: profile = every round's counted work (generation, training, checking, "
                              "verifying and publishing messages, hints for peers) on the measured device profile, "
                              "repeatable; wall = its measured wall time, on this machine and its load")
    testnet.add_argument("--duration", metavar="TIME", help="p2pd/libp2p: every node runs for this wall time "
                         "(e.g. 10m) instead of --rounds rounds")
    testnet.add_argument("--out", help="report directory (default runs/testnet-<time>)")
    testnet.add_argument("--quiet", action="store_true", help="no live dashboard")
    testnet.add_argument("--workers", type=int, default=1,
                         help="memory: run this many configurations (mix x seed) at once, one process and thread "
                              "each (the live table then shows one row per run)")
    testnet.add_argument("--page-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                         help="the live web page of the whole testnet (every node's curves): default a free "
                              "loopback port, printed at start; empty = none")
    testnet.add_argument("--resume", action="store_true", help="keep the runs a killed or shorter sweep of the "
                         "same plan finished in --out (e.g. after adding --seeds) and run only the rest")
    testnet.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """N nodes on this machine (processes over p2pd or py-libp2p, or one process over the in-memory bus), faults
    and hostile peers on a schedule, a live dashboard, then the report (node/testnet/)."""
    from node.service.console import console, pin_hash_seed_if_needed  # the re-exec is main's to allow

    from node.config.schema import ConfigError
    from node.testnet.clock import parse_duration
    from node.observe.address import parse_listen
    from node.testnet.plan import Plan, parse_hostile, parse_kills, parse_mix, parse_partitions, parse_sizes

    try:
        mixes = [parse_mix(m) for m in (args.compare.split(",") if args.compare else [args.mix])]
        # equal compute is what a comparison of mixes needs; one mix alone keeps the familiar rounds
        clock = args.clock or ("compute" if args.compare and args.transport == "memory" else "rounds")
        plan = Plan(nodes=args.nodes, rounds=args.rounds, preset=args.preset, mixes=mixes, seeds=args.seeds,
                    hostile=parse_hostile(args.hostile), kills=parse_kills(args.kill),
                    partitions=parse_partitions(args.partition), netem=args.netem, transport=args.transport,
                    heterogeneous=not args.homogeneous, overrides=list(args.set or []), frozen_peers=args.frozen_peers,
                    out=Path(args.out or f"runs/testnet-{time.strftime('%Y%m%d-%H%M%S')}"),
                    min_round_s=args.min_round_s, timeout_s=args.timeout, model_sizes=parse_sizes(args.model_sizes),
                    clock=clock, budget_s=parse_duration(args.budget) if args.budget else None, charge=args.charge,
                    grid_s=parse_duration(args.grid, "--grid") if args.grid else None,
                    duration_s=parse_duration(args.duration, "--duration") if args.duration else None)
        plan.validate()
        try:
            parse_listen(args.page_listen)
        except ValueError as err:
            raise ValueError(f"--page-listen: {err}") from None
        # the testnet's modules load when it runs, not whenever `swarm-node` builds its parser
        from node.config.schema import load_config
        from node.testnet.plan import node_overrides

        for index in range(plan.nodes):  # every node's config must load before anything starts
            pin_hash_seed_if_needed(load_config(plan.preset, None, node_overrides(plan, index, 0, plan.mixes[0])))
        # the harness logs as its nodes do (--set run.log_format=json reaches both; so does the environment)
        shared = load_config(plan.preset, None, plan.overrides, environ=os.environ).run
        configure_logs(shared.log_level, shared.log_format)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    from node.testnet.runner import run_testnet  # (the same reason: torch, transformers)

    command = " ".join(["swarm-node testnet", *sys.argv[2:]]) if len(sys.argv) > 2 else "swarm-node testnet"
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    return run_testnet(plan, command, console, quiet=args.quiet, resume=args.resume, page_listen=args.page_listen,
                       workers=args.workers)
