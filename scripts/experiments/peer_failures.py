"""What a node learns from another policy's groups, and from which half of them.

One real tiny-warm node (node/train/warm_start.py: it solves the three-digit families now and then) is
fed, every round, 4 of its own groups plus 4 groups with reward variance sampled by a *frozen*
copy of the same warm start (a peer that does not learn), through the real learner path:
    silo8          8 own groups, nothing else (the silo)
    own4+own4      4 own groups + 4 more groups with variance of its own policy (more on-policy signal)
    peer4-minpro   + 4 peer groups, tier 0 (the peer's log-probs), external objective minpro
    peer4-train    + 4 peer groups at ratio 1 (sender_logprobs = false), failures trained (SAPO)
    peer4-drop     + 4 peer groups at ratio 1, failures dropped (loss.off_policy.peer_failures = drop)
Reported per condition and seed: the node's pass rate on its own draws per window of rounds, its
greedy held-out pass@1 at the end, and the mean weight the external objective gave peer tokens.
Writes <out>/exp_peer_failures.json and .png. policy/ALGORITHMS.md ("Peers' failures dropped")
explains the outcome.

    .venv/bin/python -m scripts.experiments.peer_failures          # 2 seeds x 200 rounds (about 2 minutes)
    .venv/bin/python -m scripts.experiments.peer_failures --quick  # smoke: 1 seed x 6 rounds, a 20-step warm start
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import arg_parser, command_line, pyplot, runs_dir, write_result

CONDITIONS = {
    "silo8": ["tasks.prompts_per_round=8"],
    "own4+own4": ["tasks.prompts_per_round=4"],
    "peer4-minpro": ["tasks.prompts_per_round=4", "loss.off_policy.sender_logprobs=true",
                     "loss.off_policy.peer_failures=train", "loss.external=minpro"],
    "peer4-train": ["tasks.prompts_per_round=4", "loss.off_policy.peer_failures=train"],
    "peer4-drop": ["tasks.prompts_per_round=4", "loss.off_policy.peer_failures=drop"],
}
FEED = 4  # extra groups per round
WINDOW = 25


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--warm-steps", type=int, default=None, help="warm start steps (default: the preset's)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 seed, 6 rounds, a 20-step warm start")
    p.add_argument("--out", default=str(runs_dir("exp_peer_failures")))
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seeds, args.warm_steps = 6, 1, 20
    return args


class Feed:
    """The exchange seam (node/train/loop.py Exchange), fed by `source`'s groups with reward variance."""

    def __init__(self, source, tier: int | None):
        self.source, self.tier = source, tier
        self.last_round: dict = {}  # adds nothing to the round's metrics row

    def collect(self, round_index: int, local: list) -> list:
        out = []
        for attempt in range(20):  # rare successes: draw until FEED groups have variance
            tasks = self.source.source.batch(round_index * 100 + attempt, FEED)
            groups, _ = self.source.sampler.sample(tasks, [None] * FEED, self.source.learner.policy_version)
            for group in groups:
                if not group.flat and len(out) < FEED:
                    for rollout in group.rollouts:
                        rollout.tier = self.tier
                    group.origin = "local" if self.tier is None else "peer"
                    out.append(group)
            if len(out) == FEED:
                break
        return out

    def share(self, round_index, groups): pass
    def request_hints(self, tasks): pass
    def take_hints(self): return []
    def take_hint_requests(self, k, answerable=None): return []
    def publish_hints(self, task, levels): pass
    def state_dict(self): return None
    def status(self): return {}
    def close(self): pass


def run_condition(condition: str, seed: int, args, progress, task_id) -> dict:
    from node.config.schema import load_config
    from node.train.loop import Node

    base = ["run.threads=1", "eval.every=0", "run.checkpoint_every=1000000", f"run.seed={seed}",
            "loss.off_policy.own_failures=train",  # as measured: only peers' failures are in question
            f"tasks.seed={seed}", "hints.enabled=false", f"warm.seed={seed}",
            *([f"warm.steps={args.warm_steps}"] if args.warm_steps else [])]
    with tempfile.TemporaryDirectory(prefix="exp-peer-failures-") as tmp:
        feed = None if condition == "silo8" else Feed(None, None if condition == "own4+own4" else 0)
        node = Node(load_config("tiny-warm", None, base + CONDITIONS[condition]), Path(tmp) / "node", feed)
        if feed is not None:  # fed by the node itself or by a peer built after it (the RNG order of the runs)
            feed.source = node if condition == "own4+own4" else \
                Node(load_config("tiny-warm", None, base + [f"tasks.seed={seed + 1000}"]), Path(tmp) / "peer")
        start = node.evaluate()["heldout_pass1"]
        rows, started = [], time.perf_counter()
        for r in range(args.rounds):
            row = node.run_round(r)
            rows.append({"round": r, "pass_rate": row["pass_rate"], "rev": row["pass_rate_by_dataset"].get("rev"),
                         "peer_weight": row.get("ext_t0_weight_mean", row.get("ext_t2_weight_mean"))})
            progress.advance(task_id)
        windows = [rows[i:i + WINDOW] for i in range(0, len(rows), WINDOW)]
        weights = [x["peer_weight"] for x in rows if x["peer_weight"] is not None]
        return {"condition": condition, "seed": seed, "rows": rows,
                "pass_rate_by_window": [sum(x["pass_rate"] for x in w) / len(w) for w in windows],
                "heldout_pass1_start": start, "heldout_pass1_end": node.evaluate()["heldout_pass1"],
                "peer_weight_mean": sum(weights) / len(weights) if weights else None,
                "seconds": time.perf_counter() - started}


def plot(results: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, condition in enumerate(CONDITIONS):
        for j, r in enumerate(x for x in results if x["condition"] == condition):
            xs = [WINDOW * (k + 0.5) for k in range(len(r["pass_rate_by_window"]))]
            ax.plot(xs, r["pass_rate_by_window"], color=f"C{i}", ls="-" if j == 0 else "--",
                    label=condition if j == 0 else None)
    ax.set(title="pass rate on own draws (solid: seed 0, dashed: later seeds)", xlabel="round", ylim=(-0.02, 1.02))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    from rich.console import Console
    from rich.progress import Progress

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    results = []
    with Progress(console=console, transient=True) as progress:
        for seed in range(args.seeds):
            for condition in CONDITIONS:
                task_id = progress.add_task(f"{condition} seed {seed}", total=args.rounds)
                results.append(run_condition(condition, seed, args, progress, task_id))
    summary = {"command": command_line(__spec__, argv), "python": platform.python_version(),
               "rounds": args.rounds, "seeds": args.seeds,
               "results": [{k: v for k, v in r.items() if k != "rows"} for r in results], "rows": results}
    json_path, png_path = write_result(out, "exp_peer_failures", summary, lambda summary, path: plot(results, path))
    console.print(f"{'condition':<14} {'seed':>4}  pass rate per {WINDOW} rounds{'':<20} held-out start -> end  peer weight")
    for r in results:
        windows = " ".join(f"{v:.2f}" for v in r["pass_rate_by_window"])
        weight = "-" if r["peer_weight_mean"] is None else f"{r['peer_weight_mean']:.3f}"
        console.print(f"{r['condition']:<14} {r['seed']:>4}  {windows:<45} {r['heldout_pass1_start']:.3f} -> "
                      f"{r['heldout_pass1_end']:.3f}  {weight}", soft_wrap=True)
    console.print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
