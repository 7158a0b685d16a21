"""One learner iteration (docs/vaco-paper.md, "Loss and schedule of one learner iteration"), shared by every preset.

1. With the weights at iteration start (π_T), compute log π_T(a|s) and V(s) once.
2. Advantages and critic targets once: realigned advantages for π_T (vaco, vaco_no_filter: uncorrected
   traces by default; vaco_paper: V-trace's) with V-trace's targets for the critic, or GAE on β's data
   and its λ-returns (ppo, ppo_kl, spo, vaco_no_realign). impala instead recomputes V-trace before
   every optimizer step.
3. num_epochs x num_minibatches optimizer steps on
   policy loss + value_coef * mean (V - targets)^2 - entropy_coef * entropy.

Sources: VACO arXiv:2603.01365; V-trace arXiv:1802.01561; PPO arXiv:1707.06347.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from asyncrl.algo.ppo_losses import impala_policy_loss
from asyncrl.algo.returns import gae, next_state_values, realigned_returns
from asyncrl.algo.vaco_loss import previous_anchor_log_prob
from asyncrl.algo.value_loss import explained_variance, value_loss
from asyncrl.core.config import VTRACE_PRESETS
from asyncrl.core.iteration import (
    filter_split,
    group_steps,
    minibatch_rows,
    normalize_advantages,
    optimizer_step,
    policy_loss,
    scalar_steps,
    step_means,
    step_record,
)
from asyncrl.core.learner_group import column_groups, epoch_permutation, shard_columns
from asyncrl.tasks.control.fused_step import FusedStep
from asyncrl.tasks.control.policy import ActorCritic


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


@torch.no_grad()
def _evaluate(policy: ActorCritic, batch: dict[str, torch.Tensor], fwd: Callable[[], ContextManager]):
    """log π(a|s) [T, N], V(s_t) [T+1, N], V(final_obs) [T, N] (only where truncated), float32, and
    the normalised observations x [T * N, D] of obs[:-1] (time-major; the minibatches' input: the
    statistics are fixed within an iteration); the forwards run in ``fwd()`` (bf16 autocast or none)."""
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
    return log_prob, values, final_values, x[: T * N]


def _forward(policy: ActorCritic, x: torch.Tensor, actions: torch.Tensor, fwd: Callable[[], ContextManager]):
    """(policy output, log π(a|s) [N] float32, V(s) [N] float32) of normalised obs x [N, D], in ``fwd()``."""
    with fwd():
        out = policy.heads(x)
        log_prob = out.dist.log_prob(actions)
    return out, log_prob.float(), out.values.float()


def advantages(
    *,
    preset: str,
    batch,
    target_log_prob,
    values,
    final_values,
    gamma,
    lam,
    rho_bar,
    c_bar,
    traces,
    value_targets: str = "auto",
    lag=None,
    realign_min_lag: int = 0,
):
    """(advantages [T, N], value targets [T, N]) for ``preset``; see the module docstring.

    ``traces`` are those of the realigned advantages. ``value_targets`` picks the critic's target:
    "auto" takes V-trace's vs where the advantages are realigned and GAE's λ-returns otherwise;
    "vtrace" or "lambda_returns" name one. V-trace's vs always use V-trace's own traces
    c_t = λ min(c̄, ρ_t), whatever ``traces``: the critic's targets feed back into the critic, and only
    those traces keep that a contraction at any lag (docs/decisions/traces.md).

    ``realign_min_lag`` > 0 (realigning presets but impala): only the samples whose ``lag`` [T, N]
    (learner version - behaviour version, in versions) is at least this get the realigned advantage
    (and, under "auto", V-trace's target); the others get GAE on β's data and its λ-returns, as
    ``vaco_no_realign`` (at one or two versions of lag the realignment makes HalfCheetah's
    main job flip; docs/decisions/realign-min-lag.md).
    Raises ValueError if ``realign_min_lag`` > 0 and ``lag`` is None.
    """
    terminated, truncated = batch["terminated"], batch["truncated"]
    next_values = next_state_values(
        values_tp1=values[1:], final_values=final_values, terminated=terminated, truncated=truncated
    )
    episode_end = terminated | truncated
    realign = preset in VTRACE_PRESETS
    partial = realign and realign_min_lag > 0 and preset != "impala"
    if partial and lag is None:
        raise ValueError(
            "realign_min_lag > 0 needs each sample's lag (the batch's behavior_version and the learner's version)"
        )
    adv = targets = None
    if realign or value_targets == "vtrace":
        realign_kw = dict(
            behavior_log_prob=batch["behavior_log_prob"],
            target_log_prob=target_log_prob,
            rewards=batch["rewards"],
            values=values[:-1],
            next_values=next_values,
            episode_end=episode_end,
            gamma=gamma,
            lam=lam,
            rho_bar=rho_bar,
            c_bar=c_bar,
        )
        r = realigned_returns(**realign_kw, traces=traces)
        if realign:
            adv = r.pg_advantages if preset == "impala" else r.advantages
        if value_targets != "lambda_returns":
            targets = r.vs if traces == "vtrace" else realigned_returns(**realign_kw, traces="vtrace").vs
    if not realign or value_targets == "lambda_returns" or partial:
        g = gae(
            rewards=batch["rewards"],
            values=values[:-1],
            next_values=next_values,
            episode_end=episode_end,
            gamma=gamma,
            lam=lam,
        )
        adv = g.advantages if adv is None else adv
        targets = g.returns if targets is None else targets
        if partial:
            realigned = lag >= realign_min_lag
            adv = torch.where(realigned, adv, g.advantages)
            if value_targets == "auto":
                targets = torch.where(realigned, targets, g.returns)
    return adv, targets


def learner_iteration(
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    *,
    cfg,
    generator: torch.Generator,
    version: int | None = None,
    forward_context: Callable[[], ContextManager] = contextlib.nullcontext,
    group=None,
    shards: int = 1,
    compile_loss: bool = False,
    previous_policy: ActorCritic | None = None,
) -> dict[str, Any]:
    """Run one learner iteration in place on ``policy`` and ``optimizer``.

    Args:
        batch: time-major tensors: obs [T+1, N, D], actions [T, N, A] (or [T, N] int64),
            behavior_log_prob [T, N], rewards [T, N] (already scaled), terminated /
            truncated [T, N] bool, final_obs [T, N, D].
        cfg: an AlgoConfig (preset and hyperparameters). The caller sets the learning rate.
        generator: drives minibatch shuffling (serial runs are bit-reproducible).
        version: the learner's policy version; with it (and behavior_version [T, N] in the batch)
            no_grad_fraction is also reported for stale (behaviour version < version) and
            fresh samples apart.
        forward_context: the context of every network forward (asyncrl.core.device.forward_context: bf16
            autocast or none); log-probs and values are cast to float32 before any ratio or loss.
            The batch and ``policy`` share a device; ``generator`` is a CPU one (the shuffles are
            the same on every device).
        group: a :class:`asyncrl.core.learner_group.LearnerGroup` when this process is one member of
            a data-parallel learner group and ``batch`` its equal share (whole columns) of the
            group's batch: gradients, advantage normalisation, the TV estimate and the diagnostics
            are reduced over the group, which takes the steps of one learner on the union.
        shards: W > 1 makes one learner take exactly the steps a group of W members takes on the
            W equal column blocks of ``batch`` (the minibatches of
            :func:`asyncrl.core.learner_group.epoch_permutation`): the group's reference.
        compile_loss: take each optimizer step as one compiled graph (a group member: two, its
            collectives between them; :class:`asyncrl.tasks.control.fused_step.FusedStep`;
            learner.compile), where the optimizer has flat buffers: the same arithmetic to float rounding.
        previous_policy: π_{T-1} for cfg.ratio_anchor = "previous" (None: π_T stands in); needs
            ``version`` and the batch's behavior_version (ValueError otherwise).

    Returns:
        Scalars (policy_loss, value_loss, entropy, approx_kl, tv_estimate, no_grad_fraction
        (asyncrl.algo.policy_loss: the share of samples whose gradient the preset's clip, band or filter
        removed, one definition for every preset), explained_variance, rho_mean, rho_max, grad_norm;
        for ppo clip_fraction_two_sided; for the presets with a rule (ppo, vaco family)
        no_grad_fraction_stale / _fresh; for VACO's TV filter filter_fire_rate, the fraction of
        optimizer steps whose minibatch was filtered) plus ``minibatches``: per optimizer step
        [step, tv_estimate, no_grad_fraction] (forward lag).
    """
    fwd = forward_context
    if shards > 1 and group is not None:
        raise ValueError("shards > 1 is the single learner's reference of a group: not with group")
    shard_columns(batch["rewards"].shape[1], shards)  # ValueError unless the columns split evenly
    target_log_prob, values, final_values, x = _evaluate(policy, batch, fwd)
    log_rho = target_log_prob - batch["behavior_log_prob"]
    rho = log_rho.clamp(-20, 20).exp()
    kw = dict(
        batch=batch,
        values=values,
        final_values=final_values,
        gamma=cfg.gamma,
        lam=cfg.gae_lambda,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        traces=cfg.traces,
    )
    if cfg.preset == "impala":
        steps = _impala_steps(policy, optimizer, batch, cfg, generator, kw, fwd, group, shards)
        adv, targets = advantages(preset="impala", target_log_prob=target_log_prob, **kw)
    else:
        lag = None
        if version is not None and "behavior_version" in batch:
            lag = version - batch["behavior_version"]
        adv, targets = advantages(
            preset=cfg.preset,
            target_log_prob=target_log_prob,
            value_targets=cfg.value_targets,
            lag=lag,
            realign_min_lag=cfg.realign_min_lag,
            **kw,
        )
        stale = None if lag is None else (lag > 0).reshape(-1)
        anchor = target_log_prob
        if cfg.ratio_anchor == "previous":
            anchor = previous_anchor(previous_policy, batch, target_log_prob, lag, fwd)
        steps = _surrogate_steps(
            policy, optimizer, batch, x, cfg, generator, adv, targets, anchor, stale, fwd, group, shards, compile_loss,
        )  # fmt: skip
    stats = step_means(steps)
    stats["explained_variance"] = _explained_variance(values[:-1], targets, group)
    if group is None:
        stats["rho_mean"], stats["rho_max"] = float(rho.mean()), float(rho.max())
    else:
        stats["rho_mean"], stats["rho_max"] = float(group.mean(rho.mean())), float(group.max(rho.max()))
    stats["minibatches"] = minibatch_rows(steps)
    return stats


@torch.no_grad()
def previous_anchor(previous, batch, target_log_prob, lag, fwd=contextlib.nullcontext) -> torch.Tensor:
    """[T, N] log-probs of ratio_anchor = "previous"'s anchor (the newer of β and π_{T-1}:
    :func:`asyncrl.algo.vaco_loss.previous_anchor_log_prob`), π_{T-1}'s computed only when a sample is
    older than it; ``previous`` None: π_T (``target_log_prob``) stands in. Raises ValueError without ``lag``."""
    if lag is None:
        raise ValueError("ratio_anchor = previous needs each sample's lag: the learner's version and behavior_version")
    prev = target_log_prob
    if previous is not None and bool((lag > 1).any()):
        with fwd():  # its own observation statistics: π_{T-1} as published; its critic is not needed
            x = previous.normalize(_flat(batch["obs"][:-1]))
            prev = previous.distribution(x).log_prob(_flat(batch["actions"])).view_as(target_log_prob).float()
    return previous_anchor_log_prob(
        behavior_log_prob=batch["behavior_log_prob"].reshape(-1),
        previous_log_prob=prev.reshape(-1),
        lag=lag.reshape(-1),
    ).view_as(target_log_prob)


def warm_up_compiled_step(
    policy, optimizer, cfg, *, rows: int, spec, forward_context=contextlib.nullcontext, group=None
) -> bool:
    """Compile the optimizer step :func:`learner_iteration` takes with ``compile_loss`` (the same
    :class:`asyncrl.tasks.control.fused_step.FusedStep`) for minibatches of ``rows`` samples of
    ``spec``'s observations and actions, before the first iteration, touching no state: a learner
    serving peers compiles here, in a thread, instead of inside its first iteration. Returns True when
    the first iteration will take no compile; False where no compiled step applies (impala, an
    optimizer without flat buffers, a TV-filtered preset in a group) or the compile failed."""
    if cfg.preset == "impala":
        return False
    fused = FusedStep.get(policy, optimizer, cfg, forward_context, _with_critic, group)
    if fused is None:
        return False
    tail, dtype = ((), torch.int64) if spec.discrete else ((spec.action_dim,), torch.float32)
    device = optimizer.flat_params.device
    force = torch.zeros((), dtype=torch.bool, device=device) if cfg.tv_filter_trigger == "iteration" else False
    return fused.warm_up(rows, spec.obs_dim, tail, dtype, force)


def _explained_variance(values: torch.Tensor, targets: torch.Tensor, group) -> float:
    """:func:`asyncrl.algo.value_loss.explained_variance`, over the union of a learner group's shares."""
    if group is None:
        return explained_variance(values=values, targets=targets)
    with torch.no_grad():
        t, d = targets.double().reshape(-1), (targets - values).double().reshape(-1)
        n, st, st2, sd, sd2 = group.sum(
            torch.stack([t.new_tensor(t.numel()), t.sum(), (t * t).sum(), d.sum(), (d * d).sum()])
        )
        var_t = float(st2 / n - (st / n) ** 2)
        return math.nan if var_t <= 0.0 else 1.0 - float(sd2 / n - (sd / n) ** 2) / var_t


