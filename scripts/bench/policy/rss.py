"""Peak memory of our round ALONE: a fresh process that builds one node and runs rounds, nothing
else (scripts/bench/policy/bench.py runs it once per backend, after its own measurements).

    .venv/bin/python -m scripts.bench.policy.rss --backend hf --rounds 2 -- <config overrides...>

Prints one JSON line: the trainer process's peak RSS (VmHWM, MiB) and, for the vLLM backend,
the peak RSS of every process of the inference server (VmHWM, summed: an upper bound, since each
process peaks at its own moment), plus the seconds of each round and weight refresh.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import arg_parser


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__spec__, __doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--force-length", action="store_true", help="every completion max_new_tokens long")
    parser.add_argument("overrides", nargs="*", help="config overrides (as --set)")
    args = parser.parse_args(argv)

    from node.config.schema import load_config
    from node.train.loop import Node
    from scripts.bench.policy.generation import make_our_generator

    cfg = load_config(args.model, None, [*args.overrides, "sampling.backend=\"hf\""])
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as run_dir:
        node = Node(cfg, Path(run_dir))
        copy = getattr(node.generator, "sampling_copy", None)  # the node's own, at sampling.precision
        generator = make_our_generator(node.policy, args.backend, args.force_length, cfg.sampling.max_new_tokens,
                                       copy.precision if copy is not None else "fp32", sampling_copy=copy)
        node.use_generator(generator)
        rounds = []
        for k in range(args.rounds):
            t0 = time.perf_counter()
            node.run_round(k)
            rounds.append(time.perf_counter() - t0)
        server = 0.0
        if args.backend == "vllm":
            server = sum(peak_rss_mib(pid) for pid in process_tree(generator.process.pid))
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork + exec, so a child of a large process
        # (scripts/bench/policy/bench.py, holding TRL's model) would report its parent's size
        trainer = peak_rss_mib(os.getpid())
        # no copy: the learner's own weights sample, at the model's dtype
        sampler = copy.precision if copy is not None else f"learner {cfg.model.dtype}"
        print(json.dumps({"backend": args.backend, "precision": sampler,
                          "objective": node.objective.spec, "trainer_peak_rss_mib": trainer, "server_peak_rss_mib": server,
                          "total_peak_rss_mib": trainer + server, "round_seconds": rounds,
                          "refresh_seconds": getattr(generator, "refresh_seconds", [])}))
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
