"""The loss menu: GRPO-family objectives as small named pydantic models (spec: policy/ALGORITHMS.md).

Notation (kept in the names below):
    l      = log pi_theta(a_t | ...)           current policy, the ONLY tensor carrying a gradient
    l_old  = this node's recomputation at the start of the update (detached)
    b      = behavior log-prob (whoever sampled the token; detached)
    r      = exp(l - l_old)  proximal ratio;    rho = exp(l - b)  behavior ratio
    m      = mask, 1 on trainable completion tokens;   A = per-sequence advantage
    sg[.]  = stop-gradient (.detach())

The menu (registry names; knobs are the pydantic fields, declared torch-free in policy/loss_knobs.py):
    grpo     clipped r against l_old, SMTM            dr_grpo  grpo with A = R - mean, CN
    dapo     clip-higher, TM                          gspo     sequence ratio, mean over sequences
    cispo    clipped detached rho weight, TM          minpro   pmin * rho weight, TM
    prefix   truncated prefix product of rho, TM      ftis     truncated rho + KL filter on A < 0 rows
    tis(x)   x times a truncated exp(l_old - b)       mc(x)    x with a median baseline (G + 1 samples)
cispo / minpro / prefix / ftis already weight by the behavior ratio rho (uses_behavior_ratio), so
tis(x) refuses them: tis belongs around grpo / dr_grpo / dapo / gspo, whose ratio is against l_old.

Every objective splits into `token_loss` (per-token term [B, T], already in loss units, i.e.
negated) and `aggregate` (TM / SMTM / CN / ...), so wrappers such as tis(x) can reweight the inner
term before aggregation. `loss` = aggregate(token_loss) over the rows that `row_keep` keeps
(all rows unless the objective filters, e.g. ftis). `token_loss`'s statistics may be 0-dim tensors
still on the device (policy/loss_terms.py `Stats`); `loss` reads them as floats in one transfer.

Log-ratios go through masked_log_ratio, whose value is clamped to [-MAX_LOG_RATIO, MAX_LOG_RATIO]
(straight-through: the gradient is unchanged), so no exp overflows in float32.

Ratio form: to get the gradient w * A * grad(l) from a detached weight w, the per-token loss is
-sg[w / rho] * rho * A, whose value is -w * A. With all ratios 1 every objective then equals GRPO
in value AND gradient.

Usage:  obj = make_objective("tis(dapo)", C=2.0, inner={"eps_high": 0.28})
        loss, stats = obj.loss(LossInputs(logp, old_logp, behavior_logp, mask, advantages))
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from pydantic import field_validator
from torch import Tensor

from policy.loss_knobs import (
    CispoKnobs,
    DapoKnobs,
    DrGrpoKnobs,
    FTisKnobs,
    GrpoKnobs,
    GspoKnobs,
    McKnobs,
    MinProKnobs,
    ObjectiveKnobs,
    PrefixKnobs,
    TisKnobs,
    WrapperKnobs,
    build_objective,
)
from policy.loss_terms import (  # noqa: F401  (re-exported: the menu's building blocks)
    MAX_LOG_RATIO,
    masked_log_ratio,
    ratio_form,
    clipped_surrogate,
    ppo_clip_active,
    masked_token_mean,
    sequence_mean_token_mean,
    constant_normalizer,
    min_prefix_ratio,
    effective_sample_size,
    ratio_stats,
    token_fraction,
    weight_stats,
    Stats,
    stats_to_floats,
)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class LossInputs:
    """One minibatch of B sequences padded to T tokens.

    logp          [B, T]  l: current policy log-probs (carries grad), on logits / T_sample
    old_logp      [B, T]  l^old: recomputation with the weights at the start of the update
    behavior_logp [B, T]  b: behavior log-probs (tier 2 external: b = l^prox)
    mask          [B, T]  float, 1 on trainable completion tokens (prompt/hint/padding/pivot: 0)
    advantages    [B]     A_i per sequence
    completion_budget     max new tokens the completions were sampled with (set by the learner;
                          Dr. GRPO's CN aggregation divides by it unless l_norm is given)
    row_weight    [B]     how many rows each row counts for in the aggregation (None: 1 each); the
                          learner gives a peer group larger than ours G / n per row
    absent_rows, absent_tokens   rows counted in every aggregation's denominator but not in the
                          batch (the learner's dropped peer rows, which would add 0 to the
                          numerator): their summed row weight, and their summed row weight x
                          trainable tokens; 0 unless given
    Values at mask == 0 may be anything (even inf/nan): every objective ignores them.
    """

    logp: Tensor
    old_logp: Tensor
    behavior_logp: Tensor
    mask: Tensor
    advantages: Tensor
    completion_budget: float | None = None
    row_weight: Tensor | None = None
    absent_rows: float = 0.0
    absent_tokens: float = 0.0

    def __post_init__(self) -> None:
        shape = tuple(self.logp.shape)
        if len(shape) != 2:
            raise ValueError(f"logp must be [B, T], got {shape}")
        for name in ("old_logp", "behavior_logp", "mask"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        if tuple(self.advantages.shape) != shape[:1]:
            raise ValueError(f"advantages has shape {tuple(self.advantages.shape)}, expected {shape[:1]}")
        if self.row_weight is not None and tuple(self.row_weight.shape) != shape[:1]:
            raise ValueError(f"row_weight has shape {tuple(self.row_weight.shape)}, expected {shape[:1]}")
        if self.absent_rows < 0 or self.absent_tokens < 0:
            raise ValueError(f"absent rows/tokens must be >= 0, got {self.absent_rows}, {self.absent_tokens}")
        if self.completion_budget is not None and not self.completion_budget > 0:
            raise ValueError(f"completion_budget must be > 0, got {self.completion_budget}")
        self.old_logp = self.old_logp.detach()  # [B, T]
        self.behavior_logp = self.behavior_logp.detach()  # [B, T]
        self.mask = self.mask.detach().to(self.logp.dtype)  # [B, T]
        self.advantages = self.advantages.detach().to(self.logp.dtype)  # [B]


# --------------------------------------------------------------------------------------------
# Objectives
# --------------------------------------------------------------------------------------------


class Objective(ObjectiveKnobs):
    """A named objective: its knobs and traits (policy/loss_knobs.py) plus its tensor math."""

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        """Per-token loss term [B, T] (before aggregation; values at m = 0 are ignored) + stats
        (floats or 0-dim tensors: loss_terms.stats_to_floats reads them)."""
        raise NotImplementedError

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        """Reduce the per-token term to a scalar; token-mean unless the objective says otherwise."""
        return masked_token_mean(term, x.mask, x.row_weight, x.absent_tokens)

    @property
    def filters_rows(self) -> bool:
        """Does row_keep ever drop a row? Then the aggregation's denominators depend on every row's
        current log-probs (the learner cannot aggregate row chunks independently)."""
        return False

    def row_keep(self, x: LossInputs) -> Tensor | None:
        """Rows to train on, [B] bool, or None to keep every row. A dropped row's mask is zeroed
        before aggregation (see apply_row_keep), so it gets no gradient and leaves every
        denominator. Computed from detached values only."""
        return None

    def loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss to minimise over the rows row_keep keeps, plus float diagnostics (read on the
        host in one transfer)."""
        kept, filtered_frac = apply_row_keep(self, x)
        term, stats = self.token_loss(kept)  # [B, T]
        loss = self.aggregate(term, kept)  # []
        if kept is not x:  # the objective filters rows: report how many it dropped
            stats["filtered_frac"] = filtered_frac
        stats["loss"] = loss.detach()
        return loss, stats_to_floats(stats)


def apply_row_keep(objective: Objective, x: LossInputs) -> tuple[LossInputs, float | Tensor]:
    """x with the mask of the rows objective.row_keep drops set to 0, and the fraction of rows with
    >= 1 trainable token that were dropped (a 0-dim float64 tensor left on the device). Returns x
    itself (not a copy) and 0.0 when the objective keeps every row. Idempotent: a row with no
    trainable token is never counted."""
    keep = objective.row_keep(x)  # [B] bool or None
    if keep is None:
        return x, 0.0
    has_tok = x.mask.sum(-1) > 0  # [B]
    dropped = has_tok & ~keep  # [B]
    mask = torch.where(keep[:, None], x.mask, torch.zeros_like(x.mask))  # [B, T]
    frac = dropped.sum().double() / has_tok.sum().double().clamp_min(1.0)  # []
    return replace(x, mask=mask), frac


class Grpo(GrpoKnobs, Objective):
    """GRPO: -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = exp(l - l_old); SMTM by default.
    eps sets both sides of the clip; eps_low / eps_high, when set, override one side (DAPO's
    clip-higher is eps_high > eps_low: dapo below).

    No KL knob (beta): a k3 penalty against l_old (this node keeps no frozen reference model) is
    exactly 0 in value and gradient with one optimizer step per round (l = l_old), so it silently
    did nothing. l_norm: CN's constant (aggregation="cn"); None means LossInputs.completion_budget.
    dual_clip c: for A < 0 the term is bounded by c * A (dual-clip PPO), so no token's push-down
    grows without bound in its ratio (a stale or claimed l_old can make r = e^8); None disables."""

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        r = torch.exp(masked_log_ratio(x.logp, x.old_logp, x.mask))  # [B, T]
        A = x.advantages[:, None]  # [B, 1]
        lo, hi = self.clip_range()
        term = -clipped_surrogate(r, A, lo, hi, self.dual_clip)  # [B, T]
        clipped = ppo_clip_active(r.detach(), A, lo, hi, self.dual_clip)  # [B, T]
        stats = {"clip_frac": token_fraction(clipped, x.mask), **ratio_stats(r, x.mask)}
        return term, stats

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        if self.aggregation == "tm":
            return masked_token_mean(term, x.mask, x.row_weight, x.absent_tokens)
        if self.aggregation == "cn":
            return constant_normalizer(term, x.mask, self.completion_norm(x), x.row_weight, x.absent_rows)
        return sequence_mean_token_mean(term, x.mask, x.row_weight, x.absent_rows)

    def completion_norm(self, x: LossInputs) -> float:
        """CN's L_norm: the l_norm knob if set, else the sampling budget the learner passes (so
        dr_grpo inside tis(...) or mc(...) gets it too: the budget travels with the data)."""
        if self.l_norm is not None:
            return self.l_norm
        if x.completion_budget is not None:
            return x.completion_budget
        raise ValueError("CN aggregation needs l_norm or LossInputs.completion_budget")


class DrGrpo(DrGrpoKnobs, Grpo):
    """Dr. GRPO: GRPO's clipped term, advantage R - mean (no std), CN aggregation with
    L_norm = max new tokens (LossInputs.completion_budget, unless l_norm is set)."""


class Dapo(DapoKnobs, Grpo):
    """DAPO: grpo's term with clip-higher (lower clip 1 - eps = 0.8, upper 1 + eps_high = 1.28) and
    token-mean aggregation. DAPO's dynamic sampling and overlong penalty act on data; the node
    applies neither."""


class Gspo(GspoKnobs, Objective):
    """GSPO: sequence ratio s_i = exp(mean_t m (l - l_old)), term -min(s A, clip(s, 1-eps_low,
    1+eps_high) A), mean over sequences (the sequence term is broadcast to its tokens and reduced
    with SMTM, which is exactly the mean over sequences); dual clip as in grpo."""

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        log_r = masked_log_ratio(x.logp, x.old_logp, x.mask)  # [B, T]
        log_s = log_r.sum(-1) / x.mask.sum(-1).clamp_min(1.0)  # [B]  length-normalised
        s = torch.exp(log_s)  # [B]
        A = x.advantages  # [B]
        lo, hi = 1 - self.eps_low, 1 + self.eps_high
        seq_term = -clipped_surrogate(s, A, lo, hi, self.dual_clip)  # [B]
        term = seq_term[:, None].expand_as(log_r)  # [B, T]
        has_tok = x.mask.sum(-1) > 0  # [B]
        clipped = ppo_clip_active(s.detach(), A, lo, hi, self.dual_clip)[has_tok]  # [B']
        s_ok = s.detach()[has_tok]  # [B']
        stats = {
            "clip_frac": clipped.float().mean() if clipped.numel() else 0.0,
            "ratio_mean": s_ok.mean() if s_ok.numel() else 1.0,
            "ratio_max": s_ok.max() if s_ok.numel() else 1.0,
        }
        return term, stats

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        return sequence_mean_token_mean(term, x.mask, x.row_weight, x.absent_rows)


class Cispo(CispoKnobs, Objective):
    """CISPO: sg[clip(rho, 0, 1+eps_high)] * A * l, in ratio form -sg[w/rho] rho A; token-mean.
    Clipping the (detached) weight instead of the ratio keeps every token's gradient."""

    def weights(self, x: LossInputs) -> Tensor:
        """w = clip(rho, 0, 1+eps_high), detached [B, T]."""
        rho = torch.exp(masked_log_ratio(x.logp, x.behavior_logp, x.mask)).detach()  # [B, T]
        return rho.clamp(0.0, 1 + self.eps_high)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        rho = torch.exp(log_rho.detach())  # [B, T]
        stats = {
            "clip_frac": token_fraction(rho > 1 + self.eps_high, x.mask),
            **ratio_stats(rho, x.mask),
            **weight_stats(w, x.mask),
        }
        return term, stats


class MinPro(MinProKnobs, Objective):
    """MinPRO: w_t = clip(pmin_t * rho_t, 1-eps_low, 1+eps_high) with pmin_t the minimum behavior
    ratio over strictly preceding trainable tokens (pmin_1 = 1); loss TM[-sg[w/rho] rho A].
    eps_low = 1 (default) means no floor: a floor lifts small weights back and erases the method.
    pmin_floor (e.g. 1e-3) optionally bounds pmin from below. dead_zone: log-ratios within it of 0
    do not pull pmin down (numeric noise on on-policy data would mute long rows; see
    loss_terms.min_prefix_ratio); 0 is the exact method."""

    def weights(self, x: LossInputs) -> Tensor:
        """w = clip(pmin * rho, 1-eps_low, 1+eps_high), computed in log space, detached [B, T]."""
        lam = masked_log_ratio(x.logp, x.behavior_logp, x.mask).detach()  # [B, T]  log rho
        log_pmin = min_prefix_ratio(lam, x.mask, self.dead_zone)  # [B, T]
        if self.pmin_floor is not None:
            log_pmin = log_pmin.clamp_min(math.log(self.pmin_floor))  # [B, T]
        return torch.exp(log_pmin + lam).clamp(1 - self.eps_low, 1 + self.eps_high)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        clipped = (w >= 1 + self.eps_high) | ((w <= 1 - self.eps_low) & (self.eps_low < 1))  # [B, T]
        stats = {
            "clip_frac": token_fraction(clipped, x.mask),
            **ratio_stats(torch.exp(log_rho.detach()), x.mask),
            **weight_stats(w, x.mask),
        }
        return term, stats


class Prefix(PrefixKnobs, Objective):
    """Full prefix ratio w_t = min(prod_{j<=t, m_j=1} rho_j, C) (exact off-policy correction for
    token t, exponential variance; for study). Log space: cumsum of masked log rho. Ratio form, TM."""

    def weights(self, x: LossInputs) -> Tensor:
        """w = min(exp(cumsum_t m log rho), C), detached [B, T]. The sum can pass 88 although each
        term is clamped: its log is capped at MAX_LOG_RATIO before exp (no change unless
        C > exp(MAX_LOG_RATIO), since w is truncated at C anyway; small sums underflow harmlessly)."""
        lam = masked_log_ratio(x.logp, x.behavior_logp, x.mask).detach()  # [B, T]  0 off-mask
        log_prefix = torch.cumsum(lam, dim=-1).clamp(max=MAX_LOG_RATIO)  # [B, T]
        return torch.exp(log_prefix).clamp(max=self.C)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        stats = {
            "clip_frac": token_fraction(w >= self.C, x.mask),
            **ratio_stats(torch.exp(log_rho.detach()), x.mask),
            **weight_stats(w, x.mask),
        }
        return term, stats


class FTis(FTisKnobs, Objective):
    """F-TIS (our reading of the outline in arXiv 2605.22537): truncated importance sampling on the
    behavior ratio, w_t = sg[min(rho_t, C)], loss TM[-sg[w/rho] rho A], plus a filter: a row with
    A_i < 0 whose KL estimate k_i = token-mean of the k3 term (rho - 1) - log rho exceeds kl_max is
    dropped (a far off-policy negative sample mostly adds variance to the push-down gradient).
    Positive-advantage rows are always kept. With rho = 1 it equals GRPO token-mean."""

    def weights(self, x: LossInputs) -> Tensor:
        """w = min(rho, C), detached [B, T]."""
        rho = torch.exp(masked_log_ratio(x.logp, x.behavior_logp, x.mask)).detach()  # [B, T]
        return rho.clamp(max=self.C)  # [B, T]

    def sequence_kl(self, x: LossInputs) -> Tensor:
        """k_i = token-mean over row i's trainable tokens of (rho - 1) - log rho (k3, >= 0),
        detached [B]; 0 for a row without trainable tokens."""
        lam = masked_log_ratio(x.logp, x.behavior_logp, x.mask).detach()  # [B, T]  0 off-mask
        k3 = (torch.expm1(lam) - lam).clamp_min(0.0)  # [B, T]  expm1: no cancellation near rho = 1
        k3 = torch.where(x.mask > 0, k3, torch.zeros_like(k3))  # [B, T]
        return k3.sum(-1) / x.mask.sum(-1).clamp_min(1.0)  # [B]

    @property
    def filters_rows(self) -> bool:
        return True

    def row_keep(self, x: LossInputs) -> Tensor | None:
        """Drop rows with A_i < 0 and k_i > kl_max; keep the rest [B]."""
        return ~((x.advantages < 0) & (self.sequence_kl(x) > self.kl_max))  # [B]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        rho = torch.exp(log_rho.detach())  # [B, T]
        kl = self.sequence_kl(x)[x.mask.sum(-1) > 0]  # [B']  rows that reach the loss
        stats = {
            "clip_frac": token_fraction(rho > self.C, x.mask),
            **ratio_stats(rho, x.mask),
            **weight_stats(w, x.mask),
            "kl_mean": kl.mean() if kl.numel() else 0.0,
        }
        return term, stats


class Wrapper(WrapperKnobs, Objective):
    """An objective built around an inner one: written 'name(inner)' in the registry."""

    inner: Objective

    @field_validator("inner", mode="before")
    @classmethod
    def _build_inner(cls, v: Any) -> Any:
        return make_objective(v) if isinstance(v, str) else v

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        return self.inner.token_loss(x)

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        return self.inner.aggregate(term, x)

    @property
    def filters_rows(self) -> bool:
        return self.inner.filters_rows

    def row_keep(self, x: LossInputs) -> Tensor | None:
        return self.inner.row_keep(x)


class Tis(TisKnobs, Wrapper):
    """Truncated importance sampling for the generator/learner mismatch: multiplies the inner
    per-token term by sg[min(exp(l_old - b), C)].
    level="token": per-token ratio; level="sequence": exp(sum_t m (l_old - b)) per sequence.
    mode="truncate": min(ratio, C); mode="mask": ratio where ratio <= C, else 0.

    Only around PPO-style objectives whose ratio is against l_old (grpo, dr_grpo, dapo, gspo): an
    inner objective that already weights by rho = exp(l - b) (uses_behavior_ratio) would correct
    the mismatch twice, so it is refused. tis itself counts as weighting by a behavior ratio."""

    inner: Objective  # pydantic takes an inherited field from the leftmost base (TisKnobs): say it again

    def mismatch_ratio(self, x: LossInputs) -> Tensor:
        """exp(l_old - b) per token, or its product over the sequence, detached [B, T]. The
        sequence sum can pass 88 although each term is clamped: its log is capped at MAX_LOG_RATIO
        before exp (no change to the weight unless C > exp(MAX_LOG_RATIO), since it is truncated or
        masked at C anyway; small products underflow harmlessly)."""
        log_m = masked_log_ratio(x.old_logp, x.behavior_logp, x.mask)  # [B, T]
        if self.level == "sequence":
            log_m = log_m.sum(-1, keepdim=True).clamp(max=MAX_LOG_RATIO).expand_as(log_m)  # [B, T]
        return torch.exp(log_m).detach()  # [B, T]

    def weights(self, x: LossInputs) -> Tensor:
        """The detached TIS weight [B, T]: truncated or masked mismatch ratio."""
        ratio = self.mismatch_ratio(x)  # [B, T]
        if self.mode == "mask":
            return torch.where(ratio > self.C, torch.zeros_like(ratio), ratio)  # [B, T]
        return ratio.clamp(max=self.C)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, Stats]:
        term, stats = self.inner.token_loss(x)  # [B, T]
        w = self.weights(x)  # [B, T]
        stats = {**stats, "tis_trunc_frac": token_fraction(self.mismatch_ratio(x) > self.C, x.mask)}
        stats.update(weight_stats(w, x.mask, prefix="tis_weight"))
        return term * w, stats  # [B, T]


class Mc(McKnobs, Wrapper):
    """Median baseline (MC-GRPO style): the group is sampled with G+1 completions, A = R - median,
    no std scaling (MAD is 0 for binary rewards). The pivot (one sample whose reward equals the
    median, see policy.advantages.group_advantages(kind="median")) is excluded from backprop by the
    learner through the returned keep mask: it drops that row, or equivalently zeroes its mask (the
    aggregators do not count rows without trainable tokens). The loss itself is the inner one."""

    inner: Objective  # as in Tis: an inner with math, not only knobs


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (Grpo, DrGrpo, Dapo, Gspo, Cispo, MinPro, Prefix, FTis, Tis, Mc)
}


def make_objective(spec: str, **knobs: Any) -> Objective:
    """Build an objective from a spec such as "grpo", "tis(grpo)", "mc(dapo)", "tis(mc(dapo))".

    `knobs` go to the outermost objective; a wrapper's inner knobs go in `inner={...}` (nested
    wrappers nest the dict). Unknown names and knobs raise ValueError listing the valid ones; so
    does tis around an objective that already weights by the behavior ratio."""
    return build_objective(OBJECTIVES, spec, knobs)
