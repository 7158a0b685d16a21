"""GRPO math on token rollouts, pure torch: group-normalised advantages, their broadcast over completion
tokens, loss-averaging weights, and the flattening into the flat [N] tensors that
:mod:`asyncrl.algo.losses` takes, so that

    GRPO = :func:`asyncrl.algo.losses.ppo_clip_loss` on token ratios π_θ(y_t|x, y_<t) / β(y_t|x, y_<t)
    VACO on tokens = :func:`asyncrl.algo.losses.vaco_policy_loss` on the same tensors.

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

The diagnostics the losses return (tv_estimate, clip_fraction, approx_kl) stay unweighted token means.

Paper: DeepSeekMath (GRPO), arXiv:2402.03300; Dr. GRPO, arXiv:2503.20783.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

AVERAGING = ("token", "sequence", "constant")
DEFAULT_EPS = 1e-4   # added to the group std: bounds |A| by (max - min) / eps for a near-equal group


class TokenBatch(NamedTuple):
    """Flat completion tokens for asyncrl.algo.losses (``ppo_clip_loss(**tb._asdict(), clip_eps=...)``).

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
    if rewards.dim() != 2 or not rewards.is_floating_point() or rewards.numel() == 0:
        raise ValueError(f"rewards must be a non-empty [P, G] floating tensor, got {tuple(rewards.shape)} "
                         f"{rewards.dtype}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_by_std:
        centred = centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)
    equal = (rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True))
    return torch.where(equal, torch.zeros_like(centred), centred)


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
    lengths = m.sum(dim=1, keepdim=True)   # [B, 1] L_b
    n = float(lengths.sum())
    rows = float((lengths > 0).sum())      # B'
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


def flatten_tokens(completion_mask: Tensor, *, log_prob: Tensor, behavior_log_prob: Tensor,
                   advantages: Tensor, averaging: str = "token", max_len: int | None = None) -> TokenBatch:
    """The flat [N] tensors of asyncrl.algo.losses from [B, L] token tensors and sequence advantages.

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
    return TokenBatch(log_prob[completion_mask], behavior_log_prob[completion_mask].detach(),
                      (adv * w)[completion_mask].detach())


def _check_mask(completion_mask: Tensor) -> None:
    if completion_mask.dim() != 2 or completion_mask.dtype != torch.bool:
        raise ValueError(f"completion_mask must be a [B, L] bool tensor, got {tuple(completion_mask.shape)} "
                         f"{completion_mask.dtype}")
