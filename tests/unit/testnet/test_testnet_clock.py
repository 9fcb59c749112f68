"""The memory testnet's compute clock (node/testnet/clock.py): costs, budgets, virtual-time turns,
latency in virtual time, and the report's equal-time / equal-rounds figures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from node.observe.metrics import read_metrics
from node.testnet.clock import DeviceProfile, TurnQueue, charged_over_wall, parse_duration, profiles, round_cost
from node.testnet.memory import MemoryTestnet
from node.testnet.plan import Plan
from node.testnet.grid import grid_instants
from node.testnet.report_clock import grid_auc, time_to_target
from node.testnet.runner import run_testnet
from protocol import MemoryBus, MemoryTransport

from tests.support.fake_clock import FakeClock


def test_round_cost_charges_generation_training_and_overhead():
    device = DeviceProfile("d", gen_tokens_per_s=100.0, train_tokens_per_s=50.0, round_overhead_s=0.5)
    assert round_cost({"tokens_generated": 200, "tokens_trained": 100.0}, device) == pytest.approx(0.5 + 2 + 2)
    assert round_cost({"tokens_generated": 200}, device.scaled(2.0, "x")) == pytest.approx(0.25 + 1)
    tiny = profiles("tiny")
    assert tiny["slow"].gen_tokens_per_s == tiny["fast"].gen_tokens_per_s / 2
    assert tiny["gpu"].train_tokens_per_s == 20 * tiny["fast"].train_tokens_per_s
    with pytest.raises(ValueError, match="scripts.tools.measure_profile --preset nosuch"):
        profiles("nosuch")


def test_round_cost_charges_every_part_of_the_exchange():
    device = DeviceProfile("d", gen_tokens_per_s=100.0, train_tokens_per_s=50.0, round_overhead_s=0.5,
                           generate_call_s=0.1, message_check_s=0.01, group_verify_s=0.2, message_publish_s=0.05,
                           generate_step_s=0.3, prompt_prefill_s=0.02, forward_token_s=0.001)
    row = {"tokens_generated": 200, "tokens_trained": 100.0, "generate_calls": 3, "generate_steps": 4,
           "generate_prompts": 10, "tokens_forwarded": 500.0, "messages_checked": 20, "groups_verified": 4,
           "messages_published": 10, "hint_generate_calls": 2, "hint_generate_steps": 2, "hint_generate_prompts": 5,
           "hint_tokens_generated": 50}
    # 0.5 + (2 + 0.3 + 1.2 + 0.2) + (2 + 0.5) + (0.2 + 0.8 + 0.5 + (0.2 + 0.6 + 0.1 + 0.5))
    assert round_cost(row, device) == pytest.approx(9.6)
    assert round_cost(row, device.scaled(2.0, "x")) == pytest.approx(4.8)  # every rate, exchange included
    silo_row = {key: row[key] for key in ("tokens_generated", "tokens_trained", "generate_calls", "generate_steps",
                                          "generate_prompts", "tokens_forwarded")}
    assert round_cost(row, device) - round_cost(silo_row, device) == pytest.approx(2.9)
    wall = {**row, "t_round": 0.8}
    assert round_cost(wall, device, "wall") == 0.8 and round_cost(wall, device.scaled(2.0, "x"), "wall") == 0.4
    assert charged_over_wall([{"cost_s": 0.3, "t_round": 0.6}, {"cost_s": 0.1, "t_round": 0.2}, {"t_round": 9}]) \
        == pytest.approx(0.5)
    assert charged_over_wall([]) is None
    cpu = [{"cost_s": 0.3, "t_round": 0.9, "t_round_cpu": 0.6}, {"cost_s": 0.1, "t_round": 0.2}]  # no CPU time: left out
    assert charged_over_wall(cpu, "t_round_cpu") == pytest.approx(0.5)


def test_a_swarm_round_counts_its_exchange_work_and_the_evaluation_is_free(tmp_path, tiny_config):
    """Real nodes on the memory bus: every count the clock charges is in the row, and a held-out
    evaluation (the instrument) adds no generate call to the next round."""
    plan = Plan(nodes=3, rounds=3, transport="memory", heterogeneous=False, out=tmp_path)
    result = MemoryTestnet(plan, (4, 4), 0, tmp_path / "run").run()
    rows = [r for n in result["nodes"] for r in read_metrics(Path(n["run_dir"]))]
    assert all(r["generate_calls"] >= 1 and r["messages_published"] >= 4 for r in rows)  # 4 groups shared a round
    later = [r for r in rows if r["round"] > 0]
    assert sum(r["messages_checked"] for r in later) > 0 and sum(r["groups_verified"] for r in later) > 0
    assert all(r["groups_verified"] <= r["messages_checked"] for r in rows)
    # the round's thread CPU time: some, and never more than the wall time it took (one thread a node)
    assert all(0 < r["t_round_cpu"] <= r["t_round"] * 1.05 + 1e-3 for r in rows)
    silo = MemoryTestnet(plan, (8, 0), 0, tmp_path / "silo").run()
    silo_row = read_metrics(Path(silo["nodes"][0]["run_dir"]))[-1]
    assert "messages_checked" not in silo_row and silo_row["generate_calls"] == 1.0  # one batched call
    # 8 prompts x 8 rows: one batch, prefilled once per prompt, of one decode step (the tiny preset's max_new_tokens)
    assert silo_row["generate_steps"] == 1.0 and silo_row["generate_prompts"] == 8.0
    assert silo_row["tokens_forwarded"] >= silo_row["tokens_trained"] > 0  # prompts and padding go through too
    from node.train.loop import Node

    node = Node(tiny_config("eval.every=1", "eval.tasks_per_family=2", threads=None), tmp_path / "alone")
    node.run_round(0)  # evaluates after its update
    assert node.parts.sampling.take_work()["generate_calls"] == 0.0
    assert node.run_round(1)["generate_calls"] == 1.0


def test_budget_parsing():
    assert [parse_duration(t) for t in ("900", "900s", "30m", "2h", "1.5h", " 10m ")] == \
        [900, 900, 1800, 7200, 5400, 600]
    for bad in ("", "0", "-5m", "2d", "m", "1e9", "10 minutes", "inf"):
        with pytest.raises(ValueError, match="--budget expects a positive duration"):
            parse_duration(bad)


def test_turns_in_virtual_time_order():
    queue = TurnQueue()
    for at, index in ((3.0, 0), (1.0, 2), (1.0, 1), (2.0, 3)):
        queue.push(at, index, at - 0.5)
    queue.drop(3)
    assert [queue.pop() for _ in range(len(queue))] == [(1, 0.5), (2, 0.5), (0, 2.5)]


def test_auc_and_time_to_target_on_the_grid_by_hand():
    curve = [(0.0, 0.0), (2.0, 0.4), (4.0, 0.8)]  # a curve on the shared grid (node/testnet/grid.py)
    assert grid_auc(curve) == pytest.approx(0.4)  # the mean of its values at the grid instants
    assert time_to_target(curve, 0.6) == 4.0  # the first instant at the target: nothing interpolated
    assert time_to_target(curve, 0.9) is None and time_to_target(curve, 0.0) == 0.0


def test_messages_stay_invisible_until_their_virtual_latency():
    clock = FakeClock(100.0)
    bus = MemoryBus(latency_s=(0.5, 0.5), clock=clock)
    a, b = MemoryTransport(bus, "a"), MemoryTransport(bus, "b")
    for t in (a, b):
        t.start()
        t.subscribe("x")
    a.publish("x", b"hi")
    clock.now = 100.4
    assert b.drain("x") == []
    clock.now = 100.5
    assert [m.data for m in b.drain("x")] == [b"hi"]


def compute_plan(tmp_path: Path, **kw) -> Plan:
    base = dict(nodes=4, rounds=8, transport="memory", mixes=[(8, 0), (2, 6)], clock="compute", out=tmp_path,
                overrides=["eval.every=4"])
    return Plan(**{**base, **kw})


def test_slow_and_light_nodes_run_more_or_fewer_rounds_in_one_budget(tmp_path):
    plan = compute_plan(tmp_path)
    silo = MemoryTestnet(plan, (8, 0), 0, tmp_path / "silo").run()
    budget = silo["budget_s"]
    sapo = MemoryTestnet(plan, (2, 6), 0, tmp_path / "sapo", budget_s=budget).run()
    rounds = {run["mix"]: [len(read_metrics(Path(n["run_dir"]))) for n in run["nodes"]] for run in (silo, sapo)}
    assert [n["profile"] for n in silo["nodes"]] == ["fast", "fast", "fast", "slow"]
    assert min(rounds["8/0"][:3]) >= plan.rounds and 0.35 <= rounds["8/0"][3] / rounds["8/0"][0] <= 0.65
    assert min(rounds["2/6"][:3]) > max(rounds["8/0"][:3])  # lighter rounds: more of them per budget
    for run in (silo, sapo):
        for node in run["nodes"]:
            rows = read_metrics(Path(node["run_dir"]))
            assert all(r["vtime"] < budget for r in rows) and rows[-1]["vtime_end"] >= budget - rows[-1]["cost_s"]
            assert [r["vtime"] for r in rows] == sorted(r["vtime"] for r in rows)
            assert [e["vtime"] for e in node["evals"]] == grid_instants(silo["grid_s"], budget)
            assert "heldout_pass1" in node["evals"][-1]


def test_equal_compute_report(tmp_path):
    assert run_testnet(compute_plan(tmp_path), "test", Console(file=open("/dev/null", "w")), quiet=True) == 0
    report = json.loads((tmp_path / "testnet.json").read_text())
    compute = report["compute"]
    assert [row["mix"] for row in compute["mixes"]] == ["8/0", "2/6"]
    equal_rounds = compute["equal_rounds"]["0"]
    assert equal_rounds == min(n["rounds"] for run in report["runs"] for n in run["nodes"])
    silo, sapo = compute["mixes"]
    assert silo["heldout_at_budget_gain"] == 0.0 and silo["speedup_vs_silo"] in (1.0, None)
    assert set(silo["classes"]) == {"fast", "slow"} and "heldout_at_budget_gain" in sapo["classes"]["slow"]
    assert len(silo["rounds_per_node"]) == 4 and sapo["rollouts_per_node"]["0"] > 0
    assert sapo["curve"]["t"] == grid_instants(compute["grid_s"], compute["budget_s"]) == compute["mixes"][0]["curve"]["t"]
    assert 0.0 <= sapo["auc"]["mean"] <= 1.0 and sapo["heldout_at_budget"]["std"] is None  # one seed: no spread
    assert sapo["paired_vs_silo"]["heldout_at_budget"]["ci_low"] is None and silo["paired_vs_silo"] is None
    text = (tmp_path / "summary.txt").read_text()
    assert "compute clock" in text and "cum. reward @ R" in text and "gain vs silo" not in text
    verdict = text.strip().splitlines()[-1]  # the summary ends with the verdict of each sharing mix
    assert verdict.startswith("swarm 2/6 vs silo 8/0 at equal compute") and f"{silo['heldout_at_budget']['mean']:.3f}" in verdict
    assert "no verdict (no CI)" in verdict and "2/6: paired diff vs silo (per seed): held-out @ budget" in text
    assert set(sapo["time_to_target_by_seed"]) == {"0"} and "mean" in sapo["speedup_by_seed"]
    assert (tmp_path / "testnet.png").stat().st_size > 10_000
    assert all(0 < row["charged_over_wall"] for row in compute["mixes"]) and "charged/wall" in text


def test_rounds_clock_is_unchanged_and_compute_needs_the_memory_transport(tmp_path):
    plan = Plan(nodes=2, rounds=4, transport="memory", out=tmp_path)
    assert plan.clock == "rounds"
    result = MemoryTestnet(plan, (4, 4), 0, tmp_path / "run").run()
    assert "budget_s" not in result and all("vtime" not in r for r in read_metrics(tmp_path / "run" / "node0"))
    assert all(len(read_metrics(Path(n["run_dir"]))) == 4 for n in result["nodes"])
    with pytest.raises(ValueError, match="--transport memory"):
        Plan(clock="compute", transport="libp2p").validate()
    with pytest.raises(ValueError, match="needs --clock compute"):
        Plan(transport="memory", budget_s=10.0).validate()


def test_cli_defaults_to_the_compute_clock_for_comparisons(tmp_path, monkeypatch):
    from node import cli

    seen = {}
    monkeypatch.setattr("node.testnet.runner.run_testnet", lambda plan, *a, **k: seen.setdefault("plan", plan) and 0)
    for argv, clock in ((["--compare", "8/0,2/6"], "compute"), (["--mix", "4/4"], "rounds"),
                        (["--compare", "8/0,2/6", "--clock", "rounds"], "rounds")):
        seen.clear()
        args = cli.build_parser().parse_args(["testnet", "--transport", "memory", "--out", str(tmp_path), *argv])
        args.func(args)
        assert seen["plan"].clock == clock
    args = cli.build_parser().parse_args(["testnet", "--transport", "memory", "--compare", "8/0,2/6", "--budget", "2x"])
    with pytest.raises(ValueError, match="--budget expects"):
        args.func(args)


def test_duration_runs_process_nodes_by_wall_time():
    from node.testnet.plan import node_overrides

    plan = Plan(transport="libp2p", rounds=50, duration_s=60.0)
    plan.validate()
    assert "run.rounds=1000000" in node_overrides(plan, 0, 0, (4, 4))
    assert "run.rounds=50" in node_overrides(Plan(rounds=50), 0, 0, (4, 4))
    with pytest.raises(ValueError, match="shorter than --timeout"):
        Plan(transport="libp2p", duration_s=3600.0, timeout_s=1800.0).validate()
    with pytest.raises(ValueError, match="takes --budget"):
        Plan(transport="memory", duration_s=60.0).validate()


# --- the silo (J = 0) and the tiny-warm preset -----------------------------------------------------

from node.testnet.plan import node_overrides  # noqa: E402


def test_a_silo_mix_turns_hints_off_and_warm_presets_share_one_warm_model_per_seed():
    plan = Plan(nodes=4)
    silo, sapo = node_overrides(plan, 1, 0, (8, 0)), node_overrides(plan, 1, 0, (4, 4))
    assert "hints.enabled=false" in silo and not any(s.startswith("hints.") for s in sapo)
    assert not any(s.startswith("warm.") for s in silo + sapo)  # tiny has no warm recipe
    warm = Plan(nodes=3, preset="tiny-warm")
    sets = [node_overrides(warm, i, 3, (4, 4)) for i in range(3)]
    assert all(s.count("warm.seed=3") == 1 for s in sets)  # the testnet seed, not a per-node seed
    assert all("warm.seed=4" in node_overrides(warm, i, 4, (2, 0)) for i in range(3))


def test_a_silo_node_joins_no_bus(tmp_path):
    plan = Plan(nodes=2, rounds=3, transport="memory", mixes=[(2, 0)], out=tmp_path, overrides=["eval.every=100"])
    testnet = MemoryTestnet(plan, (2, 0), 0, tmp_path / "silo")
    result = testnet.run()
    assert all(node.exchange is None for node in testnet.nodes.values())
    assert [n["status"]["transport"] for n in result["nodes"]] == ["none (silo)"] * 2
    assert all(n["peer_id"] is None for n in result["nodes"]) and not any(result["bus"].values())
    assert all(len(read_metrics(Path(n["run_dir"]))) == 3 for n in result["nodes"])
    assert all(node.cfg.hints.enabled is False for node in testnet.nodes.values())


def test_tiny_warm_compute_clock_smoke(tmp_path, monkeypatch):
    from node import cli

    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    args = cli.build_parser().parse_args([
        "testnet", "--transport", "memory", "--preset", "tiny-warm", "--nodes", "3", "--compare", "2/0,1/1",
        "--rounds", "3", "--clock", "compute", "--quiet", "--out", str(out),
        "--set", "warm.steps=5", "--set", "eval.tasks_per_family=2", "--set", "sampling.group_size=4"])
    assert args.func(args) == 0
    report = json.loads((out / "testnet.json").read_text())
    assert [row["mix"] for row in report["compute"]["mixes"]] == ["2/0", "1/1"]
    assert all("heldout_at_budget" in row and "auc" in row for row in report["compute"]["mixes"])
    assert sum(n["accepted"] for n in report["runs"][0]["nodes"]) == 0  # the silo heard nobody
    assert sum(n["accepted"] for n in report["runs"][1]["nodes"]) > 0
    silo, sapo = json.loads((out / "runs.json").read_text())
    assert {n["status"]["transport"] for n in silo["nodes"]} == {"none (silo)"}
    assert all(n["status"]["transport"] != "none (silo)" and n["peer_id"] for n in sapo["nodes"])
    assert all(any(s.startswith("warm.seed=") for s in n["overrides"]) for run in (silo, sapo) for n in run["nodes"])
    assert len(list((tmp_path / "cache").glob("tiny-warm-*"))) == 1  # every node of the seed on one warm model
    assert "compute clock" in (out / "summary.txt").read_text()


def test_paired_speedups_per_seed():
    from node.testnet.report_clock import paired_speedups

    silo = {"0": 4.0, "1": None, "2": 3.0}  # seed 1: the silo never reached the target (counts as the budget, 10)
    mix = {"0": 2.0, "1": 5.0, "2": 0.0}  # seed 2 started at the target: no ratio
    assert paired_speedups(silo, mix, budget=10.0) == [2.0, 2.0]
    assert paired_speedups(silo, {"3": 1.0}, budget=10.0) == []  # no silo run of that seed
    assert paired_speedups({"0": 4.0}, {"0": None}, budget=10.0) == [0.4]  # the mix never reached it


def test_the_verdict_says_why_there_is_no_speedup():
    """A swarm whose curve starts at the target has no speedup, which is not "never reached it"
    (the SmolLM2 run's report said that of a swarm at the target from t = 0)."""
    from node.testnet.report_clock import verdict_lines

    def row(mix: str, t: float | None, speedup: float | None = None) -> dict:
        return {"mix": mix, "time_to_target": t, "speedup_vs_silo": speedup, "heldout_at_budget": {"mean": 0.1},
                "heldout_at_budget_gain": 0.0, "auc_gain": 0.0, "reward_at_equal_rounds_gain": 0.0}

    def verdict(silo: dict, swarm: dict) -> str:
        return verdict_lines({"mixes": [silo, swarm]})[0]

    assert "no speedup to measure" in verdict(row("8/0", 0.0), row("4/4", 0.0))
    assert "never reached the held-out target" in verdict(row("8/0", 5.0), row("4/4", None))
    assert "the silo never reached" in verdict(row("8/0", None), row("4/4", 3.0))
    assert "1.50x as fast" in verdict(row("8/0", 6.0), row("4/4", 4.0, 1.5))


def test_the_profile_fit_recovers_the_rates_rounds_were_made_with():
    """scripts/tools/measure_profile.py on rounds built from a known profile (every phase exactly its
    rates, plus a fixed rest): each rate comes back, and the fitted profile charges those rounds their
    wall time whatever their mix of work (the clock is fair across treatments)."""
    import random

    from scripts.tools.measure_profile import fit_profile

    truth = DeviceProfile("t", gen_tokens_per_s=5000.0, train_tokens_per_s=2000.0, round_overhead_s=0.004,
                          generate_call_s=0.02, message_check_s=0.0004, group_verify_s=0.0006,
                          message_publish_s=0.0002, message_skim_s=0.0001, optimizer_step_s=0.012,
                          external_group_s=0.001, generate_step_s=0.01, prompt_prefill_s=0.0005,
                          forward_token_s=0.00002)
    rng, rows = random.Random(0), []
    for _ in range(300):
        work = {"tokens_generated": rng.randint(50, 300), "generate_calls": rng.randint(1, 3),
                "generate_steps": rng.randint(1, 4), "generate_prompts": rng.randint(4, 32),
                "tokens_trained": rng.randint(0, 200), "tokens_forwarded": rng.randint(0, 3000),
                "optimizer_steps": rng.randint(0, 1), "groups_external": rng.randint(0, 4),
                "messages_checked": rng.randint(0, 20), "groups_verified": rng.randint(0, 6),
                "messages_published": rng.randint(0, 8), "messages_skimmed": rng.randint(0, 10)}
        t_generate = (work["tokens_generated"] / 5000.0 + work["generate_calls"] * 0.02 + work["generate_steps"] * 0.01
                      + work["generate_prompts"] * 0.0005)
        t_train = (0.003 + work["tokens_trained"] / 2000.0 + work["optimizer_steps"] * 0.012
                   + work["groups_external"] * 0.001 + work["tokens_forwarded"] * 0.00002)
        t_exchange = (work["messages_checked"] * 0.0004 + work["groups_verified"] * 0.0006
                      + work["messages_published"] * 0.0002 + work["messages_skimmed"] * 0.0001)
        rows.append({**work, "t_generate": t_generate, "t_train": t_train, "t_exchange": t_exchange,
                     "t_round": t_generate + t_train + t_exchange + 0.001})
    fitted = fit_profile(rows)
    for field in ("gen_tokens_per_s", "train_tokens_per_s", "round_overhead_s", "generate_call_s", "message_check_s",
                  "group_verify_s", "message_publish_s", "message_skim_s", "optimizer_step_s", "external_group_s",
                  "generate_step_s", "prompt_prefill_s", "forward_token_s"):
        assert getattr(fitted, field) == pytest.approx(getattr(truth, field), rel=1e-6), field
    silo = [r for r in rows if r["groups_external"] == 0]
    assert charged_over_wall([{**r, "cost_s": round_cost(r, fitted)} for r in silo]) == pytest.approx(1.0)
