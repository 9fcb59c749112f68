"""`swarm-node eval`: held-out pass@1 / pass@k of a run's latest checkpoint (node/train/eval.py): a table on
stdout and RUN_DIR/eval-round-NNNNNN.json."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from node.service.console import console, pin_hash_seed_if_needed


def add_parser(sub, presets: list[str]) -> None:
    evaluate = sub.add_parser("eval", help="held-out pass@1 / pass@k of a run's latest checkpoint")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--tasks", type=int,
                          help="held-out tasks per family (default: the run's eval.tasks_per_family)")
    evaluate.add_argument("--k", type=int, help="samples per task for pass@k (default: the run's eval.k)")
    evaluate.set_defaults(func=run)


def checkpoint_config(run_dir: Path, tasks: int | None, k: int | None):
    """The config saved with the run's latest checkpoint, with --tasks and --k applied; its file."""
    from pydantic import ValidationError  # the schema and checkpoints: eval's, after parsing

    from node.config.schema import ConfigError, NodeConfig
    from node.config.swarm import migrate_renamed_keys
    from policy.checkpoint import latest_checkpoint_path

    checkpoint = latest_checkpoint_path(run_dir)
    config_file = checkpoint / "config.json" if checkpoint is not None else None
    if config_file is None or not config_file.is_file():
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints: is this a run directory? "
                                "(`swarm-node train --run-dir DIR` writes checkpoints)")
    data = migrate_renamed_keys(json.loads(config_file.read_text()))  # a run saved before swarm's sections
    data.setdefault("eval", {})
    if tasks is not None:
        data["eval"]["tasks_per_family"] = tasks
    if k is not None:
        data["eval"]["k"] = k
    try:
        return NodeConfig.model_validate(data), config_file
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid configuration in {config_file} (with --tasks/--k): {problems}") from None


def run(args: argparse.Namespace) -> int:
    """Held-out pass@1 / pass@k of a run's latest checkpoint (node/train/eval.py): a table on stdout and
    RUN_DIR/eval-round-NNNNNN.json."""
    run_dir = Path(args.run_dir)
    cfg, config_file = checkpoint_config(run_dir, args.tasks, args.k)
    pin_hash_seed_if_needed(cfg)

    from node.service.assembly import assemble_node  # torch and transformers: once the run's config is read

    node = assemble_node(cfg, run_dir)
    round_index = node.resume(truncate_metrics=False)  # reading the run, not continuing it
    if round_index is None:  # the checkpoint went away since we read its config
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints any more")
    result = node.evaluate()
    evaluation = {"round": round_index, "policy_version": node.learner.policy_version,
                  "checkpoint": config_file.parent.name, "tasks_per_family": cfg.eval.tasks_per_family,
                  "heldout_seed": node.evaluator.seed, "sampling_seed": node.evaluator.sampling_seed,
                  "temperature": cfg.sampling.temperature, "ood": cfg.eval.ood, **result}
    out_path = run_dir / f"eval-round-{round_index:06d}.json"
    out_path.write_text(json.dumps(evaluation, indent=2, default=str) + "\n")
    print_evaluation(run_dir, evaluation, cfg.sampling.temperature, out_path)
    return 0


def print_evaluation(run_dir: Path, evaluation: dict, temperature: float, out_path: Path) -> None:
    from rich.table import Table  # the table's alone

    k = evaluation["heldout_k"]
    table = Table(title=f"held-out evaluation of {run_dir} "
                        f"(round {evaluation['round']}, policy v{evaluation['policy_version']})")
    for col in ("family", "pass@1", f"pass@{k}", "tasks"):
        table.add_column(col, justify="left" if col == "family" else "right")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for family, v in evaluation["heldout_by_family"].items():
        table.add_row(family, fmt(v["pass1"]), fmt(v["passk"]), str(v["tasks"]))
    inside = sum(v["tasks"] for f, v in evaluation["heldout_by_family"].items() if not f.startswith("ood:"))
    table.add_row("all (in-distribution)", fmt(evaluation["heldout_pass1"]), fmt(evaluation["heldout_passk"]),
                  str(inside), style="bold")
    Console().print(table)
    console.print(f"pass@1 greedy; pass@{k}: {k} samples at temperature {temperature} (fixed seed); "
                  f"{evaluation['t_eval']:.1f} s -> wrote {out_path}", highlight=False)
