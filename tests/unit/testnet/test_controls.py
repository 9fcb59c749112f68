"""The swarm-against-silo controls (README "Controls"), on real tiny nodes: the self-replay silo
(swarm.self_replay), the positive-only silo (loss.off_policy.own_failures) and frozen peers
(testnet --frozen-peers)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import pytest
from rich.console import Console
from safetensors.torch import load_file

from node.config.schema import load_config
from node.train.groups import compose
from node.train.loop import Node
from node.observe.metrics import read_metrics
from node.peers.self_replay import ORIGIN, SelfReplay
from node.service.assembly import build_exchange, solo_node
from node.testnet.plan import Plan, node_overrides
from node.testnet.runner import run_testnet
from node.train.warm_start import warm_model_config
from policy.models import load_policy
from policy.types import TIER_EXACT
from protocol import MemoryBus, MemoryTransport, NodeIdentity
from tests.support.tiny_node import tiny_cfg

J = 2
SILO = ["tasks.prompts_per_round=8", f"swarm.external_per_round={J}", "eval.every=0",
        "loss.off_policy.sender_logprobs=false", "loss.off_policy.peer_failures=drop"]  # tiny-warm's treatment


def content(group) -> tuple:
    return group.task.prompt_key, tuple(tuple(r.completion_ids) for r in group.rollouts)


def test_self_replay_fills_the_j_slots_with_own_earlier_groups_trained_as_peers_groups(tmp_path):
    node = solo_node(tiny_cfg("swarm.self_replay=true", *SILO), tmp_path)
    assert isinstance(node.exchange, SelfReplay) and not node.hinting
    sampled = []
    for r in range(2):
        local, _ = node.sampler.sample(node.source.batch(r, 8), [None] * 8, node.learner.policy_version)
        sampled.append(local)
        node.exchange.share(r, local)
        replayed = node.exchange.collect(r, local)
        if r == 0:
            assert replayed == []  # nothing earlier: the round's own groups are never offered to it
    earlier = {content(g): g for g in sampled[0] if not g.flat}
    assert len(earlier) >= J  # the test means something only if round 0 had more than J to choose from
    assert len(replayed) == J
    for group in replayed:
        original = earlier[content(group)]  # one of round 0's groups with reward variance
        assert group.origin == ORIGIN and group.meta["sender_round"] == 0
        assert all(r.tier == TIER_EXACT for r in group.rollouts)  # what a same-model peer's group gets
        assert all(r.tier is None for r in original.rollouts)  # our own group stays ours
    groups, _ = compose(sampled[1], replayed, "sapo")
    assert [g.external for g in groups] == [False] * 8 + [True] * J  # the learner's peer groups
    stats = node.learner.update(groups)
    correct = sum(c for g in replayed for c in g.correct)
    assert stats["ext_t2_samples"] == correct  # sender_logprobs = false: tier 2, ratio 1
    assert stats["ext_failures_dropped"] == sum(len(g.correct) for g in replayed) - correct  # peer_failures = drop


def test_the_silo_exchange_is_passed_in_where_the_node_is_assembled(tmp_path):
    """The loop builds no exchange (train/ is below peers/): a self-replay node without one is refused,
    and a swarm exchange for a self-replay config too."""
    cfg = tiny_cfg("swarm.self_replay=true", *SILO)
    with pytest.raises(ValueError, match="solo_node"):
        Node(cfg, tmp_path / "bare")
    node = solo_node(cfg, tmp_path / "silo")
    assert isinstance(node.exchange, SelfReplay)
    with pytest.raises(ValueError, match="cannot replay itself"):
        build_exchange(node.parts, NodeIdentity.generate(), MemoryTransport(MemoryBus(), "a"))


def test_self_replay_generates_nothing_and_its_training_is_charged(tmp_path):
    silo = Node(tiny_cfg(*SILO), tmp_path / "silo")  # building a node seeds the RNGs: one node at a time
    assert silo.exchange is None
    alone_rows = [silo.run_round(r) for r in range(6)]
    replay = solo_node(tiny_cfg("swarm.self_replay=true", *SILO), tmp_path / "replay")
    rows = list(zip(alone_rows, [replay.run_round(r) for r in range(6)]))
    for r, (alone, replaying) in enumerate(rows):
        assert replaying["groups_external"] == (0 if r == 0 else J)
        assert replaying.get("external_used_by_sender", {}) == ({} if r == 0 else {ORIGIN: J})
        assert all(1 <= age <= 5 for age in replaying["external_staleness_rounds"])  # swarm.pool.max_age_rounds
        assert replaying["rollouts_generated"] == 8 * 8 and replaying["tokens_generated"] > 0
    assert rows[0][0]["tokens_trained"] == rows[0][1]["tokens_trained"]  # round 0: the same node
    # round 1 samples the same groups from the same weights: only the replayed groups differ
    alone, replaying = rows[1]
    assert replaying["tokens_generated"] == alone["tokens_generated"]
    assert replaying["tokens_trained"] > alone["tokens_trained"]


def test_own_failures_drop_trains_own_groups_as_peer_drop_trains_peers():
    from tests.unit.policy.test_learner_external import local_group, make_learner

    def groups(tier):
        """Two groups of one node's samples, ours (tier None) or delivered as a peer's: one with two
        successes, one with formatted wrong answers only (partial credit, no correct sample)."""
        out = []
        for rewards in ((1.0, 0.0, 0.0, 1.0), (0.1, 0.0, 0.0, 0.1)):
            group = local_group(rewards)
            for sample in group.samples:
                sample.tier, sample.correct = tier, sample.reward == 1.0
            out.append(group)
        return out

    as_own = make_learner(external="grpo", own_failures="drop")
    as_peer = make_learner(external="grpo", peer_failures="drop", neg_damping=1.0)  # ours: undamped
    own_stats, peer_stats = as_own.update(groups(None)), as_peer.update(groups(2))
    assert own_stats["samples_trained"] == peer_stats["samples_trained"] == 2  # the two successes
    assert own_stats["own_failures_dropped"] == peer_stats["ext_failures_dropped"] == 2
    assert own_stats["own_groups_no_correct"] == peer_stats["ext_groups_no_correct"] == 1
    assert "ext_failures_dropped" not in own_stats and own_stats["loss"] == peer_stats["loss"]
    for a, b in zip(as_own.model.parameters(), as_peer.model.parameters()):  # the same step
        assert torch.equal(a, b)
    trained = make_learner(external="grpo")  # own_failures = train: the failures are pushed down too
    assert trained.update(groups(None))["samples_trained"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(as_own.model.parameters(), trained.model.parameters()))


def test_frozen_peers_never_change_and_measured_nodes_hear_only_them(tmp_path):
    plan = Plan(nodes=4, rounds=12, transport="memory", mixes=[(4, 4)], out=tmp_path, heterogeneous=False,
                frozen_peers=True, overrides=["eval.every=0"])
    assert run_testnet(plan, "test", Console(file=open("/dev/null", "w")), quiet=True, page_listen="") == 0
    (raw,) = json.loads((tmp_path / "runs.json").read_text())
    assert raw["frozen"] == [2, 3]
    ids = {n["index"]: n["peer_id"] for n in raw["nodes"]}
    run_dir = tmp_path / "mix4-4-seed0"

    def weights(index: int, round_index: int) -> dict:
        return load_file(run_dir / f"node{index}" / "checkpoints" / f"round-{round_index:06d}" / "model" /
                         "model.safetensors")

    for index in (2, 3):  # they ran every update, at lr 0: still the initial weights
        assert read_metrics(run_dir / f"node{index}")[-1]["policy_version"] == 12
        cfg = load_config(plan.preset, None, node_overrides(plan, index, 0, (4, 4)))
        start = load_policy(warm_model_config(cfg.warm, cfg.model)).model.state_dict()
        end = weights(index, 11)
        assert all(torch.equal(end[k], start[k]) for k in end)
    for index in (0, 1):
        assert any(not torch.equal(weights(index, 9)[k], weights(index, 11)[k]) for k in weights(index, 11))
        used = [s for r in read_metrics(run_dir / f"node{index}") for s, n in r.get("external_used_by_sender", {}).items()
                for _ in range(n)]
        assert used and set(used) <= {ids[2], ids[3]}  # never a measured node's group
    report = json.loads((tmp_path / "testnet.json").read_text())
    assert [n["index"] for n in report["runs"][0]["nodes"]] == [0, 1]  # frozen peers are not measured
    assert "frozen peers" in (tmp_path / "summary.txt").read_text()
