"""`swarm-node status`: ask a running node (its gRPC control service) for peers, counters, scores and rounds."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console


def add_parser(sub, presets: list[str]) -> None:
    status = sub.add_parser("status", help="ask a running node for peers, counters, scores and rounds")
    status.add_argument("--run-dir", default="runs/node", help="the node's run dir (reads node.json)")
    status.add_argument("--control", metavar="HOST:PORT", help="control service address instead of --run-dir")
    status.add_argument("--timeout", type=float, default=5.0)
    status.add_argument("--json", action="store_true", help="print the whole status as JSON (for scripts)")
    status.set_defaults(func=run)


CHECKED_BY_PEER = "checked_by_peer/"  # the ingest's per-peer counts in StatusReply.ingest
DAEMON_STATES = {0: "starting", 1: "running", 2: "restarting", 3: "closed"}  # protocol/transports/p2pd/shared.py codes


def transport_summary(name: str, counters: dict[str, int]) -> str:
    """One line: the transport, and for p2pd the daemon's state, mesh (topic) peers and DHT/connected peers."""
    if "daemon_state" not in counters:
        return f"transport {name or 'unknown'}"
    topics = ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(counters.items()) if k.startswith("topic_peers:"))
    return (f"transport {name or 'p2pd'}: daemon {DAEMON_STATES.get(counters['daemon_state'], '?')} "
            f"(pid {counters.get('daemon_pid', 0)}, restarts {counters.get('daemon_restarts', 0)}); "
            f"connected peers {counters.get('connected_peers', 0)}, DHT peers {counters.get('dht_peers', 0)}; "
            f"topic peers: {topics or 'none yet'}")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table  # status's table and its gRPC client: no other command's

    from node.observe.control import control_address, fetch_status
    from node.service.reach import reach_summary

    address = args.control or control_address(Path(args.run_dir))
    s = fetch_status(address, timeout_s=args.timeout)
    if args.json:  # for scripts: every field, protobuf's JSON mapping (64-bit counters as strings)
        from google.protobuf.json_format import MessageToJson

        print(MessageToJson(s, preserving_proto_field_name=True))
        return 0
    out = Console() if sys.stdout.isatty() else Console(width=200)  # full peer ids when piped
    out.print(f"peer {s.peer_id}  swarm {s.swarm!r}  round {s.round}  policy v{s.policy_version}  "
              f"up {s.uptime_s} s  peers connected {len(s.connected_peers)}", highlight=False)
    for addr in s.listen_addrs:
        out.print(f"  listening on {addr}", highlight=False)
    out.print(transport_summary(s.transport, dict(s.transport_counters)), highlight=False)
    if (reach := reach_summary(dict(s.transport_counters))) is not None:
        out.print(reach, highlight=False)
    out.print("transport: " + ", ".join(f"{k}={v}" for k, v in sorted(s.transport_counters.items())), highlight=False)
    out.print(f"messages accepted {s.accepted}; rejected: "
              + (", ".join(f"{k}={v}" for k, v in sorted(s.rejected_by_reason.items())) or "none"), highlight=False)
    out.print("external rollouts trained by behavior tier: "
              + (", ".join(f"tier {k}={v}" for k, v in sorted(s.tier_rollouts.items())) or "none yet")
              + "  (0 exact, 1 aligned, 2 proxy)", highlight=False)
    out.print("observed: " + (", ".join(f"{k}={v}" for k, v in sorted(s.observed.items())) or "nothing"),
              highlight=False)
    counts = {k: v for k, v in sorted(s.ingest.items()) if not k.startswith(CHECKED_BY_PEER)}
    out.print("ingest: " + (", ".join(f"{k}={v}" for k, v in counts.items()) or "inline"), highlight=False)
    out.print(f"admission: {s.established_keys} keys established, {s.young_keys} young", highlight=False)
    out.print("hints: " + (", ".join(f"{k}={v}" for k, v in sorted(s.hint_counters.items())) or "none"),
              highlight=False)
    peers = Table(title="peers")
    for col in ("peer", "connected", "score", "banned", "ban left s", "accepted", "rejected", "checked",
                "established"):
        peers.add_column(col)
    for p in s.peers:
        promoted = s.established.get(p.peer_id)
        peers.add_row(p.peer_id, str(p.connected), f"{p.score:+.2f}", str(p.banned), f"{p.ban_remaining_s:.0f}",
                      str(p.accepted), str(p.rejected), str(s.ingest.get(CHECKED_BY_PEER + p.peer_id, 0)),
                      "no" if promoted is None else "yes")
    out.print(peers)
    out.print(exchange_summary(dict(s.exchange_totals)), highlight=False)
    rounds = Table(title="recent rounds")
    for col in ("round", "local", "ext received", "ext verified", "ext used", "ext dropped", "tier 0/1/2",
                "exchange s"):
        rounds.add_column(col, justify="right")
    for r in s.rounds:
        rounds.add_row(*(str(v) for v in (r.round, r.local_groups, r.external_groups_received, r.groups_verified,
                                          r.external_groups_used, r.external_groups_dropped)),
                       f"{r.tier0_rollouts}/{r.tier1_rollouts}/{r.tier2_rollouts}", f"{r.exchange_s:.3f}")
    out.print(rounds)
    return 0


def exchange_summary(totals: dict[str, float]) -> str:
    """One line: what the exchange verified for what it used, and where its seconds went."""
    if not totals:
        return "exchange: nothing yet"
    used, verified = totals.get("external_used", 0), totals.get("groups_verified", 0)
    phases = {k.removeprefix("t_exchange_"): v for k, v in totals.items() if k.startswith("t_exchange_")}
    ratio = f"{verified / used:.2f}" if used else "-"
    return (f"exchange: {totals.get('external_received', 0):.0f} groups received, {verified:.0f} verified "
            f"({totals.get('groups_audited', 0):.0f} audits), {used:.0f} used: {ratio} verified per used; seconds "
            + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
