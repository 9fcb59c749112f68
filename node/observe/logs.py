"""Logging of the command line: `run.log_level` and `run.log_format`, set up once per process.

    text: `2026-01-01 12:00:00,000 INFO node.train.loop: checkpoint of round 9 written to ... event=checkpoint round=9`
    json: {"ts": "2026-01-01T12:00:00.000Z", "level": "info", "logger": "node.train.loop", "msg": "...",
           "event": "checkpoint", "round": 9, ...}   (one object per line, on stderr)

Records an operator greps for carry `event` and its fields as `extra` (docs/operating.md "Logs"). Only
swarm-node's own loggers (node, protocol, policy) follow `run.log_level`; other libraries log at
warning and up. Python warnings become records too. The handler writes to whatever sys.stderr is
when a record is emitted, so rich's live table (which redirects stderr) keeps log lines above it.
Stdlib only: it runs before torch is imported.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Iterator

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
OWN_LOGGERS = ("node", "protocol", "policy")
STANDARD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

_state = {"format": "text"}
# the log file of the in-process node whose code runs now (node_log); None: every record to stderr
_node_log: contextvars.ContextVar[Path | None] = contextvars.ContextVar("node_log", default=None)


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on the current sys.stderr (looked up at each record). Inside node_log, only
    warnings and errors: the rest is that node's business, in its own file."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def filter(self, record: logging.LogRecord) -> bool:
        if _node_log.get() is not None and record.levelno < logging.WARNING:
            return False
        return super().filter(record)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def extra_fields(record: logging.LogRecord) -> dict:
    """What the caller passed as `extra` (the structured fields)."""
    return {k: v for k, v in vars(record).items() if k not in STANDARD_FIELDS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        out = {"ts": ts, "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        out.update(extra_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        try:
            return json.dumps(out, default=str, ensure_ascii=False, allow_nan=False)
        except ValueError:  # inf / nan: strict JSON (jq) has no such numbers, so they travel as strings
            return json.dumps(_finite(out), default=str, ensure_ascii=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class TextFormatter(logging.Formatter):
    """Human lines; the structured fields follow as key=value, so grep works on text logs too."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in extra_fields(record).items()
                          if k not in ("stderr_tail",) and v not in (None, "", [], {}))
        if not fields:
            return line
        head, newline, rest = line.partition("\n")  # fields on the message's line, before any traceback
        return f"{head}  {fields}{newline}{rest}"


def _text_value(value) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), default=str)
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() for c in text) else text


class _NodeFileHandler(logging.Handler):
    """Appends each record to the log file of the in-process node that emitted it (node_log)."""

    def emit(self, record: logging.LogRecord) -> None:
        path = _node_log.get()
        if path is None:
            return
        try:
            with path.open("a", encoding="utf-8") as f:
                f.write(self.format(record) + "\n")
        except OSError:
            self.handleError(record)


@contextlib.contextmanager
def node_log(path: Path) -> Iterator[None]:
    """Records emitted inside go to `path` (appended), warnings and errors to stderr as well: many
    nodes in one process (the in-process testnet) keep their checkpoints and resumes out of its
    live table, each in its own run dir, as one node per process writes them to its own log."""
    token = _node_log.set(Path(path))
    try:
        yield
    finally:
        _node_log.reset(token)


def configure(level: str = "info", fmt: str = "text") -> None:
    """(Re)configures this process's logging; idempotent (replaces the handler it installed)."""
    if level not in LEVELS or fmt not in ("text", "json"):
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} and format text or json, "
                         f"got {level!r} / {fmt!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, (_StderrHandler, _NodeFileHandler))]:
        root.removeHandler(handler)
    for handler in (_StderrHandler(), _NodeFileHandler()):
        handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        root.addHandler(handler)
    root.setLevel(max(LEVELS[level], logging.WARNING))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(LEVELS[level])
    logging.captureWarnings(True)
    _state["format"] = fmt


def json_lines() -> bool:
    """True when records are JSON lines (configure(fmt="json")): console text should be records too."""
    return _state["format"] == "json"


def say(console, text: str, event: str, **fields) -> None:
    """A line for the operator: rich console text in text mode (as always), an info record with
    `event` and `fields` in JSON mode (so every line on stderr parses)."""
    if json_lines():
        logging.getLogger("node.cli").info(text, extra={"event": event, **fields})
    else:
        console.print(text, highlight=False, soft_wrap=True)
