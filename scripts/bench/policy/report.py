"""The report of scripts/bench/policy/bench.py: one console table and one PNG from its result dict."""
from __future__ import annotations

from pathlib import Path

from scripts.bench.policy.generation import median
from scripts.common import pyplot

COLORS = {"hf-fp32": "tab:blue", "hf-bf16": "tab:cyan", "hf-int8": "tab:purple", "vllm": "tab:green",
          "plain": "tab:gray", "trl": "tab:orange"}


def verdict(value: float, goal: float, higher: bool = True) -> str:
    met = value >= goal if higher else value <= goal
    return f"{'>=' if higher else '<='} {goal:g} ({'[green]met[/]' if met else '[red]missed[/]'})"


def generation_rows(gen: dict, goals: dict) -> list[tuple]:
    rows = []
    largest = max(gen["batches"], key=int)
    for batch, sides in gen["batches"].items():
        plain = sides["plain"]["tok_s_median"]
        for name, ratio in sides["ratio_vs_plain"].items():
            goal = verdict(ratio, goals["generation_vs_plain_at_64"]) if batch == largest else ""
            rows.append((f"(1) generate tok/s, batch {batch}: ours-{name} / plain fp32 generate",
                         f"{sides[name]['tok_s_median']:.1f}", f"{plain:.1f}", f"{ratio:.2f}", goal))
    for name, facts in (gen.get("precisions") or {}).items():
        rows.append((f"    {name}: mean |l - b| nats/token vs the fp32 learner; refresh s; weights MiB",
                     f"{facts['mean_abs_logp_diff']:.4f}", f"{facts['refresh_s']:.3f}", f"{facts['weights_mib']:.0f}", ""))
    if gen.get("vllm_start_s") is not None:
        rows.append(("    vLLM engine start s (once per node, excluded)", f"{gen['vllm_start_s']:.1f}", "", "", ""))
    variants = gen.get("decode_variants")
    if variants:
        ours = variants["sides"]["ours"]["tok_s_median"]
        for name, ratio in variants["ratio_vs_ours"].items():
            rows.append((f"    our {variants['precision']} sampler, batch {variants['rows']}: {name} / as it runs",
                         f"{variants['sides'][name]['tok_s_median']:.1f}", f"{ours:.1f}", f"{ratio:.2f}",
                         f"1st call {variants['first_call_s'][name]:.0f} s, new length "
                         f"{variants['new_prompt_length_s'][name]:.0f} s"))
    return rows


def training_rows(tr: dict, goals: dict) -> list[tuple]:
    ours, trl = tr["ours"], tr.get("trl")
    rows = [(f"(2) round tok/s wall: ours ({tr['backend']}, {tr.get('precision', '?')}, {tr.get('objective', '?')}) "
             "/ TRL step", f"{ours['tok_s_median']:.1f}", f"{trl['tok_s_median']:.1f}" if trl else "skipped",
             f"{tr['ratio']:.2f}" if trl else "-", verdict(tr["ratio"], goals["round_vs_trl"]) if trl else ""),
            ("    wall s per step", f"{ours['seconds_median']:.2f}", f"{trl['seconds_median']:.2f}" if trl else "-", "",
             f"{ours['tokens'][0]} tokens")]
    for phase, label in (("t_generate", "generate"), ("t_score", "score (reward)"),
                         ("t_train", "train (logp+backward+step+refresh)")):
        rows.append((f"      {label} wall s", f"{ours[phase + '_median']:.2f}",
                     f"{trl[phase + '_median']:.2f}" if trl else "-", "", ""))
    if tr.get("refresh_seconds"):
        rows.append(("    weight refresh s (per update)", f"{median(tr['refresh_seconds']):.3f}", "", "", ""))
    rows.append(("    reward mean (sanity)", f"{ours['reward_mean']:.3f}", f"{trl['reward_mean']:.3f}" if trl else "-",
                 "", ""))
    return rows


def memory_rows(memory: list[dict], goals: dict) -> list[tuple]:
    rows = []
    for probe in memory:
        label = f"(3) peak RSS MiB, our round alone ({probe['config']}, {probe['backend']}"
        if "error" in probe:
            rows.append((label + ")", "failed", "", "", probe["error"][:60]))
            continue
        split = (f" = trainer {probe['trainer_peak_rss_mib']:.0f} + vLLM {probe['server_peak_rss_mib']:.0f}"
                 if probe["server_peak_rss_mib"] else "")
        rows.append((f"{label}, {probe['precision']}, {probe['objective']}){split}", f"{probe['total_peak_rss_mib']:.0f}",
                     "", "", verdict(probe["total_peak_rss_mib"], goals["round_peak_rss_mib"], higher=False)))
    return rows


