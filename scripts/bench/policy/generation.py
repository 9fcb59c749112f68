"""Benchmark (1) of scripts/bench/policy/bench.py: rollout generation, side by side in one process.

Sides, all on the same model, prompts, temperature and completion length, none under autocast:
- "hf-fp32":  our HFGenerator (policy/generation.py) on the learner's float32 weights;
- "hf-bf16", "hf-int8": our generator on a sampling copy at that precision (policy/sampling_copy.py);
- "vllm":     our VLLMGenerator (policy/vllm_backend.py), the vLLM engine in its own process;
- "plain":    one plain float32 `model.generate` call doing the same work (the peer).
At every batch size (rows = prompts x G) the calls are interleaved (hf-fp32, hf-bf16, ..., plain,
hf-fp32, ...) after one warmup call each, and medians of wall-clock tok/s are compared. CPU time is
not: the vLLM side works in another process. Per precision it also measures the sampler's mismatch
to the float32 learner (mean |l - b| at natural length) and the seconds of one weight refresh; and,
at the largest batch, HF's static KV cache and torch.compile of the decode step (decode_variants).
"""
from __future__ import annotations

import statistics
import time

from scripts.common import load_average

PRECISIONS = ("fp32", "bf16", "int8")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def completion_length(tokens: list[int], eos_ids: set[int]) -> int:
    """Tokens generated up to and including the first eos (the rest is padding)."""
    return next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))


def make_our_generator(policy, backend: str, force: bool, max_new_tokens: int, precision: str = "fp32",
                       sampling_copy=None):
    """Our generator for `backend` (and, for hf, `precision`: a sampling copy is built unless one is
    given), unchanged, except that (when forced) every row generates exactly max_new_tokens tokens:
    the knob (min_new_tokens) the plain call and TRL get too."""
    from policy.generation import HFGenerator
    from policy.sampling_copy import CopySamplingGenerator, SamplingCopy

    if backend == "vllm":
        from policy.vllm_backend import VLLMGenerator

        return VLLMGenerator(policy, min_new_tokens=max_new_tokens if force else 0)
    base = HFGenerator if precision == "fp32" else CopySamplingGenerator

    class FullLengthGenerator(base):
        def generation_config(self, params):
            config = super().generation_config(params)
            if force:
                config.min_new_tokens = params.max_new_tokens
            return config

    if precision == "fp32":
        return FullLengthGenerator(policy.model, policy.tokenizer)
    return FullLengthGenerator(sampling_copy or SamplingCopy(policy.model, precision), policy.tokenizer)


