"""The report's figures for compute-clock runs (node/testnet/clock.py): mixes compared at equal
virtual time, and beside it at equal rounds (cumulative reward over the rounds every honest node of
every mix of that seed completed), per mix and per node class (fast / slow).

Every node of every run is evaluated on one grid of virtual instants, 0, s, 2s, ... and the budget
(node/testnet/grid.py), so nothing is interpolated: a curve is the node's held-out pass@1 at each
grid instant (a step function: the value holds until the next instant); the mean curve is the plain
mean over nodes and seeds at each instant; the AUC is the mean of a curve's values over the grid
instants (0 and the budget included); the time to the target is the first grid instant at which the
curve reaches it. Each sharing mix is compared with the silo (the mix with J = 0) seed by seed
(paired differences, a bootstrap 95% CI: node/testnet/stats.py); a gain "holds" only when its CI
excludes 0."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean

from node.observe.metrics import read_metrics
from node.testnet.clock import charged_over_wall
from node.testnet.stats import ci_excludes_zero, format_interval, learned_counts, paired_comparison, sample_std

TARGET_OF_SILO = 0.8  # the held-out target: this fraction of the silo's pass@1 at the budget's end
CLASSES = ("fast", "slow")
PAIRED = ("heldout_at_budget", "auc")  # the figures compared with the silo seed by seed


def heldout_curve(node: dict) -> list[tuple[float, float]]:
    """(grid instant, held-out pass@1) of one node: its evaluations on the shared grid."""
    return [(e["vtime"], e["heldout_pass1"]) for e in node["evals"]]


def grid_auc(points: list[tuple[float, float]]) -> float:
    """The area under a curve on the grid, per unit time: the mean of its values at the grid instants."""
    return mean(v for _, v in points)


def time_to_target(points: list[tuple[float, float]], target: float) -> float | None:
    """The first grid instant at which the curve reaches `target`; None if it never does."""
    return next((t for t, v in points if v >= target), None)


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The plain mean of curves on one grid, instant by instant."""
    grid = [t for t, _ in curves[0]]
    if any([t for t, _ in c] != grid for c in curves):
        raise ValueError("held-out curves on different grids: every run must share one evaluation grid")
    return [(t, mean(c[i][1] for c in curves)) for i, t in enumerate(grid)]


def _spread(values: list[float]) -> dict:
    """Mean and sample std (ddof=1; None below 2 seeds) over seeds."""
    return {"mean": mean(values) if values else None, "std": sample_std(values), "n": len(values)}


def _gain(value: float | None, silo: float | None) -> float | None:
    return value / silo - 1 if value is not None and silo else None


def node_figures(node: dict) -> dict:
    rows = read_metrics(Path(node["run_dir"]))
    curve = heldout_curve(node)
    return {"index": node["index"], "class": node.get("profile", "fast"), "rows": rows, "curve": curve,
            "heldout_at_budget": curve[-1][1], "auc": grid_auc(curve), "rounds": len(rows),
            "rollouts": sum(r.get("rollouts_generated", 0) for r in rows),
            "families": (node["evals"][0].get("heldout_by_family", {}), node["evals"][-1].get("heldout_by_family", {}))}


def _seed_figures(nodes: list[dict], rounds: int) -> dict:
    """One run's figures, mean over its nodes (and per class): `rounds` = its seed's equal rounds."""
    def figures(mine: list[dict]) -> dict:
        return {"heldout_at_budget": mean(n["heldout_at_budget"] for n in mine), "auc": mean(n["auc"] for n in mine),
                "reward_at_equal_rounds": mean(sum(r["reward_mean"] for r in n["rows"][:rounds]) for n in mine)}
    out = figures(nodes)
    out["classes"] = {c: figures(mine) for c in CLASSES if (mine := [n for n in nodes if n["class"] == c])}
    return out


