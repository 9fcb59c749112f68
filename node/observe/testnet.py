"""The page of a whole testnet (`swarm-node testnet`), served from the harness's own process: every
node's curves, one line per node, read from the nodes' metrics.jsonl in their run dirs (so it works
the same for the in-process memory testnet and for a testnet of `join` processes), and the
dashboard's row per node (state, round, peers, accepted and rejected messages) as the harness
last computed it. The page never calls into a node: only files and the rows it is handed."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from node.observe.control import NODE_FILE
from node.observe.history import RoundHistory


class TestnetPage:
    def __init__(self, title: str = "swarm-node testnet"):
        self._lock = threading.Lock()
        self.title = title
        self.run_dir: Path | None = None
        self.node_dirs: list[Path] = []
        self.histories: list[RoundHistory] = []
        self.rows: list[dict] = []

    def begin_run(self, title: str, run_dir: Path, node_dirs: list[Path]) -> None:
        """A new run of the plan (a mix and a seed): its nodes replace the last run's on the page."""
        with self._lock:
            self.title, self.run_dir, self.node_dirs = title, Path(run_dir), [Path(d) for d in node_dirs]
            self.histories = [RoundHistory(d) for d in self.node_dirs]
            self.rows = []

    def update(self, rows: list[dict]) -> None:
        """The dashboard's rows (node/testnet/memory.py and process.py snapshot())."""
        with self._lock:
            self.rows = [dict(r) for r in rows]

    def state(self) -> dict:
        with self._lock:
            title, run_dir, dirs, histories, rows = self.title, self.run_dir, self.node_dirs, self.histories, self.rows
        by_node = {r.get("node"): r for r in rows}
        nodes = []
        for index, (node_dir, history) in enumerate(zip(dirs, histories)):
            view = history.view()
            row = by_node.get(index, {})
            last = view["recent"][-1] if view["recent"] else {}
            nodes.append({"name": node_dir.name, "state": row.get("state", "starting"),
                          "round": row.get("round", last.get("round", -1) + 1), "reward": last.get("reward_mean"),
                          "heldout": (view["curves"]["heldout_pass1"] or [[None, None]])[-1][1],
                          **{k: row.get(k) for k in ("peers", "ext_used", "accepted", "rejected")},
                          "url": _node_page(node_dir), "curves": view["curves"]})
        return {"kind": "testnet", "title": title, "run_dir": str(run_dir or ""), "nodes": nodes}


def _node_page(node_dir: Path) -> str | None:
    """The page of a `join` node (process testnets): node.json names its listener."""
    try:
        address = json.loads((node_dir / NODE_FILE).read_text()).get("metrics")
    except (OSError, ValueError):
        return None
    return f"http://{address}/" if address else None
