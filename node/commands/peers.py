"""`swarm-node peers`: the signing keys a node knows, and the operator's bans and demotions.

    swarm-node peers --run-dir runs/node                 # list: young / established, network group, credits, bans
    swarm-node peers --run-dir runs/node --ban KEY       # refuse everything KEY signs, until --unban
    swarm-node peers --run-dir runs/node --demote KEY    # KEY young again: it earns its place anew

Listing asks the running node (its control service, as `status` does). Decisions go to
`<run_dir>/operator.json` (node/peers/operator.py), which a running node reads within a round and a
restarted one at start: the node need not be running to take them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def add_parser(sub, presets: list[str]) -> None:
    peers = sub.add_parser("peers", help="list the peer keys a node knows (young/established, network group, "
                           "credits, bans); ban, unban or demote a key, kept across restarts")
    peers.add_argument("--run-dir", default="runs/node", help="the node's run dir (node.json, operator.json)")
    peers.add_argument("--control", metavar="HOST:PORT", help="control service address instead of --run-dir's")
    peers.add_argument("--timeout", type=float, default=5.0)
    action = peers.add_mutually_exclusive_group()
    action.add_argument("--ban", metavar="KEY", help="refuse every message KEY signs or delivers, until --unban")
    action.add_argument("--unban", metavar="KEY", help="lift the operator's ban of KEY (it starts young)")
    action.add_argument("--demote", metavar="KEY", help="make an established KEY young again")
    peers.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.ban or args.unban or args.demote:
        return decide(run_dir, args)
    return list_keys(run_dir, args)


def decide(run_dir: Path, args: argparse.Namespace) -> int:
    from node.config.schema import ConfigError  # pydantic and peers/: a decision's, not every `import node.cli`
    from node.peers.operator import OperatorDecisions

    if not run_dir.is_dir():
        raise ConfigError(f"run dir {run_dir} does not exist: pass the node's --run-dir")
    try:
        decisions = OperatorDecisions.load(run_dir)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if args.ban:
        decisions.ban(args.ban)
        done = f"banned {args.ban}"
    elif args.unban:
        if not decisions.unban(args.unban):
            print(f"{args.unban} is not banned by the operator (nothing changed)", file=sys.stderr)
            return 1
        done = f"unbanned {args.unban} (young again)"
    else:
        decisions.demote(args.demote)
        done = f"demoted {args.demote} (if it was established, it is young again)"
    decisions.save(run_dir)
    print(f"{done}: written to {run_dir / 'operator.json'}; a running node applies it within a round")
    return 0


def list_keys(run_dir: Path, args: argparse.Namespace) -> int:
    from node.observe.control import control_address, fetch_status  # gRPC: the listing's alone, not ban's

    s = fetch_status(args.control or control_address(run_dir), timeout_s=args.timeout)
    scores = {p.peer_id: p for p in s.peers}
    table = Table(title=f"peer keys at {s.peer_id} ({s.established_keys} established, {s.young_keys} young)")
    for col in ("key", "state", "network group", "credited", "last credited", "score", "banned"):
        table.add_column(col)
    now = time.time()
    for k in s.keys:
        score = scores.get(k.key)
        banned = "operator" if k.operator_banned else ("score" if score is not None and score.banned else "")
        table.add_row(k.key, "established" if k.established else "young", k.network_group or "-", str(k.credited),
                      f"{now - k.last_credited_s:.0f} s ago" if k.last_credited_s else "-",
                      "-" if score is None else f"{score.score:+.2f}", banned)
    (Console() if sys.stdout.isatty() else Console(width=220)).print(table)
    return 0
