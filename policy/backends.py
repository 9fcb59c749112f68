"""Which generation backend a node runs: HF `generate` (policy/generation.py), on the learner's
weights or on a lower-precision copy of them (policy/sampling_copy.py), or vLLM in its own process
(policy/vllm_backend.py). Kept apart from all three so none imports another's module: this module
picks between them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

from policy.generation import Generator, HFGenerator
from policy.precision import bf16_is_native
from policy.sampling_copy import CopySamplingGenerator, SamplingCopy
from policy.vllm_backend import INSTALL_HINT, VLLMGenerator, find_vllm_python

if TYPE_CHECKING:
    from policy.models import LoadedPolicy

# Below this width a decode step is per-op overhead, not matrix products: a lower precision saves
# nothing there (the tiny model, 64 wide: python -m scripts.bench.policy.bench --quick) and costs a copy.
MIN_WIDTH_FOR_A_COPY = 256


def make_generator(
    backend: Literal["auto", "hf", "vllm"], policy: LoadedPolicy, max_batch: int = 64,
    precision: Literal["auto", "fp32", "bf16", "int8"] = "fp32", **vllm_options
) -> tuple[Generator, str]:
    """The generator and a line saying which backend and precision it is and why (the node prints it)."""
    if backend not in ("auto", "hf", "vllm"):
        raise ValueError(f"unknown generation backend {backend!r}: expected 'auto', 'hf' or 'vllm'")
    if precision not in ("auto", "fp32", "bf16", "int8"):
        raise ValueError(f"unknown sampling precision {precision!r}: expected 'auto', 'fp32', 'bf16' or 'int8'")
    why = "as configured"
    if backend == "auto":
        backend, why = auto_backend(policy, precision)
    if backend == "vllm":
        if precision in ("bf16", "int8"):
            raise ValueError(f"sampling.precision={precision} is the HF backend's sampling copy; vLLM samples at "
                             "model.dtype: set sampling.precision=auto or fp32, or sampling.backend=hf")
        generator = VLLMGenerator(policy, **vllm_options)
        return generator, (f"vllm {generator.vllm_version} in its own process, started in "
                           f"{generator.start_seconds:.0f} s ({why})")
    precision, precision_why = (auto_precision(policy) if precision == "auto" else (precision, "as configured"))
    if precision == "fp32":
        return (HFGenerator(policy.model, policy.tokenizer, max_batch=max_batch),
                f"hf ({why}), sampling with the learner's weights ({precision_why})")
    if precision == "int8" and policy.model.device.type != "cpu":
        raise ValueError("sampling.precision=int8 is a CPU sampler (per-token int8 products); on a GPU use bf16")
    sampling_copy = SamplingCopy(policy.model, precision)
    return (CopySamplingGenerator(sampling_copy, policy.tokenizer, max_batch=max_batch),
            f"hf ({why}), sampling from a {precision} copy of the weights refreshed after every optimizer "
            f"step ({precision_why})")


def auto_backend(policy: LoadedPolicy, precision: str = "auto") -> tuple[str, str]:
    """The fastest backend available for this policy, by what scripts/bench/policy/bench.py measured: vLLM
    on a GPU; on a CPU our HF path, which generated as fast as the CPU build of vLLM (float32; its
    bf16 is emulated and far slower without AVX512-BF16) and needs no 30 s engine start or ~3 GB."""
    if precision in ("bf16", "int8"):
        return "hf", f"auto: sampling.precision={precision} is the HF backend's sampling copy"
    if policy.model.device.type != "cuda":
        return "hf", ("auto: on CPU the HF path is as fast as vLLM's CPU build (scripts/bench/policy/bench.py); "
                      "sampling.backend=vllm runs vLLM anyway")
    if find_vllm_python() is None:
        return "hf", f"auto: no vLLM environment found; to use vLLM, {INSTALL_HINT}"
    return "vllm", "auto: a GPU and a vLLM environment"


def auto_precision(policy: LoadedPolicy) -> tuple[str, str]:
    """bf16 where the device computes it natively and the model is wide enough for it to matter,
    else the learner's own weights (scripts/bench/policy/bench.py measured each precision)."""
    model = policy.model
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        return "fp32", f"auto: the learner's weights are {str(dtype).removeprefix('torch.')} already"
    width = getattr(model.config, "hidden_size", 0)
    if width < MIN_WIDTH_FOR_A_COPY:
        return "fp32", (f"auto: a {width}-wide model decodes in per-op overhead, a lower precision would "
                        "not pay for its copy")
    if not bf16_is_native(model.device):
        return "fp32", ("auto: no native bf16 on this device (emulated bf16 is several times slower); "
                        "sampling.precision=int8 samples from an int8 copy")
    where = "GPU" if model.device.type == "cuda" else "CPU (AVX512-BF16 / AMX)"
    return "bf16", f"auto: bf16 is native on this {where}"
