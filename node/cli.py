"""`swarm-node`: the command line.

    swarm-node train  [--preset tiny|smollm2] [--config FILE] [--set key=value ...] [--resume]
    swarm-node report RUN_DIR
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

console = Console(stderr=True)


def cmd_train(args: argparse.Namespace) -> int:
    from node.config import load_config

    overrides = list(args.set or [])
    if args.rounds is not None:
        overrides.append(f"run.rounds={args.rounds}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    cfg = load_config(args.preset, args.config, overrides)

    from node.loop import Node  # heavy imports (torch, transformers) only once the config is valid
    from node.metrics import RoundTable

    run_dir = Path(args.run_dir)
    if not args.resume and (run_dir / "checkpoints").exists():
        console.print(f"[red]{run_dir} already holds checkpoints[/]: pass --resume to continue that run, "
                      "or choose another --run-dir.")
        return 2
    node = Node(cfg, run_dir)
    if args.resume:
        resumed = node.resume()
        console.print(f"resumed from round {resumed}" if resumed is not None
                      else f"no checkpoint in {run_dir}: starting at round 0")
    console.print(f"training {cfg.model.name} on {cfg.tasks.source}:{','.join(cfg.tasks.datasets)} "
                  f"with {cfg.loss.name} for {cfg.run.rounds} rounds -> {run_dir}")
    table = RoundTable(f"swarm-node train ({cfg.model.name})", console=console, quiet=args.quiet)
    node.run(cfg.run.rounds, table)
    from node.report import summarize, summary_text
    from node.metrics import read_metrics

    console.print(summary_text(summarize(read_metrics(run_dir))), highlight=False)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from node.report import write_report

    png, txt, text = write_report(Path(args.run_dir))
    console.print(text, highlight=False)
    console.print(f"wrote {png} and {txt}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarm-node", description="Decentralized RL post-training node.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one node locally (no network)")
    train.add_argument("--preset", choices=["smollm2", "tiny"], default="tiny")
    train.add_argument("--config", help="TOML file with overrides of the preset")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. optim.lr=3e-4")
    train.add_argument("--rounds", type=int, help="total rounds (shorthand for --set run.rounds=N)")
    train.add_argument("--seed", type=int, help="run seed (shorthand for --set run.seed=N)")
    train.add_argument("--run-dir", default="runs/latest", help="where metrics and checkpoints go")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --run-dir")
    train.add_argument("--quiet", action="store_true", help="no per-round output")
    train.set_defaults(func=cmd_train)

    report = sub.add_parser("report", help="plot a run's metrics (PNG) and print a summary")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message already says what is wrong and what to do: no traceback for these."""
    from node.config import ConfigError
    from node.tasks.base import UnknownDatasetError, UnknownTaskError
    from policy.models import ModelNotFoundError

    return ConfigError, FileNotFoundError, ModelNotFoundError, UnknownDatasetError, UnknownTaskError


def main(argv: list[str] | None = None) -> int:
    if argv is None and os.environ.get("PYTHONHASHSEED") != "0":
        # Some reasoning-gym generators depend on Python's hash seed; peers must rebuild identical
        # tasks, so every node runs with hash seed 0 (re-exec once, before anything is loaded).
        os.execve(sys.executable, [sys.executable, "-m", "node.cli", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except _user_errors() as err:
        console.print(f"[red]error:[/] {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
