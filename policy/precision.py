"""bf16 autocast for the learner's forward passes, and whether this device computes bf16 natively."""
from __future__ import annotations

import contextlib
import functools
from typing import Literal

import torch


def bf16_is_native(device: torch.device) -> bool:
    """Does this device compute bf16 in hardware? (AVX2-only CPUs emulate it, about 6x slower.)"""
    return torch.cuda.is_bf16_supported() if device.type == "cuda" else _cpu_has_bf16()


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_context(enabled: bool | Literal["auto"], device: torch.device):
    if enabled == "auto":
        enabled = bf16_is_native(device)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
