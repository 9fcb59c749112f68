"""Measure the "fast" device profile of a preset for the compute-clock testnet (node/testnet/clock.py).

    .venv/bin/python -m scripts.tools.measure_profile --preset tiny-warm [--nodes 4] [--rounds 60] [--repeats 3]
                                                       [--set key=value ...]

Runs in-process testnets of every treatment the experiments charge (ARMS: a silo and a 4/4 swarm,
each training its own failures or dropping them, and a silo replaying its own past groups), each
node on one CPU thread (the memory testnet on the rounds clock, so every node does a swarm's real
exchange work), and fits every rate of the profile on their rounds, phase by phase, with
non-negative least squares:

    t_generate = tokens_generated / gen_rate + generate_calls * generate_call_s
                 + generate_steps * generate_step_s + generate_prompts * prompt_prefill_s
    t_train    = train_fixed + tokens_trained / train_rate + optimizer_steps * optimizer_step_s
                 + groups_external * external_group_s + tokens_forwarded * forward_token_s
    t_exchange = messages_checked * check_s + groups_verified * verify_s + messages_published * publish_s
                 + messages_skimmed * skim_s
                 + hint writing at the generation fit's rates (subtracted first)

round_overhead_s = train_fixed + the mean rest of a round (scoring, composing). Prints the fit, the
charged/wall ratio it gives each treatment on the rounds it was fitted on (the clock is fair when
they are within 10% of each other), and the MEASURED line to paste. `--check` fits nothing: it runs
the treatments (on another `--seed`) and prints the charged/wall that the profile in
node/testnet/clock.py gives each, the out-of-sample test of a fit. Measure on an idle machine (or
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
from node.testnet.clock import (DeviceProfile, charged_over_wall, exchange_cost, fast_profile, generation_cost,
                                round_cost, training_cost)
from node.testnet.memory import MemoryTestnet
from node.testnet.plan import Plan
from scripts.common import arg_parser

WARMUP = 2
# (mix, overrides): the treatments whose rounds the profile must charge alike: the skeptic's test's
# arms (scripts/experiments/skeptic.py), its silo sweep's extremes (32 prompts a round: four generator
# batches) included
ARMS: dict[str, tuple[tuple[int, int], list[str]]] = {
    "8/0 own failures trained": ((8, 0), ["loss.off_policy.own_failures=train"]),
    "8/0 own failures dropped": ((8, 0), ["loss.off_policy.own_failures=drop"]),
    "4/4 own failures trained": ((4, 4), ["loss.off_policy.own_failures=train"]),
    "4/4 own failures dropped": ((4, 4), ["loss.off_policy.own_failures=drop"]),
    "8/4 self-replay": ((8, 4), ["swarm.self_replay=true"]),
    "16/0 own failures trained": ((16, 0), ["loss.off_policy.own_failures=train"]),
    "32/0 own failures trained": ((32, 0), ["loss.off_policy.own_failures=train"]),
    "4/0 at G=16": ((4, 0), ["sampling.group_size=16", "loss.off_policy.own_failures=train"]),
    "4/4 minpro, failures trained": ((4, 4), ["loss.off_policy.sender_logprobs=true", "loss.external=minpro",
                                              "loss.off_policy.peer_failures=train",
                                              "loss.off_policy.own_failures=train"]),
}


def swarm_rows(preset: str, nodes: int, rounds: int, extra: list[str], out: Path, repeats: int = 1,
               seed: int = 0) -> dict[str, list[dict]]:
    """Every counted round of every node, per treatment: the treatments in turn, `repeats` times over
    (the same seed each time), so a slow spell of the machine falls on all of them alike."""
    for repeat in range(repeats):
        for k, (name, (mix, overrides)) in enumerate(ARMS.items()):
            plan = Plan(nodes=nodes, rounds=rounds, preset=preset, mixes=[mix], transport="memory",
                        heterogeneous=False, overrides=["eval.every=0", *overrides, *extra], out=out)
            plan.validate()
            MemoryTestnet(plan, mix, seed, out / f"arm{k}-{repeat}", None).run()
    return saved_rows(out)


def saved_rows(out: Path) -> dict[str, list[dict]]:
    """The counted rounds of the testnets under `out` (arm<k>-<repeat>/node<i>), per treatment."""
    rows: dict[str, list[dict]] = {name: [] for name in ARMS}
    for k, name in enumerate(ARMS):
        for node_dir in sorted(out.glob(f"arm{k}-*/node*")):
            rows[name] += read_metrics(node_dir)[WARMUP:]
    return rows


def phase_ratios(rows: list[dict], profile: DeviceProfile) -> str:
    """Charged over wall per phase: which part of a round the profile gets wrong."""
    parts = (("generate", generation_cost, "t_generate"), ("train", training_cost, "t_train"),
             ("exchange", exchange_cost, "t_exchange"))
    return ", ".join(f"{name} {sum(cost(r, profile) for r in rows) / spent:.2f}" for name, cost, key in parts
                     if (spent := sum(r[key] for r in rows)) > 1e-9)


def fit(columns: list[list[float]], target: list[float]) -> list[float]:
    """Non-negative coefficients c with target ~ sum_k c_k * columns[k]."""
    coefficients, _ = nnls(np.array(columns, dtype=float).T, np.array(target, dtype=float))  # [rows, k] -> [k]
    return coefficients.tolist()


def fit_profile(rows: list[dict]) -> DeviceProfile:
    def col(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in rows]

    per_token, per_call, per_step_decode, per_prompt = fit(
        [col("tokens_generated"), col("generate_calls"), col("generate_steps"), col("generate_prompts")],
        col("t_generate"))
    train_fixed, per_trained, per_step, per_external, per_forwarded = fit(
        [[1.0] * len(rows), col("tokens_trained"), col("optimizer_steps"), col("groups_external"),
         col("tokens_forwarded")], col("t_train"))
    hints = [c * per_call + b * per_step_decode + p * per_prompt + t * per_token
             for c, b, p, t in zip(col("hint_generate_calls"), col("hint_generate_steps"),
                                   col("hint_generate_prompts"), col("hint_tokens_generated"))]
    check, verify, publish, skim = fit([col("messages_checked"), col("groups_verified"), col("messages_published"),
                                        col("messages_skimmed")], [t - h for t, h in zip(col("t_exchange"), hints)])
    rest = mean(r["t_round"] - r["t_generate"] - r["t_exchange"] - r["t_train"] for r in rows)
    return DeviceProfile("fast", gen_tokens_per_s=1.0 / max(per_token, 1e-12),
                         train_tokens_per_s=1.0 / max(per_trained, 1e-12), round_overhead_s=train_fixed + rest,
                         generate_call_s=per_call, message_check_s=check, group_verify_s=verify,
                         message_publish_s=publish, message_skim_s=skim, optimizer_step_s=per_step,
                         external_group_s=per_external, generate_step_s=per_step_decode, prompt_prefill_s=per_prompt,
                         forward_token_s=per_forwarded)


def main() -> None:
    parser = arg_parser(__spec__, __doc__.split("\n")[0], formatter_class=argparse.HelpFormatter)
    parser.add_argument("--preset", default="tiny-warm")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="each treatment's testnet this many times, in turn")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override on every node (e.g. sampling.max_new_tokens=48)")
    parser.add_argument("--seed", type=int, default=0, help="the testnets' seed (a --check uses another one)")
    parser.add_argument("--check", action="store_true",
                        help="fit nothing: the charged/wall the preset's profile in node/testnet/clock.py gives each "
                             "treatment on these rounds")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="run the testnets in DIR and keep them "
                        "(default: a temporary directory)")
    parser.add_argument("--refit", type=Path, metavar="DIR", help="run nothing: fit (or --check) the rounds a "
                        "--keep run left in DIR")
    args = parser.parse_args()
    if args.refit:
        rows = saved_rows(args.refit)
    elif args.keep:
        rows = swarm_rows(args.preset, args.nodes, args.rounds, args.overrides, args.keep, args.repeats, args.seed)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            rows = swarm_rows(args.preset, args.nodes, args.rounds, args.overrides, Path(tmp), args.repeats,
                              args.seed)
    counted = [r for arm_rows in rows.values() for r in arm_rows]
    if args.check:
        profile = fast_profile(args.preset)
        print(f"checking the profile in node/testnet/clock.py on {len(counted)} rounds: {profile}")
    else:
        profile = fit_profile(counted)
        print(f"fitted on {len(counted)} rounds: {profile}")
    for name, arm_rows in rows.items():
        charged = [{**r, "cost_s": round_cost(r, profile)} for r in arm_rows]
        phases = {key: mean(r[key] for r in arm_rows) for key in ("t_generate", "t_exchange", "t_train", "t_round")}
        print(f"{name}: charged/wall {charged_over_wall(charged):.2f} ({phase_ratios(arm_rows, profile)}); mean "
              "wall s per round: " + ", ".join(f"{key[2:]} {value:.4f}" for key, value in phases.items()))
    if args.check:
        return
    print(f'    "{args.preset}": DeviceProfile("fast", gen_tokens_per_s={profile.gen_tokens_per_s:.4g}, '
          f"train_tokens_per_s={profile.train_tokens_per_s:.4g}, round_overhead_s={profile.round_overhead_s:.3g}, "
          f"generate_call_s={profile.generate_call_s:.3g}, message_check_s={profile.message_check_s:.3g}, "
          f"group_verify_s={profile.group_verify_s:.3g}, message_publish_s={profile.message_publish_s:.3g}, "
          f"message_skim_s={profile.message_skim_s:.3g}, optimizer_step_s={profile.optimizer_step_s:.3g}, "
          f"external_group_s={profile.external_group_s:.3g}, generate_step_s={profile.generate_step_s:.3g}, "
          f"prompt_prefill_s={profile.prompt_prefill_s:.3g}, forward_token_s={profile.forward_token_s:.3g}),")


if __name__ == "__main__":
    main()
