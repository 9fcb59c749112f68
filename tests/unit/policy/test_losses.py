"""Loss menu and advantages: policy/ALGORITHMS.md numeric checks 1, 2, 3, 4, 6, 7 (5 is in
test_allocation.py, 8 in test_behavior.py) plus behaviour tests of each objective."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.advantages import group_advantages
from policy.loss_knobs import OBJECTIVE_KNOBS, check_objective
from policy.losses import (
    MAX_LOG_RATIO,
    OBJECTIVES,
    Cispo,
    FTis,
    Gspo,
    LossInputs,
    MinPro,
    Objective,
    Prefix,
    Tis,
    apply_row_keep,
    constant_normalizer,
    effective_sample_size,
    make_objective,
    masked_log_ratio,
    masked_token_mean,
    min_prefix_ratio,
    sequence_mean_token_mean,
)

# Three sequences of unequal length with padding, and a masked hint token at the start of row 2.
MASK = torch.tensor(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0],
        [0, 1, 1, 0, 0, 0],
    ],
    dtype=torch.float32,
)


def random_logp(seed: int, shape=MASK.shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (-3 * torch.rand(shape, generator=g)).requires_grad_(True)  # [B, T] log-probs < 0


def reference_tm(A: torch.Tensor, l: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """-TM[A * l], written out independently of policy.losses."""
    return -(A[:, None] * l * mask).sum() / mask.sum()


def grad_of(loss: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, l)
    return g


# ------------------------------------------------------------------------------------------
# Check 1: all ratios 1 -> gradient -TM[A grad l], ratio-form value -TM[A]
# ------------------------------------------------------------------------------------------

CHECK1_SPECS = [
    ("grpo", {"aggregation": "tm"}),
    ("dapo", {}),
    ("cispo", {}),
    ("minpro", {}),
    ("prefix", {}),
    ("tis(grpo)", {"C": 1.0, "inner": {"aggregation": "tm"}}),
    ("tis(grpo)", {"C": 2.0, "level": "sequence", "inner": {"aggregation": "tm"}}),
    ("tis(dapo)", {"C": 1.0}),
    ("ftis", {}),
    ("ftis", {"C": 1.0}),
]


@pytest.mark.parametrize("spec,knobs", CHECK1_SPECS, ids=[f"{s}-{k}" for s, k in CHECK1_SPECS])
def test_check1_all_ratios_one_equal_grpo_token_mean(spec, knobs):
    l = random_logp(0)
    A = torch.tensor([1.3, -0.7, 0.4])
    x = LossInputs(logp=l, old_logp=l.detach(), behavior_logp=l.detach(), mask=MASK, advantages=A)  # b = l_old = l
    loss, _ = make_objective(spec, **knobs).loss(x)
    ref = reference_tm(A, l, MASK)
    assert torch.allclose(grad_of(loss, l), grad_of(ref, l), atol=1e-6)
    expected_value = -(A[:, None] * MASK).sum() / MASK.sum()  # -TM[A]
    assert torch.allclose(loss.detach(), expected_value, atol=1e-6)


@pytest.mark.parametrize("spec", ["minpro", "cispo"])
def test_check1_tier2_external_behavior_is_proxy(spec):
    """Tier 2: no usable sender log-probs, b_t = l^prox_t (the receiver's own recomputation)."""
    l = random_logp(1)
    l_prox = l.detach().clone()  # receiver's recomputation with theta_0
    A = torch.tensor([0.5, 2.0, -1.5])
    x = LossInputs(logp=l, old_logp=l_prox, behavior_logp=l_prox, mask=MASK, advantages=A)
    loss, _ = make_objective(spec).loss(x)
    assert torch.allclose(grad_of(loss, l), grad_of(reference_tm(A, l, MASK), l), atol=1e-6)
    assert torch.allclose(loss.detach(), -(A[:, None] * MASK).sum() / MASK.sum(), atol=1e-6)


def test_check1_is_discriminating_smtm_differs_from_tm():
    """The check can fail: GRPO's default SMTM weights tokens of short sequences more."""
    l = random_logp(2)
    A = torch.tensor([1.3, -0.7, 0.4])
    x = LossInputs(l, l.detach(), l.detach(), MASK, A)
    loss, _ = make_objective("grpo").loss(x)
    assert not torch.allclose(grad_of(loss, l), grad_of(reference_tm(A, l, MASK), l), atol=1e-4)


@pytest.mark.parametrize("spec", ["grpo", "dr_grpo", "mc(grpo)"])
def test_grpo_refuses_beta(spec):
    """The k3 penalty was against l_old (no reference model): exactly 0 with one step per round,
    so the knob is gone rather than silently doing nothing."""
    knobs = {"inner": {"beta": 0.1}} if spec.startswith("mc") else {"beta": 0.1}
    with pytest.raises(ValueError, match=r"unknown knob.*'beta'"):
        make_objective(spec, **knobs)


# ------------------------------------------------------------------------------------------
# Check 2: MinPRO's exclusive prefix minimum
# ------------------------------------------------------------------------------------------

LOG_RHO = torch.tensor([[0.1, -0.5, 0.3, -1.0, 0.2]])  # [1, 5]
PMIN = torch.tensor([[1.0, 1.10517, 0.60653, 0.60653, 0.36788]])
PMIN_RHO = torch.tensor([[1.10517, 0.67032, 0.81873, 0.22313, 0.44933]])


def test_check2_min_prefix_ratio_values():
    ones = torch.ones_like(LOG_RHO)
    pmin = torch.exp(min_prefix_ratio(LOG_RHO, ones))  # [1, 5]
    assert torch.allclose(pmin, PMIN, atol=1e-5)
    assert torch.allclose(pmin * torch.exp(LOG_RHO), PMIN_RHO, atol=1e-5)
    assert (pmin[0, 2:] <= pmin[0, 1:-1]).all()  # non-increasing for t >= 2


def test_check2_minpro_weights_are_pmin_times_rho():
    """The same numbers through the objective (eps_high wide enough not to clip)."""
    l = torch.zeros(1, 5)
    x = LossInputs(l, l, l - LOG_RHO, torch.ones(1, 5), torch.ones(1))  # b = l - log rho
    exact = MinPro(eps_high=10.0, dead_zone=0.0)  # the check is the exact method: no dead zone
    assert torch.allclose(exact.weights(x), PMIN_RHO, atol=1e-5)
    assert torch.allclose(MinPro(dead_zone=0.0).weights(x), PMIN_RHO.clamp(max=1.28), atol=1e-5)  # default clip


@pytest.mark.parametrize("t", range(5))
def test_check2_pmin_t_ignores_rho_t(t):
    ones = torch.ones_like(LOG_RHO)
    changed = LOG_RHO.clone()
    changed[0, t] = -4.0
    before = min_prefix_ratio(LOG_RHO, ones)
    after = min_prefix_ratio(changed, ones)
    assert torch.equal(after[0, : t + 1], before[0, : t + 1])  # pmin_t and earlier unchanged


def test_check2_masked_padding_changes_nothing():
    padded = torch.cat([LOG_RHO, torch.full((1, 3), -9.0)], dim=-1)  # [1, 8]
    mask = torch.cat([torch.ones(1, 5), torch.zeros(1, 3)], dim=-1)  # [1, 8]
    pmin = torch.exp(min_prefix_ratio(padded, mask))
    assert torch.allclose(pmin[:, :5], PMIN, atol=1e-5)
    # a masked hint token in the middle is skipped too, and the first trainable token gets pmin = 1
    inner = torch.tensor([[-9.0, 0.1, -9.0, -0.5]])
    got = torch.exp(min_prefix_ratio(inner, torch.tensor([[0.0, 1.0, 0.0, 1.0]])))
    assert torch.allclose(got[0, [1, 3]], torch.tensor([1.0, 1.10517]), atol=1e-5)


# ------------------------------------------------------------------------------------------
# Check 3: pmin versus the exact prefix product
# ------------------------------------------------------------------------------------------

def _exclusive_prefix_log(log_rho: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(log_rho, -1) - log_rho  # [1, T]  sum_{j<t} log rho_j


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-3.0, 0.0), min_size=1, max_size=20))
def test_check3_ratios_below_one_pmin_at_least_prefix(values):
    log_rho = torch.tensor([values], dtype=torch.float64)
    log_pmin = min_prefix_ratio(log_rho, torch.ones_like(log_rho))
    assert (log_pmin >= _exclusive_prefix_log(log_rho) - 1e-9).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=1, max_size=20))
