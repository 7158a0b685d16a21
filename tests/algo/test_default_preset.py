"""The default preset is decoupled PPO (docs/decisions/default-preset.md; Hilton et al. 2021,
arXiv:2110.00641): VACO's surrogate with the band of 0.2 on π_θ/π_T as its only constraint."""

from __future__ import annotations

import torch

from asyncrl.core import config
from asyncrl.core.config import REALIGNING, TV_FILTERED, VTRACE_PRESETS
from asyncrl.core.iteration import policy_loss


def test_the_default_is_decoupled_ppo_neither_filtered_nor_realigned():
    cfg = config.load(None).algo
    assert cfg.preset == "decoupled_ppo"
    assert cfg.preset not in TV_FILTERED and cfg.preset not in REALIGNING and cfg.preset not in VTRACE_PRESETS


def test_the_default_loss_is_decoupled_ppos_clip_weighted_by_truncated_pi_T_over_beta():
    """Far past any TV budget (ratios up to e^±1) the default removes exactly the gradients of PPO-clip's
    mask on π_θ/π_T, and weights every sample by min(1, π_T/β)."""
    cfg = config.load(None).algo
    g = torch.Generator().manual_seed(0)
    n = 512
    behavior = torch.randn(n, generator=g) * 0.5
    target = behavior + torch.randn(n, generator=g) * 0.3  # backward lag: π_T != β
    log_prob = (target + torch.randn(n, generator=g) * 0.5).requires_grad_(True)  # forward lag, large
    adv = torch.randn(n, generator=g)
    pl = policy_loss(cfg, log_prob=log_prob, behavior_log_prob=behavior, target_log_prob=target, adv=adv)
    pl.loss.backward()

    lp = log_prob.detach().clone().requires_grad_(True)
    weight = torch.exp(target - behavior).clamp(max=1.0)
    ratio = torch.exp(lp - target)
    out = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    assert 0.2 < out.float().mean() < 0.8  # the band binds on a good share of samples
    expect = -(weight * torch.where(out, ratio.detach(), ratio) * adv).mean()
    expect.backward()
    assert torch.allclose(pl.loss, expect, rtol=1e-5)
    assert torch.allclose(log_prob.grad, lp.grad, atol=1e-7)
    assert (log_prob.grad[out] == 0).all() and (log_prob.grad[~out] != 0).all()
    assert abs(float(pl.no_grad_fraction) - out.float().mean().item()) < 1e-6
