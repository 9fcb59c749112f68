"""Profile one node's training round: where its time goes and how often the host waits on the device.

Builds one node from a preset (as `swarm-node train` does: node.train.loop.Node over
node/train/assembly.py's parts), runs one warm-up round unprofiled, then N rounds each under its own
`torch.profiler.profile` (CPU activity, plus CUDA activity when a GPU is there) and prints

  (a) the top 15 ops by self CPU time over the profiled rounds (on CUDA also by self device time),
  (b) the host syncs per round: calls of aten::_local_scalar_dense (what .item(), float(t), int(t)
      and `if t:` dispatch to) and aten::nonzero (boolean indexing: its output size is data), plus,
      on CUDA only, every other op that copied device -> host (a "Memcpy DtoH" kernel: .cpu(),
      .tolist()). On a CPU run copies cannot be told apart (every one is host -> host), so the CPU
      figure misses .tolist()/.cpu() and counts reads of CPU-only tensors too (AdamW's step
      counters, the advantages of node/train's groups). Hence also the syncs by phase (generate,
      update, step = one optimizer step of the learner without AdamW's own, optimizer, refresh,
      other) and per optimizer step: what the learner's hot path costs;
  (c) the per-phase seconds of each profiled round from its metrics row (t_generate, t_score,
      t_exchange, t_train, t_round; the profiler's overhead is in them: compare runs of this script,
      not these against unprofiled rounds; the warm-up round's are reported too).

    .venv/bin/python -m scripts.bench.policy.profile_round                      # tiny-warm, CPU or GPU
    .venv/bin/python -m scripts.bench.policy.profile_round --preset tiny --rounds 1 --device cpu
    .venv/bin/python -m scripts.bench.policy.profile_round --preset smollm2 --device cuda --json runs/prof.json
    .venv/bin/python -m scripts.bench.policy.profile_round -- optim.minibatches=4   # config overrides

Held-out evaluation is off (eval.every=0) unless an override turns it back on. With --json PATH the
figures are also written there as JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scripts.common import arg_parser, write_json

PHASES = ("t_generate", "t_score", "t_exchange", "t_train", "t_round")
SCALAR_READ = "aten::_local_scalar_dense"
SYNC_OPS = (SCALAR_READ, "aten::nonzero")  # syncs on a GPU whatever the tensor; copies: by their kernel
# the calls whose syncs are told apart: (label, owner attribute of the node, method); innermost wins
LABELS = (("generate", "sampler", "sample"), ("update", "learner", "update"), ("step", "learner", "_step"),
          ("refresh", "generator", "refresh"))
OPTIMIZER = "Optimizer.step#"  # torch's own label of optimizer.step(): AdamW's CPU step counters
TOP = 15


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny-warm", help="node preset (node/config/presets.py; default tiny-warm)")
    p.add_argument("--rounds", type=int, default=2, help="profiled rounds after the warm-up round (default 2)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="model.device of the node (default auto: cuda when there is one)")
    p.add_argument("--threads", type=int, default=None, help="run.threads (default: the preset's)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    p.add_argument("overrides", nargs="*", help="config overrides, as swarm-node's --set (after --)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def build_node(args: argparse.Namespace, run_dir: Path):
    """The node of `args.preset` on `args.device`, evaluation off, with the caller's overrides last."""
    from node.config.schema import load_config
    from node.train.loop import Node

    overrides = ["eval.every=0", f'model.device="{args.device}"',
                 *([f"run.threads={args.threads}"] if args.threads else []), *args.overrides]
    return Node(load_config(args.preset, None, overrides), run_dir)


def phases(row: dict) -> dict[str, float]:
    """The per-phase seconds of one round's metrics row."""
    return {key: float(row.get(key, 0.0)) for key in PHASES}