def test_check3_ratios_above_one_pmin_at_most_prefix(values):
    log_rho = torch.tensor([values], dtype=torch.float64)
    log_pmin = min_prefix_ratio(log_rho, torch.ones_like(log_rho))
    assert (log_pmin <= _exclusive_prefix_log(log_rho) + 1e-9).all()


# ------------------------------------------------------------------------------------------
# Check 4: group advantages
# ------------------------------------------------------------------------------------------

def test_check4_grpo_and_dr_grpo_advantages():
    R = torch.tensor([1.0, 0.0, 0.0, 1.0])
    A, keep = group_advantages(R, "mean_std")
    assert torch.allclose(A, torch.tensor([0.8659, -0.8659, -0.8659, 0.8659]), atol=1e-4)
    assert keep.all()
    A_dr, _ = group_advantages(R, make_objective("dr_grpo").advantage)
    assert torch.equal(A_dr, torch.tensor([0.5, -0.5, -0.5, 0.5]))


@pytest.mark.parametrize("kind", ["mean_std", "mean", "median"])
@pytest.mark.parametrize("R", [[0.1, 0.1, 0.1], [1.0, 1.0, 1.0, 1.0], [0.7]])
def test_check4_all_equal_rewards_give_exact_zero(kind, R):
    A, _ = group_advantages(torch.tensor(R), kind)
    assert torch.equal(A, torch.zeros(len(R)))


