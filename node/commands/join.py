"""`swarm-node join`: its arguments and the command; the node it runs is node/service/join.py's."""
from __future__ import annotations

import argparse
from pathlib import Path

from node.commands.common import add_config_options, load_command_config, network_overrides
from node.service.console import console, pin_hash_seed_if_needed


def add_parser(sub, presets: list[str]) -> None:
    join = sub.add_parser("join", help="join a swarm: train and share verified rollouts over libp2p")
    add_config_options(join, "runs/node", presets)
    join.add_argument("--peers", nargs="*", metavar="MULTIADDR", help="bootstrap peers (/ip4/.../tcp/.../p2p/<id>)")
    join.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen address (default /ip4/0.0.0.0/tcp/0: a free port, printed at start)")
    join.add_argument("--swarm", help="swarm name (gossip topic namespace)")
    join.add_argument("--identity", help="node key file (default <run-dir>/identity.key, created if missing)")
    join.add_argument("--mix", metavar="I/J", help="SAPO mix: I local + J external groups per update, e.g. 4/4")
    join.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from node.config.schema import ConfigError  # after parsing: --help never loads the schema

    extra = network_overrides(args)
    if args.mix:
        local, sep, external = args.mix.partition("/")
        if not (sep and local.isdigit() and external.isdigit() and int(local) > 0):
            raise ConfigError(f"--mix expects I/J with I >= 1 local and J >= 0 external groups (e.g. 4/4), got {args.mix!r}")
        extra += [f"tasks.prompts_per_round={local}", f"swarm.external_per_round={external}"]
    cfg = load_command_config(args, extra)
    pin_hash_seed_if_needed(cfg)
    from node.service.join import join  # torch, transformers, a transport: once the config is valid

    return join(cfg, Path(args.run_dir), console, quiet=args.quiet)
