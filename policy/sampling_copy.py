"""A lower-precision copy of the policy that samples the rollouts (`sampling.precision`).

    fp32   no copy: the learner's own weights sample (HFGenerator), as before
    bf16   a bf16 copy of every weight
    int8   every linear layer (the output layer included) as Int8Linear, the rest float32

The learner keeps training its float32 weights; after every optimizer step `refresh()` copies them
into the sampling copy in place (LoRA adapters merged on the way), and the behavior log-probs the
generator returns are the copy's own. The copy is therefore a different sampler than the learner:
the node corrects the mismatch with tis(...) (node/train/assembly.py, policy/ALGORITHMS.md).
"""
from __future__ import annotations

import copy
import time

import torch
from torch import Tensor, nn

from policy.generation import HFGenerator

COPY_DTYPES = {"bf16": torch.bfloat16, "int8": torch.float32}  # int8: what the non-linear layers keep


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 per output row (symmetric: scale = max|W_row| / 127) and x
    quantized the same way per token at every call; int8 x int8 -> int32 products (torch._int_mm),
    rescaled to float.

    Per token, not per tensor: PyTorch's dynamic quantization (torch.ao, deprecated) takes one
    activation scale for the whole batch, so a completion's log-probs would depend on the rows
    sampled beside it, and no recomputation could reproduce them; on SmolLM2 its mismatch to float32
    was 1.0-1.4 nats per token against 0.23 here (scripts/bench/policy/bench.py measures it)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))  # [out, in]
        self.register_buffer("weight_scale", torch.ones(out_features))  # [out]
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)  # [out]

    @torch.no_grad()
    def quantize_(self, weight: Tensor, bias: Tensor | None) -> None:
        """Load float weights [out, in] (and bias [out]) in place."""
        weight = weight.float()
        scale = weight.abs().amax(1).clamp_min(1e-12) / 127  # [out]
        self.weight.copy_(torch.round(weight / scale[:, None]).clamp_(-127, 127))  # [out, in]
        self.weight_scale.copy_(scale)
        if self.bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [N, in]
        scale = rows.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127  # [N, 1]
        quantized = torch.round(rows / scale).clamp_(-127, 127).to(torch.int8)  # [N, in]
        y = torch._int_mm(quantized, self.weight.t()).float().mul_(scale).mul_(self.weight_scale)  # [N, out]
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., out]


def linear_weight(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """(weight, bias) of a linear layer as the learner computes with it: a peft LoRA layer's base
    weight plus its active adapters' delta (unless already merged into the base)."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module.weight, module.bias
    weight = base.weight
    if not getattr(module, "merged", False):
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight = weight + module.get_delta_weight(adapter)  # [out, in]
    return weight, base.bias


def _skeleton(source: nn.Module) -> nn.Module:
    """A deep copy of `source` whose parameters are empty placeholders (no transient full-size
    copy) and whose LoRA layers are plain linear layers again (their base layer)."""
    memo = {id(p): nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False)
            for p in source.parameters()}
    shell = copy.deepcopy(source, memo)
    for name, module in list(shell.named_modules()):
        for child_name, child in list(module.named_children()):
            if getattr(child, "base_layer", None) is not None and hasattr(child, "lora_A"):
                setattr(module, child_name, child.base_layer)
    return shell


class SamplingCopy:
    """`source` (the learner's model) at `precision` ("bf16" or "int8"), for sampling only."""

    def __init__(self, source: nn.Module, precision: str):
        if precision not in COPY_DTYPES:
            raise ValueError(f"no sampling copy at precision {precision!r}: expected one of {', '.join(COPY_DTYPES)}")
        self.source, self.precision = source, precision
        self.model = _skeleton(source).eval()
        if precision == "int8":
            self._swap_linears()
        self.refresh_seconds: list[float] = []
        self.refresh(record=False)

    def _swap_linears(self) -> None:
        for module in list(self.model.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    replacement = Int8Linear(child.in_features, child.out_features, child.bias is not None)
                    setattr(module, name, replacement.to(child.weight.device))

    @torch.no_grad()
    def refresh(self, record: bool = True) -> None:
        """Copy the learner's current weights into the copy, in place (tied weights stay tied)."""
        started = time.perf_counter()
        sources = dict(self.source.named_modules())
        dtype = COPY_DTYPES[self.precision]
        # id of a learner tensor -> (that tensor, its copy): tied weights stay tied. The tensor is
        # held so a LoRA layer's merged weight (a temporary) cannot free its id for the next layer's.
        converted: dict[int, tuple[Tensor, nn.Parameter]] = {}
        for name, module in self.model.named_modules():
            source = sources[name]
            if isinstance(module, Int8Linear):
                module.quantize_(*linear_weight(source))
                continue
            if isinstance(module, nn.Linear):
                weights = dict(zip(("weight", "bias"), linear_weight(source)))
            else:
                weights = {key: value for key, value in source._parameters.items()}
            for key, value in weights.items():
                if value is not None and module._parameters.get(key) is not None:
                    module._parameters[key] = self._converted(value, module._parameters[key], dtype, converted)
        if record:
            self.refresh_seconds.append(time.perf_counter() - started)

    @staticmethod
    def _converted(value: Tensor, current: nn.Parameter, dtype: torch.dtype,
                   converted: dict[int, tuple[Tensor, nn.Parameter]]) -> nn.Parameter:
        """`current` (resized on the first call) holding `value` at `dtype`; one copy per learner tensor."""
        if id(value) in converted:
            return converted[id(value)][1]
        if current.shape != value.shape:  # the placeholder of the first refresh
            current = nn.Parameter(torch.empty(value.shape, dtype=dtype, device=value.device), requires_grad=False)
        current.copy_(value)
        converted[id(value)] = (value, current)
        return current


class CopySamplingGenerator(HFGenerator):
    """HFGenerator on a SamplingCopy: the rollouts' log-probs are the copy's; `refresh` re-copies
    the learner's weights first, so the next rollouts sample the updated policy."""

    sampler_is_learner = False

    def __init__(self, sampling_copy: SamplingCopy, tokenizer, max_batch: int = 64):
        super().__init__(sampling_copy.model, tokenizer, max_batch=max_batch)
        self.sampling_copy = sampling_copy

    @property
    def refresh_seconds(self) -> list[float]:
        return self.sampling_copy.refresh_seconds

    def refresh(self, policy_version: int) -> None:
        self.sampling_copy.refresh()
        super().refresh(policy_version)
