"""scripts/bench/gossip/sim_scale.py: the bounded overlay model behind proto/PROTOCOL.md's 10,000-node
arithmetic stays within its bounds, reaches everyone, and its hops grow like log N."""
from __future__ import annotations

import json
import math

import pytest

from scripts.bench.gossip import sim_scale as sim


def test_the_model_keeps_its_bounds_reaches_all_and_hops_grow_like_log_n(tmp_path):
    out = tmp_path / "sim.json"
    assert sim.main(["--nodes", "64", "2000", "--samples", "10", "--json", str(out)]) == 0
    small, large = json.loads(out.read_text())["rows"]
    for row in (small, large):
        assert row["connections_max"] <= 12 and row["connections_mean"] >= 6
        assert row["reached_fraction_min"] == 1.0
        assert sim.D - 1 <= row["mesh_degree_mean"] <= sim.D_HI
        # a node forwards to its mesh but one: about D - 1 copies each, far from N - 1
        assert 3.0 < row["copies_per_delivery"] < sim.D_HI
        assert row["hops_to_reach_all_max"] >= math.log(row["nodes"], sim.D_HI)
    assert large["hops_to_reach_all_mean"] > small["hops_to_reach_all_mean"]
    assert large["groups_per_s_per_node"] == pytest.approx(2000 * 4 / 18.0)  # every node receives every group


def test_unbounded_connections_are_what_the_bound_changes():
    rows = [sim.simulate(64, low, high, samples=5, seed=1) for low, high in ((6, 12), (63, 63))]
    assert rows[0]["connections_max"] <= 12 < rows[1]["connections_mean"]
