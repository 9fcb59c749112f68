"""`swarm-node`: the command line, a dispatcher; each verb is one module of node/commands/.

    swarm-node train  [--preset tiny|smollm2] [--config FILE] [--set key=value ...] [--resume]
    swarm-node join   [--peers MULTIADDR ...] [--listen MULTIADDR] [--swarm NAME] [--mix I/J] [...]
    swarm-node relay  [--peers MULTIADDR ...] [--listen MULTIADDR]   (bootstrap + relay, no model)
    swarm-node keygen [--out FILE]      (default ~/.config/swarm-node/identity.key)
    swarm-node status [--run-dir DIR | --control HOST:PORT]
    swarm-node report RUN_DIR
    swarm-node config [--preset ...] [--set ...] [--explain | --env]
    swarm-node eval   RUN_DIR [--tasks N] [--k K]
    swarm-node peers  [--run-dir DIR] [--ban KEY | --unban KEY | --demote KEY]
    swarm-node testnet [--nodes N] [--rounds R] [--compare 8/0,4/4] [--seeds K] [--hostile K:KIND] [...]

Each command imports what it needs inside its `run` (the reason beside each), so `--help`, `status`
and `config` never pay for torch, transformers or a transport.
"""
from __future__ import annotations

import argparse
import logging
import sys

from node.commands import config, eval, join, keygen, peers, relay, report, status, testnet, train
from node.observe.logs import configure as configure_logs, json_lines
from node.service.console import allow_reexec, console

# in the order `swarm-node --help` lists them
COMMANDS = (train, join, relay, keygen, status, config, report, eval, peers, testnet)


def build_parser() -> argparse.ArgumentParser:
    from node.config.presets import PRESETS  # names only: the config's schema loads after parsing

    parser = argparse.ArgumentParser(prog="swarm-node", description="Decentralized RL post-training node.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub, list(PRESETS))
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message already says what is wrong and what to do: no traceback for these."""
    from node.config.schema import ConfigError
    from node.tasks.base import UnknownDatasetError, UnknownTaskError
    from policy.settings import ModelNotFoundError  # not policy.models: a config error needs no torch

    from protocol import IdentityError

    return (ConfigError, FileNotFoundError, ModelNotFoundError, UnknownDatasetError, UnknownTaskError,
            IdentityError, ConnectionError)


def _report(err: Exception) -> int:
    if json_lines():
        logging.getLogger("node.cli").error(str(err), extra={"event": "error", "error": type(err).__name__})
    else:
        console.print(f"[red]error:[/] {err}", soft_wrap=True, highlight=False)
    return 2


def main(argv: list[str] | None = None) -> int:
    allow_reexec(argv is None)
    args = build_parser().parse_args(argv)
    configure_logs()  # defaults until a command has its config (run.log_level, run.log_format)
    try:
        return args.func(args)
    except (FileNotFoundError, ConnectionError) as err:  # first: a failing `status` (health check) skips torch
        return _report(err)
    except _user_errors() as err:
        return _report(err)
    except KeyboardInterrupt:  # a second stop signal (node/service/shutdown.py), or Ctrl-C while starting
        console.print("[red]stopped at once[/]: rounds since the last checkpoint are lost")
        return 130


if __name__ == "__main__":
    sys.exit(main())
