"""Action distributions of the policy, written out directly (no torch.distributions overhead).

Continuous actions: diagonal Gaussian with (usually state-independent) log-std; the actor stores
the *unclipped* sample and its log-prob, and clips only the copy sent to the env
(docs/vaco-paper.md, "Continuous actions").
Discrete actions: categorical over K logits. Both go through the same losses via log_prob [N].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.algo import checks

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class DiagGaussian:
    """Diagonal Gaussian N(mean, diag(exp(log_std)^2)) over A-dimensional actions.

    Args:
        mean: [N, A] floating, action means (action units).
        log_std: [A] (state-independent, broadcast over N) or [N, A], log standard deviations
            (log action units); same dtype as mean.

    Raises:
        ValueError: mean is not [N, A]; log_std is neither [A] nor [N, A]; dtypes differ or are
            not floating.

    Formulas: the Gaussian policy of PPO's continuous-control experiments, arXiv:1707.06347.
    """

    def __init__(self, mean: Tensor, log_std: Tensor):
        if not isinstance(mean, Tensor) or mean.dim() != 2:
            raise ValueError(f"mean must be a [N, A] tensor, got {checks.shape_of(mean)}")
        if not isinstance(log_std, Tensor) or log_std.shape not in (mean.shape[1:], mean.shape):
            raise ValueError(
                f"log_std must be [A] or [N, A] with mean {tuple(mean.shape)}, got {checks.shape_of(log_std)}"
            )
        checks.floats(mean=mean, log_std=log_std)
        self.mean = mean
        self.log_std = log_std

    def log_prob(self, actions: Tensor) -> Tensor:
        """log density of actions [N, A] (unclipped, action units) -> [N] (nats).

        Raises:
            ValueError: actions shape differs from mean's or dtype differs.
        """
        if not isinstance(actions, Tensor) or actions.shape != self.mean.shape:
            raise ValueError(f"actions must have shape {tuple(self.mean.shape)}, got {checks.shape_of(actions)}")
        checks.floats(mean=self.mean, actions=actions)
        z = (actions - self.mean) * torch.exp(-self.log_std)
        per_dim = -0.5 * z * z - self.log_std - _HALF_LOG_2PI
        return per_dim.sum(-1)

    def entropy(self) -> Tensor:
        """Differential entropy -> [N] (nats): sum_a (1/2 + log(2π)/2 + log_std_a)."""
        per_dim = (0.5 + _HALF_LOG_2PI) + self.log_std
        return per_dim.expand_as(self.mean).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Detached sample [N, A]: mean + exp(log_std) * ε, ε ~ N(0, I) from ``generator``."""
        with torch.no_grad():
            eps = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype, device=self.mean.device)
            return self.mean + torch.exp(self.log_std) * eps

    def mode(self) -> Tensor:
        """Most likely action [N, A] (the mean), detached."""
        return self.mean.detach()


class Categorical:
    """Categorical distribution over K actions.

    Args:
        logits: [N, K] floating, unnormalised log-probabilities (nats); -inf masks an action.

    Raises:
        ValueError: logits are not [N, K] with K >= 1, or not floating.

    Formulas: the softmax policy of A3C/IMPALA, arXiv:1802.01561.
    """

    def __init__(self, logits: Tensor):
        if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[1] < 1:
            raise ValueError(f"logits must be a [N, K] tensor with K >= 1, got {checks.shape_of(logits)}")
        checks.floats(logits=logits)
        self.logits = logits
        self.log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, K]

    def log_prob(self, actions: Tensor) -> Tensor:
        """log-probability of action indices [N] (integer, in [0, K)) -> [N] (nats).

        Raises:
            ValueError: actions are not an integer [N] tensor, or an index is outside [0, K).
        """
        n, k = self.logits.shape
        if not isinstance(actions, Tensor) or actions.shape != (n,):
            raise ValueError(f"actions must have shape ({n},), got {checks.shape_of(actions)}")
        if actions.is_floating_point() or actions.is_complex() or actions.dtype == torch.bool:
            raise ValueError(f"actions must be an integer tensor, got {actions.dtype}")
        if n and (int(actions.min()) < 0 or int(actions.max()) >= k):
            raise ValueError(f"actions must lie in [0, {k}), got range [{int(actions.min())}, {int(actions.max())}]")
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> Tensor:
        """Entropy -> [N] (nats): -sum_k p_k log p_k, with 0 log 0 = 0 for masked actions."""
        log_p = torch.clamp(self.log_probs, min=torch.finfo(self.log_probs.dtype).min)
        return -(torch.exp(self.log_probs) * log_p).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Detached int64 action indices [N] drawn from ``generator``."""
        with torch.no_grad():
            probs = torch.exp(self.log_probs)
            return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def mode(self) -> Tensor:
        """Most likely action indices [N] (int64, first on ties)."""
        return torch.argmax(self.logits.detach(), dim=-1)
