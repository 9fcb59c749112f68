"""`swarm-node report`: plot a run's metrics (PNG) and print a summary (node/observe/report.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from node.service.console import console


def add_parser(sub, presets: list[str]) -> None:
    report = sub.add_parser("report", help="plot a run's metrics (PNG) and print a summary")
    report.add_argument("run_dir")
    report.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from node.observe.report import write_report  # matplotlib: the report's alone

    png, txt, text = write_report(Path(args.run_dir))
    console.print(text, highlight=False)
    console.print(f"wrote {png} and {txt}")
    return 0
