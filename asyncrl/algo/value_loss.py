"""The critic's loss (squared error to the value targets: V-trace's vs in VACO, arXiv:2603.01365, or
GAE's λ-returns) and the explained-variance diagnostic."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.algo import checks


def value_loss(*, values: Tensor, targets: Tensor) -> Tensor:
    """Squared-error critic loss, mean (values - targets)^2; targets are detached.

    Args:
        values: [N] (or any shape) V(s_i), with gradient (reward units).
        targets: same shape, value targets (vs for V-trace, λ-returns for GAE).

    Returns:
        0-dim tensor (reward units squared). No 1/2 factor: scale with value_coef.

    Raises:
        ValueError: shapes differ, are empty, dtypes differ, or not floating.

    Paper: VACO, arXiv:2603.01365 (critic regresses to the V-trace targets vs).
    """
    checks.tensors(floating=True, same_dtype=True, values=values, targets=targets)
    return torch.mean((values - targets.detach()) ** 2)


def explained_variance(*, values: Tensor, targets: Tensor) -> float:
    """1 - Var[targets - values] / Var[targets] (population variances), a critic diagnostic.

    Args:
        values: [N] (or any shape) predictions V(s_i).
        targets: same shape, value targets.

    Returns:
        Python float in (-inf, 1]; 1 is a perfect fit; NaN when Var[targets] == 0.

    Raises:
        ValueError: shapes differ, are empty, dtypes differ, or not floating.

    Paper: diagnostic only (as logged by PPO implementations, arXiv:1707.06347).
    """
    checks.tensors(floating=True, same_dtype=True, values=values, targets=targets)
    with torch.no_grad():
        var_t = torch.var(targets, unbiased=False).item()
        if var_t == 0.0:
            return math.nan
        return 1.0 - torch.var(targets - values, unbiased=False).item() / var_t
