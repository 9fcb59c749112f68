"""The figures of a scripts/bench/gossip/bench.py run, their ratios between variants, the tables and the
latency plot."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scripts.bench.gossip.swarm import fmt
from scripts.common import pyplot

# (label, path into a run's result, higher is better) of every figure compared across variants
FIGURES = [
    ("connections per node: mean", ("connections", "mean"), False),
    ("connections per node: max", ("connections", "max"), False),
    ("connections per node after the flood: max", ("connections_end", "max"), False),
    ("memory per node MiB (process + daemon): mean", ("connections", "rss_mb_mean"), False),
    ("idle: cores busy (all nodes)", ("idle", "cores_busy"), False),
    ("one at a time: reach-all p50 ms", ("latency_isolated", "reach_all_ms", "p50"), False),
    ("one at a time: reach-all p95 ms", ("latency_isolated", "reach_all_ms", "p95"), False),
    ("one at a time: delivery ratio", ("latency_isolated", "delivery_ratio"), True),
    ("one at a time: wire bytes per delivered token", ("latency_isolated", "wire_bytes_per_delivered_token"), False),
    ("one at a time: wire copies per delivery", ("latency_isolated", "wire_copies_per_delivery"), False),
    ("one at a time: CPU ms per delivered group", ("latency_isolated", "cpu_s_per_delivery"), False),
    ("burst: reach-all p50 ms", ("latency", "reach_all_ms", "p50"), False),
    ("burst: reach-all p95 ms", ("latency", "reach_all_ms", "p95"), False),
    ("burst: delivery ratio", ("latency", "delivery_ratio"), True),
    ("burst: wire bytes per delivered token", ("latency", "wire_bytes_per_delivered_token"), False),
    ("burst: wire copies per delivery", ("latency", "wire_copies_per_delivery"), False),
    ("burst: CPU ms per delivered group", ("latency", "cpu_s_per_delivery"), False),
    ("flood: delivery ratio", ("flood", "delivery_ratio"), True),
    ("flood: verified msgs/s (end to end)", ("flood", "ingest_msgs_per_s"), True),
    ("flood: transport arrivals msgs/s", ("flood", "transport_rx_msgs_per_s"), True),
    ("flood: Ingress msgs/s while busy", ("flood", "verify_msgs_per_s_busy"), True),
    ("flood: node 0 CPU ms per verified msg", ("flood", "cpu_s_target_per_verified"), False),
]
_SCALE = {"cpu_s_per_delivery": 1e3, "cpu_s_target_per_verified": 1e3}  # shown in ms
# the ratios reported for every figure: (name, numerator variant, denominator variant)
RATIOS = [("bounded/unbounded", "p2pd", "p2pd-unbounded"), ("bounded/py-libp2p", "p2pd", "libp2p")]


def figure(run: dict[str, Any] | None, path: tuple[str, ...]) -> float | None:
    value: Any = run
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    if not isinstance(value, (int, float)):
        return None
    return float(value) * _SCALE.get(path[-1], 1.0)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(results: list[dict[str, Any]], nodes: list[int]) -> dict[str, dict[str, dict[str, float | None]]]:
    """{ratio name: {N: {figure label: value}}} for every ratio whose two variants ran."""
    by_key = {(r["transport"], r["n"]): r for r in results}
    ran = {r["transport"] for r in results}
    return {name: {str(n): {label: ratio(figure(by_key.get((top, n)), path), figure(by_key.get((bottom, n)), path))
                            for label, path, _ in FIGURES} for n in nodes}
            for name, top, bottom in RATIOS if top in ran and bottom in ran}


def _digits(label: str) -> int:
    return 3 if "ratio" in label else (2 if "cores" in label or "CPU" in label or "copies" in label else 1)


def figures_table(results: list[dict[str, Any]], transports: list[str], n: int, console: Any) -> None:
    from rich.table import Table

    by_key = {(r["transport"], r["n"]): r for r in results}
    ratio_values = ratios(results, [n])
    table = Table(title=f"N = {n}: every figure per variant (127.0.0.1, one process per node)")
    table.add_column("figure")
    for t in transports:
        table.add_column(t, justify="right")
    for name in ratio_values:
        table.add_column(name, justify="right", style="bold")
    for label, path, _ in FIGURES:
        row = [label] + [fmt(figure(by_key.get((t, n)), path), _digits(label)) for t in transports]
        row += [fmt(values[str(n)][label], 2) for values in ratio_values.values()]
        table.add_row(*row)
    console.print(table)


def _problems(r: dict[str, Any]) -> str:
    found = []
    if r.get("error"):
        found.append(r["error"])
    if r.get("dead_before_shutdown"):
        found.append(f"dead before shutdown: {r['dead_before_shutdown']}")
    if (r.get("shutdown") or {}).get("killed"):
        found.append(f"killed after the shutdown timeout: {r['shutdown']['killed']}")
    tt = r.get("transport_totals") or {}
    if tt.get("dropped_inbound") or tt.get("dropped_outbound") or tt.get("bad_streams"):
        found.append(f"transport drops {tt}")
    for item in (r.get("log_findings") or {}).get("top", [])[:3]:
        found.append(f"log x{item['count']}: {item['message'][:100]}")
    return "; ".join(found)[:300]


def report(results: list[dict[str, Any]], transports: list[str], nodes: list[int], wire: dict[str, Any],
           micro: dict[str, Any], console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    for n in nodes:
        figures_table(results, transports, n, console)
    setup = Table(title="setup and problems")
    for col in ("variant", "N", "start s", "mesh+settle+warm-up s", "connections/node", "load 1m at start",
                "load 1m in burst", "wall s", "problems"):
        setup.add_column(col)
    for r in results:
        peers = r.get("peers_per_node") or []
        setup.add_row(r["transport"], str(r["n"]), fmt(r.get("start_s")), fmt(r.get("mesh_s")),
                      f"{min(peers)}-{max(peers)}" if peers else "-", fmt((r.get("loadavg_at_start") or [None])[0]),
                      fmt((r.get("latency") or {}).get("loadavg_1m")), fmt(r.get("wall_s")),
                      escape(_problems(r)) or "none")  # log lines hold [brackets]
    console.print(setup)
    console.print(f"one group on the wire: signed envelope {wire['envelope_bytes']:,} B for {wire['tokens']} tokens = "
                  f"{wire['envelope_bytes_per_token']:.1f} B/token before transport framing and gossip "
                  f"(JSON {wire['json_bytes']:,} B, ratio {wire['ratio_envelope_to_json']:.3f}); Ingress alone, one "
                  f"core, no network (protocol/bench.py): {fmt(micro.get('messages_per_s'), 0)} verified msgs/s",
                  highlight=False)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    transports = list(dict.fromkeys(r["transport"] for r in results))
    fig, axes = plt.subplots(1, len(transports), figsize=(7 * len(transports), 4.8), squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, transport in zip(axes[0], transports):
        for k, r in enumerate(x for x in results if x["transport"] == transport):
            for key, style, label in (("latency_isolated", "-", "one at a time"), ("latency", "--", "burst")):
                xs = (r.get(key) or {}).get("reach_all_samples_ms") or []
                if xs:
                    ys = [(j + 1) / len(xs) for j in range(len(xs))]
                    ax.step(xs, ys, style, color=colors[k % len(colors)], where="post",
                            label=f"N={r['n']} {label} ({len(xs)} msgs)")
        ax.axvline(250, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("publish -> verified by the LAST node (ms, log)")
        ax.set_title(f"{transport}: 8x64-token groups, one process per node, {os.cpu_count()} cores", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("fraction of groups")
    axes[0][0].set_ylim(0, 1.01)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
