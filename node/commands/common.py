"""What the verbs that build a node's configuration share: the config options, the preset choice, the
network options of `join` and `relay` as overrides, and loading the config they describe."""
from __future__ import annotations

import argparse
import os

from node.observe.logs import configure as configure_logs


def add_config_options(p: argparse.ArgumentParser, run_dir: str, presets: list[str]) -> None:
    """The options of the commands that build a node's configuration (train, join, relay, config)."""
    p.add_argument("--preset", choices=presets, help="default: $SWARM_NODE_PRESET, else tiny")
    p.add_argument("--config", help="TOML file with overrides of the preset")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. optim.lr=3e-4")
    p.add_argument("--rounds", type=int, help="total rounds (shorthand for --set run.rounds=N)")
    p.add_argument("--seed", type=int, help="run seed (shorthand for --set run.seed=N)")
    p.add_argument("--run-dir", default=run_dir, help="where metrics and checkpoints go")
    p.add_argument("--quiet", action="store_true", help="no per-round output")


def resolve_preset(args: argparse.Namespace) -> str:
    """--preset, else $SWARM_NODE_PRESET (a service's environment file picks it), else tiny."""
    from node.config.schema import ConfigError  # the schema (pydantic) loads after parsing: --help never does
    from node.config.presets import PRESETS

    if args.preset:
        return args.preset
    name = os.environ.get("SWARM_NODE_PRESET", "").strip() or "tiny"
    if name not in PRESETS:
        raise ConfigError(f"SWARM_NODE_PRESET={name!r} is not a preset: valid presets are {', '.join(PRESETS)}; "
                          "fix or unset it")
    return name


def load_command_config(args: argparse.Namespace, extra: list[str] = ()):
    """The config the options describe (preset < file < environment < --set < the verb's `extra`);
    the process's logs configured from it."""
    from node.config.schema import load_config  # after parsing: --help never loads the schema

    overrides = list(args.set or [])
    if args.rounds is not None:
        overrides.append(f"run.rounds={args.rounds}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    # the environment sits between the config file and --set
    # (docs/configuration.md: "Configuration is typed ... later wins")
    cfg = load_config(resolve_preset(args), args.config, [*overrides, *extra], environ=os.environ)
    configure_logs(cfg.run.log_level, cfg.run.log_format)
    return cfg


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def network_overrides(args: argparse.Namespace) -> list[str]:
    """--peers, --listen, --swarm and --identity of `join` and `relay` as config overrides."""
    extra = []
    if args.peers:
        extra.append(f"swarm.peers={toml_list(args.peers)}")
    if args.listen:
        extra.append(f"swarm.listen={toml_list(args.listen)}")
    if getattr(args, "swarm", None):  # relay has no gossip topic, so no --swarm
        extra.append(f"swarm.name={args.swarm}")
    if args.identity:
        extra.append(f"swarm.identity={args.identity}")
    return extra