def bench_generation(node, prompts: list[list[int]], batches: list[int], args, console, vllm=None,
                     other_prompts: list[list[int]] | None = None) -> dict:
    """tok/s per side at each batch size; `prompts` holds enough prompts for the largest batch (and
    `other_prompts`, as many of another length, for the decode variants)."""
    from policy.generation import eos_token_ids
    from policy.logprobs import pad_batch
    from policy.types import SamplingParams

    model, tokenizer = node.policy.model, node.policy.tokenizer
    force = not args.natural_length
    G, L, T = args.group_size, args.max_new_tokens, args.temperature
    ours_by_side = {f"hf-{p}": make_our_generator(node.policy, "hf", force, L, p) for p in args.precisions}
    if vllm is not None:
        ours_by_side["vllm"] = vllm
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    params = SamplingParams(temperature=T, max_new_tokens=L)

    def ours(generator, batch_prompts) -> int:
        groups = generator.generate(batch_prompts, G, params)
        return sum(len(r.completion_ids) for g in groups for r in g)

    def plain(batch_prompts) -> int:
        repeated = [p for p in batch_prompts for _ in range(G)]
        input_ids, attention_mask, _ = pad_batch(repeated, [[] for _ in repeated], pad_id)  # [B, P]
        kwargs = kwargs_for_plain(args, pad_id, eos_ids)
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                             **kwargs)  # [B, P+S]
        new = out[:, input_ids.shape[1]:].tolist()  # [B, S]
        return sum(completion_length(row, set(eos_ids)) for row in new)

    sides = {name: (lambda ps, g=generator: ours(g, ps)) for name, generator in ours_by_side.items()}
    sides["plain"] = plain
    result: dict = {"max_new_tokens": L, "group_size": G, "batches": {}}
    was_training = model.training
    model.eval()
    try:
        for rows in batches:
            batch_prompts = prompts[: max(1, rows // G)]
            runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
            for rep in range(1 + args.gen_reps):  # rep 0 = warmup of every side
                for name, fn in sides.items():
                    t0 = time.perf_counter()
                    tokens = fn(batch_prompts)
                    seconds = time.perf_counter() - t0
                    console.log(f"generation batch {len(batch_prompts) * G:3d} {name:7s} "
                                f"{'warmup' if rep == 0 else f'rep {rep}'}: {tokens} tokens in {seconds:.2f} s "
                                f"({tokens / seconds:.1f} tok/s) load {load_average()}")
                    if rep > 0:
                        runs[name].append((seconds, tokens))
            result["batches"][str(len(batch_prompts) * G)] = summarize(runs)
        largest = prompts[: max(1, batches[-1] // G)]
        result["precisions"] = precision_facts(node, ours_by_side, largest, args)
        if args.decode_variants:
            speeds = result["batches"][str(len(largest) * G)]
            best = max((n for n in ours_by_side if n.startswith("hf-")), key=lambda n: speeds[n]["tok_s_median"])
            result["decode_variants"] = bench_decode_variants(node, best[3:], largest, other_prompts, args, console)
    finally:
        model.train(was_training)
    return result


def kwargs_for_plain(args, pad_id: int, eos_ids: list[int]) -> dict:
    """The plain `generate` call's sampling: temperature only, forced length unless --natural-length."""
    kwargs = dict(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                  max_new_tokens=args.max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_ids)
    if not args.natural_length:
        kwargs["min_new_tokens"] = args.max_new_tokens
    return kwargs


def decode_variant(policy, precision: str, force: bool, max_new_tokens: int, static: bool, compiled: bool):
    """Our generator at `precision` on weights of its own (a new copy; for fp32 a deep copy of the
    learner, so compiling never touches the model that trains), with HF's static KV cache (the
    shared prompt prefill needs the dynamic one, so it is off then) and/or a compiled forward."""
    import copy

    import torch

    from policy.sampling_copy import SamplingCopy

    base = make_our_generator(policy, "hf", force, max_new_tokens, precision,
                              sampling_copy=SamplingCopy(policy.model, precision) if precision != "fp32" else None)

    class Variant(type(base)):
        def generation_config(self, params):
            config = super().generation_config(params)
            if static:
                config.cache_implementation = "static"
            return config

        def shared_prefix_cache(self, prompts, owners):
            return None if static else super().shared_prefix_cache(prompts, owners)

    if precision == "fp32":
        generator = Variant(copy.deepcopy(policy.model), policy.tokenizer)
    else:
        generator = Variant(base.sampling_copy, policy.tokenizer)
    if compiled:  # an instance attribute: generate() calls it; shapes first seen compile (dynamic after a change)
        generator.model.forward = torch.compile(generator.model.forward)
    return generator


def bench_decode_variants(node, precision: str, prompts: list[list[int]], other_prompts: list[list[int]], args,
                          console) -> dict:
    """Our fastest sampler four ways, interleaved: as it runs (dynamic KV cache, shared prompt
    prefill), with HF's static cache, with torch.compile of the forward pass, with both. The first
    call pays the compilation; `other_prompts` (another prompt length) then shows what a new shape
    costs, as a node meets one whenever its prompts are longer or shorter than before."""
    from policy.types import SamplingParams

    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    force = not args.natural_length
    variants = {name: decode_variant(node.policy, precision, force, args.max_new_tokens, static, compiled)
                for name, static, compiled in (("ours", False, False), ("static", True, False),
                                               ("compiled", False, True), ("static+compiled", True, True))}
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in variants}
    first_call_s, new_length_s = {}, {}
    for rep in range(2 + args.gen_reps):  # rep 0: first call (compiles), last: another prompt length
        for name, generator in variants.items():
            batch = other_prompts if rep == 1 + args.gen_reps else prompts
            t0 = time.perf_counter()
            tokens = sum(len(r.completion_ids) for g in generator.generate(batch, args.group_size, params) for r in g)
            seconds = time.perf_counter() - t0
            label = "first call" if rep == 0 else "new prompt length" if batch is other_prompts else f"rep {rep}"
            console.log(f"decode variant {name:15s} {label}: {tokens} tokens in {seconds:.2f} s "
                        f"({tokens / seconds:.1f} tok/s) load {load_average()}")
            if rep == 0:
                first_call_s[name] = seconds
            elif batch is other_prompts:
                new_length_s[name] = seconds
            else:
                runs[name].append((seconds, tokens))
    summary = {name: {"tok_s_median": median([t / s for s, t in calls]), "tok_s": [t / s for s, t in calls]}
               for name, calls in runs.items()}
    ours = summary["ours"]["tok_s_median"]
    return {"precision": precision, "rows": len(prompts) * args.group_size, "sides": summary,
            "first_call_s": first_call_s, "new_prompt_length_s": new_length_s,
            "ratio_vs_ours": {n: summary[n]["tok_s_median"] / ours for n in summary if n != "ours"}}


def precision_facts(node, generators: dict, prompts: list[list[int]], args) -> dict:
    """Per precision: the sampler's mismatch to the float32 learner on its own rollouts (natural
    length: a forced length masks eos, which is not the policy's distribution), the seconds of one
    weight refresh (median of 3) and the copy's weight MiB."""
    import torch

    from policy.logprobs import completion_logprobs, pad_batch
    from policy.types import SamplingParams

    policy = node.policy
    facts = {}
    for name, generator in generators.items():
        if not name.startswith("hf-"):
            continue
        copy = getattr(generator, "sampling_copy", None)
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
        natural = make_our_generator(policy, "hf", False, args.max_new_tokens, name[3:], sampling_copy=copy)
        rollouts = [r for g in natural.generate(prompts, args.group_size, params) for r in g]
        ids, mask, completion = pad_batch([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts],
                                          policy.tokenizer.pad_token_id)
        with torch.no_grad():
            learner = completion_logprobs(policy.model, ids, mask, completion.shape[1], args.temperature)  # [N, C]
        behavior = torch.zeros_like(learner)  # [N, C]
        for i, r in enumerate(rollouts):
            behavior[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
        diff = (learner - behavior).abs() * completion  # [N, C]
        refresh = []
        for _ in range(3 if copy is not None else 0):
            t0 = time.perf_counter()
            copy.refresh(record=False)
            refresh.append(time.perf_counter() - t0)
        weights = copy.model if copy is not None else policy.model
        facts[name] = {"mean_abs_logp_diff": float(diff.sum() / completion.sum()), "max_abs_logp_diff": float(diff.max()),
                       "tokens": int(completion.sum()), "refresh_s": median(refresh) if refresh else 0.0,
                       "weights_mib": sum(t.numel() * t.element_size() for t in (*weights.parameters(), *weights.buffers()))
                       / 2**20}
    return facts


def summarize(runs: dict[str, list[tuple[float, int]]]) -> dict:
    out: dict = {}
    for name, calls in runs.items():
        tok_s = [tokens / seconds for seconds, tokens in calls]
        out[name] = {"tok_s": tok_s, "tok_s_median": median(tok_s), "seconds": [s for s, _ in calls],
                     "tokens": [t for _, t in calls]}
    plain = out["plain"]["tok_s_median"]
    out["ratio_vs_plain"] = {name: out[name]["tok_s_median"] / plain for name in out if name != "plain"}
    return out
