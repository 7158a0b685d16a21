"""One learner iteration of the llm task: GRPO advantages, then epochs x minibatches of the preset's
policy loss on completion tokens, through the same dispatch as the control task
(:func:`asyncrl.core.iteration.policy_loss`: ``grpo`` -> ``ppo_clip_loss``, ``vaco`` -> ``vaco_policy_loss``
with the learning anchor π_T, ``surrogate_rho_bar`` and the band on the forward ratio π_θ/π_T).

1. With the weights at iteration start (π_T): log π_T of the completion tokens of the rows that can
   train, once (every row with ``llm.realign``, whose advantages need it; otherwise the rows of
   informative groups, or all rows with ``llm.silent_groups`` "step" / "skip"). The first
   minibatch of the first epoch takes its log π_T from its own forward, taken before any optimizer
   step of the iteration and hence at π_T: with one minibatch and one epoch (the gsm-tiny default)
   the learner makes no separate forward at all. A forward of every row took twice the time of the
   training step on the informative fifth (lab/llm-gsm-tiny/README.md).
2. Group-normalised advantages per row (:func:`asyncrl.algo.grpo.group_advantages`; with
   ``llm.realign = "is_baseline"`` against the baseline of π_T instead,
   :func:`asyncrl.algo.grpo.realigned_group_advantages` with ``algo.rho_bar``; docs/llm-realignment.md),
   broadcast over the tokens the policy chose (``policy_mask``: padding and calculator-written tokens
   get none), times the averaging weights (``llm.averaging``); negative advantages are scaled by
   ``llm.negative_weight`` (1: GRPO; 0: positive-sample reinforcement, arXiv:2506.01347).
3. ``algo.num_epochs`` x ``algo.num_minibatches`` optimizer steps; minibatches are random sets of
   rows (completions), drawn from the learner's generator (serial runs are bit-reproducible). Groups
   whose rewards are all equal have zero advantage (``llm.silent_groups``: ``step`` keeps them, and
   a minibatch of them alone still moves Adam on its momentum; ``skip`` takes no optimizer step for
   such a minibatch; ``drop`` removes them first, as DAPO's dynamic sampling, arXiv:2503.14476, and
   splits the rest into at most num_minibatches parts). With
   ``llm.kl_coef > 0`` each step's loss adds kl_coef times the k3 estimate of KL(π_θ || π_ref) per
   policy token (:func:`asyncrl.algo.grpo.kl_k3`), averaged with the loss's token weights; π_ref
   is the frozen start model, its log-probs computed once per iteration (DeepSeekMath, arXiv:2402.03300).

Log-probs and memory: every log-prob is that of the generators' sampling transform (llm.temperature,
top_k, top_p; asyncrl.tasks.llm.token_log_probs), computed in chunks of ``llm.logprob_chunk_tokens``
completion positions (never [rows, tokens, vocabulary] logits). With ``llm.micro_batch_rows`` each
optimizer step accumulates its gradient over micro-batches: the minibatch's log-probs first without
gradient, its loss and the loss's gradient per token on them (the TV filter, advantage normalisation and
token averaging see the whole minibatch), then each micro-batch's forward backpropagates its share
(GradCache, arXiv:2101.06983): the update of the whole minibatch to float rounding. The forwards
without gradient (π_T, π_ref) run one micro-batch at a time too.

Shapes: batch rows R' = B slots x prompts x G (groups of G consecutive rows), S = S_p + L tokens.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from asyncrl.algo import grpo
from asyncrl.core.iteration import (
    filter_split,
    minibatch_rows,
    normalize_advantages,
    optimizer_step,
    policy_loss,
    scalar_steps,
    step_means,
    step_record,
)
from asyncrl.tasks.llm.token_log_probs import completion_log_probs


def _token_log_probs(model, batch: dict[str, torch.Tensor], rows, *, llm) -> torch.Tensor:
    """[len(rows), L] log-probs of the rows' completion tokens under ``model`` and the generators'
    sampling transform (llm.temperature, top_k, top_p), in chunks of llm.logprob_chunk_tokens."""
    ids = torch.cat([batch["prompt_ids"][rows], batch["completion_ids"][rows]], 1)
    mask = torch.cat([batch["prompt_mask"][rows], batch["completion_mask"][rows]], 1).long()
    return completion_log_probs(
        model,
        ids,
        mask,
        batch["completion_mask"][rows],
        temperature=llm.temperature,
        top_k=llm.top_k,
        top_p=llm.top_p,
        chunk_tokens=llm.logprob_chunk_tokens,
    )


def _micro_batches(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``rows`` in consecutive parts of ``size`` (llm.micro_batch_rows; 0: one part)."""
    return list(rows.split(size)) if 0 < size < len(rows) else [rows]


