"""Shared by the deployment tests: environment files read as systemd and docker read them."""
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "scripts" / "deploy" / "swarm-node.env.example"
COMMENTED_ASSIGNMENT = re.compile(r"^# (SWARM_NODE_[A-Z0-9_]+=.*)$")


def read_env_file(text: str, uncomment: bool = False) -> dict[str, str]:
    """NAME=value lines as systemd's EnvironmentFile= and `docker --env-file` read the values the
    renderer writes (unquoted, no backslashes); `uncomment`: also the commented-out assignments."""
    env = {}
    for line in text.splitlines():
        match = COMMENTED_ASSIGNMENT.match(line) if uncomment else None
        line = match.group(1) if match else line
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and name not in env, f"bad or repeated line {line!r}"
        env[name] = value.strip()
    return env


def clean_environ() -> dict[str, str]:
    """This process's environment without SWARM_NODE_* variables (a developer's own settings)."""
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("SWARM_NODE_")}
