#!/usr/bin/env python
"""Benchmark our policy stack against its peers, side by side in ONE run on the same model and batch.

(1) generation: policy.generation.HFGenerator vs a plain `model.generate` call doing the same work
    (same model, prompts x G rows, max_new_tokens, temperature, top_k=0 / top_p=1, same autocast).
    Calls are interleaved (ours, plain, ours, plain, ...) after one warmup call each; medians.
(2) training: one full round of ours (node.loop.Node.run_round: tasks, generate, score, update)
    vs one TRL `GRPOTrainer` optimizer step at equal prompts, G, completion length and loss
    (loss_type="grpo", beta=0, num_iterations=1, no vLLM, one optimizer step per P x G batch).
    The two are interleaved too: our round runs inside TRL's on_step_end callback and is timed
    apart from TRL's step. The first step of each side is a warmup and is not counted.

Throughput = completion tokens / wall seconds of one step. By default both sides are forced to
generate exactly max_new_tokens tokens (min_new_tokens = max_new_tokens), so the token counts
match; tokens are counted on both sides anyway.

    .venv/bin/python scripts/bench_policy.py                      # SmolLM2, 8 prompts x 8 x 64 tokens
    .venv/bin/python scripts/bench_policy.py --steps 2 --skip-trl
    .venv/bin/python scripts/bench_policy.py --quick              # tiny model, seconds (smoke test)

Writes <out>/bench_policy.json and <out>/bench_policy.png (default out: runs/bench).
Exit status 2 when TRL is needed but missing (the install command is printed).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

# Nothing in this benchmark may reach the network (TRL / transformers / datasets would try).
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "WANDB_DISABLED": "true", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
                     "HF_HUB_DISABLE_PROGRESS_BARS": "1"}.items():
    os.environ.setdefault(_key, _value)

# transformers 5 deprecates names TRL 1.16 still uses internally (gradient_checkpointing...): noise here.
warnings.filterwarnings("ignore", category=FutureWarning)

ROOT = Path(__file__).resolve().parents[1]
TRL_VERSION = "1.16.0"
TRL_INSTALL = f".venv/bin/pip install trl=={TRL_VERSION}"
GOAL_GENERATION_RATIO = 0.95

# basic_arithmetic as in the smollm2 preset: cheap to verify, same semantics on both sides.
SMOLLM2_DATASETS = ("tasks.datasets={basic_arithmetic={weight=1.0,config={min_terms=2,max_terms=2,"
                    "min_digits=1,max_digits=1}}}")


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "smollm2"], default=None,
                   help="policy model (default smollm2; --quick implies tiny)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per round / per TRL step (default 8)")
    p.add_argument("--group-size", type=int, default=None, help="G completions per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion length (default 64)")
    p.add_argument("--steps", type=int, default=None, help="measured training steps per side (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured training steps first (default 1)")
    p.add_argument("--gen-reps", type=int, default=None, help="measured generate calls per side (default 4)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--bf16", choices=["on", "off"], default="on",
                   help="bf16 autocast over float32 weights on both sides (TRL: bf16=True); default on")
    p.add_argument("--natural-length", action="store_true",
                   help="do not force min_new_tokens = max_new_tokens (token counts may then differ)")
    p.add_argument("--skip-trl", action="store_true", help="measure (1) and our rounds only")
    p.add_argument("--skip-generation", action="store_true", help="skip benchmark (1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, 2 prompts x 4 x 8 tokens, 2 steps, 2 reps: a smoke test in seconds")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench", help="folder for the JSON and PNG")
    args = p.parse_args(argv)
    quick = {"model": "tiny", "prompts": 2, "group_size": 4, "max_new_tokens": 8, "steps": 2, "gen_reps": 2}
    full = {"model": "smollm2", "prompts": 8, "group_size": 8, "max_new_tokens": 64, "steps": 3, "gen_reps": 4}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick and args.model != "tiny":
        p.error("--quick uses the tiny model")
    if args.group_size < 2 or args.prompts < 1 or args.max_new_tokens < 1 or args.steps < 1 or args.gen_reps < 1:
        p.error("need --group-size >= 2 and --prompts, --max-new-tokens, --steps, --gen-reps >= 1")
    if args.warmup < 1:
        p.error("--warmup must be >= 1: the first step of each side pays one-time costs")
    return args


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


# --------------------------------------------------------------------------------------------
# Shared setup
# --------------------------------------------------------------------------------------------


def build_config(args):
    from node.config import load_config

    overrides = [
        f"tasks.prompts_per_round={args.prompts}",
        f"sampling.group_size={args.group_size}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        f"sampling.temperature={args.temperature}",
        "sampling.backend=\"hf\"",
        "loss.name=\"grpo\"",
        "optim.epochs=1",
        "optim.minibatches=1",
        "optim.lora_rank=0",
        f"optim.autocast_bf16={'true' if args.bf16 == 'on' else 'false'}",
        # TRL trains on every group, zero-advantage ones included: do the same amount of work.
        "optim.skip_zero_advantage=false",
        "model.dtype=\"float32\"",  # float32 master weights on both sides (TRL keeps them too)
    ]
    if args.model == "smollm2":
        overrides.append(SMOLLM2_DATASETS)
    if args.threads:
        overrides.append(f"run.threads={args.threads}")
    return load_config(args.model, None, overrides)


def make_full_length_generator(policy, force: bool):
    """Our HFGenerator, unchanged, except that (when forced) every row generates exactly
    max_new_tokens tokens: min_new_tokens = max_new_tokens, the same knob the plain call and TRL
    get, so all three do the same amount of work."""
    from policy.generation import HFGenerator

    class FullLengthHFGenerator(HFGenerator):
        def _generation_config(self, params):
            config = super()._generation_config(params)
            if force:
                config.min_new_tokens = params.max_new_tokens
            return config

    return FullLengthHFGenerator(policy.model, policy.tokenizer)


class DtypeProbe:
    """Records the output dtype of the first attention q_proj, split by grad mode: tells what
    precision generation (no grad) and training (grad) really ran in, on each side."""

    def __init__(self, model):
        self.seen: dict[str, set[str]] = {"generate": set(), "train": set()}
        module = next((m for name, m in model.named_modules() if name.endswith("q_proj")), None)
        self.handle = module.register_forward_hook(self._hook) if module is not None else None

    def _hook(self, module, inputs, output):
        import torch

        self.seen["train" if torch.is_grad_enabled() else "generate"].add(str(output.dtype).replace("torch.", ""))

    def summary(self) -> dict[str, str]:
        return {phase: ",".join(sorted(v)) or "-" for phase, v in self.seen.items()}


def completion_length(tokens: list[int], eos_ids: set[int]) -> int:
    """Tokens generated up to and including the first eos (the rest is padding)."""
    return next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    """1-minute load average: above the core count, other processes compete for the CPUs and wall
    times inflate (process CPU time much less so)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