def _surrogate_steps(
    policy,
    optimizer,
    batch,
    x,
    cfg,
    generator,
    adv,
    targets,
    target_log_prob,
    stale=None,
    fwd=contextlib.nullcontext,
    group=None,
    shards=1,
    compile_loss=False,
):
    """The iteration's num_epochs x num_minibatches optimizer steps; their records as floats."""
    T, N = batch["rewards"].shape
    flat = {
        "x": x,
        "actions": _flat(batch["actions"]),
        "behavior_log_prob": batch["behavior_log_prob"].reshape(-1),
        "target_log_prob": target_log_prob.reshape(-1),
        "adv": adv.reshape(-1),
        "targets": targets.reshape(-1),
    }
    if stale is not None:
        flat["stale"] = stale
    steps, filter_rows = [], []
    device = flat["adv"].device
    fused = FusedStep.get(policy, optimizer, cfg, fwd, _with_critic, group) if compile_loss else None
    # hysteresis: has a minibatch of this iteration been over δ
    fired = torch.zeros((), dtype=torch.bool, device=device)
    for _ in range(cfg.num_epochs):
        # CPU generator: the same shuffles everywhere (on every device and every member of a group)
        perm = epoch_permutation(T, N, cfg.num_minibatches, generator, shards).to(device)
        mb = perm.numel() // cfg.num_minibatches
        shuffled = {k: v[perm] for k, v in flat.items()}  # one gather per epoch; minibatches are slices of it
        for k in range(cfg.num_minibatches):
            m = {key: v[k * mb : (k + 1) * mb] for key, v in shuffled.items()}
            force = fired if cfg.tv_filter_trigger == "iteration" else False
            mb_args = (
                m["x"],
                m["actions"],
                m["behavior_log_prob"],
                m["target_log_prob"],
                m["adv"],
                m["targets"],
                force,
            )
            done = None if fused is None else fused(*mb_args)  # one compiled graph: loss, gradient, clip, Adam
            if done is None:
                loss, pl, vl, entropy = _minibatch_loss(policy, cfg, *mb_args, group, fwd)
                grad_norm = optimizer_step(optimizer, loss, cfg.max_grad_norm, group=group)
            else:
                pl, vl, entropy, grad_norm = done
            steps.append(step_record(len(steps), pl, grad_norm, value_loss=vl, entropy=entropy))
            if pl.filter_fired is not None:
                # a group's hysteresis: the filter fired on any member's share of the minibatch
                now = (
                    pl.filter_fired
                    if group is None or cfg.tv_filter_trigger != "iteration"
                    else group.max(pl.filter_fired.to(torch.uint8)).bool()
                )
                fired = fired | now
            if pl.keep_mask is not None:
                filter_rows.append((pl.filter_fired, pl.keep_mask, m.get("stale")))
    steps = group_steps(scalar_steps(steps), group)
    if filter_rows:  # what the rule removed, for all steps at once
        fired_s, keep_s, stale_s = zip(*filter_rows)
        split = filter_split(
            None if fired_s[0] is None else torch.stack(fired_s),
            torch.stack(keep_s),
            None if stale is None else torch.stack(stale_s),
            group,
        )
        for key, v in split.items():
            for step, value in zip(steps, v.cpu().tolist()):
                step[key] = value
    return steps


