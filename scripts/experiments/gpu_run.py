"""The swarm against the silo on a real model, sized for one GPU: `scripts/gpu_run.sh`.

    scripts/gpu_run.sh            # a CUDA machine: SmolLM2, 4 nodes, 8/0 vs 4/4, 3 paired seeds, 8 minutes
    scripts/gpu_run.sh --smoke    # anywhere: the tiny preset, 2 nodes, 1 seed, seconds

Every (arm, seed) is one in-process memory testnet (node/testnet/memory.py) in its own OS process, all of
them at once on the one GPU (a CUDA context each: generation of one run overlaps training of another).
Each runs on the compute clock (node/testnet/clock.py): every node is charged its generation, training
and exchange work on the preset's device profile, so the virtual budget, and what it buys, is the same
on any machine; held-out pass@1 is measured on one virtual-time grid shared by every run
(node/testnet/grid.py). The budget is --rounds nominal silo rounds (a round generating and training
max_new_tokens for every rollout; real completions are shorter, so a node runs more).

At the wall deadline (--minutes) a run still going is stopped (its process, by id) and reported as cut:
its rounds still count in the per-phase seconds, not in the held-out table.

Writes <out>/gpu_run.json and gpu_run.png: per arm and seed the held-out pass@1 at the budget, the
paired difference 4/4 - 8/0 per seed, rollouts generated, peer groups used and their share correct; the
per-phase seconds (generate, score, exchange, train; eval per grid point) of every node-round, and their
means per arm. It installs nothing, needs neither hivemind nor grpcio-tools (the memory transport), and
ends by printing what it could not do (no GPU, no matplotlib, runs cut at the deadline).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import platform
import time
from pathlib import Path
from statistics import mean

from scripts.common import arg_parser, command_line, pyplot, runs_dir, write_json

ARMS = {"silo": (8, 0), "swarm": (4, 4)}  # the silo trains 8 own groups; a swarm node 4 own + 4 peers'
PHASES = ("t_generate", "t_score", "t_exchange", "t_train")
# No checkpoints (a 0.5 GB float32 save per node-round would be most of a GPU round). The two-family smollm2
# preset, sized for a GPU round: 8 prompts x 8 samples x up to 64 tokens a silo node-round, the grid every 4
# nominal silo rounds on 16 tasks per family; smollm2-arith runs as the preset says.
NO_CHECKPOINTS = ["run.checkpoint_every=100000"]
GPU_SET = {"smollm2": [*NO_CHECKPOINTS, "sampling.group_size=8", "sampling.max_new_tokens=64", "eval.every=4",
                       "eval.tasks_per_family=16", "optim.lr=1e-5"],
           "smollm2-arith": [*NO_CHECKPOINTS, "eval.every=4"]}
SMOKE_SET = [*NO_CHECKPOINTS, "eval.every=2", "eval.tasks_per_family=4"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = arg_parser(__spec__, __doc__)
    parser.add_argument("--smoke", "--quick", dest="smoke", action="store_true",
                        help="the tiny preset, 2 nodes, 1 seed, 4 rounds (seconds)")
    parser.add_argument("--preset", default=None, help="default smollm2 (tiny with --smoke); e.g. smollm2-arith")
    parser.add_argument("--nodes", type=int, default=None, help="nodes per testnet (default 4; 2 with --smoke)")
    parser.add_argument("--seeds", type=int, default=None, help="paired seeds per arm (default 3; 1 with --smoke)")
    parser.add_argument("--rounds", type=float, default=None, help="the budget in nominal silo rounds (default 12)")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall deadline for all runs together")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="a config override (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="default runs/gpu_run (runs/gpu_run-smoke)")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.preset = args.preset or ("tiny" if smoke else "smollm2")
    args.nodes = args.nodes or (2 if smoke else 4)
    args.seeds = args.seeds or (1 if smoke else 3)
    args.rounds = args.rounds or (4 if smoke else 12)
    args.out = args.out or runs_dir("gpu_run-smoke" if smoke else "gpu_run")
    if args.nodes < 2:
        parser.error("--nodes must be at least 2: a swarm node needs a peer")
    return args


# -- one run (in its own process) -----------------------------------------------------------------
def run_testnet(job: dict) -> None:
    """One memory testnet of one arm and seed; its result JSON lands in job["dir"]/result.json."""
    import torch

    from node.testnet.memory import MemoryTestnet

    torch.set_num_threads(job["threads"])
    plan = make_plan(job)
    result = MemoryTestnet(plan, tuple(job["mix"]), job["seed"], Path(job["dir"]), None, budget_s=job["budget"]).run()
    write_json(Path(job["dir"]) / "result.json", result)


def make_plan(job: dict):
    from node.testnet.plan import Plan

    plan = Plan(nodes=job["nodes"], rounds=100_000, preset=job["preset"], mixes=[tuple(m) for m in job["mixes"]],
                transport="memory", heterogeneous=False, overrides=job["overrides"], out=Path(job["dir"]).parent,
                clock="compute", budget_s=job["budget"], grid_s=job["grid"])
    plan.validate()
    return plan


def budget_and_grid(args, overrides: list[str]) -> tuple[float, float]:
    """(budget, grid spacing) in virtual seconds: --rounds and eval.every nominal silo rounds."""
    from node.config.schema import load_config
    from node.testnet.grid import grid_spacing
    from node.testnet.plan import Plan

    plan = Plan(preset=args.preset, mixes=list(ARMS.values()), overrides=overrides, clock="compute")
    every = load_config(args.preset, None, overrides).eval.every
    spacing = grid_spacing(plan)
    nominal = spacing / every
    return args.rounds * nominal, spacing


# -- launching ---------------------------------------------------------------------------------------
def jobs_for(args, device: str) -> list[dict]:
    preset_set = SMOKE_SET if args.smoke else GPU_SET.get(args.preset, NO_CHECKPOINTS)
    overrides = [*preset_set, f"model.device={device}", *args.extra]
    budget, grid = budget_and_grid(args, overrides)
    threads = 1 if device == "cuda" else max(1, (multiprocessing.cpu_count() or 2) // (len(ARMS) * args.seeds))
    return [{"arm": arm, "mix": mix, "mixes": list(ARMS.values()), "seed": seed, "preset": args.preset,
             "nodes": args.nodes, "overrides": overrides, "budget": budget, "grid": grid, "threads": threads,
             "dir": str(Path(args.out) / arm / f"seed{seed}")}
            for seed in range(args.seeds) for arm, mix in ARMS.items()]


def prepare_model(job: dict) -> float:
    """Loads the policy once before the runs start (SmolLM2: converts the GGUF into the cache once,
    instead of in every process at once); returns the seconds it took."""
    from node.config.schema import load_config
    from policy.models import load_policy

    started = time.monotonic()
    cfg = load_config(job["preset"], None, [*job["overrides"], "model.device=cpu"])
    load_policy(cfg.model)
    return time.monotonic() - started


def run_all(jobs: list[dict], minutes: float) -> dict[str, str]:
    """Every job in its own process at once; at the deadline the ones still going are stopped.
    Returns each run's state: done, failed (exit code) or cut."""
    import shutil

    from node.testnet.dashboard import Dashboard
    from node.testnet.parallel import progress_row

    context = multiprocessing.get_context("spawn")
    procs = {}
    for job in jobs:
        shutil.rmtree(job["dir"], ignore_errors=True)  # a run is never resumed from another's checkpoints
        Path(job["dir"]).mkdir(parents=True)
        procs[label(job)] = (job, context.Process(target=run_testnet, args=(job,), name=label(job)))
        procs[label(job)][1].start()
    deadline = time.monotonic() + minutes * 60
    with Dashboard(f"gpu_run: {len(jobs)} testnets at once, deadline {minutes:g} min") as dashboard:
        while any(p.is_alive() for _, p in procs.values()) and time.monotonic() < deadline:
            time.sleep(1.0)
            dashboard.update([progress_row(name, Path(job["dir"]), "running" if p.is_alive() else "done", None)
                              for name, (job, p) in procs.items()])
    states = {}
    for name, (job, proc) in procs.items():
        if proc.is_alive():
            proc.terminate()  # our own child, by its pid
            proc.join(30)
            states[name] = "cut"
        else:
            proc.join()
            states[name] = "done" if proc.exitcode == 0 and (Path(job["dir"]) / "result.json").is_file() \
                else f"failed (exit {proc.exitcode})"
    return states


