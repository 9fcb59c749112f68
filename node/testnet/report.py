"""The testnet report: per configuration and seed, what every honest node achieved and what crossed
the network; the SAPO table in miniature; plots (swarm vs silo reward and held-out pass rate, per
node, external groups per sender over time); the command that reproduces it."""
from __future__ import annotations

import json
import math
import tomllib
from collections import defaultdict
from pathlib import Path
from statistics import mean, pstdev

from node.observe.metrics import read_metrics
from node.observe.report import rolling_mean
from node.testnet.plan import halves
from node.testnet.report_clock import compute_table, compute_text, plot_heldout_vs_time, verdict_lines
from node.testnet.round_costs import round_cost_text, round_costs

SAPO_PAPER_GAIN = {"8/0": 0.0, "6/2": 0.52, "4/4": 0.94, "2/6": 0.68}  # cumulative reward vs 8/0, 8 x Qwen2.5-0.5B
INVALID_KINDS = {"forged", "tampered", "liar", "replay", "malformed", "oversized", "hint_leak"}


def specialty(node: dict) -> str | None:
    """The family a heterogeneous node draws most of its tasks from (its tasks.datasets override)."""
    for item in node.get("overrides", []):
        if item.startswith("tasks.datasets="):
            weights = tomllib.loads("v = " + item.split("=", 1)[1])["v"]
            main = max(weights, key=lambda name: weights[name])
            return main if weights[main] > 0.5 else None
    return None


