"""Issue 31, "an honest peer is always heard": two default `swarm-node join` nodes on p2pd
(127.0.0.1, preset tiny, started as docs/joining-a-swarm.md says) and a flood of valid, unique,
trainable groups from many keys.

A runs unpaced; B is paced to one round a second (`--set swarm.min_round_s=1.0`) and dials A.
Both learn at optim.lr 2e-5 (LEARNING_SETS; `--node-set` replaces it): at the preset's 1e-3 the
unpaced node answers deterministically within a minute and has no group with reward variance left
to share, which would measure its entropy collapse rather than the receiver's ingest.
After a warm-up (both have verified a message of the other, bounded), phase "quiet" runs with
nobody else, then phase "flood" with --procs attacker processes (node/hostile/flood_origins.py)
running --keys keys between them, each key its own libp2p host (so GossipSub's `from` is that key)
sending --rate valid groups a second, dialing both nodes. Both nodes' status is polled every
second and their metrics.jsonl tailed (node/labs/honest_heard.py). Figures, per node and phase:

  honest_trained_fraction    rounds in which the honest peer's groups were trained (>= 0.9 wanted
                             at B, in both phases)
  honest_trained_seconds     the same per second (>= 0.9 wanted at A, in both phases: A runs more
                             rounds a second than B can send groups, at most 10 messages/s)
  honest_verified_seconds    1-s intervals in which the node verified a message of the honest peer
                             (1.0 wanted under the flood, from --settle-s after its start)
  attacker_share             groups trained from anyone but the honest peer, over all groups
                             trained, during the flood (<= swarm.admission.young_share_max wanted)
  establishment              attacker keys established, and when, against swarm.admission.young_seconds and
                             swarm.admission.establish_interval_s (after the first key, at most one key per
                             interval; no key sooner than young_seconds after it was first seen)

    .venv/bin/python -m scripts.experiments.honest_heard           # 120 s + 120 s, 32 keys x 60 msg/s, 4 processes
    .venv/bin/python -m scripts.experiments.honest_heard --smoke   # 25 s + 25 s, 4 keys x 10 msg/s, 2 processes

Writes <out>/exp_honest_heard.json and .png (default out runs/exp-honest-heard), the nodes' run
dirs and logs and the attackers' summaries beside them. The JSON's "acceptance" names each check
(null: not measurable, "missing" says why) and "machine" the CPU the figures came from. Exit
status 0 whatever the figures (a measurement), 1 with --check when a check fails, 2 on a setup error.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path

from node.labs.honest_heard_run import LEARNING_SETS
from scripts.common import arg_parser, command_line, console as make_console, pyplot, runs_dir, write_result

SMOKE = {"quiet_s": 25.0, "flood_s": 25.0, "keys": 4, "procs": 2, "rate": 10.0}
FULL = {"quiet_s": 120.0, "flood_s": 120.0, "keys": 32, "procs": 4, "rate": 60.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--smoke", "--quick", action="store_true", dest="smoke",
                   help=f"seconds-long run: {SMOKE} (explicit options still win)")
    p.add_argument("--quiet-s", type=float, help=f"phase 1 seconds (default {FULL['quiet_s']:.0f})")
    p.add_argument("--flood-s", type=float, help=f"phase 2 seconds (default {FULL['flood_s']:.0f})")
    p.add_argument("--keys", type=int, help=f"attacker keys (default {FULL['keys']})")
    p.add_argument("--procs", type=int, help=f"attacker processes (default {FULL['procs']})")
    p.add_argument("--rate", type=float, help=f"messages/s per key (default {FULL['rate']:.0f})")
    p.add_argument("--settle-s", type=float, default=5.0, help="first flood seconds not held to 'every second'")
    p.add_argument("--min-round-s", type=float, default=1.0, help="B's pace (swarm.min_round_s)")
    p.add_argument("--transport", choices=("libp2p", "p2pd"), default="libp2p", help="the attacker hosts' kind")
    p.add_argument("--share-tolerance", type=float, default=0.0, help="added to young_share_max in the share check")
    p.add_argument("--swarm", default="honest-heard", help="swarm name of this run")
    p.add_argument("--node-set", action="append", default=None, metavar="KEY=VALUE",
                   help="config override for both nodes and the attackers' task source (repeatable; default "
                        f"{' '.join(LEARNING_SETS)}: the fast node keeps groups with reward variance to share)")
    p.add_argument("--check", action="store_true", help="exit 1 when an acceptance check fails or is unmeasurable")
    p.add_argument("--out", default=str(runs_dir("exp-honest-heard")))
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.keys < 1 or args.procs < 1 or args.rate < 0 or args.quiet_s < 1 or args.flood_s < 1:
        p.error("need --keys >= 1, --procs >= 1, --rate >= 0 and phases of at least 1 s")
    return args


def machine() -> dict:
    model = None
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), None)
    except OSError:  # no /proc/cpuinfo: the model stays unknown
        model = None
    return {"platform": platform.platform(), "processor": platform.processor() or None, "cpu_model": model,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    flood_t = result["phases"]["flood"]["t0"] - result["phases"]["quiet"]["t0"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    for name, color in (("a", "C0"), ("b", "C1")):
        rows = result["series"][name]
        t = [r["t"] for r in rows]
        label = f"{name.upper()} ({'paced' if name == 'b' else 'unpaced'})"
        axes[0].plot(t, [r["verified"] / r["dt"] for r in rows], color=color, lw=1, label=label)
        axes[1].plot(t, [r["trained_rounds"] / r["rounds"] if r["rounds"] else float("nan") for r in rows],
                     color=color, lw=1, label=label)
        axes[2].plot(t, [1 - r["used_honest"] / r["used"] if r["used"] else float("nan") for r in rows],
                     color=color, lw=1, label=label)
    young = result["limits"].get("young_share_max")
    axes[1].axhline(0.9, color="grey", ls="--", lw=1, label="0.9 bar")
    if young is not None:
        axes[2].axhline(young, color="grey", ls="--", lw=1, label=f"young_share_max {young}")
    titles = ("honest peer's messages verified per second (between 1-s polls)", "rounds that trained the honest peer's groups",
              "share of trained groups not from the honest peer")
    for ax, title in zip(axes, titles):
        ax.axvline(flood_t, color="red", lw=1, alpha=0.6)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    axes[1].set_ylim(-0.02, 1.02)
    axes[2].set_ylim(-0.02, 1.02)
    plan = result["plan"]
    axes[2].set_xlabel(f"seconds since phase 1 (red: flood of {plan['keys']} keys x {plan['rate']:g} msg/s over "
                       f"{plan['procs']} processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def progress_ticker(progress, task_id):
    def on_tick(phase: str, elapsed: float, total: float, probes) -> None:
        b = probes["b"].samples[-1] if probes["b"].samples else None
        a = probes["a"].samples[-1] if probes["a"].samples else None
        rounds = f"A round {a.round if a else '-'}, B round {b.round if b else '-'}"
        progress.update(task_id, description=f"{phase:>11}: {rounds}", completed=min(elapsed, total or 1),
                        total=total or 1)
    return on_tick


def summary_table(result: dict):
    from rich.table import Table

    table = Table(title="exp_honest_heard: acceptance (null = not measurable)")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_column("figure", justify="right")
    figures = {ph: result["phases"][ph]["figures"] for ph in ("quiet", "flood")}
    for check, ok in result["acceptance"].items():
        phase, node, what = check.split(".", 2)
        key = what.split("<")[0].split(">")[0]
        if key == "honest_verified_every_second":
            key = "honest_verified_seconds"
        value = (result["phases"]["flood"]["establishment"][node].get("attacker_established")
                 if key == "establish_rate_ok" else figures[phase][node].get(key))
        table.add_row(check, {True: "[green]pass", False: "[red]FAIL", None: "[yellow]n/a"}[ok], str(value))
    return table


def _terminate(signum, _frame) -> None:
    """SIGTERM ends the run like Ctrl-C: the clean-up stops every process it started."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut that clean-up short
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from node.labs.honest_heard_run import HonestHeardRun, Plan

    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    out = Path(args.out)
    shutil.rmtree(out / "a", ignore_errors=True)  # a join node would resume an earlier run's checkpoint
    shutil.rmtree(out / "b", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    console = make_console(160)
    plan = Plan(out=out, swarm=args.swarm, quiet_s=args.quiet_s, flood_s=args.flood_s, keys=args.keys,
                procs=args.procs, rate=args.rate, settle_s=args.settle_s, min_round_s=args.min_round_s,
                transport=args.transport, share_tolerance=args.share_tolerance, node_sets=LEARNING_SETS if args.node_set is None else tuple(args.node_set))
    started, info = time.time(), machine()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            result = HonestHeardRun(plan, progress_ticker(progress, progress.add_task("starting", total=1))).execute()
    except (RuntimeError, TimeoutError) as err:
        console.print(f"[red]exp_honest_heard: {err}")
        return 2
    info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {"machine": info, "seconds": round(time.time() - started, 1),
              "command": command_line(__spec__, argv),
              **result}
    json_path, png_path = write_result(out, "exp_honest_heard", result, plot)
    console.print(summary_table(result))
    for line in result["missing"]:
        console.print(f"missing: {line}", style="yellow", markup=False)
    for line in result["diagnosis"]:
        console.print(f"note: {line}", markup=False)
    console.print(f"wrote {json_path} and {png_path}")
    failed = [k for k, v in result["acceptance"].items() if v is not True]
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