def _minibatch_loss(policy, cfg, x, actions, behavior_log_prob, target_log_prob, adv, targets, force, group, fwd):
    """(loss to minimise, PolicyLoss, value loss, entropy) of one minibatch of flat samples [M]: the
    advantages normalised (over the group's union with ``group``), the preset's policy loss, plus
    value_coef x the critic's loss, minus entropy_coef x the entropy (only reported at 0)."""
    a = normalize_advantages(adv, cfg.normalize_advantages, group)
    out, log_prob, values = _forward(policy, x, actions, fwd)
    pl = policy_loss(
        cfg,
        log_prob=log_prob,
        behavior_log_prob=behavior_log_prob,
        target_log_prob=target_log_prob,
        adv=a,
        force=force,
        group=group,
    )
    loss, vl, entropy = _with_critic(cfg, pl, out, values, targets)
    return loss, pl, vl, entropy


def _with_critic(cfg, pl, out, values, targets):
    """(policy loss + value_coef x the critic's loss - entropy_coef x the entropy, the critic's loss,
    the entropy), the last two detached; at entropy_coef 0 the entropy is only reported (no backward)."""
    vl = value_loss(values=values, targets=targets)
    loss = pl.loss + cfg.value_coef * vl
    if cfg.entropy_coef:
        entropy = out.dist.entropy().mean()
        loss = loss - cfg.entropy_coef * entropy
    else:
        with torch.no_grad():
            entropy = out.dist.entropy().mean()
    return loss, vl.detach(), entropy.detach()


