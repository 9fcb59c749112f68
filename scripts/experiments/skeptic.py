"""The swarm against the silo, as a skeptic would run it: every cost charged, a tuned silo, controls.

Every arm is an in-process tiny-warm testnet (node/testnet/memory.py) on the compute clock, which
charges each node all the work it did, exchange included (node/testnet/clock.py), until one fixed
virtual budget; held-out pass@1 is measured on one virtual-time grid shared by every arm
(node/testnet/grid.py). Three stages:

  budget   the virtual time the default silo's fast nodes need for --rounds rounds (tuning seed)
  tune     the silo swept over prompts per round {8, 16, 32} x learning rate {0.5, 1, 2} x the
           preset's, on --tune-seeds seeds of their own; the best is chosen on TRAINING reward (mean
           own reward over the second half of the budget), never on held-out
  final    every arm on --seeds paired seeds (seed s: the same warm model and task draws in every arm)
  confirm  (--confirm-seeds K) the claim the final stage points to (swarm-positive), re-tested on K fresh
           seeds against the best silo, the best positive-only silo (its learning rate tuned on the
           tuning seeds, on training reward) and its own controls (frozen peers, self-replay, both
           dropping their own failures): swarm-positive was added after three final seeds had been
           seen, so the final stage cannot confirm it by itself

Arms of the final stage (docs/testnets-and-experiments.md "The swarm against the silo"):
  silo            8/0, the preset's settings but its own failures trained (every arm but the
                  positive ones trains them: the preset drops them since this experiment)
  silo-best       the tuned silo
  swarm           4/4, peers' groups at ratio 1, only their correct samples trained (the default)
  self-replay     8/4: the silo's 8 own groups plus 4 slots filled with its own earlier groups with
                  reward variance, trained exactly as peers' (swarm.self_replay; at 4/4 a node has
                  too few such groups of its own to fill the slots: about 0.8 of 4 a round)
  positive-only   8/0, the node's own failures dropped as peers' are (loss.off_policy.own_failures)
  swarm-positive  4/4 with the node's own failures dropped too: the swarm against positive-only at the
                  same treatment of failures
  frozen-peers    4/4 whose peers are warm-start copies that never learn (--frozen-peers; 2N nodes:
                  N measured hearing N frozen, so each hears as many peers as in `swarm`)
  entropy-silo    4/0 at G = 16: the silo's rollouts per round spent on more samples per prompt,
                  fewer groups without reward variance (DAPO's remedy for entropy collapse is more
                  samples, not a different loss)
  join-old        4/4 as `join` shipped: minpro on the sender's log-probs, failures trained
  sapo            4/4 as SAPO: ratio 1, failures trained

Reported per arm: held-out pass@1 at the budget and AUC over the grid (mean over measured nodes,
sample std over seeds), pass@8 and pass@32 at the budget (eval.pass_at: 32 samples a task at the
sampling temperature, the unbiased estimator, node/train/eval.py), distinct successes per virtual
second (the row's distinct_successes: own and peers' correct completions the updates could use),
paired differences against the best silo, the default silo and (for the
controls) the swarm with 95% bootstrap CIs (node/testnet/stats.py), training reward, entropy,
distinct completions, flat-group share, charged/wall (and charged/CPU: over the rounds' thread CPU
time, which a busy machine barely changes), rounds. Writes <out>/exp_skeptic.json and
exp_skeptic.png; every run's result is kept (<out>/<stage>/<arm>/seed<k>.json) and reused on a rerun.

    .venv/bin/python -m scripts.experiments.skeptic           # 4 nodes, 8 seeds, 3 tuning seeds (hours)
    .venv/bin/python -m scripts.experiments.skeptic --quick   # smoke: 2 nodes, 2 seeds, a tiny budget (~40 s)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import shutil
from pathlib import Path
from statistics import mean

from scripts.common import arg_parser, command_line, pyplot, run_saved_jobs, runs_dir, write_json

PRESET = "tiny-warm"
LR = 1e-3  # the preset's
SWEEP = [(p, f) for p in (8, 16, 32) for f in (0.5, 1.0, 2.0)]  # prompts per round, lr factor
# every arm states how it treats its own failures: the preset drops them since this experiment
OWN_TRAIN, OWN_DROP = "loss.off_policy.own_failures=train", "loss.off_policy.own_failures=drop"
TRAIN_TREATMENT = ["loss.off_policy.sender_logprobs=false", "loss.off_policy.peer_failures=train", OWN_TRAIN]
ARMS: dict[str, dict] = {
    "silo": {"mix": (8, 0), "set": [OWN_TRAIN]},
    "swarm": {"mix": (4, 4), "set": [OWN_TRAIN]},
    "self-replay": {"mix": (8, 4), "set": ["swarm.self_replay=true", OWN_TRAIN]},
    "positive-only": {"mix": (8, 0), "set": [OWN_DROP]},
    "swarm-positive": {"mix": (4, 4), "set": [OWN_DROP]},
    "frozen-peers": {"mix": (4, 4), "frozen": True, "set": [OWN_TRAIN]},
    "entropy-silo": {"mix": (4, 0), "set": ["sampling.group_size=16", OWN_TRAIN]},
    "join-old": {"mix": (4, 4), "set": ["loss.off_policy.sender_logprobs=true", "loss.off_policy.peer_failures=train",
                                        "loss.external=minpro", OWN_TRAIN]},
    "sapo": {"mix": (4, 4), "set": TRAIN_TREATMENT},
}
# the confirm stage's controls of swarm-positive: its peers frozen, or its J slots refilled from its own past
POSITIVE_CONTROLS: dict[str, dict] = {
    "frozen-positive": {"mix": (4, 4), "frozen": True, "set": [OWN_DROP]},
    "self-replay-positive": {"mix": (8, 4), "set": ["swarm.self_replay=true", OWN_DROP]},
}
CONTROLS = ("self-replay", "positive-only", "frozen-peers", "entropy-silo")
# (arm, reference): does sharing still pay once both sides drop their own failures?
PAIRS = (("swarm-positive", "positive-only"), ("swarm-positive", "swarm"), ("swarm-positive", "silo-best"))
GRID_POINTS = 12  # held-out instants after 0, the same for every arm
# pass@k at the budget beside pass@1 (k samples at the sampling temperature, fixed seeds, never charged):
# does training on successes alone buy pass@1 at the cost of diversity?
PASS_AT = (8, 32)


def sweep_arm(prompts: int, factor: float) -> dict:
    return {"mix": (prompts, 0), "set": [f"optim.lr={LR * factor:g}", OWN_TRAIN]}


def sweep_name(prompts: int, factor: float) -> str:
    return f"silo-p{prompts}-lr{factor:g}x"


# the positive-only silo's learning rate, tuned as the silo's (at the silo sweep's best prompts per round)
POSITIVE_SWEEP = {f"positive-lr{f:g}x": {"mix": (8, 0), "set": [OWN_DROP, f"optim.lr={LR * f:g}"]}
                  for f in (0.5, 1.0, 2.0)}


# -- one run -------------------------------------------------------------------------------------
def run_arm(job: dict) -> dict:
    """One testnet of one arm and seed (in a worker process); its figures, saved to job["path"]."""
    import torch

    from node.testnet.memory import MemoryTestnet
    from node.testnet.plan import Plan

    torch.set_num_threads(1)
    arm, path = job["arm"], Path(job["path"])
    nodes = job["nodes"] * (2 if arm.get("frozen") else 1)
    sizes = [tuple(size) for size in job.get("model_sizes", ())]  # tiny shapes per node, cycled (weak peers)
    plan = Plan(nodes=nodes, rounds=job["rounds"], preset=PRESET, mixes=[tuple(arm["mix"])], transport="memory",
                heterogeneous=False, overrides=[*job["extra"], *arm.get("set", [])], out=path.parent,
                clock="compute", budget_s=job["budget"], grid_s=job["grid"], frozen_peers=bool(arm.get("frozen")),
                model_sizes=sizes)
    plan.validate()
    shutil.rmtree(path.with_suffix(""), ignore_errors=True)  # a run cut short must not be resumed from its checkpoints
    result = MemoryTestnet(plan, tuple(arm["mix"]), job["seed"], path.with_suffix(""), None,
                           budget_s=job["budget"]).run()
    figures = run_figures(result, sizes)
    path.write_text(json.dumps(figures, indent=1))
    return figures


FIGURE_KEYS = ("heldout", *(f"pass{k}" for k in PASS_AT), "auc", "train_reward", "successes_per_s", "rounds",
               "charged_over_wall", "charged_over_cpu", "entropy_mean", "distinct_completions", "flat_group_share")
# the paired comparisons: held-out pass@1 at the budget, its AUC over the grid, pass@8 at the budget
PAIRED_KEYS = ("heldout", "auc", f"pass{PASS_AT[0]}")


def shape_label(size: tuple[int, int]) -> str:
    """A tiny model's shape as --model-sizes writes it: WIDTHxLAYERS."""
    return "x".join(map(str, size))