def _no_grad_log_probs(model, batch, rows, *, llm, forward_context) -> torch.Tensor:
    """:func:`_token_log_probs` without gradient, one micro-batch of rows per forward."""
    with torch.no_grad(), forward_context():
        parts = [_token_log_probs(model, batch, part, llm=llm) for part in _micro_batches(rows, llm.micro_batch_rows)]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _backward_micro_batches(model, batch, parts, grad_log_prob, *, llm, forward_context) -> None:
    """Fill the parameters' gradients one micro-batch (``parts``, rows) at a time: its forward with
    gradient, then the backward of its log-probs against its rows of ``grad_log_prob`` ([rows, L],
    d loss / d log π of the whole minibatch): their sum is the minibatch's gradient."""
    for part, g in zip(parts, grad_log_prob.split([len(p) for p in parts])):
        with forward_context():
            lp = _token_log_probs(model, batch, part, llm=llm)
        (lp * g).sum().backward()


def _advantages(batch: dict[str, torch.Tensor], target: torch.Tensor, *, algo, llm) -> tuple[torch.Tensor, dict]:
    """[R'] sequence advantages (``llm.realign``, then ``llm.negative_weight``) and the realignment's
    statistics."""
    rewards = batch["rewards"].to(torch.float32).view(-1, llm.group_size)
    if llm.realign == "none":
        adv = grpo.group_advantages(rewards, scale_by_std=llm.scale_by_std).reshape(-1)
        return grpo.weight_negatives(adv, llm.negative_weight), {}
    log_ratio = grpo.sequence_log_ratio(target, batch["behavior_log_prob"], batch["policy_mask"])
    r = grpo.realigned_group_advantages(
        rewards, log_ratio.view_as(rewards), rho_bar=algo.rho_bar, scale_by_std=llm.scale_by_std
    )
    adv = grpo.weight_negatives(r.advantages.reshape(-1), llm.negative_weight)
    return adv, {
        "realign_baseline_shift": float(r.baseline_shift.abs().mean()),
        "realign_weight_mean": float(r.weights.mean()),
        "realign_weight_min": float(r.weights.min()),
    }


def _kl_penalty(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor, *, llm, max_len: int
) -> tuple[torch.Tensor, float]:
    """(the token-weighted mean of the k3 KL to the reference over the [N] policy tokens of ``mask``,
    its unweighted mean for the statistics)."""
    kl = grpo.kl_k3(log_prob, ref_log_prob)
    w = grpo.token_weights(mask, averaging=llm.averaging, max_len=max_len).to(kl.dtype)[mask]
    return (w * kl).mean(), float(kl.detach().mean())


_STEP_KEYS = ("policy_loss", "approx_kl", "tv_estimate", "no_grad_fraction", "grad_norm")


def _minibatches(perm: torch.Tensor, n: int, *, exact: bool) -> list[torch.Tensor]:
    """``n`` minibatches of the shuffled rows ``perm``: equal slices of len // n rows (``exact``; the
    remainder is left out, as the control task does), or the near-equal non-empty parts of
    torch.tensor_split (silent groups dropped: any number of rows is left)."""
    if exact:
        mb = len(perm) // n
        return [perm[k * mb : (k + 1) * mb] for k in range(n)]
    return [part for part in torch.tensor_split(perm, min(n, len(perm))) if len(part)] if len(perm) else []


