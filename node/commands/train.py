"""`swarm-node train`: one node trains locally, without peers (the self-replay silo with swarm.self_replay)."""
from __future__ import annotations

import argparse
from pathlib import Path

from node.commands.common import add_config_options, load_command_config
from node.observe.logs import json_lines, say
from node.service.console import console, pin_hash_seed_if_needed


def add_parser(sub, presets: list[str]) -> None:
    train = sub.add_parser("train", help="train one node locally (no network)")
    add_config_options(train, "runs/latest", presets)
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --run-dir")
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_command_config(args)
    pin_hash_seed_if_needed(cfg)

    from node.config.schema import ConfigError
    from node.service.assembly import assemble_node  # heavy imports (torch, transformers) only once the config is valid
    from node.observe.metrics import RoundTable
    from node.observe.state import NodeObserver, loop_progress
    from node.observe.web import announce, serve_node
    from node.service.shutdown import StopOnSignals

    run_dir = Path(args.run_dir)
    if not args.resume and (run_dir / "checkpoints").exists():
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or choose another --run-dir.")
    node = assemble_node(cfg, run_dir)
    if args.resume:
        node.resume()  # logs where it resumed (event "resume")
    say(console, f"training {cfg.model.name} on {cfg.tasks.source}:{','.join(cfg.tasks.datasets)} "
                 f"with {cfg.loss.name} for {cfg.run.rounds} rounds -> {run_dir}", "start", command="train",
        model=cfg.model.name, loss=cfg.loss.name, rounds=cfg.run.rounds, run_dir=str(run_dir),
        next_round=node.next_round)
    say(console, f"rollouts: {node.backend_line}", "backend")
    title = f"swarm-node train ({cfg.model.name})"
    table = RoundTable(title, console=console, quiet=args.quiet, log_rounds=json_lines())
    observe = serve_node(cfg.swarm.metrics_listen, NodeObserver(run_dir, title, {}, loop_progress(node)))
    announce(observe, console, "metrics (/metrics) and live page")
    try:
        with StopOnSignals() as stop:  # Ctrl-C / SIGTERM: finish the round and checkpoint it
            node.run(cfg.run.rounds, table, stop)
    finally:
        if observe is not None:
            observe.stop()
        node.close()
    from node.observe.report import summarize, summary_text  # the end-of-run summary's alone
    from node.observe.metrics import read_metrics

    summary = summarize(read_metrics(run_dir))
    say(console, summary_text(summary).rstrip(), "summary", **summary)
    return 0
