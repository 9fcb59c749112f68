"""Measure the "fast" device profile of a preset for the compute-clock testnet (node/testnet/clock.py).

    .venv/bin/python -m scripts.tools.measure_profile --preset tiny-warm [--nodes 4] [--rounds 60] [--repeats 3]
                                                       [--set key=value ...]

Runs in-process testnets of every treatment the experiments charge (ARMS: a silo and a 4/4 swarm,
each training its own failures or dropping them, and a silo replaying its own past groups), each
node on one CPU thread (the memory testnet on the rounds clock, so every node does a swarm's real
exchange work), and fits every rate of the profile on their rounds, phase by phase, with
non-negative least squares:

    t_generate = tokens_generated / gen_rate + generate_calls * generate_call_s
    t_train    = train_fixed + tokens_trained / train_rate + optimizer_steps * optimizer_step_s
                 + groups_external * external_group_s
    t_exchange = messages_checked * check_s + groups_verified * verify_s + messages_published * publish_s
                 + messages_skimmed * skim_s
                 + hint_generate_calls * generate_call_s + hint_tokens_generated / gen_rate   (the last
                 two from the generation fit, subtracted first)

round_overhead_s = train_fixed + the mean rest of a round (scoring, composing). Prints the fit, the
charged/wall ratio it gives each treatment on the rounds it was fitted on (the clock is fair when
they are within 10% of each other), and the MEASURED line to paste. Measure on an idle machine (or
run this at `nice -n -19`): wall time measures the load too. The first two rounds of every node are
warm-up and not counted.
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
# (mix, overrides): the treatments whose rounds the profile must charge alike
ARMS: dict[str, tuple[tuple[int, int], list[str]]] = {
    "8/0 own failures trained": ((8, 0), ["loss.off_policy.own_failures=train"]),
    "8/0 own failures dropped": ((8, 0), ["loss.off_policy.own_failures=drop"]),
    "4/4 own failures trained": ((4, 4), ["loss.off_policy.own_failures=train"]),
    "4/4 own failures dropped": ((4, 4), ["loss.off_policy.own_failures=drop"]),
    "8/4 self-replay": ((8, 4), ["swarm.self_replay=true"]),
}


def swarm_rows(preset: str, nodes: int, rounds: int, extra: list[str], out: Path, repeats: int = 1
               ) -> dict[str, list[dict]]:
    """Every counted round of every node, per treatment: the treatments in turn, `repeats` times over
    (the same seed each time), so a slow spell of the machine falls on all of them alike."""
    rows: dict[str, list[dict]] = {name: [] for name in ARMS}
    for repeat in range(repeats):
        for k, (name, (mix, overrides)) in enumerate(ARMS.items()):
            plan = Plan(nodes=nodes, rounds=rounds, preset=preset, mixes=[mix], transport="memory",
                        heterogeneous=False, overrides=["eval.every=0", *overrides, *extra], out=out)
            plan.validate()
            run_dir = out / f"arm{k}-{repeat}"
            MemoryTestnet(plan, mix, 0, run_dir, None).run()
            rows[name] += [r for i in range(nodes) for r in read_metrics(run_dir / f"node{i}")[WARMUP:]]
    return rows


def fit(columns: list[list[float]], target: list[float]) -> list[float]:
    """Non-negative coefficients c with target ~ sum_k c_k * columns[k]."""
    coefficients, _ = nnls(np.array(columns, dtype=float).T, np.array(target, dtype=float))  # [rows, k] -> [k]
    return coefficients.tolist()


def fit_profile(rows: list[dict]) -> DeviceProfile:
    def col(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in rows]

    per_token, per_call = fit([col("tokens_generated"), col("generate_calls")], col("t_generate"))
    train_fixed, per_trained, per_step, per_external = fit(
        [[1.0] * len(rows), col("tokens_trained"), col("optimizer_steps"), col("groups_external")], col("t_train"))
    hints = [c * per_call + t * per_token for c, t in zip(col("hint_generate_calls"), col("hint_tokens_generated"))]
    check, verify, publish, skim = fit([col("messages_checked"), col("groups_verified"), col("messages_published"),
                                        col("messages_skimmed")], [t - h for t, h in zip(col("t_exchange"), hints)])
    rest = mean(r["t_round"] - r["t_generate"] - r["t_exchange"] - r["t_train"] for r in rows)
    return DeviceProfile("fast", gen_tokens_per_s=1.0 / max(per_token, 1e-12),
                         train_tokens_per_s=1.0 / max(per_trained, 1e-12), round_overhead_s=train_fixed + rest,
                         generate_call_s=per_call, message_check_s=check, group_verify_s=verify,
                         message_publish_s=publish, message_skim_s=skim, optimizer_step_s=per_step,
                         external_group_s=per_external)


def main() -> None:
    parser = arg_parser(__spec__, __doc__.split("\n")[0], formatter_class=argparse.HelpFormatter)
    parser.add_argument("--preset", default="tiny-warm")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="each treatment's testnet this many times, in turn")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override on every node (e.g. sampling.max_new_tokens=48)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = swarm_rows(args.preset, args.nodes, args.rounds, args.overrides, Path(tmp), args.repeats)
    profile = fit_profile([r for mix_rows in rows.values() for r in mix_rows])
    print(f"fitted on {sum(map(len, rows.values()))} rounds: {profile}")
    for name, arm_rows in rows.items():
        charged = [{**r, "cost_s": round_cost(r, profile)} for r in arm_rows]
        phases = {key: mean(r[key] for r in arm_rows) for key in ("t_generate", "t_exchange", "t_train", "t_round")}
        print(f"{name}: charged/wall {charged_over_wall(charged):.2f}; mean wall s per round: "
              + ", ".join(f"{key[2:]} {value:.4f}" for key, value in phases.items()))
    print(f'    "{args.preset}": DeviceProfile("fast", gen_tokens_per_s={profile.gen_tokens_per_s:.4g}, '
          f"train_tokens_per_s={profile.train_tokens_per_s:.4g}, round_overhead_s={profile.round_overhead_s:.3g}, "
          f"generate_call_s={profile.generate_call_s:.3g}, message_check_s={profile.message_check_s:.3g}, "
          f"group_verify_s={profile.group_verify_s:.3g}, message_publish_s={profile.message_publish_s:.3g}, "
          f"message_skim_s={profile.message_skim_s:.3g}, optimizer_step_s={profile.optimizer_step_s:.3g}, "
          f"external_group_s={profile.external_group_s:.3g}),")


if __name__ == "__main__":
    main()
