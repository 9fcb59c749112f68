"""Which generation backend a node runs: HF `generate` (policy/generation.py) or vLLM in its own
process (policy/vllm_backend.py). Kept apart from both so neither imports the other's module:
vllm_backend builds on generation's shared helpers, and this module picks between them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from policy.generation import Generator, HFGenerator
from policy.vllm_backend import INSTALL_HINT, VLLMGenerator, find_vllm_python

if TYPE_CHECKING:
    from policy.models import LoadedPolicy


def make_generator(
    backend: Literal["auto", "hf", "vllm"], policy: LoadedPolicy, max_batch: int = 64, **vllm_options
) -> tuple[Generator, str]:
    """The generator and a line saying which backend it is and why (the node prints it)."""
    if backend not in ("auto", "hf", "vllm"):
        raise ValueError(f"unknown generation backend {backend!r}: expected 'auto', 'hf' or 'vllm'")
    why = "as configured"
    if backend == "auto":
        backend, why = auto_backend(policy)
    if backend == "hf":
        return HFGenerator(policy.model, policy.tokenizer, max_batch=max_batch), f"hf ({why})"
    generator = VLLMGenerator(policy, **vllm_options)
    return generator, (f"vllm {generator.vllm_version} in its own process, started in "
                       f"{generator.start_seconds:.0f} s ({why})")


def auto_backend(policy: LoadedPolicy) -> tuple[str, str]:
    """The fastest backend available for this policy, by what scripts/bench_policy.py measured: vLLM
    on a GPU; on a CPU our HF path, which generated as fast as the CPU build of vLLM (float32; its
    bf16 is emulated and far slower without AVX512-BF16) and needs no 30 s engine start or ~3 GB."""
    if policy.model.device.type != "cuda":
        return "hf", ("auto: on CPU the HF path is as fast as vLLM's CPU build (scripts/bench_policy.py); "
                      "sampling.backend=vllm runs vLLM anyway")
    if find_vllm_python() is None:
        return "hf", f"auto: no vLLM environment found; to use vLLM, {INSTALL_HINT}"
    return "vllm", "auto: a GPU and a vLLM environment"
