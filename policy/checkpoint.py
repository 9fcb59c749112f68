"""Atomic checkpoints: a killed node resumes exactly where its last checkpoint left it.

Layout under `<run_dir>/checkpoints/`:
    round-000050/model/        save_pretrained weights (or the LoRA adapter) + tokenizer
    round-000050/state.pt      optimizer, RNG states (torch CPU and every CUDA device, python, numpy),
                               round counter, extra
    round-000050/config.json   the node config that produced it
    round-000050/<name>        any `files` the caller adds (a node: exchange.json, its admission state)
    LATEST                     name of the newest complete checkpoint

A checkpoint is written into a hidden temp directory and renamed into place, and LATEST is
replaced atomically after that, so a SIGKILL at any moment leaves either the previous or the new
checkpoint complete, never a torn one.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

from policy.ground import atomic_write_text, fsync_dir

LATEST = "LATEST"


@dataclass
class Checkpoint:
    path: Path
    round_index: int  # the last completed round; training resumes at round_index + 1
    state: dict


def rng_state() -> dict:
    """Every generator a round draws from: sampling on a GPU draws from CUDA's, not the CPU's."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()  # one per visible device
    return state


def restore_rng(state: dict) -> None:
    """Restores what rng_state saved. A checkpoint written on a GPU resumed on a machine without one
    (or the reverse) restores what both have: the run goes on, but its draws differ from then on."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        devices = min(len(cuda), torch.cuda.device_count())
        for index in range(devices):
            torch.cuda.set_rng_state(cuda[index], index)


def save_checkpoint(run_dir: Path, round_index: int, model, tokenizer, optimizer: torch.optim.Optimizer,
                    config: dict, extra: dict | None = None, keep: int = 2, files: dict[str, str] | None = None) -> Path:
    hf_logging.disable_progress_bar()  # a bar per checkpoint would drown the round table
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"round-{round_index:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"round": round_index, "optimizer": optimizer.state_dict(), "rng": rng_state(),
                "extra": extra or {}}, tmp / "state.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
    for file_name, text in (files or {}).items():  # inside the temp dir: renamed into place with the rest
        (tmp / file_name).write_text(text)
    fsync_dir(tmp)
    final = root / name
    if final.exists():  # re-running a round after a resume: the new one replaces it
        shutil.rmtree(final)
    os.rename(tmp, final)
    atomic_write_text(root / LATEST, name)  # fsyncs root: the checkpoint's rename is durable with it
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("round-*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # torn writes of a killed process
        if not str(stale).endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint_path(run_dir: Path) -> Path | None:
    """The newest complete checkpoint's directory (what LATEST names), without loading it."""
    root = Path(run_dir) / "checkpoints"
    marker = root / LATEST
    return root / marker.read_text().strip() if marker.is_file() else None


def latest_round(run_dir: Path) -> int | None:
    """The round of the newest complete checkpoint (from its name), without loading it."""
    path = latest_checkpoint_path(run_dir)
    return None if path is None else int(path.name.removeprefix("round-"))


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    path = latest_checkpoint_path(run_dir)
    if path is None:
        return None
    state = torch.load(path / "state.pt", weights_only=False)  # our own file: RNG states are pickled
    return Checkpoint(path=path, round_index=int(state["round"]), state=state)


def load_weights(model: torch.nn.Module, checkpoint: Checkpoint) -> None:
    """Load checkpoint weights into an already-built model (full model or peft-wrapped)."""
    folder = checkpoint.path / "model"
    adapter = folder / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(adapter))
        return
    weights = load_file(folder / "model.safetensors")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"checkpoint {folder} does not match the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}; was it written with a different model config?")
    if tied:
        model.tie_weights()
