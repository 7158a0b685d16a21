"""The PPO-family policy losses over a flat minibatch [N]: PPO's clipped surrogate and its fixed-coefficient
KL-penalty variant (Schulman et al., arXiv:1707.06347), SPO (Xie et al., arXiv:2401.16025) and IMPALA's
V-trace policy gradient (Espeholt et al., arXiv:1802.01561).

Conventions (ratios, detached constants, :class:`~asyncrl.algo.policy_loss.PolicyLoss`, the one
definition of ``no_grad_fraction``): :mod:`asyncrl.algo.policy_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.algo import checks
from asyncrl.algo.policy_loss import PolicyLoss, _log_ratio, _result


def ppo_clip_loss(*, log_prob: Tensor, behavior_log_prob: Tensor, advantages: Tensor, clip_eps: float) -> PolicyLoss:
    """PPO clipped surrogate, loss = -mean_i min(r_i A_i, clip(r_i, 1-ε, 1+ε) A_i), r = π_θ/β.

    Args:
        log_prob: [N] log π_θ(a_i|s_i) (nats), with gradient.
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        advantages: [N] A_i (reward units).
        clip_eps: ε > 0, finite.

    Returns:
        :class:`PolicyLoss`; keep_mask False and counted in no_grad_fraction where the clipped
        branch is taken, A_i (r_i - 1) > 0 and |r_i - 1| > ε (its gradient is exactly zero);
        clip_fraction_two_sided = fraction of samples with |r_i - 1| > ε.

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; clip_eps <= 0 or not finite.

    Paper: Schulman et al., arXiv:1707.06347.
    """
    checks.samples(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=advantages)
    eps = checks.scalar("clip_eps", clip_eps, low=0.0, low_open=True)
    log_ratio = _log_ratio(log_prob, behavior_log_prob)
    ratio, adv = torch.exp(log_ratio), advantages.detach()
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv).mean()
    with torch.no_grad():
        # bounds included, as torch.clamp passes the gradient at them (ratio - 1 would miss r = 1 + eps)
        outside = (ratio < 1.0 - eps) | (ratio > 1.0 + eps)
        keep = ~outside | (adv * (ratio - 1.0) <= 0)  # the clipped branch is the min only outward
        two_sided = outside.to(ratio.dtype).mean()
    return _result(loss, log_ratio, keep=keep)._replace(clip_fraction_two_sided=two_sided)


def ppo_kl_loss(*, log_prob: Tensor, behavior_log_prob: Tensor, advantages: Tensor, kl_coef: float) -> PolicyLoss:
    """Ratio surrogate with a KL(β ‖ π_θ) penalty (k3 estimator).

        loss = -mean_i r_i A_i + kl_coef * mean_i ((r_i - 1) - log r_i),  r = π_θ/β

    Args:
        log_prob: [N] log π_θ(a_i|s_i) (nats), with gradient.
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        advantages: [N] A_i (reward units).
        kl_coef: penalty coefficient >= 0, finite (reward units per nat).

    Returns:
        :class:`PolicyLoss` (no_grad_fraction = 0).

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; kl_coef < 0 or not finite.

    Paper: Schulman et al., arXiv:1707.06347 (the KL-penalty variant, fixed coefficient).
    """
    checks.samples(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=advantages)
    kl_coef = checks.scalar("kl_coef", kl_coef, low=0.0)
    log_ratio = _log_ratio(log_prob, behavior_log_prob)
    ratio = torch.exp(log_ratio)
    kl = ((ratio - 1.0) - log_ratio).mean()
    loss = -(ratio * advantages.detach()).mean() + kl_coef * kl
    return _result(loss, log_ratio)


def spo_loss(*, log_prob: Tensor, behavior_log_prob: Tensor, advantages: Tensor, spo_eps: float) -> PolicyLoss:
    """Simple Policy Optimization surrogate.

        loss = -mean_i [r_i A_i - |A_i| (r_i - 1)^2 / (2 ε)],  r = π_θ/β

    Args:
        log_prob: [N] log π_θ(a_i|s_i) (nats), with gradient.
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        advantages: [N] A_i (reward units).
        spo_eps: ε > 0, finite.

    Returns:
        :class:`PolicyLoss` (no_grad_fraction = 0).

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; spo_eps <= 0 or not finite.

    Paper: Xie et al., arXiv:2401.16025.
    """
    checks.samples(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=advantages)
    eps = checks.scalar("spo_eps", spo_eps, low=0.0, low_open=True)
    log_ratio = _log_ratio(log_prob, behavior_log_prob)
    ratio, adv = torch.exp(log_ratio), advantages.detach()
    loss = -(ratio * adv - adv.abs() * (ratio - 1.0) ** 2 / (2.0 * eps)).mean()
    return _result(loss, log_ratio)


def impala_policy_loss(
    *, log_prob: Tensor, behavior_log_prob: Tensor, pg_advantages: Tensor, rho_bar: float
) -> PolicyLoss:
    """IMPALA policy gradient, loss = -mean_i rho_i stopgrad(pg_A_i) log π_θ(a_i|s_i).

    rho_i = min(rho_bar, exp(stopgrad(log π_θ) - log β)) (no clamp of the log ratio here:
    an overflow to inf is clipped to rho_bar).

    Args:
        log_prob: [N] log π_θ(a_i|s_i) (nats), with gradient.
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        pg_advantages: [N] RealignedReturns.pg_advantages, flattened (reward units).
        rho_bar: ρ̄ > 0 (inf allowed).

    Returns:
        :class:`PolicyLoss` (no_grad_fraction = 0).

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; rho_bar <= 0 or NaN.

    Paper: Espeholt et al., arXiv:1802.01561.
    """
    checks.samples(log_prob=log_prob, behavior_log_prob=behavior_log_prob, pg_advantages=pg_advantages)
    rho_bar = checks.scalar("rho_bar", rho_bar, low=0.0, low_open=True, allow_inf=True)
    with torch.no_grad():
        rhos = torch.clamp(torch.exp(log_prob - behavior_log_prob), max=rho_bar)
    loss = -(rhos * pg_advantages.detach() * log_prob).mean()
    return _result(loss, _log_ratio(log_prob, behavior_log_prob))
