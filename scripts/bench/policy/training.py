"""Benchmark (2) of scripts/bench/policy/bench.py: one full round of ours (node.loop.Node.run_round) vs one
TRL `GRPOTrainer` optimizer step at equal prompts, G, completion length and loss, interleaved: our
round runs inside TRL's on_step_end callback and is timed apart from TRL's step. The first step of
each side is a warmup and is not counted.
"""
from __future__ import annotations

import statistics
import tempfile
import time

from scripts.bench.policy.generation import median
from scripts.common import load_average


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


# --------------------------------------------------------------------------------------------
# (2) training: our round vs TRL GRPOTrainer step
# --------------------------------------------------------------------------------------------


def our_round(node, round_index: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    row = node.run_round(round_index)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall": wall, "cpu": cpu, "tokens": row["tokens_generated"], "t_generate": row["t_generate"],
            "t_score": row["t_score"], "t_train": row["t_train"], "reward_mean": row["reward_mean"],
            "samples_trained": row.get("samples_trained", 0.0),
            "zero_adv_rows_skipped": row.get("zero_adv_rows_skipped", 0.0)}


def build_trl_dataset(node, n_steps: int):
    """One row per prompt, in round order: TRL step k (shuffle off) sees our round k's tasks."""
    from datasets import Dataset

    from node.scoring.verifiers import SYSTEM_PROMPT

    tasks, rows = {}, []
    tok = node.policy.tokenizer
    for k in range(n_steps):
        for task in node.source.batch(k, node.cfg.tasks.prompts_per_round):
            tasks[task.ref.key] = task
            if node.policy.chat:
                prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]
            else:  # the exact text of our rendered ids (the tiny tokenizer parses "<bos>" back to bos)
                from node.train.prompts import render_prompt

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
        return {
            "tok_s": tps, "tok_s_median": median(tps),
            "seconds": [r["wall"] for r in measured], "seconds_median": median([r["wall"] for r in measured]),
            "tokens": [r["tokens"] for r in measured],
            "t_generate_median": median([r["t_generate"] for r in measured]),
            "t_score_median": median([r["t_score"] for r in measured]),
            "t_train_median": median([r["t_train"] for r in measured]),
            "reward_mean": statistics.fmean(r["reward_mean"] for r in measured),
            "samples_trained": [r.get("samples_trained") for r in measured],  # ours: rows forwarded
            "zero_adv_rows_skipped": [r.get("zero_adv_rows_skipped") for r in measured],  # ours: + these = P x G
            "warmup_seconds": [r["wall"] for r in rows[:args.warmup]],
        }

    result = {"ours": summarize(ours_rows), "trl": summarize(trl_rows) if trl_rows else None, **trl_info}
    if result["trl"]:
        result["ratio"] = result["ours"]["tok_s_median"] / result["trl"]["tok_s_median"]
        result["best_ratio"] = max(result["ours"]["tok_s"]) / max(result["trl"]["tok_s"])
        result["pair_ratio_median"] = median([o["tokens"] / o["wall"] / (t["tokens"] / t["wall"])
                                              for o, t in zip(ours_rows[args.warmup:], trl_rows[args.warmup:])])
    return result


def run_trl(node, args, console, n_steps: int, run_ours) -> tuple[list[dict], dict]:
    """TRL's GRPOTrainer for `n_steps` optimizer steps on its own copy of the weights, our round
    `run_ours(k)` after each of its steps: (TRL's per-step rows, its settings and dtypes)."""
    import torch
    import trl
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from policy.models import load_policy

    cfg = node.cfg
    # TRL patches the model's forward (fused LM head) and owns its optimizer: give it its own copy
    # of the same weights (load_policy is deterministic: same file / same init seed).
    trl_policy = load_policy(cfg.model)
    probe = DtypeProbe(trl_policy.model)
    dataset, tasks = build_trl_dataset(node, n_steps)
    state = {"tokens": [], "reward": [], "t_generate": 0.0, "t_score": 0.0, "generate_calls": 0}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        config = trl_config(cfg, args, tmp, n_steps)
        trainer = GRPOTrainer(model=trl_policy.model, reward_funcs=[verifier_reward(node, tasks, state)], args=config,
                              train_dataset=dataset, processing_class=trl_policy.tokenizer)
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-train metrics dict
        # Time TRL's generation (the model's public `generate`, which TRL calls on the model we gave
        # it) and reward phases (timed inside our reward function); the rest of its step is logp +
        # backward + optimizer. No private TRL attribute is read or replaced.
        first_prompts: list[list[int]] = []
        trl_policy.model.generate = timed_generate(trl_policy.model.generate, state, first_prompts)
        trainer.add_callback(interleave(args, console, state, rows, run_ours))
        trainer.train()
        if state["generate_calls"] == 0:
            raise RuntimeError(f"TRL {trl.__version__} never called the model's generate(): this bench cannot "
                               "time its generation; pin the TRL version docs/benchmarks.md names")
        prompts_identical = same_prompt_ids(first_prompts, node)
    P, G, L = cfg.tasks.prompts_per_round, cfg.sampling.group_size, cfg.sampling.max_new_tokens
    info = {"trl_dtypes": probe.summary(), "prompts_identical": prompts_identical,
            "trl_settings": {"version": trl.__version__, "loss_type": "grpo", "beta": 0.0, "num_iterations": 1,
                             "per_device_train_batch_size": G, "gradient_accumulation_steps": P,
                             "generation_batch_size": config.generation_batch_size,
                             "num_generations": G, "max_completion_length": L, "bf16": bool(config.bf16),
                             "gradient_checkpointing": False, "optim": "adamw_torch",
                             "min_new_tokens": L if not args.natural_length else None, "use_vllm": False,
                             "torch_threads": torch.get_num_threads()}}
    return rows, info


