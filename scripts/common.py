"""What the scripts share: the repository root, their default output folders under runs/, their
argument parser and recorded command line (both name the `python -m` invocation), writing a result
as JSON next to its PNG, a console for tables, matplotlib without a display, and the machine's load.

Every script runs as a module from the repository root (`.venv/bin/python -m scripts.<package>.<name>`),
so `scripts`, `node`, `policy` and `protocol` import as they are, with no import path set by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
PYTHON = ".venv/bin/python"


def runs_dir(name: str) -> Path:
    """A script's default output folder: runs/<name> under the repository root."""
    return RUNS / name


def invocation(spec: ModuleSpec | None) -> str:
    """How the module of `spec` (a script's `__spec__`) is run: `python -m scripts.x.y`."""
    return f"python -m {spec.name if spec is not None else 'scripts'}"


def arg_parser(spec: ModuleSpec | None, doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A script's parser: its usage line shows the `python -m` invocation, its help the docstring as written."""
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(prog=invocation(spec), description=doc, **kwargs)


def command_line(spec: ModuleSpec | None, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run (recorded in the result JSON)."""
    return " ".join([invocation(spec), *(argv if argv is not None else sys.argv[1:])])


def write_json(path: Path, data: Any, indent: int = 1, newline: bool = False, default: Any = None) -> Path:
    """`data` as JSON at `path` (its folder made), through a temporary file so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=default) + ("\n" if newline else ""))
    tmp.replace(path)
    return path


def write_result(out: Path, stem: str, result: Any, plot: Callable[[Any, Path], None],
                 indent: int = 1, newline: bool = False) -> tuple[Path, Path]:
    """<out>/<stem>.json first (the figures survive a plotting error), then <out>/<stem>.png drawn by `plot`."""
    json_path, png_path = Path(out) / f"{stem}.json", Path(out) / f"{stem}.png"
    write_json(json_path, result, indent=indent, newline=newline)
    plot(result, png_path)
    return json_path, png_path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def console(width: int = 160, record: bool = False):
    """A rich console: the terminal's width on a terminal, else `width` columns (logs: no wrapping)."""
    from rich.console import Console

    return Console(record=record) if sys.stdout.isatty() else Console(width=width, record=record)


def load_average() -> str:
    """1-minute load average: above the core count, other processes compete for the CPUs."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def uptime() -> str:
    """`uptime`'s load averages (1, 5, 15 min): how busy the machine was around a measurement."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_saved_jobs(jobs: list[dict], workers: int, run: Callable[[dict], Any]) -> list[dict]:
    """Every job's figures: `run(job)` saves them as JSON at job["path"]; a job whose file exists is not
    run again (a long experiment survives being stopped). workers == 1 runs in this process (no start-up
    per run); more run in spawned processes, `run` being a module-level function."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    todo = [job for job in jobs if not Path(job["path"]).exists()]
    for job in todo:
        Path(job["path"]).parent.mkdir(parents=True, exist_ok=True)
    if todo:
        print(f"running {len(todo)} of {len(jobs)} runs on {workers} worker(s)", flush=True)
    if workers == 1:
        for job in todo:
            run(job)
            print(f"  done {job['label']}", flush=True)
    elif todo:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for job, _ in zip(todo, pool.map(run, todo)):
                print(f"  done {job['label']}", flush=True)
    return [json.loads(Path(job["path"]).read_text()) for job in jobs]
