"""Which rows one update trains: every group's advantages, the row weights of peers' groups, and
the rows `loss.off_policy.peer_failures = "drop"` leaves out (policy/ALGORITHMS.md, "Peers'
failures dropped"; `own_failures = "drop"`, a control, leaves out ours by the same rule), and the
rows at advantage exactly 0 where their objective makes that free (`skip_zero_rows`).
policy/learner.py pads the trained rows into its batch; a dropped row is never forwarded, yet
counts in every aggregation's denominator (`absent_weights`)."""
from __future__ import annotations

import dataclasses

import torch

from policy.advantages import AdvantageKind, group_advantages, group_size_weight
from policy.settings import OffPolicyConfig
from policy.types import TrainGroup, TrainSample


@dataclasses.dataclass
class Selection:
    """The rows of one update, group by group (N of them), and the groups skipped."""

    samples: list[TrainSample] = dataclasses.field(default_factory=list)
    advantages: list[float] = dataclasses.field(default_factory=list)  # 0 on dropped rows
    row_weights: list[float] = dataclasses.field(default_factory=list)
    dropped: list[bool] = dataclasses.field(default_factory=list)  # a row not forwarded (failures, or zero_adv)
    zero_adv: list[bool] = dataclasses.field(default_factory=list)  # dropped for its A = 0 (skip_zero_rows)
    groups_zero_adv: int = 0
    ext_groups_no_correct: int = 0  # peers' groups without a correct sample (peer_failures = drop)
    own_groups_no_correct: int = 0  # groups with samples of ours and no correct sample (own_failures = drop)

    @property
    def trained(self) -> list[int]:
        """Indices of the rows that are forwarded and trained."""
        return [i for i, dropped in enumerate(self.dropped) if not dropped]

    def drop_stats(self) -> dict[str, float]:
        """Rows dropped and groups skipped for want of a correct sample, peers' and ours, and rows
        left out at A = 0 (0s left out)."""
        flags = self.zero_adv or [False] * len(self.dropped)  # [N] a Selection built without the flags
        zero = [d and z for d, z in zip(self.dropped, flags)]  # [N] a flagged row forwarded anyway is not counted
        failed = [d and not z for d, z in zip(self.dropped, zero)]  # [N]
        own = sum(f and s.tier is None for s, f in zip(self.samples, failed))
        counts = {"ext_failures_dropped": sum(failed) - own, "own_failures_dropped": own,
                  "ext_groups_no_correct": self.ext_groups_no_correct,
                  "own_groups_no_correct": self.own_groups_no_correct, "zero_adv_rows_skipped": sum(zero)}
        return {key: float(n) for key, n in counts.items() if n}


def select_rows(groups: list[TrainGroup], kind: AdvantageKind, off_policy: OffPolicyConfig,
                group_size: int | None, skip_zero_advantage: bool) -> Selection:
    """Every row of the update with its advantage and row weight, which rows are dropped peer rows,
    and the groups skipped. Every group uses the local objective's advantage `kind`: a peer group
    scored on another scale would weigh more or less than ours for nothing (local dr_grpo and
    external minpro made a peer group weigh 2.8x ours). `group_size`: our G (None: the largest
    group of our own here); a larger peer group counts as G rows (`group_size_weight`).

    peer_failures = "drop": advantages are computed over the whole group as always; then a peer's
    sample trains only if our verifier found it correct and its advantage is not negative. Every
    other peer row is dropped: it keeps advantage 0 and its place in the denominators, nothing
    else. A peer's group (no sample of ours) without a correct sample is skipped whole, like a
    zero-advantage group: with partial credit its formatted wrong answers can sit above its mean.
    own_failures = "drop" applies the same rule to this node's samples (the positive-only control)."""
    drop_peer, drop_own = off_policy.peer_failures == "drop", off_policy.own_failures == "drop"
    reference = group_size or max((sum(s.tier is None for s in g.samples) for g in groups if not g.external),
                                  default=None)
    sel = Selection()
    for group in groups:
        rewards = torch.tensor([s.reward for s in group.samples], dtype=torch.float32)  # [G]
        kappa = torch.tensor([1.0 if s.tier is None else off_policy.neg_damping
                              for s in group.samples])  # [G] a peer's failure counts for less, whatever its tier
        adv, keep = group_advantages(rewards, kind, kappa)  # [G], [G] bool
        if skip_zero_advantage and bool((adv == 0).all()):
            sel.groups_zero_adv += 1
            continue
        drops = [drop_peer if s.tier is not None else drop_own for s in group.samples]  # [G]
        if all(drops) and not any(s.correct for s in group.samples):
            if group.external:
                sel.ext_groups_no_correct += 1
            else:
                sel.own_groups_no_correct += 1
            continue
        n_peer = sum(s.tier is not None for s in group.samples)
        peer_weight, peer_scale = (1.0, 1.0) if reference is None else group_size_weight(
            n_peer, reference, kind if group.external else "mean")
        for sample, a, k, drop in zip(group.samples, adv.tolist(), keep.tolist(), drops):
            if not k:  # mc: the pivot sample is excluded from backprop
                continue
            peer = sample.tier is not None
            dropped = drop and (a < 0 or sample.correct is not True)
            sel.samples.append(sample)
            sel.advantages.append(0.0 if dropped else a * peer_scale if peer else a)
            sel.row_weights.append(peer_weight if peer else 1.0)
            sel.dropped.append(dropped)
            sel.zero_adv.append(False)
    return sel


def skip_zero_rows(sel: Selection, own: bool, peer: bool) -> Selection:
    """sel with every row still trained at advantage exactly 0 dropped (and flagged zero_adv): ours
    when `own`, peers' when `peer`, i.e. when the objective that trains them is zero_advantage_inert
    (policy/loss_knobs.py). Such a row adds exactly 0 to the numerator, so left out of the forward
    pass yet counted in the denominators (`absent_weights`) it gives the gradient it gave forwarded:
    a flat group kept by skip_zero_advantage = false, an mc row at the median, a partial-credit row
    at its group's mean cost nothing."""
    zero = [not d and a == 0.0 and (peer if s.tier is not None else own)
            for s, a, d in zip(sel.samples, sel.advantages, sel.dropped)]  # [N]
    return dataclasses.replace(sel, dropped=[d or z for d, z in zip(sel.dropped, zero)], zero_adv=zero)


def absent_weights(sel: Selection) -> tuple[torch.Tensor, torch.Tensor]:
    """What each row adds to the aggregations' denominators when it is dropped, per row [N]: its
    row weight if it has a trainable token (SMTM's and CN's row count), and its row weight x
    trainable tokens (TM's token count); 0 for a row that trains (its batch row counts itself).
    With these a dropped row weighs in every aggregation exactly as it did trained at advantage 0
    (it then added 0 to the numerator): taking it out of the denominators too pushed every
    remaining token, the peer's successes and our own samples alike, harder than with the whole
    group trained (a 1-of-8 peer success 8x as hard with dr_grpo's CN, about 2x with TM/SMTM)."""
    tokens = torch.tensor([float(sum(s.loss_mask)) if s.loss_mask is not None else float(len(s.completion_ids))
                           for s in sel.samples])  # [N]
    weight = torch.tensor(sel.row_weights) * torch.tensor(sel.dropped, dtype=torch.float32)  # [N]
    return weight * (tokens > 0), weight * tokens  # [N], [N]
