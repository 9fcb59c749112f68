"""What a round costs per mix, phase by phase (measured wall seconds on this machine), and what the
exchange verified for what it used: the table behind "a sharing round must cost less than a silo
round" (docs/benchmarks.md "What a sharing round costs").

Per mix, the mean over every honest node's rounds (each node's first WARMUP rounds left out: model
warm-up, the pool filling) of each phase of node/train/loop.py's row and each exchange phase of
node/peers/exchange.py's, and the round's time over the silo's (the mix with no external groups) when
the run has one. Wall seconds depend on the machine and its load: compare mixes of one run only.
"""
from __future__ import annotations

from pathlib import Path
from statistics import mean

from node.observe.metrics import read_metrics

WARMUP = 2
PHASES = ("t_generate", "t_score", "t_exchange", "t_train", "t_round")
EXCHANGE_PARTS = ("skim", "ingress", "precheck", "rebuild", "score", "retokenize", "tier", "publish", "hints")
COUNTS = ("generate_calls", "rollouts_generated", "external_received", "groups_verified", "groups_audited",
          "external_used", "messages_checked", "messages_skimmed", "messages_published", "hint_requests_served")


def round_costs(runs: list[dict]) -> list[dict]:
    """One row per mix: mean seconds per phase and counts per round, over every run (seed) of it."""
    by_mix: dict[str, list[dict]] = {}
    for run in runs:
        for node in run["nodes"]:
            by_mix.setdefault(run["mix"], []).extend(read_metrics(Path(node["run_dir"]))[WARMUP:])
    table = []
    for mix, rows in by_mix.items():
        if not rows:
            continue
        row = {"mix": mix, "rounds": len(rows)}
        for key in (*PHASES, *(f"t_exchange_{p}" for p in EXCHANGE_PARTS), *COUNTS):
            row[key] = mean(float(r.get(key) or 0.0) for r in rows)
        row["verified_per_used"] = row["groups_verified"] / row["external_used"] if row["external_used"] else None
        row["exchange_share"] = row["t_exchange"] / row["t_round"] if row["t_round"] else None
        table.append(row)
    silo = next((r for r in table if r["mix"].endswith("/0")), None)
    for row in table:
        row["round_vs_silo"] = row["t_round"] / silo["t_round"] if silo and silo["t_round"] else None
    return table


def round_cost_text(table: list[dict]) -> list[str]:
    if not table:
        return []
    lines = ["what a round costs (mean wall s per round on this machine; exchange parts below):",
             f"{'mix':>6} {'round':>8} {'vs silo':>8} {'generate':>9} {'calls':>6} {'exchange':>9} {'share':>6} "
             f"{'train':>8} {'received':>9} {'verified':>9} {'used':>5} {'verified/used':>14}"]
    for r in table:
        vs = "-" if r["round_vs_silo"] is None else f"{r['round_vs_silo']:.2f}x"
        share = "-" if r["exchange_share"] is None else f"{r['exchange_share']:.0%}"
        per_used = "-" if r["verified_per_used"] is None else f"{r['verified_per_used']:.2f}"
        lines.append(f"{r['mix']:>6} {r['t_round']:>8.4f} {vs:>8} {r['t_generate']:>9.4f} {r['generate_calls']:>6.2f} "
                     f"{r['t_exchange']:>9.4f} {share:>6} {r['t_train']:>8.4f} {r['external_received']:>9.1f} "
                     f"{r['groups_verified']:>9.1f} {r['external_used']:>5.1f} {per_used:>14}")
    for r in table:
        if r["t_exchange"]:
            lines.append(f"  {r['mix']} exchange: " + ", ".join(f"{p} {r[f't_exchange_{p}']:.4f}" for p in EXCHANGE_PARTS))
    return [*lines, ""]