def run_figures(result: dict, model_sizes: list[tuple[int, int]] = ()) -> dict:
    """A run's figures, means over its measured (not frozen) nodes, from the testnet report's own
    per-node figures (node/testnet/report_clock.py node_figures, node/testnet/report.py late_diversity).
    With `model_sizes` (cycled over the nodes, as --model-sizes), also the means per shape, "by_size"."""
    from node.testnet.clock import charged_over_wall
    from node.testnet.report import late_diversity, mean_of, measured
    from node.testnet.report_clock import mean_curve, node_figures

    budget = result["budget_s"]
    per_node = []
    for node in measured(result)["nodes"]:
        fig = node_figures(node)
        rows = fig["rows"]
        pass_at = node["evals"][-1].get("heldout_pass_at", {})  # the budget's point
        per_node.append({
            "heldout": fig["heldout_at_budget"], "auc": fig["auc"], "curve": fig["curve"],
            **{f"pass{k}": value for k, value in pass_at.items()},
            "train_reward": mean([r["reward_mean"] for r in rows if r["vtime"] >= budget / 2] or [0.0]),
            "successes_per_s": sum(r.get("distinct_successes", 0) for r in rows if r["vtime_end"] <= budget) / budget,
            "rounds": fig["rounds"], "charged_over_wall": charged_over_wall(rows),
            "charged_over_cpu": charged_over_wall(rows, "t_round_cpu"), **late_diversity(rows),
            "learned": fig["families"], "index": fig["index"],
        })
    out = {key: mean_of(per_node, key) for key in FIGURE_KEYS}
    if model_sizes:
        shape = {n["index"]: shape_label(model_sizes[n["index"] % len(model_sizes)]) for n in per_node}
        out["by_size"] = {label: {key: mean_of([n for n in per_node if shape[n["index"]] == label], key)
                                  for key in FIGURE_KEYS} for label in dict.fromkeys(shape.values())}
    grid, heldout = zip(*mean_curve([n["curve"] for n in per_node]))
    out["curve"] = {"t": list(grid), "heldout": list(heldout)}
    out["learned_runs"] = [n["learned"] for n in per_node]
    out["budget_s"], out["seed"], out["mix"] = budget, result["seed"], result["mix"]
    return out


