"""VACO's TV budget (docs/decisions/tv-budget.md): the importance-weighted TV estimate under backward
lag, and the "shrink" rule, whose band narrows as a minibatch spends its budget δ."""

import math

import pytest
import torch

from asyncrl.algo.vaco_loss import tv_estimate, vaco_policy_loss

F64 = torch.float64


def _normal_log_prob(x, mu, sigma=1.0):
    return -0.5 * ((x - mu) / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))


def test_importance_weighted_tv_is_unbiased_under_backward_lag():
    """Actions from β = N(0, 1); the anchor π_T = N(1.2, 1), π_θ = N(1.5, 1): TV(π_θ, π_T) =
    2 Φ(0.15) - 1 = 0.1192. Weighted by π_T/β the estimate finds it; unweighted it reads high
    (it measures E_β|π_θ/π_T - 1| / 2, not a distance between π_θ and π_T)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(400_000, generator=g, dtype=F64)
    beta, anchor, theta = _normal_log_prob(a, 0.0), _normal_log_prob(a, 1.2), _normal_log_prob(a, 1.5)
    true_tv = math.erf(0.15 / math.sqrt(2))  # 2 Φ(d / 2) - 1 with d = 0.3
    weighted = tv_estimate(theta - anchor, anchor - beta).item()
    unweighted = tv_estimate(theta - anchor).item()
    assert weighted == pytest.approx(true_tv, abs=0.004)
    assert unweighted > true_tv + 0.03
    # with the anchor equal to β the weight is 1: the paper's estimate
    assert tv_estimate(theta - beta, beta - beta).item() == tv_estimate(theta - beta).item()


def _minibatch(n=64, spread=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    beh = -torch.rand(n, generator=g, dtype=F64)
    anchor = beh + 0.05 * torch.randn(n, generator=g, dtype=F64)
    log_prob = anchor + spread * torch.randn(n, generator=g, dtype=F64)
    adv = torch.randn(n, generator=g, dtype=F64)
    return log_prob, beh, anchor, adv


def _keep(tv_rule, delta, band=0.2, **data):
    log_prob, beh, anchor, adv = data.get("mb") or _minibatch()
    return vaco_policy_loss(
        log_prob=log_prob,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=delta,
        anchor_log_prob=anchor,
        behavior_band=band,
        band_ratio="forward",
        tv_rule=tv_rule,
    )


def test_shrink_with_budget_unused_is_the_fixed_band_and_over_budget_the_sign_rule():
    log_prob, beh, anchor, adv = mb = _minibatch()
    fixed = _keep("filter", math.inf, mb=mb)
    assert fixed.budget_fraction.item() == 0.0 and not fixed.filter_fired
    # δ far above the estimate: the band barely narrows
    wide = _keep("shrink", 1e9, mb=mb)
    assert torch.equal(wide.keep_mask, fixed.keep_mask)
    # δ at or under the estimate: the band is closed, every sample moving away from π_T loses its gradient
    tv = fixed.tv_estimate.item()
    closed = _keep("shrink", tv, mb=mb)
    deviation = torch.exp(log_prob - anchor) - 1
    assert torch.equal(closed.keep_mask, adv * deviation <= 0)
    assert closed.filter_fired and closed.budget_fraction.item() == pytest.approx(
        (fixed.keep_mask & ~closed.keep_mask).double().mean().item()
    )


def test_shrink_narrows_the_band_in_proportion_to_the_budget_used():
    log_prob, beh, anchor, adv = mb = _minibatch()
    tv = _keep("filter", math.inf, mb=mb).tv_estimate.item()
    delta = 2 * tv  # half the budget used: half-width 0.1
    out = _keep("shrink", delta, mb=mb)
    deviation = torch.exp(log_prob - anchor) - 1
    expected = (adv * deviation <= 0) | (deviation.abs() <= 0.2 * (1 - tv / delta))
    assert torch.equal(out.keep_mask, expected)
    removed = ~out.keep_mask
    assert removed.any() and (deviation[removed].abs() > 0.1 - 1e-12).all()
    # gradient: exactly zero where removed
    lp = log_prob.clone().requires_grad_(True)
    _keep("shrink", delta, mb=(lp, beh, anchor, adv)).loss.backward()
    assert torch.all(lp.grad[removed] == 0) and torch.all(lp.grad[~removed] != 0)


def test_shrink_at_zero_budget_and_bad_arguments():
    mb = _minibatch()
    assert torch.equal(_keep("shrink", 0.0, mb=mb).keep_mask, _keep("shrink", 1e-300, mb=mb).keep_mask)
    log_prob, beh, anchor, adv = mb
    same = _keep("shrink", 0.0, mb=(anchor.clone(), beh, anchor, adv))  # π_θ = π_T: tv 0, nothing used
    assert same.keep_mask.all() and same.budget_fraction.item() == 0.0
    with pytest.raises(ValueError, match="tv_rule must be one of"):
        _keep("sometimes", 0.1, mb=mb)
    with pytest.raises(ValueError, match="finite behavior_band"):
        _keep("shrink", 0.1, band=math.inf, mb=mb)
