"""How the swarm's gain grows: swarm-positive against positive-only at N = 2, 4, 8, 16 nodes (J = 4),
and at J = 2, 4, 6 external groups of 8 (N = 8), at equal per-node compute.

If peers' verified successes are what the swarm's gain is made of (docs/testnets-and-experiments.md
"The swarm against the silo"), it should grow with the number of peers and with J. Every run is a
tiny-warm in-memory testnet on the compute clock, exactly as in scripts/experiments/skeptic.py (the
same arms' treatment: own failures dropped; the same run function, figures and grid): the budget is
the virtual time the default silo's fast nodes need for --rounds rounds, the same for every N and J
(compute per node, not per swarm). The silo at each N is its own run on the same seeds (its nodes do
not interact, so only the nodes measured differ). Reported per point: held-out pass@1 and pass@8 at
the budget, the paired difference swarm - silo over the seeds with its 95% bootstrap CI
(node/testnet/stats.py). Writes <out>/exp_swarm_size.json and exp_swarm_size.png; every run is kept
(<out>/<arm>/seed<k>.json) and reused on a rerun.

The weak-peer point: N = 8 at 4/4 where every other node is a smaller tiny model (WEAK_SIZES: 64x2, the
preset's shape, and 32x1, each warm-started by the same recipe), against a silo of the same shapes.
Its gain is reported per shape: does a strong node still gain from weak peers, and do weak nodes gain
more? The clock charges a round by the work it did (node/testnet/clock.py), not by the model's size,
so both shapes get the same rounds: the weak nodes are weaker in capacity, not in speed.

    .venv/bin/python -m scripts.experiments.swarm_size            # 5 fresh seeds (16-20), N 2-16, J 2-6, weak peers
    .venv/bin/python -m scripts.experiments.swarm_size --quick    # smoke: 2 seeds, N 2 and 4, J 2 and 4, weak peers, 3 rounds
"""
from __future__ import annotations

import platform
from pathlib import Path
from statistics import mean

from scripts.common import arg_parser, command_line, pyplot, run_saved_jobs, runs_dir, write_result
from scripts.experiments.skeptic import GRID_POINTS, OWN_DROP, PASS_AT, ci_error_bars, run_arm, shape_label

SIZES = (2, 4, 8, 16)  # N at J = 4 (mix 4/4)
MIXES = ((6, 2), (4, 4), (2, 6))  # I/J at N = 8
# compared: held-out pass@1 and pass@8 at the budget, and the held-out curve's AUC over the budget (how soon:
# held-out at the budget saturates near 2/3 on many seeds, when a node has learned two of the three families)
KEYS = ("heldout", f"pass{PASS_AT[0]}", "auc")
WEAK_SIZES = ((64, 2), (32, 1))  # the weak-peer point's shapes, cycled over the nodes: strong, weak, strong, ...


def arm(mix: tuple[int, int]) -> dict:
    return {"mix": mix, "set": [OWN_DROP]}


def points(sizes: tuple[int, ...], mixes: tuple[tuple[int, int], ...], j_nodes: int) -> list[dict]:
    """Each point of the two curves and the weak-peer point: its name, N, the swarm's mix, the model
    shapes (none: the preset's); the silo (8/0) at the same N and shapes."""
    out = [{"curve": "N", "x": n, "nodes": n, "mix": (4, 4), "sizes": ()} for n in sizes]
    out += [{"curve": "J", "x": mix[1], "nodes": j_nodes, "mix": mix, "sizes": ()} for mix in mixes]
    out.append({"curve": "weak", "x": j_nodes, "nodes": j_nodes, "mix": (4, 4), "sizes": WEAK_SIZES})
    return out


def run_name(kind: str, point: dict) -> str:
    """The folder of a point's silo or swarm runs (shared by the points that run the same testnet)."""
    n, (local, external) = point["nodes"], point["mix"]
    name = f"silo-n{n}" if kind == "silo" else f"swarm-n{n}-{local}-{external}"
    return name + ("-weak" if point["sizes"] else "")


def job(args, kind: str, point: dict, seed: int, budget: float | None, name: str | None = None) -> dict:
    grid = None if budget is None else budget / GRID_POINTS
    name = name or run_name(kind, point)
    return {"arm": arm((8, 0) if kind == "silo" else point["mix"]), "seed": seed, "budget": budget, "grid": grid,
            "nodes": point["nodes"], "model_sizes": [list(s) for s in point["sizes"]], "rounds": args.rounds,
            "extra": args.extra, "path": str(Path(args.out) / name / f"seed{seed}.json"), "label": f"{name}/seed{seed}"}


def derive_budget(args) -> float:
    budget_job = job(args, "silo", {"nodes": 4, "mix": (8, 0), "sizes": ()}, 100, None, name="budget")
    (figures,) = run_saved_jobs([budget_job], 1, run_arm)
    return figures["budget_s"]