# --------------------------------------------------------------------------------------------
# (1) generation: HFGenerator vs plain model.generate
# --------------------------------------------------------------------------------------------


def bench_generation(node, prompts: list[list[int]], args, console) -> dict:
    from policy.generation import eos_token_ids
    from policy.learner import autocast_context
    from policy.logprobs import pad_batch
    from policy.types import SamplingParams

    model, tokenizer = node.policy.model, node.policy.tokenizer
    force = not args.natural_length
    G, L, T = args.group_size, args.max_new_tokens, args.temperature
    ours_gen = make_full_length_generator(node.policy, force)
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    params = SamplingParams(temperature=T, max_new_tokens=L)

    def ours() -> int:
        groups = ours_gen.generate(prompts, G, params)
        return sum(len(r.completion_ids) for g in groups for r in g)

    def plain() -> int:
        repeated = [p for p in prompts for _ in range(G)]
        input_ids, attention_mask, _ = pad_batch(repeated, [[] for _ in repeated], pad_id)  # [B, P]
        kwargs = dict(do_sample=True, temperature=T, top_k=0, top_p=1.0, max_new_tokens=L,
                      pad_token_id=pad_id, eos_token_id=eos_ids)
        if force:
            kwargs["min_new_tokens"] = L
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                             **kwargs)  # [B, P+S]
        new = out[:, input_ids.shape[1]:].tolist()  # [B, S]
        return sum(completion_length(row, set(eos_ids)) for row in new)

    runs = {"ours": [], "plain": []}  # (wall seconds, tokens, cpu seconds) per measured call
    was_training = model.training
    model.eval()
    try:
        with autocast_context(node.cfg.optim.autocast_bf16, node.learner.device):
            for rep in range(1 + args.gen_reps):  # rep 0 = warmup of both
                for name, fn in (("ours", ours), ("plain", plain)):
                    t0, c0 = time.perf_counter(), time.process_time()
                    tokens = fn()
                    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                    label = "warmup" if rep == 0 else f"rep {rep}"
                    console.log(f"generation {name:5s} {label}: {tokens} tokens in {seconds:.2f} s wall, "
                                f"{cpu:.2f} s cpu ({tokens / seconds:.1f} tok/s wall, "
                                f"{tokens / cpu:.1f} tok/cpu-s) load {load_average()}")
                    if rep > 0:
                        runs[name].append((seconds, tokens, cpu))
    finally:
        model.train(was_training)

    tps = {name: [tok / sec for sec, tok, _ in r] for name, r in runs.items()}
    cps = {name: [tok / cpu for _, tok, cpu in r] for name, r in runs.items()}
    pair_ratios = [o / p for o, p in zip(tps["ours"], tps["plain"])]
    return {
        "batch_rows": len(prompts) * G,
        "max_new_tokens": L,
        "ours_tok_s": tps["ours"], "plain_tok_s": tps["plain"],
        "ours_seconds": [s for s, _, _ in runs["ours"]], "plain_seconds": [s for s, _, _ in runs["plain"]],
        "ours_tokens": [t for _, t, _ in runs["ours"]], "plain_tokens": [t for _, t, _ in runs["plain"]],
        "ours_cpu_seconds": [c for _, _, c in runs["ours"]], "plain_cpu_seconds": [c for _, _, c in runs["plain"]],
        "ours_tok_cpu_s_median": median(cps["ours"]), "plain_tok_cpu_s_median": median(cps["plain"]),
        "ratio_cpu": median(cps["ours"]) / median(cps["plain"]),
        "ours_tok_s_median": median(tps["ours"]), "plain_tok_s_median": median(tps["plain"]),
        "ratio": median(tps["ours"]) / median(tps["plain"]),
        "pair_ratio_median": median(pair_ratios),
        "best_ratio": max(tps["ours"]) / max(tps["plain"]),  # fastest call of each: least disturbed
        "goal": GOAL_GENERATION_RATIO,
    }


