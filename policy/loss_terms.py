"""The tensor math the loss menu is built from: log-ratios, the ratio form, PPO clipping,
aggregators (TM / SMTM / CN), MinPRO's prefix minimum and the effective sample size.

Pure functions of tensors (notation: policy/ALGORITHMS.md); policy/losses.py composes them into
the named objectives.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

MAX_LOG_RATIO = 20.0  # |log-ratio| bound before exp: float32 exp overflows past 88.7


def masked_log_ratio(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """num - den on trainable tokens, exactly 0 elsewhere (so padding junk never reaches exp or a
    gradient: torch.where routes a zero gradient to the unselected branch).

    Straight-through clamp: the VALUE is clamped to [-MAX_LOG_RATIO, MAX_LOG_RATIO] so that exp of
    it (or of a mean of it) cannot overflow, the GRADIENT is passed through unchanged. Written as
    sg[clamp(x)] + (x - sg[x]) rather than x + sg[clamp(x) - x]: the same value and gradient, but
    exact for any finite x (the latter rounds to 0 or past 88 once |x| > ~1e8). Where |x| <= MAX
    the value is bit-for-bit x."""
    x = torch.where(mask > 0, num - den, torch.zeros_like(num))  # [B, T]
    return x.detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) + (x - x.detach())  # [B, T]


def ratio_form(w: Tensor, log_rho: Tensor) -> Tensor:
    """sg[w / rho] * rho, with value w and gradient w * grad(log_rho) = w * grad(l).

    Computed as sg[w] * exp(log_rho - sg[log_rho]): the identical function, but exp's argument is
    exactly 0, so rho = exp(l - b) can neither overflow (rho = inf gives 0 * inf = nan in the
    literal form) nor underflow."""
    return w.detach() * torch.exp(log_rho - log_rho.detach())  # [B, T]


def clipped_surrogate(ratio: Tensor, A: Tensor, lo: float, hi: float) -> Tensor:
    """PPO term min(ratio * A, clip(ratio, lo, hi) * A) (to be maximised); ratio, A broadcastable."""
    return torch.minimum(ratio * A, ratio.clamp(lo, hi) * A)


def ppo_clip_active(ratio: Tensor, A: Tensor, lo: float, hi: float) -> Tensor:
    """Where the clipped branch wins and the gradient is zero: (ratio > hi, A > 0) or (ratio < lo, A < 0)."""
    return ((ratio > hi) & (A > 0)) | ((ratio < lo) & (A < 0))


def masked_token_mean(term: Tensor, mask: Tensor) -> Tensor:
    """TM: sum_{i,t} m term / sum_{i,t} m  (every trainable token of the batch weighs the same)."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    return term.sum() / mask.sum().clamp_min(1.0)  # []


def sequence_mean_token_mean(term: Tensor, mask: Tensor) -> Tensor:
    """SMTM: mean over sequences of (sum_t m term / sum_t m); rows without trainable tokens are
    not counted."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    n_tok = mask.sum(-1)  # [B]
    per_seq = term.sum(-1) / n_tok.clamp_min(1.0)  # [B]
    return per_seq.sum() / (n_tok > 0).sum().clamp_min(1)  # []


def constant_normalizer(term: Tensor, mask: Tensor, l_norm: float) -> Tensor:
    """CN (Dr. GRPO): sum_{i,t} m term / (G * L_norm) with a constant L_norm (max new tokens), so
    long and short completions get the same per-token weight. G = sequences with >= 1 trainable
    token (a pivot or fully masked row is not counted)."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    n_seq = (mask.sum(-1) > 0).sum().clamp_min(1)  # []
    return term.sum() / (n_seq * l_norm)  # []


def min_prefix_ratio(log_rho: Tensor, mask: Tensor) -> Tensor:
    """MinPRO's log pmin: log pmin_{i,t} = min over j < t with m_{i,j} = 1 of log rho_{i,j}.

    Untrainable positions are filled with +inf (never the minimum), then an EXCLUSIVE running min
    (torch.cummin shifted right by one). A token with no trainable predecessor (position 1, or the
    first completion token after a prompt/hint) gets 0, i.e. pmin = 1. Pure; recompute every
    minibatch because l (hence rho) changes after each step."""
    filled = log_rho.masked_fill(mask <= 0, math.inf)  # [B, T]
    inclusive = torch.cummin(filled, dim=-1).values  # [B, T]  min over j <= t
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], dim=-1)  # [B, T]
    return exclusive.masked_fill(exclusive == math.inf, 0.0)  # [B, T]  (-inf, i.e. rho = 0, stays)


def effective_sample_size(w: Tensor) -> float:
    """Normalised ESS (sum w)^2 / (n sum w^2) in [1/n, 1]: 1 for uniform weights, 1/n when one
    weight carries everything. Empty input gives 1.0; all-zero weights give 0.0."""
    w = w.detach().double().flatten()  # [n]
    if w.numel() == 0:
        return 1.0
    sq = float((w * w).sum())
    return float(w.sum() ** 2 / (w.numel() * sq)) if sq > 0 else 0.0


def ratio_stats(ratio: Tensor, mask: Tensor, prefix: str = "ratio") -> dict[str, float]:
    """Mean and max of a per-token ratio over trainable tokens."""
    vals = ratio.detach()[mask > 0]  # [N]
    if vals.numel() == 0:
        return {f"{prefix}_mean": 1.0, f"{prefix}_max": 1.0}
    return {f"{prefix}_mean": float(vals.mean()), f"{prefix}_max": float(vals.max())}


def token_fraction(flags: Tensor, mask: Tensor) -> float:
    """Fraction of trainable tokens where `flags` is True."""
    return float((flags & (mask > 0)).sum()) / max(float((mask > 0).sum()), 1.0)


def weight_stats(w: Tensor, mask: Tensor, prefix: str = "weight") -> dict[str, float]:
    """Mean / ESS of a detached per-token weight over trainable tokens."""
    vals = w.detach()[mask > 0]  # [N]
    mean = float(vals.mean()) if vals.numel() else 1.0
    return {f"{prefix}_mean": mean, f"{prefix}_ess": effective_sample_size(vals)}
