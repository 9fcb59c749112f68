"""A node's rounds as the observe page and /metrics need them, read from its metrics.jsonl.

The file is tailed (only what was appended since the last read), so the same reader serves a `join`
node, `train`, and a testnet harness reading its nodes' run dirs; nothing in the round loop changes.
Memory stays bounded for runs of days: each curve keeps at most `max_points` points (when full, every
second point goes, so the curve keeps its shape at half the resolution) and the table its last rows.
"""
from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path

from node.observe.metrics import METRICS_FILE

CURVE_POINTS = 2000
RECENT_ROWS = 20
# metrics row key -> curve name; held-out keys exist only in evaluation rounds
CURVES = {"reward_mean": "reward", "heldout_pass1": "heldout_pass1", "heldout_passk": "heldout_passk"}
# the keys of a row the page's table shows (a full row also holds per-sender and per-family dicts)
TABLE_KEYS = ("round", "reward_mean", "pass_rate", "heldout_pass1", "loss", "grad_norm", "groups_trained",
              "external_used", "external_tiers", "peers_connected", "tokens_per_s", "t_round")


class RoundHistory:
    """Thread-safe: `refresh` (any thread) reads the new rows; `view` and `latest` return copies."""

    def __init__(self, run_dir: Path, max_points: int = CURVE_POINTS):
        self.path = Path(run_dir) / METRICS_FILE
        self.max_points = max_points
        self._lock = threading.Lock()
        self._reset(None)

    def _reset(self, inode: int | None) -> None:
        self._inode, self._offset = inode, 0
        self._curves: dict[str, list[list[float]]] = {name: [] for name in CURVES.values()}
        self._recent: deque[dict] = deque(maxlen=RECENT_ROWS)
        self._last: dict | None = None
        self._last_eval: dict | None = None

    def refresh(self) -> None:
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._reset(None)  # no round yet (or the run dir was cleared)
                return
            # a resumed node rewrites the file without the rounds after its checkpoint (a new inode)
            if stat.st_ino != self._inode or stat.st_size < self._offset:
                self._reset(stat.st_ino)
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                for line in fh:
                    if not line.endswith(b"\n"):
                        break  # being written: read it next time
                    self._offset += len(line)
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line torn by a kill mid-write
                    if isinstance(row, dict) and isinstance(row.get("round"), int):
                        self._add(row)

    def _add(self, row: dict) -> None:
        for key, name in CURVES.items():
            value = row.get(key)
            if isinstance(value, (int, float)):
                curve = self._curves[name]
                curve.append([row["round"], float(value)])
                if len(curve) > self.max_points:
                    del curve[-2::-2]  # every second point, the newest kept
        self._recent.append({k: row[k] for k in TABLE_KEYS if k in row})
        self._last = row
        if "heldout_pass1" in row:
            self._last_eval = row

    def view(self) -> dict:
        """Curves as [[round, value], ...] and the last rows (newest last), after reading new rows."""
        self.refresh()
        with self._lock:
            return {"curves": {name: [list(p) for p in points] for name, points in self._curves.items()},
                    "recent": list(self._recent)}

    def latest(self) -> tuple[dict | None, dict | None]:
        """(the newest row, the newest row with a held-out evaluation), after reading new rows."""
        self.refresh()
        with self._lock:
            return self._last, self._last_eval
