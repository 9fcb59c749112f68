"""What the observe endpoints read from one node, at request time: its identity (public parts only),
the exchange's counters and peer scores, and its rounds (node/observe/history.py)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from node.observe.history import RoundHistory
from protocol.transports.options import REACHABILITY_NAMES as REACH_NAMES

MAX_PEERS_SHOWN = 200  # the page lists the lowest-scored peers first; a crowd of keys cannot grow the reply


@dataclasses.dataclass
class NodeObserver:
    """`status`: SwarmExchange.status() of a node in a swarm, None for `swarm-node train`;
    `progress`: {"round": rounds done, "policy_version": ...} now. `identity` holds only public
    facts (peer id, swarm, transport, listen addresses): never anything of the private key."""

    run_dir: Path
    title: str
    identity: dict
    progress: Callable[[], dict]
    status: Callable[[], dict] | None = None
    started: float = dataclasses.field(default_factory=time.monotonic)

    def __post_init__(self):
        self.history = RoundHistory(self.run_dir)

    def swarm_status(self) -> dict | None:
        return self.status() if self.status is not None else None

    def state(self) -> dict:
        """The JSON of /api/state."""
        out = {"kind": "node", "title": self.title, **self.identity, **self.progress(),
               "uptime_s": time.monotonic() - self.started, **self.history.view()}
        status = self.swarm_status()
        if status is not None:
            out.update(swarm_summary(status))
        return out


def swarm_summary(status: dict) -> dict:
    """The JSON-able part of SwarmExchange.status() the page shows."""
    connected = set(status["connected"])
    peers = [{**dataclasses.asdict(p), "connected": p.peer_id in connected} for p in status["peers"]]
    counters = status.get("transport", {})
    reach = REACH_NAMES.get(counters["reachability"], "unknown") if "reachability" in counters else None
    return {"listen_addrs": status["listen_addrs"], "connected": len(connected), "accepted": status["accepted"],
            "reachability": reach, "relayed_peers": counters.get("relayed_peers", 0),
            "rejected_by_reason": dict(status["rejected_by_reason"]), "tiers_used": dict(status.get("tiers_used", {})),
            "peers_tracked": len(peers), "peers_banned": sum(p["banned"] for p in peers),
            "peers": peers[:MAX_PEERS_SHOWN]}


def loop_progress(node) -> Callable[[], dict]:
    """What the listener reads of a node.train.loop.Node's round loop: two ints, safe from another thread."""
    return lambda: {"round": node.next_round, "policy_version": node.learner.policy_version}
