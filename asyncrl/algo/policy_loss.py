"""What every policy loss over a flat minibatch [N] (N = samples drawn from a [T, B] batch) shares: the
clamped log-ratio, and the :class:`PolicyLoss` result with its diagnostics.

Every policy loss takes ``log_prob`` = log π_θ(a_i|s_i) (carries the gradient) and the stored
``behavior_log_prob`` = log β(a_i|s_i). Behaviour/anchor log-probs and advantages are constants
of the update: they are detached here, so a caller cannot leak gradient into them by accident.
The importance ratio is r_i = exp(clamp(log π_θ - log β, -20, 20)) (the clamp keeps exp finite;
outside it the ratio carries no gradient).

Each policy loss returns a :class:`PolicyLoss`: the scalar loss plus detached 0-dim diagnostics,
so logging needs no extra forward pass (call ``.item()`` when logging).

One definition of "share of samples without gradient", the same for every loss:
``no_grad_fraction`` is the fraction of the N samples whose policy-gradient term the loss's own rule
sets to exactly zero: PPO-clip's mask (A_i (r_i - 1) > 0 and |r_i - 1| > ε), VACO's per-sample band
(the same mask on the ratio it bounds) and TV filter. A sample counts once whatever removed it.
Losses without such a rule (ratio, KL penalty, SPO, IMPALA) report 0: a penalty or a truncated
weight shrinks a gradient but never removes it. Not counted: samples with A_i = 0 (no gradient
whatever the rule) and the |log r| > 20 clamp (a numerical guard, not a rule).
PPO's usual "clip fraction" (|r_i - 1| > ε in either direction, half of which still carry gradient)
is kept for PPO only, as ``clip_fraction_two_sided``.

The losses: :mod:`asyncrl.algo.vaco_loss` (VACO's TV filter and loss, arXiv:2603.01365, and its ablation
without the filter), :mod:`asyncrl.algo.ppo_losses` (PPO clip and KL penalty, SPO, IMPALA);
the critic's loss: :mod:`asyncrl.algo.value_loss`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp: e^20 ~ 4.9e8, far beyond any useful ratio


class PolicyLoss(NamedTuple):
    """Output of every policy loss.

    loss: 0-dim, the value to minimise (carries the gradient w.r.t. log_prob).
    tv_estimate: 0-dim detached, the estimate of TV(π_θ, anchor): 0.5 mean |r - 1| against β (every
        loss but VACO's); VACO's against its anchor, importance-weighted by π_T/β when the anchor is
        π_T (:func:`asyncrl.algo.vaco_loss.tv_estimate`).
    no_grad_fraction: 0-dim detached, fraction of samples whose gradient the loss's rule removed
        (PPO clip mask, VACO band and TV filter; 0 for losses without one: see the module docstring).
    approx_kl: 0-dim detached, mean((r - 1) - log r) with r = π_θ/β: the k3 estimator of
        KL(β ‖ π_θ) (nats).
    filter_fired: 0-dim bool (VACO only), the TV filter's sign rule was applied; None otherwise.
    keep_mask: [N] bool (losses with a rule: PPO clip, VACO), False for the samples counted in
        no_grad_fraction; None otherwise (every sample keeps its gradient).
    clip_fraction_two_sided: 0-dim detached (PPO clip only), fraction with |r - 1| > clip_eps in
        either direction; None for the other losses.
    budget_fraction: 0-dim detached (VACO with a TV budget only), fraction of samples whose gradient
        the TV budget removed and the fixed band alone would have kept; None otherwise.
    """

    loss: Tensor
    tv_estimate: Tensor
    no_grad_fraction: Tensor
    approx_kl: Tensor
    filter_fired: Tensor | None = None
    keep_mask: Tensor | None = None
    clip_fraction_two_sided: Tensor | None = None
    budget_fraction: Tensor | None = None


def _log_ratio(log_prob: Tensor, reference: Tensor) -> Tensor:
    return torch.clamp(log_prob - reference.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _result(
    loss: Tensor,
    log_ratio: Tensor,
    *,
    tv: Tensor | None = None,
    keep: Tensor | None = None,
    fired: Tensor | None = None,
    budget: Tensor | None = None,
) -> PolicyLoss:
    """The PolicyLoss of ``loss``; ``keep`` [N] bool (None: every sample keeps its gradient) gives
    no_grad_fraction, the one definition every loss reports."""
    with torch.no_grad():
        lr = log_ratio.detach()
        ratio = torch.exp(lr)
        return PolicyLoss(
            loss=loss,
            tv_estimate=(0.5 * (ratio - 1.0).abs().mean() if tv is None else tv.detach()),
            no_grad_fraction=(
                torch.zeros((), dtype=lr.dtype, device=lr.device) if keep is None else 1.0 - keep.to(lr.dtype).mean()
            ),
            approx_kl=((ratio - 1.0) - lr).mean(),
            filter_fired=fired,
            keep_mask=keep,
            budget_fraction=budget,
        )
