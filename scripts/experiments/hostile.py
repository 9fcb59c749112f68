"""Hostile peers against a swarm: do honest nodes accept any invalid message, and what does each
attack cost them?

The same swarm of honest nodes runs once with no attacker (the baseline) and once per hostile kind
with --count peers of that kind beside them (node/hostile/peer.py: forged, tampered, liar,
replay, flood, malformed, oversized, sybil, hint_leak, hint_junk, garbage). Per kind: groups the
honest nodes trained from INVALID senders (must be 0), from any hostile sender, the honest nodes'
mean cumulative reward relative to the baseline (the bar: within 10%), and the rejections they
recorded. Runs use the in-process testnet (`swarm-node testnet --transport memory`): real signed
messages through the real Ingress and exchange, deterministic per seed.

    .venv/bin/python -m scripts.experiments.hostile           # 6 honest + 2 hostile, 300 rounds, all kinds
    .venv/bin/python -m scripts.experiments.hostile --quick   # smoke: 2 honest, 2 kinds, 12 rounds
    .venv/bin/python -m scripts.experiments.hostile --resume  # after a crash: only the kinds not yet done

Writes <out>/exp_hostile.json and <out>/exp_hostile.png (default out runs/exp_hostile).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from scripts.common import arg_parser, command_line, console as make_console, pyplot, runs_dir, write_json, write_result


def parse_args(argv=None) -> argparse.Namespace:
    from node.hostile.peer import KINDS

    p = arg_parser(__spec__, __doc__)
    p.add_argument("--honest", type=int, default=6, help="honest nodes")
    p.add_argument("--count", type=int, default=2, help="hostile peers of each kind")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--mix", default="4/4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key on every honest node, e.g. another treatment of peers' samples")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 honest nodes, 2 kinds, 12 rounds")
    p.add_argument("--resume", action="store_true", help="reuse the kinds an earlier run with the same settings "
                                                         "finished (<out>/<kind>/result.json)")
    p.add_argument("--out", default=str(runs_dir("exp_hostile")))
    args = p.parse_args(argv)
    if args.quick:
        args.honest, args.rounds, args.kinds = 2, 12, "liar,sybil"
    args.kinds = args.kinds.split(",")
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        p.error(f"unknown kinds {unknown}; valid: {', '.join(KINDS)}")
    return args


def run_once(args, kind: str | None, out: Path) -> dict:
    from node.testnet.memory import MemoryTestnet
    from node.testnet.plan import Plan, parse_mix
    from node.testnet.report import run_summary

    plan = Plan(nodes=args.honest, rounds=args.rounds, transport="memory", mixes=[parse_mix(args.mix)],
                hostile=[(args.count, kind)] if kind else [], overrides=list(args.set), out=out)
    plan.validate()
    run_dir = out / (kind or "baseline")
    shutil.rmtree(run_dir, ignore_errors=True)  # nodes would resume an earlier run's checkpoints
    raw = MemoryTestnet(plan, plan.mixes[0], args.seed, run_dir).run()
    summary = run_summary(raw)
    rejected: dict[str, int] = {}
    for node in summary["nodes"]:
        for reason, n in node["rejected_by_reason"].items():
            rejected[reason] = rejected.get(reason, 0) + n
    return {"kind": kind or "none", "invalid_used": summary["invalid_used"], "hostile_used": summary["hostile_used"],
            "cumulative_reward_per_node": summary["cumulative_reward_per_node"],
            "final_heldout_pass1": summary["final_heldout_pass1"], "rejected": rejected,
            "hostile_sent": {k: v for h in raw["hostile"] for k, v in h["counters"].items()},
            "hostile_identities": sum(len(h["identities"]) for h in raw["hostile"]), "seconds": raw["seconds"]}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(10, 4))
    names = [r["kind"] for r in runs]
    rel = [r["relative_reward"] for r in runs]
    ax.bar(names, rel, color=["C2" if r["invalid_used"] == 0 and r["relative_reward"] >= 0.9 else "C3" for r in runs])
    ax.axhline(0.9, color="grey", ls="--", lw=1, label="-10% bar")
    ax.set(title=f"honest nodes' cumulative reward vs no attacker ({result['honest']} honest + {result['count']} "
                 f"hostile, {result['rounds']} rounds)\nred: invalid message trained or reward below the bar",
           ylabel="relative cumulative reward", ylim=(0, max(1.2, max(rel) + 0.05)))
    ax.tick_params(axis="x", rotation=30)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    from rich.table import Table

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = make_console(200)
    started = time.perf_counter()
    runs = []
    settings = {k: getattr(args, k) for k in ("honest", "count", "rounds", "mix", "seed", "set")}
    for kind in [None, *args.kinds]:
        saved = out / (kind or "baseline") / "result.json"
        if args.resume and saved.is_file() and json.loads(saved.read_text())["settings"] == settings:
            console.print(f"{'no attacker' if kind is None else kind}: finished earlier, kept (--resume)")
            runs.append(json.loads(saved.read_text())["run"])
            continue
        console.print(f"running {'no attacker' if kind is None else kind} ...", highlight=False)
        runs.append(run_once(args, kind, out))
        write_json(saved, {"settings": settings, "run": runs[-1]})  # survives a later crash
    base = runs[0]["cumulative_reward_per_node"]
    for run in runs:
        run["relative_reward"] = run["cumulative_reward_per_node"] / base if base else None
    result = {"honest": args.honest, "count": args.count, "rounds": args.rounds, "mix": args.mix, "seed": args.seed,
              "command": command_line(__spec__, argv),
              "seconds": time.perf_counter() - started, "runs": runs}
    table = Table(title=f"exp_hostile: {args.honest} honest nodes + {args.count} hostile of each kind, "
                        f"{args.rounds} rounds, mix {args.mix}")
    for col in ("kind", "invalid trained", "hostile trained", "reward vs none", "held-out pass@1", "rejections"):
        table.add_column(col, justify="right")
    for run in runs:
        top = ", ".join(f"{k}={v}" for k, v in sorted(run["rejected"].items(), key=lambda kv: -kv[1])[:4]) or "none"
        heldout = "-" if run["final_heldout_pass1"] is None else f"{run['final_heldout_pass1']:.2f}"
        table.add_row(run["kind"], str(run["invalid_used"]), str(run["hostile_used"]), f"{run['relative_reward']:.3f}",
                      heldout, top)
    console.print(table)
    json_path, png_path = write_result(out, "exp_hostile", result, plot)
    console.print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
