"""What the bounded GossipSub overlay costs at sizes this machine cannot start (proto/PROTOCOL.md,
"Scaling to 10,000 nodes"): hops to reach all, copies received per delivery, and each node's
bytes per second at a publication pace.

What it models, and nothing more: a connection graph in which every node dials random peers
until it holds `--conn-low` connections, a peer at `--conn-high` refusing more (the bound of
protocol/transports/p2pd/bounds.py); on it a GossipSub mesh in which every node grafts up to D
random connected peers and a peer with D_hi mesh peers refuses (go-libp2p-pubsub 0.10's D=6,
D_hi=12); a message that every node forwards once, on first receipt, to all its mesh peers but
the one it came from (flood publishing off, as in the daemon). Hops are breadth-first levels over
the mesh, so latency = hops x the per-hop time you pass (`--hop-ms`, e.g. measured by
scripts/bench/gossip/bench.py); the wire cost = copies x the envelope bytes. Not modelled: queues,
loss, churn, IHAVE/IWANT repair, DHT traffic, the CPU of verifying, links of unequal speed.

    .venv/bin/python -m scripts.bench.gossip.sim_scale                 # N = 64, 1,000, 10,000
    .venv/bin/python -m scripts.bench.gossip.sim_scale --nodes 64 10000 --hop-ms 30 --json out.json
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import deque
from pathlib import Path

from scripts.common import arg_parser, write_json

D, D_HI = 6, 12  # go-libp2p-pubsub 0.10 defaults inside p2pd


def connection_graph(n: int, low: int, high: int, rng: random.Random) -> list[set[int]]:
    """Every node dials random peers until it has `low` connections; a peer at `high` refuses."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for u in rng.sample(range(n), n):
        tries = 0
        while len(adj[u]) < min(low, n - 1) and tries < 50 * low:
            tries += 1
            v = rng.randrange(n)
            if v != u and v not in adj[u] and len(adj[v]) < high:
                adj[u].add(v)
                adj[v].add(u)
    return adj


def mesh(adj: list[set[int]], rng: random.Random) -> list[set[int]]:
    """Every node grafts up to D random connected peers; a peer with D_hi mesh peers refuses."""
    out: list[set[int]] = [set() for _ in adj]
    for u in rng.sample(range(len(adj)), len(adj)):
        for v in rng.sample(sorted(adj[u]), len(adj[u])):
            if len(out[u]) >= D:
                break
            if v not in out[u] and len(out[v]) < D_HI:
                out[u].add(v)
                out[v].add(u)
    return out


def spread(m: list[set[int]], source: int) -> tuple[int, int, int]:
    """(hops to reach all reached, nodes reached, transmissions) of one message from `source`."""
    level = {source: 0}
    queue = deque([source])
    sends = 0
    while queue:
        u = queue.popleft()
        sends += len(m[u]) - (0 if u == source else 1)  # to every mesh peer but the one it came from
        for v in m[u]:
            if v not in level:
                level[v] = level[u] + 1
                queue.append(v)
    return max(level.values()), len(level), sends


def simulate(n: int, low: int, high: int, samples: int, seed: int) -> dict:
    rng = random.Random(seed)
    adj = connection_graph(n, low, high, rng)
    m = mesh(adj, rng)
    hops, reached, copies = [], [], []
    for source in rng.sample(range(n), min(samples, n)):
        h, r, sends = spread(m, source)
        hops.append(h)
        reached.append(r / n)
        copies.append(sends / max(1, r - 1))
    return {"nodes": n, "connections_mean": statistics.fmean(len(a) for a in adj),
            "connections_max": max(len(a) for a in adj), "mesh_degree_mean": statistics.fmean(len(x) for x in m),
            "hops_to_reach_all_mean": statistics.fmean(hops), "hops_to_reach_all_max": max(hops),
            "reached_fraction_min": min(reached), "copies_per_delivery": statistics.fmean(copies)}


def per_node_load(row: dict, pace: float, envelope_bytes: int, hop_ms: float) -> dict:
    """Every node receives every group: N x pace groups/s, each `copies` times."""
    groups_per_s = row["nodes"] * pace
    return {"groups_per_s_per_node": groups_per_s,
            "bytes_per_s_per_node": groups_per_s * envelope_bytes * row["copies_per_delivery"],
            "reach_all_ms": row["hops_to_reach_all_max"] * hop_ms}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__.split("\n\n")[0], formatter_class=argparse.HelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[64, 1000, 10000])
    p.add_argument("--conn-low", type=int, default=6)
    p.add_argument("--conn-high", type=int, default=12)
    p.add_argument("--samples", type=int, default=50, help="messages (random sources) per size")
    p.add_argument("--pace", type=float, default=4 / 18.0,
                   help="groups/s each node publishes (default: the smollm2 preset, 4 a round of ~18 s)")
    p.add_argument("--envelope-bytes", type=int, default=5700, help="one signed group (smollm2: 4 x 96 tokens)")
    p.add_argument("--hop-ms", type=float, default=30.0, help="one hop's time (link + daemon), measured or assumed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    if not 1 <= args.conn_low <= args.conn_high or min(args.nodes) < 2:
        p.error("need 1 <= --conn-low <= --conn-high and every --nodes >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    print(f"{'N':>7} {'conns mean/max':>15} {'mesh':>5} {'hops mean/max':>14} {'reached':>8} {'copies':>7} "
          f"{'groups/s/node':>14} {'MB/s/node':>10} {'reach-all ms':>13}")
    for n in args.nodes:
        row = simulate(n, args.conn_low, args.conn_high, args.samples, args.seed)
        row.update(per_node_load(row, args.pace, args.envelope_bytes, args.hop_ms))
        rows.append(row)
        print(f"{n:>7} {row['connections_mean']:>9.1f}/{row['connections_max']:<5} {row['mesh_degree_mean']:>5.1f} "
              f"{row['hops_to_reach_all_mean']:>8.1f}/{row['hops_to_reach_all_max']:<5} "
              f"{row['reached_fraction_min']:>8.3f} {row['copies_per_delivery']:>7.2f} "
              f"{row['groups_per_s_per_node']:>14.1f} {row['bytes_per_s_per_node'] / 1e6:>10.2f} "
              f"{row['reach_all_ms']:>13.0f}")
    if args.json:
        write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
