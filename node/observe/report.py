"""`swarm-node report RUN_DIR`: plots (PNG) and a short text summary of a run's metrics."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: write files, never open windows
import matplotlib.pyplot as plt  # noqa: E402

from node.observe.metrics import read_metrics  # noqa: E402


def rolling_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def summarize(rows: list[dict]) -> dict:
    rewards = [r["reward_mean"] for r in rows]
    k = min(10, len(rows))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    return {
        "rounds": len(rows),
        "reward_first10": first,
        "reward_last10": last,
        "improvement": (last / first) if first > 0 else float("inf") if last > 0 else 1.0,
        "pass_rate_last10": sum(r["pass_rate"] for r in rows[-k:]) / k,
        "tokens_per_s_mean": sum(r["tokens_per_s"] for r in rows) / len(rows),
        "seconds_total": sum(r["t_round"] for r in rows),
        "seconds_generate": sum(r["t_generate"] for r in rows),
        "seconds_score": sum(r["t_score"] for r in rows),
        "seconds_train": sum(r["t_train"] for r in rows),
        "seconds_exchange": sum(r.get("t_exchange", 0.0) for r in rows),
        **_last_heldout(rows),
        **_late_diversity(rows[-k:]),
    }


def _late_diversity(rows: list[dict]) -> dict:
    """The own rollouts' entropy, distinct completions per group and flat-group share
    (node/train/rollouts.py diversity_stats), each averaged over `rows` where measured."""
    out = {}
    for key in ("entropy_mean", "distinct_completions", "flat_group_share"):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[f"{key}_last10"] = sum(values) / len(values) if values else None
    return out


def _last_heldout(rows: list[dict]) -> dict:
    """The last held-out evaluation of the run (node/train/eval.py), if there was one."""
    evaluated = [r for r in rows if r.get("heldout_pass1") is not None or r.get("heldout_by_family")]
    if not evaluated:
        return {}
    last = evaluated[-1]
    return {"heldout_round": last["round"], "heldout_pass1": last.get("heldout_pass1"),
            "heldout_passk": last.get("heldout_passk"), "heldout_k": last.get("heldout_k"),
            "heldout_by_family": last.get("heldout_by_family", {}), "heldout_evaluations": len(evaluated)}


def _heldout_text(s: dict) -> str:
    """One summary line about the last held-out evaluation; empty when the run had none."""
    if "heldout_round" not in s:
        return ""

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    line = (f"held-out (last evaluation, round {s['heldout_round']}): pass@1 {fmt(s['heldout_pass1'])}, "
            f"pass@{s['heldout_k']} {fmt(s['heldout_passk'])}")
    families = ", ".join(f"{f} {fmt(v.get('pass1'))}" for f, v in s["heldout_by_family"].items())
    return line + (f"; pass@1 by family: {families}" if families else "") + "\n"


def _diversity_text(s: dict) -> str:
    """One line about the own rollouts' diversity; empty for runs logged before it was measured."""
    if s.get("distinct_completions_last10") is None:
        return ""
    entropy = "-" if s["entropy_mean_last10"] is None else f"{s['entropy_mean_last10']:.3f} nats/token"
    return (f"sampling (last 10 rounds): entropy {entropy}, distinct completions/group "
            f"{s['distinct_completions_last10']:.2f}, flat groups {s['flat_group_share_last10']:.0%}\n")


def summary_text(s: dict) -> str:
    ratio = "inf" if s["improvement"] == float("inf") else f"{s['improvement']:.2f}x"
    return (
        f"rounds: {s['rounds']}\n"
        f"reward: first 10 rounds {s['reward_first10']:.3f} -> last 10 rounds {s['reward_last10']:.3f} ({ratio})\n"
        f"pass rate (last 10 rounds): {s['pass_rate_last10']:.3f}\n"
        f"{_diversity_text(s)}"
        f"{_heldout_text(s)}"
        f"throughput: {s['tokens_per_s_mean']:.1f} generated tokens/s (mean over rounds)\n"
        f"time: {s['seconds_total']:.1f} s total = generate {s['seconds_generate']:.1f} s + score "
        f"{s['seconds_score']:.1f} s + exchange {s['seconds_exchange']:.1f} s + train {s['seconds_train']:.1f} s\n"
    )