def label(job: dict) -> str:
    return f"{job['arm']}/seed{job['seed']}"


# -- figures -------------------------------------------------------------------------------------------
def phase_rows(job: dict) -> list[dict]:
    """Every node-round of a run (finished or cut) with its per-phase seconds, from the metrics files."""
    from node.observe.metrics import read_metrics

    rows = []
    for node_dir in sorted(Path(job["dir"]).glob("node*")):
        for r in read_metrics(node_dir):
            rows.append({"node": node_dir.name, "round": r["round"], "vtime": r.get("vtime"),
                         **{k: r.get(k, 0.0) for k in (*PHASES, "t_round")},
                         "rollouts": r.get("rollouts_generated", 0), "peer_groups_used": r.get("external_used", 0),
                         "peer_samples_used": r.get("external_samples_used", 0),
                         "peer_correct_used": r.get("external_correct_used", 0)})
    return rows


def eval_seconds(result: dict | None) -> list[float]:
    """Seconds of every held-out evaluation on the grid (one per distinct weights a node had)."""
    if result is None:
        return []
    return [e["t_eval"] for node in result["nodes"] for e in node.get("evals", []) if e.get("t_eval") is not None]


def work_figures(rows: list[dict]) -> dict:
    """Node-rounds, rollouts, peer groups used and their share correct, mean seconds per phase: of
    one run's rows or of an arm's."""
    samples = sum(r["peer_samples_used"] for r in rows)
    return {"node_rounds": len(rows), "rollouts": sum(r["rollouts"] for r in rows),
            "peer_groups_used": sum(r["peer_groups_used"] for r in rows),
            "peer_share_correct": sum(r["peer_correct_used"] for r in rows) / samples if samples else None,
            "phases_mean_s": {k: mean(r[k] for r in rows) if rows else None for k in (*PHASES, "t_round")}}


