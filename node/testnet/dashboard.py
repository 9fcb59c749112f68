"""The live testnet view: one row per node (round, reward, held-out pass rate, peers, accepted and
rejected messages). A rich live table on a terminal; a plain progress line every few seconds in
logs and CI."""
from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

COLUMNS = [("node", "node", "{}"), ("state", "state", "{}"), ("round", "round", "{}"), ("reward", "reward", "{:.3f}"),
           ("held-out", "heldout", "{:.2f}"), ("peers", "peers", "{}"), ("ext used", "ext_used", "{}"),
           ("accepted", "accepted", "{}"), ("rejected", "rejected", "{}")]
PLAIN_EVERY_S = 10.0


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


class Dashboard:
    def __init__(self, title: str, console: Console | None = None, quiet: bool = False, page=None):
        """`page`: the testnet's web page (node/observe/testnet.py), handed every update too."""
        self.console = console or Console(stderr=True)
        self.title = title
        self.quiet = quiet
        self.page = page
        self.live: Live | None = None
        self._last_plain = 0.0

    def __enter__(self):
        if self.console.is_terminal and not self.quiet:
            self.live = Live(Table(title=self.title), console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def update(self, rows: list[dict], title: str | None = None) -> None:
        if self.page is not None:
            self.page.update(rows)
        if self.quiet:
            return
        if self.live is not None:
            table = Table(title=title or self.title)
            for header, _, _ in COLUMNS:
                table.add_column(header, justify="right")
            for row in rows:
                table.add_row(*(_cell(row, key, fmt) for _, key, fmt in COLUMNS))
            self.live.update(table)
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            rounds = [r.get("round") for r in rows if r.get("round") is not None]
            rewards = [r["reward"] for r in rows if r.get("reward") is not None]
            self.console.print(f"{title or self.title}: rounds {min(rounds, default=0)}-{max(rounds, default=0)}, "
                               f"mean reward {sum(rewards) / max(1, len(rewards)):.3f}, "
                               f"{sum(r.get('state') == 'killed' for r in rows)} down", highlight=False)
