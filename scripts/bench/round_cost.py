"""What a sharing round costs against a silo round, phase by phase, measured in one run.

    .venv/bin/python -m scripts.bench.round_cost                          # tiny-warm, 8 nodes, 60 rounds
    .venv/bin/python -m scripts.bench.round_cost --preset smollm2 --nodes 3 --rounds 4 \\
        --set sampling.group_size=8 --set sampling.max_new_tokens=48        # SmolLM2, 8 x 8 x 48 tokens
    .venv/bin/python -m scripts.bench.round_cost --quick                  # smoke: 2 nodes, 4 rounds

Runs the in-process memory testnet on the rounds clock (real nodes, real signed messages, the real
exchange; node/testnet/memory.py), first every node a silo (8/0), then a swarm (4/4), and prints
node/testnet/round_costs.py's table: mean wall seconds per round of each phase (generation, the
exchange and its parts, training), the 4/4 round over the silo round, and the peers' groups each
node received, verified and used. Wall time: the figures hold on the machine and load they were
measured on, and only the ratio of two mixes of one run means anything. Writes
<out>/bench_round_cost.json and .png (stacked seconds per round, per mix).
"""
from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

from node.testnet.memory import MemoryTestnet
from node.testnet.plan import Plan
from node.testnet.round_costs import EXCHANGE_PARTS, round_cost_text, round_costs
from scripts.common import arg_parser, pyplot, runs_dir, write_result

MIXES = ((8, 0), (4, 4))


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--preset", default="tiny-warm")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 nodes, 4 rounds")
    p.add_argument("--out", default=str(runs_dir("bench-round-cost")))
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds = 2, 4
    return args


def run(args: argparse.Namespace, work: Path) -> list[dict]:
    plan = Plan(nodes=args.nodes, rounds=args.rounds, preset=args.preset, mixes=list(MIXES), transport="memory",
                heterogeneous=False, overrides=["eval.every=0", *args.overrides], out=work)
    plan.validate()
    runs = []
    for mix in MIXES:
        name = f"mix{mix[0]}-{mix[1]}"
        MemoryTestnet(plan, mix, 0, work / name, None).run()
        runs.append({"mix": f"{mix[0]}/{mix[1]}",
                     "nodes": [{"run_dir": str(work / name / f"node{i}")} for i in range(args.nodes)]})
    return round_costs(runs)


def plot(table: list[dict], path: Path) -> None:
    plt = pyplot()
    parts = [("t_generate", "generate"), ("t_score", "score own"), ("t_train", "train"),
             *((f"t_exchange_{p}", f"exchange: {p}") for p in EXCHANGE_PARTS)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(table)
    for n, (key, label) in enumerate([*parts, (None, "rest (bookkeeping)")]):
        values = ([max(0.0, r["t_round"] - b) for r, b in zip(table, bottom)] if key is None
                  else [r[key] for r in table])
        if any(values):
            ax.bar([r["mix"] for r in table], values, bottom=bottom, label=label, color=plt.cm.tab20(n))
            bottom = [b + v for b, v in zip(bottom, values)]
    for i, r in enumerate(table):
        ax.text(i, r["t_round"], f"{r['t_round']:.3g} s" + (f", {r['round_vs_silo']:.2f}x silo"
                                                            if r["round_vs_silo"] else ""), ha="center", va="bottom")
    ax.set_ylim(0, 1.15 * max(r["t_round"] for r in table))
    ax.set(ylabel="wall seconds per round (mean)", title="what a round costs, by phase")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as work:
        table = run(args, Path(work))
    print("\n".join(round_cost_text(table)))
    result = {"preset": args.preset, "nodes": args.nodes, "rounds": args.rounds, "overrides": args.overrides,
              "machine": f"{platform.processor() or platform.machine()}, {platform.system()}", "table": table}
    write_result(out, "bench_round_cost", result, lambda result, path: plot(result["table"], path))
    print(f"wrote {out / 'bench_round_cost.json'} and .png")


if __name__ == "__main__":
    main()