def run_points(args, budget: float) -> list[dict]:
    """Every point's silo and swarm on every seed, seed by seed (a stopped run leaves paired seeds)."""
    from node.testnet.stats import paired_comparison

    todo = points(args.sizes, args.mixes, args.j_nodes)
    jobs = [job(args, kind, point, seed, budget) for seed in args.seeds for point in todo for kind in ("silo", "swarm")]
    unique = list({j["path"]: j for j in jobs}.values())  # N = 8, J = 4 is on both curves
    figures = dict(zip((j["path"] for j in unique), run_saved_jobs(unique, args.workers, run_arm)))
    for point in todo:
        runs = {kind: [figures[job(args, kind, point, s, budget)["path"]] for s in args.seeds] for kind in ("silo", "swarm")}
        for kind, figs in runs.items():
            point[kind] = {key: [f[key] for f in figs] for key in KEYS}
        point["gain"] = {key: paired_comparison(point["swarm"][key], point["silo"][key]) for key in KEYS}
        if point["sizes"]:  # the weak-peer point: each shape against the silo's nodes of that shape
            point["by_size"] = {}
            for label in runs["swarm"][0]["by_size"]:
                mine = {kind: {key: [f["by_size"][label][key] for f in figs] for key in KEYS} for kind, figs in runs.items()}
                mine["gain"] = {key: paired_comparison(mine["swarm"][key], mine["silo"][key]) for key in KEYS}
                point["by_size"][label] = mine
            strong = shape_label(point["sizes"][0])
            same = next(p for p in todo if not p["sizes"] and p["nodes"] == point["nodes"] and p["mix"] == point["mix"])
            point["strong_vs_strong_peers"] = {  # a strong node among weak peers minus one among strong peers
                key: paired_comparison(point["by_size"][strong]["swarm"][key], same["swarm"][key]) for key in KEYS}
    return todo


def report_lines(result: dict) -> list[str]:
    from node.testnet.stats import format_interval

    lines = [f"budget {result['budget_s']:.4g} virtual s a node; {len(result['seeds'])} paired seeds; "
             "swarm-positive minus positive-only (8/0) at the same N, paired:"]
    def gain(figures: dict) -> str:
        return (f"held-out {format_interval(figures['heldout'])}  pass@{PASS_AT[0]} {format_interval(figures[KEYS[1]])}"
                f"  AUC {format_interval(figures['auc'])}")

    for point in result["points"]:
        label = f"N={point['nodes']:>2} {point['mix'][0]}/{point['mix'][1]}"
        if not point["sizes"]:
            lines.append(f"  {label}: {gain(point['gain'])}")
            continue
        lines.append(f"weak peers, {label}, shapes {' '.join(map(shape_label, point['sizes']))} in turn:")
        for shape, mine in point["by_size"].items():
            silo, swarm = (mean(mine[kind]["heldout"]) for kind in ("silo", "swarm"))
            lines.append(f"  {shape} nodes (silo {silo:.3f}, swarm {swarm:.3f}): {gain(mine['gain'])}")
        lines.append(f"  a strong node among weak peers minus one among strong peers: {gain(point['strong_vs_strong_peers'])}")
    return lines


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, curve, xlabel in ((axes[0], "N", "nodes N (J = 4)"), (axes[1], "J", f"external groups J of 8 "
                                                                             f"(N = {result['j_nodes']})")):
        mine = [p for p in result["points"] if p["curve"] == curve]
        for key, color in zip(KEYS, ("tab:green", "tab:blue")):
            gains = [p["gain"][key] for p in mine]
            ax.errorbar([p["x"] for p in mine], [g["mean"] for g in gains], yerr=ci_error_bars(gains), marker="o", capsize=4, color=color,
                        label="held-out pass@1" if key == "heldout" else f"pass@{PASS_AT[0]}")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel=xlabel, ylabel="swarm-positive - positive-only (95% CI)", xticks=[p["x"] for p in mine])
        ax.legend(fontsize=8)
    weak = next(p for p in result["points"] if p["curve"] == "weak")
    shapes = list(weak["by_size"])
    for offset, key, color in ((-0.1, "heldout", "tab:green"), (0.1, KEYS[1], "tab:blue")):
        gains = [weak["by_size"][shape]["gain"][key] for shape in shapes]
        axes[2].errorbar([k + offset for k in range(len(shapes))], [g["mean"] for g in gains], yerr=ci_error_bars(gains),
                         fmt="o", capsize=4, color=color, label="held-out pass@1" if key == "heldout" else f"pass@{PASS_AT[0]}")
    axes[2].axhline(0, color="black", linewidth=0.8)
    axes[2].set(xticks=range(len(shapes)), xticklabels=[f"{s} nodes" for s in shapes], xlim=(-0.5, len(shapes) - 0.5),
                xlabel=f"weak peers: N = {weak['nodes']}, shapes in turn", ylabel="swarm - silo of the same shape (95% CI)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"the gain against swarm size and J, {len(result['seeds'])} paired seeds, equal compute per node")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--rounds", type=int, default=300, help="the budget: the default silo's rounds (4 nodes)")
    p.add_argument("--seeds", type=int, default=5, help="paired seeds: K of them from --first-seed")
    p.add_argument("--first-seed", type=int, default=16, help="the first seed (the skeptic's test used 0-15)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="seconds: 2 seeds, N 2 and 4, J 2 and 4 and weak peers at N = 2, 3 rounds")
    p.add_argument("--out", default=str(runs_dir("exp-swarm-size")))
    args = p.parse_args(argv)
    args.sizes, args.mixes, args.j_nodes = SIZES, MIXES, 8
    args.extra = [f"eval.pass_at={list(PASS_AT)}"]
    if args.quick:
        args.rounds, args.seeds, args.workers, args.sizes, args.mixes, args.j_nodes = 3, 2, 1, (2, 4), MIXES[:2], 2
        args.extra += ["warm.steps=5", "eval.tasks_per_family=2", "sampling.group_size=4"]
    args.seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    budget = derive_budget(args)
    result = {"budget_s": budget, "seeds": args.seeds, "j_nodes": args.j_nodes, "points": run_points(args, budget),
              "machine": f"{platform.processor() or platform.machine()}", "command": command_line(__spec__, argv)}
    text = "\n".join(report_lines(result))
    write_result(Path(args.out), "exp_swarm_size", result, plot)
    (Path(args.out) / "summary.txt").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
