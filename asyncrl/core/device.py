"""Where the learner (and the llm task's generator actors) compute: the device check, moving a batch,
and the optional bf16 autocast of the learner's forward passes.

The CPU path is today's computation, untouched: :func:`to_device` returns the batch itself and
:func:`forward_context` a no-op context for ``cpu`` with ``fp32``, so CPU runs stay bit-identical.

bf16 (``learner.precision = "bf16"``): only the network forward passes run under
``torch.autocast(dtype=torch.bfloat16)``: the matrix products of the MLPs (control) or of the
transformer (llm) in bf16, with autocast's own float32 list (softmax, log_softmax, norms, exp, ...)
kept in float32. The log-probs and values they give are cast to float32 before any ratio,
advantage or loss; the loss, its backward pass, the gradient clipping, Adam and the weights stay
float32 (autocast is not mixed-precision weights: the parameters are float32 throughout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import torch

from asyncrl.core.config import DEVICE_RE, PRECISIONS, ConfigError


def check_device(device: str, precision: str = "fp32", *, key: str = "learner.device") -> torch.device:
    """The torch device of ``device`` ("cpu", "cuda", "cuda:N") if this machine has it.

    Raises:
        ConfigError: a malformed name, cuda asked for where torch sees no CUDA device (or not
            device N), or ``precision`` bf16 on a CUDA device without bf16 support. One line,
            naming ``key``.
    """
    if not DEVICE_RE.fullmatch(device):
        raise ConfigError(f"{key} must be cpu, cuda or cuda:N, got {device!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"learner.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{key} = {device}, but torch {torch.__version__} sees no CUDA device on this machine; use {key}=cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{key} = {device}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError(
                f"learner.precision = bf16, but {torch.cuda.get_device_name(dev)} does not support "
                f"bf16; use learner.precision=fp32"
            )
    return dev


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on ``device`` (the batch itself, not a copy, when it is there already)."""
    if all(t.device == device for t in batch.values()):
        return batch
    return {k: t.to(device, non_blocking=True) for k, t in batch.items()}


def forward_context(device: torch.device, precision: str) -> Callable[[], ContextManager]:
    """A factory of the context the learner's forward passes run in: bf16 autocast on ``device``'s
    type for ``precision`` "bf16", else a no-op (see the module docstring for what runs in bf16)."""
    if precision == "bf16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext
