"""The loss menu's names, knobs and traits, without the math: what a config needs to check
`loss.name` and its knobs before any model (or torch) loads. policy/losses.py gives every
objective here its tensor math by subclassing it; the objectives themselves: policy/ALGORITHMS.md.

The knobs of an objective are its pydantic fields (unknown knobs are an error); its traits are
class variables: the advantage kind, extra samples per group, wrapper or not, whether its term
is already weighted by the behavior ratio rho = exp(l - b), and whether a row at advantage exactly 0
adds nothing to the loss and its gradient (zero_advantage_inert: the learner then never forwards it).

Usage:  check_objective("tis(dapo)", C=2.0, inner={"eps_high": 0.28})  # raises ValueError if wrong
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ObjectiveKnobs(BaseModel):
    """A named objective's knobs and traits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ClassVar[str] = "objective"
    advantage: ClassVar[str] = "mean_std"  # "mean_std" | "mean" | "median"
    extra_samples: ClassVar[int] = 0  # completions per group beyond G (mc needs G + 1)
    wrapper: ClassVar[bool] = False
    uses_behavior_ratio: ClassVar[bool] = False  # term already weighted by rho = exp(l - b)
    # Every per-token term is exactly 0, with a zero gradient, on a row at A = 0, whatever the other
    # rows hold (no KL / entropy term, no filter reading the batch): the learner may leave such a
    # row out of the forward pass, counted as absent in the denominators (policy/selection.py).
    # Off unless an objective's math is checked to allow it.
    zero_advantage_inert: ClassVar[bool] = False

    @property
    def spec(self) -> str:
        """The registry spec that builds this objective, e.g. 'tis(mc(grpo))'."""
        return self.name


class GrpoKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "grpo"
    zero_advantage_inert: ClassVar[bool] = True  # -min(r A, clip(r) A) (dual clip: only A < 0): 0 * r
    eps: float = Field(0.2, gt=0)
    eps_low: float | None = Field(None, ge=0, le=1)  # lower clip 1 - eps_low; None: eps
    eps_high: float | None = Field(None, ge=0)  # upper clip 1 + eps_high; None: eps
    dual_clip: float | None = Field(3.0, gt=1)
    aggregation: Literal["smtm", "tm", "cn"] = "smtm"
    l_norm: float | None = Field(None, gt=0)  # only for aggregation="cn"

    def clip_range(self) -> tuple[float, float]:
        """(1 - eps_low, 1 + eps_high), each side eps unless set."""
        low = self.eps if self.eps_low is None else self.eps_low
        high = self.eps if self.eps_high is None else self.eps_high
        return 1 - low, 1 + high


class DrGrpoKnobs(GrpoKnobs):
    name: ClassVar[str] = "dr_grpo"
    zero_advantage_inert: ClassVar[bool] = True  # grpo's term
    advantage: ClassVar[str] = "mean"
    aggregation: Literal["smtm", "tm", "cn"] = "cn"


class DapoKnobs(GrpoKnobs):
    name: ClassVar[str] = "dapo"
    zero_advantage_inert: ClassVar[bool] = True  # grpo's term
    eps_high: float | None = Field(0.28, ge=0)
    aggregation: Literal["smtm", "tm", "cn"] = "tm"


class GspoKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "gspo"
    zero_advantage_inert: ClassVar[bool] = True  # -min(s A, clip(s) A), s the row's own sequence ratio
    eps_low: float = Field(3e-4, ge=0, le=1)
    eps_high: float = Field(4e-4, ge=0)
    dual_clip: float | None = Field(3.0, gt=1)


class CispoKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "cispo"
    uses_behavior_ratio: ClassVar[bool] = True
    zero_advantage_inert: ClassVar[bool] = True  # -sg[w/rho] rho A, w from the row's own tokens
    eps_high: float = Field(0.28, ge=0)


class MinProKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "minpro"
    uses_behavior_ratio: ClassVar[bool] = True
    zero_advantage_inert: ClassVar[bool] = True  # as cispo: pmin is a minimum over the row's own prefix
    eps_low: float = Field(1.0, ge=0, le=1)
    eps_high: float = Field(0.28, ge=0)
    pmin_floor: float | None = Field(None, gt=0)
    dead_zone: float = Field(0.5, ge=0)


class PrefixKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "prefix"
    uses_behavior_ratio: ClassVar[bool] = True
    zero_advantage_inert: ClassVar[bool] = True  # as cispo: the prefix product is the row's own
    C: float = Field(2.0, gt=0)


class FTisKnobs(ObjectiveKnobs):
    name: ClassVar[str] = "ftis"
    uses_behavior_ratio: ClassVar[bool] = True
    # Its term is cispo-like, but it filters rows (filters_rows: the filter and filtered_frac are
    # over the batch's rows, the learner trains it on the whole-batch path): rows stay forwarded.
    zero_advantage_inert: ClassVar[bool] = False
    C: float = Field(2.0, gt=0)
    kl_max: float = Field(0.5, gt=0)


