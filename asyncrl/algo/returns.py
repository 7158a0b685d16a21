"""Value targets and advantages over time-major rollouts [T, B].

Index convention (docs/vaco-paper.md): ``rewards[t]`` follows ``actions[t]`` taken in ``obs[t]``;
``values[t] = V(obs[t])`` for t < T. The value of the state *after* step t is ``next_values[t]``
(V'_t), built once by :func:`next_state_values` so that termination (bootstrap 0) and truncation
(bootstrap V(final_obs)) are decided in one place and no trace ever crosses an episode end.

Everything here is plain differentiable torch: nothing is detached inside. Value targets and
advantages are constants of a learner iteration, so pass detached inputs (or call under
``torch.no_grad()``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from asyncrl.algo import checks


class RealignedReturns(NamedTuple):
    """Output of :func:`realigned_returns`; every field is [T, B] in the dtype of ``values``.

    vs: value targets (reward units): V-trace's targets with ``traces="vtrace"``; with
        ``traces="uncorrected"`` the λ-targets of the uncorrected traces (not V-trace's, not a
        contraction under lag: the learner takes the critic's targets from a ``"vtrace"`` call).
    advantages: VACO's realigned advantages A_t (no rho factor; arXiv:2603.01365).
    pg_advantages: IMPALA's policy-gradient advantages r_t + γ vs_{t+1} - V(s_t) (no rho factor;
        arXiv:1802.01561), with vs_{t+1} replaced by V'_t at an episode end and at t = T-1.
    clipped_rhos: min(rho_bar, π_T/β), the importance weights used in the trace.
    """

    vs: Tensor
    advantages: Tensor
    pg_advantages: Tensor
    clipped_rhos: Tensor


class GAEReturns(NamedTuple):
    """Output of :func:`gae`; both fields [T, B].

    advantages: GAE(λ) advantages (reward units).
    returns: λ-returns, advantages + values (the critic's regression target).
    """

    advantages: Tensor
    returns: Tensor


def next_state_values(*, values_tp1: Tensor, final_values: Tensor, terminated: Tensor, truncated: Tensor) -> Tensor:
    """V'_t: the value of the state reached by step t, with episode ends applied.

    Args:
        values_tp1: [T, B] V(obs[t+1]); row T-1 is V(obs[T]), the bootstrap of the rollout.
        final_values: [T, B] V(final_obs[t]); read only where ``truncated`` (other entries may
            hold anything, NaN included: they are never selected).
        terminated: [T, B] bool, the episode ended in a terminal state at step t.
        truncated: [T, B] bool, the episode was cut (time limit) at step t.

    Returns:
        [T, B] V'_t = values_tp1[t], replaced by final_values[t] where truncated and by 0 where
        terminated (terminated wins where both are set). Same dtype as ``values_tp1``.

    Raises:
        ValueError: shapes differ or are not [T, B]; flags are not bool; value dtypes differ or
            are not floating point.

    Paper: VACO arXiv:2603.01365 (definition of V'_t in its V-trace; docs/vaco-paper.md, "Component 1").
    """
    checks.tensors(dims=2, values_tp1=values_tp1, final_values=final_values, terminated=terminated, truncated=truncated)
    checks.floats(values_tp1=values_tp1, final_values=final_values)
    checks.bools(terminated=terminated, truncated=truncated)
    out = torch.where(truncated, final_values, values_tp1)
    return torch.where(terminated, torch.zeros_like(out), out)


def realigned_returns(
    *,
    behavior_log_prob: Tensor,
    target_log_prob: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    episode_end: Tensor,
    gamma: float,
    lam: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    traces: str = "vtrace",
) -> RealignedReturns:
    """Returns realigned to the learning policy π_T from β's data: V-trace (``traces="vtrace"``, the
    critic's targets and the paper's realigned advantages) or the realignment with uncorrected traces
    (``traces="uncorrected"``, the advantages of vaco and vaco_no_filter).

    With log_rho_t = target_log_prob - behavior_log_prob, rho_t = min(rho_bar, e^log_rho_t),
    c_t = lam * min(c_bar, e^log_rho_t) (``traces="vtrace"``) or c_t = lam (``traces="uncorrected"``:
    the trace is not importance-weighted, so its reach does not shrink with the lag; the TD errors
    keep their weights rho_t), delta_t = r_t + γ V'_t - V(s_t), end_t = episode_end:

        vs_t - V(s_t) = rho_t delta_t + γ c_t (1 - end_t) (vs_{t+1} - V(s_{t+1}))
        advantages_t  = delta_t + γ lam (1 - end_t) (vs_{t+1} - V(s_{t+1}))
        pg_advantages_t = delta_t + γ (1 - end_t) (vs_{t+1} - V(s_{t+1}))

    with (vs_T - V(s_T)) = 0: the rollout's last step bootstraps from V'_{T-1} alone. When
    β = π_T and rho_bar = c_bar = 1, vs are the λ-returns and advantages equal GAE(λ).

    Args:
        behavior_log_prob: [T, B] log β(a_t|s_t) (nats), stored by the actor.
        target_log_prob: [T, B] log π_T(a_t|s_t) (nats), learner weights at iteration start.
        rewards: [T, B] r_t (reward units).
        values: [T, B] V(s_t).
        next_values: [T, B] V'_t from :func:`next_state_values`.
        episode_end: [T, B] bool, terminated | truncated at step t.
        gamma: discount, in [0, 1].
        lam: λ of the trace, in [0, 1].
        rho_bar: ρ̄ > 0 (may be inf), clip of the importance weight in the TD term.
        c_bar: c̄ > 0 (may be inf), clip of the trace coefficient (``traces="vtrace"`` only).
        traces: "vtrace" (Espeholt et al.) or "uncorrected" (c_t = λ, as Peng's Q(λ) and GAE;
            Kozuno et al., arXiv:2103.00107).

    Returns:
        :class:`RealignedReturns`, every field [T, B] in the dtype of ``values``.

    Raises:
        ValueError: shapes differ or are not [T, B] with T >= 1; episode_end is not bool;
            floating inputs differ in dtype; a scalar is out of range or NaN.

    Papers: V-trace, Espeholt et al., arXiv:1802.01561; realigned advantages, VACO,
    arXiv:2603.01365.
    """
    checks.tensors(
        dims=2,
        behavior_log_prob=behavior_log_prob,
        target_log_prob=target_log_prob,
        rewards=rewards,
        values=values,
        next_values=next_values,
        episode_end=episode_end,
    )
    checks.floats(
        behavior_log_prob=behavior_log_prob,
        target_log_prob=target_log_prob,
        rewards=rewards,
        values=values,
        next_values=next_values,
    )
    checks.bools(episode_end=episode_end)
    gamma = checks.scalar("gamma", gamma, low=0.0, high=1.0)
    lam = checks.scalar("lam", lam, low=0.0, high=1.0)
    rho_bar = checks.scalar("rho_bar", rho_bar, low=0.0, low_open=True, allow_inf=True)
    c_bar = checks.scalar("c_bar", c_bar, low=0.0, low_open=True, allow_inf=True)
    if traces not in ("vtrace", "uncorrected"):
        raise ValueError(f"traces must be 'vtrace' or 'uncorrected', got {traces!r}")

    rhos = torch.exp(target_log_prob - behavior_log_prob)  # overflow to inf is clipped below
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = lam * torch.clamp(rhos, max=c_bar) if traces == "vtrace" else torch.full_like(rhos, lam)
    not_end = (~episode_end).to(values.dtype)
    deltas = rewards + gamma * next_values - values
    diffs = _discounted_backward(clipped_rhos * deltas, gamma * cs * not_end)  # vs - V
    next_diffs = torch.cat([diffs[1:], torch.zeros_like(diffs[:1])])
    advantages = deltas + gamma * lam * not_end * next_diffs
    pg_advantages = deltas + gamma * not_end * next_diffs
    return RealignedReturns(values + diffs, advantages, pg_advantages, clipped_rhos)


def gae(
    *, rewards: Tensor, values: Tensor, next_values: Tensor, episode_end: Tensor, gamma: float, lam: float
) -> GAEReturns:
    """Generalised advantage estimation, no off-policy correction.

        delta_t = r_t + γ V'_t - V(s_t);  A_t = delta_t + γ λ (1 - end_t) A_{t+1};  A_T = 0

    Args:
        rewards: [T, B] r_t (reward units).
        values: [T, B] V(s_t).
        next_values: [T, B] V'_t from :func:`next_state_values`.
        episode_end: [T, B] bool, terminated | truncated at step t.
        gamma: discount, in [0, 1].
        lam: λ, in [0, 1].

    Returns:
        :class:`GAEReturns` (advantages, returns = advantages + values), both [T, B].

    Raises:
        ValueError: shapes differ or are not [T, B] with T >= 1; episode_end is not bool;
            floating inputs differ in dtype; a scalar is out of range or NaN.

    Paper: Schulman et al., arXiv:1506.02438.
    """
    checks.tensors(dims=2, rewards=rewards, values=values, next_values=next_values, episode_end=episode_end)
    checks.floats(rewards=rewards, values=values, next_values=next_values)
    checks.bools(episode_end=episode_end)
    gamma = checks.scalar("gamma", gamma, low=0.0, high=1.0)
    lam = checks.scalar("lam", lam, low=0.0, high=1.0)
    not_end = (~episode_end).to(values.dtype)
    deltas = rewards + gamma * next_values - values
    advantages = _discounted_backward(deltas, gamma * lam * not_end)
    return GAEReturns(advantages, advantages + values)


def _discounted_backward(x: Tensor, coef: Tensor) -> Tensor:
    """y_t = x_t + coef_t y_{t+1}, y_T = 0, over [T, B] (stack keeps autograd intact)."""
    acc = torch.zeros_like(x[0])
    out = [acc] * x.shape[0]
    for t in range(x.shape[0] - 1, -1, -1):
        acc = x[t] + coef[t] * acc
        out[t] = acc
    return torch.stack(out)