def family_pass_rates(rows: list[dict], family: str | None) -> tuple[float | None, float | None]:
    """Pass rate on the node's own family and on the others over the last 20% of its rounds: what a
    specialist gives up (own) and gains (others) by training on its peers' groups."""
    if family is None:
        return None, None
    own, others = [], []
    for r in rows[-max(1, len(rows) // 5):]:
        for name, rate in r.get("pass_rate_by_dataset", {}).items():
            (own if name == family else others).append(rate)
    return (mean(own) if own else None), (mean(others) if others else None)


DIVERSITY_KEYS = ("entropy_mean", "distinct_completions", "flat_group_share")  # own rollouts, node/train/rollouts.py


def late_diversity(rows: list[dict]) -> dict:
    """Each of DIVERSITY_KEYS averaged over the node's last 20% of rounds (None where no round has a
    value: entropy with vLLM): does a node's sampling collapse (low entropy, many flat groups)?"""
    late = rows[-max(1, len(rows) // 5):]
    return {key: mean_of(late, key) for key in DIVERSITY_KEYS}


def node_summary(node: dict, hostile_ids: set[str], invalid_ids: set[str]) -> dict:
    rows = read_metrics(Path(node["run_dir"]))
    own_pass, others_pass = family_pass_rates(rows, specialty(node))
    # the compute clock's grid points (node/testnet/grid.py), else the rounds' own evaluations
    heldout = node.get("evals") or [r for r in rows if "heldout_pass1" in r]
    rollouts = sum(r.get("rollouts_generated", 0) for r in rows)
    correct = sum(r.get("correct_per_rollout", 0.0) * r.get("rollouts_generated", 0) for r in rows)
    wire_bytes = sum(r.get("wire_bytes", 0) for r in rows)
    wire_tokens = sum(r.get("wire_tokens", 0) for r in rows)
    used_by_sender: dict[str, int] = defaultdict(int)
    for r in rows:
        for sender, n in r.get("external_used_by_sender", {}).items():
            used_by_sender[sender] += n
    status = node.get("status") or {}
    return {
        "index": node["index"], "peer_id": node.get("peer_id"), "rounds": len(rows),
        "cumulative_reward": sum(r["reward_mean"] for r in rows),
        "final_heldout_pass1": heldout[-1]["heldout_pass1"] if heldout else None,
        "final_heldout_passk": heldout[-1].get("heldout_passk") if heldout else None,
        "accuracy_per_rollout": correct / rollouts if rollouts else None,
        "rollouts_generated": rollouts,
        "external_used": sum(r.get("external_used", 0) for r in rows),
        "used_from_hostile": sum(n for s, n in used_by_sender.items() if s in hostile_ids),
        "used_from_invalid": sum(n for s, n in used_by_sender.items() if s in invalid_ids),
        "wire_bytes_per_token": wire_bytes / wire_tokens if wire_tokens else None,
        "accepted": status.get("accepted"), "rejected_by_reason": status.get("rejected_by_reason", {}),
        "slowdown": node.get("slowdown", 1), "specialty": specialty(node),
        "own_family_pass": own_pass, "other_families_pass": others_pass, **late_diversity(rows),
    }


def mean_of(rows: list[dict], key: str) -> float | None:
    """Mean of `key` over the rows that have a value for it (None when none has)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return mean(values) if values else None


def run_summary(run: dict) -> dict:
    hostile_ids = {i for h in run.get("hostile", []) for i in h.get("identities", [])}
    invalid_ids = {i for h in run.get("hostile", []) if h.get("kind") in INVALID_KINDS for i in h.get("identities", [])}
    nodes = [node_summary(n, hostile_ids, invalid_ids) for n in run["nodes"]]
    return {
        "mix": run["mix"], "seed": run["seed"], "transport": run["transport"], "seconds": run["seconds"],
        "timed_out": run.get("timed_out", False), "events": run.get("events", []), "frozen": run.get("frozen", []),
        "hostile_kinds": sorted({h.get("kind") for h in run.get("hostile", [])}),
        "nodes": nodes,
        "cumulative_reward_per_node": mean(n["cumulative_reward"] for n in nodes) if nodes else 0.0,
        "final_heldout_pass1": mean_of(nodes, "final_heldout_pass1"),
        "accuracy_per_rollout": mean_of(nodes, "accuracy_per_rollout"),
        "rollouts_per_node": mean(n["rollouts_generated"] for n in nodes) if nodes else 0.0,
        "invalid_used": sum(n["used_from_invalid"] for n in nodes),
        "hostile_used": sum(n["used_from_hostile"] for n in nodes),
        "wire_bytes_per_token": mean_of(nodes, "wire_bytes_per_token"),
        "own_family_pass": mean_of(nodes, "own_family_pass"),
        "other_families_pass": mean_of(nodes, "other_families_pass"),
    }


def sapo_table(runs: list[dict]) -> list[dict]:
    """Per configuration: mean and spread over seeds, and the gain over the no-sharing configuration."""
    by_mix: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_mix[run["mix"]].append(run)
    silo = next((m for m in by_mix if m.endswith("/0")), None)
    silo_reward = mean(r["cumulative_reward_per_node"] for r in by_mix[silo]) if silo else None
    rows = []
    for mix, mine in by_mix.items():
        rewards = [r["cumulative_reward_per_node"] for r in mine]
        heldout = [r["final_heldout_pass1"] for r in mine if r["final_heldout_pass1"] is not None]
        reward = mean(rewards)
        rows.append({"mix": mix, "seeds": len(mine), "cumulative_reward": reward, "cumulative_reward_std": pstdev(rewards),
                     "rollouts_per_node": mean(r["rollouts_per_node"] for r in mine),
                     "final_heldout_pass1": mean(heldout) if heldout else None,
                     "final_heldout_pass1_std": pstdev(heldout) if heldout else None,
                     "gain_vs_silo": (reward / silo_reward - 1) if silo_reward else None,
                     "paper_gain": SAPO_PAPER_GAIN.get(mix),
                     **{key: mean_of(mine, key) for key in ("own_family_pass", "other_families_pass")}})
    return rows


def text_summary(report: dict) -> str:
    lines = [f"testnet: {report['plan']['nodes']} nodes, {report['plan']['rounds']} rounds, preset "
             f"{report['plan']['preset']}, transport {report['plan']['transport']}",
             f"reproduce: {report['command']}", ""]
    if "compute" in report:  # mixes at equal compute replace the equal-rounds table
        lines += [*compute_text(report["compute"]), ""]
    else:
        lines += _rounds_table(report)
    lines += round_cost_text(report.get("round_costs", []))
    for run in report["runs"]:
        head = f"[{run['mix']} seed {run['seed']}] {run['seconds']:.0f} s" + (" TIMED OUT" if run["timed_out"] else "")
        if run["hostile_kinds"]:
            head += f"; hostile {','.join(run['hostile_kinds'])}: honest nodes trained {run['invalid_used']} groups " \
                    f"from invalid senders, {run['hostile_used']} from hostile ones in all"
        lines.append(head)
        for event in run["events"]:
            lines.append(f"    {event}")
        if run["frozen"]:
            lines.append(f"  frozen peers (never updated, the only peers the nodes below hear; not in any table): "
                         f"{', '.join(f'node{i}' for i in run['frozen'])}")
        for n in run["nodes"]:
            rejected = ", ".join(f"{k}={v}" for k, v in sorted(n["rejected_by_reason"].items())) or "none"
            heldout = "-" if n["final_heldout_pass1"] is None else f"{n['final_heldout_pass1']:.2f}"
            acc = "-" if n["accuracy_per_rollout"] is None else f"{n['accuracy_per_rollout']:.3f}"
            bpt = "-" if n["wire_bytes_per_token"] is None else f"{n['wire_bytes_per_token']:.0f}"
            lines.append(f"  node{n['index']}: {n['rounds']} rounds, cum. reward {n['cumulative_reward']:.1f}, held-out "
                         f"{heldout}, acc/rollout {acc}, ext used {n['external_used']}, accepted {n['accepted']}, "
                         f"bytes/token {bpt}, {_diversity_text(n)}, rejected: {rejected}")
    if "compute" in report:
        lines += ["", *verdict_lines(report["compute"])]
    return "\n".join(lines) + "\n"


def _diversity_text(n: dict) -> str:
    """The node's own sampling over its last 20% of rounds (late_diversity), "-" where unmeasured."""
    def fmt(key: str, spec: str) -> str:
        return "-" if n.get(key) is None else format(n[key], spec)

    return (f"last 20%: entropy {fmt('entropy_mean', '.3f')} nats, distinct/group "
            f"{fmt('distinct_completions', '.2f')}, flat groups {fmt('flat_group_share', '.0%')}")


def _rounds_table(report: dict) -> list[str]:
    """The SAPO table of a rounds-clock run: every node ran the same number of rounds."""
    lines = [f"{'mix':>6} {'seeds':>5} {'cum. reward/node':>20} {'held-out pass@1':>18} {'gain vs silo':>13} "
             f"{'paper':>7} {'rollouts/node':>14} {'own/other families':>19}"]
    for row in report["table"]:
        heldout = "-" if row["final_heldout_pass1"] is None else \
            f"{row['final_heldout_pass1']:.3f} ± {row['final_heldout_pass1_std']:.3f}"
        gain = "-" if row["gain_vs_silo"] is None else f"{row['gain_vs_silo']:+.1%}"
        paper = "-" if row["paper_gain"] is None else f"{row['paper_gain']:+.0%}"
        families = "-" if row.get("own_family_pass") is None else \
            f"{row['own_family_pass']:.3f} / {row['other_families_pass'] or 0:.3f}"
        lines.append(f"{row['mix']:>6} {row['seeds']:>5} {row['cumulative_reward']:>11.1f} ± "
                     f"{row['cumulative_reward_std']:<6.1f} {heldout:>18} {gain:>13} {paper:>7} "
                     f"{row['rollouts_per_node']:>14.0f} {families:>19}")
    if any(row.get("own_family_pass") is not None for row in report["table"]):
        lines.append("own/other families: specialists' pass rate on their own family and on the others, last 20% "
                     "of rounds")
    return [*lines, ""]


def plot(report: dict, runs_raw: list[dict], path: Path) -> None:
    import matplotlib  # about 0.5 s: the plot's alone, not the report's readers'

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use('Agg'): no display is looked for

    compute = report.get("compute")
    fig, axes = plt.subplots(2, 3 if compute else 2, figsize=(19 if compute else 13, 8))
    if compute:
        plot_heldout_vs_time(axes[0][2], compute)
        axes[1][2].axis("off")
    by_mix: dict[str, list[dict]] = defaultdict(list)
    for run in runs_raw:
        by_mix[run["mix"]].append(run)
    for i, (mix, mine) in enumerate(by_mix.items()):
        curves, heldouts = [], []
        for run in mine:
            for node in run["nodes"]:
                rows = read_metrics(Path(node["run_dir"]))
                curves.append([r["reward_mean"] for r in rows])
                evals = node.get("evals") or [r for r in rows if "heldout_pass1" in r]  # grid points carry "round"
                heldouts.append([(r["round"], r["heldout_pass1"]) for r in evals])
        n = min(len(c) for c in curves) if curves else 0
        if n:
            avg = [mean(c[t] for c in curves) for t in range(n)]
            axes[0][0].plot(range(n), rolling_mean(avg, max(1, n // 20)), color=f"C{i}", label=mix)
        points: dict[int, list[float]] = defaultdict(list)
        for h in heldouts:
            for rnd, value in h:
                points[rnd].append(value)
        if points:
            xs = sorted(points)
            axes[0][1].plot(xs, [mean(points[x]) for x in xs], marker="o", color=f"C{i}", label=mix)
    axes[0][0].set(title="reward (mean over nodes and seeds)", xlabel="round", ylim=(-0.02, 1.02))
    axes[0][1].set(title="held-out pass@1 (mean over nodes and seeds)", xlabel="round", ylim=(-0.02, 1.02))
    first = runs_raw[-1]
    for node in first["nodes"]:
        rows = read_metrics(Path(node["run_dir"]))
        values = [r["reward_mean"] for r in rows]
        axes[1][0].plot([r["round"] for r in rows], rolling_mean(values, max(1, len(values) // 20)),
                        label=f"node{node['index']}" + (" (slow)" if node.get("slowdown", 1) > 1 else ""))
    axes[1][0].set(title=f"per node reward [{first['mix']} seed {first['seed']}]", xlabel="round", ylim=(-0.02, 1.02))
    _plot_senders(axes[1][1], first)
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_senders(ax, run: dict) -> None:
    """External groups node0 trained on per round, one line per sender: solid for senders in node0's
    half of the swarm, dashed for the other half (a partition shows as the dashed lines dropping
    to 0, its healing as them coming back)."""
    ids = {n["peer_id"]: n["index"] for n in run["nodes"] + run.get("frozen_nodes", []) if n.get("peer_id")}
    a, _ = halves(len(run["nodes"]))
    rows = read_metrics(Path(run["nodes"][0]["run_dir"]))
    x = [r["round"] for r in rows]
    w = max(1, len(x) // 40)
    for peer_id, index in sorted(ids.items(), key=lambda item: item[1]):
        if index == 0:
            continue
        counts = [r.get("external_used_by_sender", {}).get(peer_id, 0) for r in rows]
        ax.plot(x, rolling_mean(counts, w), ls="-" if index in a else "--", label=f"from node{index}")
    for event in run.get("events", []):
        if "partition" in event.get("event", "") or "healed" in event.get("event", ""):
            at = event.get("rounds", {}).get("0", event.get("clock", event.get("tick", 0)))  # node0's own round
            ax.axvline(at, color="grey", lw=0.8)
    ax.set(title=f"node0: peer groups trained per round, by sender [{run['mix']} seed {run['seed']}]",
           xlabel="round")


def measured(run: dict) -> dict:
    """The run without its frozen peers (--frozen-peers): they are the instrument, not what is measured."""
    frozen = set(run.get("frozen", []))
    if not frozen:
        return run
    return {**run, "nodes": [n for n in run["nodes"] if n["index"] not in frozen],
            "frozen_nodes": [n for n in run["nodes"] if n["index"] in frozen]}  # still senders in the plot


def write_report(out: Path, plan_json: dict, command: str, runs_raw: list[dict]) -> tuple[Path, Path, str]:
    runs_raw = [measured(r) for r in runs_raw]
    runs = [run_summary(r) for r in runs_raw]
    report = {"plan": plan_json, "command": command, "runs": runs, "table": sapo_table(runs),
              "round_costs": round_costs(runs_raw)}
    if runs_raw and all(r.get("clock") == "compute" for r in runs_raw):
        report["compute"] = compute_table(runs_raw)
    out.mkdir(parents=True, exist_ok=True)
    (out / "testnet.json").write_text(json.dumps(report, indent=1, default=_json_default))
    text = text_summary(report)
    (out / "summary.txt").write_text(text)
    png = out / "testnet.png"
    plot(report, runs_raw, png)
    return out / "testnet.json", png, text


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
