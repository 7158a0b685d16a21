"""The learner's policy one version before its own, π_{T-1}, for ``algo.ratio_anchor = "previous"``
(:func:`asyncrl.algo.vaco_loss.previous_anchor_log_prob`; docs/decisions/learning-anchor.md).

Two modules of the task's policy are kept and swapped: before iteration T the learner's weights and
buffers (observation statistics included: π_T exactly as it was published as version T) are copied
into the spare, the iteration reads the other (π_{T-1}), and after it the two swap. Nothing is built
or copied for any other anchor. Checkpoints and a learner group's start carry π_{T-1}, so a resumed
run and every member compute the same anchor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class PreviousPolicy:
    """π_{T-1} of a learner. ``build()`` makes a fresh policy module on the learner's device."""

    def __init__(self, build: Callable[[], torch.nn.Module]):
        self._build = build
        self.module: torch.nn.Module | None = None  # π_{T-1}; None before the second iteration
        self._spare: torch.nn.Module | None = None

    def _new(self) -> torch.nn.Module:
        module = self._build()
        module.requires_grad_(False)
        return module

    def start(self, policy: torch.nn.Module) -> torch.nn.Module | None:
        """Before an iteration: keep ``policy`` (π_T) for the next one; returns π_{T-1} or None."""
        if self._spare is None:
            self._spare = self._new()
        with torch.no_grad():
            self._spare.load_state_dict(policy.state_dict())
        return self.module

    def finish(self) -> None:
        """After the iteration: π_T becomes the previous policy of the next."""
        self.module, self._spare = self._spare, self.module

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        return None if self.module is None else self.module.state_dict()

    def load_state_dict(self, d: dict[str, torch.Tensor] | None) -> None:
        """Inverse of :meth:`state_dict` (None: no π_{T-1}, as at the start of a run)."""
        if d is None:
            self.module = None
            return
        if self.module is None:
            self.module = self._new()
        self.module.load_state_dict(d)
