"""What the operator decided about peers' signing keys, kept in `<run_dir>/operator.json`.

`swarm-node peers --ban KEY`, `--unban KEY` and `--demote KEY` write it (atomically); a node reads
it when it starts and at the start of every round in which the file changed (SwarmExchange.collect),
so a decision reaches a running node within a round and holds across restarts:

  banned    every message the key signs (or delivers) is refused as `banned`, its pooled groups are
            dropped, and it is young again, until `--unban`
  demoted   a key established before the decision is young again and earns its place anew (the
            admission record's credits, rounds and seconds restart); one established after it keeps it
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from policy.ground import atomic_write_text

OPERATOR_FILE = "operator.json"
log = logging.getLogger(__name__)


@dataclass
class OperatorDecisions:
    banned: dict[str, float] = field(default_factory=dict)   # key -> when it was banned (unix time)
    demoted: dict[str, float] = field(default_factory=dict)  # key -> when it was demoted (unix time)

    @classmethod
    def load(cls, run_dir: Path) -> OperatorDecisions:
        """The decisions in `run_dir` (none if the file is absent); ValueError naming the file and
        what is wrong with it otherwise."""
        path = Path(run_dir) / OPERATOR_FILE
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            return cls(banned=_times(data.get("banned", {})), demoted=_times(data.get("demoted", {})))
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not an operator file ({err}); fix it or delete it "
                             "(swarm-node peers --ban/--unban/--demote rewrites it)") from err

    def save(self, run_dir: Path) -> None:
        atomic_write_text(Path(run_dir) / OPERATOR_FILE,
                          json.dumps({"banned": self.banned, "demoted": self.demoted}, indent=1, sort_keys=True))

    def ban(self, key: str) -> None:
        self.banned[key] = time.time()

    def unban(self, key: str) -> bool:
        return self.banned.pop(key, None) is not None

    def demote(self, key: str) -> None:
        self.demoted[key] = time.time()


def _times(entries: dict) -> dict[str, float]:
    if not isinstance(entries, dict):
        raise TypeError(f"expected an object of key -> unix time, got {type(entries).__name__}")
    return {str(key): float(at) for key, at in entries.items()}


class OperatorWatch:
    """Re-reads the operator file when its modification time changes."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / OPERATOR_FILE
        self._seen: float | None = None

    def changed_or_none(self) -> OperatorDecisions | None:
        """`changed()`, with a malformed file logged (once per change) instead of raised: the
        decisions applied before stay."""
        try:
            return self.changed()
        except ValueError as err:
            log.warning("%s; keeping the operator's earlier decisions", err, extra={"event": "operator_file_invalid"})
            return None

    def changed(self) -> OperatorDecisions | None:
        """The decisions if the file changed since the last call (the first call: if it exists)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self._seen:
            return None
        self._seen = mtime
        return OperatorDecisions.load(self.path.parent)


def apply_decisions(decisions: OperatorDecisions, ingress, pool) -> None:
    """Banned keys refused by the Ingress (`Ingress.block`), out of the pool and young; demoted keys
    established before their demotion young again (node/peers/admission.py `demote`)."""
    ingress.block(decisions.banned)
    for key in decisions.banned:
        pool.drop_sender(key)
        pool.admission.demote(key)
    for key, at in decisions.demoted.items():
        pool.admission.demote(key, at)
    log.info("operator decisions: %d key(s) banned, %d demoted", len(decisions.banned), len(decisions.demoted),
             extra={"event": "operator_decisions", "banned": len(decisions.banned), "demoted": len(decisions.demoted)})
