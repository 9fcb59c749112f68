"""`swarm-node config --env`: the configuration as an environment file, for systemd's
EnvironmentFile= and `docker run --env-file` (scripts/deploy/swarm-node.env.example is its output).

Every key is one `SWARM_NODE_<SECTION>__<KEY>=value` line (node/config/schema.py reads them), commented out
where it holds the preset's value, with its description above it; the keys an operator sets are
first. Values are written so that systemd and docker read them alike: unquoted (systemd strips
quotes that docker keeps), no backslashes (systemd unescapes them), TOML inside (node/config/schema.py
parses values as TOML). A None is an empty value, which node/config/schema.py reads as "not set".
"""
from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from pydantic import BaseModel

from node.config.schema import ENV_PREFIX, NON_CONFIG_ENV, ConfigError, explain, parse_value

# What an operator running a node as a service decides, with what the key's description leaves out.
OPERATOR_KEYS = {
    "swarm.peers": "At least one peer of the swarm, as its start-up line or `swarm-node status` prints it; a "
                   "restarted node also redials the peers it met (<run_dir>/peers.json)",
    "swarm.name": "The same on every node of one swarm",
    "swarm.listen": "Pin the port to open in the firewall (or forward), e.g. [\"/ip4/0.0.0.0/tcp/4001\"]; "
                    "several nodes on one host need one port each",
    "swarm.identity": "The unit keeps it in its run dir, /var/lib/swarm-node/<instance>/identity.key "
                      "(docker: /data/identity.key); back it up, never share it",
    "run.rounds": "The node exits (status 0: no restart) once it has trained this many rounds in all; set it "
                  "high to run for days",
}
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
WIDTH = 110


def env_name(key: str) -> str:
    """'swarm.external_per_round' -> 'SWARM_NODE_SWARM__EXTERNAL_PER_ROUND'."""
    return ENV_PREFIX + key.replace(".", "__").upper()


def toml_value(value: Any) -> str:
    """A TOML value on one line (inline tables and arrays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = (k if BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False) for k in value)
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in zip(keys, value.values())) + "}"
    raise ValueError(f"{value!r} has no TOML form")


def env_value(key: str, value: Any) -> str:
    """The text after `NAME=`: a string bare (read back as a string), anything else as TOML."""
    if value is None:
        return ""
    text = value if isinstance(value, str) and parse_value(value) == value else toml_value(value)
    if isinstance(value, str) and (text != value or not value) or "\\" in text or "\n" in text or text != text.strip() \
            or text[:1] in ("'", '"'):
        raise ConfigError(f"{key} = {value!r} cannot be written as an environment value that systemd and "
                          "docker read alike: set it in a TOML file (--config) instead")
    return text


def _comment(text: str, indent: str = "# ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def _key_lines(key: str, value: Any, default: Any, description: str, note: str = "") -> list[str]:
    lines = _comment(f"{key}: {description}" + (f". {note}" if note else ""))
    assignment = f"{env_name(key)}={env_value(key, value)}"
    return lines + [assignment if value != default else f"# {assignment}"]


def _values(cfg: BaseModel) -> dict[str, tuple[Any, str]]:
    """dotted key -> (JSON-ready value, description), in the schema's order."""
    dumped = cfg.model_dump(mode="json")
    out = {}
    for key, _, description in explain(cfg):
        value = dumped
        for part in key.split("."):
            value = value[part]
        out[key] = (value, description)
    return out


def render_env_file(cfg: BaseModel, defaults: BaseModel, preset: str) -> str:
    """The environment file of `cfg`; lines equal to `defaults` (the preset alone) are commented out."""
    values, base = _values(cfg), _values(defaults)
    preset_line = f"SWARM_NODE_PRESET={preset}"
    out = [*_comment(f"swarm-node environment file, made by `swarm-node config --env --preset {preset}`: every "
                     "configuration key as SWARM_NODE_<SECTION>__<KEY>=value, for systemd (EnvironmentFile= in "
                     "scripts/deploy/swarm-node@.service) and `docker run --env-file`. Values are read like --set "
                     "values (TOML: numbers, true/false, [\"lists\"], {tables}; anything else is a string); KEY= "
                     "(empty) is not set. Each key is commented out at the preset's value: uncomment and change "
                     "the ones you need. The run dir (checkpoints, metrics.jsonl, node.json, peers.json, the "
                     "identity key) is not a key: the unit passes --run-dir /var/lib/swarm-node/<instance>, the "
                     "docker image /data."),
           "", *_comment(f"SWARM_NODE_PRESET (not a config key): {NON_CONFIG_ENV['SWARM_NODE_PRESET']}; "
                         "the values below are this preset's"),
           preset_line if preset != "tiny" else f"# {preset_line}",
           "", "# ==== set these " + "=" * (WIDTH - 17)]
    for key, note in OPERATOR_KEYS.items():
        out += _key_lines(key, values[key][0], base[key][0], values[key][1], note)
    section = None
    for key, (value, description) in values.items():
        if key in OPERATOR_KEYS:
            continue
        if key.split(".")[0] != section:
            section = key.split(".")[0]
            out += ["", f"# ==== [{section}] " + "=" * (WIDTH - 10 - len(section))]
        out += _key_lines(key, value, base[key][0], description)
    out += ["", "# ==== not config keys " + "=" * (WIDTH - 23)]
    for name, description in NON_CONFIG_ENV.items():
        if name != "SWARM_NODE_PRESET":
            out += _comment(f"{name} (not a config key): {description}")
    return "\n".join(out) + "\n"
