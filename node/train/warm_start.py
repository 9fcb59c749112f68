"""Warm-starting the tiny model, so RL begins where SAPO's does: with rare successes to spread.

A from-scratch tiny model answers a one-token task right by chance (1 in 13) from round 0. A
pretrained language model instead knows the format and most of a skill, and succeeds on a hard
family only now and then; those rare successes are what a swarm can pass around. The `digits3`
recipe builds that regime in about 30 s on one CPU core:

    corpus   "copy" at lengths 1-4 (clean), and the three-digit families rev / inc / rot with the
             digits at NOISY_POSITIONS replaced by uniform random digits (fresh noise every batch):
             a related but different task, the format right and some positions a guess
    steps    AdamW (lr 3e-3, cosine to 0), batches of 64, next-token loss on the answer + eos
    split    corpus questions are training-split questions only (node/tasks/synthetic.py)

So the warm model's pass rate on a family is about 10^-(noisy positions): rev (1) about 10%,
inc and rot (2) about 1%, against 1.5e-5 by chance. Build time, seed and the warm model's greedy
held-out pass@1 per family are written beside the weights (warm_start.json).

The model is a deterministic function of (recipe, steps, seed, the model's shape) and is built
once per cache dir (model.cache_dir) under a file lock, so the nodes of a testnet that share a
seed share one warm model, as SAPO's nodes share one pretrained checkpoint.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
import torch

from node.config.sections import WarmStartConfig
from node.tasks.synthetic import GENERATORS, SPLIT_FAMILIES, SyntheticSource, is_heldout_question
from policy.models import ModelConfig, load_policy, resolve_cache_dir

RECIPE_VERSION = 2  # bump when the recipe changes: the cache key changes with it
NOISY_POSITIONS = {"rev": (2,), "inc": (1, 2), "rot": (1, 2)}  # answer digits the corpus randomises: the tail
COPY_LENGTHS = (1, 2, 3, 4)
BATCH_SIZE = 64
LR = 3e-3


def cache_key(warm: WarmStartConfig, model: ModelConfig) -> str:
    spec = {"recipe": warm.recipe, "version": RECIPE_VERSION, "steps": warm.steps, "seed": warm.seed,
            "shape": [model.hidden_size, model.num_layers, model.num_heads]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def warm_model_config(warm: WarmStartConfig, model: ModelConfig) -> ModelConfig:
    """The model config a node loads: `model` itself without a warm start, else the warm model's
    folder (built now if the cache does not hold it yet)."""
    if warm.recipe == "none":
        return model
    if model.name != "tiny":
        raise ValueError(f"warm.recipe = {warm.recipe!r} warm-starts the tiny model; model.name is {model.name!r}. "
                         "Use --set warm.recipe=none for other models")
    folder = resolve_cache_dir(model) / f"tiny-warm-{cache_key(warm, model)}"
    if not (folder / "config.json").is_file():
        build_locked(warm, model, folder)
    return model.model_copy(update={"name": str(folder)})


def build_locked(warm: WarmStartConfig, model: ModelConfig, folder: Path) -> None:
    """Build once: concurrent nodes wait on the lock, and the folder appears by an atomic rename."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "config.json").is_file():
            return
        tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        record = build(warm, model, tmp)
        (tmp / "warm_start.json").write_text(json.dumps(record, indent=1))
        os.rename(tmp, folder)


def corpus_example(rng: random.Random) -> tuple[str, str]:
    """One (question, answer) of the digits3 corpus."""
    family = rng.choice([*sorted(NOISY_POSITIONS), "copy"])
    if family == "copy":
        s = "".join(str(rng.randrange(10)) for _ in range(rng.choice(COPY_LENGTHS)))
        return f"{s}=", s
    question, answer = GENERATORS[family](rng)
    while is_heldout_question(question):  # the corpus never shows a held-out question
        question, answer = GENERATORS[family](rng)
    noisy = NOISY_POSITIONS[family]
    return question, "".join(str(rng.randrange(10)) if i in noisy else c for i, c in enumerate(answer))


def build(warm: WarmStartConfig, model_cfg: ModelConfig, folder: Path) -> dict:
    started = time.perf_counter()
    policy = load_policy(model_cfg.model_copy(update={"init_seed": warm.seed}))
    model, tokenizer = policy.model, policy.tokenizer
    rng = random.Random(f"warm-{warm.seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, warm.steps) / warm.steps)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warm.seed)
        model.train()
        for _ in range(warm.steps):
            ids, mask = corpus_batch(tokenizer, [corpus_example(rng) for _ in range(BATCH_SIZE)])  # [B, L] each
            logits = model(ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits[:, :-1]  # [B, L-1, V]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]  # [B, L-1]
            loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"recipe": warm.recipe, "version": RECIPE_VERSION, "steps": warm.steps, "seed": warm.seed,
            "seconds": round(time.perf_counter() - started, 1), "final_loss": round(loss.item(), 4),
            "greedy_heldout_pass1": greedy_pass1(model, tokenizer)}


def corpus_batch(tokenizer, pairs: list[tuple[str, str]]):
    """bos + question + answer + eos, right-padded; the mask covers answer + eos."""
    rows, masks = [], []
    for question, answer in pairs:
        prompt = [tokenizer.bos_token_id, *tokenizer.encode(question, add_special_tokens=False)]
        target = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        rows.append(prompt + target)
        masks.append([0.0] * len(prompt) + [1.0] * len(target))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)  # [B, L]
    mask = torch.zeros(len(rows), width)  # [B, L]
    for i, (row, m) in enumerate(zip(rows, masks)):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(m)] = torch.tensor(m)
    return ids, mask


def greedy_pass1(model, tokenizer, per_family: int = 100) -> dict[str, float]:
    """Greedy pass@1 on held-out questions of each split family (what RL starts from)."""
    source = SyntheticSource({name: 1.0 for name in sorted(SPLIT_FAMILIES)}, seed=0)
    out = {}
    with torch.no_grad():
        for family in sorted(SPLIT_FAMILIES):
            tasks = [t for t in source.heldout(per_family) if t.ref.dataset == family]
            correct = 0
            for task in tasks:
                prompt = torch.tensor([[tokenizer.bos_token_id, *tokenizer.encode(task.question, add_special_tokens=False)]])
                generated = model.generate(prompt, max_new_tokens=4, do_sample=False,
                                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
                correct += tokenizer.decode(generated[0, prompt.shape[1]:], skip_special_tokens=True) == task.answer
            out[family] = correct / max(1, len(tasks))
    return out
