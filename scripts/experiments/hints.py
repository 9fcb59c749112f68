"""Hints across the swarm: does a node that cannot solve a task family learn it from a peer's hints?

Two real tiny nodes in one process, talking over the in-process bus (real signed messages, the
real Ingress and exchange; no rollouts are shared, J = 0, so only hints cross):
  strong  warm-started: a short supervised fine-tune on the family's correct answers, then the
          same RL loop; it answers hint requests with hints built from its own correct completions
  weak    from scratch on the same family; every group it fails triggers a HintRequest
Family: synthetic "count" ("3++=" -> "3456"): four right tokens in a row, so a random policy
succeeds about once in 65,000 samples and RL alone stays at 0. Prefix hints let the weak node
learn it backwards, one token at a time (node/train/hints.py: less help once hinted completions succeed).
Conditions: hints on vs hints off (the weak node never asks), each over --seeds seeds.

Reported per condition and seed: the weak node's unhinted pass rate over rounds (the hinted
completions are not counted), its greedy pass@1 on all 10 count questions every --eval-every
rounds, hinted-group statistics, and hint traffic. Writes <out>/exp_hints.json and .png.

    .venv/bin/python -m scripts.experiments.hints             # 3 seeds x 400 rounds (a few minutes)
    .venv/bin/python -m scripts.experiments.hints --quick     # smoke: 1 seed x 12 rounds
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import arg_parser, command_line, console as make_console, pyplot, runs_dir, write_result

FAMILY = "count"
CONDITIONS = ("hints_on", "hints_off")


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--sft-steps", type=int, default=300, help="supervised warm start of the strong node")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 seed, 12 rounds, short warm start")
    p.add_argument("--out", default=str(runs_dir("exp_hints")))
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seeds, args.eval_every, args.sft_steps = 12, 1, 6, 60
    return args


def make_node(run_dir: Path, bus, name: str, seed: int, hints: bool):
    from node.config.schema import load_config
    from node.service.assembly import memory_bus_node

    cfg = load_config("tiny", None, [
        "run.threads=1", f"run.seed={seed}", f"tasks.seed={seed * 10 + (name == 'strong')}",
        f"tasks.datasets={{{FAMILY} = 1.0}}", "tasks.prompts_per_round=8", "sampling.max_new_tokens=4",
        "swarm.name=hints", "swarm.external_per_round=0", f"hints.enabled={'true' if hints else 'false'}",
        "hints.serve_per_round=4", "hints.revisits_per_round=4", f"model.init_seed={seed}"])
    node = memory_bus_node(cfg, run_dir / name, bus, name)
    return node


def questions(node):
    """One task per distinct question of the family (10 for count)."""
    seen = {}
    for i in range(1000):
        for task in node.source.batch(10_000 + i, 1):
            seen.setdefault(task.question, task)
        if len(seen) == 10:
            break
    return [seen[q] for q in sorted(seen)]


def greedy_pass_rate(node, tasks) -> float:
    """pass@1 with greedy decoding on every question of the family."""
    from node.train.prompts import render_prompt
    from policy.types import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_new_tokens=node.cfg.sampling.max_new_tokens)
    rollouts = node.generator.generate([render_prompt(node.policy, t.question) for t in tasks], 1, greedy)
    return sum(node.verifier.score(t, node.source, rs[0].text)[1]["correct"] for t, rs in zip(tasks, rollouts)) / len(tasks)


def warm_start(node, tasks, steps: int, lr: float = 3e-3) -> float:
    """Supervised fine-tune on correct answers (prompt masked), then greedy pass@1."""
    import torch

    from node.train.prompts import render_prompt

    tok = node.policy.tokenizer
    rows = [(render_prompt(node.policy, t.question), tok(t.answer, add_special_tokens=False)["input_ids"])
            for t in tasks]
    ids = torch.tensor([p + a for p, a in rows], device=node.learner.device)  # [10, P+A]: equal lengths here
    labels = ids.clone()
    labels[:, : len(rows[0][0])] = -100  # [10, P+A]: loss on answer tokens only
    optimizer = torch.optim.AdamW(node.model.parameters(), lr=lr)
    node.model.train()
    for _ in range(steps):
        loss = node.model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return greedy_pass_rate(node, tasks)


def run_condition(condition: str, seed: int, args, progress, task_id) -> dict:
    from protocol import MemoryBus

    with tempfile.TemporaryDirectory(prefix="exp-hints-") as tmp:
        bus = MemoryBus(seed=seed)
        on = condition == "hints_on"
        strong = make_node(Path(tmp), bus, "strong", seed, hints=True)
        weak = make_node(Path(tmp), bus, "weak", seed, hints=on)
        family = questions(weak)
        strong_start = warm_start(strong, family, args.sft_steps)
        rows, evals = [], []
        started = time.perf_counter()
        for r in range(args.rounds):
            row = weak.run_round(r)
            strong.run_round(r)
            rows.append({k: row.get(k) for k in ("round", "pass_rate", "groups_hinted", "hinted_pass_rate",
                                                  "hints_accepted", "correct_per_rollout", "rollouts_generated")})
            if (r + 1) % args.eval_every == 0 or r + 1 == args.rounds:
                evals.append({"round": r, "weak_greedy_pass": greedy_pass_rate(weak, family),
                              "strong_greedy_pass": greedy_pass_rate(strong, family)})
            progress.advance(task_id)
        tail = rows[-max(1, args.rounds // 10):]
        first_success = next((x["round"] for x in rows if x["pass_rate"] > 0), None)
        return {
            "condition": condition, "seed": seed, "rows": rows, "evals": evals,
            "strong_greedy_pass_after_warm_start": strong_start,
            "weak_pass_rate_last10pct": sum(x["pass_rate"] for x in tail) / len(tail),
            "weak_greedy_pass_final": evals[-1]["weak_greedy_pass"],
            "first_unhinted_success_round": first_success,
            "hinted_groups": sum(x["groups_hinted"] for x in rows),
            "hints_accepted": sum(x.get("hints_accepted") or 0 for x in rows),
            "hint_counters": {**weak.hints.counters},
            "served_by_strong": dict(strong.hint_writer.counters),
            "rollouts_generated": sum(x["rollouts_generated"] for x in rows),
            "seconds": time.perf_counter() - started,
        }


def plot(result: dict, path: Path) -> None:
    from node.observe.report import rolling_mean

    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"hints_on": "C2", "hints_off": "C3"}
    for run in result["runs"]:
        x = [r["round"] for r in run["rows"]]
        window = max(1, len(x) // 25)
        label = f"{run['condition']} (seed {run['seed']})"
        ax1.plot(x, rolling_mean([r["pass_rate"] for r in run["rows"]], window), color=colors[run["condition"]],
                 alpha=0.8, label=label)
        ax2.plot([e["round"] for e in run["evals"]], [e["weak_greedy_pass"] for e in run["evals"]], marker="o",
                 color=colors[run["condition"]], alpha=0.8, label=label)
    ax1.set(title=f"weak node: unhinted pass rate on '{FAMILY}' (rolling mean)", xlabel="round",
            ylim=(-0.02, 1.02))
    ax2.set(title="weak node: greedy pass@1 on all 10 questions", xlabel="round", ylim=(-0.02, 1.02))
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    from rich.progress import Progress
    from rich.table import Table

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = make_console(160)
    runs = []
    with Progress(console=console, transient=True) as progress:
        for seed in range(args.seeds):
            for condition in CONDITIONS:
                task_id = progress.add_task(f"{condition} seed {seed}", total=args.rounds)
                runs.append(run_condition(condition, seed, args, progress, task_id))
    result = {"family": FAMILY, "rounds": args.rounds, "seeds": args.seeds, "sft_steps": args.sft_steps,
              "machine": platform.platform(), "command": command_line(__spec__, argv),
              "runs": runs}
    table = Table(title=f"exp_hints: weak node on '{FAMILY}' ({args.rounds} rounds)")
    for col in ("condition", "seed", "strong pass@1 (warm)", "weak pass rate, last 10%", "weak greedy pass@1",
                "1st unhinted success", "hinted groups", "hints kept"):
        table.add_column(col, justify="right")
    for run in runs:
        table.add_row(run["condition"], str(run["seed"]), f"{run['strong_greedy_pass_after_warm_start']:.2f}",
                      f"{run['weak_pass_rate_last10pct']:.3f}", f"{run['weak_greedy_pass_final']:.2f}",
                      str(run["first_unhinted_success_round"]), str(run["hinted_groups"]), str(run["hints_accepted"]))
    console.print(table)
    json_path, png_path = write_result(out, "exp_hints", result, plot)
    console.print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
