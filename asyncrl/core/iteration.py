"""One learner iteration's shared pieces, for every task kind: the policy loss of the configured
preset, the optimizer step, the per-step records and their reduction, minibatch advantage
normalisation and the TV filter's split by lag. The control task's iteration
(:mod:`asyncrl.tasks.control.update`) and the llm task's (:mod:`asyncrl.tasks.llm.learn`) both build on them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from asyncrl.algo.policy_loss import PolicyLoss
from asyncrl.algo.ppo_losses import ppo_clip_loss, ppo_kl_loss, spo_loss
from asyncrl.algo.vaco_loss import vaco_policy_loss
from asyncrl.core.config.field_meta import TV_FILTERED, VACO_FAMILY
from asyncrl.core.optim import FlatAdam, GuardedAdam


def policy_loss(cfg, *, log_prob, behavior_log_prob, target_log_prob, adv, force=False, group=None) -> PolicyLoss:
    """The policy loss of preset ``cfg.preset`` (an AlgoConfig) on flat [N] samples: env steps of the
    control task, completion tokens of the llm task (asyncrl.tasks.llm.learn); one dispatch for both.
    ``group``: a :class:`asyncrl.core.learner_group.LearnerGroup` whose members hold equal minibatches;
    the TV filter then compares the estimate over their union with δ. ``target_log_prob`` [N]: the
    anchor's log-probs where the preset has one (ratio_anchor learning: log π_T; previous: the per-sample
    anchor of :func:`asyncrl.algo.vaco_loss.previous_anchor_log_prob`); ignored for the β anchor."""
    p = cfg.preset
    if p in TV_FILTERED:
        anchor = None if cfg.ratio_anchor == "behavior" else target_log_prob
        filter_rule = cfg.tv_rule == "filter"  # the filter's own options (no meaning for "shrink")
        return vaco_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=behavior_log_prob,
            advantages=adv,
            tv_threshold=cfg.tv_threshold,
            anchor_log_prob=anchor,
            surrogate_rho_bar=cfg.surrogate_rho_bar,
            min_deviation=cfg.tv_filter_min_deviation if filter_rule else 0.0,
            force=force if filter_rule else False,
            ratio_cap=cfg.tv_filter_ratio_cap if filter_rule else math.inf,
            behavior_band=cfg.behavior_band,
            band_ratio=cfg.behavior_band_ratio,
            tv_rule=cfg.tv_rule,
            tv_reduce=None if group is None else group.mean,
        )
    if p in VACO_FAMILY:  # vaco's surrogate (anchor, weight bound, band) without the TV filter
        anchor = None if cfg.ratio_anchor == "behavior" else target_log_prob
        return vaco_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=behavior_log_prob,
            advantages=adv,
            tv_threshold=math.inf,
            anchor_log_prob=anchor,
            surrogate_rho_bar=cfg.surrogate_rho_bar,
            behavior_band=cfg.behavior_band,
            band_ratio=cfg.behavior_band_ratio,
        )
    if p in ("ppo", "grpo"):  # grpo: PPO-clip on token ratios (its advantages are the group-normalised ones)
        return ppo_clip_loss(
            log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=adv, clip_eps=cfg.clip_eps
        )
    if p == "ppo_kl":
        return ppo_kl_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=adv, kl_coef=cfg.kl_coef)
    if p == "spo":
        return spo_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=adv, spo_eps=cfg.spo_eps)
    raise ValueError(f"unknown preset {p!r}")


def optimizer_step(
    optimizer, loss, max_grad_norm, *, backward: Callable[[], None] | None = None, group=None
) -> torch.Tensor:
    """Backward, clip the global norm of the optimizer's parameters' gradient at ``max_grad_norm``,
    step: returns the norm before clipping (0-dim tensor). A :class:`asyncrl.core.optim.GuardedAdam` is
    given that norm and skips the step when it is not finite. ``backward``: called instead of
    ``loss.backward()`` to fill the gradients (gradient accumulation over micro-batches). ``group``: a
    :class:`asyncrl.core.learner_group.LearnerGroup`; the gradients are averaged over its members
    before the clip, so every member clips and steps on the same gradient."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    flat = isinstance(optimizer, FlatAdam)
    if flat:  # the gradients are views of one buffer: zeroed, averaged and clipped whole
        optimizer.zero_grad()
    else:
        for p in params:  # optimizer.zero_grad(set_to_none=True), without its per-call profiling hooks
            p.grad = None
    if backward is None:
        loss.backward()
    else:
        backward()
    if group is not None:
        group.average_gradients(params, flat=optimizer.flat_grad if flat else None)
    if flat:
        grad_norm = optimizer.clip_grad_norm_(max_grad_norm)
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if flat:
        optimizer.update(grad_norm)
    elif isinstance(optimizer, GuardedAdam):
        optimizer.step(grad_norm=grad_norm)
    else:
        optimizer.step()
    return grad_norm.detach()


