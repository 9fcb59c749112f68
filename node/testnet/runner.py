"""`swarm-node testnet`: run the plan once per configuration and seed, then write the report."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from node.testnet.dashboard import Dashboard
from node.testnet.plan import Plan
from node.testnet.report import write_report


def run_testnet(plan: Plan, command: str, console: Console, quiet: bool = False) -> int:
    plan.validate()
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    plan_json = {**asdict(plan), "out": str(plan.out)}
    runs: list[dict] = []
    for seed in range(plan.seeds):
        for mix in plan.mixes:
            name = f"mix{mix[0]}-{mix[1]}-seed{seed}"
            run_dir = out / name
            shutil.rmtree(run_dir, ignore_errors=True)  # a re-run of the plan starts every node afresh
            title = f"testnet {name} ({plan.nodes} nodes, {plan.transport})"
            console.print(f"[bold]{title}[/]: node run dirs under {run_dir}", highlight=False, soft_wrap=True)
            with Dashboard(title, console=console, quiet=quiet) as dashboard:
                if plan.transport == "memory":
                    from node.testnet.memory import MemoryTestnet

                    result = MemoryTestnet(plan, mix, seed, run_dir, dashboard).run()
                else:
                    from node.testnet.process import ProcessTestnet

                    result = ProcessTestnet(plan, mix, seed, run_dir, dashboard).run()
            runs.append(result)
            (out / "runs.json").write_text(json.dumps(runs, indent=1, default=str))  # survives a later crash
    json_path, png, text = write_report(out, plan_json, command, runs)
    console.print(text, highlight=False, soft_wrap=True)
    console.print(f"wrote {json_path}, {out / 'summary.txt'} and {png}")
    return 0
