"""`swarm-node testnet`: run the plan once per configuration and seed, then write the report."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from node.config.schema import ConfigError
from node.observe.address import parse_listen
from node.observe.server import ObserveServer
from node.observe.testnet import TestnetPage
from node.observe.web import announce, page_routes
from node.testnet.dashboard import Dashboard
from node.testnet.plan import Plan
from node.testnet.report import write_report


# plan fields a resumed sweep may change (which runs it holds); every other field must match
SWEEP_FIELDS = ("mixes", "seeds", "out")


def finished_runs(out: Path, plan_json: dict) -> list[dict]:
    """The runs an earlier invocation of the same plan finished (runs.json), for --resume."""
    old_plan = out / "plan.json"
    if not (out / "runs.json").is_file() or not old_plan.is_file():
        return []
    old = json.loads(old_plan.read_text())
    default = json.loads(json.dumps(asdict(Plan()), default=str))  # a field added since then had its default
    now = json.loads(json.dumps(plan_json, default=str))
    changed = [f"{key} ({old.get(key, default[key])!r} then, {value!r} now)" for key, value in now.items()
               if key not in SWEEP_FIELDS and old.get(key, default[key]) != value]
    if changed:
        raise ConfigError(f"--resume: the runs in {out} were made with another plan: {'; '.join(changed)}. "
                         "Use another --out, or run without --resume to start over")
    return json.loads((out / "runs.json").read_text())


def run_testnet(plan: Plan, command: str, console: Console, quiet: bool = False, resume: bool = False,
                page_listen: str = "127.0.0.1:0", workers: int = 1) -> int:
    """`page_listen`: HOST:PORT of the testnet's live page (every node's curves); empty = none.
    `workers` > 1 (memory transport): that many runs at once (node/testnet/parallel.py)."""
    plan.validate()
    if workers > 1 and plan.transport != "memory":
        raise ConfigError(f"--workers {workers} runs memory testnets in parallel; with --transport {plan.transport} "
                          "every node is already its own process: leave --workers at 1")
    page = TestnetPage()
    server = ObserveServer(page_listen, page_routes(page.state)).start() if parse_listen(page_listen) else None
    announce(server, console, "live testnet page")
    try:
        return _run_plan(plan, command, console, quiet, resume, page, workers)
    finally:
        if server is not None:
            server.stop()


def _run_plan(plan: Plan, command: str, console: Console, quiet: bool, resume: bool, page: TestnetPage,
              workers: int) -> int:
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    plan_json = {**asdict(plan), "out": str(plan.out)}
    done = {(r["mix"], r["seed"]): r for r in finished_runs(out, plan_json)} if resume else {}
    (out / "plan.json").write_text(json.dumps(plan_json, indent=1, default=str))
    runs: list[dict] = []
    # compute clock without --budget: the first run (first mix, seed 0) runs until its fast nodes have
    # done --rounds rounds; the virtual time that took is every later run's budget
    budget_s = plan.budget_s or next((r["budget_s"] for r in done.values() if r.get("budget_s")), None)
    parallel: list[tuple[str, tuple[int, int], int, Path]] = []
    for seed in range(plan.seeds):
        for mix in plan.mixes:
            name = f"mix{mix[0]}-{mix[1]}-seed{seed}"
            run_dir = out / name
            if (f"{mix[0]}/{mix[1]}", seed) in done and run_dir.is_dir():
                console.print(f"[bold]testnet {name}[/]: finished earlier, kept (--resume)", highlight=False)
                runs.append(done[(f"{mix[0]}/{mix[1]}", seed)])
                continue
            shutil.rmtree(run_dir, ignore_errors=True)  # a re-run of the plan starts every node afresh
            if workers > 1 and (budget_s is not None or plan.clock != "compute"):
                parallel.append((name, mix, seed, run_dir))  # the budget is known: run it beside the others
                continue
            title = f"testnet {name} ({plan.nodes} nodes, {plan.transport})"
            console.print(f"[bold]{title}[/]: node run dirs under {run_dir}", highlight=False, soft_wrap=True)
            page.begin_run(title, run_dir, [run_dir / f"node{i}" for i in range(plan.nodes)])
            with Dashboard(title, console=console, quiet=quiet, page=page) as dashboard:
                if plan.transport == "memory":
                    from node.testnet.memory import MemoryTestnet  # torch: only the memory testnet's

                    result = MemoryTestnet(plan, mix, seed, run_dir, dashboard, budget_s=budget_s).run()
                    budget_s = result.get("budget_s", budget_s)
                else:
                    from node.testnet.process import ProcessTestnet  # the join processes' harness: only its own

                    result = ProcessTestnet(plan, mix, seed, run_dir, dashboard).run()
            runs.append(result)
            (out / "runs.json").write_text(json.dumps(runs, indent=1, default=str))  # survives a later crash
    if parallel:
        from node.testnet.parallel import run_parallel  # worker processes: only with --parallel

        console.print(f"[bold]testnet[/]: {len(parallel)} runs, {workers} at a time: node run dirs under {out}",
                      highlight=False, soft_wrap=True)
        runs += run_parallel(plan, parallel, budget_s, workers, console, quiet)
        mixes = [f"{i}/{j}" for i, j in plan.mixes]
        runs.sort(key=lambda run: (run["seed"], mixes.index(run["mix"])))  # the plan's order, as run in sequence
        (out / "runs.json").write_text(json.dumps(runs, indent=1, default=str))
    json_path, png, text = write_report(out, plan_json, command, runs)
    console.print(text, highlight=False, soft_wrap=True)
    console.print(f"wrote {json_path}, {out / 'summary.txt'} and {png}")
    return 0