def _mix_row(mix: str, mine: list[dict], nodes: dict, equal_rounds: dict) -> dict:
    """One mix over its seeds: figures per seed, their mean and spread, the mean curve and its spread."""
    seeds = {r["seed"]: _seed_figures(nodes[id(r)], equal_rounds[r["seed"]]) for r in mine}
    curves = {r["seed"]: mean_curve([n["curve"] for n in nodes[id(r)]]) for r in mine}  # per seed: mean over nodes
    all_nodes = [n for r in mine for n in nodes[id(r)]]
    grid, means = zip(*mean_curve(list(curves.values())))  # one grid for every seed, checked

    def per_node(key: str) -> dict[str, float]:  # node index -> its mean over seeds
        return {str(n["index"]): mean(m[key] for m in all_nodes if m["index"] == n["index"]) for n in nodes[id(mine[0])]}

    return {
        "mix": mix, "seeds": len(mine),
        **{key: {**_spread([s[key] for s in seeds.values()]),
                 "by_seed": {str(seed): s[key] for seed, s in sorted(seeds.items())}}
           for key in ("heldout_at_budget", "auc", "reward_at_equal_rounds")},
        "classes": {c: {key: mean(s["classes"][c][key] for s in seeds.values() if c in s["classes"])
                        for key in ("heldout_at_budget", "reward_at_equal_rounds")}
                    for c in CLASSES if any(c in s["classes"] for s in seeds.values())},
        "rounds_per_node": per_node("rounds"), "rollouts_per_node": per_node("rollouts"),
        "charged_over_wall": charged_over_wall([r for n in all_nodes for r in n["rows"]]),
        "learned": learned_counts([n["families"] for n in all_nodes]),
        "curve": {"t": list(grid), "mean": list(means),
                  "std": [sample_std([c[i][1] for c in curves.values()]) for i in range(len(grid))]},
        "seed_curves": curves,
    }


def compute_table(runs_raw: list[dict]) -> dict:
    """Per mix: the equal-time and equal-rounds figures (mean and spread over seeds), gains vs the silo
    and the paired comparison with it."""
    budget = max(r["budget_s"] for r in runs_raw)
    nodes = {id(r): [node_figures(n) for n in r["nodes"]] for r in runs_raw}
    equal_rounds = {seed: min(n["rounds"] for r in runs_raw if r["seed"] == seed for n in nodes[id(r)])
                    for seed in {r["seed"] for r in runs_raw}}
    by_mix: dict[str, list[dict]] = defaultdict(list)
    for r in runs_raw:
        by_mix[r["mix"]].append(r)
    rows = {mix: _mix_row(mix, mine, nodes, equal_rounds) for mix, mine in by_mix.items()}
    grids = {tuple(row["curve"]["t"]) for row in rows.values()}
    if len(grids) > 1:
        raise ValueError(f"the mixes were evaluated on different grids ({len(grids)}): their runs need one "
                         "budget and one grid spacing (node/testnet/grid.py)")
    _add_gains(rows, budget)
    return {"budget_s": budget, "grid_s": runs_raw[0].get("grid_s"), "target_of_silo": TARGET_OF_SILO,
            "equal_rounds": {str(s): r for s, r in sorted(equal_rounds.items())}, "mixes": list(rows.values())}


def paired_speedups(silo_times: dict[str, float | None], times: dict[str, float | None],
                    budget: float) -> list[float]:
    """Per seed, the silo's time to the target over this mix's (same seed). A run that never reached
    the target (None) counts as reaching it at the budget; a seed whose curve starts at the target
    (time 0) has no ratio."""
    def censored(t: float | None) -> float:
        return budget if t is None else t

    return [censored(silo_times[seed]) / censored(t) for seed, t in times.items()
            if seed in silo_times and censored(t) > 0 and censored(silo_times[seed]) > 0]


def paired_with_silo(row: dict, silo: dict, key: str) -> dict:
    """`key` per seed, this mix minus the silo's run of the same seed: mean and bootstrap CI."""
    seeds = sorted(set(row[key]["by_seed"]) & set(silo[key]["by_seed"]), key=int)
    return {**paired_comparison([row[key]["by_seed"][s] for s in seeds], [silo[key]["by_seed"][s] for s in seeds]),
            "seeds": seeds}


