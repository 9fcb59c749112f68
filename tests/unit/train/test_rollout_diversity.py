"""The own rollouts' diversity of a round (node/train/rollouts.py diversity_stats): sampling entropy,
distinct completions per group, flat-group share; on hand-built groups, through the real sampler
with a prefix hint, in the testnet report and on /metrics."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node.train.assembly import build_parts
from node.train.groups import HintUse, ScoredGroup
from node.observe.prometheus import node_registry
from node.observe.state import NodeObserver
from node.train.rollouts import RolloutSampler, diversity_stats
from node.tasks.synthetic import SyntheticSource
from node.testnet.report import node_summary, run_summary, sapo_table, text_summary
from policy.types import Rollout

from tests.support.tiny_node import tiny_cfg

TASK = SyntheticSource({"copy": 1.0}, seed=0).batch(0, 1)[0]


def rollout(completion: list[int], entropy: float | None, hint_tokens: int = 0) -> Rollout:
    return Rollout(prompt_ids=[1], completion_ids=completion, logprobs=[-1.0] * len(completion), text="",
                   offsets=[(0, 0)] * len(completion), truncated=False, hint_tokens=hint_tokens, entropy=entropy)


def scored(rollouts: list[Rollout], rewards: list[float]) -> ScoredGroup:
    return ScoredGroup(task=TASK, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards])


def test_diversity_of_hand_built_groups():
    """Entropy is averaged over generated tokens (a forced hint prefix carries no entropy), rollouts
    without a measurement are left out of it; distinct sequences and flat groups are counted per group."""
    flat = scored([rollout([3, 4], 1.0), rollout([3, 4], 2.0), rollout([5], 4.0)], [1.0, 1.0, 1.0])
    varied = scored([rollout([3], 1.0), rollout([6], None), rollout([9, 9, 3], 0.5, hint_tokens=2),
                     rollout([8, 2], 0.25)], [0.0, 1.0, 0.0, 0.5])
    stats = diversity_stats([flat, varied])
    tokens = 2 + 2 + 1 + 1 + 1 + 2  # the None rollout and the 2 prefix tokens are not counted
    entropy = (1.0 * 2 + 2.0 * 2 + 4.0 + 1.0 + 0.5 + 0.25 * 2) / tokens
    assert stats == {"entropy_mean": pytest.approx(entropy), "distinct_completions": (2 + 4) / 2,
                     "flat_group_share": 0.5}
    unmeasured = scored([rollout([3], None), rollout([3], None)], [0.0, 0.0])  # vLLM: no entropy
    assert diversity_stats([unmeasured]) == {"entropy_mean": None, "distinct_completions": 1.0,
                                             "flat_group_share": 1.0}
    assert diversity_stats([]) == {"entropy_mean": None, "distinct_completions": None, "flat_group_share": None}


def test_sampler_stats_through_the_real_generator_with_a_prefix_hint():
    """A prefix-hinted group's forced tokens keep the entropy of the tokens generated after them;
    the round's stats are the three numbers recomputed from the returned groups."""
    cfg = tiny_cfg()
    parts = build_parts(cfg)
    sampler = RolloutSampler(parts.sampling, cfg.sampling.group_size, cfg.allocation, parts.pass_rates, True)
    tasks = parts.source.batch(0, 3)
    hints = [None, HintUse("prefix", tasks[1].answer or "1"), None]
    groups, stats = sampler.sample(tasks, hints, 0)
    hinted = [r for r in groups[1].rollouts if r.hint_tokens]
    assert hinted and all(r.entropy is not None and 0 < r.entropy <= math.log(16) for r in hinted)
    assert all(r.entropy is not None for g in groups for r in g.rollouts)
    expected = diversity_stats(groups)
    assert {k: stats[k] for k in expected} == expected
    assert 0 < stats["entropy_mean"] <= math.log(16) and 1 <= stats["distinct_completions"] <= cfg.sampling.group_size


def write_rows(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_testnet_report_averages_the_last_fifth_of_each_nodes_rounds(tmp_path):
    """10 rounds: the last 2 count. node1 ran vLLM (no entropy): "-" rather than a number."""
    write_rows(tmp_path / "n0", [{"round": i, "reward_mean": 0.0, "entropy_mean": 9.0 if i < 8 else 0.1 * i,
                                  "distinct_completions": 1.0 + (i >= 8), "flat_group_share": 0.25 * (i >= 8)}
                                 for i in range(10)])
    write_rows(tmp_path / "n1", [{"round": i, "reward_mean": 0.0, "entropy_mean": None, "distinct_completions": 3.0,
                                  "flat_group_share": 1.0} for i in range(10)])
    nodes = [{"index": i, "run_dir": str(tmp_path / f"n{i}")} for i in range(2)]
    summary = node_summary(nodes[0], set(), set())
    assert summary["entropy_mean"] == pytest.approx(0.85)
    assert (summary["distinct_completions"], summary["flat_group_share"]) == (2.0, 0.25)
    assert node_summary(nodes[1], set(), set())["entropy_mean"] is None
    runs = [run_summary({"mix": "2/0", "seed": 0, "transport": "memory", "seconds": 1.0, "nodes": nodes})]
    text = text_summary({"plan": {"nodes": 2, "rounds": 10, "preset": "tiny", "transport": "memory"},
                         "command": "swarm-node testnet", "runs": runs, "table": sapo_table(runs)})
    assert "last 20%: entropy 0.850 nats, distinct/group 2.00, flat groups 25%" in text
    assert "last 20%: entropy - nats, distinct/group 3.00, flat groups 100%" in text


def scrape(run_dir: Path) -> dict[str, float]:
    observer = NodeObserver(run_dir, "t", {}, lambda: {"round": 1, "policy_version": 1})
    text = generate_latest(node_registry(observer)).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_prometheus_gauges_of_the_newest_row_and_no_entropy_when_unmeasured(tmp_path):
    write_rows(tmp_path / "hf", [{"round": 0, "reward_mean": 0.5, "entropy_mean": 1.25, "distinct_completions": 3.5,
                                  "flat_group_share": 0.75}])
    values = scrape(tmp_path / "hf")
    assert values["swarm_node_sampling_entropy_nats"] == 1.25
    assert values["swarm_node_distinct_completions_per_group"] == 3.5
    assert values["swarm_node_flat_group_ratio"] == 0.75
    write_rows(tmp_path / "vllm", [{"round": 0, "reward_mean": 0.5, "entropy_mean": None, "distinct_completions": 2.0,
                                    "flat_group_share": 0.0}])
    values = scrape(tmp_path / "vllm")
    assert "swarm_node_sampling_entropy_nats" not in values  # absent, not a made-up 0
    assert values["swarm_node_flat_group_ratio"] == 0.0
