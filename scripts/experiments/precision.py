"""Learning parity of a low-precision sampler: does sampling from an int8 copy of the policy, with the
mismatch corrected by tis(...), learn like sampling from the float32 learner itself?

Three arms, same preset, same seeds, the learner always trains float32 weights:
    fp32              sampling.precision = fp32: the learner's own weights sample (today's path)
    int8_tis          sampling.precision = int8: an int8 copy samples; the node wraps the local
                      objective in tis(...) (node/train/assembly.py local_objective)
    int8_uncorrected  the same int8 copy, the objective left unwrapped (the ablation: what the
                      correction buys)
Optional arms: bf16_tis (a bf16 copy samples, tis corrects: what `auto` picks on a CPU with native
bf16) and lean (the 2 GB configuration: LoRA on bf16 weights, docs/benchmarks.md "A SmolLM2 round in
2 GB"). Per arm and seed: reward per round, its cumulative sum, the sampler's mismatch to the learner
(sampler_logp_diff, sampler_kl) and the tis weight's ESS and truncation fraction, and held-out
greedy pass@1 of the LEARNER's float32 weights (evaluated with its own generator, never the copy)
every --eval-every rounds. Parity: int8_tis's mean cumulative reward within one std of fp32's.

    .venv/bin/python -m scripts.experiments.precision               # tiny, 3 seeds x 300 rounds
    .venv/bin/python -m scripts.experiments.precision --preset tiny-warm --rounds 150
    .venv/bin/python -m scripts.experiments.precision --preset smollm2 --rounds 15 --seeds 1 --threads 2 \\
        --arms fp32,bf16_tis,int8_tis,int8_uncorrected,lean --eval-every 15 --eval-tasks 8
    .venv/bin/python -m scripts.experiments.precision --quick       # smoke: 6 rounds, 1 seed

Writes <out>/exp_precision.json and <out>/exp_precision.png (default out runs/exp_precision).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import arg_parser, pyplot, runs_dir, write_result

# arm -> sampling.precision, whether the node's tis correction stays on, extra overrides
ARMS = {
    "fp32": ("fp32", True, []),
    "int8_tis": ("int8", True, []),
    "int8_uncorrected": ("int8", False, []),
    "bf16_tis": ("bf16", True, []),
    # the 2 GB configuration (docs/benchmarks.md "A SmolLM2 round in 2 GB"): LoRA on bf16 weights that sample themselves
    "lean": ("auto", True, ["optim.lora_rank=8", "model.dtype=\"bfloat16\"", "optim.backward_chunk_tokens=256"]),
}
DEFAULT_ARMS = ("fp32", "int8_tis", "int8_uncorrected")
COLORS = {"fp32": "tab:blue", "int8_tis": "tab:green", "int8_uncorrected": "tab:red", "bf16_tis": "tab:cyan",
          "lean": "tab:purple"}
# smollm2: the small run of scripts/experiments/offpolicy.py (one-digit synthetic families in the chat template,
# where SmolLM2 starts at a 6-22% pass rate) at lr 1e-5, 4 prompts x 8 x 48 tokens
PRESET_OVERRIDES = {
    "smollm2": ["tasks.source=synthetic", "tasks.datasets={copy = 1.0, succ = 1.0, add = 1.0}",
                "tasks.prompts_per_round=4", "sampling.group_size=8", "sampling.max_new_tokens=48",
                "verifier.format_weight=0.0", "optim.lr=1e-5", "eval.ood={}"],
}
PER_ROUND = ("reward_mean", "sampler_logp_diff", "sampler_kl", "tis_weight_ess", "tis_trunc_frac")


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--preset", choices=["tiny", "tiny-warm", "smollm2"], default="tiny")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=50, help="held-out pass@1 of the learner every N rounds")
    p.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks per family")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"subset of {','.join(ARMS)}")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="extra config override")
    p.add_argument("--quick", action="store_true", help="smoke mode: 6 rounds, 1 seed, 4 held-out tasks")
    p.add_argument("--out", type=Path, default=runs_dir("exp_precision"))
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seeds, args.eval_every, args.eval_tasks = 6, 1, 3, 4
    args.arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or args.rounds < 1 or args.seeds < 1 or args.eval_every < 1:
        p.error(f"--arms from {', '.join(ARMS)} (got {unknown}); --rounds, --seeds, --eval-every >= 1")
    return args


def learner_evaluator(parts, args):
    """Held-out pass@1 of the learner's float32 weights: the node's Evaluator on a SamplingContext
    whose generator is the learner itself (the copy would grade the sampler, not what was learned)."""
    from node.train.eval import Evaluator
    from node.tasks import make_source
    from policy.generation import HFGenerator

    cfg = parts.cfg
    learner = HFGenerator(parts.policy.model, parts.policy.tokenizer)
    ctx = dataclasses.replace(parts.sampling, generator=learner)
    ood = make_source(cfg.tasks.source, cfg.eval.ood, cfg.tasks.seed) if cfg.eval.ood else None
    return Evaluator(cfg.eval.model_copy(update={"every": args.eval_every, "tasks_per_family": args.eval_tasks,
                                                 "k": 1}), ctx, ood)


def run_arm(arm: str, seed: int, args) -> dict:
    from node.train.assembly import build_parts
    from node.config.schema import load_config
    from node.train.loop import Node
    from policy.losses import make_objective

    precision, corrected, arm_overrides = ARMS[arm]
    cfg = load_config(args.preset, None, [f"sampling.precision=\"{precision}\"", f"run.seed={seed}",
                                          f"model.init_seed={seed}", f"tasks.seed={seed}", "eval.every=0",
                                          f"run.threads={args.threads}", *PRESET_OVERRIDES.get(args.preset, []),
                                          *arm_overrides, *args.overrides])
    parts = build_parts(cfg)
    if not corrected:  # the ablation: the same copy samples, nothing corrects its mismatch
        parts = dataclasses.replace(parts, objective=make_objective(cfg.loss.name, **cfg.loss.knobs))
    evaluator = learner_evaluator(parts, args)
    rows, evals = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="exp-precision-") as run_dir:
        node = Node(cfg, Path(run_dir), parts=parts)
        for k in range(args.rounds):
            row = node.run_round(k)
            rows.append({key: row.get(key) for key in PER_ROUND})
            if (k + 1) % args.eval_every == 0 or k + 1 == args.rounds:
                evals.append({"round": k, "pass1": evaluator.evaluate()["heldout_pass1"]})
    rewards = [r["reward_mean"] for r in rows]
    return {"arm": arm, "seed": seed, "objective": parts.objective.spec, "precision": precision,
            "cumulative_reward": sum(rewards), "final_pass1": evals[-1]["pass1"], "evals": evals,
            "rows": rows, "seconds": time.perf_counter() - started,
            **{f"mean_{key}": _mean(r[key] for r in rows) for key in PER_ROUND[1:]}}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def summarize(runs: list[dict]) -> dict:
    summary = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {"objective": mine[0]["objective"],
                        "cumulative_reward": _mean_std([r["cumulative_reward"] for r in mine]),
                        "final_pass1": _mean_std([r["final_pass1"] for r in mine]),
                        **{f"mean_{key}": _mean(r[f"mean_{key}"] for r in mine) for key in PER_ROUND[1:]}}
    parity = {}
    if "fp32" in summary:  # each arm against the float32 sampler: its mean within one std (the larger)
        ref = summary["fp32"]["cumulative_reward"]
        parity = {arm: abs(s["cumulative_reward"]["mean"] - ref["mean"]) <= max(ref["std"], s["cumulative_reward"]["std"])
                  for arm, s in summary.items() if arm != "fp32"}
    return {"arms": summary, "within_one_std_of_fp32": parity}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    runs, summary = result["runs"], result["summary"]["arms"]
    arms = [a for a in ARMS if a in summary]
    fig, (ax_reward, ax_pass, ax_bar) = plt.subplots(1, 3, figsize=(15, 4.4))
    for arm in arms:
        curves = [[sum(x["reward_mean"] for x in r["rows"][: k + 1]) for k in range(len(r["rows"]))]
                  for r in runs if r["arm"] == arm]
        mean = [statistics.fmean(c[k] for c in curves) for k in range(len(curves[0]))]
        ax_reward.plot(mean, color=COLORS[arm], label=f"{arm} ({summary[arm]['objective']})")
        evals = [r["evals"] for r in runs if r["arm"] == arm]
        xs = [e["round"] for e in evals[0]]
        ys = [statistics.fmean(ev[i]["pass1"] for ev in evals) for i in range(len(xs))]
        ax_pass.plot(xs, ys, marker="o", color=COLORS[arm], label=arm)
    ax_reward.set(title="cumulative reward (mean over seeds)", xlabel="round")
    ax_pass.set(title="held-out greedy pass@1 of the float32 learner", xlabel="round", ylim=(0, 1))
    stats = [summary[a]["cumulative_reward"] for a in arms]
    bars = ax_bar.bar(arms, [s["mean"] for s in stats], yerr=[s["std"] for s in stats],
                      color=[COLORS[a] for a in arms], capsize=6)
    ax_bar.bar_label(bars, labels=[f"{s['mean']:.1f} ± {s['std']:.1f}" for s in stats], label_type="center",
                     color="white", fontsize=9)
    ax_bar.set_title(f"cumulative reward, {result['seeds']} seeds (mean ± std)")
    ax_reward.legend(fontsize=8)
    ax_pass.legend(fontsize=8)
    fig.suptitle(f"{result['preset']}, {result['rounds']} rounds: int8 sampler with / without tis vs float32",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started, load_start = time.perf_counter(), os.getloadavg()
    runs = []
    for seed in range(args.seeds):
        for arm in args.arms:
            runs.append(run_arm(arm, seed, args))
            r = runs[-1]
            print(f"{arm:17s} seed {seed}: cumulative reward {r['cumulative_reward']:.2f}, final pass@1 "
                  f"{r['final_pass1']:.3f}, |l-b| {r['mean_sampler_logp_diff']:.2e}, {r['seconds']:.0f} s", flush=True)
    result = {"preset": args.preset, "rounds": args.rounds, "seeds": args.seeds, "overrides": args.overrides,
              "summary": summarize(runs), "runs": runs, "wall_s": time.perf_counter() - started,
              "load_average_start_end": [load_start, os.getloadavg()], "threads": args.threads,
              "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}"}
    json_path, png_path = write_result(args.out, "exp_precision", result, plot, indent=2, newline=True)
    for arm, s in result["summary"]["arms"].items():
        c, p = s["cumulative_reward"], s["final_pass1"]
        print(f"{arm:17s} {s['objective']:10s} cumulative reward {c['mean']:.2f} ± {c['std']:.2f}, final "
              f"pass@1 {p['mean']:.3f} ± {p['std']:.3f}, mean |l-b| {s['mean_sampler_logp_diff']:.2e}")
    print(f"within one std of fp32's cumulative reward: {result['summary'].get('within_one_std_of_fp32')}; "
          f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
