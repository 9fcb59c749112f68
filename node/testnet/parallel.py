"""`swarm-node testnet --workers K` (memory transport): the plan's runs, one per mix and seed, in K
processes at once. Each run is one process on one thread: the tiny model gains little from a
second thread, a second run at once nearly doubles the throughput. The live table then has one row
per run, read from the tail of its nodes' metrics files (node/testnet/dashboard.py)."""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from statistics import mean

from rich.console import Console

from node.observe.metrics import METRICS_FILE
from node.testnet.dashboard import Dashboard
from node.testnet.plan import Plan

POLL_S = 1.0
TAIL_BYTES = 16384  # a metrics row is ~2 KB: the last complete one is in the file's last 16 KB


def run_in_worker(plan: Plan, mix: tuple[int, int], seed: int, run_dir: Path, budget_s: float | None) -> dict:
    """One memory testnet run in a worker process; its result as the sequential runner gets it."""
    import torch  # in the worker process: the parent that coordinates never loads torch

    from node.testnet.memory import MemoryTestnet

    torch.set_num_threads(1)
    return MemoryTestnet(plan, mix, seed, run_dir, None, budget_s=budget_s).run()


def last_row(path: Path) -> dict | None:
    """The last complete metrics row of a file another process is appending to (None: none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:  # the line being written, or the cut-off first one
            continue
    return None


def progress_row(name: str, run_dir: Path, state: str, result: dict | None) -> dict:
    """One run's row of the live table: mean round, recent reward and peer groups used over its nodes,
    and at the end its mean held-out pass@1."""
    rows = [row for path in sorted(run_dir.glob(f"node*/{METRICS_FILE}")) if (row := last_row(path))]
    out = {"node": name, "state": state}
    if rows:
        out["round"] = round(mean(r["round"] for r in rows))
        out["reward"] = mean(r.get("reward_mean") or 0.0 for r in rows)
        out["ext_used"] = sum(r.get("external_used") or 0 for r in rows)
    if result is not None:
        evals = [node["evals"][-1]["heldout_pass1"] for node in result["nodes"] if node.get("evals")]
        out["heldout"] = mean(evals) if evals else None
    return out


def run_parallel(plan: Plan, runs: list[tuple[str, tuple[int, int], int, Path]], budget_s: float | None,
                 workers: int, console: Console, quiet: bool) -> list[dict]:
    """Every run of `runs` (name, mix, seed, run dir), `workers` at a time; their results in order."""
    results: dict[str, dict] = {}
    title = f"testnet: {len(runs)} runs of {plan.nodes} nodes, {workers} at a time (memory)"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool, \
            Dashboard(title, console=console, quiet=quiet) as dashboard:
        futures: dict[Future, str] = {pool.submit(run_in_worker, plan, mix, seed, run_dir, budget_s): name
                                      for name, mix, seed, run_dir in runs}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in finished:
                results[futures[future]] = future.result()  # a failed run raises here, as it would in sequence
            running = {futures[f] for f in pending if f.running()}
            dashboard.update([progress_row(name, run_dir, "done" if name in results else
                                           "running" if name in running else "waiting", results.get(name))
                              for name, _, _, run_dir in runs])
    return [results[name] for name, _, _, _ in runs]
