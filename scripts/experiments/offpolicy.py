"""Off-policy correction of peers' rollouts: which corrections keep training stable, and at what cost?

One receiver node trains I local + J peer groups per round. The peer groups come through the real
wire path (signed RolloutGroups on the in-process bus, the receiver's Ingress, re-scoring, tiers)
from a replaying peer that samples with
    stale-k   the receiver's own weights from k rounds ago (k = 0, 4, 16): the same tokenizer, so
              every rollout is tier 0 and carries the exact behavior log-probs
    other     a different model: the same architecture warm-started by a short supervised
              fine-tune on the task family (a stronger, far off-policy peer)
and the receiver trains them with
    default     the node's default: ratio 1 (tier 2), only peers' verified successes trained
    sapo        ratio 1: peers' log-probs ignored (tier 2), external objective grpo, failures trained (the
                SAPO paper)
    grpo_token  grpo with its PPO ratio taken against the sender's behavior log-probs (this and the
                next two train peers' failures too)
    minpro      MinPRO on the behavior ratio (prefix minimum, no floor)
    ftis        truncated behavior ratio plus the KL filter on negative-advantage samples
The local objective is grpo throughout. Per setting and seed: the receiver's own on-policy reward
over rounds (peers' samples are never counted), loss, gradient norm, the external weights' ESS,
clip/truncation and filter fractions. A run is called unstable when its loss or gradient goes
non-finite, or its reward over the last 20% of rounds falls below half of its best 20-round mean.

    .venv/bin/python -m scripts.experiments.offpolicy --model tiny                  # 20 settings x 300 rounds
    .venv/bin/python -m scripts.experiments.offpolicy --model smollm2 --rounds 30   # multi-token completions
    .venv/bin/python -m scripts.experiments.offpolicy --quick                       # smoke: tiny, 6 rounds

Writes <out>/exp_offpolicy.json and <out>/exp_offpolicy.png (default out runs/exp_offpolicy).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from scripts.common import (
    arg_parser, command_line, console as make_console, pyplot, runs_dir, write_json, write_result,
)

SOURCES = ("stale0", "stale4", "stale16", "other")
# each states its treatment of peers' failures and log-probs: the defaults ignore log-probs and drop failures
FAILURES_TRAINED = "loss.off_policy.peer_failures=train"
CLAIMS = ["loss.off_policy.sender_logprobs=true", FAILURES_TRAINED]
CORRECTIONS = {
    "default": [],  # ratio 1, only peers' verified successes trained (policy/settings.py)
    "sapo": ["loss.external=grpo", "loss.off_policy.sender_logprobs=false", FAILURES_TRAINED],
    "grpo_token": ["loss.external=grpo", 'loss.off_policy.proximal="behavior"', *CLAIMS],
    "minpro": ["loss.external=minpro", *CLAIMS],
    "ftis": ["loss.external=ftis", *CLAIMS],
}
# The smoke's "other" peer: a smoke checks the wire path and the corrections, not the other model's
# strength. Measured (seed 0): base pass rate 0.07; 50 steps 0.12 in 36 CPU-s, 150 steps 0.30 in 95.
QUICK_SFT_STEPS = 50
MODELS = {
    # tiny: one-token answers learned from scratch (every ratio is a token ratio)
    "tiny": {"preset": "tiny", "overrides": ["tasks.prompts_per_round=4", "sampling.group_size=8"],
             "external": 12, "rounds": 300, "sft_steps": 150, "sft_lr": 3e-3},
    # SmolLM2: multi-token completions (prefix ratios differ from token ratios) on one-digit
    # arithmetic in its chat template, where it starts at a 6-22% pass rate (measured at 32 tokens)
    "smollm2": {"preset": "smollm2",
                "overrides": ["tasks.source=synthetic", "tasks.datasets={copy = 1.0, succ = 1.0, add = 1.0}",
                              "tasks.prompts_per_round=4", "sampling.group_size=8", "sampling.max_new_tokens=48",
                              "verifier.format_weight=0.0", "optim.lr=1e-5"],
                "external": 4, "rounds": 25, "sft_steps": 12, "sft_lr": 3e-5},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--rounds", type=int, help="rounds per run (default: per model)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1")
    p.add_argument("--sources", default=",".join(SOURCES), help=f"subset of {','.join(SOURCES)}")
    p.add_argument("--corrections", default=",".join(CORRECTIONS), help=f"subset of {','.join(CORRECTIONS)}")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quick", action="store_true", help="smoke mode: tiny, 6 rounds, two settings, "
                   f"{QUICK_SFT_STEPS} warm-start steps")
    p.add_argument("--out", default=str(runs_dir("exp_offpolicy")))
    p.add_argument("--merge", nargs="+", metavar="JSON", help="combine the runs of several result files "
                   "(e.g. one per process) into one table and plot; nothing is trained")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.rounds, args.seeds = "tiny", 6, 1
        args.sources, args.corrections = "stale4,other", "default,minpro"
    args.sft_steps = QUICK_SFT_STEPS if args.quick else MODELS[args.model]["sft_steps"]
    args.rounds = args.rounds or MODELS[args.model]["rounds"]
    args.sources, args.corrections = args.sources.split(","), args.corrections.split(",")
    for name in args.sources:
        if name not in SOURCES:
            p.error(f"unknown source {name!r}; valid: {', '.join(SOURCES)}")
    for name in args.corrections:
        if name not in CORRECTIONS:
            p.error(f"unknown correction {name!r}; valid: {', '.join(CORRECTIONS)}")
    return args


class ReplayingPeer:
    """Samples J groups per round with a copy of the receiver's weights from k rounds ago (or with a
    fixed other model) and publishes them as signed RolloutGroups."""

    def __init__(self, receiver, bus, k: int | None, other_state: dict | None, groups: int, seed: int):
        from node.tasks import make_source
        from policy.generation import HFGenerator
        from policy.models import load_policy
        from proto import swarm_pb2
        from protocol import MemoryTransport, NodeIdentity, Outbox

        cfg = receiver.cfg
        self.receiver, self.k, self.groups = receiver, k, groups
        self.policy = load_policy(cfg.model)
        if other_state is not None:
            self.policy.model.load_state_dict(other_state)
        self.generator = HFGenerator(self.policy.model, self.policy.tokenizer)
        self.source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed + 1000 + seed)
        self.snapshots: deque[dict] = deque(maxlen=(k or 0) + 1)
        self.transport = MemoryTransport(bus, "peer")
        self.transport.start()
        self.outbox = Outbox(NodeIdentity.generate(), pace=None)  # a round's groups at once, as a real round sends them
        self.card = swarm_pb2.ModelCard(name=cfg.model.name, tokenizer_fingerprint=self.policy.tokenizer_fingerprint)
        self.sampling_card = swarm_pb2.SamplingParams(temperature=cfg.sampling.temperature,
                                                      max_new_tokens=cfg.sampling.max_new_tokens)

    def publish(self, round_index: int) -> None:
        from node.peers.wire import to_wire
        from node.train.groups import ScoredGroup
        from node.train.prompts import render_prompt

        node = self.receiver
        if self.k is not None:  # the receiver's weights k rounds ago (all we have during the first k)
            # snapshots live in host memory: 17 copies of SmolLM2 would take 9 GB of GPU memory
            self.snapshots.append({n: t.detach().to("cpu", copy=True) for n, t in node.model.state_dict().items()})
            self.policy.model.load_state_dict(self.snapshots[0])
        tasks = self.source.batch(round_index, self.groups)
        prompts = [render_prompt(self.policy, t.question) for t in tasks]
        with node.parts.sampling.autocast():
            completions = self.generator.generate(prompts, node.cfg.sampling.group_size, node.sampling)
        for task, rollouts in zip(tasks, completions):
            scored = [node.verifier.score(task, node.source, r.text) for r in rollouts]
            group = ScoredGroup(task, rollouts, [s[0] for s in scored], [bool(s[1]["correct"]) for s in scored],
                                policy_version=round_index)
            self.outbox.publish(self.transport, node.cfg.swarm.name,
                                to_wire(group, round_index, self.card, self.sampling_card, node.verifier.digest))


def sampled_pass_rate(node, prompts: int = 16) -> float:
    """Pass rate of the node's current policy at its sampling temperature on fresh tasks."""
    groups, _ = node.sampler.sample(node.source.batch(90_000, prompts), [None] * prompts, 0)
    correct = [c for g in groups for c in g.correct]
    return sum(correct) / len(correct)


