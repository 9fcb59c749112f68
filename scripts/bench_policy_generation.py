"""Benchmark (1) of scripts/bench_policy.py: rollout generation, side by side in one process.

Sides, all on the same model, prompts, temperature and completion length:
- "hf":    our HFGenerator (policy/generation.py), in this process;
- "vllm":  our VLLMGenerator (policy/vllm_backend.py), the vLLM engine in its own process;
- "plain": one plain `model.generate` call doing the same work (the peer).
At every batch size (rows = prompts x G) the calls are interleaved (hf, vllm, plain, hf, ...) after
one warmup call each, and medians of wall-clock tok/s are compared. CPU time is not: the vLLM side
works in another process.
"""
from __future__ import annotations

import os
import statistics
import time

SIDES = ("hf", "vllm", "plain")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    """1-minute load average: above the core count, other processes compete for the CPUs."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def completion_length(tokens: list[int], eos_ids: set[int]) -> int:
    """Tokens generated up to and including the first eos (the rest is padding)."""
    return next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))


def make_our_generator(policy, backend: str, force: bool, max_new_tokens: int):
    """Our generator for `backend`, unchanged, except that (when forced) every row generates exactly
    max_new_tokens tokens: the knob (min_new_tokens) the plain call and TRL get too."""
    from policy.generation import HFGenerator

    if backend == "vllm":
        from policy.vllm_backend import VLLMGenerator

        return VLLMGenerator(policy, min_new_tokens=max_new_tokens if force else 0)

    class FullLengthHFGenerator(HFGenerator):
        def _generation_config(self, params):
            config = super()._generation_config(params)
            if force:
                config.min_new_tokens = params.max_new_tokens
            return config

    return FullLengthHFGenerator(policy.model, policy.tokenizer)


def bench_generation(node, prompts: list[list[int]], batches: list[int], args, console, vllm=None) -> dict:
    """tok/s per side at each batch size; `prompts` holds enough prompts for the largest batch."""
    from policy.generation import eos_token_ids
    from policy.learner import autocast_context
    from policy.logprobs import pad_batch
    from policy.types import SamplingParams

    model, tokenizer = node.policy.model, node.policy.tokenizer
    force = not args.natural_length
    G, L, T = args.group_size, args.max_new_tokens, args.temperature
    hf = make_our_generator(node.policy, "hf", force, L)
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    params = SamplingParams(temperature=T, max_new_tokens=L)

    def ours(generator, batch_prompts) -> int:
        groups = generator.generate(batch_prompts, G, params)
        return sum(len(r.completion_ids) for g in groups for r in g)

    def plain(batch_prompts) -> int:
        repeated = [p for p in batch_prompts for _ in range(G)]
        input_ids, attention_mask, _ = pad_batch(repeated, [[] for _ in repeated], pad_id)  # [B, P]
        kwargs = dict(do_sample=True, temperature=T, top_k=0, top_p=1.0, max_new_tokens=L,
                      pad_token_id=pad_id, eos_token_id=eos_ids)
        if force:
            kwargs["min_new_tokens"] = L
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                             **kwargs)  # [B, P+S]
        new = out[:, input_ids.shape[1]:].tolist()  # [B, S]
        return sum(completion_length(row, set(eos_ids)) for row in new)

    sides = {"hf": lambda ps: ours(hf, ps), "plain": plain}
    if vllm is not None:
        sides["vllm"] = lambda ps: ours(vllm, ps)
    result: dict = {"max_new_tokens": L, "group_size": G, "batches": {}}
    was_training = model.training
    model.eval()
    try:
        with autocast_context(node.cfg.optim.autocast_bf16, node.learner.device):
            for rows in batches:
                batch_prompts = prompts[: max(1, rows // G)]
                runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
                for rep in range(1 + args.gen_reps):  # rep 0 = warmup of every side
                    for name, fn in sides.items():
                        t0 = time.perf_counter()
                        tokens = fn(batch_prompts)
                        seconds = time.perf_counter() - t0
                        console.log(f"generation batch {len(batch_prompts) * G:3d} {name:5s} "
                                    f"{'warmup' if rep == 0 else f'rep {rep}'}: {tokens} tokens in {seconds:.2f} s "
                                    f"({tokens / seconds:.1f} tok/s) load {load_average()}")
                        if rep > 0:
                            runs[name].append((seconds, tokens))
                result["batches"][str(len(batch_prompts) * G)] = summarize(runs)
    finally:
        model.train(was_training)
    return result


def summarize(runs: dict[str, list[tuple[float, int]]]) -> dict:
    out: dict = {}
    for name, calls in runs.items():
        tok_s = [tokens / seconds for seconds, tokens in calls]
        out[name] = {"tok_s": tok_s, "tok_s_median": median(tok_s), "seconds": [s for s, _ in calls],
                     "tokens": [t for _, t in calls]}
    plain = out["plain"]["tok_s_median"]
    out["ratio_vs_plain"] = {name: out[name]["tok_s_median"] / plain for name in out if name != "plain"}
    return out