# -- stages ----------------------------------------------------------------------------------------
def run_jobs(jobs: list[dict], workers: int) -> list[dict]:
    """Every job's figures, reusing those a previous run saved."""
    return run_saved_jobs(jobs, workers, run_arm)


def job(args, stage: str, name: str, arm: dict, seed: int, budget: float | None, grid: float | None) -> dict:
    return {"arm": arm, "seed": seed, "budget": budget, "grid": grid, "nodes": args.nodes, "rounds": args.rounds,
            "extra": args.extra, "path": str(Path(args.out) / stage / name / f"seed{seed}.json"),
            "label": f"{stage}/{name}/seed{seed}"}


def tune(args, budget: float, grid: float, sweep: dict[str, dict]) -> tuple[str, dict, dict]:
    """The setting of `sweep` with the best mean training reward over the tuning seeds."""
    jobs = [job(args, "tune", name, arm, seed, budget, grid) for name, arm in sweep.items()
            for seed in args.tune_seeds]
    figures = run_jobs(jobs, args.workers)
    table: dict[str, dict] = {}
    for j, fig in zip(jobs, figures):
        table.setdefault(j["label"].split("/")[1], {}).setdefault("train_reward", []).append(fig["train_reward"])
    for row in table.values():
        row["mean_train_reward"] = mean(row["train_reward"])
    best = max(table, key=lambda name: table[name]["mean_train_reward"])
    return best, sweep[best], table


