"""VACO's design options: the truncated importance weight of the learning anchor, the
sign rule only beyond a minimum deviation, and the iteration-level (hysteresis) trigger."""

import math

import pytest
import torch

from asyncrl.algo.ppo_losses import ppo_clip_loss
from asyncrl.algo.vaco_loss import tv_filter, vaco_policy_loss
from asyncrl.core import config
from asyncrl.tasks.control.update import _surrogate_steps

F64 = torch.float64


def _data(n=512, seed=0, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    beh = -torch.rand(n, generator=g, dtype=F64) * 3
    anchor = beh + spread * torch.randn(n, generator=g, dtype=F64)  # π_T: lag away from β
    log_prob = anchor + 0.3 * torch.randn(n, generator=g, dtype=F64)  # π_θ: forward drift
    adv = torch.randn(n, generator=g, dtype=F64)
    return beh, anchor, log_prob, adv


def test_truncated_weight_gradient_by_hand():
    beh, anchor, log_prob, adv = _data()
    lp = log_prob.clone().requires_grad_(True)
    out = vaco_policy_loss(
        log_prob=lp,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
    )
    out.loss.backward()
    w = torch.exp(anchor - beh).clamp(max=1.0)
    want = -(w * torch.exp(log_prob - anchor) * adv) / len(adv)  # d/d log π of w (π_θ/π_T) A
    torch.testing.assert_close(lp.grad, want, rtol=1e-12, atol=1e-14)
    assert (torch.exp(anchor - beh) > 1).any()  # the bound did bind


def test_unbounded_weight_is_the_plain_ratio_and_beta_anchor_ignores_the_bound():
    beh, anchor, log_prob, adv = _data(seed=1)
    grads = []
    for kw in (dict(anchor_log_prob=anchor, surrogate_rho_bar=math.inf), dict(surrogate_rho_bar=1.0), {}):
        lp = log_prob.clone().requires_grad_(True)
        vaco_policy_loss(
            log_prob=lp, behavior_log_prob=beh, advantages=adv, tv_threshold=math.inf, **kw
        ).loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[2], rtol=1e-10, atol=1e-14)  # w (π_θ/π_T) = π_θ/β
    assert torch.equal(grads[1], grads[2])  # β anchor: w = 1


def test_min_deviation_with_zero_delta_is_ppo_clip_gradient():
    beh, _, log_prob, adv = _data(seed=2, spread=0.0)
    g_vaco, g_ppo = log_prob.clone().requires_grad_(True), log_prob.clone().requires_grad_(True)
    vaco_policy_loss(
        log_prob=g_vaco, behavior_log_prob=beh, advantages=adv, tv_threshold=0.0, min_deviation=0.2
    ).loss.backward()
    ppo_clip_loss(log_prob=g_ppo, behavior_log_prob=beh, advantages=adv, clip_eps=0.2).loss.backward()
    assert torch.equal(g_vaco.grad == 0, g_ppo.grad == 0) and (g_ppo.grad == 0).any()
    torch.testing.assert_close(g_vaco.grad, g_ppo.grad, rtol=1e-12, atol=1e-15)


def test_min_deviation_and_force_on_hand_made_samples():
    log_ratio = torch.log(torch.tensor([1.05, 1.5, 0.6, 0.97], dtype=F64))  # |r - 1| = .05 .5 .4 .03
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=F64)  # every A (r - 1) > 0
    tv = 0.5 * (0.05 + 0.5 + 0.4 + 0.03) / 4
    assert tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=0.1).keep_mask.tolist() == [False] * 4
    assert tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=0.1, min_deviation=0.1).keep_mask.tolist() == [
        True,
        False,
        False,
        True,
    ]
    under = tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=tv + 0.01)
    assert under.keep_mask.all() and not under.fired
    forced = tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=tv + 0.01, force=torch.tensor(True))
    assert not forced.keep_mask.any() and forced.fired
    with pytest.raises(ValueError, match="min_deviation"):
        tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=0.1, min_deviation=-1.0)
    with pytest.raises(ValueError, match="surrogate_rho_bar"):
        vaco_policy_loss(
            log_prob=log_ratio, behavior_log_prob=log_ratio, advantages=adv, tv_threshold=0.1, surrogate_rho_bar=0.0
        )