def step_record(step: int, pl: PolicyLoss, grad_norm: torch.Tensor, **extra) -> dict[str, Any]:
    """One optimizer step's diagnostics, kept as 0-dim tensors (no device sync per step); the
    iteration converts them all at once (:func:`scalar_steps`)."""
    record = {
        "step": step,
        "policy_loss": pl.loss.detach(),
        "approx_kl": pl.approx_kl,
        "tv_estimate": pl.tv_estimate,
        "no_grad_fraction": pl.no_grad_fraction,
        "grad_norm": grad_norm,
    }
    if pl.clip_fraction_two_sided is not None:  # PPO clip only (ppo, grpo)
        record["clip_fraction_two_sided"] = pl.clip_fraction_two_sided
    if pl.budget_fraction is not None:  # VACO's TV budget: what it removed beyond the fixed band
        record["tv_budget_fraction"] = pl.budget_fraction
    return {**record, **extra}


def scalar_steps(steps: list[dict]) -> list[dict]:
    """The step records with every 0-dim tensor as a Python float, one stack and transfer per key."""
    if not steps:
        return steps
    columns = {}
    for k in steps[0]:
        vals = [s[k] for s in steps]
        if all(isinstance(v, torch.Tensor) for v in vals):
            columns[k] = torch.stack([v.float() for v in vals]).cpu().tolist()
        else:
            columns[k] = vals if k == "step" else [float(v) for v in vals]
    return [{k: columns[k][i] for k in columns} for i in range(len(steps))]


def group_steps(steps: list[dict], group) -> list[dict]:
    """The step records (:func:`scalar_steps`' floats, each a mean over a member's minibatch) averaged
    over a learner group's members in one all-reduce: over equal minibatches, the means over their
    union. ``steps`` unchanged without a group."""
    if group is None or not steps:
        return steps
    keys = [k for k in steps[0] if k != "step"]
    table = torch.tensor([[s[k] for k in keys] for s in steps], dtype=torch.float64)
    rows = group.mean(table).tolist()
    return [{"step": s["step"], **dict(zip(keys, row))} for s, row in zip(steps, rows)]


def step_means(steps: list[dict]) -> dict[str, float]:
    """Mean over an iteration's optimizer steps of each scalar they report (NaN steps ignored; NaN
    when every step is NaN), ``step`` left out."""
    return {
        k: float(np.nanmean([s[k] for s in steps])) if any(s[k] == s[k] for s in steps) else float("nan")
        for k in steps[0]
        if k != "step"
    }


def minibatch_rows(steps: list[dict]) -> list[list[float]]:
    """Per optimizer step [step, tv_estimate, no_grad_fraction] (forward lag;
    asyncrl.core.metrics.MINIBATCH_COLUMNS)."""
    return [[s["step"], s["tv_estimate"], s["no_grad_fraction"]] for s in steps]


def normalize_advantages(a: torch.Tensor, on: bool, group=None) -> torch.Tensor:
    """Minibatch advantage normalisation (PPO's): (a - mean) / (std + 1e-8) when ``on`` and a has
    more than one element; otherwise ``a`` unchanged. ``group``: a learner group whose members hold
    equal minibatches; the mean and the (unbiased) standard deviation are then their union's."""
    if group is None:
        return (a - a.mean()) / (a.std() + 1e-8) if on and a.numel() > 1 else a
    n = a.numel() * group.world
    if not on or n < 2:
        return a
    mean = group.sum(a.sum()) / n
    std = torch.sqrt(group.sum(((a - mean) ** 2).sum()) / (n - 1))
    return (a - mean) / (std + 1e-8)


def filter_split(
    fired: torch.Tensor | None, keep: torch.Tensor, stale: torch.Tensor | None, group=None
) -> dict[str, torch.Tensor]:
    """How often VACO's TV filter fired (0 or 1), and the share of stale and of fresh samples left
    without gradient (no_grad_fraction split by lag; NaN where a minibatch has none), per minibatch.

    Args:
        fired: [...] bool, whether the filter fired (PolicyLoss.filter_fired), or None (no TV filter:
            PPO's clip).
        keep: [..., M] bool, the samples that kept their gradient (PolicyLoss.keep_mask).
        stale: [..., M] bool (behaviour version older than the learner's), or None.
        group: a learner group: the shares are then over the union of its members' minibatches,
            and the filter fired where it fired on any member's share.

    Returns:
        float32 tensors of shape [...]: filter_fire_rate (with ``fired``), and with ``stale``
        no_grad_fraction_stale and no_grad_fraction_fresh.
    """
    out = {}
    if fired is not None:
        out["filter_fire_rate"] = fired.to(torch.float32) if group is None else group.max(fired.to(torch.float32))
    if stale is None:
        return out
    removed = ~keep
    counts = [(removed & stale).sum(-1), (removed & ~stale).sum(-1), stale.sum(-1)]
    counts = [c.to(torch.float32) for c in (counts if group is None else group.sum(torch.stack(counts)).unbind(0))]
    m = stale.shape[-1] * (1 if group is None else group.world)
    out["no_grad_fraction_stale"] = counts[0] / counts[2]
    out["no_grad_fraction_fresh"] = counts[1] / (m - counts[2])
    return out