def compare(arms: dict[str, list[dict]], reference: str, key: str) -> dict:
    return {name: paired(figs, arms[reference], key) for name, figs in arms.items() if name != reference}


def paired(arm: list[dict], reference: list[dict], key: str) -> dict:
    from node.testnet.stats import paired_comparison

    return paired_comparison([f[key] for f in arm], [f[key] for f in reference])


def paired_both(arm: list[dict], reference: list[dict]) -> dict:
    """The paired comparisons of PAIRED_KEYS."""
    return {key: paired(arm, reference, key) for key in PAIRED_KEYS}


def summarise(arms: dict[str, list[dict]]) -> dict:
    from node.testnet.stats import learned_counts, sample_std

    rows = {}
    for name, figs in arms.items():
        row = {}
        for key in FIGURE_KEYS:
            values = [f[key] for f in figs if f.get(key) is not None]
            row[key] = {"mean": mean(values) if values else None, "std": sample_std(values), "by_seed": values}
        row["learned"] = learned_counts([tuple(run) for f in figs for run in f["learned_runs"]])
        rows[name] = row
    return rows


def run_arms(args, stage: str, arms: dict[str, dict], seeds: list[int], budget: float, grid: float
             ) -> dict[str, list[dict]]:
    """Every arm's figures on `seeds`, run seed by seed: a cut-short run leaves every arm on the same seeds."""
    jobs = {name: [job(args, stage, name, arm, seed, budget, grid) for seed in seeds] for name, arm in arms.items()}
    flat = [js[k] for k in range(len(seeds)) for js in jobs.values()]
    figures = dict(zip((j["label"] for j in flat), run_jobs(flat, args.workers)))
    return {name: [figures[j["label"]] for j in js] for name, js in jobs.items()}


def confirm(args, budget: float, grid: float, best: dict) -> dict:
    """The claim chosen on the final seeds, re-tested on fresh ones: swarm-positive against the best silo
    and the best positive-only silo (its learning rate tuned as the silo's, on training reward)."""
    positive_name, positive, positive_tuning = tune(args, budget, grid, dict(list(POSITIVE_SWEEP.items())[:args.sweep]))
    arms = {"silo-best": best, "positive-best": positive, "swarm-positive": ARMS["swarm-positive"], **POSITIVE_CONTROLS}
    by_arm = run_arms(args, "confirm", arms, args.confirm_seeds, budget, grid)
    return {"seeds": args.confirm_seeds, "best_positive": positive_name, "positive_tuning": positive_tuning,
            "arms": summarise(by_arm),
            "pairs": {f"swarm-positive minus {ref}": paired_both(by_arm["swarm-positive"], by_arm[ref])
                      for ref in ("silo-best", "positive-best", *POSITIVE_CONTROLS)},
            "curves": {name: [f["curve"] for f in figs] for name, figs in by_arm.items()}}


def final(args, budget: float, grid: float, best: dict) -> dict:
    by_arm = run_arms(args, "final", {"silo-best": best, **ARMS}, args.seeds, budget, grid)
    swarm_vs = {name: by_arm[name] for name in ("swarm", *CONTROLS, "join-old", "sapo")}
    return {"arms": summarise(by_arm),
            "vs_best_silo": {key: compare(by_arm, "silo-best", key) for key in PAIRED_KEYS},
            "vs_silo": {key: compare(by_arm, "silo", key) for key in PAIRED_KEYS},
            "swarm_vs": {key: {name: _negated(c) for name, c in compare(swarm_vs, "swarm", key).items()}
                         for key in PAIRED_KEYS},
            "pairs": {f"{arm} minus {ref}": paired_both(by_arm[arm], by_arm[ref]) for arm, ref in PAIRS},
            "curves": {name: [f["curve"] for f in figs] for name, figs in by_arm.items()}}


def _negated(comparison: dict) -> dict:
    """swarm - arm, from the arm - swarm the paired comparison gives."""
    low, high = comparison["ci_low"], comparison["ci_high"]
    return {**comparison, "mean": -comparison["mean"], "diffs": [-d for d in comparison["diffs"]],
            "ci_low": None if high is None else -high, "ci_high": None if low is None else -low}


