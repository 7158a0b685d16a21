"""One learner iteration (VACO.md "Loss and schedule"), shared by every preset.

1. With the weights at iteration start (π_T), compute log π_T(a|s) and V(s) once.
2. Advantages once: V-trace realignment (vaco, vaco_no_filter) or GAE on β's data (ppo, ppo_kl,
   spo, vaco_no_realign). impala instead recomputes V-trace before every optimizer step.
3. num_epochs x num_minibatches optimizer steps on
   policy loss + value_coef * mean (V - targets)^2 - entropy_coef * entropy.

Sources: VACO arXiv:2603.01365; V-trace arXiv:1802.01561; PPO arXiv:1707.06347.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager

import numpy as np
import torch

from .algo import losses
from .algo.returns import gae, next_state_values, vtrace
from .policy import ActorCritic

VTRACE_PRESETS = ("vaco", "vaco_paper", "vaco_no_filter", "impala")


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


@torch.no_grad()
def _evaluate(policy: ActorCritic, batch: dict[str, torch.Tensor], fwd: Callable[[], ContextManager]):
    """log π(a|s) [T, N], V(s_t) [T+1, N], V(final_obs) [T, N] (only where truncated); float32,
    the forwards run in ``fwd()`` (bf16 autocast or none)."""
    obs, actions, truncated = batch["obs"], batch["actions"], batch["truncated"]
    T, N = actions.shape[:2]
    with fwd():
        x = policy.normalize(_flat(obs))
        values = policy.v(x).view(T + 1, N).float()
        log_prob = policy.distribution(x[: T * N]).log_prob(_flat(actions)).view(T, N).float()
    final_values = torch.zeros(T, N, device=values.device)
    if truncated.any():
        idx = truncated.nonzero(as_tuple=True)
        with fwd():
            final_values[idx] = policy.value(batch["final_obs"][idx]).float()
    return log_prob, values, final_values


def _forward(policy: ActorCritic, obs: torch.Tensor, actions: torch.Tensor, fwd: Callable[[], ContextManager]):
    """(policy output, log π(a|s) [N] float32, V(s) [N] float32) of raw obs [N, D], in ``fwd()``."""
    with fwd():
        out = policy(obs)
        log_prob = out.dist.log_prob(actions)
    return out, log_prob.float(), out.values.float()


def advantages(*, preset: str, batch, target_log_prob, values, final_values, gamma, lam, rho_bar, c_bar, traces):
    """(advantages [T, N], value targets [T, N]) for ``preset``; see the module docstring."""
    terminated, truncated = batch["terminated"], batch["truncated"]
    next_values = next_state_values(values_tp1=values[1:], final_values=final_values,
                                    terminated=terminated, truncated=truncated)
    episode_end = terminated | truncated
    if preset in VTRACE_PRESETS:
        r = vtrace(behavior_log_prob=batch["behavior_log_prob"], target_log_prob=target_log_prob,
                   rewards=batch["rewards"], values=values[:-1], next_values=next_values,
                   episode_end=episode_end, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar,
                   traces=traces)
        return (r.pg_advantages if preset == "impala" else r.advantages), r.vs
    g = gae(rewards=batch["rewards"], values=values[:-1], next_values=next_values,
            episode_end=episode_end, gamma=gamma, lam=lam)
    return g.advantages, g.returns


def policy_loss(cfg, *, log_prob, behavior_log_prob, target_log_prob, adv, force=False) -> losses.PolicyLoss:
    """The policy loss of preset ``cfg.preset`` (an AlgoConfig) on flat [N] samples: env steps of the
    control task, completion tokens of the llm task (asyncrl.tasks.llm.learn); one dispatch for both."""
    p = cfg.preset
    if p in ("vaco", "vaco_paper", "vaco_no_realign"):
        anchor = target_log_prob if cfg.ratio_anchor == "learning" else None
        return losses.vaco_policy_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob,
                                       advantages=adv, tv_threshold=cfg.tv_threshold, anchor_log_prob=anchor,
                                       surrogate_rho_bar=cfg.surrogate_rho_bar,
                                       min_deviation=cfg.tv_filter_min_deviation, force=force,
                                       ratio_cap=cfg.tv_filter_ratio_cap, behavior_band=cfg.behavior_band,
                                       band_ratio=cfg.behavior_band_ratio)
    if p == "vaco_no_filter":      # vaco's surrogate (same anchor, weight bound and band) without the TV filter
        anchor = target_log_prob if cfg.ratio_anchor == "learning" else None
        return losses.vaco_policy_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob, advantages=adv,
                                       tv_threshold=math.inf, anchor_log_prob=anchor,
                                       surrogate_rho_bar=cfg.surrogate_rho_bar, behavior_band=cfg.behavior_band,
                                       band_ratio=cfg.behavior_band_ratio)
    if p in ("ppo", "grpo"):       # grpo: PPO-clip on token ratios (its advantages are the group-normalised ones)
        return losses.ppo_clip_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob,
                                    advantages=adv, clip_eps=cfg.clip_eps)
    if p == "ppo_kl":
        return losses.ppo_kl_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob,
                                  advantages=adv, kl_coef=cfg.kl_coef)
    if p == "spo":
        return losses.spo_loss(log_prob=log_prob, behavior_log_prob=behavior_log_prob,
                               advantages=adv, spo_eps=cfg.spo_eps)
    raise ValueError(f"unknown preset {p!r}")


def optimizer_step(policy, optimizer, loss, max_grad_norm) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return float(grad_norm)


def learner_iteration(policy: ActorCritic, optimizer: torch.optim.Optimizer,
                      batch: dict[str, torch.Tensor], *, cfg, generator: torch.Generator,
                      version: int | None = None,
                      forward_context: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, Any]:
    """Run one learner iteration in place on ``policy`` and ``optimizer``.

    Args:
        batch: time-major tensors: obs [T+1, N, D], actions [T, N, A] (or [T, N] int64),
            behavior_log_prob [T, N], rewards [T, N] (already scaled), terminated /
            truncated [T, N] bool, final_obs [T, N, D].
        cfg: an AlgoConfig (preset and hyperparameters). The caller sets the learning rate.
        generator: drives minibatch shuffling (serial runs are bit-reproducible).
        version: the learner's policy version; with it (and behavior_version [T, N] in the batch)
            the filtered fraction is also reported for stale (behaviour version < version) and
            fresh samples apart.
        forward_context: the context of every network forward (asyncrl.device.forward_context: bf16
            autocast or none); log-probs and values are cast to float32 before any ratio or loss.
            The batch and ``policy`` share a device; ``generator`` is a CPU one (the shuffles are
            the same on every device).

    Returns:
        Scalars (policy_loss, value_loss, entropy, approx_kl, tv_estimate, filtered_fraction,
        clip_fraction, explained_variance, rho_mean, rho_max, grad_norm; for VACO also
        filter_fire_rate, the fraction of optimizer steps whose minibatch was filtered, and
        filtered_fraction_stale / _fresh) plus ``minibatches``:
        per optimizer step [step, tv_estimate, filtered_fraction, clip_fraction] (forward lag).
    """
    fwd = forward_context
    target_log_prob, values, final_values = _evaluate(policy, batch, fwd)
    log_rho = target_log_prob - batch["behavior_log_prob"]
    rho = log_rho.clamp(-20, 20).exp()
    kw = dict(batch=batch, values=values, final_values=final_values, gamma=cfg.gamma,
              lam=cfg.gae_lambda, rho_bar=cfg.rho_bar, c_bar=cfg.c_bar, traces=cfg.traces)
    if cfg.preset == "impala":
        steps = _impala_steps(policy, optimizer, batch, cfg, generator, kw, fwd)
        adv, targets = advantages(preset="impala", target_log_prob=target_log_prob, **kw)
    else:
        adv, targets = advantages(preset=cfg.preset, target_log_prob=target_log_prob, **kw)
        stale = None
        if version is not None and "behavior_version" in batch:
            stale = (batch["behavior_version"] < version).reshape(-1)
        steps = _surrogate_steps(policy, optimizer, batch, cfg, generator, adv, targets, target_log_prob, stale, fwd)
    stats = step_means(steps)
    stats["explained_variance"] = losses.explained_variance(values=values[:-1], targets=targets)
    stats["rho_mean"], stats["rho_max"] = float(rho.mean()), float(rho.max())
    stats["minibatches"] = minibatch_rows(steps)
    return stats


def step_means(steps: list[dict]) -> dict[str, float]:
    """Mean over an iteration's optimizer steps of each scalar they report (NaN steps ignored; NaN
    when every step is NaN), ``step`` left out."""
    return {k: float(np.nanmean([s[k] for s in steps])) if any(s[k] == s[k] for s in steps) else float("nan")
            for k in steps[0] if k != "step"}


def minibatch_rows(steps: list[dict]) -> list[list[float]]:
    """Per optimizer step [step, tv_estimate, filtered_fraction, clip_fraction] (forward lag)."""
    return [[s["step"], s["tv_estimate"], s["filtered_fraction"], s["clip_fraction"]] for s in steps]


def normalize_advantages(a: torch.Tensor, on: bool) -> torch.Tensor:
    """Minibatch advantage normalisation (PPO's): (a - mean) / (std + 1e-8) when ``on`` and a has
    more than one element; otherwise ``a`` unchanged."""
    return (a - a.mean()) / (a.std() + 1e-8) if on and a.numel() > 1 else a


def _surrogate_steps(policy, optimizer, batch, cfg, generator, adv, targets, target_log_prob, stale=None,
                     fwd=contextlib.nullcontext):
    T, N = batch["rewards"].shape
    flat = {"obs": _flat(batch["obs"][:-1]), "actions": _flat(batch["actions"]),
            "behavior_log_prob": batch["behavior_log_prob"].reshape(-1),
            "target_log_prob": target_log_prob.reshape(-1), "adv": adv.reshape(-1), "targets": targets.reshape(-1)}
    size = T * N
    mb = size // cfg.num_minibatches
    steps = []
    device = flat["adv"].device
    # hysteresis: has a minibatch of this iteration been over δ
    fired = torch.zeros((), dtype=torch.bool, device=device)
    for _ in range(cfg.num_epochs):
        perm = torch.randperm(size, generator=generator).to(device)   # CPU generator: the same shuffles everywhere
        for k in range(cfg.num_minibatches):
            idx = perm[k * mb:(k + 1) * mb]
            a = normalize_advantages(flat["adv"][idx], cfg.normalize_advantages)
            out, log_prob, values = _forward(policy, flat["obs"][idx], flat["actions"][idx], fwd)
            pl = policy_loss(cfg, log_prob=log_prob, behavior_log_prob=flat["behavior_log_prob"][idx],
                              target_log_prob=flat["target_log_prob"][idx], adv=a,
                              force=fired if cfg.tv_filter_trigger == "iteration" else False)
            step = _finish_step(policy, optimizer, cfg, pl, out, values, flat["targets"][idx], len(steps))
            if pl.filter_fired is not None:
                fired = fired | pl.filter_fired
                step.update(filter_split(pl, stale, idx))
            steps.append(step)
    return steps


def filter_split(pl, stale, idx) -> dict[str, float]:
    """How often the filter fired, and what it removed from stale and from fresh samples."""
    out = {"filter_fire_rate": float(pl.filter_fired)}
    if stale is None:
        return out
    keep, s = pl.keep_mask, stale[idx]
    nan = float("nan")
    out["filtered_fraction_stale"] = float((~keep[s]).float().mean()) if s.any() else nan
    out["filtered_fraction_fresh"] = float((~keep[~s]).float().mean()) if (~s).any() else nan
    return out


def _finish_step(policy, optimizer, cfg, pl, out, values, targets, step):
    vl = losses.value_loss(values=values, targets=targets)
    entropy = out.dist.entropy().mean()
    loss = pl.loss + cfg.value_coef * vl - cfg.entropy_coef * entropy
    grad_norm = optimizer_step(policy, optimizer, loss, cfg.max_grad_norm)
    return {"step": step, "policy_loss": pl.loss.item(), "value_loss": vl.item(), "entropy": entropy.item(),
            "approx_kl": float(pl.approx_kl), "tv_estimate": float(pl.tv_estimate),
            "filtered_fraction": float(pl.filtered_fraction), "clip_fraction": float(pl.clip_fraction),
            "grad_norm": grad_norm}


def _impala_steps(policy, optimizer, batch, cfg, generator, kw, fwd):
    """One epoch; minibatches are groups of whole rollouts (columns), and V-trace is recomputed
    with the current weights before every optimizer step (IMPALA, arXiv:1802.01561)."""
    T, N = batch["rewards"].shape
    groups = max(1, min(cfg.num_minibatches, N))
    steps = []
    device = batch["rewards"].device
    for cols in torch.randperm(N, generator=generator).to(device).chunk(groups):
        sub = {k: v[:, cols] for k, v in batch.items()}
        target_log_prob, values, final_values = _evaluate(policy, sub, fwd)
        sub_kw = dict(kw, batch=sub, values=values, final_values=final_values)
        pg_adv, vs = advantages(preset="impala", target_log_prob=target_log_prob, **sub_kw)
        out, log_prob, new_values = _forward(policy, _flat(sub["obs"][:-1]), _flat(sub["actions"]), fwd)
        pl = losses.impala_policy_loss(log_prob=log_prob, behavior_log_prob=sub["behavior_log_prob"].reshape(-1),
                                       pg_advantages=pg_adv.reshape(-1), rho_bar=cfg.rho_bar)
        steps.append(_finish_step(policy, optimizer, cfg, pl, out, new_values, vs.reshape(-1), len(steps)))
    return steps
