"""scripts/bench/policy/bench.py runs end to end in its --quick mode (tiny model) and writes its report."""
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_policy_quick_writes_json_and_png(tmp_path):
    args = [sys.executable, "-m", "scripts.bench.policy.bench", "--quick", "--gen-reps", "1", "--steps", "1",
            "--out", str(tmp_path)]
    with_trl = importlib.util.find_spec("trl") is not None
    if not with_trl:
        args.append("--skip-trl")
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench_policy.json").read_text())
    assert (tmp_path / "bench_policy.png").stat().st_size > 0
    gen = result["generation"]["batches"]["8"]  # quick: 2 prompts x G=4
    for side in ("hf-fp32", "hf-bf16", "hf-int8"):  # every sampling precision, the same work as plain generate
        assert gen["ratio_vs_plain"][side] > 0 and gen[side]["tokens"] == gen["plain"]["tokens"] == [8 * 8]
    assert "vllm" not in gen  # the tiny model's head dim is not one vLLM's CPU attention supports
    facts = result["generation"]["precisions"]
    assert facts["hf-fp32"]["mean_abs_logp_diff"] < 1e-5 < facts["hf-int8"]["mean_abs_logp_diff"]
    assert facts["hf-int8"]["refresh_s"] > 0 and facts["hf-fp32"]["refresh_s"] == 0
    memory = result["memory"]
    assert [(m["config"], m["backend"]) for m in memory] == [("full", "hf"), ("lean", "hf")]
    assert all(100 < m["total_peak_rss_mib"] < 4096 for m in memory)
    assert memory[1]["objective"] == "grpo" and "optim.lora_rank=8" in memory[1]["overrides"]
    assert result["training"]["precision"] == "fp32"  # auto on the tiny model: the learner's own weights
    ours = result["training"]["ours"]
    assert ours["tok_s_median"] > 0 and ours["tokens"] == [2 * 4 * 8]  # prompts x G x max_new_tokens
    # every group is trained, as TRL does; rows at advantage 0 are counted but not forwarded
    assert [a + b for a, b in zip(ours["samples_trained"], ours["zero_adv_rows_skipped"])] == [2 * 4]
    if with_trl:
        trl = result["training"]["trl"]
        assert trl["tokens"] == ours["tokens"] and result["training"]["ratio"] > 0
        assert result["training"]["prompts_identical"] is True


def test_bench_policy_without_trl_exits_2_with_the_install_command(tmp_path, monkeypatch, capsys):
    # imported here, on a copy of the environment and warning filters: the module sets the benchmark's
    # offline environment and quiets FutureWarning, which must not leak into the rest of the session
    monkeypatch.setattr(os, "environ", os.environ.copy())
    with warnings.catch_warnings():
        from scripts.bench.policy import bench

    monkeypatch.setattr(bench, "trl_available", lambda: False)
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 2
    assert ".venv/bin/pip install trl==1.16.0" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_learner_update_measures_both_sides():
    """--learner-update on the tiny model: both sides run (each in its own process) and the ratio is printed."""
    args = [sys.executable, "-m", "scripts.bench.policy.bench", "--learner-update", "--model", "tiny", "--prompts", "2",
            "--group-size", "4", "--max-new-tokens", "8", "--steps", "1", "--threads", "1"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sides = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [s["shared_prefix"] for s in sides] == ["off", "on"]
    assert all(s["rows"] == 8 and s["s_per_update"] > 0 and s["peak_rss_mib"] > 0 for s in sides)
    assert "learner update:" in proc.stdout and "x faster" in proc.stdout