def derive_budget(args) -> float:
    spec = job(args, "budget", "silo", ARMS["silo"], args.tune_seeds[0], None, None)
    (figures,) = run_jobs([spec], 1)
    return figures["budget_s"]


# -- report ----------------------------------------------------------------------------------------
def verdict_line(title: str, block: dict) -> str:
    """One paired comparison: held-out, AUC and pass@8 with their CIs, and whether the held-out claim holds."""
    from node.testnet.stats import ci_excludes_zero, format_interval

    verdict = "holds" if ci_excludes_zero(block["heldout"]) else "not shown"
    return (f"  {title}: {format_interval(block['heldout'])}  AUC {format_interval(block['auc'])}  "
            f"pass@{PASS_AT[0]} {format_interval(block[PAIRED_KEYS[2]])}  -> {verdict}")


def report_lines(result: dict) -> list[str]:
    fin = result["final"]
    lines = [f"budget {result['budget_s']:.4g} virtual s, held-out every {result['grid_s']:.4g} s; "
             f"{len(result['seeds'])} paired seeds; best silo (chosen on training reward): {result['best_silo']}",
             f"{'arm':>14} {'held-out':>15} {'pass@8':>6} {'pass@32':>7} {'AUC':>15} {'train rew':>9} {'succ/s':>7} "
             f"{'entropy':>7} {'flat':>5} {'distinct':>8} {'chg/wall':>8} {'rounds':>6}"]
    for name, row in fin["arms"].items():
        def pm(key: str) -> str:
            m, s = row[key]["mean"], row[key]["std"]
            return "-" if m is None else f"{m:.3f} ± {s:.3f}" if s is not None else f"{m:.3f}"

        def one(key: str, digits: int = 2) -> str:
            m = row[key]["mean"]
            return "-" if m is None else f"{m:.{digits}f}"
        lines.append(f"{name:>14} {pm('heldout'):>15} {one('pass8', 3):>6} {one('pass32', 3):>7} {pm('auc'):>15} "
                     f"{one('train_reward', 3):>9} {one('successes_per_s', 1):>7} {one('entropy_mean'):>7} "
                     f"{one('flat_group_share'):>5} {one('distinct_completions'):>8} {one('charged_over_wall'):>8} "
                     f"{one('rounds', 0):>6}")
    for title, block in (("vs the best silo", fin["vs_best_silo"]), ("vs the default silo", fin["vs_silo"]),
                         ("swarm minus", fin["swarm_vs"])):
        lines.append(f"paired held-out pass@1 at the budget, {title} (a claim holds only where its CI excludes 0):")
        for name, comparison in block["heldout"].items():
            lines.append(verdict_line(f"{name:>14}", {key: block[key][name] for key in PAIRED_KEYS}))
    lines.append("paired held-out pass@1 at the budget:")
    for title, block in fin["pairs"].items():
        lines.append(verdict_line(title, block))
    conf = result.get("confirm")
    if conf:
        lines.append(f"confirmation on fresh seeds {conf['seeds'][0]}-{conf['seeds'][-1]} (best positive-only silo, "
                     f"chosen on training reward: {conf['best_positive']}):")
        for name, row in conf["arms"].items():
            held = row["heldout"]
            lines.append(f"  {name:>14}: held-out {held['mean']:.3f}" + (f" ± {held['std']:.3f}" if held["std"] else ""))
        for title, block in conf["pairs"].items():
            lines.append(verdict_line(title, block))
    return lines


