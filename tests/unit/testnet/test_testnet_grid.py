"""The compute clock's shared evaluation grid (node/testnet/grid.py): every node of every mix is
measured at the same virtual instants, each with the weights it had then, and the report reads the
curves on that grid without interpolating (node/testnet/report_clock.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.train.loop import Node
from node.observe.metrics import read_metrics
from node.testnet.grid import GridEvaluator, WeightCopy, grid_instants, grid_spacing
from node.testnet.memory import MemoryTestnet
from node.testnet.plan import Plan, parse_kills
from node.testnet.report_clock import compute_table, grid_auc, mean_curve, time_to_target

FAST = ["eval.tasks_per_family=2", "eval.k=2", "sampling.group_size=4", "eval.every=1"]


def test_grid_instants_and_spacing():
    assert grid_instants(0.25, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]  # the budget once, not twice
    assert grid_instants(0.3, 1.0) == [0.0, 0.3, 0.6, 1.0]  # 0.9 is within s/2 of the budget: left out
    assert grid_instants(0.3, 1.1) == [0.0, 0.3, 0.6, 0.3 * 3, 1.1]  # k * s, not a running sum
    assert grid_instants(1.0, 0.4) == [0.0, 0.4]  # a budget shorter than half a spacing
    assert grid_instants(None, 2.0) == [0.0, 2.0]  # eval.every = 0: the untrained model and the budget
    plan = Plan(preset="tiny-warm", mixes=[(8, 0), (4, 4)], transport="memory", clock="compute")
    spacing = grid_spacing(plan)
    assert spacing == grid_spacing(Plan(preset="tiny-warm", mixes=[(4, 4)], transport="memory", clock="compute"))
    assert grid_spacing(Plan(preset="tiny-warm", mixes=[(8, 0)], overrides=["eval.every=50"])) == pytest.approx(2 * spacing)
    assert grid_spacing(Plan(preset="tiny-warm", overrides=["eval.every=0"])) is None


def test_the_weight_copy_is_exact_and_swaps_back(tmp_path, tiny_config):
    node = Node(tiny_config("eval.tasks_per_family=2", "eval.k=2", threads=None), tmp_path / "node")
    before = node.evaluate()
    copy = WeightCopy(node)
    params = [p.detach().clone() for p in copy.params]
    node.run_one(5)
    after = [p.detach().clone() for p in copy.params]
    assert any(not torch.equal(a, b) for a, b in zip(params, after))  # the round changed the weights
    with copy.swapped_in(node):
        assert all(torch.equal(p, b) for p, b in zip(copy.params, params))
        inside = node.evaluate()
    assert all(torch.equal(p, a) for p, a in zip(copy.params, after))
    strip = lambda r: {k: v for k, v in r.items() if k != "t_eval"}  # noqa: E731 (wall time)
    assert strip(inside) == strip(before)
    copy.capture()
    assert all(torch.equal(s, a) for s, a in zip(copy.saved, after))


def test_each_instant_gets_the_weights_of_the_last_round_ended_by_then(tmp_path, tiny_config):
    """One real node driven through three rounds of made-up virtual spans, spacing 1: [0, 1.5),
    [1.5, 3.1), [3.15, 3.3), budget 3.2 (the third round straddles it)."""
    node = Node(tiny_config("eval.tasks_per_family=2", "eval.k=2", threads=None), tmp_path / "node")
    grid, measured = GridEvaluator(1.0, 1), []
    for start, end in ((0.0, 1.5), (1.5, 3.1), (3.15, 3.3)):
        measured.append(node.evaluate())  # the weights before this round (evaluating changes nothing)
        grid.before_round(0, node, start)
        node.run_one(10)
        grid.after_round(0, start, end)
    evals = grid.finish(0, node, 3.2)
    # 3.0 was measured when the third round started (the budget unknown yet); it is within s/2 of 3.2: dropped
    assert [e["vtime"] for e in evals] == [0.0, 1.0, 2.0, 3.2] == grid_instants(1.0, 3.2)
    assert [e["round"] for e in evals] == [0, 0, 1, 2]  # 1.0 inside round 1, 2.0 inside round 2, 3.2 inside round 3
    strip = lambda r: {k: v for k, v in r.items() if k not in ("t_eval", "vtime", "round")}  # noqa: E731
    assert [strip(e) for e in evals] == [strip(measured[i]) for i in (0, 0, 1, 2)]
    assert node.next_round == 3 and grid.tracks[0].copy is None


def test_every_node_of_both_mixes_is_measured_on_the_shared_grid(tmp_path):
    """3 tiny nodes, a silo and a swarm mix at one budget: the same instants for every node, each
    point with the rounds that had ENDED by then; the nodes' own evaluations are off; pass@k' at the
    budget only."""
    plan = Plan(nodes=3, rounds=4, preset="tiny", transport="memory", mixes=[(2, 0), (1, 1)], clock="compute",
                heterogeneous=False, out=tmp_path, overrides=[*FAST, "eval.pass_at=[2]"])
    silo = MemoryTestnet(plan, (2, 0), 0, tmp_path / "silo").run()
    budget = silo["budget_s"]
    swarm = MemoryTestnet(plan, (1, 1), 0, tmp_path / "swarm", budget_s=budget).run()
    spacing = grid_spacing(plan)
    grid = grid_instants(spacing, budget)
    assert silo["grid_s"] == swarm["grid_s"] == spacing and len(grid) >= 4  # a few instants inside the budget
    for run in (silo, swarm):
        for node in run["nodes"]:
            rows = read_metrics(Path(node["run_dir"]))
            assert [e["vtime"] for e in node["evals"]] == grid
            assert [e["round"] for e in node["evals"]] == [sum(r["vtime_end"] <= t for r in rows) for t in grid]
            assert not any("heldout_pass1" in r for r in rows)  # eval.every=1, yet no round evaluated itself
            # eval.pass_at's many samples a task: at the run's end (the budget's point, and instants it settles) alone
            assert "heldout_pass_at" in node["evals"][-1] and "heldout_pass_at" not in node["evals"][0]
    assert any(0 < e["round"] < len(read_metrics(Path(n["run_dir"])))  # points inside the run, not only its ends
               for run in (silo, swarm) for n in run["nodes"] for e in n["evals"])
    table = compute_table([silo, swarm])
    for row in table["mixes"]:
        assert row["curve"]["t"] == grid
        assert row["time_to_target"] is None or row["time_to_target"] in grid
        assert all(t is None or t in grid for t in row["time_to_target_by_seed"].values())
        curve = mean_curve([[(e["vtime"], e["heldout_pass1"]) for e in n["evals"]]
                            for run in (silo, swarm) if run["mix"] == row["mix"] for n in run["nodes"]])
        assert row["curve"]["mean"] == pytest.approx([v for _, v in curve])
        assert row["auc"]["mean"] == pytest.approx(grid_auc(curve))


def test_a_killed_node_stays_on_the_grid(tmp_path):
    """Killed at swarm round 2 and back 2 rounds later: its points before the kill are its own, the
    ones while it was down are those of what it restarted from, and all sit on the grid."""
    plan = Plan(nodes=3, rounds=6, preset="tiny", transport="memory", mixes=[(2, 2)], clock="compute",
                heterogeneous=False, out=tmp_path, kills=parse_kills("2:1:2"), overrides=FAST)
    run = MemoryTestnet(plan, (2, 2), 0, tmp_path / "run").run()
    grid = grid_instants(run["grid_s"], run["budget_s"])
    assert any("node1 killed" in e["event"] for e in run["events"])
    for node in run["nodes"]:
        assert [e["vtime"] for e in node["evals"]] == grid
    rounds = [e["round"] for e in run["nodes"][1]["evals"]]
    assert 0 in rounds[1:] and max(rounds) > 0  # back at round 0 (no checkpoint yet), then trained again


def test_time_to_target_is_the_first_grid_instant_at_the_target():
    curve = [(0.0, 0.1), (0.5, 0.3), (1.0, 0.2), (1.5, 0.6), (1.8, 0.7)]
    assert time_to_target(curve, 0.3) == 0.5 and time_to_target(curve, 0.25) == 0.5  # no interpolation
    assert time_to_target(curve, 0.1) == 0.0 and time_to_target(curve, 0.65) == 1.8
    assert time_to_target(curve, 0.8) is None
    assert grid_auc(curve) == pytest.approx((0.1 + 0.3 + 0.2 + 0.6 + 0.7) / 5)
    assert mean_curve([curve, [(t, 1.0) for t, _ in curve]])[3] == (1.5, pytest.approx(0.8))
    with pytest.raises(ValueError, match="different grids"):
        mean_curve([curve, curve[:-1]])


def hand_run(tmp_path: Path, mix: str, seed: int, values: list[list[float]], rev: list[tuple[float, float]]) -> dict:
    """A compute-clock run as runs.json holds it: per node its held-out pass@1 on the grid 0, 1, 2,
    2.5 (budget) and the `rev` family's pass@1 (of 16 tasks) at 0 and at the budget; 3 rounds each."""
    grid = grid_instants(1.0, 2.5)
    nodes = []
    for index, (curve, (start, end)) in enumerate(zip(values, rev)):
        run_dir = tmp_path / f"{mix.replace('/', '-')}-{seed}" / f"node{index}"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("".join(f'{{"round": {r}, "reward_mean": 0.5, "rollouts_generated": 8}}\n'
                                                       for r in range(3)))
        family = lambda p: {"rev": {"pass1": p, "passk": p, "tasks": 16}}  # noqa: E731
        evals = [{"vtime": t, "round": k, "heldout_pass1": v, "heldout_by_family": family(start if k == 0 else end)}
                 for k, (t, v) in enumerate(zip(grid, curve))]
        nodes.append({"index": index, "run_dir": str(run_dir), "profile": "fast", "evals": evals})
    return {"mix": mix, "seed": seed, "clock": "compute", "budget_s": 2.5, "grid_s": 1.0, "nodes": nodes}


