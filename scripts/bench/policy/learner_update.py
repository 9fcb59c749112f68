"""Benchmark (4) of scripts/bench/policy/bench.py (--learner-update): the learner's update ALONE, with
optim.shared_prefix off and on, at one config: the preset's model and optimizer settings (smollm2:
float32 weights, bf16 autocast where native, backward chunks of 1,024 tokens), P prompts x G
samples of exactly --max-new-tokens completion tokens, one optimizer step per update.

    .venv/bin/python -m scripts.bench.policy.bench --learner-update --prompts 8 --group-size 8 \\
        --max-new-tokens 48 --threads 1                       # SmolLM2, both sides, the ratio
    .venv/bin/python -m scripts.bench.policy.learner_update --shared-prefix on --model tiny   # one side

Each side runs in a fresh process, so its peak RSS (VmHWM, MiB) is its own: the model load, then
--warmup unmeasured updates and --steps measured ones on the same batch (the weights move by lr
between them: the work does not change). Prompts are the node's own chat-rendered arithmetic
questions (SmolLM2: about 66 tokens); completions are random token ids (seeded: both sides train
the same batch), rewards alternate within a group so no group is flat. Prints one JSON line per side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from scripts.bench.policy.rss import peak_rss_mib
from scripts.common import ROOT, arg_parser

PRESETS = {"smollm2": "smollm2", "tiny": "tiny"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__.split("\n\n")[0])
    p.add_argument("--shared-prefix", choices=["on", "off"], required=True)
    p.add_argument("--model", choices=list(PRESETS), default="smollm2")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    return p.parse_args(argv)


def build_groups(policy, prompts: int, group_size: int, length: int, seed: int = 0):
    """`prompts` groups of `group_size` samples with `length` random completion tokens each."""
    import torch

    from node.train.prompts import render_prompt
    from policy.types import TrainGroup, TrainSample

    vocab = policy.model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(prompts):
        a, b = 17 + 13 * i, 29 + 7 * i
        prompt = render_prompt(policy, f"What is {a} + {b}?" if policy.chat else f"{a}+{b}=")  # tiny: digits only
        completions = torch.randint(10, vocab, (group_size, length), generator=generator)  # [G, length]
        groups.append(TrainGroup(samples=[
            TrainSample(prompt_ids=prompt, completion_ids=row.tolist(), behavior_logprobs=None, reward=float(j % 2))
            for j, row in enumerate(completions)]))
    return groups


def measure(args: argparse.Namespace) -> dict:
    """One side: load, warm up, time --steps updates; the figures as a dict."""
    import torch

    from node.config.schema import load_config
    from policy.learner import Learner
    from policy.losses import make_objective
    from policy.models import load_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    autocast = {"auto": "auto", "on": True, "off": False}[args.bf16]
    cfg = load_config(PRESETS[args.model], None, [f"optim.shared_prefix={args.shared_prefix == 'on'}"])
    optim = cfg.optim.model_copy(update={"autocast_bf16": autocast})
    policy = load_policy(cfg.model)
    rss_loaded = peak_rss_mib(os.getpid())
    learner = Learner(policy.model, make_objective(cfg.loss.name, **cfg.loss.knobs), optim,
                      pad_id=policy.tokenizer.pad_token_id, temperature=1.0, completion_budget=args.max_new_tokens)
    groups = build_groups(policy, args.prompts, args.group_size, args.max_new_tokens)
    seconds = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        stats = learner.update(groups)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - started)
    return {"shared_prefix": args.shared_prefix, "model": args.model, "threads": torch.get_num_threads(),
            "autocast_bf16": str(autocast), "rows": args.prompts * args.group_size,
            "prompt_tokens": len(groups[0].samples[0].prompt_ids), "completion_tokens": args.max_new_tokens,
            "s_per_update": statistics.median(seconds), "s_each": seconds, "peak_rss_mib": peak_rss_mib(os.getpid()),
            "peak_rss_after_load_mib": rss_loaded, "loss": stats["loss"], "samples_trained": stats["samples_trained"]}


def compare(args: argparse.Namespace, console) -> int:
    """bench.py --learner-update: both sides, each in its own process; prints them and the ratio."""
    sides = {}
    for shared in ("off", "on"):
        command = [sys.executable, "-m", "scripts.bench.policy.learner_update", "--shared-prefix", shared,
                   "--model", args.model, "--prompts", str(args.prompts), "--group-size", str(args.group_size),
                   "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--bf16", args.bf16,
                   *(["--threads", str(args.threads)] if args.threads else [])]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        sides[shared] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(sides[shared]), flush=True)  # one line each, never wrapped
    ratio = sides["off"]["s_per_update"] / sides["on"]["s_per_update"]
    console.print(f"learner update: {sides['off']['s_per_update']:.2f} s plain, {sides['on']['s_per_update']:.2f} s "
                  f"shared prefix ({ratio:.2f}x faster); peak RSS {sides['off']['peak_rss_mib']:.0f} MiB plain, "
                  f"{sides['on']['peak_rss_mib']:.0f} MiB shared")
    return 0


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(measure(parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