def run_summary(job: dict, state: str) -> dict:
    """One run: its held-out figures (finished runs), its work and its per-phase seconds."""
    from scripts.experiments.skeptic import run_figures

    result_path = Path(job["dir"]) / "result.json"
    result = json.loads(result_path.read_text()) if state == "done" else None
    rows = phase_rows(job)
    out = {"arm": job["arm"], "seed": job["seed"], "state": state, **work_figures(rows),
           "eval_s": eval_seconds(result), "rows": rows, "grid_reached": grid_reached(job)}
    if result is not None:
        figures = run_figures(result)
        out.update(heldout=figures["heldout"], heldout_start=figures["curve"]["heldout"][0], auc=figures["auc"],
                   curve=figures["curve"], train_reward=figures["train_reward"], wall_s=result["seconds"],
                   **passk_at_ends(result))
    return out


def grid_reached(job: dict) -> list[list[float]]:
    """[virtual time, held-out pass@1 mean over nodes] at every grid instant ALL the run's nodes reached, from
    the evaluations the testnet writes as they happen (node/testnet/memory.py GRID_EVALS): a run cut at the
    deadline still says how far it got and what it measured on the way."""
    from node.testnet.memory import GRID_EVALS

    tracks = [json.loads(p.read_text()) for p in sorted(Path(job["dir"]).glob(f"node*/{GRID_EVALS}"))]
    if len(tracks) < job["nodes"] or not all(tracks):
        return []
    common = sorted(set.intersection(*({e["vtime"] for e in track} for track in tracks)))
    return [[t, mean(next(e["heldout_pass1"] for e in track if e["vtime"] == t) for track in tracks)] for t in common]


def passk_at_ends(result: dict) -> dict:
    """Held-out pass@k (eval.k samples at the sampling temperature) before training and at the budget,
    means over the run's nodes; absent where the evaluations measured no pass@k."""
    from node.testnet.report import measured

    ends = [(node["evals"][0].get("heldout_passk"), node["evals"][-1].get("heldout_passk"))
            for node in measured(result)["nodes"] if node.get("evals")]
    if not ends or any(v is None for pair in ends for v in pair):
        return {}
    return {"passk_start": mean(a for a, _ in ends), "passk": mean(b for _, b in ends),
            "k": result["nodes"][0]["evals"][-1].get("heldout_k")}


