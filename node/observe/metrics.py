"""Per-round metrics: one JSON line per round in `<run_dir>/metrics.jsonl`, and a live round table."""
from __future__ import annotations

import json
import logging
import os
from collections import deque
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from policy.ground import atomic_write_text

METRICS_FILE = "metrics.jsonl"
log = logging.getLogger(__name__)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line torn by a kill mid-write: everything after it is untrustworthy
    return rows


class MetricsLog:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.last: dict | None = None  # the newest row this process wrote (dashboards)
        self.last_heldout: float | None = None  # the newest held-out pass@1 this process measured

    def truncate_after(self, round_index: int) -> None:
        """On resume: drop rounds after the checkpoint (they will be run again, identically)."""
        kept = [r for r in read_metrics(self.path.parent) if r["round"] <= round_index]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def append(self, row: dict) -> None:
        self.last = row
        self.last_heldout = row.get("heldout_pass1", self.last_heldout)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


COLUMNS = [  # (header, key, format)
    ("round", "round", "{:d}"),
    ("reward", "reward_mean", "{:.3f}"),
    ("pass", "pass_rate", "{:.2f}"),
    ("held-out", "heldout_pass1", "{:.2f}"),  # greedy pass@1 on held-out tasks; "-" between evaluations
    ("loss", "loss", "{:+.4f}"),
    ("ratio", "ratio_mean", "{:.3f}"),
    ("ratio max", "ratio_max", "{:.3f}"),
    ("clip", "clip_frac", "{:.3f}"),
    ("groups", "groups_trained", "{:d}"),
    ("ext used", "external_used", "{:d}"),
    ("tiers 0/1/2", "external_tiers", "{}"),
    ("hinted", "groups_hinted", "{:d}"),
    ("peers", "peers_connected", "{:d}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("gen s", "t_generate", "{:.2f}"),
    ("score s", "t_score", "{:.2f}"),
    ("train s", "t_train", "{:.2f}"),
]


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if isinstance(value, dict):  # e.g. rollouts per behavior tier: "3/0/1"
        return "/".join(str(value[k]) for k in sorted(value))
    try:
        return fmt.format(int(value) if fmt == "{:d}" else value)
    except (TypeError, ValueError):
        return str(value)


# the round record of JSON logs: the table's columns and a few more
ROUND_FIELDS = [key for _, key, _ in COLUMNS] + ["policy_version", "t_round", "external_received", "pool_size"]


def log_round(row: dict) -> None:
    """One info record per round (event "round") with the table's values."""
    fields = {key: row[key] for key in ROUND_FIELDS if row.get(key) is not None}
    shown = [f"{header} {_cell(row, key, fmt)}" for header, key, fmt in COLUMNS[1:5] if row.get(key) is not None]
    log.info("round %d: %s", row["round"], ", ".join(shown), extra={"event": "round", **fields})


def _plain_line(row: dict) -> str:
    return "  ".join(f"{header}={_cell(row, key, fmt)}" for header, key, fmt in COLUMNS)


class RoundTable:
    """A live table of the last rounds on a terminal; one plain line per round otherwise (logs, CI).
    `log_rounds` (JSON logs): a `round` log record per round instead of the plain line, also when
    quiet (the live table still shows on a terminal)."""

    def __init__(self, title: str, console: Console | None = None, rows: int = 12, quiet: bool = False,
                 log_rounds: bool = False):
        self.console = console or Console()
        self.title = title
        self.rows: deque[dict] = deque(maxlen=rows)
        self.quiet = quiet
        self.log_rounds = log_rounds
        self.live = Live(self._table(), console=self.console, refresh_per_second=4) \
            if self.console.is_terminal and not quiet else None

    def _table(self) -> Table:
        table = Table(title=self.title, expand=False)
        for header, _, _ in COLUMNS:
            table.add_column(header, justify="right")
        for row in self.rows:
            table.add_row(*(_cell(row, key, fmt) for _, key, fmt in COLUMNS))
        return table

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.log_rounds:
            log_round(row)
        if self.live:
            self.live.update(self._table())
        elif not self.quiet and not self.log_rounds:
            self.console.print(_plain_line(row), highlight=False, soft_wrap=True)
