"""Hostile testnet peers (node/hostile/peer.py) against a real tiny node on the in-process bus.

For every kind: a receiver node, an honest tiny peer node and one HostilePeer share a MemoryBus;
each round the honest peer trains and shares, the hostile peer steps, the receiver trains. The
receiver must never crash; INVALID kinds show up under their reject reason and nothing of theirs is
trained on or kept as a hint; VALID-but-hostile kinds may be used, but the receiver keeps training
and keeps using the honest peer's groups."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.scoring.verifiers import Verifier
from node.train.loop import Node
from node.observe.metrics import read_metrics
from node.service.assembly import memory_bus_node
from node.tasks import make_source
from node.hostile.peer import (
    EXPECTED_REASONS,
    FLOOD_FACTOR,
    INVALID_KINDS,
    KINDS,
    POSSIBLE_REASONS,
    VALID_KINDS,
    HostilePeer,
    is_valid_kind,
    marker,
)
from protocol import MemoryBus, MemoryTransport, NodeIdentity, topic_name

from tests.support.processes import repo_env
from tests.support.tiny_node import tiny_cfg

ROOT = Path(__file__).resolve().parents[3]
SWARM = "hx"
ROUNDS = 4


def tiny_node(tmp_path: Path, name: str, bus: MemoryBus, extra=()) -> Node:
    cfg = tiny_cfg(f"swarm.name={SWARM}", *extra)
    node = memory_bus_node(cfg, tmp_path / name, bus, name)
    return node


def hostile_peer(kind: str, bus: MemoryBus, like: Node, **kwargs) -> HostilePeer:
    """A hostile peer whose task source and verifier are configured like the honest nodes'."""
    transport = MemoryTransport(bus, f"hostile-{kind}")
    transport.start()
    cfg = like.cfg
    return HostilePeer(kind, transport, SWARM, make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed),
                       Verifier.from_config(cfg.verifier), seed=7, **kwargs)


def record(exchange, name: str, into: list) -> None:
    """Wrap exchange.<name> so that everything it hands to the node is also appended to `into`."""
    original = getattr(exchange, name)

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        into.extend(out)
        return out

    setattr(exchange, name, wrapped)


# With J = 4 external groups per round and per-sender sampling, at most J - 1 new sybil senders a
# round leave the honest peer a slot every round. More crowd it out: measured over 8 rounds, the
# honest share of the external mix is ~0.41 with 3 sybil keys a step, ~0.13 with 8, ~0.04 with 32.
PER_STEP = {"sybil": 3}


@pytest.mark.parametrize("kind", KINDS)
def test_receiver_survives_each_hostile_kind(kind, tmp_path):
    bus = MemoryBus()
    receiver = tiny_node(tmp_path, "receiver", bus)
    honest = tiny_node(tmp_path, "honest", bus, ["run.seed=1", "tasks.seed=1"])
    hostile = hostile_peer(kind, bus, receiver, per_step=PER_STEP.get(kind, 8))
    used, handed_hints = [], []
    record(receiver.exchange, "collect", used)
    record(receiver.exchange, "take_hints", handed_hints)

    sent = 0
    for round_index in range(ROUNDS):
        honest.metrics.append(honest.run_round(round_index))
        sent += hostile.step(round_index)
        receiver.metrics.append(receiver.run_round(round_index))  # must not raise

    rows = read_metrics(tmp_path / "receiver")
    assert [r["round"] for r in rows] == list(range(ROUNDS))  # never crashed, never skipped a round
    assert [r["policy_version"] for r in rows] == sorted({r["policy_version"] for r in rows})  # kept training
    assert sent > 0 and hostile.counters["messages"] == sent

    status = receiver.exchange.status()
    reasons = status["rejected_by_reason"]
    for reason in EXPECTED_REASONS[kind]:
        assert reasons.get(reason, 0) >= 1, (kind, reason, reasons)
    unexpected = {r for r, n in reasons.items() if n} - POSSIBLE_REASONS[kind]
    assert not unexpected, (kind, reasons)

    honest_id = honest.exchange.peer_id
    bad = set(hostile.identities())
    scores = {p.peer_id: p for p in status["peers"]}
    assert not scores[honest_id].banned and scores[honest_id].score > 0  # nobody got the honest peer blamed
    assert status["used_by_sender"].get(honest_id, 0) > 0  # its groups were still trained on
    assert all(g.origin == honest_id or g.origin in bad for g in used)
    used_by_metrics = {s for r in rows for s, n in r["external_used_by_sender"].items() if n}
    assert used_by_metrics == set(status["used_by_sender"])

    if kind in INVALID_KINDS:
        assert not used_by_metrics & bad and not set(status["used_by_sender"]) & bad
        assert not any(g.meta.get("tokenizer") == marker(kind) for g in used)  # forged ones included
        assert not any(h.sender in bad for h in handed_hints)
        kept = {text for state in receiver.hints.states.values() for text in state.levels.values()}
        assert not kept & set(hostile.hint_texts)
        assert all(not scores[i].score > 0 for i in bad if i in scores)  # never earned credit
    else:
        assert sum(scores[i].accepted for i in bad if i in scores) > 0  # its messages really were valid