def verifier_reward(node, tasks: dict, state: dict):
    """TRL's reward function: our verifier, exactly as run_round scores a rollout; it records the
    completion tokens and the mean reward of each call in `state`."""
    def reward_fn(prompts, completions, completion_ids, task_key, **_):
        t0 = time.perf_counter()
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [node.verifier.score(tasks[key], node.source, text)[0] for text, key in zip(texts, task_key)]
        state["tokens"].append(sum(len(ids) for ids in completion_ids))
        state["reward"].append(sum(rewards) / len(rewards))
        state["t_score"] += time.perf_counter() - t0
        return rewards

    reward_fn.__name__ = "verifier"
    return reward_fn


def trl_config(cfg, args, output_dir: str, n_steps: int):
    """GRPOConfig at our round's prompts, G, completion length, loss and optimizer."""
    from trl import GRPOConfig

    P, G, L = cfg.tasks.prompts_per_round, cfg.sampling.group_size, cfg.sampling.max_new_tokens
    config = GRPOConfig(
        output_dir=output_dir,
        # one optimizer step = P prompts x G completions, generated at once and backpropagated in
        # micro-batches of G rows (activations bounded, as our chunked backward bounds ours: all 64
        # SmolLM2 rows at once would hold ~10 GB of activations)
        per_device_train_batch_size=G,
        gradient_accumulation_steps=P,
        num_generations=G,
        max_completion_length=L,
        temperature=cfg.sampling.temperature,
        top_k=0, top_p=1.0, repetition_penalty=1.0,
        generation_kwargs={"min_new_tokens": L} if not args.natural_length else None,
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
    return config


def same_prompt_ids(trl_prompt_ids: list[list[int]], node) -> bool:
    """Whether the prompts TRL generated from in its first step (`timed_generate` kept their ids,
    padding removed; TRL repeats each prompt G times) are the very ids we render for round 0."""
    from node.train.prompts import render_prompt

    P = node.cfg.tasks.prompts_per_round
    ours_prompt_ids = [render_prompt(node.policy, t.question) for t in node.source.batch(0, P)]
    return {tuple(ids) for ids in trl_prompt_ids} == {tuple(ids) for ids in ours_prompt_ids}


def timed_generate(generate, state: dict, first_prompts: list[list[int]]):
    """`generate`, its wall seconds added to state["t_generate"] on every call; the first call's
    prompt ids (left padding masked out) appended to `first_prompts`."""
    def wrapper(*a, **kw):
        if not first_prompts:
            ids, mask = kw.get("input_ids", a[0] if a else None), kw.get("attention_mask")
            if ids is not None:
                first_prompts.extend(row[m.bool()].tolist() if mask is not None else row.tolist()
                                     for row, m in zip(ids, mask if mask is not None else ids))
        state["generate_calls"] += 1
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            state["t_generate"] += time.perf_counter() - t0
    return wrapper


def interleave(args, console, state: dict, rows: list[dict], run_ours):
    """The callback that, after each TRL optimizer step, records its wall time in `rows`, then runs
    one round of ours (timed apart: TRL's clock resumes after it)."""
    from transformers import TrainerCallback

    clock = {"resume": None, "resume_cpu": None}

    class Interleave(TrainerCallback):
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

    return Interleave()
