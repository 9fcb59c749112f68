"""The tensor math the loss menu is built from: log-ratios, the ratio form, PPO clipping,
aggregators (TM / SMTM / CN), MinPRO's prefix minimum and the effective sample size.

Pure functions of tensors (notation: policy/ALGORITHMS.md); policy/losses.py composes them into
the named objectives.

Statistics stay on the device: the `*_stats`, `token_fraction` and `sampler_mismatch` values are
0-dim tensors (or plain floats where no tensor was involved), read on the host all at once by
`stats_to_floats`, once per optimizer step: every float(t) on a CUDA tensor stalls the GPU.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

MAX_LOG_RATIO = 20.0  # |log-ratio| bound before exp: float32 exp overflows past 88.7

Stat = float | Tensor  # a statistic: a Python float, or a 0-dim tensor not read on the host yet
Stats = dict[str, Stat]


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


def clipped_surrogate(ratio: Tensor, A: Tensor, lo: float, hi: float, dual: float | None = None) -> Tensor:
    """PPO term min(ratio * A, clip(ratio, lo, hi) * A) (to be maximised); ratio, A broadcastable.

    dual (dual-clip PPO, Ye et al. 2020): for A < 0 the term is also bounded below by dual * A, so a
    token whose ratio passed `dual` gets no gradient. Without it the A < 0 branch is ratio * A,
    unbounded in the ratio: a ratio against a stale or claimed behavior log-prob can be e^8."""
    term = torch.minimum(ratio * A, ratio.clamp(lo, hi) * A)
    if dual is None:
        return term
    return torch.where(A < 0, torch.maximum(term, dual * A), term)


def ppo_clip_active(ratio: Tensor, A: Tensor, lo: float, hi: float, dual: float | None = None) -> Tensor:
    """Where a clipped branch wins and the gradient is zero: (ratio > hi, A > 0), (ratio < lo, A < 0),
    or, with a dual clip, (ratio > dual, A < 0)."""
    active = ((ratio > hi) & (A > 0)) | ((ratio < lo) & (A < 0))
    return active if dual is None else active | ((ratio > dual) & (A < 0))


def _row_weights(mask: Tensor, row_weight: Tensor | None) -> Tensor:
    """Per-row weight [B] of rows with >= 1 trainable token (1 each unless given), 0 for the others."""
    has_tok = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    return has_tok if row_weight is None else has_tok * row_weight.detach().to(mask.dtype)  # [B]


def masked_token_mean(term: Tensor, mask: Tensor, row_weight: Tensor | None = None,
                      absent_tokens: float = 0.0) -> Tensor:
    """TM: sum_{i,t} s_i m term / (sum_{i,t} s_i m + absent_tokens)  (every trainable token of the
    batch weighs the same; row weights s_i, 1 unless given, count an oversized peer group as G rows:
    policy/learner.py; absent_tokens: the weighted tokens of rows counted but not in the batch)."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    s = _row_weights(mask, row_weight)[:, None]  # [B, 1]
    return (s * term).sum() / ((s * mask).sum() + absent_tokens).clamp_min(1e-12)  # []