def ci_error_bars(comparisons: list[dict]) -> list[list[float]]:
    """matplotlib's [below, above] error bars of paired comparisons' 95% CIs (none where a CI is n/a)."""
    means = [c["mean"] for c in comparisons]
    return [[m - (c["ci_low"] if c["ci_low"] is not None else m) for c, m in zip(comparisons, means)],
            [(c["ci_high"] if c["ci_high"] is not None else m) - m for c, m in zip(comparisons, means)]]


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fin = result["final"]
    confirm = result.get("confirm")
    fig, axes = plt.subplots(1, 3 if confirm else 2, figsize=(21 if confirm else 14, 5.5))
    left, right = axes[0], axes[1]
    for name, curves in fin["curves"].items():
        t = curves[0]["t"]
        left.step(t, [mean(c["heldout"][k] for c in curves) for k in range(len(t))], where="post", label=name,
                  linewidth=2.5 if name in ("swarm", "silo-best") else 1.2)
    left.set(xlabel="virtual seconds (every cost charged)", ylabel="held-out pass@1 (mean over seeds)",
             title="held-out pass@1 on the shared grid")
    left.legend(fontsize=8)
    block = fin["vs_best_silo"]["heldout"]
    names = list(block)
    means = [block[n]["mean"] for n in names]
    right.barh(names, means, xerr=ci_error_bars([block[n] for n in names]), color=["tab:green" if n == "swarm" else "tab:gray" for n in names])
    right.axvline(0, color="black", linewidth=0.8)
    right.set(xlabel="held-out pass@1 at the budget minus the best silo's (paired, 95% bootstrap CI)",
              title=f"{len(result['seeds'])} paired seeds")
    if confirm:  # the claim re-tested on fresh seeds: each confirmation pair
        pairs = confirm["pairs"]
        names = list(pairs)
        axes[2].barh([n.replace("swarm-positive minus ", "minus ") for n in names], [pairs[n]["heldout"]["mean"] for n in names],
                     xerr=ci_error_bars([pairs[n]["heldout"] for n in names]), color="tab:brown")
        axes[2].axvline(0, color="black", linewidth=0.8)
        axes[2].set(xlabel="swarm-positive minus each: held-out pass@1 at the budget (95% CI)",
                    title=f"confirmation on {len(confirm['seeds'])} fresh seeds ({confirm['seeds'][0]}-{confirm['seeds'][-1]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--nodes", type=int, default=4, help="measured nodes per testnet")
    p.add_argument("--rounds", type=int, default=300, help="the budget: the default silo's rounds")
    p.add_argument("--seeds", type=int, default=8, help="paired seeds of the final stage: 0..K-1")
    p.add_argument("--tune-seeds", type=int, default=3, help="tuning seeds: 100..100+K-1, never final ones")
    p.add_argument("--confirm-seeds", type=int, default=0, help="this many fresh seeds after the final ones re-test "
                   "swarm-positive, the claim the final stage points to (0: no confirm stage)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="seconds: 2 nodes, 3 rounds, 2 seeds, 2 sweep points, "
                   "in this process")
    p.add_argument("--out", default=str(runs_dir("exp-skeptic")))
    args = p.parse_args(argv)
    args.sweep, args.extra = len(SWEEP), [f"eval.pass_at={list(PASS_AT)}"]
    if args.quick:
        args.nodes, args.rounds, args.seeds, args.tune_seeds, args.sweep, args.workers = 2, 3, 2, 1, 2, 1
        args.confirm_seeds = 1
        args.extra += ["warm.steps=5", "eval.tasks_per_family=2", "sampling.group_size=4"]
    args.confirm_seeds = list(range(args.seeds, args.seeds + args.confirm_seeds))
    args.seeds, args.tune_seeds = list(range(args.seeds)), [100 + k for k in range(args.tune_seeds)]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = derive_budget(args)
    grid = budget / GRID_POINTS
    best_name, best, tuning = tune(args, budget, grid,
                                   {sweep_name(p, f): sweep_arm(p, f) for p, f in SWEEP[:args.sweep]})
    result = {"budget_s": budget, "grid_s": grid, "seeds": args.seeds, "tune_seeds": args.tune_seeds,
              "nodes": args.nodes, "rounds": args.rounds, "best_silo": best_name, "best_silo_arm": best,
              "tuning": tuning, "final": final(args, budget, grid, best),
              "confirm": confirm(args, budget, grid, best) if args.confirm_seeds else None,
              "machine": f"{platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} cores",
              "command": command_line(__spec__, argv)}
    text = "\n".join(report_lines(result))
    write_json(out / "exp_skeptic.json", result)
    (out / "summary.txt").write_text(text + "\n")
    plot(result, out / "exp_skeptic.png")
    print(text)
    print(f"wrote {out / 'exp_skeptic.json'}, {out / 'summary.txt'} and {out / 'exp_skeptic.png'}")
    return result


if __name__ == "__main__":
    main()
