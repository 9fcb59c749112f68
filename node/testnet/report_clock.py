"""The report's figures for compute-clock runs (node/testnet/clock.py): mixes compared at equal
virtual time (held-out pass@1 at the budget's end, the area under its curve, the time to a target
and the speedup over the silo), and beside it at equal rounds (cumulative reward over the rounds
every honest node of every mix of that seed completed), per mix and per node class (fast / slow)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean, pstdev

from node.metrics import read_metrics

TARGET_OF_SILO = 0.8  # the held-out target: this fraction of the silo's pass@1 at the budget's end
CLASSES = ("fast", "slow")


def heldout_curve(node: dict, rows: list[dict], budget: float) -> list[tuple[float, float]]:
    """(virtual time, held-out pass@1) of one node over [0, budget]: its evaluation at 0, those of its
    evaluation rounds (at their round's end), and the one at the budget's end."""
    points = [(e["vtime"], e["heldout_pass1"]) for e in node.get("evals", [])]
    points += [(r["vtime_end"], r["heldout_pass1"]) for r in rows if "heldout_pass1" in r and r["vtime_end"] < budget]
    return sorted(points)


def value_at(points: list[tuple[float, float]], t: float) -> float:
    """The curve at time t: linear between points, flat before the first and after the last."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return points[-1][1]


def normalised_auc(points: list[tuple[float, float]], budget: float) -> float:
    """Trapezoid area under the curve over [0, budget], divided by the budget (a mean pass@1)."""
    times = [0.0, *(t for t, _ in points if 0.0 < t < budget), budget]
    area = sum((t1 - t0) * (value_at(points, t0) + value_at(points, t1)) / 2 for t0, t1 in zip(times, times[1:]))
    return area / budget


def time_to_target(points: list[tuple[float, float]], target: float) -> float | None:
    """The first virtual time the curve reaches `target` (interpolated); None if it never does."""
    if points[0][1] >= target:
        return points[0][0]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if v1 >= target:
            return t0 + (t1 - t0) * (target - v0) / (v1 - v0)
    return None


def mean_curve(curves: list[list[tuple[float, float]]], grid: list[float]) -> list[tuple[float, float]]:
    return [(t, mean(value_at(c, t) for c in curves)) for t in grid]


def _spread(values: list[float]) -> dict:
    return {"mean": mean(values), "std": pstdev(values)} if values else {"mean": None, "std": None}


def _gain(value: float | None, silo: float | None) -> float | None:
    return value / silo - 1 if value is not None and silo else None


def node_figures(node: dict, budget: float) -> dict:
    rows = read_metrics(Path(node["run_dir"]))
    curve = heldout_curve(node, rows, budget)
    return {"index": node["index"], "class": node.get("profile", "fast"), "rows": rows, "curve": curve,
            "heldout_at_budget": node["evals"][-1]["heldout_pass1"], "auc": normalised_auc(curve, budget),
            "rounds": len(rows), "rollouts": sum(r.get("rollouts_generated", 0) for r in rows)}


def _seed_figures(nodes: list[dict], rounds: int) -> dict:
    """One run's figures, mean over its nodes (and per class): `rounds` = its seed's equal rounds."""
    def figures(mine: list[dict]) -> dict:
        return {"heldout_at_budget": mean(n["heldout_at_budget"] for n in mine), "auc": mean(n["auc"] for n in mine),
                "reward_at_equal_rounds": mean(sum(r["reward_mean"] for r in n["rows"][:rounds]) for n in mine)}
    out = figures(nodes)
    out["classes"] = {c: figures(mine) for c in CLASSES if (mine := [n for n in nodes if n["class"] == c])}
    return out


def compute_table(runs_raw: list[dict], grid_points: int = 101) -> dict:
    """Per mix: the equal-time and equal-rounds figures (mean and spread over seeds), gains vs the silo."""
    budget = max(r["budget_s"] for r in runs_raw)
    nodes = {id(r): [node_figures(n, budget) for n in r["nodes"]] for r in runs_raw}
    equal_rounds = {seed: min(n["rounds"] for r in runs_raw if r["seed"] == seed for n in nodes[id(r)])
                    for seed in {r["seed"] for r in runs_raw}}
    by_mix: dict[str, list[dict]] = defaultdict(list)
    for r in runs_raw:
        by_mix[r["mix"]].append(r)
    grid = [budget * (i / (grid_points - 1)) for i in range(grid_points)]  # the last point is the budget exactly
    rows = {}
    for mix, mine in by_mix.items():
        seeds = [_seed_figures(nodes[id(r)], equal_rounds[r["seed"]]) for r in mine]
        curves = [mean_curve([n["curve"] for n in nodes[id(r)]], grid) for r in mine]  # one per seed
        all_nodes = [n for r in mine for n in nodes[id(r)]]
        rows[mix] = {
            "mix": mix, "seeds": len(mine),
            **{key: _spread([s[key] for s in seeds]) for key in ("heldout_at_budget", "auc", "reward_at_equal_rounds")},
            "classes": {c: {key: mean(s["classes"][c][key] for s in seeds if c in s["classes"])
                            for key in ("heldout_at_budget", "reward_at_equal_rounds")}
                        for c in CLASSES if any(c in s["classes"] for s in seeds)},
            "rounds_per_node": {str(n["index"]): mean(m["rounds"] for m in all_nodes if m["index"] == n["index"])
                                for n in nodes[id(mine[0])]},
            "rollouts_per_node": {str(n["index"]): mean(m["rollouts"] for m in all_nodes if m["index"] == n["index"])
                                  for n in nodes[id(mine[0])]},
            "curve": {"t": grid, "mean": [mean(c[i][1] for c in curves) for i in range(len(grid))],
                      "std": [pstdev([c[i][1] for c in curves]) for i in range(len(grid))]},
            "seed_curves": {r["seed"]: curve for r, curve in zip(mine, curves)},
        }
    _add_gains(rows, budget)
    return {"budget_s": budget, "equal_rounds": {str(s): r for s, r in sorted(equal_rounds.items())},
            "target_of_silo": TARGET_OF_SILO, "mixes": list(rows.values())}


def paired_speedups(silo_times: dict[str, float | None], times: dict[str, float | None],
                    budget: float) -> list[float]:
    """Per seed, the silo's time to the target over this mix's (same seed). A run that never reached
    the target (None) counts as reaching it at the budget; a seed whose curve starts at the target
    (time 0) has no ratio."""
    def censored(t: float | None) -> float:
        return budget if t is None else t

    return [censored(silo_times[seed]) / censored(t) for seed, t in times.items()
            if seed in silo_times and censored(t) > 0 and censored(silo_times[seed]) > 0]


def _add_gains(rows: dict[str, dict], budget: float) -> None:
    """Gains over the silo (the mix with no external groups), the held-out target and its speedup."""
    silo = next((rows[m] for m in rows if m.endswith("/0")), None)
    target = TARGET_OF_SILO * silo["heldout_at_budget"]["mean"] if silo else None
    for row in rows.values():
        curve = list(zip(row["curve"]["t"], row["curve"]["mean"]))
        row["time_to_target"] = time_to_target(curve, target) if target is not None else None
    for row in rows.values():  # per seed, paired with the silo's run of the same seed: the spread of the speedup
        times = {seed: time_to_target(curve, target) if target is not None else None
                 for seed, curve in row.pop("seed_curves").items()}
        row["time_to_target_by_seed"] = {str(seed): t for seed, t in sorted(times.items())}
    for row in rows.values():
        silo_time = silo["time_to_target"] if silo else None
        row["speedup_by_seed"] = _spread(paired_speedups(silo["time_to_target_by_seed"], row["time_to_target_by_seed"],
                                                         budget) if silo else [])
        row["target"] = target
        row["speedup_vs_silo"] = silo_time / row["time_to_target"] if silo_time and row["time_to_target"] else None
        for key in ("heldout_at_budget", "auc", "reward_at_equal_rounds"):
            row[f"{key}_gain"] = _gain(row[key]["mean"], silo[key]["mean"]) if silo else None
        for c, figures in row["classes"].items():
            base = silo["classes"].get(c, {}) if silo else {}
            for key in ("heldout_at_budget", "reward_at_equal_rounds"):
                figures[f"{key}_gain"] = _gain(figures[key], base.get(key))


def _pm(figure: dict, digits: int = 3) -> str:
    return "-" if figure["mean"] is None else f"{figure['mean']:.{digits}f} ± {figure['std']:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def compute_text(table: dict) -> list[str]:
    rounds = ", ".join(f"seed {s}: {r}" for s, r in table["equal_rounds"].items())
    lines = [f"compute clock: every node ran until its next round would start at or after {table['budget_s']:.4g} "
             f"virtual s; equal rounds R ({rounds}) = the fewest any honest node of that seed completed", "",
             f"{'mix':>6} {'held-out @ budget':>18} {'gain':>7} {'AUC/budget':>15} {'gain':>7} {'t to target':>12} "
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
                 + ("" if target is None else f" = {target:.3f}") + "; ± is the spread over seeds; speedup: on the "
                 "mean curves, and per seed against the silo's run of the same seed (a run that never reached the "
                 "target counts as reaching it at the budget)")
    lines.append("")
    for row in table["mixes"]:
        classes = "; ".join(f"{c}: held-out {f['heldout_at_budget']:.3f} ({_pct(f['heldout_at_budget_gain'])}), "
                            f"cum. reward @ R {f['reward_at_equal_rounds']:.2f} ({_pct(f['reward_at_equal_rounds_gain'])})"
                            for c, f in row["classes"].items())
        per_node = ", ".join(f"node{i} {row['rounds_per_node'][i]:.0f}/{row['rollouts_per_node'][i]:.0f}"
                             for i in row["rounds_per_node"])
        lines.append(f"  {row['mix']}: {classes}")
        lines.append(f"  {row['mix']}: rounds/rollouts per node: {per_node}")
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
        speedup = _speedup_phrase(row, silo)
        lines.append(f"swarm {row['mix']} vs silo {silo['mix']} at equal compute: held-out pass@1 "
                     f"{row['heldout_at_budget']['mean']:.3f} vs {silo['heldout_at_budget']['mean']:.3f} "
                     f"({_pct(row['heldout_at_budget_gain'])}), area under its curve {_pct(row['auc_gain'])}, "
                     f"{speedup}; cum. reward at equal rounds {_pct(row['reward_at_equal_rounds_gain'])}")
    return lines


def _speedup_phrase(row: dict, silo: dict) -> str:
    if row["speedup_vs_silo"] is not None:
        return f"reached the held-out target {row['speedup_vs_silo']:.2f}x as fast"
    if row["time_to_target"] is None:
        return "never reached the held-out target"
    if row["time_to_target"] == 0 or silo["time_to_target"] == 0:  # a curve that starts at the target: no ratio
        return "no speedup to measure (a curve started at the held-out target)"
    return "the silo never reached the held-out target"


def plot_heldout_vs_time(ax, table: dict) -> None:
    """Held-out pass@1 against virtual time per mix: mean over nodes and seeds, ± std over seeds."""
    for i, row in enumerate(table["mixes"]):
        t, m, s = row["curve"]["t"], row["curve"]["mean"], row["curve"]["std"]
        ax.plot(t, m, color=f"C{i}", label=row["mix"])
        ax.fill_between(t, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=f"C{i}", alpha=0.2)
    ax.set(title="held-out pass@1 at equal compute (mean over nodes and seeds, ± std over seeds)",
           xlabel="virtual time (s)", ylim=(-0.02, 1.02))