def _plot_heldout(ax, rows: list[dict]) -> None:
    """Held-out pass@1 / pass@k per evaluated round (markers), OOD families' pass@1 dotted."""
    evaluated = [r for r in rows if r.get("heldout_by_family")]
    if not evaluated:
        return
    x = [r["round"] for r in evaluated]
    nan = lambda v: float("nan") if v is None else v  # noqa: E731
    if any(r.get("heldout_pass1") is not None for r in evaluated):
        k = evaluated[-1].get("heldout_k")
        ax.plot(x, [nan(r.get("heldout_pass1")) for r in evaluated], "o-", color="C4", label="held-out pass@1")
        ax.plot(x, [nan(r.get("heldout_passk")) for r in evaluated], "s--", color="C5", alpha=0.8,
                label=f"held-out pass@{k}")
    oods = sorted({f for r in evaluated for f in r["heldout_by_family"] if f.startswith("ood:")})
    for i, family in enumerate(oods):
        ax.plot(x, [nan(r["heldout_by_family"].get(family, {}).get("pass1")) for r in evaluated], "^:",
                color=f"C{6 + i % 4}", label=f"{family} pass@1")


def _plot_diversity(ax, rows: list[dict], window: int) -> None:
    """Own rollouts per round: entropy (nats/token, left axis; no line when never measured: vLLM),
    flat-group share and distinct completions over the mean group size (right axis, 0-1)."""
    rows = [r for r in rows if r.get("distinct_completions") is not None]  # runs logged before: nothing
    x = [r["round"] for r in rows]
    ax.set(title="own rollouts: sampling entropy, flat groups, distinct completions", xlabel="round",
           ylabel="nats/token")
    entropy = [r.get("entropy_mean") for r in rows]
    if any(v is not None for v in entropy):
        ax.plot(x, [float("nan") if v is None else v for v in entropy], alpha=0.3, color="C0")
        ax.plot(x, rolling_mean([v or 0.0 for v in entropy], window), color="C0", label="entropy (nats/token)")
    right = ax.twinx()
    right.set(ylim=(-0.02, 1.05), ylabel="share")
    right.plot(x, rolling_mean([r["flat_group_share"] for r in rows], window), color="C3", ls="--",
               label="flat-group share")
    group_size = [r["rollouts_generated"] / max(1, r["groups_local"]) for r in rows]
    right.plot(x, rolling_mean([r["distinct_completions"] / max(1.0, n) for r, n in zip(rows, group_size)], window),
               color="C2", ls=":", label="distinct / group size")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=8)


def write_report(run_dir: Path) -> tuple[Path, Path, str]:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"no metrics in {run_dir}/metrics.jsonl: is this a run directory? "
                                "(create one with `swarm-node train --run-dir DIR`)")
    x = [r["round"] for r in rows]
    window = max(1, len(rows) // 20)
    fig, axes = plt.subplots(3, 2, figsize=(11, 10))

    ax = axes[0][0]
    ax.plot(x, [r["reward_mean"] for r in rows], alpha=0.3, color="C0")
    ax.plot(x, rolling_mean([r["reward_mean"] for r in rows], window), color="C0", label="reward", lw=2.5)
    ax.plot(x, rolling_mean([r["pass_rate"] for r in rows], window), color="C2", label="pass rate", ls="--")
    _plot_heldout(ax, rows)
    ax.set(title=f"reward and pass rate (rolling mean, window {window})", xlabel="round", ylim=(-0.02, 1.05))
    ax.legend()

    ax = axes[0][1]
    losses = [r.get("loss", float("nan")) for r in rows]
    ax.plot(x, losses, alpha=0.3, color="C3")
    ax.plot(x, rolling_mean([v if v == v else 0.0 for v in losses], window), color="C3")
    ax.set(title="loss", xlabel="round")

    ax = axes[1][0]
    ax.plot(x, [r["tokens_per_s"] for r in rows], color="C1")
    ax.set(title="throughput (generated tokens / round seconds)", xlabel="round", ylabel="tokens/s")

    ax = axes[1][1]
    parts = ("t_generate", "t_score", "t_exchange", "t_train")
    ax.stackplot(x, *([r.get(k, 0.0) for r in rows] for k in parts), labels=[k[2:] for k in parts], alpha=0.8)
    ax.set(title="seconds per round", xlabel="round")
    ax.legend(loc="upper left")

    grid = axes[2][0].get_gridspec()
    for ax in axes[2]:
        ax.remove()
    _plot_diversity(fig.add_subplot(grid[2, :]), rows, window)  # one panel across the bottom row

    fig.tight_layout()
    png = run_dir / "report.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    text = summary_text(summarize(rows))
    txt = run_dir / "summary.txt"
    txt.write_text(text)
    return png, txt, text