def llm_iteration(
    model,
    optimizer,
    batch: dict[str, torch.Tensor],
    *,
    algo,
    llm,
    generator: torch.Generator,
    version: int | None = None,
    reference=None,
    forward_context: Callable[[], ContextManager] = contextlib.nullcontext,
    target_from_first_step: bool = True,
) -> dict[str, Any]:
    """Run one learner iteration in place on ``model`` and ``optimizer``.

    Args:
        batch: prompt_ids / prompt_mask [R', S_p], completion_ids / completion_mask / policy_mask /
            behavior_log_prob [R', L], behavior_version and rewards [R'] (asyncrl.tasks.llm.spec).
        algo: AlgoConfig (preset grpo, vaco or vaco_no_filter; clip_eps, tv_threshold, ...).
        llm: LLMConfig (group_size, temperature, top_k, top_p, averaging, scale_by_std, realign,
            kl_coef, logprob_chunk_tokens, micro_batch_rows).
        generator: minibatch shuffling.
        reference: the frozen reference model π_ref of the KL penalty, on the model's device; needed
            when llm.kl_coef > 0, unused otherwise.
        version: the learner's version; splits no_grad_fraction into stale / fresh tokens and
            gives the generator-vs-learner log-prob mismatch of fresh rows (zero lag).
        forward_context: the context of the model's forwards (asyncrl.core.device.forward_context: bf16
            autocast or none); the token log-probs come out float32 (completion_log_probs casts the
            logits before the log-softmax), so ratios and losses are float32. ``batch`` and
            ``model`` share a device; ``generator`` is a CPU one.
        target_from_first_step: the first minibatch takes log π_T from its own forward (step 1 of the
            module docstring); False when a forward with gradient is not π_T's (LoRA dropout on), so
            every row gets log π_T from a forward without gradient.

    Returns:
        Scalars (policy_loss, approx_kl, tv_estimate, no_grad_fraction (the share of tokens whose
        gradient grpo's clip or vaco's band and filter removed: asyncrl.algo.policy_loss), grad_norm,
        clip_fraction_two_sided (grpo),
        rho_mean, rho_max, reward_mean, completion_tokens_mean, logprob_mismatch_fresh, ...; with
        llm.realign: realign_baseline_shift = mean over groups of |b_T - b_β| in reward units,
        realign_weight_mean / _min of the sequence weights min(ρ̄, π_T/β); with llm.kl_coef > 0: kl_ref,
        the mean k3 estimate per policy token, nats; zero_advantage_groups and
        zero_advantage_groups_solved, the fractions of groups with equal rewards and with every reward
        > 0; optimizer_steps taken and skipped_minibatches, llm.silent_groups; no_token_minibatches,
        minibatches without a policy token, skipped: no batch the slot checks let in can end the
        learner) and ``minibatches`` rows
        [step, tv_estimate, no_grad_fraction]. The per-step scalars are NaN when no
        step was taken.

    Raises:
        ValueError: rows not a multiple of group_size, llm.kl_coef > 0 without a reference, or as
            grpo.flatten_tokens / grpo.realigned_group_advantages.
    """
    rows, G = batch["rewards"].shape[0], llm.group_size
    if rows % G:
        raise ValueError(f"{rows} rows are not whole groups of {G}")
    if llm.kl_coef > 0 and reference is None:
        raise ValueError(f"llm.kl_coef = {llm.kl_coef} needs the reference model (llm_iteration(reference=...))")
    cmask = batch["completion_mask"]
    pmask = batch["policy_mask"]  # the policy's own tokens: loss, ratios, TV estimate and counts
    device = cmask.device
    everything = torch.arange(rows, device=device)
    behavior = batch["behavior_log_prob"]
    target = torch.zeros_like(behavior)  # log π_T [R', L], on the rows in `known`
    known = torch.zeros(rows, dtype=torch.bool, device=device)

    def fill_target(idx: torch.Tensor) -> None:  # a forward at π_T, without gradient
        if len(idx):
            target[idx] = _no_grad_log_probs(model, batch, idx, llm=llm, forward_context=forward_context)
            known[idx] = True

    if llm.realign != "none":
        fill_target(everything)
    adv, realign_stats = _advantages(batch, target, algo=algo, llm=llm)
    stale_rows = batch["behavior_version"] < version if version is not None else None
    silent = (adv.view(-1, G) == 0).all(1)  # [groups]
    pool = everything
    if llm.silent_groups == "drop":
        pool = everything[~silent.repeat_interleave(G)]
    exact = llm.silent_groups != "drop"
    first_perm = pool[torch.randperm(len(pool), generator=generator).to(device)]  # epoch 1's shuffle
    first = (_minibatches(first_perm, algo.num_minibatches, exact=exact) or [first_perm[:0]])[0]
    if (
        not target_from_first_step
        or llm.silent_groups == "skip"
        and not bool((adv[first] != 0).any())
        or not bool(pmask[first].any())
    ):
        first = first[:0]  # skipped, or its forward is not π_T's: its rows get π_T from a forward of their own
    fill_target(pool[~known[pool] & ~torch.isin(pool, first)])  # the first minibatch fills its own at its forward
    ref = None  # log π_ref [R', L] on the pool's rows
    if llm.kl_coef > 0:
        ref = torch.zeros_like(behavior)
        if len(pool):
            ref[pool] = _no_grad_log_probs(reference, batch, pool, llm=llm, forward_context=forward_context)
    steps: list[dict] = []
    skipped = empty = 0
    fired = torch.zeros((), dtype=torch.bool, device=device)

    def minibatch_loss(log_prob: torch.Tensor, idx: torch.Tensor):
        """(loss, PolicyLoss, KL statistics) of the minibatch ``idx`` from its [len(idx), L] log-probs."""
        m = pmask[idx]
        tb = grpo.flatten_tokens(
            m,
            log_prob=log_prob,
            behavior_log_prob=behavior[idx],
            advantages=adv[idx],
            averaging=llm.averaging,
            max_len=cmask.shape[1],
        )
        a = normalize_advantages(tb.advantages, algo.normalize_advantages)
        pl = policy_loss(
            algo,
            log_prob=tb.log_prob,
            behavior_log_prob=tb.behavior_log_prob,
            target_log_prob=target[idx][m],
            adv=a,
            force=fired if algo.tv_filter_trigger == "iteration" else False,
        )
        loss, kl = pl.loss, {}
        if ref is not None:
            penalty, kl["kl_ref"] = _kl_penalty(tb.log_prob, ref[idx][m], m, llm=llm, max_len=cmask.shape[1])
            loss = loss + llm.kl_coef * penalty
        return loss, pl, kl

    for epoch in range(algo.num_epochs):  # CPU generator: the same shuffles on every device
        perm = first_perm if epoch == 0 else pool[torch.randperm(len(pool), generator=generator).to(device)]
        for idx in _minibatches(perm, algo.num_minibatches, exact=exact):
            m = pmask[idx]
            if not bool(m.any()):  # no token the policy chose: nothing to average a loss over
                empty += 1  # (the slot check refuses such rows; this is the learner's own guard)
                continue
            if llm.silent_groups == "skip" and ref is None and not bool((adv[idx] != 0).any()):
                skipped += 1  # nothing to learn here: no Adam step on momentum alone
                continue
            parts = _micro_batches(idx, llm.micro_batch_rows)
            if len(parts) == 1:
                with forward_context():
                    log_prob = _token_log_probs(model, batch, idx, llm=llm)
            else:  # the minibatch's log-probs first, without gradient (GradCache's first pass)
                log_prob = _no_grad_log_probs(model, batch, idx, llm=llm, forward_context=forward_context)
                log_prob.requires_grad_()
            if not bool(known[idx].all()):  # the first minibatch, before any step: these weights are π_T
                target[idx] = log_prob.detach()
                known[idx] = True
            loss, pl, kl = minibatch_loss(log_prob, idx)
            backward = None
            if len(parts) > 1:
                (grad_log_prob,) = torch.autograd.grad(loss, log_prob, allow_unused=True)  # [len(idx), L]
                if grad_log_prob is None:  # a loss that does not depend on the log-probs
                    grad_log_prob = torch.zeros_like(log_prob)
                backward = functools.partial(
                    _backward_micro_batches,
                    model,
                    batch,
                    parts,
                    grad_log_prob,
                    llm=llm,
                    forward_context=forward_context,
                )
            grad_norm = optimizer_step(optimizer, loss, algo.max_grad_norm, backward=backward)
            step = step_record(len(steps), pl, grad_norm, **kl)
            if pl.filter_fired is not None:
                fired = fired | pl.filter_fired
            if pl.keep_mask is not None:
                stale = None if stale_rows is None else stale_rows[idx][:, None].expand_as(m)[m]
                step.update(filter_split(pl.filter_fired, pl.keep_mask, stale))
            steps.append(step)
    steps = scalar_steps(steps)
    step_keys = _STEP_KEYS + (("clip_fraction_two_sided",) if algo.preset == "grpo" else ())
    stats = step_means(steps) if steps else dict.fromkeys(step_keys, float("nan"))
    stats.update(realign_stats)
    log_rho = (target - behavior)[pmask & known[:, None]]  # the rows that trained (or all, with realign)
    rho = log_rho.clamp(-20, 20).exp()
    stats["rho_mean"], stats["rho_max"] = (float(rho.mean()), float(rho.max())) if len(rho) else (float("nan"),) * 2
    stats["reward_mean"] = float(batch["rewards"].float().mean())
    stats["completion_tokens_mean"] = float(cmask.sum(1).float().mean())
    stats["policy_tokens_mean"] = float(pmask.sum(1).float().mean())
    stats["zero_advantage_groups"] = float(silent.float().mean())
    solved = (batch["rewards"].float().view(-1, G) > 0).all(1)
    stats["zero_advantage_groups_solved"] = float((silent & solved).float().mean())  # the rest: all wrong
    stats["optimizer_steps"] = len(steps)
    stats["skipped_minibatches"] = skipped
    stats["no_token_minibatches"] = empty
    fresh = None if stale_rows is None else ~stale_rows
    if fresh is not None and bool(fresh.any()):
        fm = pmask & (fresh & known)[:, None]  # rows generated by the weights of this very version: zero lag
        stats["logprob_mismatch_fresh"] = (
            float((target - behavior)[fm].abs().mean()) if bool(fm.any()) else float("nan")
        )
    else:
        stats["logprob_mismatch_fresh"] = float("nan")
    stats["minibatches"] = minibatch_rows(steps)
    return stats
