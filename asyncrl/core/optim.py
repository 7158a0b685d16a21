"""The learner's optimizer: Adam that never takes a non-finite step."""

from __future__ import annotations

import torch


class GuardedAdam(torch.optim.Adam):
    """Adam that skips a step whose gradients are not all finite (a NaN or inf loss, an overflow),
    leaving parameters and moments untouched; ``skipped`` counts skipped steps, ``consecutive``
    the current run of them (reset by the next good step).

    ``step(grad_norm=n)`` takes the gradients' global norm when the caller has it already (as
    :func:`asyncrl.core.iteration.optimizer_step` has from gradient clipping, before the clip): the step is
    skipped when ``n`` is not finite. Without it the norm is computed here."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.skipped = self.consecutive = 0

    def step(self, closure=None, *, grad_norm: torch.Tensor | None = None):
        if grad_norm is None:
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
        if grad_norm is not None and not bool(torch.isfinite(grad_norm)):
            self.skipped += 1
            self.consecutive += 1
            return None
        self.consecutive = 0
        return super().step(closure)