def _finish_step(optimizer, cfg, pl, out, values, targets, step, group=None):
    loss, vl, entropy = _with_critic(cfg, pl, out, values, targets)
    grad_norm = optimizer_step(optimizer, loss, cfg.max_grad_norm, group=group)
    return step_record(step, pl, grad_norm, value_loss=vl, entropy=entropy)


def _impala_steps(policy, optimizer, batch, cfg, generator, kw, fwd, group=None, shards=1):
    """One epoch; minibatches are groups of whole rollouts (columns), and V-trace is recomputed
    with the current weights before every optimizer step (IMPALA, arXiv:1802.01561)."""
    T, N = batch["rewards"].shape
    groups = max(1, min(cfg.num_minibatches, N // shards))
    steps = []
    device = batch["rewards"].device
    for cols in column_groups(N, groups, generator, shards):
        cols = cols.to(device)
        sub = {k: v[:, cols] for k, v in batch.items()}
        target_log_prob, values, final_values, x = _evaluate(policy, sub, fwd)
        sub_kw = dict(kw, batch=sub, values=values, final_values=final_values)
        pg_adv, vs = advantages(preset="impala", target_log_prob=target_log_prob, **sub_kw)
        out, log_prob, new_values = _forward(policy, x, _flat(sub["actions"]), fwd)
        pl = impala_policy_loss(
            log_prob=log_prob,
            behavior_log_prob=sub["behavior_log_prob"].reshape(-1),
            pg_advantages=pg_adv.reshape(-1),
            rho_bar=cfg.rho_bar,
        )
        steps.append(_finish_step(optimizer, cfg, pl, out, new_values, vs.reshape(-1), len(steps), group))
    return group_steps(scalar_steps(steps), group)
