"""`swarm-node testnet`: plans and schedules, an in-process testnet with a kill, a partition and a
hostile peer, and (slow) real `swarm-node join` processes over libp2p on 127.0.0.1."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from node.observe.metrics import read_metrics
from node.testnet.plan import (Plan, halves, node_overrides, parse_hostile, parse_kills, parse_mix, parse_partitions,
                               parse_sizes)
from node.testnet.process import start_waves
from node.testnet.runner import run_testnet


def test_plan_parsing_and_errors():
    assert parse_mix("6/2") == (6, 2)
    assert parse_kills("150:1,2,3:40; 300:0") == [
        *parse_kills("150:1,2,3:40"), *parse_kills("300:0:30")]
    assert parse_kills("150:1,2,3:40")[0].nodes == (1, 2, 3)
    assert [(p.start, p.end) for p in parse_partitions("100-200,300-310")] == [(100, 200), (300, 310)]
    assert parse_hostile("2:liar,1:sybil") == [(2, "liar"), (1, "sybil")]
    for bad, call in (("0/4", parse_mix), ("150", parse_kills), ("200-100x", parse_partitions),
                      ("2:teleport", parse_hostile)):
        with pytest.raises(ValueError):
            call(bad)
    with pytest.raises(ValueError, match="numbered 0..2"):
        Plan(nodes=3, kills=parse_kills("5:3")).validate()
    assert parse_sizes("64x2, 96x3") == [(64, 2), (96, 3)]
    for bad in ("66x2", "64", "0x2", "64x0"):
        with pytest.raises(ValueError, match="WIDTHxLAYERS"):
            parse_sizes(bad)
    with pytest.raises(ValueError, match="one size"):
        Plan(preset="smollm2", model_sizes=[(64, 2)]).validate()
    assert halves(8) == ([0, 1, 2, 3], [4, 5, 6, 7]) and start_waves(8) == [[0], [1, 2], [3, 4, 5, 6], [7]]


def test_testnet_defaults_to_the_transport_join_uses():
    """One default transport: a testnet without --transport runs its nodes as `join` would."""
    from node import cli
    from node.config.schema import SwarmConfig

    assert SwarmConfig().transport == "p2pd"
    assert cli.build_parser().parse_args(["testnet"]).transport == SwarmConfig().transport == Plan().transport


def test_nodes_are_heterogeneous_unless_asked_otherwise():
    plan = Plan(nodes=4)
    sets = [node_overrides(plan, i, 0, (4, 4)) for i in range(4)]
    lrs = {next(s for s in o if s.startswith("optim.lr=")) for o in sets}
    mixes = {next(s for s in o if s.startswith("tasks.datasets=")) for o in sets}
    assert len(lrs) == 4 and len(mixes) == 3  # own learning rates; specialists in copy / succ / max
    same = [node_overrides(Plan(nodes=4, heterogeneous=False), i, 0, (4, 4)) for i in range(4)]
    assert not any(s.startswith(("optim.lr=", "tasks.datasets=")) for o in same for s in o)


def memory_plan(tmp_path: Path, **kw) -> Plan:
    base = dict(nodes=4, rounds=30, transport="memory", mixes=[(4, 4)], out=tmp_path,
                overrides=["eval.every=15"], kills=parse_kills("24:1:3"), partitions=parse_partitions("8-18"),
                hostile=parse_hostile("1:liar"))
    return Plan(**{**base, **kw})


def test_memory_testnet_survives_a_kill_a_partition_and_a_liar(tmp_path):
    assert run_testnet(memory_plan(tmp_path), "test", Console(file=open("/dev/null", "w")), quiet=True) == 0
    report = json.loads((tmp_path / "testnet.json").read_text())
    (run,) = report["runs"]
    assert all(n["rounds"] == 30 for n in run["nodes"])  # every node finished, the killed one too
    assert run["invalid_used"] == 0  # nothing the liar sent was ever trained on
    events = [e["event"] for e in run["events"]]
    assert "node1 killed at round 24" in events and "node1 restarted from its checkpoint of round 19" in events
    assert any(e.startswith("partition") for e in events) and "partition healed" in events
    rows = read_metrics(tmp_path / "mix4-4-seed0" / "node0")
    ids = {n["index"]: n["peer_id"] for n in run["nodes"]}
    other_half = {ids[i] for i in halves(4)[1]}
    # node0 runs one round per tick; groups pooled before the split live 5 rounds (pool_max_age_rounds)
    during = [r for r in rows if 14 <= r["round"] <= 17]
    after = [r for r in rows if 19 <= r["round"] <= 23]
    assert not any(set(r["external_used_by_sender"]) & other_half for r in during)
    assert any(set(r["external_used_by_sender"]) & other_half for r in after)
    assert run["nodes"][0]["final_heldout_pass1"] is not None and report["table"][0]["mix"] == "4/4"
    assert [n["specialty"] for n in run["nodes"]] == ["copy", "succ", "max", "copy"]
    assert 0.0 <= report["table"][0]["own_family_pass"] <= 1.0 and "own/other families" in \
        (tmp_path / "summary.txt").read_text()
    assert (tmp_path / "testnet.png").stat().st_size > 10_000 and "reproduce: test" in (tmp_path / "summary.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["p2pd", "libp2p"])
def test_processes_keep_training_through_a_sigkill_and_a_partition(tmp_path, transport):
    """Real `swarm-node join` processes on either network transport: the survivors never wait for
    the killed node, which resumes from its checkpoint; a partition stops groups crossing halves
    until it heals."""
    # killed at 12 (its checkpoint is round 10's: rounds 10-11 run again), back 8 rounds later; the
    # partition leaves 11 rounds inside its edges' slack and 11 after the heal's
    plan = Plan(nodes=4, rounds=58, mixes=[(4, 4)], out=tmp_path, kills=parse_kills("12:3:8"),
                partitions=parse_partitions("24-44"), min_round_s=0.3, timeout_s=240,
                overrides=["eval.every=40", "swarm.ingest.max_wait_s=0.5"], transport=transport)
    assert run_testnet(plan, "test", Console(file=open("/dev/null", "w")), quiet=True) == 0
    report = json.loads((tmp_path / "testnet.json").read_text())
    (run,) = report["runs"]
    assert run["transport"] == transport
    assert not run["timed_out"] and all(n["rounds"] == 58 for n in run["nodes"])
    killed = read_metrics(tmp_path / "mix4-4-seed0" / "node3")
    assert [r["round"] for r in killed] == list(range(58))  # resumed: nothing lost or logged twice
    events = [e["event"] for e in run["events"]]
    assert any("SIGKILLed" in e for e in events) and any("node3 restarted from" in e for e in events)
    assert any("node3 listening again after" in e for e in events)
    ids = {n["index"]: n["peer_id"] for n in run["nodes"]}
    rows = read_metrics(tmp_path / "mix4-4-seed0" / "node0")
    other_half = {ids[i] for i in halves(4)[1]}
    # node0's own rounds when the partition began and healed (it may lag the clock, the fastest node,
    # on a loaded machine); slack at each edge: a message staged before the partition may still be
    # verified for swarm.ingest.max_wait_s (0.5 s: at most 2 rounds) and its group pooled 5 rounds more
    partition = next(e["rounds"]["0"] for e in run["events"] if e["event"].startswith("partition"))
    healed = next(e["rounds"]["0"] for e in run["events"] if e["event"].startswith("healed"))
    inside = [r for r in rows if partition + 7 <= r["round"] <= healed - 3]
    assert len(inside) >= 5 and not any(set(r["external_used_by_sender"]) & other_half for r in inside)
    assert any(set(r["external_used_by_sender"]) & other_half for r in rows if r["round"] >= healed + 3)


def test_netem_loss_and_delay_in_memory_mode(tmp_path):
    from node.testnet.memory import MemoryTestnet

    plan = Plan(nodes=2, rounds=10, transport="memory", out=tmp_path, netem="delay 1ms loss 30%")
    result = MemoryTestnet(plan, (4, 4), 0, tmp_path / "run").run()
    assert result["bus"]["lost"] > 0 and all(read_metrics(Path(n["run_dir"]))[-1]["round"] == 9
                                             for n in result["nodes"])


def test_resume_keeps_finished_runs_and_refuses_another_plan(tmp_path):
    """A sweep killed after its first seed (or extended with --seeds) runs only what is missing."""
    from node.config.schema import ConfigError

    console = Console(file=open(Path(tmp_path, "console.txt"), "w"), width=120)
    plan = Plan(nodes=2, rounds=3, transport="memory", out=tmp_path / "sweep", seeds=1)
    assert run_testnet(plan, "first", console, quiet=True) == 0
    first = json.loads((tmp_path / "sweep" / "runs.json").read_text())
    plan.seeds = 2
    assert run_testnet(plan, "resumed", console, quiet=True, resume=True) == 0
    runs = json.loads((tmp_path / "sweep" / "runs.json").read_text())
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[0]["seconds"] == first[0]["seconds"]  # kept, not re-run
    with pytest.raises(ConfigError, match="rounds"):
        run_testnet(Plan(nodes=2, rounds=4, transport="memory", out=tmp_path / "sweep", seeds=2), "other",
                    console, quiet=True, resume=True)


def test_nodes_of_different_sizes_share_tier0_rollouts(tmp_path):
    """--model-sizes: a 64x2 and a 96x3 tiny node have one tokenizer, so each trains the other's
    completions with the sender's own log-probs (tier 0)."""
    from node.testnet.memory import MemoryTestnet

    plan = Plan(nodes=2, rounds=6, transport="memory", out=tmp_path, model_sizes=parse_sizes("64x2,96x3"),
                overrides=["loss.off_policy.sender_logprobs=true"])  # tier 0 used (the default: every peer tier 2)
    result = MemoryTestnet(plan, (4, 4), 0, tmp_path / "run").run()
    for node, (hidden, layers) in zip(result["nodes"], plan.model_sizes):
        assert f"model.hidden_size={hidden}" in node["overrides"] and f"model.num_layers={layers}" in node["overrides"]
        assert sum(r.get("ext_t0_samples") or 0 for r in read_metrics(Path(node["run_dir"]))) > 0