def summarise(runs: list[dict], seeds: int) -> dict:
    """Per arm: held-out at the budget, the paired 4/4 - 8/0 difference per seed, work and phases."""
    from node.testnet.stats import paired_comparison

    arms = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        rows = [row for r in mine for row in r["rows"]]
        done = [r for r in mine if "heldout" in r]
        arms[arm] = {"mix": "/".join(map(str, ARMS[arm])), "runs_done": len(done), "runs": len(mine),
                     "heldout_mean": mean(r["heldout"] for r in done) if done else None, **work_figures(rows),
                     "eval_mean_s": mean(s for r in mine for s in r["eval_s"]) if any(r["eval_s"] for r in mine) else None}
    both = [s for s in range(seeds) if all(any(r["seed"] == s and r["arm"] == a and "heldout" in r for r in runs)
                                           for a in ARMS)]
    pick = {(r["arm"], r["seed"]): r for r in runs}

    def paired(key: str) -> dict | None:
        if not both or any(key not in pick[(a, s)] for a in ARMS for s in both):
            return None
        return paired_comparison([pick[("swarm", s)][key] for s in both], [pick[("silo", s)][key] for s in both])

    return {"arms": arms, "paired_seeds": both, "swarm_minus_silo": paired("heldout"),
            "swarm_minus_silo_passk": paired("passk"), "reached": reached_comparison(runs, seeds)}


def reached_comparison(runs: list[dict], seeds: int) -> dict | None:
    """Where runs were cut: per seed, held-out of both arms at the last grid instant both reached, paired."""
    from node.testnet.stats import paired_comparison

    pick = {(r["arm"], r["seed"]): dict(map(tuple, r["grid_reached"])) for r in runs}
    at = {}
    for s in range(seeds):
        shared = set(pick.get(("silo", s), {})) & set(pick.get(("swarm", s), {}))
        if len(shared) > 1:  # more than the start
            at[s] = max(shared)
    if not at:
        return None
    swarm, silo = [pick[("swarm", s)][t] for s, t in at.items()], [pick[("silo", s)][t] for s, t in at.items()]
    return {"seeds": list(at), "vtime": list(at.values()), "swarm": swarm, "silo": silo,
            "swarm_minus_silo": paired_comparison(swarm, silo) if len(at) > 1 else None}


