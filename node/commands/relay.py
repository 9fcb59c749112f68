"""`swarm-node relay`: its arguments and the command; the relay it runs is node/service/relay.py's."""
from __future__ import annotations

import argparse
from pathlib import Path

from node.commands.common import add_config_options, load_command_config, network_overrides
from node.service.console import console


def add_parser(sub, presets: list[str]) -> None:
    relay = sub.add_parser("relay", help="run a bootstrap peer and circuit relay for nodes behind NAT (no model)")
    add_config_options(relay, "runs/relay", presets)
    relay.add_argument("--peers", nargs="*", metavar="MULTIADDR", help="other bootstrap peers or relays to dial")
    relay.add_argument("--listen", action="append", metavar="MULTIADDR",
                       help="listen address; pin a port others can reach, e.g. /ip4/0.0.0.0/tcp/4001")
    relay.add_argument("--identity", help="node key file (default <run-dir>/identity.key, created if missing)")
    relay.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_command_config(args, network_overrides(args))
    from node.service.relay import relay  # a transport: once the config is valid

    return relay(cfg, Path(args.run_dir), console, quiet=args.quiet)