def test_flood_is_rate_limited_and_capped_in_the_pool(tmp_path):
    bus = MemoryBus()
    receiver = tiny_node(tmp_path, "receiver", bus)
    honest = tiny_node(tmp_path, "honest", bus, ["run.seed=1", "tasks.seed=1"])
    flood = hostile_peer("flood", bus, receiver, per_step=8)
    for round_index in range(2):
        honest.run_round(round_index)
        assert flood.step(round_index) == 8 * FLOOD_FACTOR
        receiver.run_round(round_index)
    exchange = receiver.exchange
    assert exchange.status()["rejected_by_reason"]["rate_limited"] >= 1
    flooder = flood.identities()[0]
    assert sum(e.group.origin == flooder for e in exchange.pool.entries) <= exchange.pool.max_per_sender
    # the flood re-signs the same 8 groups each step: copies are refused as duplicates (pool cap
    # eviction itself: tests/unit/peers/test_exchange.py::test_per_sender_sampling_and_cap_resist_a_flooding_peer)
    assert exchange.status()["rejected_by_reason"]["duplicate_content"] >= 1
    assert flood.identities() == [flooder]  # one key


def test_learning_from_traffic_and_identities(tmp_path):
    bus = MemoryBus()
    receiver = tiny_node(tmp_path, "receiver", bus)
    forger = hostile_peer("forged", bus, receiver, per_step=4)
    sybil = hostile_peer("sybil", bus, receiver, per_step=6, sybil_keys=4)
    junk = hostile_peer("hint_junk", bus, receiver)
    replay = hostile_peer("replay", bus, receiver)
    assert junk.step(0) == 0 and replay.step(0) == 0  # nothing heard yet: nothing to answer or replay
    receiver.run_round(0)  # shares its groups and asks for hints (a fresh tiny model fails most)
    forger.step(1)
    assert forger.claimed_identities() == [receiver.exchange.peer_id]  # learned the only honest key
    assert forger.identities() == [forger.identity.peer_id()]
    assert sybil.step(1) == 6
    assert len(sybil.identities()) == 1 + 4 and len(set(sybil.identities())) == 5  # main key + 4 rotated keys
    assert junk.step(1) > 0 and junk.learned["requested"] > 0
    assert replay.step(1) > 0
    with pytest.raises(ValueError):
        hostile_peer("nonsense", bus, receiver)


def test_kinds_are_classified():
    assert set(INVALID_KINDS) | set(VALID_KINDS) == set(KINDS) and not set(INVALID_KINDS) & set(VALID_KINDS)
    assert set(EXPECTED_REASONS) == set(POSSIBLE_REASONS) == set(KINDS)
    assert all(set(EXPECTED_REASONS[k]) <= POSSIBLE_REASONS[k] for k in KINDS)
    assert is_valid_kind("garbage") and not is_valid_kind("liar")
    with pytest.raises(ValueError):
        is_valid_kind("nonsense")


@pytest.mark.slow
@pytest.mark.serial
def test_process_entry_point_against_a_libp2p_node(tmp_path, tiny_config):
    """`python -m node.hostile.process --kind liar ... --rounds 2` against an in-process tiny node
    on a real libp2p transport (127.0.0.1): it connects, lies, is caught, and exits with a summary."""
    from node.train.assembly import build_parts
    from node.service.assembly import build_exchange
    from protocol.transports.libp2p import Libp2pOptions, Libp2pTransport

    cfg = tiny_config(f"swarm.name={SWARM}")
    identity = NodeIdentity.generate()
    transport = Libp2pTransport(identity.private_seed(), Libp2pOptions(
        listen=["/ip4/127.0.0.1/tcp/0"], topics=[topic_name(SWARM, k) for k in ("rollouts", "hints", "hint-requests")]))
    transport.start()
    out, log = tmp_path / "hostile.json", open(tmp_path / "hostile.log", "wb")
    proc = node = None
    try:
        parts = build_parts(cfg)
        node = Node(cfg, tmp_path / "node", build_exchange(parts, identity, transport), parts=parts)
        cmd = [sys.executable, "-m", "node.hostile.process", "--kind", "liar", "--peers", *transport.listen_addrs(),
               "--swarm", SWARM, "--preset", "tiny", "--set", "run.threads=1", "--rounds", "2", "--period-s", "1",
               "--per-step", "4", "--out", str(out), "--connect-timeout-s", "15"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=repo_env(), stdout=log, stderr=log)
        deadline = time.monotonic() + 28
        round_index = 0
        while time.monotonic() < deadline:
            node.run_round(round_index)
            round_index += 1
            if proc.poll() is not None and node.exchange.status()["rejected_by_reason"].get("wrong_reward"):
                break
            time.sleep(0.2)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, (tmp_path / "hostile.log").read_text()
        summary = json.loads(out.read_text())
        assert summary["kind"] == "liar" and summary["steps"] == 2 and summary["counters"]["lying_group"] == 8
        assert summary["identities"] == [summary["peer_id"]]  # one key: envelope signer = libp2p host
        status = node.exchange.status()
        assert status["rejected_by_reason"].get("wrong_reward", 0) >= 1, status["rejected_by_reason"]
        assert summary["peer_id"] not in status["used_by_sender"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if node is not None and node.exchange is not None:
            node.exchange.close()  # its background ingest thread
        transport.close()
        log.close()
