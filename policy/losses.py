"""The loss menu: GRPO-family objectives as small named pydantic models (spec: ALGORITHMS.md).

Notation (kept in the names below):
    l      = log pi_theta(a_t | ...)           current policy, the ONLY tensor carrying a gradient
    l_old  = this node's recomputation at the start of the update (detached)
    b      = behavior log-prob (whoever sampled the token; detached)
    r      = exp(l - l_old)  proximal ratio;    rho = exp(l - b)  behavior ratio
    m      = mask, 1 on trainable completion tokens;   A = per-sequence advantage
    sg[.]  = stop-gradient (.detach())

Every objective splits into `token_loss` (per-token term [B, T], already in loss units, i.e.
negated) and `aggregate` (TM / SMTM / CN / ...), so wrappers such as tis(x) can reweight the inner
term before aggregation. `loss` = aggregate(token_loss).

Ratio form: to get the gradient w * A * grad(l) from a detached weight w, the per-token loss is
-sg[w / rho] * rho * A, whose value is -w * A. With all ratios 1 every objective then equals GRPO
in value AND gradient.

Usage:  obj = make_objective("tis(minpro)", C=2.0, inner={"eps_high": 0.28})
        loss, stats = obj.loss(LossInputs(logp, old_logp, behavior_logp, mask, advantages))
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import Tensor

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
    Values at mask == 0 may be anything (even inf/nan): every objective ignores them.
    """

    logp: Tensor
    old_logp: Tensor
    behavior_logp: Tensor
    mask: Tensor
    advantages: Tensor

    def __post_init__(self) -> None:
        shape = tuple(self.logp.shape)
        if len(shape) != 2:
            raise ValueError(f"logp must be [B, T], got {shape}")
        for name in ("old_logp", "behavior_logp", "mask"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        if tuple(self.advantages.shape) != shape[:1]:
            raise ValueError(f"advantages has shape {tuple(self.advantages.shape)}, expected {shape[:1]}")
        self.old_logp = self.old_logp.detach()  # [B, T]
        self.behavior_logp = self.behavior_logp.detach()  # [B, T]
        self.mask = self.mask.detach().to(self.logp.dtype)  # [B, T]
        self.advantages = self.advantages.detach().to(self.logp.dtype)  # [B]


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def masked_log_ratio(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """num - den on trainable tokens, exactly 0 elsewhere (so padding junk never reaches exp or a
    gradient: torch.where routes a zero gradient to the unselected branch)."""
    return torch.where(mask > 0, num - den, torch.zeros_like(num))  # [B, T]


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


def _ratio_stats(ratio: Tensor, mask: Tensor, prefix: str = "ratio") -> dict[str, float]:
    """Mean and max of a per-token ratio over trainable tokens."""
    vals = ratio.detach()[mask > 0]  # [N]
    if vals.numel() == 0:
        return {f"{prefix}_mean": 1.0, f"{prefix}_max": 1.0}
    return {f"{prefix}_mean": float(vals.mean()), f"{prefix}_max": float(vals.max())}


def _frac(flags: Tensor, mask: Tensor) -> float:
    """Fraction of trainable tokens where `flags` is True."""
    return float((flags & (mask > 0)).sum()) / max(float((mask > 0).sum()), 1.0)


def _weight_stats(w: Tensor, mask: Tensor, prefix: str = "weight") -> dict[str, float]:
    """Mean / ESS of a detached per-token weight over trainable tokens."""
    vals = w.detach()[mask > 0]  # [N]
    mean = float(vals.mean()) if vals.numel() else 1.0
    return {f"{prefix}_mean": mean, f"{prefix}_ess": effective_sample_size(vals)}


# --------------------------------------------------------------------------------------------
# Objectives
# --------------------------------------------------------------------------------------------


class Objective(BaseModel):
    """A named objective; its pydantic fields are the knobs (unknown knobs are an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ClassVar[str] = "objective"
    advantage: ClassVar[str] = "mean_std"  # "mean_std" | "mean" | "median"
    extra_samples: ClassVar[int] = 0  # completions per group beyond G (mc needs G + 1)
    wrapper: ClassVar[bool] = False

    @property
    def spec(self) -> str:
        """The registry spec that builds this objective, e.g. 'tis(minpro)'."""
        return self.name

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        """Per-token loss term [B, T] (before aggregation; values at m = 0 are ignored) + stats."""
        raise NotImplementedError

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        """Reduce the per-token term to a scalar; token-mean unless the objective says otherwise."""
        return masked_token_mean(term, x.mask)

    def loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss to minimise, plus float diagnostics."""
        term, stats = self.token_loss(x)  # [B, T]
        loss = self.aggregate(term, x)  # []
        stats["loss"] = float(loss.detach())
        return loss, stats


class Grpo(Objective):
    """GRPO: -min(r A, clip(r, 1-eps, 1+eps) A) [+ beta * k3], r = exp(l - l_old); SMTM by default.

    beta > 0 adds the k3 KL estimator exp(l_old - l) - (l_old - l) - 1 against the OLD policy (a
    trust-region penalty; this node keeps no frozen reference model). Its gradient is 0 at r = 1."""

    name: ClassVar[str] = "grpo"
    eps: float = Field(0.2, gt=0)
    beta: float = Field(0.0, ge=0)
    aggregation: Literal["smtm", "tm", "cn"] = "smtm"
    l_norm: float = Field(64.0, gt=0)  # only for aggregation="cn"

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        log_r = masked_log_ratio(x.logp, x.old_logp, x.mask)  # [B, T]
        r = torch.exp(log_r)  # [B, T]
        A = x.advantages[:, None]  # [B, 1]
        lo, hi = 1 - self.eps, 1 + self.eps
        term = -clipped_surrogate(r, A, lo, hi)  # [B, T]
        stats = {"clip_frac": _frac(ppo_clip_active(r.detach(), A, lo, hi), x.mask), **_ratio_stats(r, x.mask)}
        if self.beta > 0:
            k3 = torch.exp(-log_r) + log_r - 1  # [B, T]  KL(old || theta) estimator, >= 0
            term = term + self.beta * k3  # [B, T]
            stats["kl_k3"] = float(masked_token_mean(k3.detach(), x.mask))
        return term, stats

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        if self.aggregation == "tm":
            return masked_token_mean(term, x.mask)
        if self.aggregation == "cn":
            return constant_normalizer(term, x.mask, self.l_norm)
        return sequence_mean_token_mean(term, x.mask)


class DrGrpo(Grpo):
    """Dr. GRPO: GRPO's clipped term, advantage R - mean (no std), CN aggregation with
    L_norm = max new tokens (the node sets l_norm)."""

    name: ClassVar[str] = "dr_grpo"
    advantage: ClassVar[str] = "mean"
    aggregation: Literal["smtm", "tm", "cn"] = "cn"


class Dapo(Objective):
    """DAPO: -min(r A, clip(r, 1-eps_low, 1+eps_high) A) (clip-higher), token-mean. Dynamic
    sampling and the overlong penalty act on data: see policy.advantages."""

    name: ClassVar[str] = "dapo"
    eps_low: float = Field(0.2, ge=0, le=1)
    eps_high: float = Field(0.28, ge=0)

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        r = torch.exp(masked_log_ratio(x.logp, x.old_logp, x.mask))  # [B, T]
        A = x.advantages[:, None]  # [B, 1]
        lo, hi = 1 - self.eps_low, 1 + self.eps_high
        term = -clipped_surrogate(r, A, lo, hi)  # [B, T]
        stats = {"clip_frac": _frac(ppo_clip_active(r.detach(), A, lo, hi), x.mask), **_ratio_stats(r, x.mask)}
        return term, stats


class Gspo(Objective):
    """GSPO: sequence ratio s_i = exp(mean_t m (l - l_old)), term -min(s A, clip(s, 1-eps_low,
    1+eps_high) A), mean over sequences (the sequence term is broadcast to its tokens and reduced
    with SMTM, which is exactly the mean over sequences)."""

    name: ClassVar[str] = "gspo"
    eps_low: float = Field(3e-4, ge=0, le=1)
    eps_high: float = Field(4e-4, ge=0)

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        log_r = masked_log_ratio(x.logp, x.old_logp, x.mask)  # [B, T]
        log_s = log_r.sum(-1) / x.mask.sum(-1).clamp_min(1.0)  # [B]  length-normalised
        s = torch.exp(log_s)  # [B]
        A = x.advantages  # [B]
        lo, hi = 1 - self.eps_low, 1 + self.eps_high
        seq_term = -clipped_surrogate(s, A, lo, hi)  # [B]
        term = seq_term[:, None].expand_as(log_r)  # [B, T]
        has_tok = x.mask.sum(-1) > 0  # [B]
        clipped = ppo_clip_active(s.detach(), A, lo, hi)[has_tok]  # [B']
        s_ok = s.detach()[has_tok]  # [B']
        stats = {
            "clip_frac": float(clipped.float().mean()) if clipped.numel() else 0.0,
            "ratio_mean": float(s_ok.mean()) if s_ok.numel() else 1.0,
            "ratio_max": float(s_ok.max()) if s_ok.numel() else 1.0,
        }
        return term, stats

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        return sequence_mean_token_mean(term, x.mask)


class Cispo(Objective):
    """CISPO: sg[clip(rho, 0, 1+eps_high)] * A * l, in ratio form -sg[w/rho] rho A; token-mean.
    Clipping the (detached) weight instead of the ratio keeps every token's gradient."""

    name: ClassVar[str] = "cispo"
    eps_high: float = Field(0.28, ge=0)

    def weights(self, x: LossInputs) -> Tensor:
        """w = clip(rho, 0, 1+eps_high), detached [B, T]."""
        rho = torch.exp(masked_log_ratio(x.logp, x.behavior_logp, x.mask)).detach()  # [B, T]
        return rho.clamp(0.0, 1 + self.eps_high)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        rho = torch.exp(log_rho.detach())  # [B, T]
        stats = {
            "clip_frac": _frac(rho > 1 + self.eps_high, x.mask),
            **_ratio_stats(rho, x.mask),
            **_weight_stats(w, x.mask),
        }
        return term, stats


class MinPro(Objective):
    """MinPRO: w_t = clip(pmin_t * rho_t, 1-eps_low, 1+eps_high) with pmin_t the minimum behavior
    ratio over strictly preceding trainable tokens (pmin_1 = 1); loss TM[-sg[w/rho] rho A].
    eps_low = 1 (default) means no floor: a floor lifts small weights back and erases the method.
    pmin_floor (e.g. 1e-3) optionally bounds pmin from below."""

    name: ClassVar[str] = "minpro"
    eps_low: float = Field(1.0, ge=0, le=1)
    eps_high: float = Field(0.28, ge=0)
    pmin_floor: float | None = Field(None, gt=0)

    def weights(self, x: LossInputs) -> Tensor:
        """w = clip(pmin * rho, 1-eps_low, 1+eps_high), computed in log space, detached [B, T]."""
        lam = masked_log_ratio(x.logp, x.behavior_logp, x.mask).detach()  # [B, T]  log rho
        log_pmin = min_prefix_ratio(lam, x.mask)  # [B, T]
        if self.pmin_floor is not None:
            log_pmin = log_pmin.clamp_min(math.log(self.pmin_floor))  # [B, T]
        return torch.exp(log_pmin + lam).clamp(1 - self.eps_low, 1 + self.eps_high)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        clipped = (w >= 1 + self.eps_high) | ((w <= 1 - self.eps_low) & (self.eps_low < 1))  # [B, T]
        stats = {
            "clip_frac": _frac(clipped, x.mask),
            **_ratio_stats(torch.exp(log_rho.detach()), x.mask),
            **_weight_stats(w, x.mask),
        }
        return term, stats


class Prefix(Objective):
    """Full prefix ratio w_t = min(prod_{j<=t, m_j=1} rho_j, C) (exact off-policy correction for
    token t, exponential variance; for study). Log space: cumsum of masked log rho. Ratio form, TM."""

    name: ClassVar[str] = "prefix"
    C: float = Field(2.0, gt=0)

    def weights(self, x: LossInputs) -> Tensor:
        """w = min(exp(cumsum_t m log rho), C), detached [B, T]."""
        lam = masked_log_ratio(x.logp, x.behavior_logp, x.mask).detach()  # [B, T]  0 off-mask
        return torch.exp(torch.cumsum(lam, dim=-1)).clamp(max=self.C)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        log_rho = masked_log_ratio(x.logp, x.behavior_logp, x.mask)  # [B, T]
        w = self.weights(x)  # [B, T]
        term = -ratio_form(w, log_rho) * x.advantages[:, None]  # [B, T]
        stats = {
            "clip_frac": _frac(w >= self.C, x.mask),
            **_ratio_stats(torch.exp(log_rho.detach()), x.mask),
            **_weight_stats(w, x.mask),
        }
        return term, stats


class Wrapper(Objective):
    """An objective built around an inner one: written 'name(inner)' in the registry."""

    wrapper: ClassVar[bool] = True
    inner: Objective

    @field_validator("inner", mode="before")
    @classmethod
    def _build_inner(cls, v: Any) -> Any:
        return make_objective(v) if isinstance(v, str) else v

    @property
    def spec(self) -> str:
        return f"{self.name}({self.inner.spec})"

    @property
    def advantage(self) -> str:  # type: ignore[override]
        return self.inner.advantage

    @property
    def extra_samples(self) -> int:  # type: ignore[override]
        return self.inner.extra_samples

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        return self.inner.token_loss(x)

    def aggregate(self, term: Tensor, x: LossInputs) -> Tensor:
        return self.inner.aggregate(term, x)


class Tis(Wrapper):
    """Truncated importance sampling for the generator/learner mismatch: multiplies the inner
    per-token term by sg[min(exp(l_old - b), C)].
    level="token": per-token ratio; level="sequence": exp(sum_t m (l_old - b)) per sequence.
    mode="truncate": min(ratio, C); mode="mask": ratio where ratio <= C, else 0."""

    name: ClassVar[str] = "tis"
    C: float = Field(2.0, gt=0)
    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"

    def mismatch_ratio(self, x: LossInputs) -> Tensor:
        """exp(l_old - b) per token, or its product over the sequence, detached [B, T]."""
        log_m = masked_log_ratio(x.old_logp, x.behavior_logp, x.mask)  # [B, T]
        if self.level == "sequence":
            log_m = log_m.sum(-1, keepdim=True).expand_as(log_m)  # [B, T]
        return torch.exp(log_m).detach()  # [B, T]

    def weights(self, x: LossInputs) -> Tensor:
        """The detached TIS weight [B, T]: truncated or masked mismatch ratio."""
        ratio = self.mismatch_ratio(x)  # [B, T]
        if self.mode == "mask":
            return torch.where(ratio > self.C, torch.zeros_like(ratio), ratio)  # [B, T]
        return ratio.clamp(max=self.C)  # [B, T]

    def token_loss(self, x: LossInputs) -> tuple[Tensor, dict[str, float]]:
        term, stats = self.inner.token_loss(x)  # [B, T]
        w = self.weights(x)  # [B, T]
        stats = {**stats, "tis_trunc_frac": _frac(self.mismatch_ratio(x) > self.C, x.mask)}
        stats.update(_weight_stats(w, x.mask, prefix="tis_weight"))
        return term * w, stats  # [B, T]


class Mc(Wrapper):
    """Median baseline (MC-GRPO style): the group is sampled with G+1 completions, A = R - median,
    no std scaling (MAD is 0 for binary rewards). The pivot (one sample whose reward equals the
    median, see policy.advantages.group_advantages(kind="median")) is excluded from backprop by the
    learner through the returned keep mask: it drops that row, or equivalently zeroes its mask (the
    aggregators do not count rows without trainable tokens). The loss itself is the inner one."""

    name: ClassVar[str] = "mc"

    @property
    def advantage(self) -> str:  # type: ignore[override]
        return "median"

    @property
    def extra_samples(self) -> int:  # type: ignore[override]
        return self.inner.extra_samples + 1


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (Grpo, DrGrpo, Dapo, Gspo, Cispo, MinPro, Prefix, Tis, Mc)
}
_SPEC = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$")


def make_objective(spec: str, **knobs: Any) -> Objective:
    """Build an objective from a spec such as "grpo", "tis(grpo)", "mc(dapo)", "tis(mc(minpro))".

    `knobs` go to the outermost objective; a wrapper's inner knobs go in `inner={...}` (nested
    wrappers nest the dict). Unknown names and knobs raise ValueError listing the valid ones."""
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"malformed objective spec {spec!r}; expected 'name' or 'wrapper(name)'")
    name, inner_spec = match.group(1), match.group(2)
    cls = OBJECTIVES.get(name)
    if cls is None:
        raise ValueError(f"unknown objective {name!r}; valid: {', '.join(sorted(OBJECTIVES))}")
    valid = sorted(k for k in cls.model_fields if k != "inner")
    unknown = sorted(set(knobs) - set(valid) - ({"inner"} if cls.wrapper else set()))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown} for objective {name!r}; valid knobs: {valid or 'none'}")
    if not cls.wrapper:
        if inner_spec is not None:
            raise ValueError(f"{name!r} is not a wrapper and takes no inner objective; wrappers: "
                             f"{', '.join(sorted(n for n, c in OBJECTIVES.items() if c.wrapper))}")
        return cls(**knobs)
    if not inner_spec:
        raise ValueError(f"{name!r} is a wrapper; write {name}(<objective>), e.g. {name}(grpo)")
    inner_knobs = knobs.pop("inner", None) or {}
    if not isinstance(inner_knobs, dict):
        raise ValueError(f"inner knobs for {name!r} must be a dict, got {type(inner_knobs).__name__}")
    return cls(inner=make_objective(inner_spec, **inner_knobs), **knobs)