# -- output ----------------------------------------------------------------------------------------------
def plot(result: dict, path: Path) -> None:
    """Left: held-out pass@1 on the virtual-time grid, each run; right: mean seconds per node-round by phase."""
    plt = pyplot()
    fig, (curves, phases) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"silo": "tab:gray", "swarm": "tab:blue"}
    for run in result["runs"]:
        if "curve" in run:
            curves.plot(run["curve"]["t"], run["curve"]["heldout"], color=colors[run["arm"]], alpha=0.8,
                        label=f"{run['arm']} {ARMS[run['arm']][0]}/{ARMS[run['arm']][1]}" if run["seed"] == 0 else None)
    curves.set(xlabel="virtual seconds (compute clock)", ylabel="held-out pass@1", title="held-out, every run")
    if any("curve" in run for run in result["runs"]):
        curves.legend()
    else:
        curves.text(0.5, 0.5, "no run reached its budget\n(cut at the deadline or failed)", ha="center",
                    va="center", transform=curves.transAxes)
    names = list(result["arms"])
    bottom = [0.0] * len(names)
    for phase in PHASES:
        heights = [result["arms"][a]["phases_mean_s"][phase] or 0.0 for a in names]
        phases.bar(names, heights, bottom=bottom, label=phase.removeprefix("t_"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    phases.set(ylabel="seconds per node-round (wall)", title=f"phases on {result['device']}")
    phases.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_lines(result: dict) -> list[str]:
    from node.testnet.stats import format_interval

    def num(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"device: {result['device']}; budget {result['budget_s']:.1f} virtual s ({result['rounds']:g} nominal "
             f"silo rounds), {result['nodes']} nodes, wall {result['wall_s']:.0f} s"]
    for run in result["runs"]:
        grid = run.get("grid_reached") or []
        held = (f"held-out {num(run.get('heldout_start'))} -> {num(run.get('heldout'))} (pass@k "
                f"{num(run.get('passk_start'))} -> {num(run.get('passk'))})" if "heldout" in run else
                f"held-out {num(grid[0][1])} -> {num(grid[-1][1])} at {grid[-1][0]:.0f} virtual s (reached)" if grid
                else "held-out -")
        lines.append(f"  {run['arm']:5} seed {run['seed']}: {run['state']:5} {held}"
                     f", {run['node_rounds']} node-rounds, {run['rollouts']} rollouts, "
                     f"peer groups used {run['peer_groups_used']} ({num(run['peer_share_correct'], 2)} correct)")
    for arm, a in result["arms"].items():
        phases = ", ".join(f"{k.removeprefix('t_')} {num(v, 2)}" for k, v in a["phases_mean_s"].items())
        lines.append(f"  {arm} {a['mix']}: seconds per node-round: {phases}; eval {num(a['eval_mean_s'], 2)} per grid point")
    if result["swarm_minus_silo"] is not None:
        diffs = ", ".join(f"{d:+.3f}" for d in result["swarm_minus_silo"]["diffs"])
        lines.append(f"  held-out 4/4 - 8/0 at the budget: {format_interval(result['swarm_minus_silo'])}; per seed {diffs}")
    reached = result.get("reached")
    if reached is not None and result["swarm_minus_silo"] is None:
        pairs = ", ".join(f"seed {s} at {t:.0f} s: {a:.3f} vs {b:.3f}" for s, t, a, b in
                          zip(reached["seeds"], reached["vtime"], reached["swarm"], reached["silo"]))
        lines.append(f"  cut runs, held-out 4/4 vs 8/0 at the last grid point both reached: {pairs}")
        if reached["swarm_minus_silo"] is not None:
            lines.append(f"    4/4 - 8/0 there: {format_interval(reached['swarm_minus_silo'])}")
    if result.get("swarm_minus_silo_passk") is not None:
        lines.append(f"  held-out pass@k 4/4 - 8/0 at the budget: {format_interval(result['swarm_minus_silo_passk'])}")
    return lines


def limits(args, device: str, states: dict[str, str]) -> list[str]:
    """What this run could not do, said plainly."""
    out = []
    if device != "cuda":
        out.append("no CUDA GPU seen by torch: ran on the CPU" + (" (smoke mode)" if args.smoke else ""))
    cut = [name for name, state in states.items() if state == "cut"]
    if cut:
        out.append(f"{len(cut)} run(s) cut at the {args.minutes:g}-minute deadline (no held-out figure): {', '.join(cut)}")
    out += [f"{name} {state}: see its node logs" for name, state in states.items() if state.startswith("failed")]
    if importlib.util.find_spec("matplotlib") is None:
        out.append("matplotlib not installed: no PNG")
    return out


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    jobs = jobs_for(args, device)
    load_s = prepare_model(jobs[0])
    started = time.monotonic()
    states = run_all(jobs, args.minutes)
    runs = [run_summary(job, states[label(job)]) for job in jobs]
    result = {"command": command_line(__spec__, argv), "device": name, "preset": args.preset, "nodes": args.nodes,
              "rounds": args.rounds, "budget_s": jobs[0]["budget"], "grid_s": jobs[0]["grid"],
              "overrides": jobs[0]["overrides"], "wall_s": time.monotonic() - started, "model_load_s": load_s,
              **summarise(runs, args.seeds), "runs": runs}
    result["could_not"] = limits(args, device, states)
    write_json(Path(args.out) / "gpu_run.json", result)
    if not any("matplotlib" in line for line in result["could_not"]):
        plot(result, Path(args.out) / "gpu_run.png")
    print("\n".join(report_lines(result)))
    print("could not do: " + ("; ".join(result["could_not"]) or "nothing"))
    print(f"wrote {Path(args.out) / 'gpu_run.json'}")
    return result


if __name__ == "__main__":
    main()
