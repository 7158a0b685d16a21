"""VACO's policy loss over a flat minibatch [N] (arXiv:2603.01365): the total-variation estimate, the
TV filter (the sign rule that removes the gradient of samples pushing π further from the anchor, β or
the learning policy π_T, once the estimated TV passes δ), and the filtered importance-ratio surrogate
with its options (anchor, truncated weight, behaviour band; the default preset decoupled_ppo is this
surrogate with the band on π_θ/π_T and no filter).

Conventions (ratios, detached constants, :class:`~asyncrl.algo.policy_loss.PolicyLoss`, the one
definition of ``no_grad_fraction``): :mod:`asyncrl.algo.policy_loss`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from asyncrl.algo import checks
from asyncrl.algo.policy_loss import LOG_RATIO_CLAMP, PolicyLoss, _log_ratio, _result

BAND_RATIOS = ("full", "backward", "forward")  # the ratio vaco_policy_loss's behavior_band bounds
TV_RULES = ("shrink", "filter")  # how vaco_policy_loss spends the TV budget δ


class TVFilter(NamedTuple):
    """Output of :func:`tv_filter`.

    keep_mask: [N] bool, True for samples whose gradient is kept.
    tv_estimate: 0-dim, 0.5 mean |r - 1| (unitless, in [0, inf), estimates E_s TV in [0, 1]).
    filtered_fraction: 0-dim, fraction of the N samples with keep_mask False.
    fired: 0-dim bool, the sign rule was applied.
    deviation: [N] r - 1 with r = exp(clamp(log_ratio, -20, 20)) (unitless, no gradient).
    """

    keep_mask: Tensor
    tv_estimate: Tensor
    filtered_fraction: Tensor
    fired: Tensor | None = None  # 0-dim bool: the sign rule was applied (over δ, or forced)
    deviation: Tensor | None = None  # [N] r - 1 (no gradient)


def tv_estimate(log_ratio: Tensor, log_weight: Tensor | None = None) -> Tensor:
    """Sample estimate of the total-variation distance between π and its anchor μ, from actions
    drawn by β (μ = β, or μ = π_T, the learning policy at iteration start).

    With w_i = μ(a_i|s_i)/β(a_i|s_i) and r_i = π(a_i|s_i)/μ(a_i|s_i), E_{a~β}[w |r - 1|] =
    Σ_a |π(a) - μ(a)| = 2 TV(π, μ): the importance-weighted mean is unbiased for E_s TV(π, μ) under
    β's states. Unweighted (w = 1) it estimates E_{a~β}|π/μ - 1| / 2, which is TV only when μ = β
    (under backward lag it reads high: the paper's estimate anchored on π_T).

    Args:
        log_ratio: [N] log π(a_i|s_i) - log μ(a_i|s_i) (nats), with a_i ~ β.
        log_weight: [N] log μ(a_i|s_i) - log β(a_i|s_i) (nats), or None for μ = β (w = 1).

    Returns:
        0-dim tensor 0.5 * mean_i w_i |exp(log_ratio_i) - 1| (unitless), both exponents clamped to
        [-20, 20].

    Raises:
        ValueError: log_ratio (or log_weight) is not a non-empty 1-D floating tensor, or they differ
            in shape or dtype.

    Paper: VACO, arXiv:2603.01365 (docs/vaco-paper.md, "Component 2"); the weighting: docs/decisions/tv-budget.md.
    """
    named = {"log_ratio": log_ratio} | ({} if log_weight is None else {"log_weight": log_weight})
    checks.samples(**named)
    return _deviation_tv(log_ratio, log_weight)[1]


def _deviation_tv(log_ratio: Tensor, log_weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(r - 1 [N], 0.5 mean w |r - 1|) with r = exp(clamp(log_ratio)), w = exp(clamp(log_weight)) or 1."""
    deviation = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) - 1.0
    spread = torch.abs(deviation)
    if log_weight is not None:
        spread = spread * torch.exp(torch.clamp(log_weight, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return deviation, 0.5 * torch.mean(spread)


def tv_filter(
    *,
    log_ratio: Tensor,
    advantages: Tensor,
    tv_threshold: float,
    min_deviation: float = 0.0,
    force: bool | Tensor = False,
    ratio_cap: float = math.inf,
    log_weight: Tensor | None = None,
    tv_reduce: Callable[[Tensor], Tensor] | None = None,
) -> TVFilter:
    """VACO's TV filter: which samples keep their gradient in this minibatch.

    If tv_estimate(log_ratio, log_weight) <= tv_threshold (and not ``force``) every sample is kept; otherwise
    sample i is kept iff A_i (r_i - 1) <= 0, i.e. its gradient step would not grow |r_i - 1| (a
    step on sample i moves r_i in the direction of sign(A_i)), or |r_i - 1| <= min_deviation.
    min_deviation = 0 is the paper's rule; a positive one applies the sign rule only to samples
    that already moved that far (with δ = 0 it is PPO-clip's gradient mask at ε = min_deviation).
    ``force`` (bool or 0-dim bool tensor) applies the rule whatever the estimate (hysteresis: the
    caller keeps filtering once a minibatch of the iteration was over δ). ``ratio_cap`` also applies
    the sign rule, whatever the estimate, to single samples with |r_i - 1| > ratio_cap: a per-sample
    bound on top of the minibatch budget (inf: none). Computed without gradient.

    Args:
        log_ratio: [N] log π_θ - log anchor (nats); the anchor is β, or π_T for
            ratio_anchor = "learning".
        advantages: [N] A_i (reward units, possibly normalised).
        tv_threshold: δ >= 0 (inf disables the filter), budget on the minibatch tv_estimate.
        min_deviation: >= 0, finite (unitless, on |r - 1|).
        force: apply the sign rule even at or under δ.
        ratio_cap: > min_deviation (unitless, on |r - 1|), inf allowed.
        log_weight: [N] log anchor - log β (nats) for the importance-weighted estimate
            (:func:`tv_estimate`), or None (the anchor is β).
        tv_reduce: maps this minibatch's 0-dim estimate to the one the rule compares with δ, or None
            (itself). A learner group passes the mean over its members' equal minibatches
            (:meth:`asyncrl.core.learner_group.LearnerGroup.mean`): the estimate of their union.

    Returns:
        :class:`TVFilter` (keep_mask [N] bool, tv_estimate 0-dim, filtered_fraction 0-dim, fired
        0-dim bool).

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; tv_threshold < 0 or NaN;
            min_deviation < 0 or not finite; ratio_cap <= 0 or NaN.

    Paper: VACO, arXiv:2603.01365.
    """
    named = {} if log_weight is None else {"log_weight": log_weight}
    checks.samples(log_ratio=log_ratio, advantages=advantages, **named)
    tv_threshold = checks.scalar("tv_threshold", tv_threshold, low=0.0, allow_inf=True)
    min_deviation = checks.scalar("min_deviation", min_deviation, low=0.0)
    ratio_cap = checks.scalar("ratio_cap", ratio_cap, low=0.0, low_open=True, allow_inf=True)
    with torch.no_grad():
        deviation, tv = _deviation_tv(log_ratio, None if log_weight is None else log_weight.detach())
        if tv_reduce is not None:
            tv = tv_reduce(tv)
        fired = (tv > tv_threshold) | torch.as_tensor(force, device=tv.device)
        # "or" with the 0-dim comparison instead of a Python `if`: stays on device, no host sync.
        inward = advantages * deviation <= 0  # a step on the sample would not grow |r - 1|
        keep = inward | ~fired
        if ratio_cap < math.inf:
            keep = keep & (inward | (deviation.abs() <= ratio_cap))
        if min_deviation > 0:
            keep = keep | (deviation.abs() <= min_deviation)
        filtered_fraction = 1.0 - keep.to(log_ratio.dtype).mean()
    return TVFilter(keep, tv, filtered_fraction, fired, deviation)


def vaco_policy_loss(
    *,
    log_prob: Tensor,
    behavior_log_prob: Tensor,
    advantages: Tensor,
    tv_threshold: float,
    anchor_log_prob: Tensor | None = None,
    surrogate_rho_bar: float = math.inf,
    min_deviation: float = 0.0,
    force: bool | Tensor = False,
    ratio_cap: float = math.inf,
    behavior_band: float = math.inf,
    band_ratio: str = "full",
    tv_rule: str = "filter",
    tv_reduce: Callable[[Tensor], Tensor] | None = None,
) -> PolicyLoss:
    """VACO's filtered ratio surrogate.

        w_i = min(surrogate_rho_bar, anchor_i/β_i)   (w_i = 1 for the β anchor)
        s_i = w_i (π_θ/anchor)_i A_i;  keep from :func:`tv_filter` on the anchor ratio π_θ/anchor
        loss = -mean_i [keep_i s_i + (1 - keep_i) stopgrad(s_i)]

    With the β anchor s_i = (π_θ/β)_i A_i, the paper's surrogate. With the learning anchor π_T and
    surrogate_rho_bar = inf, s_i is still (π_θ/β)_i A_i (the ratio is unbounded per sample); a
    finite surrogate_rho_bar truncates the backward-lag part π_T/β of the ratio, as V-trace's ρ̄
    truncates it in the advantages, and leaves the forward part π_θ/π_T to the TV filter (the
    "decoupled" split of the ratio: Hilton et al. 2021, arXiv:2110.00641).
    Filtered samples still count in the loss value but receive exactly zero gradient.

    Args:
        log_prob: [N] log π_θ(a_i|s_i) (nats), with gradient.
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        advantages: [N] advantages A_i (reward units, possibly normalised): realigned (vaco) or GAE
            (decoupled_ppo, vaco_no_realign).
        tv_threshold: δ >= 0 (inf disables the filter).
        anchor_log_prob: [N] or None. None anchors the TV estimate and filter on β
            (ratio_anchor = "behavior"); pass log π_T(a_i|s_i) for ratio_anchor = "learning".
        surrogate_rho_bar: bound > 0 on the importance weight anchor/β (inf: none); only
            meaningful with an anchor other than β.
        min_deviation, force, ratio_cap: passed to :func:`tv_filter` (filter granularity,
            hysteresis, per-sample bound).
        behavior_band: > 0 (inf: off). Also detach, whatever the TV estimate, samples whose ratio
            (the one ``band_ratio`` names) already left [1 - band, 1 + band] in the direction of
            sign(A_i): PPO-clip's gradient mask, as a per-sample guard next to the minibatch budget.
        band_ratio: which ratio the band bounds: "full" (π_θ/β, PPO-clip's mask) or "backward"
            (the anchor ratio π_T/β, fixed for the iteration: a sample whose behaviour policy is
            already more than ``band`` from π_T in its advantage's direction is left out of the
            iteration, and the forward part π_θ/π_T is left to the TV filter alone; needs
            anchor_log_prob), or "forward" (π_θ/anchor: with the learning anchor PPO-clip's mask
            centred on π_T, the clip of Hilton et al.'s decoupled PPO, arXiv:2110.00641, while
            surrogate_rho_bar bounds the weight π_T/β apart, so lag alone never takes a sample
            out of the band; with the β anchor it is "full").
        tv_rule: how the minibatch's TV budget δ is spent. "filter" (the paper's): while the
            estimate is at most δ every sample keeps its gradient (the band aside); over δ the sign
            rule removes it from every sample moving away from the anchor. "shrink": the band's
            half-width is behavior_band (1 - tv/δ)_+, so samples may move less the more of the budget
            the minibatch has used, and at tv >= δ the band is closed: the sign rule on every
            sample (needs a finite behavior_band; min_deviation, force and ratio_cap are the filter's).
        tv_reduce: passed to :func:`tv_filter` (a learner group's estimate over its union minibatch).

    The TV estimate is :func:`tv_estimate` against the anchor, importance-weighted by anchor/β when
    the anchor is π_T (unbiased under backward lag).

    Returns:
        :class:`PolicyLoss`; tv_estimate is measured against the anchor, approx_kl against β;
        budget_fraction is the share of samples whose gradient the TV budget removed and the fixed
        band alone (behavior_band; none when inf) would have kept, filter_fired whether there was one.

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating; tv_threshold < 0 or NaN;
            surrogate_rho_bar <= 0 or NaN; behavior_band <= 0 or NaN; band_ratio or tv_rule unknown,
            "backward" without an anchor, "shrink" with an infinite band or with a filter option set;
            min_deviation, ratio_cap or tv_reduce refused by :func:`tv_filter`.

    Paper: VACO, arXiv:2603.01365.
    """
    if tv_rule not in TV_RULES:
        raise ValueError(f"tv_rule must be one of {TV_RULES}, got {tv_rule!r}")
    if tv_rule == "shrink" and (
        not behavior_band < math.inf or min_deviation != 0 or ratio_cap < math.inf or force is not False
    ):
        raise ValueError(
            "tv_rule='shrink' narrows the band: it needs a finite behavior_band, and min_deviation, ratio_cap and "
            "force are options of the 'filter' rule"
        )
    if band_ratio not in BAND_RATIOS:
        raise ValueError(f"band_ratio must be one of {BAND_RATIOS}, got {band_ratio!r}")
    if band_ratio == "backward" and anchor_log_prob is None:
        raise ValueError("band_ratio='backward' bounds π_T/β and needs anchor_log_prob (the learning anchor)")
    checks.samples(
        log_prob=log_prob,
        behavior_log_prob=behavior_log_prob,
        advantages=advantages,
        **({} if anchor_log_prob is None else {"anchor_log_prob": anchor_log_prob}),
    )
    bar = checks.scalar("surrogate_rho_bar", surrogate_rho_bar, low=0.0, low_open=True, allow_inf=True)
    anchor = behavior_log_prob if anchor_log_prob is None else anchor_log_prob
    log_ratio = _log_ratio(log_prob, behavior_log_prob)
    if anchor_log_prob is None or math.isinf(bar):
        surrogate = torch.exp(log_ratio) * advantages.detach()
    else:
        with torch.no_grad():
            weight = torch.exp(_log_ratio(anchor, behavior_log_prob)).clamp(max=bar)
        surrogate = weight * torch.exp(_log_ratio(log_prob, anchor)) * advantages.detach()
    filt = tv_filter(
        log_ratio=log_prob.detach() - anchor.detach(),
        advantages=advantages.detach(),
        tv_threshold=tv_threshold,
        min_deviation=min_deviation,
        force=force,
        ratio_cap=ratio_cap,
        log_weight=None if anchor_log_prob is None else anchor.detach() - behavior_log_prob.detach(),
        tv_reduce=tv_reduce,
    )
    band = checks.scalar("behavior_band", behavior_band, low=0.0, low_open=True, allow_inf=True)
    delta = checks.scalar("tv_threshold", tv_threshold, low=0.0, allow_inf=True)
    with torch.no_grad():
        adv = advantages.detach()
        if band < math.inf:
            if band_ratio == "backward":
                deviation = torch.exp(_log_ratio(anchor.detach(), behavior_log_prob)) - 1.0
            elif band_ratio == "full" and anchor_log_prob is not None:
                deviation = torch.exp(_log_ratio(log_prob.detach(), behavior_log_prob)) - 1.0
            else:  # π_θ/anchor ("forward", or "full" with the β anchor): the filter's own r - 1
                deviation = filt.deviation
            inward = adv * deviation <= 0
            # inside [1 - band, 1 + band] compared on the ratio itself, bounds included, as torch.clamp
            # bounds PPO-clip's ratio: the same samples at the float edge (r - 1 would exclude r = 1 + band)
            ratio = deviation + 1.0  # exact for ratios in [0.5, 2], the only ones near the edges
            band_keep = inward | ((ratio >= 1.0 - band) & (ratio <= 1.0 + band))
        else:
            band_keep = torch.ones_like(filt.keep_mask)
        if tv_rule == "shrink":
            tv = filt.tv_estimate
            left = torch.clamp(1.0 - tv / delta, min=0.0) if delta > 0 else (tv <= 0).to(tv.dtype)
            width = band * left  # 0-dim; the band closes at tv >= δ
            keep = inward | (deviation.abs() <= width)
        else:
            keep = filt.keep_mask & band_keep
        budget_removed = band_keep & ~keep
        fired = budget_removed.any()
        budget_fraction = budget_removed.to(log_prob.dtype).mean()
    loss = -torch.where(keep, surrogate, surrogate.detach()).mean()
    return _result(loss, log_ratio, tv=filt.tv_estimate, keep=keep, fired=fired, budget=budget_fraction)


def previous_anchor_log_prob(*, behavior_log_prob: Tensor, previous_log_prob: Tensor, lag: Tensor) -> Tensor:
    """The per-sample anchor of ``ratio_anchor = "previous"``: the newer of β and π_{T-1}.

        log c_i = log β_i          if lag_i <= 1 (β is π_T or π_{T-1})
                  log π_{T-1,i}    otherwise   (β older than π_{T-1})

    With c as :func:`vaco_policy_loss`'s anchor (weight min(1, c/β), band on π_θ/c), a sample of lag
    0 or 1 gets PPO-clip's gradient on π_θ/β exactly (weight 1), and an older one decoupled PPO's
    (Hilton et al. 2021, arXiv:2110.00641) with the proximal policy one version before π_T: the trust
    region PPO's clip gives at lag 1, at any lag. No count of versions is tuned: "one version back"
    is the structure of PPO's own window at lag 1 (docs/decisions/learning-anchor.md).

    Args:
        behavior_log_prob: [N] log β(a_i|s_i) (nats).
        previous_log_prob: [N] log π_{T-1}(a_i|s_i) (nats); where the learner has no π_{T-1} (its first
            iteration, or resumed from a checkpoint without one) the caller passes log π_T.
        lag: [N] integer learner version - behaviour version (versions, >= 0).

    Returns:
        [N] anchor log-probs, no gradient.

    Raises:
        ValueError: shapes differ, a log-prob is not non-empty 1-D floating, or lag is not integer.

    Paper: VACO, arXiv:2603.01365 (its surrogate); decoupled PPO, arXiv:2110.00641.
    """
    checks.samples(behavior_log_prob=behavior_log_prob, previous_log_prob=previous_log_prob)
    if lag.shape != behavior_log_prob.shape or lag.is_floating_point() or lag.is_complex() or lag.dtype == torch.bool:
        raise ValueError(
            f"lag must be an integer tensor of shape {tuple(behavior_log_prob.shape)}, "
            f"got {lag.dtype} {tuple(lag.shape)}"
        )
    return torch.where(lag <= 1, behavior_log_prob, previous_log_prob).detach()