class WrapperKnobs(ObjectiveKnobs):
    """An objective built around an inner one: written 'name(inner)' in the registry. Its traits
    are the inner objective's unless it says otherwise."""

    wrapper: ClassVar[bool] = True
    inner: ObjectiveKnobs

    @property
    def spec(self) -> str:
        return f"{self.name}({self.inner.spec})"

    @property
    def advantage(self) -> str:  # type: ignore[override]
        return self.inner.advantage

    @property
    def extra_samples(self) -> int:  # type: ignore[override]
        return self.inner.extra_samples

    @property
    def uses_behavior_ratio(self) -> bool:  # type: ignore[override]
        return self.inner.uses_behavior_ratio

    @property
    def zero_advantage_inert(self) -> bool:  # type: ignore[override]
        """tis multiplies the inner term by a detached finite weight (<= C), mc only changes the
        advantage (A = R - median, the pivot is no row): both are inert exactly when the inner one is."""
        return self.inner.zero_advantage_inert


class TisKnobs(WrapperKnobs):
    """tis refuses an inner objective that already weights by a behavior ratio (policy/losses.py Tis)."""

    name: ClassVar[str] = "tis"
    C: float = Field(2.0, gt=0)
    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"

    @field_validator("inner", mode="after")
    @classmethod
    def _refuse_behavior_ratio(cls, v: ObjectiveKnobs) -> ObjectiveKnobs:
        if v.uses_behavior_ratio:
            raise ValueError(
                f"tis({v.spec}) corrects the sampler mismatch twice: {v.spec} already weights its term "
                f"by a behavior ratio against b (e.g. rho = exp(l - b)) and tis multiplies by "
                f"min(exp(l_old - b), C) on top, a weight ~ (pi_theta/pi_b)(pi_old/pi_b). Use {v.spec} "
                f"alone (its own knobs bound the weight), or tis around a PPO-style objective whose "
                f"ratio is against l_old: grpo, dr_grpo, dapo, gspo")
        return v

    @property
    def uses_behavior_ratio(self) -> bool:  # type: ignore[override]
        return True  # its weight is exp(l_old - b): tis(tis(x)) would double-correct as well


class McKnobs(WrapperKnobs):
    name: ClassVar[str] = "mc"

    @property
    def advantage(self) -> str:  # type: ignore[override]
        return "median"

    @property
    def extra_samples(self) -> int:  # type: ignore[override]
        return self.inner.extra_samples + 1


OBJECTIVE_KNOBS: dict[str, type[ObjectiveKnobs]] = {
    cls.name: cls for cls in (GrpoKnobs, DrGrpoKnobs, DapoKnobs, GspoKnobs, CispoKnobs, MinProKnobs, PrefixKnobs,
                              FTisKnobs, TisKnobs, McKnobs)
}
_SPEC = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$")


def check_objective(spec: str, **knobs: Any) -> ObjectiveKnobs:
    """The knobs of `spec` validated without torch: raises the ValueError make_objective would."""
    return build_objective(OBJECTIVE_KNOBS, spec, knobs)


def build_objective(menu: Mapping[str, type[ObjectiveKnobs]], spec: str, knobs: Mapping[str, Any]) -> ObjectiveKnobs:
    """Build an objective of `menu` (name -> class) from a spec such as "grpo", "tis(grpo)",
    "mc(dapo)", "tis(mc(dapo))".

    `knobs` go to the outermost objective; a wrapper's inner knobs go in `inner={...}` (nested
    wrappers nest the dict). Unknown names and knobs raise ValueError listing the valid ones; so
    does tis around an objective that already weights by the behavior ratio."""
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"malformed objective spec {spec!r}; expected 'name' or 'wrapper(name)'")
    name, inner_spec = match.group(1), match.group(2)
    cls = menu.get(name)
    if cls is None:
        raise ValueError(f"unknown objective {name!r}; valid: {', '.join(sorted(menu))}")
    knobs = dict(knobs)
    valid = sorted(k for k in cls.model_fields if k != "inner")
    unknown = sorted(set(knobs) - set(valid) - ({"inner"} if cls.wrapper else set()))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown} for objective {name!r}; valid knobs: {valid or 'none'}")
    if not cls.wrapper:
        if inner_spec is not None:
            raise ValueError(f"{name!r} is not a wrapper and takes no inner objective; wrappers: "
                             f"{', '.join(sorted(n for n, c in menu.items() if c.wrapper))}")
        return _build(cls, spec, knobs)
    if not inner_spec:
        raise ValueError(f"{name!r} is a wrapper; write {name}(<objective>), e.g. {name}(grpo)")
    inner_knobs = knobs.pop("inner", None) or {}
    if not isinstance(inner_knobs, dict):
        raise ValueError(f"inner knobs for {name!r} must be a dict, got {type(inner_knobs).__name__}")
    return _build(cls, spec, {"inner": build_objective(menu, inner_spec, inner_knobs), **knobs})


def _build(cls: type[ObjectiveKnobs], spec: str, knobs: dict[str, Any]) -> ObjectiveKnobs:
    """cls(**knobs), with pydantic's report flattened into one ValueError line naming the spec."""
    try:
        return cls(**knobs)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or spec}: {e['msg'].removeprefix('Value error, ')}"
                             for e in err.errors())
        raise ValueError(f"{spec}: {problems}") from None