# --------------------------------------------------------------------------------------------
# (2) training: our round vs TRL GRPOTrainer step
# --------------------------------------------------------------------------------------------


def our_round(node, round_index: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    row = node.run_round(round_index)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall": wall, "cpu": cpu, "tokens": row["tokens_generated"], "t_generate": row["t_generate"],
            "t_score": row["t_score"], "t_train": row["t_train"], "reward_mean": row["reward_mean"],
            "samples_trained": row.get("samples_trained", 0.0)}


def build_trl_dataset(node, n_steps: int):
    """One row per prompt, in round order: TRL step k (shuffle off) sees our round k's tasks."""
    from datasets import Dataset

    from node.verifiers import SYSTEM_PROMPT

    tasks, rows = {}, []
    tok = node.policy.tokenizer
    for k in range(n_steps):
        for task in node.source.batch(k, node.cfg.tasks.prompts_per_round):
            tasks[task.ref.key] = task
            if node.policy.chat:
                prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]
            else:  # the exact text of our rendered ids (the tiny tokenizer parses "<bos>" back to bos)
                from node.prompts import render_prompt

                prompt = tok.decode(render_prompt(node.policy, task.question), skip_special_tokens=False)
            rows.append({"prompt": prompt, "task_key": task.ref.key})
    return Dataset.from_list(rows), tasks