def _add_gains(rows: dict[str, dict], budget: float) -> None:
    """Gains over the silo (the mix with no external groups), the held-out target and its speedup."""
    silo = next((rows[m] for m in rows if m.endswith("/0")), None)
    target = TARGET_OF_SILO * silo["heldout_at_budget"]["mean"] if silo else None
    for row in rows.values():
        row["time_to_target"] = time_to_target(list(zip(row["curve"]["t"], row["curve"]["mean"])), target) \
            if target is not None else None
        times = {seed: time_to_target(curve, target) if target is not None else None
                 for seed, curve in row.pop("seed_curves").items()}
        row["time_to_target_by_seed"] = {str(seed): t for seed, t in sorted(times.items())}
    for row in rows.values():
        silo_time = silo["time_to_target"] if silo else None
        row["speedup_by_seed"] = _spread(paired_speedups(silo["time_to_target_by_seed"], row["time_to_target_by_seed"],
                                                         budget) if silo else [])
        row["target"] = target
        row["speedup_vs_silo"] = silo_time / row["time_to_target"] if silo_time and row["time_to_target"] else None
        row["paired_vs_silo"] = {key: paired_with_silo(row, silo, key) for key in PAIRED} \
            if silo is not None and row is not silo else None
        for key in ("heldout_at_budget", "auc", "reward_at_equal_rounds"):
            row[f"{key}_gain"] = _gain(row[key]["mean"], silo[key]["mean"]) if silo else None
        for c, figures in row["classes"].items():
            base = silo["classes"].get(c, {}) if silo else {}
            for key in ("heldout_at_budget", "reward_at_equal_rounds"):
                figures[f"{key}_gain"] = _gain(figures[key], base.get(key))