def _fire_sequence(trigger):
    cfg = config.load(
        None,
        [
            "algo.preset=vaco",
            "algo.num_epochs=4",
            "algo.num_minibatches=4",
            "algo.tv_threshold=0.05",
            "algo.lr=0.01",
            f"algo.tv_filter_trigger={trigger}",
            "algo.tv_rule=filter",
            "algo.ratio_anchor=learning",
            "algo.surrogate_rho_bar=1.0",
            "env.id=asyncrl/Corridor-v0",
        ],
    )
    from asyncrl.tasks.control.policy import build_policy

    torch.manual_seed(0)
    policy = build_policy(cfg.policy, 2, 1, discrete=False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.algo.lr)
    n = 256
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n + 1, 1, 2, generator=g)
    actions = torch.randn(n, 1, 1, generator=g)
    with torch.no_grad():
        lp = policy.distribution(policy.normalize(obs[:-1, 0])).log_prob(actions[:, 0]).view(n, 1)
    batch = {"obs": obs, "actions": actions, "behavior_log_prob": lp, "rewards": torch.randn(n, 1, generator=g)}
    adv = torch.randn(n, 1, generator=g)
    with torch.no_grad():
        x = policy.normalize(obs[:-1, 0])
    steps = _surrogate_steps(
        policy,
        opt,
        batch,
        x,
        cfg.algo,
        torch.Generator().manual_seed(2),
        adv,
        adv,
        lp,
        stale=torch.zeros(n, dtype=torch.bool),
    )
    return [s["filter_fire_rate"] for s in steps], steps


def test_iteration_trigger_keeps_filtering_once_over_the_budget():
    seq, steps = _fire_sequence("iteration")
    first = seq.index(1.0)
    assert 0 < first and all(f == 1.0 for f in seq[first:])
    assert all(math.isnan(s["no_grad_fraction_stale"]) and s["no_grad_fraction_fresh"] >= 0 for s in steps)
    per_minibatch, _ = _fire_sequence("minibatch")
    assert per_minibatch[: first + 1] == seq[: first + 1]  # identical until the first firing
    with pytest.raises(config.ConfigError, match="tv_filter_trigger"):
        config.load(None, ["algo.tv_filter_trigger=sometimes"])


def test_ratio_cap_filters_single_outliers_under_the_budget():
    log_ratio = torch.log(torch.tensor([1.05, 1.9, 0.6, 0.97, 2.5], dtype=F64))  # |r - 1| = .05 .9 .4 .03 1.5
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0], dtype=F64)  # the last: A (r - 1) < 0
    out = tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=10.0, ratio_cap=0.5)
    assert not out.fired and out.keep_mask.tolist() == [True, False, True, True, True]
    assert tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=10.0).keep_mask.all()
    with pytest.raises(ValueError, match="ratio_cap"):
        tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=0.1, ratio_cap=0.0)
    with pytest.raises(config.ConfigError, match="tv_filter_ratio_cap"):
        config.load(None, ["algo.tv_filter_ratio_cap=0.1", "algo.tv_filter_min_deviation=0.2"])


def test_behavior_band_without_filter_is_ppo_clip_gradient():
    beh, anchor, log_prob, adv = _data(seed=4)
    g_vaco, g_ppo = log_prob.clone().requires_grad_(True), log_prob.clone().requires_grad_(True)
    vaco_policy_loss(
        log_prob=g_vaco, behavior_log_prob=beh, advantages=adv, tv_threshold=math.inf, behavior_band=0.2
    ).loss.backward()
    ppo_clip_loss(log_prob=g_ppo, behavior_log_prob=beh, advantages=adv, clip_eps=0.2).loss.backward()
    assert (g_ppo.grad == 0).any()
    torch.testing.assert_close(g_vaco.grad, g_ppo.grad, rtol=1e-12, atol=1e-15)
    # with the learning anchor and weight bound, it masks on the full ratio pi_theta/beta
    lp = log_prob.clone().requires_grad_(True)
    out = vaco_policy_loss(
        log_prob=lp,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
        behavior_band=0.2,
    )
    out.loss.backward()
    r = torch.exp(log_prob - beh)
    masked = (adv * (r - 1) > 0) & ((r - 1).abs() > 0.2)
    assert torch.all(lp.grad[masked] == 0) and torch.all(lp.grad[~masked] != 0)
    assert out.no_grad_fraction.item() == pytest.approx(masked.double().mean().item())


