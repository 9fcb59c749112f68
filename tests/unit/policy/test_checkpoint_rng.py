"""A resumed run continues with the same random draws as one that was never stopped, on the device it
ran on: checkpoints carry every generator a round draws from, CUDA's included (policy/checkpoint.py)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from node.observe.metrics import RoundTable, read_metrics
from node.train.loop import Node
from policy import checkpoint
from policy.checkpoint import restore_rng, rng_state

from tests.support.tiny_node import tiny_cfg


def next_draws() -> dict:
    draws = {"torch": torch.rand(6).tolist(), "python": [random.random() for _ in range(3)],
             "numpy": np.random.rand(3).tolist()}
    if torch.cuda.is_available():
        draws["cuda"] = torch.rand(6, device="cuda").tolist()
    return draws


def run_then_draw(cfg, run_dir, rounds: int, resume: bool = False) -> tuple[list[dict], dict]:
    node = Node(cfg, run_dir)
    if resume:
        node.resume()
    node.run(rounds, RoundTable("test", quiet=True))
    node.close()
    return read_metrics(run_dir), next_draws()


def test_a_resumed_run_draws_what_an_uninterrupted_one_draws(tmp_path):
    """6 rounds straight vs 3 + resume (after other draws clobbered every generator) + 3: the sampled
    completions' rewards match round by round, and the generators stand at the same place after."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU path where there is one
    cfg = tiny_cfg("run.checkpoint_every=3", f"model.device={device}", "sampling.temperature=1.0")
    straight_rows, straight = run_then_draw(cfg, tmp_path / "a", 6)
    run_then_draw(cfg, tmp_path / "b", 3)
    torch.manual_seed(12345), random.seed(12345), np.random.seed(12345)  # what another process would hold
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(12345)
    resumed_rows, resumed = run_then_draw(cfg, tmp_path / "b", 6, resume=True)
    assert [(r["reward_mean"], r["tasks_digest"]) for r in resumed_rows] == \
        [(r["reward_mean"], r["tasks_digest"]) for r in straight_rows]
    assert resumed == straight


def test_checkpoint_state_keeps_and_restores_cuda_generators(monkeypatch):
    """The CUDA branch on a machine without a GPU: torch.cuda is replaced by a two-device stand-in
    (the real one runs in the test above wherever torch sees a GPU)."""
    saved = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    restored: dict[int, list[int]] = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in saved])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.update({device: state.tolist()}))
    state = rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[1, 2], [3, 4]]
    restore_rng(state)
    assert restored == {0: [1, 2], 1: [3, 4]}

    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # resumed where fewer devices are visible
    restore_rng(state)
    assert restored == {0: [1, 2]}


def test_a_gpu_checkpoint_resumes_on_a_cpu_machine(monkeypatch):
    state = rng_state()
    state["cuda"] = [torch.tensor([9], dtype=torch.uint8)]  # as written on a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    expected = torch.rand(3)
    torch.set_rng_state(state["torch"])  # rewind: restore_rng must land here again
    restore_rng(state)
    assert torch.rand(3).tolist() == pytest.approx(expected.tolist())
    assert checkpoint.rng_state().get("cuda") is None
