"""Gossip benchmark: three variants side by side, N protocol-only nodes (no model), each a SEPARATE
PROCESS (scripts/bench/gossip/node.py) on 127.0.0.1, wired through bootstrap addresses (every node
dials node 0, and from node 2 on one random earlier node). Variants: p2pd (the go-libp2p daemon
with its default connection bounds, conn_low..conn_high = 6..12), p2pd-unbounded (conn_high=0:
connected to every peer it meets, as before the bounds), libp2p (py-libp2p). For every variant
and every N it measures

(0) connections per node (mean, max; after the bounded variant settled within its bound, and
    again after the flood) and the cores all nodes use doing nothing.
(1) latency: "reach all" = publish -> the LAST of the N-1 other nodes has verified the group with
    its Ingress (8 completions x 64 tokens with token ids, log-probs and offsets, ~7.5 KB signed):
    p50 / p95 (a) one group in flight at a time, (b) 4 publishers bursting; delivery ratio; CPU
    seconds of all nodes (daemons included) per delivered group; TCP bytes between the nodes per
    delivered token and per delivered envelope ("wire copies per delivery": from `ss`, so
    framing, encryption, gossip control, DHT traffic and duplicates all count).
(2) ingest: S senders flood K pre-sealed ~4 KB groups at node 0 (the only subscriber of that
    topic; with p2pd the senders dial node 0 first, since GossipSub routes a topic only through
    its subscribers): delivery ratio, verified msgs/s end to end, and separately the transport's
    arrival rate and the Ingress's own rate while busy.
(3) the ratios bounded / unbounded and bounded / py-libp2p of every figure, per N, with the load
    average at the start of each run and during its burst.

    .venv/bin/python -m scripts.bench.gossip.bench                                  # N = 8 16 32 64, all three
    .venv/bin/python -m scripts.bench.gossip.bench --nodes 3 --messages 3 --flood 60   # smoke

Writes <out>/bench_gossip.json, <out>/bench_gossip.png (latency CDFs) and <out>/bench_gossip.txt
(the tables; default out runs/bench).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from scripts.bench.gossip.node import (
    FLOOD_COMPLETIONS, GROUP_COMPLETIONS, TOKENS_PER_COMPLETION, TRANSPORTS, available_transports, build_group,
)
from scripts.bench.gossip.phases import run_one
from scripts.bench.gossip.report import plot, ratios, report
from scripts.common import arg_parser, console as make_console, runs_dir, write_json


def wire_vs_json() -> dict[str, Any]:
    """Signed envelope bytes of one group vs the same group as JSON, and per token."""
    import numpy as np

    from proto import swarm_pb2
    from protocol import NodeIdentity, Outbox

    group = build_group(1, 1)
    sealed = Outbox(NodeIdentity.generate()).seal(group)
    wire = swarm_pb2.RolloutGroup.FromString(swarm_pb2.Envelope.FromString(sealed).body)  # as received

    def as_dict(short_floats: bool) -> dict[str, Any]:
        fl = (lambda x: float(str(np.float32(x)))) if short_floats else float
        ref, m, s = wire.task_ref, wire.model, wire.sampling
        return {
            "task_ref": {"source": ref.source, "dataset": ref.dataset, "config_digest": ref.config_digest,
                         "seed": ref.seed, "index": ref.index},
            "model": {"name": m.name, "tokenizer_fingerprint": m.tokenizer_fingerprint,
                      "weights_version": m.weights_version},
            "sampling": {"temperature": fl(s.temperature), "max_new_tokens": s.max_new_tokens, "top_p": fl(s.top_p)},
            "policy_version": wire.policy_version, "round": wire.round,
            "question": wire.question, "answer": wire.answer,
            "completions": [{"text": c.text, "token_ids": list(c.token_ids),
                             "logprobs": [fl(x) for x in c.behavior_logprobs],
                             "offsets": [[c.char_offsets[k], c.char_offsets[k + 1]]
                                         for k in range(0, len(c.char_offsets), 2)],
                             "reward": fl(c.claimed_reward), "truncated": c.truncated} for c in wire.completions],
        }

    json_default = len(json.dumps(as_dict(False)).encode())
    json_compact = len(json.dumps(as_dict(True), separators=(",", ":")).encode())
    tokens = sum(len(c.token_ids) for c in wire.completions)
    return {
        "completions": len(wire.completions), "tokens": tokens, "envelope_bytes": len(sealed),
        "body_bytes": len(group.SerializeToString()), "envelope_bytes_per_token": len(sealed) / tokens,
        "json_bytes": json_default, "json_compact_float32_bytes": json_compact,
        "ratio_envelope_to_json": len(sealed) / json_default,
        "ratio_envelope_to_json_compact": len(sealed) / json_compact,
    }


def ingress_microbench(messages: int) -> dict[str, Any]:
    try:
        from protocol import bench

        return bench.run(messages=messages)
    except Exception as e:  # noqa: BLE001 - reported in the output, the benchmark goes on
        return {"error": f"{type(e).__name__}: {e}"}


def p2pd_bounds() -> dict[str, Any]:
    """The bounded variant's connection bounds and what GossipSub in the daemon uses."""
    from protocol.transports.options import P2pdOptions

    o = P2pdOptions()
    return {"conn_low": o.conn_low, "conn_high": o.conn_high, "conn_grace_s": o.conn_grace_s,
            "gossipsub": "go-libp2p-pubsub 0.10 defaults: D=6, D_lo=5, D_hi=12, D_lazy=6, gossip factor 0.25, "
                         "flood publishing off (p2pd 0.5 sets none of them)"}