def test_backward_band_masks_on_pi_T_over_beta_by_hand():
    beh, anchor, log_prob, adv = _data(seed=5)
    lp = log_prob.clone().requires_grad_(True)
    out = vaco_policy_loss(
        log_prob=lp,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
        behavior_band=0.2,
        band_ratio="backward",
    )
    out.loss.backward()
    rb = torch.exp(anchor - beh)  # backward-lag ratio pi_T/beta, fixed per iteration
    masked = (adv * (rb - 1) > 0) & ((rb - 1).abs() > 0.2)
    w = rb.clamp(max=1.0)
    expected = -(w * torch.exp(log_prob - anchor) * adv) / len(adv)  # d loss / d log_prob of a kept sample
    torch.testing.assert_close(lp.grad[~masked], expected[~masked], rtol=1e-12, atol=1e-15)
    assert masked.any() and torch.all(lp.grad[masked] == 0)
    # it differs from the full-ratio band: the forward part pi_theta/pi_T is not in the mask
    full = vaco_policy_loss(
        log_prob=log_prob,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
        behavior_band=0.2,
    )
    assert not torch.equal(full.keep_mask, out.keep_mask)
    with pytest.raises(ValueError, match="anchor_log_prob"):
        vaco_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=beh,
            advantages=adv,
            tv_threshold=0.2,
            behavior_band=0.2,
            band_ratio="backward",
        )
    with pytest.raises(ValueError, match="band_ratio"):
        vaco_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=beh,
            advantages=adv,
            tv_threshold=0.2,
            anchor_log_prob=anchor,
            band_ratio="sideways",
        )


def test_forward_band_is_decoupled_ppo_clip_by_hand():
    """band_ratio="forward": PPO's clip on pi_theta/pi_T with the weight min(1, pi_T/beta) in front
    (Hilton et al., arXiv:2110.00641), written out with torch.clamp and compared gradient for gradient."""
    beh, anchor, log_prob, adv = _data(seed=6)
    lp, ref = log_prob.clone().requires_grad_(True), log_prob.clone().requires_grad_(True)
    out = vaco_policy_loss(
        log_prob=lp,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
        behavior_band=0.2,
        band_ratio="forward",
    )
    out.loss.backward()
    w = torch.exp(anchor - beh).clamp(max=1.0)
    r = torch.exp(ref - anchor)
    (-(w * torch.minimum(r * adv, torch.clamp(r, 0.8, 1.2) * adv)).mean()).backward()
    torch.testing.assert_close(lp.grad, ref.grad, rtol=1e-12, atol=1e-15)
    rf = torch.exp(log_prob - anchor)
    masked = (adv * (rf - 1) > 0) & ((rf - 1).abs() > 0.2)
    assert masked.any() and torch.all(lp.grad[masked] == 0)
    assert out.no_grad_fraction.item() == pytest.approx(masked.double().mean().item())
    # at iteration start (pi_theta = pi_T) nothing is masked, however stale the sample
    start = vaco_policy_loss(
        log_prob=anchor,
        behavior_log_prob=beh,
        advantages=adv,
        tv_threshold=math.inf,
        anchor_log_prob=anchor,
        surrogate_rho_bar=1.0,
        behavior_band=0.2,
        band_ratio="forward",
    )
    assert start.keep_mask.all()
    # with the β anchor the forward ratio is pi_theta/beta: the full band
    fwd, full = (
        vaco_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=beh,
            advantages=adv,
            tv_threshold=math.inf,
            behavior_band=0.2,
            band_ratio=b,
        )
        for b in ("forward", "full")
    )
    assert torch.equal(fwd.keep_mask, full.keep_mask) and not fwd.keep_mask.all()
    with pytest.raises(config.ConfigError, match="behavior_band_ratio"):
        config.load(None, ["algo.behavior_band_ratio=backward", "algo.ratio_anchor=behavior"])
    with pytest.raises(config.ConfigError, match="behavior_band_ratio"):
        config.load(None, ["algo.behavior_band_ratio=both"])