def test_the_report_compares_each_seed_with_the_silos_and_says_whether_the_gain_holds(tmp_path):
    from node.testnet.report_clock import compute_text, verdict_lines

    runs = []
    for seed, base in enumerate((0.1, 0.3, 0.2)):  # seeds differ; the swarm is 0.1 above the silo at the budget
        silo = [[0.0, base / 2, base, base], [0.0, base / 2, base, base]]
        swarm = [[0.0, base, base + 0.1, base + 0.1], [0.0, base, base + 0.1, base + 0.1]]
        runs += [hand_run(tmp_path, "8/0", seed, silo, [(0.0, 0.0), (0.0, 1 / 16)]),
                 hand_run(tmp_path, "4/4", seed, swarm, [(0.0, 2 / 16), (0.0, 0.0)])]
    table = compute_table(runs)
    silo, swarm = table["mixes"]
    assert silo["heldout_at_budget"]["mean"] == pytest.approx(0.2) and swarm["heldout_at_budget"]["mean"] == pytest.approx(0.3)
    assert silo["heldout_at_budget"]["std"] == pytest.approx(0.1)  # ddof=1 over seeds 0.1, 0.3, 0.2
    paired = swarm["paired_vs_silo"]["heldout_at_budget"]
    assert paired["diffs"] == pytest.approx([0.1, 0.1, 0.1]) and paired["seeds"] == ["0", "1", "2"]
    assert (paired["ci_low"], paired["ci_high"]) == pytest.approx((0.1, 0.1))
    auc = swarm["paired_vs_silo"]["auc"]  # (0 + b + 2 (b + .1)) / 4 - (0 + b / 2 + 2 b) / 4 = b / 8 + 0.05
    assert auc["diffs"] == pytest.approx([0.0625, 0.0875, 0.075]) and auc["ci_low"] > 0
    target = 0.8 * 0.2  # the silo's mean curve is 0, 0.1, 0.2, 0.2: it reaches 0.16 at instant 2.0
    assert silo["time_to_target"] == 2.0 and swarm["time_to_target"] == 1.0 and swarm["target"] == pytest.approx(target)
    assert swarm["speedup_vs_silo"] == 2.0 and silo["curve"]["mean"] == pytest.approx([0.0, 0.1, 0.2, 0.2])
    assert silo["learned"] == {"rev": {"learned": 3, "runs": 6}} and swarm["learned"] == {"rev": {"learned": 3, "runs": 6}}
    text = "\n".join(compute_text(table))
    assert "4/4: paired diff vs silo (per seed): held-out @ budget +0.100 [95% CI +0.100, +0.100] (n=3 seeds)" in text
    assert "rev 3/6" in text and "0.200 ± 0.100" in text
    (verdict,) = verdict_lines(table)
    assert "the swarm's gain holds (the CI excludes 0)" in verdict
    runs[3]["nodes"][0]["evals"][-1]["heldout_pass1"] = 0.1  # seed 1: the swarm now below the silo at the budget
    (verdict,) = verdict_lines(compute_table(runs))
    assert "no difference shown (the CI includes 0)" in verdict