def print_report(result: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    cond = Table(title="measurement conditions", show_header=False, title_justify="left")
    cond.add_column(style="bold")
    cond.add_column()
    for key, value in result["conditions"].items():
        cond.add_row(key, escape(str(value)))
    console.print(cond)
    table = Table(title="bench_policy: side by side, same model and batch, medians", title_justify="left")
    for col in ("benchmark", "ours", "peer", "ours / peer", "goal"):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    goals = result["goals"]
    rows = generation_rows(result["generation"], goals) if result.get("generation") else []
    rows += training_rows(result["training"], goals) if result.get("training") else []
    rows += memory_rows(result["memory"], goals) if result.get("memory") else []
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if result.get("load_warning"):
        console.print(f"[yellow]{result['load_warning']}[/]")
    console.print(f"total wall time {result['total_wall_s']:.1f} s; wrote {result['json']} and {result['png']}")


def write_plot(result: dict, path: Path) -> None:
    plt = pyplot()
    gen, tr, memory = result.get("generation"), result.get("training"), result.get("memory")
    panels = [name for name, present in (("gen", gen), ("train", tr), ("split", tr), ("rss", memory)) if present]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    draw = {"gen": _generation_panel, "train": _training_panel, "split": _split_panel, "rss": _memory_panel}
    for ax, panel in zip(axes[0], panels):
        draw[panel](ax, result)
    c = result["conditions"]
    fig.suptitle(f"{c['model']} | {c['prompts x G x tokens']} | threads {c['torch threads']} | load {c['uptime load (start / end)']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _generation_panel(ax, result: dict) -> None:
    gen = result["generation"]
    batches = sorted(gen["batches"], key=int)
    names = [n for n in gen["batches"][batches[0]] if n != "ratio_vs_plain"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(batches))]
        values = [gen["batches"][b][name]["tok_s_median"] for b in batches]
        container = ax.bar(xs, values, width, color=COLORS.get(name, "black"),
                           label="plain fp32 generate" if name == "plain" else f"ours-{name}")
        ax.bar_label(container, fmt="%.0f", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_title("(1) generate tok/s (medians)", fontsize=10)
    ax.legend(fontsize=7)


def _training_panel(ax, result: dict) -> None:
    tr = result["training"]
    bars = [(f"ours ({tr.get('precision', tr['backend'])})", tr["ours"]["tok_s"], COLORS["hf-bf16"])]
    title = "(2) round tok/s"
    if tr.get("trl"):
        bars.append(("TRL GRPOTrainer", tr["trl"]["tok_s"], COLORS["trl"]))
        title += f": ratio {tr['ratio']:.2f} (goal {result['goals']['round_vs_trl']:g})"
    container = ax.bar([b[0] for b in bars], [median(b[1]) for b in bars], color=[b[2] for b in bars])
    ax.bar_label(container, fmt="%.1f", label_type="center", fontsize=9, color="white")
    for x, (_, values, _) in enumerate(bars):  # every measured step: shows the noise
        ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("completion tokens / wall s (bar: median, dots: runs)", fontsize=8)


def _split_panel(ax, result: dict) -> None:
    tr = result["training"]
    sides = [("ours", tr["ours"])] + ([("TRL", tr["trl"])] if tr.get("trl") else [])
    bottom = [0.0] * len(sides)
    for phase, color in (("t_generate", "tab:green"), ("t_score", "tab:purple"), ("t_train", "tab:red")):
        vals = [side[phase + "_median"] for _, side in sides]
        container = ax.bar([n for n, _ in sides], vals, bottom=bottom, color=color, label=phase[2:])
        ax.bar_label(container, labels=[f"{v:.1f}" if v >= 0.5 else "" for v in vals], label_type="center", fontsize=8)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("wall s per step by phase (medians)", fontsize=10)
    ax.legend(fontsize=8)


def _memory_panel(ax, result: dict) -> None:
    probes = [p for p in result["memory"] if "error" not in p]
    names = [f"{p['config']}\n{p['backend']}, {p['precision']}" for p in probes]
    trainer = [p["trainer_peak_rss_mib"] for p in probes]
    server = [p["server_peak_rss_mib"] for p in probes]
    container = ax.bar(names, trainer, color="tab:blue", label="trainer process")
    ax.bar_label(container, fmt="%.0f", label_type="center", color="white", fontsize=8)
    ax.bar(names, server, bottom=trainer, color="tab:green", label="vLLM processes")
    ax.axhline(result["goals"]["round_peak_rss_mib"], color="red", linestyle="--", label="goal")
    ax.set_title("(3) peak RSS MiB, our round alone", fontsize=10)
    ax.legend(fontsize=8)