def bench_training(node, args, console, skip_trl: bool) -> dict:
    n_steps = args.warmup + args.steps
    ours_rows: list[dict] = []

    def run_ours(k: int) -> None:
        r = our_round(node, k)
        ours_rows.append(r)
        label = "warmup" if k < args.warmup else f"step {k - args.warmup + 1}"
        console.log(f"ours  round {label}: {r['tokens']} tokens in {r['wall']:.2f} s wall, {r['cpu']:.2f} s cpu "
                    f"(gen {r['t_generate']:.2f} / score {r['t_score']:.2f} / train {r['t_train']:.2f}) "
                    f"-> {r['tokens'] / r['wall']:.1f} tok/s wall, {r['tokens'] / r['cpu']:.1f} tok/cpu-s; "
                    f"load {load_average()}")

    trl_rows: list[dict] = []
    trl_info: dict = {}
    if skip_trl:
        for k in range(n_steps):
            run_ours(k)
    else:
        trl_rows, trl_info = run_trl(node, args, console, n_steps, run_ours)

    def summarize(rows: list[dict]) -> dict:
        measured = rows[args.warmup:]
        if not measured:
            return {}
        tps = [r["tokens"] / r["wall"] for r in measured]
        cps = [r["tokens"] / r["cpu"] for r in measured]
        return {
            "tok_s": tps, "tok_s_median": median(tps),
            "tok_cpu_s": cps, "tok_cpu_s_median": median(cps),
            "cpu_seconds": [r["cpu"] for r in measured],
            "seconds": [r["wall"] for r in measured], "seconds_median": median([r["wall"] for r in measured]),
            "tokens": [r["tokens"] for r in measured],
            "t_generate_median": median([r["t_generate"] for r in measured]),
            "t_score_median": median([r["t_score"] for r in measured]),
            "t_train_median": median([r["t_train"] for r in measured]),
            "reward_mean": statistics.fmean(r["reward_mean"] for r in measured),
            "samples_trained": [r.get("samples_trained") for r in measured],  # ours: all P x G expected
            "warmup_seconds": [r["wall"] for r in rows[:args.warmup]],
        }

    result = {"ours": summarize(ours_rows), "trl": summarize(trl_rows) if trl_rows else None, **trl_info}
    if result["trl"]:
        result["ratio"] = result["ours"]["tok_s_median"] / result["trl"]["tok_s_median"]
        result["ratio_cpu"] = result["ours"]["tok_cpu_s_median"] / result["trl"]["tok_cpu_s_median"]
        result["best_ratio"] = max(result["ours"]["tok_s"]) / max(result["trl"]["tok_s"])
        result["pair_ratio_median"] = median([o["tokens"] / o["wall"] / (t["tokens"] / t["wall"])
                                              for o, t in zip(ours_rows[args.warmup:], trl_rows[args.warmup:])])
    return result