def label_calls(node) -> None:
    """Wrap the node's generate, update, optimizer step and refresh calls (LABELS) in profiler ranges,
    on these objects only, so each sync can be told to its phase."""
    from torch.profiler import record_function

    def labelled(label, method):
        def call(*args, **kwargs):
            with record_function(f"profile_round.{label}"):
                return method(*args, **kwargs)
        return call

    for label, owner, name in LABELS:
        target = getattr(node, owner)
        setattr(target, name, labelled(label, getattr(target, name)))


def phase_of(evt) -> str:
    """The innermost labelled call (or optimizer step) an event ran in; "other" outside them all."""
    while evt is not None:
        if evt.name.startswith(OPTIMIZER):
            return "optimizer"
        if evt.name.startswith("profile_round."):
            return evt.name.split(".", 1)[1]
        evt = evt.cpu_parent
    return "other"


def count_syncs(events) -> tuple[Counter, Counter]:
    """Host syncs in a profile's events, (by op, by phase): every scalar read and nonzero, and every
    other op with a device -> host copy among its kernels (CUDA only: on a CPU run no op has kernels)."""
    by_op: Counter = Counter()
    by_phase: Counter = Counter()
    for evt in events:
        if evt.name in SYNC_OPS or any("DtoH" in kernel.name for kernel in evt.kernels):
            by_op[evt.name] += 1
            by_phase[phase_of(evt)] += 1
    return by_op, by_phase


def merge_ops(totals: dict[str, dict], averages) -> None:
    """Add one profile's per-op figures (key_averages) to `totals` (name -> calls and microseconds;
    `kernel`: a device-side event, whose time its launching op's self device time already holds)."""
    from torch.autograd import DeviceType

    for avg in averages:
        if avg.key.startswith("profile_round."):  # our labels (label_calls), not ops
            continue
        op = totals.setdefault(avg.key, {"calls": 0, "self_cpu_us": 0.0, "cpu_total_us": 0.0, "self_device_us": 0.0,
                                         "kernel": avg.device_type != DeviceType.CPU})
        op["calls"] += avg.count
        op["self_cpu_us"] += avg.self_cpu_time_total
        op["cpu_total_us"] += avg.cpu_time_total
        op["self_device_us"] += getattr(avg, "self_device_time_total", 0.0)


def top_ops(totals: dict[str, dict], key: str, rounds: int, n: int = TOP) -> list[dict]:
    """The n ops (host-side: a kernel's time is its op's) with the most `key` time, in milliseconds per round."""
    ops = [(name, op) for name, op in totals.items() if not op["kernel"]]
    ranked = sorted(ops, key=lambda item: item[1][key], reverse=True)[:n]
    return [{"name": name, "calls_per_round": op["calls"] / rounds,
             "self_cpu_ms_per_round": op["self_cpu_us"] / 1e3 / rounds,
             "cpu_total_ms_per_round": op["cpu_total_us"] / 1e3 / rounds,
             "self_device_ms_per_round": op["self_device_us"] / 1e3 / rounds} for name, op in ranked]


