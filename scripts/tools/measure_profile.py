"""Measure the "fast" device profile of a preset for the compute-clock testnet (node/testnet/clock.py).

    .venv/bin/python -m scripts.tools.measure_profile --preset tiny-warm [--nodes 4] [--rounds 60] [--set key=value ...]

Runs a silo (mix 8/0) and a swarm (4/4) of in-process nodes on one CPU thread each (the memory
testnet on the rounds clock, so every node does a swarm's real exchange work) and fits every rate of
the profile on their rounds, phase by phase, with non-negative least squares:

    t_generate = tokens_generated / gen_rate + generate_calls * generate_call_s
    t_train    = train_fixed + tokens_trained / train_rate
    t_exchange = messages_checked * check_s + groups_verified * verify_s + messages_published * publish_s
                 + messages_skimmed * skim_s
                 + hint_generate_calls * generate_call_s + hint_tokens_generated / gen_rate   (the last
                 two from the generation fit, subtracted first)

round_overhead_s = train_fixed + the mean rest of a round (scoring, composing). Prints the fit, the
charged/wall ratio it gives each mix on the rounds it was fitted on, and the MEASURED line to paste.
The first two rounds of every node are warm-up and not counted.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import mean

import numpy as np
from scipy.optimize import nnls

from node.observe.metrics import read_metrics
from node.testnet.clock import DeviceProfile, charged_over_wall, round_cost
from node.testnet.memory import MemoryTestnet
from node.testnet.plan import Plan
from scripts.common import arg_parser

WARMUP = 2
MIXES = ((8, 0), (4, 4))


def swarm_rows(preset: str, nodes: int, rounds: int, extra: list[str], out: Path) -> dict[str, list[dict]]:
    """Every counted round of every node, per mix."""
    plan = Plan(nodes=nodes, rounds=rounds, preset=preset, mixes=list(MIXES), transport="memory",
                heterogeneous=False, overrides=["eval.every=0", *extra], out=out)
    plan.validate()
    rows: dict[str, list[dict]] = {}
    for mix in MIXES:
        run_dir = out / f"mix{mix[0]}-{mix[1]}"
        MemoryTestnet(plan, mix, 0, run_dir, None).run()
        rows[f"{mix[0]}/{mix[1]}"] = [r for i in range(nodes) for r in read_metrics(run_dir / f"node{i}")[WARMUP:]]
    return rows


def fit(columns: list[list[float]], target: list[float]) -> list[float]:
    """Non-negative coefficients c with target ~ sum_k c_k * columns[k]."""
    coefficients, _ = nnls(np.array(columns, dtype=float).T, np.array(target, dtype=float))  # [rows, k] -> [k]
    return coefficients.tolist()


def fit_profile(rows: list[dict]) -> DeviceProfile:
    def col(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in rows]

    per_token, per_call = fit([col("tokens_generated"), col("generate_calls")], col("t_generate"))
    train_fixed, per_trained = fit([[1.0] * len(rows), col("tokens_trained")], col("t_train"))
    hints = [c * per_call + t * per_token for c, t in zip(col("hint_generate_calls"), col("hint_tokens_generated"))]
    check, verify, publish, skim = fit([col("messages_checked"), col("groups_verified"), col("messages_published"),
                                        col("messages_skimmed")], [t - h for t, h in zip(col("t_exchange"), hints)])
    rest = mean(r["t_round"] - r["t_generate"] - r["t_exchange"] - r["t_train"] for r in rows)
    return DeviceProfile("fast", gen_tokens_per_s=1.0 / max(per_token, 1e-12),
                         train_tokens_per_s=1.0 / max(per_trained, 1e-12), round_overhead_s=train_fixed + rest,
                         generate_call_s=per_call, message_check_s=check, group_verify_s=verify,
                         message_publish_s=publish, message_skim_s=skim)


def main() -> None:
    parser = arg_parser(__spec__, __doc__.split("\n")[0], formatter_class=argparse.HelpFormatter)
    parser.add_argument("--preset", default="tiny-warm")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override on every node (e.g. sampling.max_new_tokens=48)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = swarm_rows(args.preset, args.nodes, args.rounds, args.overrides, Path(tmp))
    profile = fit_profile([r for mix_rows in rows.values() for r in mix_rows])
    print(f"fitted on {sum(map(len, rows.values()))} rounds: {profile}")
    for mix, mix_rows in rows.items():
        charged = [{**r, "cost_s": round_cost(r, profile)} for r in mix_rows]
        phases = {key: mean(r[key] for r in mix_rows) for key in ("t_generate", "t_exchange", "t_train", "t_round")}
        print(f"{mix}: charged/wall {charged_over_wall(charged):.2f}; mean wall s per round: "
              + ", ".join(f"{key[2:]} {value:.4f}" for key, value in phases.items()))
    print(f'    "{args.preset}": DeviceProfile("fast", gen_tokens_per_s={profile.gen_tokens_per_s:.4g}, '
          f"train_tokens_per_s={profile.train_tokens_per_s:.4g}, round_overhead_s={profile.round_overhead_s:.3g}, "
          f"generate_call_s={profile.generate_call_s:.3g}, message_check_s={profile.message_check_s:.3g}, "
          f"group_verify_s={profile.group_verify_s:.3g}, message_publish_s={profile.message_publish_s:.3g}, "
          f"message_skim_s={profile.message_skim_s:.3g}),")


if __name__ == "__main__":
    main()