def _pm(figure: dict, digits: int = 3) -> str:
    """'mean ± sample std', or the mean alone from one seed."""
    if figure["mean"] is None:
        return "-"
    return f"{figure['mean']:.{digits}f}" + ("" if figure["std"] is None else f" ± {figure['std']:.{digits}f}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def compute_text(table: dict) -> list[str]:
    rounds = ", ".join(f"seed {s}: {r}" for s, r in table["equal_rounds"].items())
    spacing = "only 0 and the budget (eval.every = 0)" if table.get("grid_s") is None else \
        f"every {table['grid_s']:.4g} virtual s and at the budget"
    lines = [f"compute clock: every node ran until its next round would start at or after {table['budget_s']:.4g} "
             f"virtual s; equal rounds R ({rounds}) = the fewest any honest node of that seed completed; held-out "
             f"pass@1 measured on one grid for every mix and seed: {spacing}", "",
             f"{'mix':>6} {'held-out @ budget':>18} {'gain':>7} {'AUC':>15} {'gain':>7} {'t to target':>12} "
             f"{'speedup':>8} {'per seed':>12} {'cum. reward @ R':>17} {'gain':>7}"]
    for row in table["mixes"]:
        t = "-" if row["time_to_target"] is None else f"{row['time_to_target']:.4g} s"
        speedup = "-" if row["speedup_vs_silo"] is None else f"{row['speedup_vs_silo']:.2f}x"
        lines.append(f"{row['mix']:>6} {_pm(row['heldout_at_budget']):>18} {_pct(row['heldout_at_budget_gain']):>7} "
                     f"{_pm(row['auc']):>15} {_pct(row['auc_gain']):>7} {t:>12} {speedup:>8} "
                     f"{_pm(row['speedup_by_seed'], 2):>12} "
                     f"{_pm(row['reward_at_equal_rounds'], 2):>17} {_pct(row['reward_at_equal_rounds_gain']):>7}")
    target = table["mixes"][0]["target"]
    lines.append(f"target: {TARGET_OF_SILO:.0%} of the silo's held-out pass@1 at the budget"
                 + ("" if target is None else f" = {target:.3f}") + "; ± is the sample std over seeds (ddof=1); AUC "
                 "= the mean held-out pass@1 over the grid instants; t to target = the first grid instant the mean "
                 "curve reaches it; speedup: on the mean curves, and per seed against the silo's run of the same "
                 "seed (a run that never reached the target counts as reaching it at the budget)")
    lines.append("")
    for row in table["mixes"]:
        lines += _row_details(row)
    return lines


def _row_details(row: dict) -> list[str]:
    """The lines under the table for one mix: paired comparison, node classes, learned families, rounds."""
    lines = []
    if row.get("paired_vs_silo"):
        paired = row["paired_vs_silo"]
        lines.append(f"  {row['mix']}: paired diff vs silo (per seed): held-out @ budget "
                     f"{format_interval(paired['heldout_at_budget'])}; AUC {format_interval(paired['auc'])}")
    classes = "; ".join(f"{c}: held-out {f['heldout_at_budget']:.3f} ({_pct(f['heldout_at_budget_gain'])}), "
                        f"cum. reward @ R {f['reward_at_equal_rounds']:.2f} ({_pct(f['reward_at_equal_rounds_gain'])})"
                        for c, f in row["classes"].items())
    learned = ", ".join(f"{family} {c['learned']}/{c['runs']}" for family, c in row["learned"].items())
    per_node = ", ".join(f"node{i} {row['rounds_per_node'][i]:.0f}/{row['rollouts_per_node'][i]:.0f}"
                         for i in row["rounds_per_node"])
    lines.append(f"  {row['mix']}: {classes}")
    lines.append(f"  {row['mix']}: learned (node x seed runs whose held-out pass@1 on the family rose by at least "
                 f"one task from t = 0 to the budget): {learned or '-'}")
    lines.append(f"  {row['mix']}: rounds/rollouts per node: {per_node}")
    if row.get("charged_over_wall") is not None:
        lines.append(f"  {row['mix']}: charged/wall {row['charged_over_wall']:.2f} (virtual seconds charged over "
                     "the wall seconds its rounds took here)")
    return lines


def verdict_lines(table: dict) -> list[str]:
    """One line per sharing mix against the silo, at equal compute: what a reader wants first."""
    silo = next((row for row in table["mixes"] if row["mix"].endswith("/0")), None)
    if silo is None:
        return []
    lines = []
    for row in table["mixes"]:
        if row is silo:
            continue
        paired = (row.get("paired_vs_silo") or {}).get("heldout_at_budget")
        lines.append(f"swarm {row['mix']} vs silo {silo['mix']} at equal compute: held-out pass@1 "
                     f"{row['heldout_at_budget']['mean']:.3f} vs {silo['heldout_at_budget']['mean']:.3f} "
                     f"({_pct(row['heldout_at_budget_gain'])}){_holds_phrase(paired)}, area under its curve "
                     f"{_pct(row['auc_gain'])}, {_speedup_phrase(row, silo)}; cum. reward at equal rounds "
                     f"{_pct(row['reward_at_equal_rounds_gain'])}")
    return lines


def _holds_phrase(paired: dict | None) -> str:
    """Whether the held-out difference with the silo holds: only when its CI excludes 0."""
    if paired is None:
        return ""
    diff = f"; paired diff {format_interval(paired)}: "
    if ci_excludes_zero(paired):
        return diff + ("the swarm's gain holds (the CI excludes 0)" if paired["mean"] > 0
                       else "the silo's lead holds (the CI excludes 0)")
    if paired["ci_low"] is None:
        return diff + "no verdict (no CI)"
    return diff + "no difference shown (the CI includes 0)"


def _speedup_phrase(row: dict, silo: dict) -> str:
    if row["speedup_vs_silo"] is not None:
        return f"reached the held-out target {row['speedup_vs_silo']:.2f}x as fast"
    if row["time_to_target"] is None:
        return "never reached the held-out target"
    if row["time_to_target"] == 0 or silo["time_to_target"] == 0:  # a curve that starts at the target: no ratio
        return "no speedup to measure (a curve started at the held-out target)"
    return "the silo never reached the held-out target"


def plot_heldout_vs_time(ax, table: dict) -> None:
    """Held-out pass@1 on the grid per mix (steps: a value holds until the next instant), mean over
    nodes and seeds, ± sample std over seeds."""
    for i, row in enumerate(table["mixes"]):
        t, m = row["curve"]["t"], row["curve"]["mean"]
        s = [v or 0.0 for v in row["curve"]["std"]]  # one seed: no spread to draw
        ax.plot(t, m, color=f"C{i}", label=row["mix"], drawstyle="steps-post", marker=".")
        ax.fill_between(t, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=f"C{i}", alpha=0.2,
                        step="post")
    ax.set(title="held-out pass@1 at equal compute (mean over nodes and seeds, ± std over seeds)",
           xlabel="virtual time (s)", ylim=(-0.02, 1.02))