def warm_start(node, steps: int, lr: float) -> dict:
    """A copy of the initial weights fine-tuned on correct answers of the receiver's task family."""
    import torch

    from node.train.prompts import render_prompt

    tok = node.policy.tokenizer
    original = {n: t.detach().clone() for n, t in node.model.state_dict().items()}
    optimizer = torch.optim.AdamW(node.model.parameters(), lr=lr)
    node.model.train()
    for step in range(steps):
        for task in node.source.batch(50_000 + step, node.cfg.tasks.prompts_per_round):
            target = task.answer if not node.policy.chat else f"<answer>{task.answer}</answer>"
            prompt = render_prompt(node.policy, task.question)
            answer = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([prompt + answer], device=node.learner.device)  # [1, P+A]
            labels = ids.clone()
            labels[:, : len(prompt)] = -100  # [1, P+A]
            loss = node.model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    tuned = {n: t.detach().clone() for n, t in node.model.state_dict().items()}
    node.other_pass_rate = sampled_pass_rate(node)
    node.model.load_state_dict(original)
    node.base_pass_rate = sampled_pass_rate(node)
    return tuned


def run_setting(model: str, source: str, correction: str, seed: int, args, other_state, progress, task_id) -> dict:
    from node.config.schema import load_config
    from node.service.assembly import memory_bus_node
    from protocol import MemoryBus

    spec = MODELS[model]
    overrides = [*spec["overrides"], f"run.seed={seed}", f"model.init_seed={seed}", "swarm.name=offpolicy",
                 f"swarm.external_per_round={spec['external']}", "swarm.sampling_policy=uniform",
                 "swarm.pool.max_age_rounds=0", "hints.enabled=false", *CORRECTIONS[correction]]
    if args.threads:
        overrides.append(f"run.threads={args.threads}")
    cfg = load_config(spec["preset"], None, overrides)
    with tempfile.TemporaryDirectory(prefix="exp-offpolicy-") as tmp:
        bus = MemoryBus(seed=seed)
        swarm_time = [0.0]  # one round = one second for the receiver's rate limits, whatever the CPU's speed
        node = memory_bus_node(cfg, Path(tmp), bus, "receiver", swarm_clock=lambda: swarm_time[0])
        k = None if source == "other" else int(source.removeprefix("stale"))
        peer = ReplayingPeer(node, bus, k, other_state if source == "other" else None, spec["external"] * 2, seed)
        rows = []
        started = time.perf_counter()
        for r in range(args.rounds):
            swarm_time[0] = float(r)
            peer.publish(r)
            row = node.run_round(r)
            rows.append({key: row.get(key) for key in (
                "round", "reward_mean", "pass_rate", "loss", "grad_norm", "external_used", "ext_t0_ratio_mean",
                "ext_t0_ratio_max", "ext_t0_weight_ess", "ext_t0_clip_frac", "ext_t0_filtered_frac",
                "ext_t2_ratio_mean", "ext_t0_samples", "ext_t2_samples", "external_staleness_rounds")})
            progress.advance(task_id)
        return {"model": model, "source": source, "correction": correction, "seed": seed, "rows": rows,
                "seconds": time.perf_counter() - started, **summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    rewards = [r["reward_mean"] for r in rows]
    tail = rewards[-max(1, len(rows) // 5):]
    window = max(1, min(20, len(rows) // 5))
    best = max(sum(rewards[i:i + window]) / window for i in range(max(1, len(rows) - window + 1)))
    finite = all(r["loss"] is None or math.isfinite(r["loss"]) for r in rows) and \
        all(r["grad_norm"] is None or math.isfinite(r["grad_norm"]) for r in rows)
    final = sum(tail) / len(tail)

    def mean(key):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    return {"reward_first": sum(rewards[:len(tail)]) / len(tail), "reward_final": final, "reward_best": best,
            "reward_cumulative": sum(rewards), "stable": finite and final >= 0.5 * best,
            "ess_mean": mean("ext_t0_weight_ess"), "clip_frac_mean": mean("ext_t0_clip_frac"),
            "filtered_frac_mean": mean("ext_t0_filtered_frac"), "ratio_mean": mean("ext_t0_ratio_mean"),
            "grad_norm_max": max((r["grad_norm"] or 0.0) for r in rows)}


def summarize_over_seeds(runs: list[dict]) -> list[dict]:
    from statistics import mean, pstdev

    rows = []
    for source in SOURCES:
        for correction in CORRECTIONS:
            mine = [r for r in runs if r["source"] == source and r["correction"] == correction]
            if not mine:
                continue
            cumulative, final = [r["reward_cumulative"] for r in mine], [r["reward_final"] for r in mine]
            rows.append({"source": source, "correction": correction, "seeds": len(mine),
                         "cumulative_mean": mean(cumulative), "cumulative_std": pstdev(cumulative),
                         "final_mean": mean(final), "final_std": pstdev(final),
                         "stable": sum(r["stable"] for r in mine)})
    return rows


def plot(result: dict, path: Path) -> None:
    """Per source: each correction's own reward over rounds, mean over seeds (band: min to max),
    smoothed with a rolling mean; dotted when any of its runs was unstable."""
    from node.observe.report import rolling_mean

    plt = pyplot()
    sources = result["sources"]
    fig, axes = plt.subplots(1, len(sources), figsize=(4.2 * len(sources), 3.8), squeeze=False)
    for ax, source in zip(axes[0], sources):
        for i, correction in enumerate(CORRECTIONS):
            runs = [r for r in result["runs"] if r["source"] == source and r["correction"] == correction]
            if not runs:
                continue
            n = min(len(r["rows"]) for r in runs)
            window = max(1, n // 8)
            curves = [rolling_mean([row["reward_mean"] for row in r["rows"][:n]], window) for r in runs]
            mean = [sum(values) / len(values) for values in zip(*curves)]
            color = f"C{i}"
            ax.plot(range(n), mean, color=color, ls="-" if all(r["stable"] for r in runs) else ":",
                    label=f"{correction} ({len(runs)} seeds)")
            ax.fill_between(range(n), [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)],
                            color=color, alpha=0.12)
        ax.set(title=f"peer rollouts: {source}", xlabel="round", ylabel="own reward (rolling mean)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']}: receiver's own reward by correction (band: seeds' range; dotted: unstable)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    import torch
    from rich.progress import Progress

    from node.config.schema import load_config
    from node.train.loop import Node

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = make_console(170)
    if args.merge:
        parts = [json.loads(Path(path).read_text()) for path in args.merge]
        unique = {(r["source"], r["correction"], r["seed"]): r for part in parts for r in reversed(part["runs"])}
        result = {**parts[0], "runs": list(reversed(unique.values())),
                  "seeds": len({run["seed"] for part in parts for run in part["runs"]}),
                  "sources": [s for s in SOURCES if any(s in part["sources"] for part in parts)],
                  "warm_start": list({w["seed"]: w for part in parts for w in part.get("warm_start", [])}.values()),
                  "command": "; ".join(part["command"] for part in parts)}
        return report(result, out, console)
    spec = MODELS[args.model]
    runs, warm = [], []
    with Progress(console=console, transient=True) as progress:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            other_state = None
            if "other" in args.sources:
                with tempfile.TemporaryDirectory() as tmp:
                    teacher = Node(load_config(spec["preset"], None, [*spec["overrides"], f"model.init_seed={seed}"]),
                                   Path(tmp))
                    other_state = warm_start(teacher, args.sft_steps, spec["sft_lr"])
                    warm.append({"seed": seed, "sft_steps": args.sft_steps, "base_pass_rate": teacher.base_pass_rate,
                                 "other_pass_rate": teacher.other_pass_rate})
                    del teacher
            for source in args.sources:
                for correction in args.corrections:
                    task_id = progress.add_task(f"{source} / {correction} / seed {seed}", total=args.rounds)
                    runs.append(run_setting(args.model, source, correction, seed, args, other_state, progress, task_id))
                    result = {"model": args.model, "rounds": args.rounds, "seeds": args.seeds, "sources": args.sources,
                              "corrections": args.corrections, "machine": platform.platform(),
                              "device": "cuda" if torch.cuda.is_available() else "cpu", "warm_start": warm,
                              "command": command_line(__spec__, argv),
                              "runs": runs}
                    # every finished run is on disk at once: a long sweep cut short keeps what it did
                    write_json(out / "exp_offpolicy.json", result)
    return report(result, out, console)


def report(result: dict, out: Path, console) -> int:
    from rich.table import Table

    runs = result["runs"]
    table = Table(title=f"exp_offpolicy ({result['model']}, {result['rounds']} rounds, {result['seeds']} seed(s))")
    for col in ("source", "correction", "seed", "reward first 20%", "reward last 20%", "best", "cumulative",
                "stable", "ext ratio", "ESS", "clip/trunc", "filtered", "max grad"):
        table.add_column(col, justify="right")

    def fmt(value):
        return "-" if value is None else f"{value:.3f}"

    for run in runs:
        table.add_row(run["source"], run["correction"], str(run["seed"]), fmt(run["reward_first"]),
                      fmt(run["reward_final"]), fmt(run["reward_best"]), f"{run['reward_cumulative']:.1f}",
                      "yes" if run["stable"] else "NO", fmt(run["ratio_mean"]), fmt(run["ess_mean"]),
                      fmt(run["clip_frac_mean"]), fmt(run["filtered_frac_mean"]), fmt(run["grad_norm_max"]))
    console.print(table)
    result["summary"] = summarize_over_seeds(runs)
    summary = Table(title="mean over seeds (± standard deviation)")
    for col in ("source", "correction", "seeds", "cumulative reward", "reward last 20%", "stable runs"):
        summary.add_column(col, justify="right")
    for row in result["summary"]:
        summary.add_row(row["source"], row["correction"], str(row["seeds"]),
                        f"{row['cumulative_mean']:.1f} ± {row['cumulative_std']:.1f}",
                        f"{row['final_mean']:.3f} ± {row['final_std']:.3f}", f"{row['stable']}/{row['seeds']}")
    console.print(summary)
    for w in result.get("warm_start", []):
        console.print(f"seed {w['seed']}: the 'other' peer model samples at pass rate {w['other_pass_rate']:.2f} "
                      f"(the receiver starts at {w['base_pass_rate']:.2f})")
    json_path, png_path = write_result(out, "exp_offpolicy", result, plot)
    console.print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
