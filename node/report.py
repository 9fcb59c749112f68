"""`swarm-node report RUN_DIR`: plots (PNG) and a short text summary of a run's metrics."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: write files, never open windows
import matplotlib.pyplot as plt  # noqa: E402

from node.metrics import read_metrics  # noqa: E402


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
    }


def summary_text(s: dict) -> str:
    ratio = "inf" if s["improvement"] == float("inf") else f"{s['improvement']:.2f}x"
    return (
        f"rounds: {s['rounds']}\n"
        f"reward: first 10 rounds {s['reward_first10']:.3f} -> last 10 rounds {s['reward_last10']:.3f} ({ratio})\n"
        f"pass rate (last 10 rounds): {s['pass_rate_last10']:.3f}\n"
        f"throughput: {s['tokens_per_s_mean']:.1f} generated tokens/s (mean over rounds)\n"
        f"time: {s['seconds_total']:.1f} s total = generate {s['seconds_generate']:.1f} s + score "
        f"{s['seconds_score']:.1f} s + exchange {s['seconds_exchange']:.1f} s + train {s['seconds_train']:.1f} s\n"
    )


def write_report(run_dir: Path) -> tuple[Path, Path, str]:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"no metrics in {run_dir}/metrics.jsonl: is this a run directory? "
                                "(create one with `swarm-node train --run-dir DIR`)")
    x = [r["round"] for r in rows]
    window = max(1, len(rows) // 20)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))

    ax = axes[0][0]
    ax.plot(x, [r["reward_mean"] for r in rows], alpha=0.3, color="C0")
    ax.plot(x, rolling_mean([r["reward_mean"] for r in rows], window), color="C0", label="reward", lw=2.5)
    ax.plot(x, rolling_mean([r["pass_rate"] for r in rows], window), color="C2", label="pass rate", ls="--")
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

    fig.tight_layout()
    png = run_dir / "report.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    text = summary_text(summarize(rows))
    txt = run_dir / "summary.txt"
    txt.write_text(text)
    return png, txt, text