def test_check4_mc_median_drops_exactly_one_pivot():
    R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    obj = make_objective("mc(grpo)")
    assert obj.advantage == "median" and obj.extra_samples == 1
    A, keep = group_advantages(R, obj.advantage)
    assert torch.equal(A, torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0]))  # R - median(=0)
    assert int((~keep).sum()) == 1 and int(keep.sum()) == 4
    assert R[~keep].item() == 0.0  # the pivot's reward is the median


def test_mc_end_to_end_keep_mask_excludes_pivot():
    """mc(dapo): the learner multiplies the pivot row's mask by keep; the pivot gets no gradient
    and the loss equals the inner loss on the 4 kept samples alone."""
    R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    obj = make_objective("mc(dapo)")
    A, keep = group_advantages(R, obj.advantage)
    l = random_logp(4, (5, 4))
    drift = 0.3 * torch.randn(5, 4, generator=torch.Generator().manual_seed(5))
    mask = torch.ones(5, 4) * keep[:, None]  # [5, 4] pivot row zeroed
    loss, _ = obj.loss(LossInputs(l, l.detach() + drift, l.detach(), mask, A))
    g = grad_of(loss, l)
    assert torch.isfinite(loss) and torch.equal(g[~keep], torch.zeros_like(g[~keep]))
    l_kept = l.detach()[keep].requires_grad_(True)
    ref, _ = make_objective("dapo").loss(LossInputs(l_kept, l_kept.detach() + drift[keep], l_kept.detach(), torch.ones(4, 4), A[keep]))
    assert torch.allclose(loss, ref, atol=1e-6)
    assert torch.allclose(g[keep], grad_of(ref, l_kept), atol=1e-6)