def run_conditions(args: argparse.Namespace, transports: list[str], skipped: list[str]) -> dict[str, Any]:
    """What the figures depend on, recorded with them."""
    try:
        libp2p_version = version("libp2p")
    except PackageNotFoundError:
        libp2p_version = "?"
    return {
        "transports": transports, "skipped_transports": skipped, "nodes": args.nodes,
        "publishers": args.publishers, "messages_per_publisher": args.messages, "spacing_ms": args.spacing_ms,
        "isolated_messages": args.isolated, "flood_messages": args.flood, "flood_senders": args.flood_senders,
        "group": f"{GROUP_COMPLETIONS} completions x {TOKENS_PER_COMPLETION} tokens (token ids, log-probs, "
                 f"offsets), Ed25519-signed Envelope; flood: {FLOOD_COMPLETIONS} completions (~4 KB)",
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "libp2p": libp2p_version,
        "platform": platform.platform(), "poll_ms": args.poll_ms, "seed": args.seed,
        "ingress_latency_phase": "protocol defaults (rate limits on)",
        "ingress_flood_phase": "rate limits lifted (as protocol/bench.py)",
        "loadavg_at_start": os.getloadavg(), "command": " ".join(sys.argv),
        "p2pd_bounds": p2pd_bounds(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__.split("\n\n")[0])
    p.add_argument("--transports", default=",".join(TRANSPORTS),
                   help=f"comma-separated, compared side by side (default {','.join(TRANSPORTS)}; "
                        "one missing from this checkout is skipped with a note)")
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 64], help="swarm sizes (default 8 16 32 64)")
    p.add_argument("--publishers", type=int, default=4, help="publishers bursting in the burst phase")
    p.add_argument("--messages", type=int, default=20, help="groups per publisher in the burst phase")
    p.add_argument("--spacing-ms", type=float, default=50.0, help="gap between one publisher's groups")
    p.add_argument("--isolated", type=int, default=20,
                   help="groups sent one at a time (the next once the previous reached all) before the burst")
    p.add_argument("--idle-s", type=float, default=2.0, help="seconds of idle CPU measurement")
    p.add_argument("--flood", type=int, default=2000, help="~4 KB groups flooded at node 0 (K)")
    p.add_argument("--flood-senders", type=int, default=4)
    p.add_argument("--micro-messages", type=int, default=2000, help="protocol/bench.py messages")
    p.add_argument("--poll-ms", type=float, default=2.0, help="receiver drain() poll interval when idle")
    p.add_argument("--keep-logs", action="store_true", help="keep the per-node log folders (kept anyway on failure)")
    p.add_argument("--seed", type=int, default=0, help="topology RNG seed (the same topology for every transport)")
    p.add_argument("--out", type=Path, default=runs_dir("bench"))
    p.add_argument("--start-timeout", type=float, help="seconds for N nodes to listen (default 60 + 3 N)")
    p.add_argument("--mesh-timeout", type=float, default=60.0)
    p.add_argument("--settle-timeout", type=float, default=180.0,
                   help="seconds for the bounded p2pd variant to get every node within its bound")
    p.add_argument("--warmup-timeout", type=float, default=15.0)
    p.add_argument("--isolated-timeout", type=float, default=5.0)
    p.add_argument("--delivery-timeout", type=float, default=20.0)
    p.add_argument("--flood-timeout", type=float, default=60.0)
    p.add_argument("--shutdown-timeout", type=float, default=20.0)
    p.add_argument("--worker-deadline", type=float,
                   help="a node process exits by itself this many seconds after its swarm started "
                        "(default 360 + 8 N)")
    args = p.parse_args(argv)
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = [t for t in args.transports if t not in TRANSPORTS]
    if unknown or not args.transports:
        p.error(f"--transports: unknown {unknown}; choose from {', '.join(TRANSPORTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = make_console(240, record=True)
    t0 = time.time()
    have = available_transports()
    transports = [t for t in args.transports if t in have]
    skipped = [t for t in args.transports if t not in have]
    for t in skipped:
        console.print(f"[yellow]transport {t} is not in this checkout: skipped[/yellow]")
    if not transports:
        console.print("[red]no transport to benchmark[/red]")
        return 2
    conditions = run_conditions(args, transports, skipped)
    console.print(f"[bold]bench_gossip[/bold]: transports {transports}, N={args.nodes}, burst {args.publishers} "
                  f"publishers x {args.messages} every {args.spacing_ms:.0f} ms, flood K={args.flood} from "
                  f"{args.flood_senders} senders, {conditions['cpu_count']} cores, load {os.getloadavg()[0]:.1f}, "
                  f"Python {conditions['python']}, libp2p {conditions['libp2p']}")
    wire = wire_vs_json()
    micro = ingress_microbench(args.micro_messages)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    results: list[dict[str, Any]] = []
    interrupted = False
    try:
        for n in args.nodes:
            for transport in transports:  # the same topology seed for every transport at one N
                results.append(run_one(n, transport, args, random.Random(args.seed * 1000 + n), console))
    except KeyboardInterrupt:
        interrupted = True
        console.print("[red]interrupted[/red]")
    wall = time.time() - t0
    conditions["loadavg_at_end"] = os.getloadavg()
    out_json, out_png, out_txt = (args.out / f"bench_gossip.{ext}" for ext in ("json", "png", "txt"))
    payload = {"conditions": conditions, "wire": wire, "ingress_microbench": micro, "runs": results,
               "ratios": ratios(results, args.nodes), "wall_s": round(wall, 2), "interrupted": interrupted}
    write_json(out_json, payload, indent=2)  # first: the measurements survive any report bug
    report(results, transports, [n for n in args.nodes if any(r["n"] == n for r in results)], wire, micro, console)
    console.print(f"total wall time {wall:.1f} s")
    try:
        plot(results, out_png)
    except Exception as e:  # noqa: BLE001 - the JSON and the tables are the result; the plot is a view
        console.print(f"plot failed: {e}", style="yellow", markup=False)
    out_txt.write_text(console.export_text())
    console.print(f"wrote {out_json}, {out_png} and {out_txt}")
    failed = interrupted or any(r.get("error") for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