def run_trl(node, args, console, n_steps: int, run_ours) -> tuple[list[dict], dict]:
    import torch
    import trl
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from node.prompts import render_prompt
    from policy.models import load_policy

    cfg = node.cfg
    P, G, L = cfg.tasks.prompts_per_round, cfg.sampling.group_size, cfg.sampling.max_new_tokens
    force = not args.natural_length
    # TRL patches the model's forward (fused LM head) and owns its optimizer: give it its own copy
    # of the same weights (load_policy is deterministic: same file / same init seed).
    trl_policy = load_policy(cfg.model)
    probe = DtypeProbe(trl_policy.model)
    dataset, tasks = build_trl_dataset(node, n_steps)

    state = {"tokens": [], "reward": [], "t_generate": 0.0, "t_score": 0.0}

    def reward_fn(prompts, completions, completion_ids, task_key, **_):
        """Our verifier, exactly as run_round scores a rollout."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [node.verifier.score(tasks[key], node.source, text)[0] for text, key in zip(texts, task_key)]
        state["tokens"].append(sum(len(ids) for ids in completion_ids))
        state["reward"].append(sum(rewards) / len(rewards))
        return rewards

    reward_fn.__name__ = "verifier"
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=P * G,  # one optimizer step = P prompts x G completions
            gradient_accumulation_steps=1,
            num_generations=G,
            max_completion_length=L,
            temperature=cfg.sampling.temperature,
            top_k=0, top_p=1.0, repetition_penalty=1.0,
            generation_kwargs={"min_new_tokens": L} if force else None,
            loss_type="grpo",  # per-sequence token mean, then mean over sequences = our SMTM "grpo"
            scale_rewards="group",  # (R - mean) / (std + 1e-4), like ours
            epsilon=0.2,
            beta=0.0, num_iterations=1, use_vllm=False,
            learning_rate=cfg.optim.lr, adam_beta1=cfg.optim.betas[0], adam_beta2=cfg.optim.betas[1],
            weight_decay=cfg.optim.weight_decay, max_grad_norm=cfg.optim.grad_clip,
            optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
            bf16=cfg.optim.autocast_bf16, use_cpu=True,
            activation_checkpointing=False,  # TRL defaults to True; we do not checkpoint, so neither does TRL
            max_steps=n_steps, shuffle_dataset=False, seed=cfg.run.seed,
            logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
            log_completions=False, dataloader_num_workers=0, dataloader_pin_memory=False,
        )
        assert not config.gradient_checkpointing and not config.activation_checkpointing
        trainer = GRPOTrainer(model=trl_policy.model, reward_funcs=[reward_fn], args=config,
                              train_dataset=dataset, processing_class=trl_policy.tokenizer)
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-train metrics dict

        # Same prompt token ids on both sides?
        trl_prompt_ids, _, _ = trainer._tokenize_prompts([row["prompt"] for row in dataset.select(range(P))])
        ours_prompt_ids = [render_prompt(node.policy, t.question) for t in node.source.batch(0, P)]
        prompts_identical = [list(map(int, x)) for x in trl_prompt_ids] == ours_prompt_ids

        # Time TRL's generation and reward phases (the rest of its step is logp + backward + optimizer).
        def timed(method, key):
            def wrapper(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return method(*a, **kw)
                finally:
                    state[key] += time.perf_counter() - t0
            return wrapper

        trainer._generate = timed(trainer._generate, "t_generate")
        trainer._calculate_rewards = timed(trainer._calculate_rewards, "t_score")

        rows: list[dict] = []
        clock = {"resume": None, "resume_cpu": None}

        class Interleave(TrainerCallback):
            """After each TRL optimizer step, record its wall time, then run one round of ours."""

            def on_train_begin(self, *a, **kw):
                clock["resume"], clock["resume_cpu"] = time.perf_counter(), time.process_time()

            def on_step_end(self, a, trainer_state, control, **kw):
                wall = time.perf_counter() - clock["resume"]  # includes data fetch + logging of TRL
                cpu = time.process_time() - clock["resume_cpu"]
                k = trainer_state.global_step - 1
                row = {"wall": wall, "cpu": cpu, "tokens": state["tokens"][-1] if state["tokens"] else 0,
                       "t_generate": state["t_generate"], "t_score": state["t_score"],
                       "t_train": wall - state["t_generate"] - state["t_score"],
                       "reward_mean": state["reward"][-1] if state["reward"] else float("nan")}
                state["t_generate"] = state["t_score"] = 0.0
                rows.append(row)
                label = "warmup" if k < args.warmup else f"step {k - args.warmup + 1}"
                console.log(f"TRL   step  {label}: {row['tokens']} tokens in {wall:.2f} s wall, {cpu:.2f} s cpu "
                            f"(gen {row['t_generate']:.2f} / score {row['t_score']:.2f} / "
                            f"rest {row['t_train']:.2f}) -> {row['tokens'] / wall:.1f} tok/s wall, "
                            f"{row['tokens'] / cpu:.1f} tok/cpu-s; load {load_average()}")
                run_ours(k)
                clock["resume"], clock["resume_cpu"] = time.perf_counter(), time.process_time()

        trainer.add_callback(Interleave())
        trainer.train()
    info = {"trl_dtypes": probe.summary(), "prompts_identical": prompts_identical,
            "trl_settings": {"version": trl.__version__, "loss_type": "grpo", "beta": 0.0, "num_iterations": 1,
                             "per_device_train_batch_size": P * G, "gradient_accumulation_steps": 1,
                             "num_generations": G, "max_completion_length": L, "bf16": bool(config.bf16),
                             "gradient_checkpointing": False, "optim": "adamw_torch",
                             "min_new_tokens": L if force else None, "use_vllm": False,
                             "torch_threads": torch.get_num_threads()}}
    return rows, info


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def print_report(result: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    c = result["conditions"]
    cond = Table(title="measurement conditions", show_header=False, title_justify="left")
    cond.add_column(style="bold")
    cond.add_column()
    for key, value in c.items():
        cond.add_row(key, escape(str(value)))
    console.print(cond)

    table = Table(title="bench_policy: side by side, same model and batch, medians", title_justify="left")
    for col in ("benchmark", "ours", "peer", "ours / peer", "goal", "per-pair ratio median", "best / best",
                "samples"):
        table.add_column(col, justify="right" if col not in ("benchmark",) else "left")
    gen = result.get("generation")
    if gen:
        ok = "[green]met[/]" if gen["ratio"] >= gen["goal"] else "[red]missed[/]"
        table.add_row("(1) generate tok/s wall (HFGenerator / plain)",
                      f"{gen['ours_tok_s_median']:.1f}", f"{gen['plain_tok_s_median']:.1f}",
                      f"{gen['ratio']:.3f}", f">= {gen['goal']} ({ok})", f"{gen['pair_ratio_median']:.3f}",
                      f"{gen['best_ratio']:.3f}", f"{len(gen['ours_tok_s'])} + {len(gen['plain_tok_s'])}")
        table.add_row("    tok per process-CPU s", f"{gen['ours_tok_cpu_s_median']:.1f}",
                      f"{gen['plain_tok_cpu_s_median']:.1f}", f"{gen['ratio_cpu']:.3f}", "", "", "", "")
        table.add_row("    wall s per call", f"{median(gen['ours_seconds']):.2f}",
                      f"{median(gen['plain_seconds']):.2f}", "", "", "", "",
                      f"{gen['ours_tokens'][0]} / {gen['plain_tokens'][0]} tokens")
    tr = result.get("training")
    if tr:
        ours, trl = tr["ours"], tr.get("trl")
        table.add_row("(2) round tok/s wall (run_round / TRL step)",
                      f"{ours['tok_s_median']:.1f}", f"{trl['tok_s_median']:.1f}" if trl else "skipped",
                      f"{tr['ratio']:.3f}" if trl else "-", "-",
                      f"{tr['pair_ratio_median']:.3f}" if trl else "-", f"{tr['best_ratio']:.3f}" if trl else "-",
                      f"{len(ours['tok_s'])} + {len(trl['tok_s']) if trl else 0}")
        table.add_row("    tok per process-CPU s", f"{ours['tok_cpu_s_median']:.1f}",
                      f"{trl['tok_cpu_s_median']:.1f}" if trl else "-",
                      f"{tr['ratio_cpu']:.3f}" if trl else "-", "", "", "", "")
        table.add_row("    wall s per step", f"{ours['seconds_median']:.2f}",
                      f"{trl['seconds_median']:.2f}" if trl else "-", "", "", "", "",
                      f"{ours['tokens'][0]} / {trl['tokens'][0] if trl else '-'} tokens")
        for phase, label in (("t_generate", "generate"), ("t_score", "score (reward)"),
                             ("t_train", "train (logp+backward+step)")):
            table.add_row(f"      {label} wall s", f"{ours[phase + '_median']:.2f}",
                          f"{trl[phase + '_median']:.2f}" if trl else "-", "", "", "", "", "")
        table.add_row("    reward mean (sanity)", f"{ours['reward_mean']:.3f}",
                      f"{trl['reward_mean']:.3f}" if trl else "-", "", "", "", "", "")
    console.print(table)
    if result.get("load_warning"):
        console.print(f"[yellow]{result['load_warning']}[/]")
    console.print(f"total wall time {result['total_wall_s']:.1f} s; wrote {result['json']} and {result['png']}")


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen, tr = result.get("generation"), result.get("training")
    panels = [p for p in ("gen", "train", "split") if (p == "gen" and gen) or (p != "gen" and tr)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel in ("gen", "train"):
            if panel == "gen":
                bars = [("HFGenerator", gen["ours_tok_s"], "tab:blue"), ("plain generate", gen["plain_tok_s"], "tab:gray")]
                title = f"(1) generate tok/s: ratio {gen['ratio']:.3f} (goal {gen['goal']})"
            else:
                bars = [("ours run_round", tr["ours"]["tok_s"], "tab:blue")]
                title = "(2) round tok/s"
                if tr.get("trl"):
                    bars.append(("TRL GRPOTrainer", tr["trl"]["tok_s"], "tab:orange"))
                    title += f": ratio {tr['ratio']:.2f}"
            names = [b[0] for b in bars]
            container = ax.bar(names, [median(b[1]) for b in bars], color=[b[2] for b in bars], alpha=0.85)
            ax.bar_label(container, fmt="%.1f", label_type="center", fontsize=9, color="white")
            for x, (_, values, _) in enumerate(bars):  # every measured call: shows the noise
                ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
            ax.set_title(title, fontsize=10)
            ax.set_ylabel("completion tokens / wall s (bar: median, dots: runs)", fontsize=8)
        else:
            sides = [("ours", tr["ours"])] + ([("TRL", tr["trl"])] if tr.get("trl") else [])
            bottom = [0.0] * len(sides)
            for phase, color in (("t_generate", "tab:green"), ("t_score", "tab:purple"), ("t_train", "tab:red")):
                vals = [s[phase + "_median"] for _, s in sides]
                container = ax.bar([n for n, _ in sides], vals, bottom=bottom, color=color, label=phase[2:])
                ax.bar_label(container, labels=[f"{v:.1f}" if v >= 0.5 else "" for v in vals],
                             label_type="center", fontsize=8)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_title("wall s per step by phase (medians)", fontsize=10)
            ax.legend(fontsize=8)
    c = result["conditions"]
    fig.suptitle(f"{c['model']} | {c['prompts x G x tokens']} | threads {c['torch threads']} | {c['precision']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=150)  # logs: no wrapping
    if not args.skip_trl and not trl_available():
        console.print(f"TRL is not installed (the peer this benchmark compares against). Install it with:\n"
                      f"  {TRL_INSTALL}\n(or pip install 'swarm-node[bench]'), or pass --skip-trl.")
        return 2

    import torch
    import transformers

    from node.loop import Node
    from node.prompts import render_prompt

    load_start = load_average()
    cfg = build_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-node-") as node_dir:
        t0 = time.perf_counter()
        node = Node(cfg, Path(node_dir))
        load_s = time.perf_counter() - t0
        node.use_generator(make_full_length_generator(node.policy, force=not args.natural_length))
        probe = DtypeProbe(node.model)
        console.log(f"loaded {cfg.model.name} in {load_s:.1f} s; torch threads {torch.get_num_threads()}")

        generation = None
        if not args.skip_generation:
            prompts = [render_prompt(node.policy, t.question) for t in node.source.batch(0, args.prompts)]
            generation = bench_generation(node, prompts, args, console)
            gen_dtypes = probe.summary()["generate"]
            probe.seen["generate"].clear()
        training = bench_training(node, args, console, skip_trl=args.skip_trl)
        ours_dtypes = probe.summary()
        if generation is None:
            gen_dtypes = ours_dtypes["generate"]

    model = node.policy.model
    n_params = sum(p.numel() for p in model.parameters())
    prompt_lens = [len(render_prompt(node.policy, t.question)) for t in node.source.batch(0, args.prompts)]
    cpu_flags = ""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
        cpu_flags = ",".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in line.split())
    except (OSError, StopIteration):
        pass
    precision = (f"{cfg.model.dtype} weights + bf16 autocast" if cfg.optim.autocast_bf16
                 else f"{cfg.model.dtype} weights, no autocast")
    conditions = {
        "model": f"{cfg.model.name} ({n_params / 1e6:.1f}M params, vocab {model.config.vocab_size})",
        "prompts x G x tokens": f"{args.prompts} x {args.group_size} x {args.max_new_tokens}",
        "completion length": ("forced: min_new_tokens = max_new_tokens on every side" if not args.natural_length
                              else "natural (eos may stop early); tokens counted per side"),
        "tokens counted": "completion tokens (up to and incl. first eos), prompts excluded",
        "prompt tokens (round 0)": f"mean {statistics.fmean(prompt_lens):.1f}, max {max(prompt_lens)}",
        "precision": precision,
        "ours: q_proj dtype gen / train": f"{gen_dtypes} / {ours_dtypes['train']}",
        "TRL: q_proj dtype gen / train": (f"{training['trl_dtypes']['generate']} / {training['trl_dtypes']['train']}"
                                          if training.get("trl_dtypes") else "-"),
        "prompt ids identical ours/TRL": training.get("prompts_identical", "-"),
        "sampling": f"temperature {args.temperature}, top_k 0, top_p 1.0",
        "loss": "grpo (SMTM, eps 0.2, beta 0), 1 epoch x 1 minibatch, zero-adv groups trained",
        "optimizer": f"AdamW lr {cfg.optim.lr}, clip {cfg.optim.grad_clip}",
        "TRL": (f"trl {training['trl_settings']['version']}, loss_type grpo, grad ckpt off, adamw_torch, no vLLM"
                if training.get("trl_settings") else "skipped"),
        "measured": f"{args.gen_reps} generate calls per side after 1 warmup (interleaved); "
                    f"{args.steps} train steps per side after {args.warmup} warmup (interleaved)",
        "torch threads": torch.get_num_threads(),
        "machine": f"{os.cpu_count()} CPUs ({cpu_flags or 'no avx512'}), Python {platform.python_version()}",
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "model load s (excluded)": f"{load_s:.1f}",
        "load average 1 min (start / end)": f"{load_start} / {load_average()}",
        "wall vs CPU": "wall = perf_counter; CPU = process_time of this process (all its threads)",
    }
    json_path, png_path = args.out / "bench_policy.json", args.out / "bench_policy.png"
    result = {"conditions": conditions, "generation": generation, "training": training,
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "json": str(json_path), "png": str(png_path)}
    try:
        peak = max(float(load_start), float(load_average()))
    except ValueError:
        peak = 0.0
    if peak > (os.cpu_count() or 1):
        result["load_warning"] = (
            f"machine busy: 1-minute load average reached {peak:.1f} on {os.cpu_count()} CPUs, so other processes "
            "competed for the cores; wall-clock figures are inflated and noisy (the interleaving keeps the ratios "
            "comparable; process-CPU figures are less affected).")
    result["total_wall_s"] = time.perf_counter() - started
    write_plot(result, png_path)
    result["total_wall_s"] = time.perf_counter() - started
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_report(result, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
