"""The update step: groups of scored completions in, optimizer steps out.

One call of `Learner.update` is one round's training:
  1. advantages per group (the objective says which kind: mean/std, mean only, median + pivot);
  2. pad everything into one [B, P+C] batch (prompts left-padded, completions right-padded);
  3. l^old: this node's log-probs at the start of the update (skipped when there is exactly one
     minibatch step, where l^old == sg[l] exactly, as TRL does);
  4. `epochs` passes over `minibatches` shuffled minibatches, one optimizer step each, so ratios
     really leave 1 after the first step.
"""
from __future__ import annotations

import contextlib
import math

import torch
from pydantic import BaseModel, ConfigDict, Field

from policy.advantages import group_advantages
from policy.logprobs import completion_logprobs, pad_batch
from policy.losses import LossInputs, Objective
from policy.types import TrainGroup


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    epochs: int = Field(1, ge=1)
    minibatches: int = Field(1, ge=1)
    autocast_bf16: bool = Field(False, description="bf16 autocast for forward passes (CPU AVX512-BF16 / GPU)")
    skip_zero_advantage: bool = Field(True, description="drop groups whose advantages are all 0 (no signal)")
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tuning; > 0 wraps the model with peft LoRA")
    lora_alpha: int = 16
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def apply_lora(model: torch.nn.Module, cfg: OptimConfig) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters when cfg.lora_rank > 0 (only adapters then train)."""
    if cfg.lora_rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_targets,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def autocast_context(enabled: bool, device: torch.device):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class Learner:
    def __init__(self, model: torch.nn.Module, objective: Objective, cfg: OptimConfig, pad_id: int,
                 temperature: float):
        self.model = model
        self.objective = objective
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature  # log-probs on logits / T, else the on-policy ratio is not 1
        self.params = [p for p in model.parameters() if p.requires_grad]  # LoRA: adapters only
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.device = next(model.parameters()).device

    def _logprobs(self, input_ids, attention_mask, n_completion):
        with autocast_context(self.cfg.autocast_bf16, self.device):
            return completion_logprobs(self.model, input_ids, attention_mask, n_completion,
                                       self.temperature).float()

    def update(self, groups: list[TrainGroup]) -> dict[str, float]:
        """Train on `groups`; returns averaged loss/ratio statistics of all optimizer steps."""
        samples, advantages = [], []
        n_zero = 0
        for group in groups:
            rewards = torch.tensor([s.reward for s in group.samples], dtype=torch.float32)  # [G]
            adv, keep = group_advantages(rewards, self.objective.advantage)  # [G], [G] bool
            if self.cfg.skip_zero_advantage and bool((adv == 0).all()):
                n_zero += 1
                continue
            for sample, a, k in zip(group.samples, adv.tolist(), keep.tolist()):
                if k:  # mc: the pivot sample is excluded from backprop
                    samples.append(sample)
                    advantages.append(a)
        stats: dict[str, float] = {"groups_zero_adv": float(n_zero), "samples_trained": float(len(samples))}
        if not samples:
            return stats

        input_ids, attention_mask, completion_mask = pad_batch(
            [s.prompt_ids for s in samples], [s.completion_ids for s in samples], self.pad_id)
        # input_ids/attention_mask: [B, P+C]; completion_mask: [B, C]
        n_completion = completion_mask.shape[1]
        loss_mask = completion_mask.clone().float()  # [B, C]
        behavior = torch.full(loss_mask.shape, float("nan"))  # [B, C]; NaN = unknown (use l^old)
        for i, s in enumerate(samples):
            n = len(s.completion_ids)
            if s.loss_mask is not None:
                loss_mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)  # hint tokens -> 0
            if s.behavior_logprobs is not None:
                behavior[i, :n] = torch.tensor(s.behavior_logprobs, dtype=torch.float32)
        adv_t = torch.tensor(advantages, dtype=torch.float32)  # [B]

        n_steps = self.cfg.epochs * self.cfg.minibatches
        old_logp = None
        if n_steps > 1:  # l^old must be frozen at the start of the update
            with torch.no_grad():
                old_logp = self._logprobs(input_ids, attention_mask, n_completion)  # [B, C]

        self.model.train()
        totals: dict[str, float] = {}
        b_size = len(samples)
        for _ in range(self.cfg.epochs):
            order = torch.randperm(b_size)  # [B]
            for idx in order.chunk(self.cfg.minibatches):
                ids, am = input_ids[idx], attention_mask[idx]  # [b, P+C]
                logp = self._logprobs(ids, am, n_completion)  # [b, C]
                old = old_logp[idx] if old_logp is not None else logp.detach()  # [b, C]
                beh = behavior[idx]  # [b, C]
                beh = torch.where(torch.isnan(beh), old, beh)  # [b, C] tier 2 / unknown -> l^old
                loss, step_stats = self.objective.loss(LossInputs(
                    logp=logp, old_logp=old, behavior_logp=beh, mask=loss_mask[idx], advantages=adv_t[idx]))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
                self.optimizer.step()
                step_stats = {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **step_stats}
                for key, value in step_stats.items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        totals[key] = totals.get(key, 0.0) + value / n_steps
        stats.update(totals)
        stats["optimizer_steps"] = float(n_steps)
        stats["tokens_trained"] = float(loss_mask.sum())
        return stats
