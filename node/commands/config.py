"""`swarm-node config`: the resolved configuration, --explain: what each knob does, --env: an environment file."""
from __future__ import annotations

import argparse
import json

from node.commands.common import add_config_options, load_command_config, resolve_preset


def add_parser(sub, presets: list[str]) -> None:
    config = sub.add_parser("config", help="print the resolved configuration (--explain: what each knob does)")
    add_config_options(config, "runs/latest", presets)
    config.add_argument("--explain", action="store_true", help="describe every knob next to its value")
    config.add_argument("--env", action="store_true", help="print an environment file (systemd EnvironmentFile=, "
                        "docker --env-file): every key as SWARM_NODE_<SECTION>__<KEY>, commented out at the "
                        "preset's value unless set otherwise, with what it does")
    config.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The resolved configuration, one `section.key = value` line per knob (TOML values);
    --explain adds what each knob does."""
    from node.config.schema import explain  # after parsing: --help never loads the schema

    cfg = load_command_config(args)
    if args.env:
        from node.config.schema import load_config  # --env's writer, no other command's
        from node.config.env_file import render_env_file

        preset = resolve_preset(args)
        print(render_env_file(cfg, load_config(preset), preset), end="")
        return 0
    for key, value, description in explain(cfg):
        shown = json.dumps(value, default=str) if not isinstance(value, str) else json.dumps(value)
        line = f"{key} = {shown}"
        print(f"{line:<48} # {description}" if args.explain and description else line)
    return 0
