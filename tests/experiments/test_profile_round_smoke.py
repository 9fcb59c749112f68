"""scripts/bench/policy/profile_round.py runs in-process on the tiny preset (one profiled round on the
CPU, seconds) and writes its figures; the learner's optimizer step stays free of per-statistic syncs."""
import json

from scripts.bench.policy import profile_round

# Host syncs (scalar reads and nonzero calls) inside one optimizer step of the learner, AdamW's own
# CPU step counters apart, measured on the tiny preset (CPU, torch 2.13, transformers 5.23): 4 = two
# `padding_mask.all()` checks in transformers' create_causal_mask (its forward) + the nonzero of the
# two boolean-indexed statistics (ratio_stats, sampler_mismatch; kept so their values stay bit-exact).
# The one transfer that reads the step's statistics is a .tolist(), which a CPU run cannot count.
# Before the statistics stayed on the device it was 18: float() on clip_frac (2), ratio_mean/max
# (2), sampler_logp_diff/kl (2), the claims fraction (2), loss (1), grad_norm (1), and a nonzero per
# tier to find its rows (4). 6 leaves room for a transformers version with another mask check, and
# fails as soon as three of those reads come back.
MAX_SYNCS_PER_STEP = 6


def test_profile_round_writes_phases_top_ops_and_sync_counts(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert profile_round.main(["--preset", "tiny", "--rounds", "1", "--device", "cpu", "--threads", "1",
                               "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["phases"]["t_generate"] > 0 and result["phases"]["t_train"] > 0
    assert set(profile_round.PHASES) <= set(result["phases"]) and len(result["phases_per_round"]) == 1
    ops = result["top_ops_self_cpu"]
    assert 0 < len(ops) <= profile_round.TOP and all(op["name"] and op["calls_per_round"] > 0 for op in ops)
    assert not any(op["name"].startswith("profile_round.") for op in ops)  # our labels are not ops
    assert isinstance(result["host_syncs"], int) and result["host_syncs"] >= 0
    assert result["host_syncs_per_round"] == [result["host_syncs"]]
    assert result["optimizer_steps_per_round"] == [1.0]
    assert 0 < result["syncs_per_optimizer_step"] <= MAX_SYNCS_PER_STEP, result["syncs_by_phase_per_round"]
    assert "host syncs per round" in capsys.readouterr().out
