"""Connections (and memory) in a scripts/bench/gossip/bench.py run (scripts/bench/gossip/phases.py
calls these): how many each node holds, waiting for the bounded p2pd variant to settle within its
bound, and putting the flood senders next to the flood's target."""
from __future__ import annotations

import statistics
import time
from typing import Any

from scripts.bench.gossip.swarm import PhaseTimeout


def conn_high(transport: str) -> int | None:
    """The connection bound of a variant (None: unbounded)."""
    if transport != "p2pd":
        return None
    from protocol.transports.options import P2pdOptions

    return P2pdOptions().conn_high


def connection_figures(statuses: dict[int, dict]) -> dict[str, Any]:
    """Connections per node, and resident memory per node (its process and daemon, MiB)."""
    counts = [s["peers"] for _, s in sorted(statuses.items())]
    rss = [s.get("rss_mb", 0.0) for _, s in sorted(statuses.items())]
    return {"mean": statistics.fmean(counts), "max": max(counts), "min": min(counts), "per_node": counts,
            "rss_mb_mean": statistics.fmean(rss), "rss_mb_max": max(rss)}


# Seen at N=64 in 3 of 5 runs measured 45 s after the start (bounds 8..16): every group of the
# last node to join reached all in ~0.55 s instead of ~0.1 s, as if its mesh were empty and its
# groups left through gossip (IHAVE/IWANT at the next 1 s heartbeat). The likely cause: GossipSub (go-libp2p-pubsub
# 0.10) backs a pruned mesh link off for a minute on both sides and keeps the backoff across
# reconnects; during the join churn, grafts to peers whose mesh is full are pruned, and a node
# left connected only to such peers cannot graft until the minute is over. So the settled mesh is
# measured after that minute.
PRUNE_BACKOFF_S = 60.0


def settle(b: Any) -> None:
    """Bounded p2pd: waits until every node holds at most conn_high connections, three looks in a
    row (nodes dial and ask the DHT while short, and close connections past their grace period
    while over), then until the prune backoff of the join churn has passed (PRUNE_BACKOFF_S after
    the last look that saw a node outside the bound). Other variants: nothing to wait for."""
    high = conn_high(b.swarm.transport)
    if high is None:
        return
    t0, in_a_row, counts, churn_seen = time.time(), 0, [], time.time()
    while time.time() - t0 < b.args.settle_timeout:
        counts = [s["peers"] for _, s in sorted(b.refresh_statuses().items())]
        within = max(counts) <= high and min(counts) >= 1
        in_a_row = in_a_row + 1 if within else 0
        churn_seen = churn_seen if within else time.time()
        if in_a_row >= 3:
            break
        time.sleep(1.0)
    else:
        raise PhaseTimeout(f"connections not within the bound {high} after {b.args.settle_timeout:.0f} s: {counts}")
    b.res["settle_s"] = round(time.time() - t0, 2)
    b.console.print(f"  connections within the bound ({high}) after {b.res['settle_s']:.1f} s: {counts}")
    backoff_left = churn_seen + PRUNE_BACKOFF_S - time.time()
    trims = b.n - 1 > high  # in a smaller swarm nobody exceeds the bound: no churn to wait out
    if backoff_left > 0 and trims:
        b.console.print(f"  waiting {backoff_left:.0f} s more: GossipSub's prune backoff after the join churn")
        time.sleep(backoff_left)
    b.res["settle_backoff_wait_s"] = round(max(0.0, backoff_left), 1) if trims else 0.0


def dial_target(b: Any, senders: list[int], target: int = 0) -> None:
    """p2pd variants: the flood senders dial the target first (as a flooder would): GossipSub routes
    a topic only through its subscribers, and the flood topic has one. Others: already connected."""
    if not b.swarm.transport.startswith("p2pd"):
        return
    replies = b.swarm.request_all(senders, "dial", "dialed", 15.0, addr=b.swarm.addrs[target])
    failed = {i: r["error"] for i, r in replies.items() if r.get("error")}
    if failed:
        b.console.print(f"  flood senders could not dial node {target}: {failed}", style="yellow", markup=False)