def sequence_mean_token_mean(term: Tensor, mask: Tensor, row_weight: Tensor | None = None,
                             absent_rows: float = 0.0) -> Tensor:
    """SMTM: (weighted) mean over sequences of (sum_t m term / sum_t m); rows without trainable
    tokens are not counted; absent_rows (the weight of rows counted but not in the batch) joins
    the number of sequences."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    per_seq = term.sum(-1) / mask.sum(-1).clamp_min(1.0)  # [B]
    s = _row_weights(mask, row_weight)  # [B]
    return (s * per_seq).sum() / (s.sum() + absent_rows).clamp_min(1e-12)  # []


def constant_normalizer(term: Tensor, mask: Tensor, l_norm: float, row_weight: Tensor | None = None,
                        absent_rows: float = 0.0) -> Tensor:
    """CN (Dr. GRPO): sum_{i,t} s_i m term / (G * L_norm) with a constant L_norm (max new tokens), so
    long and short completions get the same per-token weight. G = sum of the row weights of
    sequences with >= 1 trainable token (a pivot or fully masked row is not counted), plus
    absent_rows (the weight of rows counted but not in the batch)."""
    term = torch.where(mask > 0, term, torch.zeros_like(term))  # [B, T]
    s = _row_weights(mask, row_weight)  # [B]
    return (s[:, None] * term).sum() / ((s.sum() + absent_rows).clamp_min(1e-12) * l_norm)  # []


def min_prefix_ratio(log_rho: Tensor, mask: Tensor, dead_zone: float = 0.0) -> Tensor:
    """MinPRO's log pmin: log pmin_{i,t} = shrink(min over j < t with m_{i,j} = 1 of log rho_{i,j}).

    Untrainable positions are filled with +inf (never the minimum), then an EXCLUSIVE running min
    (torch.cummin shifted right by one). A token with no trainable predecessor (position 1, or the
    first completion token after a prompt/hint) gets 0, i.e. pmin = 1.

    dead_zone delta: shrink(x) = sign(x) * max(|x| - delta, 0). The minimum of n noisy log-ratios
    drifts like -sd * sqrt(2 ln n) with position even on-policy (sd 0.1 gave mean weight 0.74 at
    tokens 448-512): log-ratios within delta of 0 are numeric noise (another engine, another
    precision), not a policy shift, and no longer pull pmin down. delta = 0 is the exact method.
    Shrinking is monotone, so pmin still never rises when a ratio falls. Pure; recompute every
    minibatch because l (hence rho) changes after each step."""
    filled = log_rho.masked_fill(mask <= 0, math.inf)  # [B, T]
    inclusive = torch.cummin(filled, dim=-1).values  # [B, T]  min over j <= t
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], dim=-1)  # [B, T]
    exclusive = exclusive.masked_fill(exclusive == math.inf, 0.0)  # [B, T]  (-inf, i.e. rho = 0, stays)
    if dead_zone > 0:
        exclusive = exclusive.sign() * (exclusive.abs() - dead_zone).clamp_min(0.0)  # [B, T]
    return exclusive  # [B, T]


def effective_sample_size(w: Tensor) -> float:
    """Normalised ESS (sum w)^2 / (n sum w^2) in [1/n, 1]: 1 for uniform weights, 1/n when one
    weight carries everything. Empty input gives 1.0; all-zero weights give 0.0."""
    return float(_effective_sample_size(w))


def _effective_sample_size(w: Tensor) -> Stat:
    """effective_sample_size as a 0-dim float64 tensor (1.0 for an empty w), not read on the host."""
    w = w.detach().double().flatten()  # [n]
    if w.numel() == 0:
        return 1.0
    sq = (w * w).sum()  # []
    num, den = w.sum() ** 2, sq * w.numel()  # [], []
    # float(sq) made den a host number, and CUDA divides by one as a product with its reciprocal:
    # the same op here keeps the value bit for bit on either device
    return torch.where(sq > 0, num * (1.0 / den) if w.is_cuda else num / den, 0.0)  # []


def ratio_stats(ratio: Tensor, mask: Tensor, prefix: str = "ratio") -> Stats:
    """Mean and max of a per-token ratio over trainable tokens."""
    vals = ratio.detach()[mask > 0]  # [N]
    if vals.numel() == 0:
        return {f"{prefix}_mean": 1.0, f"{prefix}_max": 1.0}
    return {f"{prefix}_mean": vals.mean(), f"{prefix}_max": vals.max()}


def token_fraction(flags: Tensor, mask: Tensor) -> Tensor:
    """Fraction of trainable tokens where `flags` is True (0-dim float64)."""
    trainable = mask > 0  # [B, T]
    return (flags & trainable).sum().double() / trainable.sum().double().clamp_min(1.0)  # []


def weight_stats(w: Tensor, mask: Tensor, prefix: str = "weight") -> Stats:
    """Mean / ESS of a detached per-token weight over trainable tokens."""
    vals = w.detach()[mask > 0]  # [N]
    mean = vals.mean() if vals.numel() else 1.0
    return {f"{prefix}_mean": mean, f"{prefix}_ess": _effective_sample_size(vals)}


def sampler_mismatch(old_logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> Stats:
    """How far the sampler was from the learner on the tokens it sampled: mean |l^old - b| and the
    k3 estimate of KL(sampler || learner), the token mean of (rho - 1) - log rho with
    rho = exp(l^old - b) (unbiased under the sampler's tokens, >= 0 term by term)."""
    log_ratio = masked_log_ratio(old_logp.detach(), behavior_logp.detach(), mask).detach()  # [B, T], 0 off-mask
    vals = log_ratio[mask > 0]  # [N]
    if vals.numel() == 0:
        return {"sampler_logp_diff": 0.0, "sampler_kl": 0.0}
    k3 = (torch.expm1(vals) - vals).clamp_min(0.0)  # [N]  expm1: no cancellation near rho = 1
    return {"sampler_logp_diff": vals.abs().mean(), "sampler_kl": k3.mean()}


def stats_to_floats(stats: Stats) -> dict[str, float]:
    """`stats` with every tensor value read on the host in ONE transfer (one device sync), in the
    same order. Each value is exactly float(value): float32/int64 -> float64 is exact."""
    keys = [key for key, value in stats.items() if isinstance(value, Tensor)]
    if not keys:
        return dict(stats)
    device = stats[keys[0]].device
    values = torch.stack([stats[k].detach().to(device=device, dtype=torch.float64) for k in keys]).tolist()  # [K]
    return {**stats, **dict(zip(keys, values))}