# DAPO's data-level rules, written out for check 4d: the node applies neither (policy/ALGORITHMS.md,
# "Group advantages"), so they live here and not in policy/.
def overlong_penalty(lengths: torch.Tensor | list[int], max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward:

        0                                  if L <= max_len - cache_len
        (max_len - cache_len - L) / cache  if max_len - cache_len < L <= max_len   (0 -> -1)
        -1                                 if L > max_len
    cache_len = 0 degenerates to a hard step (0 up to max_len, -1 beyond).
    """
    if cache_len < 0 or cache_len > max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    L = torch.as_tensor(lengths, dtype=torch.float32)  # [N]
    if cache_len == 0:
        return torch.where(L > max_len, -1.0, 0.0)  # [N]
    return ((max_len - cache_len - L) / cache_len).clamp(-1.0, 0.0)  # [N]


def dynamic_sampling_keep(rewards: torch.Tensor, correct_threshold: float = 1.0) -> bool:
    """DAPO dynamic sampling: keep a group only if 0 < #correct < G, i.e. it has reward variance
    between right and wrong (all-right and all-wrong groups give A = 0 and waste a slot).
    A completion counts as correct when its reward >= correct_threshold."""
    R = torch.as_tensor(rewards)  # [G]
    n_correct = int((R >= correct_threshold).sum())
    return 0 < n_correct < R.numel()


def test_dapo_data_filters():
    assert overlong_penalty([10, 12, 14, 16, 20], max_len=16, cache_len=4).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert dynamic_sampling_keep(torch.tensor([1.0, 0.0, 0.0]))
    assert not dynamic_sampling_keep(torch.tensor([1.0, 1.0, 1.0]))
    assert not dynamic_sampling_keep(torch.tensor([0.0, 0.0, 0.0]))


# ------------------------------------------------------------------------------------------
# Check 6: TIS truncation, GSPO sequence clip
# ------------------------------------------------------------------------------------------

def test_check6_tis_truncates_mismatch_ratio_three_to_two():
    l_old = torch.zeros(1, 3)
    b = -torch.log(torch.tensor([[3.0, 1.5, 1.0]]))  # exp(l_old - b) = [3, 1.5, 1]
    x = LossInputs(l_old.clone(), l_old, b, torch.ones(1, 3), torch.ones(1))
    assert torch.allclose(Tis(inner=make_objective("grpo"), C=2.0).weights(x), torch.tensor([[2.0, 1.5, 1.0]]))
    assert torch.allclose(Tis(inner=make_objective("grpo"), C=2.0, mode="mask").weights(x), torch.tensor([[0.0, 1.5, 1.0]]))
    seq = Tis(inner=make_objective("grpo"), C=10.0, level="sequence").weights(x)
    assert torch.allclose(seq, torch.full((1, 3), 4.5))  # 3 * 1.5 * 1
    loss, stats = make_objective("tis(grpo)", inner={"aggregation": "tm"}).loss(x)
    assert loss.item() == pytest.approx(-(2.0 + 1.5 + 1.0) / 3)  # r = 1: per-token -w A
    assert stats["tis_trunc_frac"] == pytest.approx(1 / 3)


def test_check6_gspo_sequence_ratio_clipped_zero_gradient():
    log_r = torch.tensor([[0.2, -0.2, 0.3, 5.0]])  # last token is padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    l = torch.full((1, 4), -1.0, requires_grad=True)
    x = LossInputs(l, l.detach() - log_r, l.detach(), mask, torch.tensor([1.0]))
    loss, stats = Gspo().loss(x)
    assert stats["ratio_mean"] == pytest.approx(1.10517, abs=1e-5)  # s = exp(0.1)
    assert stats["clip_frac"] == 1.0
    assert torch.equal(grad_of(loss, l), torch.zeros(1, 4))
    # with A < 0 the unclipped branch is the min: the gradient is non-zero
    x_neg = LossInputs(l, l.detach() - log_r, l.detach(), mask, torch.tensor([-1.0]))
    loss_neg, _ = Gspo().loss(x_neg)
    assert grad_of(loss_neg, l)[0, :3].abs().min() > 0


def test_gspo_is_mean_over_sequences():
    l = random_logp(6)
    A = torch.tensor([1.0, 2.0, -4.0])
    loss, _ = Gspo().loss(LossInputs(l, l.detach(), l.detach(), MASK, A))
    assert loss.item() == pytest.approx(-A.mean().item(), abs=1e-6)


def test_ppo_clip_higher_dapo_vs_grpo():
    """r = 1.25 with A > 0: clipped by grpo (1.2) but not by dapo (1.28)."""
    l = torch.zeros(1, 2, requires_grad=True)
    x = LossInputs(l, l.detach() - math.log(1.25), l.detach(), torch.ones(1, 2), torch.ones(1))
    loss_g, stats_g = make_objective("grpo").loss(x)
    loss_d, stats_d = make_objective("dapo").loss(x)
    assert stats_g["clip_frac"] == 1.0 and torch.equal(grad_of(loss_g, l), torch.zeros(1, 2))
    assert stats_d["clip_frac"] == 0.0 and torch.allclose(grad_of(loss_d, l), torch.full((1, 2), -1.25 / 2))


def test_dapo_is_grpo_with_clip_higher_and_token_mean():
    """dapo is grpo with eps_high = 0.28 and TM: the same loss, gradient and statistics, ratios on both
    sides of the clip; eps_low moves only the lower side."""
    l = random_logp(21)
    drift = 0.4 * torch.randn(MASK.shape, generator=torch.Generator().manual_seed(2))
    x = LossInputs(l, l.detach() + drift, l.detach(), MASK, torch.tensor([1.0, -1.0, 0.5]))
    loss_d, stats_d = make_objective("dapo").loss(x)
    loss_g, stats_g = make_objective("grpo", eps_high=0.28, aggregation="tm").loss(x)
    assert torch.equal(loss_d, loss_g) and stats_d == stats_g and 0 < stats_d["clip_frac"] < 1
    assert torch.equal(grad_of(loss_d, l), grad_of(loss_g, l))
    assert make_objective("dapo", eps_low=0.1).clip_range() == (1 - 0.1, 1 + 0.28)
    assert make_objective("grpo").clip_range() == (1 - 0.2, 1 + 0.2)


# ------------------------------------------------------------------------------------------
# Check 7: effective sample size
# ------------------------------------------------------------------------------------------

def test_check7_effective_sample_size():
    assert effective_sample_size(torch.tensor([1.0, 1.0, 1.0, 1.0])) == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([4.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert effective_sample_size(torch.tensor([1.0, 3.0])) == pytest.approx(16 / 20)


# ------------------------------------------------------------------------------------------
# Objective behaviour
# ------------------------------------------------------------------------------------------

def test_prefix_weights_truncated_at_C():
    log_rho = torch.tensor([[0.5, 0.5, -2.0, 0.5, 0.5, 9.0]])  # last one is padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    l = torch.zeros(1, 6)
    w = Prefix(C=2.0).weights(LossInputs(l, l, l - log_rho, mask, torch.ones(1)))
    expected = torch.exp(torch.tensor([0.5, 1.0, -1.0, -0.5, 0.0])).clamp(max=2.0)  # [1.6487, 2, e^-1, e^-.5, 1]
    assert torch.allclose(w[0, :5], expected, atol=1e-6)


def test_minpro_weights_shrink_under_large_drift():
    """A behavior-shifted batch (peer rollouts, |log rho| ~ 1): MinPRO weights decay along the
    sequence, token-level CISPO weights do not; with no drift both stay ~1."""
    g = torch.Generator().manual_seed(7)
    l = -3 * torch.rand(16, 64, generator=g)
    mask = torch.ones(16, 64)
    drifted = LossInputs(l, l, l - torch.randn(16, 64, generator=g), mask, torch.ones(16))
    w_min, w_cis = MinPro().weights(drifted), Cispo().weights(drifted)
    assert w_min[:, -16:].mean() < 0.25 and w_min[:, :4].mean() > 0.5
    assert w_cis[:, -16:].mean() > 0.5
    _, stats = MinPro().loss(drifted)
    assert stats["weight_ess"] < effective_sample_size(w_cis)
    calm = LossInputs(l, l, l - 1e-3 * torch.randn(16, 64, generator=g), mask, torch.ones(16))
    assert torch.allclose(MinPro().weights(calm), torch.ones(16, 64), atol=0.05)


def test_minpro_pmin_floor():
    log_rho = torch.tensor([[-10.0, 0.5, 0.2]])
    l = torch.zeros(1, 3)
    x = LossInputs(l, l, l - log_rho, torch.ones(1, 3), torch.ones(1))
    no_floor = MinPro(dead_zone=0.0).weights(x)
    floored = MinPro(pmin_floor=1e-3, dead_zone=0.0).weights(x)
    assert torch.allclose(no_floor[0, 1:], torch.exp(torch.tensor([-9.5, -9.8])), rtol=1e-4)
    assert torch.allclose(floored[0, 1:], 1e-3 * torch.exp(torch.tensor([0.5, 0.2])), rtol=1e-4)
    assert floored[0, 0] == no_floor[0, 0]  # position 1: pmin = 1, no floor involved


def test_dr_grpo_uses_constant_normalizer():
    l = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    A = torch.tensor([1.0, -0.5])
    x = LossInputs(l, l.detach(), l.detach(), mask, A)
    loss, _ = make_objective("dr_grpo", l_norm=10).loss(x)
    assert loss.item() == pytest.approx(-(3 * 1.0 - 2 * 0.5) / (2 * 10))  # -sum(A m) / (G L_norm)
    assert torch.allclose(grad_of(loss, l), -A[:, None] * mask / 20)
    # no default L_norm: it comes from the knob or from the data's completion budget
    assert make_objective("dr_grpo").l_norm is None
    with pytest.raises(ValueError, match="CN aggregation needs l_norm or LossInputs.completion_budget"):
        make_objective("dr_grpo").loss(x)
    budget, _ = make_objective("dr_grpo").loss(LossInputs(l, l.detach(), l.detach(), mask, A, completion_budget=10))
    assert torch.equal(budget, loss)
    knob_wins, _ = make_objective("dr_grpo", l_norm=10).loss(LossInputs(l, l.detach(), l.detach(), mask, A, completion_budget=99))
    assert torch.equal(knob_wins, loss)


@pytest.mark.parametrize("spec", ["tis(dr_grpo)", "mc(dr_grpo)", "tis(mc(dr_grpo))"])
def test_dr_grpo_inside_wrappers_uses_completion_budget(spec):
    """The budget travels with the data, so wrapped dr_grpo no longer silently keeps L_norm = 64."""
    R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    _, keep = group_advantages(R, "median")  # mc's pivot: the learner zeroes its row
    A = torch.tensor([0.5, -0.5, -0.5, 0.0, 0.5])
    l = random_logp(9, (5, 4))
    drift = 0.3 * torch.randn(5, 4, generator=torch.Generator().manual_seed(10))
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]] * 3 + [[1.0, 1.0, 0.0, 0.0]] * 2) * keep[:, None]  # [5, 4]
    old = l.detach() + drift  # b = l_old: tis's weight is exactly 1
    loss, _ = make_objective(spec).loss(LossInputs(l, old, old, mask, A, completion_budget=10))
    ref, _ = make_objective("dr_grpo", l_norm=10).loss(LossInputs(l, old, old, mask, A))  # the same rows
    assert torch.equal(loss, ref)
    assert torch.equal(grad_of(loss, l), grad_of(ref, l))


def test_aggregators():
    term = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert masked_token_mean(term, mask).item() == pytest.approx(10 / 4)
    assert sequence_mean_token_mean(term, mask).item() == pytest.approx((2 + 4) / 2)
    assert constant_normalizer(term, mask, 5.0).item() == pytest.approx(10 / (2 * 5))


def test_make_objective_errors_name_the_valid_choices():
    with pytest.raises(ValueError) as e:
        make_objective("ppo")
    assert all(name in str(e.value) for name in OBJECTIVES)
    with pytest.raises(ValueError, match=r"epsilon.*valid knobs.*eps"):
        make_objective("grpo", epsilon=0.1)
    with pytest.raises(ValueError, match=r"'C'.*valid knobs"):
        make_objective("tis(dapo)", inner={"C": 3.0})  # C belongs to tis, not dapo
    with pytest.raises(ValueError, match="wrapper"):
        make_objective("tis")
    with pytest.raises(ValueError, match="not a wrapper"):
        make_objective("grpo(dapo)")
    with pytest.raises(Exception, match="Extra inputs"):
        MinPro(eps=0.1)  # direct construction: pydantic forbids unknown knobs too


def test_make_objective_knobs_and_nesting():
    obj = make_objective("tis(mc(dapo))", C=3.0, inner={"inner": {"eps_high": 0.5}})
    assert obj.spec == "tis(mc(dapo))" and obj.C == 3.0 and obj.inner.inner.eps_high == 0.5
    assert obj.advantage == "median" and obj.extra_samples == 1
    assert make_objective("tis(dr_grpo)").advantage == "mean"


def _registry_specs() -> list[str]:
    return [f"{name}(grpo)" if cls.wrapper else name for name, cls in OBJECTIVES.items()] + [
        "tis(dapo)", "mc(gspo)", "tis(gspo)", "mc(minpro)", "mc(ftis)", "tis(mc(dr_grpo))"]


def test_the_torch_free_knob_table_is_the_menu():
    """policy/loss_knobs.py (what config validation reads, without torch) and the menu agree: the
    same names, each objective a subclass of its knob class with the same knobs and defaults, the
    same traits and the same refusals."""
    assert list(OBJECTIVE_KNOBS) == list(OBJECTIVES)
    for name, cls in OBJECTIVES.items():
        knobs = OBJECTIVE_KNOBS[name]
        assert issubclass(cls, knobs) and issubclass(cls, Objective)
        defaults = {k: f.default for k, f in cls.model_fields.items()}
        assert defaults == {k: f.default for k, f in knobs.model_fields.items()}
    for spec in [*_registry_specs(), "tis(tis(grpo))", "tis(minpro)", "mc(dapo(grpo))", "nope"]:
        try:
            built = make_objective(spec)
        except ValueError as err:
            with pytest.raises(ValueError) as checked:
                check_objective(spec)
            assert str(checked.value) == str(err)
            continue
        checked = check_objective(spec)
        assert (checked.spec, checked.advantage, checked.extra_samples, checked.uses_behavior_ratio) == (
            built.spec, built.advantage, built.extra_samples, built.uses_behavior_ratio)


@pytest.mark.parametrize("spec", _registry_specs())
def test_every_objective_finite_loss_and_gradient_with_junk_padding(spec):
    g = torch.Generator().manual_seed(8)
    l0 = -3 * torch.rand(3, 6, generator=g)
    old = l0 + 0.3 * torch.randn(3, 6, generator=g)
    b = l0 + 1.0 * torch.randn(3, 6, generator=g)
    pad = MASK == 0
    l0[pad], old[pad], b[pad] = float("-inf"), float("nan"), 80.0  # junk where m = 0
    l = l0.requires_grad_(True)
    obj = make_objective(spec)
    assert isinstance(obj, Objective)
    loss, stats = obj.loss(LossInputs(l, old, b, MASK, torch.tensor([1.0, -0.5, 2.0]), completion_budget=6))
    grad = grad_of(loss, l)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert torch.equal(grad[pad], torch.zeros_like(grad[pad]))
    assert grad[~pad].abs().sum() > 0 or "gspo" in spec  # gspo may clip every sequence
    assert all(math.isfinite(v) for v in stats.values()) and "loss" in stats and "clip_frac" in stats


# ------------------------------------------------------------------------------------------
# Overflow-safe log-ratios
# ------------------------------------------------------------------------------------------

def test_masked_log_ratio_straight_through_clamp():
    num = torch.tensor([[100.0, -100.0, 3.0, 1e10, 50.0]], requires_grad=True)
    den = torch.zeros(1, 5)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    out = masked_log_ratio(num, den, mask)
    assert out.detach().tolist() == [[MAX_LOG_RATIO, -MAX_LOG_RATIO, 3.0, MAX_LOG_RATIO, 0.0]]  # exact, even at 1e10
    (g,) = torch.autograd.grad((out * torch.arange(1.0, 6.0)).sum(), num)
    assert g.tolist() == [[1.0, 2.0, 3.0, 4.0, 0.0]]  # gradient passed through, 0 off-mask


OVERFLOW_SPECS = _registry_specs() + ["tis(grpo)+sequence", "tis(grpo)+mask", "tis(dapo)+sequence"]


@pytest.mark.parametrize("spec", OVERFLOW_SPECS)
def test_every_objective_finite_at_log_ratio_100(spec):
    """l - l_old = +-100 and l - b = +-100 on trainable tokens: float32 exp(100) is inf, so without
    the clamp ratios, weights and gradients overflow."""
    spec, _, level = spec.partition("+")
    knobs = {"level": level} if level == "sequence" else {"mode": level} if level else {}
    l = random_logp(11)
    sign = torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0, 1.0], [-1.0, 1.0, 1.0, -1.0, 0.0, 0.0], [0.0, 1.0, -1.0, 0.0, 0.0, 0.0]])
    old = l.detach() - 100.0 * sign  # [3, 6]  l - l_old = +-100
    b = l.detach() + 100.0 * sign.roll(1, dims=-1)  # [3, 6]  l - b = -+100 on a shifted pattern
    A = torch.tensor([1.0, -0.5, 2.0])
    loss, stats = make_objective(spec, **knobs).loss(LossInputs(l, old, b, MASK, A, completion_budget=6))
    grad = grad_of(loss, l)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in stats.values())


def test_long_prefix_and_sequence_sums_do_not_overflow():
    """Each log-ratio is within the clamp but their sum passes 88: Prefix and sequence-level TIS cap
    the summed log before exp; the weights are truncated at C as before."""
    l = torch.zeros(1, 10)
    x = LossInputs(l, l, l - 15.0, torch.ones(1, 10), torch.ones(1))  # l - b = l_old - b = 15; sums reach 150
    assert torch.equal(Prefix(C=2.0).weights(x), torch.full((1, 10), 2.0))
    tis = Tis(inner=make_objective("grpo"), level="sequence")
    assert torch.equal(tis.mismatch_ratio(x), torch.exp(torch.full((1, 10), MAX_LOG_RATIO)))  # finite
    assert torch.equal(tis.weights(x), torch.full((1, 10), 2.0))
    assert torch.equal(Tis(inner=make_objective("grpo"), level="sequence", mode="mask").weights(x), torch.zeros(1, 10))


# ------------------------------------------------------------------------------------------
# tis refuses objectives that already weight by the behavior ratio
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["tis(minpro)", "tis(cispo)", "tis(prefix)", "tis(ftis)", "tis(mc(minpro))", "tis(tis(grpo))"])
def test_tis_refuses_behavior_ratio_objectives(spec):
    with pytest.raises(ValueError, match=r"twice.*grpo, dr_grpo, dapo, gspo"):
        make_objective(spec)


def test_tis_refuses_direct_construction_too():
    with pytest.raises(ValueError, match="twice"):
        Tis(inner=MinPro())


def test_uses_behavior_ratio_flags_and_propagation():
    flagged = {name for name, cls in OBJECTIVES.items() if not cls.wrapper and cls.uses_behavior_ratio}
    assert flagged == {"cispo", "minpro", "prefix", "ftis"}
    assert make_objective("mc(minpro)").uses_behavior_ratio and not make_objective("mc(grpo)").uses_behavior_ratio
    assert make_objective("tis(mc(grpo))").uses_behavior_ratio  # tis's own weight is a behavior ratio


# ------------------------------------------------------------------------------------------
# Row filter hook
# ------------------------------------------------------------------------------------------

def test_apply_row_keep_without_filter_is_identity():
    l = random_logp(12)
    x = LossInputs(l, l.detach(), l.detach(), MASK, torch.tensor([1.0, -1.0, 0.5]))
    for spec in ("grpo", "tis(dapo)", "mc(cispo)"):
        obj = make_objective(spec)
        assert obj.row_keep(x) is None
        kept, frac = apply_row_keep(obj, x)
        assert kept is x and frac == 0.0
        assert "filtered_frac" not in obj.loss(x)[1]


# ------------------------------------------------------------------------------------------
# F-TIS
# ------------------------------------------------------------------------------------------

def test_ftis_truncates_behavior_ratio_three_to_two():
    """Check 6 style: rho = [3, 1.5, 1] with C = 2 gives weights [2, 1.5, 1] and gradient
    w A grad(l) (the loss, a token mean, has -w A / N)."""
    l = torch.zeros(1, 3, requires_grad=True)
    b = l.detach() - torch.log(torch.tensor([[3.0, 1.5, 1.0]]))  # rho = exp(l - b) = [3, 1.5, 1]
    A = torch.tensor([0.7])
    x = LossInputs(l, l.detach(), b, torch.ones(1, 3), A)
    assert torch.allclose(FTis(C=2.0).weights(x), torch.tensor([[2.0, 1.5, 1.0]]))
    loss, stats = FTis(C=2.0).loss(x)
    assert torch.allclose(grad_of(loss, l), -0.7 * torch.tensor([[2.0, 1.5, 1.0]]) / 3)
    assert loss.item() == pytest.approx(-0.7 * 4.5 / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3) and stats["ratio_max"] == pytest.approx(3.0)
    assert stats["weight_mean"] == pytest.approx(1.5) and stats["filtered_frac"] == 0.0


def test_ftis_kl_filter_drops_only_far_negative_rows():
    """Row 0: A < 0, k = 0.9016 > kl_max = 0.5 -> dropped. Row 1: same log rho but A > 0 -> kept.
    Row 2: A < 0, k = 0.0120 -> kept. The dropped row gets no gradient and leaves the denominator."""
    lam = torch.tensor([[1.5, -1.5, 0.0, 0.0], [1.5, -1.5, 0.0, 0.0], [0.1, -0.2, 0.0, 0.0]])  # log rho
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    A = torch.tensor([-1.0, 2.0, -0.5])
    l = torch.zeros(3, 4, requires_grad=True)
    b = l.detach() - lam
    b[mask == 0] = 80.0  # junk
    x = LossInputs(l, l.detach(), b, mask, A)
    e = math.exp
    k_far = ((e(1.5) - 1 - 1.5) + (e(-1.5) - 1 + 1.5) + 0.0) / 3  # 0.90161
    k_near = ((e(0.1) - 1 - 0.1) + (e(-0.2) - 1 + 0.2)) / 2  # 0.01195
    obj = FTis()  # C = 2, kl_max = 0.5
    assert torch.allclose(obj.sequence_kl(x), torch.tensor([k_far, k_far, k_near]), atol=1e-6)
    assert obj.row_keep(x).tolist() == [False, True, True]
    assert make_objective("mc(ftis)").row_keep(x).tolist() == [False, True, True]  # wrappers delegate
    loss, stats = obj.loss(x)
    w1 = [min(e(1.5), 2.0), e(-1.5), 1.0]  # row 1 weights (truncated at C)
    w2 = [e(0.1), e(-0.2)]  # row 2 weights
    expected = -(2.0 * sum(w1) - 0.5 * sum(w2)) / 5  # token mean over the 3 + 2 kept tokens
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    g = grad_of(loss, l)
    assert torch.equal(g[0], torch.zeros(4))
    assert torch.allclose(g[1, :3], -2.0 * torch.tensor(w1) / 5) and torch.allclose(g[2, :2], 0.5 * torch.tensor(w2) / 5)
    assert stats["filtered_frac"] == pytest.approx(1 / 3)
    assert stats["kl_mean"] == pytest.approx((k_far + k_near) / 2, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(1 / 5)  # only row 1's rho = e^1.5 > 2, among kept tokens
    # the learner may pre-filter with apply_row_keep: same loss, and nothing left to drop
    kept, frac = apply_row_keep(obj, x)
    assert float(frac) == pytest.approx(1 / 3) and kept.mask[0].sum() == 0 and torch.equal(kept.mask[1:], mask[1:])
    again, stats_again = obj.loss(kept)
    assert torch.equal(again, loss) and stats_again["filtered_frac"] == 0.0
    # a looser threshold keeps row 0: the denominator is back to 8 tokens
    loose, _ = FTis(kl_max=1.0).loss(x)
    assert loose.item() == pytest.approx(-(-1.0 * sum(w1) + 2.0 * sum(w1) - 0.5 * sum(w2)) / 8, rel=1e-6)


def test_ftis_knobs_validated():
    with pytest.raises(ValueError):
        make_objective("ftis", kl_max=0.0)
    with pytest.raises(ValueError, match="unknown knob"):
        make_objective("ftis", eps_high=0.2)