def test_memory_testnet_rate_limits_count_ticks_not_wall_seconds(tmp_path):
    """Once the fast nodes finish, the two half-speed nodes tick alone, many rounds a wall-clock second
    (seen: each banned the other after 21 rate_limited in a 600-round run). In memory mode a tick is a
    second of swarm time for the per-peer rate limits: 250 messages in one wall second are 250 ticks."""
    from node.testnet.memory import TICK_S, MemoryTestnet

    testnet = MemoryTestnet(Plan(nodes=2, rounds=1, transport="memory", out=tmp_path), (4, 4), 0, tmp_path / "run")
    testnet.tick = 0
    testnet._start(0)
    limiter = testnet.nodes[0].exchange.ingress.rate_limiter
    burst = int(limiter.limits.message_burst)
    assert all(limiter.allow("node1", 100) for _ in range(burst)) and not limiter.allow("node1", 100)
    for tick in range(1, 251):  # one message a tick from node1: well under messages_per_s
        testnet.tick = tick
        assert limiter.allow("node1", 100), tick
    assert TICK_S * limiter.limits.messages_per_s > 1


def test_memory_testnet_frees_its_nodes_when_a_run_ends_and_when_one_is_killed(tmp_path):
    """Node <-> exchange is a reference cycle: without an explicit release every finished run of a
    --compare sweep kept its models until the cyclic collector happened to run (a SmolLM2 sweep ran
    out of memory). With the collector off, only the testnet's own release can free them."""
    import gc

    from node.train.loop import Node
    from node.testnet.memory import MemoryTestnet

    def live_nodes() -> int:
        return sum(type(obj) is Node for obj in gc.get_objects())

    gc.collect()
    before = live_nodes()
    gc.disable()
    try:
        plan = Plan(nodes=3, rounds=6, transport="memory", out=tmp_path, kills=parse_kills("3:1:1"))
        result = MemoryTestnet(plan, (4, 4), 0, tmp_path / "run").run()
        assert live_nodes() == before
    finally:
        gc.enable()
    assert any(e["event"] == "node1 killed at round 3" for e in result["events"])
    assert all(read_metrics(Path(n["run_dir"]))[-1]["round"] == 5 for n in result["nodes"])