def profile_rounds(node, rounds: int, first: int, cuda: bool) -> tuple[list[dict], list[tuple], dict[str, dict]]:
    """Rounds first .. first + rounds - 1, each under its own profiler: (metrics rows, syncs (by op,
    by phase) per round, per-op totals over all of them)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    rows, syncs, totals = [], [], {}
    for k in range(first, first + rounds):
        with profile(activities=activities) as prof:
            rows.append(node.run_round(k))
            if cuda:
                torch.cuda.synchronize()
        syncs.append(count_syncs(prof.events()))
        merge_ops(totals, prof.key_averages())
    return rows, syncs, totals


def summarize(args: argparse.Namespace, node, warmup: dict, rows: list[dict], syncs: list[tuple],
              totals: dict[str, dict], cuda: bool, build_s: float) -> dict:
    """The figures: per-phase seconds, host syncs per round (by op, by phase, per optimizer step), the top ops."""
    import torch

    per_round = [sum(by_op.values()) for by_op, _ in syncs]
    by_op = sum((c for c, _ in syncs), Counter())
    by_phase = sum((c for _, c in syncs), Counter())
    steps = sum(row.get("optimizer_steps", 0.0) for row in rows)
    return {
        "preset": args.preset, "rounds": args.rounds, "overrides": args.overrides,
        "device": str(node.learner.device), "cuda": cuda, "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "objective": node.objective.spec, "build_s": build_s,
        "host_syncs": max(per_round),  # the most of any profiled round (rounds differ: eos, rows that train)
        "host_syncs_per_round": per_round,
        "scalar_reads_per_round": [c[SCALAR_READ] for c, _ in syncs],
        "syncs_by_op_per_round": {name: n / args.rounds for name, n in by_op.most_common()},
        "syncs_by_phase_per_round": {name: n / args.rounds for name, n in by_phase.most_common()},
        # one optimizer step of the learner (loss, backward, statistics), AdamW's CPU step counters apart
        "syncs_per_optimizer_step": by_phase["step"] / steps if steps else None,
        "phases": {key: statistics.fmean(phases(row)[key] for row in rows) for key in PHASES},
        "phases_per_round": [phases(row) for row in rows],
        "warmup_phases": phases(warmup),
        "optimizer_steps_per_round": [row.get("optimizer_steps", 0.0) for row in rows],
        "tokens_generated_per_round": [row.get("tokens_generated", 0) for row in rows],
        "top_ops_self_cpu": top_ops(totals, "self_cpu_us", args.rounds),
        "top_ops_self_device": top_ops(totals, "self_device_us", args.rounds) if cuda else [],
    }


def print_report(result: dict) -> None:
    print(f"preset {result['preset']} on {result['device']} ({result['objective']}), torch {result['torch']}, "
          f"{result['torch_threads']} threads; {result['rounds']} profiled round(s) after 1 warm-up")
    tables = [("self CPU", "top_ops_self_cpu")] + ([("self device", "top_ops_self_device")] if result["cuda"] else [])
    for title, key in tables:
        print(f"\ntop {TOP} ops by {title} time (per round)")
        print(f"  {'op':<60} {'calls':>8} {'self cpu ms':>12} {'cpu total ms':>13} {'self dev ms':>12}")
        for op in result[key]:
            print(f"  {op['name'][:60]:<60} {op['calls_per_round']:>8.1f} {op['self_cpu_ms_per_round']:>12.2f} "
                  f"{op['cpu_total_ms_per_round']:>13.2f} {op['self_device_ms_per_round']:>12.2f}")
    print(f"\nhost syncs per round: {result['host_syncs_per_round']} (scalar reads "
          f"{result['scalar_reads_per_round']}; {'with' if result['cuda'] else 'no'} device -> host copies)")
    for kind in ("op", "phase"):
        for name, n in result[f"syncs_by_{kind}_per_round"].items():
            print(f"  {kind} {name:<57} {n:>8.1f}")
    print(f"  {'per optimizer step (learner, AdamW apart)':<60} {result['syncs_per_optimizer_step'] or 0:>8.1f}")
    print("\nseconds per phase (mean of the profiled rounds; warm-up round in brackets)")
    for key in PHASES:
        print(f"  {key:<12} {result['phases'][key]:>9.4f}  [{result['warmup_phases'][key]:.4f}]")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory(prefix="profile-round-") as run_dir:
        started = time.perf_counter()
        node = build_node(args, Path(run_dir))
        build_s = time.perf_counter() - started
        label_calls(node)
        try:
            cuda = torch.cuda.is_available() and node.learner.device.type == "cuda"
            warmup = node.run_round(0)
            rows, syncs, totals = profile_rounds(node, args.rounds, 1, cuda)
            result = summarize(args, node, warmup, rows, syncs, totals, cuda, build_s)
        finally:
            node.close()
    print_report(result)
    if args.json is not None:
        write_json(args.json, result, indent=2, newline=True)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
