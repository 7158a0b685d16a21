"""GRPO math on token rollouts, pure torch: group-normalised advantages, their broadcast over completion
tokens, loss-averaging weights, and the flattening into the flat [N] tensors that
:mod:`asyncrl.algo.vaco_loss` and :mod:`asyncrl.algo.ppo_losses` take, so that

    GRPO = :func:`asyncrl.algo.ppo_losses.ppo_clip_loss` on token ratios π_θ(y_t|x, y_<t) / β(y_t|x, y_<t)
    VACO on tokens = :func:`asyncrl.algo.vaco_loss.vaco_policy_loss` on the same tensors.

Shapes: P prompts, G completions per prompt (a group), B = P * G rows prompt-major (row p * G + g),
L completion positions per row, N = number of completion tokens (mask True) in the batch.

Loss averaging (``averaging``). The losses in asyncrl.algo take the plain mean over their N samples.
Every other average over tokens is that mean with per-token weights w folded into the advantages
(A_t -> w_t A_t, w_t > 0), which is exact for both losses: PPO-clip's min(r A, clip(r) A) and VACO's
r A are positively homogeneous in A, and VACO's filter and band read only the sign of A:

    "token"     w = 1: mean over all N tokens of the batch (DAPO, arXiv:2503.14476).
    "sequence"  w = N / (B' L_b): mean over each row's L_b tokens, then over the B' rows that have
                any token (GRPO as in DeepSeekMath, arXiv:2402.03300).
    "constant"  w = N / (B' L_max): the sum over all tokens divided by B' * L_max, a constant that
                does not depend on the lengths (Dr. GRPO, arXiv:2503.20783; L_max = max_len, the
                generation budget).

The diagnostics the losses return (tv_estimate, no_grad_fraction, clip_fraction_two_sided, approx_kl) stay
unweighted token means.

Advantage realignment without a critic (``llm.realign = "is_baseline"``, docs/llm-realignment.md):
:func:`realigned_group_advantages` replaces the group mean of β's rewards by the self-normalised,
ρ̄-truncated importance-weighted mean under π_T, the group's fixed point of one-step V-trace (VACO,
arXiv:2603.01365; V-trace, arXiv:1802.01561). :func:`kl_k3` is the per-token penalty toward a
reference model (``llm.kl_coef``; DeepSeekMath eq. 4).

Paper: DeepSeekMath (GRPO), arXiv:2402.03300; Dr. GRPO, arXiv:2503.20783.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from asyncrl.algo import checks
from asyncrl.algo.policy_loss import LOG_RATIO_CLAMP

AVERAGING = ("token", "sequence", "constant")
DEFAULT_EPS = 1e-4  # added to the group std: bounds |A| by (max - min) / eps for a near-equal group


class TokenBatch(NamedTuple):
    """Flat completion tokens for the policy losses of asyncrl.algo.ppo_losses and vaco_loss
    (``ppo_clip_loss(**tb._asdict(), clip_eps=...)``).

    log_prob: [N] log π_θ of each completion token (nats), with gradient.
    behavior_log_prob: [N] log β of the same tokens (nats), from the sampler.
    advantages: [N] the token's sequence advantage times its averaging weight.
    """

    log_prob: Tensor
    behavior_log_prob: Tensor
    advantages: Tensor


def group_advantages(rewards: Tensor, *, scale_by_std: bool = True, eps: float = DEFAULT_EPS) -> Tensor:
    """Group-normalised advantages A_pg = (r_pg - mean_g r_p) [/ (std_g r_p + eps)].

    Args:
        rewards: [P, G] floating, reward of completion g of prompt p.
        scale_by_std: divide by the group's population standard deviation (GRPO); False keeps the
            mean-centred reward only (Dr. GRPO, which finds the division biases toward easy and hard
            questions). TRL's GRPOTrainer uses the Bessel-corrected std; this uses the population std
            (identical up to the factor sqrt(G / (G - 1))).
        eps: >= 0 added to the std (reward units); with eps = 0 a nearly-equal group can give huge |A|.

    Returns:
        [P, G] advantages, same dtype. A group whose rewards are all equal gets exactly 0 (set
        explicitly, not left to rounding), which also covers G = 1.

    Raises:
        ValueError: rewards not a 2-D floating tensor with G >= 1, non-finite rewards, or eps < 0.
    """
    _check_rewards(rewards, eps)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return _normalised(
        rewards, centred, rewards.std(dim=1, unbiased=False, keepdim=True), scale_by_std=scale_by_std, eps=eps
    )


def weight_negatives(advantages: Tensor, negative_weight: float) -> Tensor:
    """Scale the negative advantages: A' = A where A >= 0, negative_weight * A where A < 0.

    1 leaves GRPO's advantages; 0 keeps only the completions above their group's mean, i.e.
    positive-sample reinforcement, PSR (Zhu et al., "The Surprising Effectiveness of Negative
    Reinforcement in LLM Reasoning", arXiv:2506.01347, which splits the objective into positive- and
    negative-sample terms: PSR alone raises Pass@1 and lowers Pass@k at large k; their
    Weighted-REINFORCE instead scales the positive term by 0.1 for Pass@k). With binary rewards the
    negative completions of a group are the wrong ones; a weight below 1 lowers how hard the tokens
    they share with right completions (the operators after a wrong operand, lab/llm-gsm-tiny/README.md) are
    pushed down.

    Args:
        advantages: any shape, floating (reward units, or unitless when scaled by the group's std).
        negative_weight: finite >= 0.

    Returns:
        Same shape and dtype; zeros stay zero (silent groups stay silent).

    Raises:
        ValueError: negative_weight negative or not finite.
    """
    if not 0 <= negative_weight < float("inf"):
        raise ValueError(f"negative_weight must be a finite number >= 0, got {negative_weight}")
    if negative_weight == 1:
        return advantages
    return torch.where(advantages < 0, advantages * negative_weight, advantages)


class RealignedAdvantages(NamedTuple):
    """Output of :func:`realigned_group_advantages` (P prompts, G completions each).

    advantages: [P, G] (r_pg - b_T(x_p)) [/ (σ_w + eps)], reward units (or unitless when scaled).
    baseline_shift: [P] b_T(x_p) - b_β(x_p), reward units: how far realignment moved each baseline.
    weights: [P, G] w_pg = min(ρ̄, π_T(y_pg|x_p) / β(y_pg|x_p)), the truncated sequence weights (not normalised).
    """

    advantages: Tensor
    baseline_shift: Tensor
    weights: Tensor


def realigned_group_advantages(
    rewards: Tensor, log_ratio: Tensor, *, rho_bar: float = 1.0, scale_by_std: bool = True, eps: float = DEFAULT_EPS
) -> RealignedAdvantages:
    """Group advantages against a baseline of the learning policy π_T (advantage realignment without a critic).

    A completion is a one-step episode: prompt x the state, completion y the action, reward r at its end.
    One-step V-trace (arXiv:1802.01561) with ρ = min(ρ̄, π_T(y|x)/β(y|x)) has the target
    v(x) = V(x) + ρ (r - V(x)); the baseline of the group that equals the mean of its own targets,
    Σ_g ρ_g (r_g - b) = 0, is the self-normalised truncated importance-weighted mean

        b_T(x) = Σ_g w_g r_g / Σ_g w_g,   w_g = min(ρ̄, exp(log_ratio_g)),

    a consistent estimate of E_{π_ρ̄}[r | x] with π_ρ̄ ∝ min(ρ̄ β, π_T), the policy V-trace's fixed
    point values (= π_T when ρ̄ >= max π_T/β). The plain group mean b_β estimates E_β[r | x] instead.
    Realigned advantages (VACO's, arXiv:2603.01365: computed once per iteration with π_T, no ρ factor):

        A_g = (r_g - b_T) / (σ_w + eps),   σ_w² = Σ_g w_g (r_g - b_T)² / Σ_g w_g   (weighted population std)

    or A_g = r_g - b_T without ``scale_by_std``. The weights are normalised in log space (a softmax of
    min(log ρ̄, log_ratio)), so very stale completions cannot underflow the sum. A group whose weights
    are all equal (zero lag, or every ratio past ρ̄) has b_T = b_β and σ_w = σ: it is computed exactly as
    :func:`group_advantages`, so at zero lag the result equals that function's bit for bit. A group of
    equal rewards gets exactly 0, as there.

    Args:
        rewards: [P, G] floating, finite.
        log_ratio: [P, G] floating, finite: log π_T(y|x) - log β(y|x) of each completion, nats, summed
            over the tokens the policy chose (:func:`sequence_log_ratio`).
        rho_bar: ρ̄ > 0 (inf: no truncation), the bound on the sequence weight (``algo.rho_bar``).
        scale_by_std, eps: as :func:`group_advantages`.

    Returns:
        :class:`RealignedAdvantages` in the dtype of ``rewards``.

    Raises:
        ValueError: as :func:`group_advantages`; log_ratio not of rewards' shape or not finite; rho_bar
            not > 0.
    """
    _check_rewards(rewards, eps)
    rho_bar = checks.scalar("rho_bar", rho_bar, low=0.0, low_open=True, allow_inf=True)
    if log_ratio.shape != rewards.shape or not log_ratio.is_floating_point():
        raise ValueError(
            f"log_ratio must be a floating tensor of the rewards' shape {tuple(rewards.shape)}, got "
            f"{tuple(log_ratio.shape)} {log_ratio.dtype}"
        )
    if not bool(torch.isfinite(log_ratio).all()):
        raise ValueError("log_ratio must be finite")
    log_w = log_ratio.to(rewards.dtype).clamp(max=math.log(rho_bar))
    p = torch.softmax(log_w, dim=1)  # w_g / Σ w
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # r - b_β
    shift = (p * centred).sum(dim=1, keepdim=True)  # b_T - b_β
    std_w = (p * (centred - shift).square()).sum(dim=1, keepdim=True).sqrt()
    uniform = log_w.amax(dim=1, keepdim=True) == log_w.amin(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    adv = _normalised(
        rewards,
        torch.where(uniform, centred, centred - shift),
        torch.where(uniform, std, std_w),
        scale_by_std=scale_by_std,
        eps=eps,
    )
    return RealignedAdvantages(adv, torch.where(uniform, torch.zeros_like(shift), shift).squeeze(1), log_w.exp())


def sequence_log_ratio(target_log_prob: Tensor, behavior_log_prob: Tensor, policy_mask: Tensor) -> Tensor:
    """log π_T(y|x) - log β(y|x) of each completion: the sum of the token log-ratios over the tokens the
    policy chose (calculator-written tokens are the environment's: probability 1 under both policies).

    Args:
        target_log_prob, behavior_log_prob: [B, L] floating, nats (any value off ``policy_mask``).
        policy_mask: [B, L] bool.

    Returns:
        [B] in the dtype of target_log_prob; 0 for a row without a policy token.

    Raises:
        ValueError: a bad mask, or log-prob shapes that differ from it.
    """
    _check_mask(policy_mask)
    for name, t in (("target_log_prob", target_log_prob), ("behavior_log_prob", behavior_log_prob)):
        if t.shape != policy_mask.shape:
            raise ValueError(f"{name} is {tuple(t.shape)}, policy_mask is {tuple(policy_mask.shape)}")
    diff = target_log_prob - behavior_log_prob.to(target_log_prob.dtype)
    return torch.where(policy_mask, diff, torch.zeros((), dtype=diff.dtype)).sum(dim=1)


def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ || π_ref): exp(d) - d - 1 with d = log π_ref - log π_θ (nats).

    Schulman, "Approximating KL divergence" (2020); GRPO's penalty, DeepSeekMath arXiv:2402.03300 eq. 4.
    Non-negative, 0 where π_θ = π_ref; its gradient with respect to log π_θ is 1 - π_ref/π_θ. d is
    clamped to ±20 (asyncrl.algo.policy_loss.LOG_RATIO_CLAMP) before exp; past the clamp the gradient is 0.
    With tokens sampled by β rather than π_θ it is the off-policy estimate GRPO uses too.

    Args:
        log_prob: [N] log π_θ of the tokens (with gradient).
        ref_log_prob: [N] log π_ref of the same tokens (detached here).

    Returns:
        [N] per-token estimates, dtype of log_prob.

    Raises:
        ValueError: shapes differ or are not non-empty 1-D floating.
    """
    checks.tensors(dims=1, floating=True, log_prob=log_prob, ref_log_prob=ref_log_prob)
    d = (ref_log_prob.detach().to(log_prob.dtype) - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


def token_advantages(advantages: Tensor, completion_mask: Tensor) -> Tensor:
    """Broadcast each completion's advantage over its tokens.

    Args:
        advantages: [P, G] (or [B]) sequence advantages.
        completion_mask: [B, L] bool, B = P * G, True on completion tokens.

    Returns:
        [B, L] token advantages: A_b on the row's completion tokens, 0 on padding (padding tokens get
        no advantage; :func:`flatten_tokens` drops them anyway).

    Raises:
        ValueError: completion_mask not [B, L] bool, or advantages.numel() != B.
    """
    _check_mask(completion_mask)
    if advantages.numel() != completion_mask.shape[0]:
        raise ValueError(f"{advantages.numel()} advantages for {completion_mask.shape[0]} completions")
    adv = advantages.reshape(-1, 1)
    return torch.where(completion_mask, adv.expand(completion_mask.shape), torch.zeros((), dtype=adv.dtype))


def token_weights(completion_mask: Tensor, *, averaging: str = "token", max_len: int | None = None) -> Tensor:
    """Per-token weights that turn the plain token mean into the chosen average (module docstring).

    Args:
        completion_mask: [B, L] bool.
        averaging: "token", "sequence" or "constant".
        max_len: L_max for "constant" (the generation budget, >= every row's length); default L.

    Returns:
        [B, L] float32 weights (0 on padding). The mean of the weights over the N tokens is 1 for
        "token" and "sequence"; for "constant" it is (mean row length) / L_max.

    Raises:
        ValueError: unknown averaging, a bad mask, no token at all, or max_len shorter than a row.
    """
    _check_mask(completion_mask)
    if averaging not in AVERAGING:
        raise ValueError(f"averaging must be one of {AVERAGING}, got {averaging!r}")
    m = completion_mask.to(torch.float32)
    lengths = m.sum(dim=1, keepdim=True)  # [B, 1] L_b
    n = float(lengths.sum())
    rows = float((lengths > 0).sum())  # B'
    if n == 0:
        raise ValueError("completion_mask has no completion token")
    if averaging == "token":
        return m
    if averaging == "sequence":
        return m * n / (rows * lengths.clamp(min=1.0))
    l_max = completion_mask.shape[1] if max_len is None else int(max_len)
    if l_max < float(lengths.max()):
        raise ValueError(f"max_len {l_max} is shorter than the longest completion ({int(lengths.max())})")
    return m * n / (rows * l_max)


def flatten_tokens(
    completion_mask: Tensor,
    *,
    log_prob: Tensor,
    behavior_log_prob: Tensor,
    advantages: Tensor,
    averaging: str = "token",
    max_len: int | None = None,
) -> TokenBatch:
    """The flat [N] tensors of asyncrl.algo's policy losses from [B, L] token tensors and sequence advantages.

    Args:
        completion_mask: [B, L] bool.
        log_prob: [B, L] log π_θ per token (from completion_log_probs; keeps its gradient).
        behavior_log_prob: [B, L] sampler log-probs.
        advantages: [P, G] or [B] sequence advantages (e.g. :func:`group_advantages`).
        averaging, max_len: see :func:`token_weights`.

    Returns:
        :class:`TokenBatch` of [N] tensors in row-major token order (row 0's tokens first).

    Raises:
        ValueError: shapes that differ from completion_mask, or as :func:`token_weights`.
    """
    for name, t in (("log_prob", log_prob), ("behavior_log_prob", behavior_log_prob)):
        if t.shape != completion_mask.shape:
            raise ValueError(f"{name} is {tuple(t.shape)}, completion_mask is {tuple(completion_mask.shape)}")
    adv = token_advantages(advantages.to(log_prob.dtype), completion_mask)
    w = token_weights(completion_mask, averaging=averaging, max_len=max_len).to(log_prob.dtype)
    return TokenBatch(
        log_prob[completion_mask], behavior_log_prob[completion_mask].detach(), (adv * w)[completion_mask].detach()
    )


def _check_rewards(rewards: Tensor, eps: float) -> None:
    if rewards.dim() != 2 or not rewards.is_floating_point() or rewards.numel() == 0:
        raise ValueError(
            f"rewards must be a non-empty [P, G] floating tensor, got {tuple(rewards.shape)} {rewards.dtype}"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def _normalised(rewards: Tensor, centred: Tensor, std: Tensor, *, scale_by_std: bool, eps: float) -> Tensor:
    """centred [/ (std + eps)]; exactly 0 in a group of equal rewards."""
    if scale_by_std:
        centred = centred / (std + eps)
    equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(equal, torch.zeros_like(centred), centred)


def _check_mask(completion_mask: Tensor) -> None:
    if completion_mask.dim() != 2 or completion_mask.dtype != torch.bool:
        raise ValueError(
            f"completion_mask must be a [B, L] bool tensor, got {tuple(completion_mask.shape)} {completion_mask.dtype}"
        )
