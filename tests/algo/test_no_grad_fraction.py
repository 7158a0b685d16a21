"""One definition of "share of samples without gradient": ``no_grad_fraction`` counts the
samples whose policy-gradient term the preset's own rule (PPO's clip, VACO's band and TV filter)
sets to exactly zero, the same way for every preset; PPO's two-sided clip fraction is reported
apart, under its own name."""

import dataclasses
import math

import pytest
import torch

from asyncrl.algo.ppo_losses import impala_policy_loss, ppo_clip_loss
from asyncrl.algo.vaco_loss import vaco_policy_loss
from asyncrl.core import config
from asyncrl.core.iteration import policy_loss

F64 = torch.float64

# Six samples, every case of the clip / band rule at ε = 0.2 (A (r - 1) > 0 is "outward"):
#   0: r = 1.5, A = +1   outward, |r-1| > ε    -> no gradient
#   1: r = 0.5, A = -2   outward, |r-1| > ε    -> no gradient
#   2: r = 1.1, A = +1   outward, inside ε     -> gradient
#   3: r = 0.7, A = +0.8 inward,  |r-1| > ε    -> gradient (PPO's two-sided fraction counts it)
#   4: r = 1.4, A = -0.3 inward,  |r-1| > ε    -> gradient (counted two-sided too)
#   5: r = 0.9, A = -1   outward, inside ε     -> gradient
R = [1.5, 0.5, 1.1, 0.7, 1.4, 0.9]
A = [1.0, -2.0, 1.0, 0.8, -0.3, -1.0]
BEH = [-1.0, -0.5, -2.0, -1.5, -0.7, -1.2]
NO_GRAD = [True, True, False, False, False, False]


def _hand():
    beh = torch.tensor(BEH, dtype=F64)
    log_prob = (beh + torch.log(torch.tensor(R, dtype=F64))).requires_grad_(True)
    return log_prob, beh, torch.tensor(A, dtype=F64)


def test_ppo_and_vaco_band_count_the_same_samples_by_hand():
    lp_ppo, beh, adv = _hand()
    lp_vaco = lp_ppo.detach().clone().requires_grad_(True)
    ppo = ppo_clip_loss(log_prob=lp_ppo, behavior_log_prob=beh, advantages=adv, clip_eps=0.2)
    vaco = vaco_policy_loss(
        log_prob=lp_vaco, behavior_log_prob=beh, advantages=adv, tv_threshold=math.inf, behavior_band=0.2
    )  # band only: the filter is inert
    assert ppo.keep_mask.tolist() == vaco.keep_mask.tolist() == [not x for x in NO_GRAD]
    assert ppo.no_grad_fraction.item() == vaco.no_grad_fraction.item() == pytest.approx(2 / 6)
    assert ppo.clip_fraction_two_sided.item() == pytest.approx(4 / 6)  # samples 0, 1, 3, 4
    assert vaco.clip_fraction_two_sided is None
    ppo.loss.backward()
    vaco.loss.backward()
    assert (lp_ppo.grad == 0).tolist() == (lp_vaco.grad == 0).tolist() == NO_GRAD


def _random_minibatch(n=256, seed=0):
    """A minibatch far enough off-policy (|log r| ~ 0.6) for every rule to act: the TV estimate is
    over δ = 0.2, and many ratios are out of a 0.2 band; A_i != 0 for every sample."""
    g = torch.Generator().manual_seed(seed)
    beh = -torch.rand(n, generator=g, dtype=F64) * 3.0
    target = beh + 0.3 * torch.randn(n, generator=g, dtype=F64)  # π_T: one or two versions ahead of β
    log_prob = target + 0.6 * torch.randn(n, generator=g, dtype=F64)
    adv = torch.randn(n, generator=g, dtype=F64)
    adv = torch.where(adv == 0, torch.ones_like(adv), adv)
    return log_prob, beh, target, adv


def _algo(preset: str):
    if preset == "grpo":  # the llm task's PPO clip on token ratios: the same loss and clip_eps as ppo
        return dataclasses.replace(config.load(None, ["algo.preset=ppo"]).algo, preset="grpo")
    return config.load(None, [f"algo.preset={preset}", "algo.tv_threshold=0.2"]).algo


REMOVES = ("ppo", "grpo", "vaco", "vaco_paper", "vaco_no_realign", "vaco_no_filter")  # a rule that removes gradient
NEVER = ("ppo_kl", "spo")  # a penalty: shrinks, never removes


@pytest.mark.parametrize("preset", REMOVES + NEVER)
def test_a_sample_without_gradient_is_counted_for_each_preset(preset):
    """The samples no_grad_fraction counts are exactly those whose gradient is exactly zero."""
    log_prob, beh, target, adv = _random_minibatch()
    lp = log_prob.clone().requires_grad_(True)
    out = policy_loss(_algo(preset), log_prob=lp, behavior_log_prob=beh, target_log_prob=target, adv=adv)
    out.loss.backward()
    zero = lp.grad == 0
    assert out.no_grad_fraction.item() == pytest.approx(zero.double().mean().item(), abs=1e-12)
    if preset in REMOVES:
        assert zero.any() and torch.equal(~out.keep_mask, zero)
    else:
        assert not zero.any() and out.no_grad_fraction.item() == 0.0 and out.keep_mask is None
    assert (out.clip_fraction_two_sided is not None) == (preset in ("ppo", "grpo"))


def test_impala_never_removes_a_gradient():
    """IMPALA's ρ̄ truncates a weight (a shrink, not a removal): nothing counted, every sample keeps
    a gradient, even those whose ratio is far over ρ̄."""
    log_prob, beh, _, adv = _random_minibatch(seed=1)
    lp = log_prob.clone().requires_grad_(True)
    out = impala_policy_loss(log_prob=lp, behavior_log_prob=beh, pg_advantages=adv, rho_bar=1.0)
    out.loss.backward()
    assert ((log_prob - beh).exp() > 1.5).any()
    assert out.no_grad_fraction.item() == 0.0 and not (lp.grad == 0).any()


def test_vaco_counts_the_filter_and_band_once():
    """vaco_paper's TV filter and a band together: a sample removed by both is counted once."""
    log_prob, beh, _, adv = _random_minibatch(seed=2)
    lp = log_prob.clone().requires_grad_(True)
    out = vaco_policy_loss(log_prob=lp, behavior_log_prob=beh, advantages=adv, tv_threshold=0.1, behavior_band=0.2)
    band_only = vaco_policy_loss(
        log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=math.inf, behavior_band=0.2
    )
    filter_only = vaco_policy_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=0.1)
    out.loss.backward()
    both = ~band_only.keep_mask & ~filter_only.keep_mask
    assert bool(out.filter_fired) and both.any()
    assert torch.equal(out.keep_mask, band_only.keep_mask & filter_only.keep_mask)
    assert out.no_grad_fraction.item() == pytest.approx((lp.grad == 0).double().mean().item())
