"""Group advantages (notation: policy/ALGORITHMS.md).

All functions are pure: tensors in, tensors out, nothing is modified in place.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

AdvantageKind = Literal["mean_std", "mean", "median"]
STD_EPS = 1e-4  # A_i = (R_i - mean) / (std + 1e-4)
# The std is floored here: a reward spread far below any real difference between completions
# (rounding in a partial-credit scorer) must not be blown up to full-size advantages
# ([1, 1, 1, 0.999] gave A = -1.25 with the bare 1e-4).
STD_FLOOR = 0.01


def group_advantages(rewards: Tensor, kind: AdvantageKind = "mean_std",
                     neg_weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Advantages of the G completions of one prompt, plus which of them enter backprop.

    - "mean_std" (grpo, dapo, ...): A_i = (R_i - mean_G R) / (max(std_G R, 0.01) + 1e-4), ddof=1.
    - "mean" (dr_grpo):             A_i = R_i - mean_G R   (no std scaling).
    - "median" (mc):                A_i = R_i - median_G R; G = N+1 samples, and exactly one pivot
                                    (a sample whose reward IS the median) gets keep=False. Its
                                    advantage is 0 anyway; excluding it makes the baseline
                                    independent of every sample that is trained on.
    neg_weight [G] (damping of peers' failures, kappa_neg; 1 = undamped): a sample below the group
    mean counts with weight w_i = neg_weight_i, every other with 1, and the baseline becomes the
    weighted mean b = sum w R / sum w, so A_i = w_i (R_i - b) / scale still sums to 0 over the
    group. (Damping A < 0 after normalising left a 1-of-8 peer group +1.24 of net push-up.) For
    "median" the negative advantages are simply scaled.
    A group whose rewards are all equal (and G = 1) gets A = 0 exactly: no NaN, no rounding residue.
    Returns (advantages [G] float, keep [G] bool); keep is all True except the mc pivot.
    """
    R = torch.as_tensor(rewards)  # [G]
    R = R if R.is_floating_point() else R.float()  # [G]
    if R.dim() != 1 or R.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(R.shape)}")
    keep = torch.ones_like(R, dtype=torch.bool)  # [G]
    all_equal = bool((R == R[0]).all())
    kappa = torch.ones_like(R) if neg_weight is None else torch.as_tensor(neg_weight, dtype=R.dtype)  # [G]

    if kind == "median":
        med = R.median()  # [] lower median; always one of the rewards, so a pivot exists
        pivot = int((R == med).nonzero()[0])  # first sample whose reward equals the median
        keep[pivot] = False
        A = torch.zeros_like(R) if all_equal else R - med  # [G]
        return torch.where(A < 0, kappa * A, A), keep
    if kind not in ("mean_std", "mean"):
        raise ValueError(f"unknown advantage kind {kind!r}; valid: 'mean_std', 'mean', 'median'")
    if all_equal:  # covers G = 1, where the ddof=1 std is undefined
        return torch.zeros_like(R), keep
    w = torch.where(R < R.mean(), kappa, torch.ones_like(R))  # [G]
    A = w * (R - (w * R).sum() / w.sum())  # [G]  sums to 0
    if kind == "mean_std":
        A = A / (R.std(unbiased=True).clamp_min(STD_FLOOR) + STD_EPS)  # [G]
    return A, keep


def group_size_weight(n: int, group_size: int, kind: AdvantageKind = "mean_std") -> tuple[float, float]:
    """(row weight, advantage scale) of a peer group of n completions when ours have `group_size`
    (G). A sender picks n: 64 completions with one right brought A = 7.87 on that row (2.47 among
    8), 3x the advantage mass and 8x the rows of an honest slot, diluting every other row of the
    batch. For n > G each row counts as G / n rows in every aggregation, so the group fills G rows
    of any denominator; with std scaling (ddof = 1) the mean |A| of a group also grows like
    sqrt((n - 1) / n), which the advantage scale undoes, so the group's advantage mass
    sum_i w |A_i| equals that of a G-group with the same rewards in the same proportions. A group
    of at most G completions is left as it is (1.0, 1.0): fewer rows, less mass."""
    if n <= group_size:
        return 1.0, 1.0
    scale = math.sqrt((group_size - 1) / group_size * n / (n - 1)) if kind == "mean_std" else 1.0
    return group_size / n, scale
