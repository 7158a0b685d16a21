"""Input checks shared by the algo modules: every failure is a ValueError naming the argument."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def shape_of(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def tensors(*, dims: int | None = None, floating: bool = False, same_dtype: bool = False, **named) -> None:
    """Each argument is a non-empty tensor (with ``dims`` dimensions when given); all share one
    shape; with ``floating`` they are floating point, with ``same_dtype`` of one dtype."""
    first = ref = None
    for name, x in named.items():
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if dims is not None and (x.dim() != dims or x.shape[0] < 1):
            want = {1: "[N] with N >= 1", 2: "[T, B] with T >= 1"}.get(dims, f"{dims}-D")
            raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
        if x.numel() == 0:
            raise ValueError(f"{name} is empty")
        if ref is None:
            first, ref = name, x
        elif x.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(ref.shape)} (the shape of {first})")
    if floating and same_dtype:
        floats(**named)
    elif floating:
        for name, x in named.items():
            floats(**{name: x})


def samples(**named) -> None:
    """Flat minibatch inputs of a policy loss: each a non-empty [N] floating tensor, one shape and one
    dtype for all (:func:`tensors` with dims=1, floating, same_dtype)."""
    tensors(dims=1, floating=True, same_dtype=True, **named)


def floats(**named: Tensor) -> None:
    """Floating-point tensors of one dtype."""
    dtype = first = None
    for name, x in named.items():
        if not x.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
        if dtype is None:
            dtype, first = x.dtype, name
        elif x.dtype != dtype:
            raise ValueError(f"{name} has dtype {x.dtype}, expected {dtype} (that of {first})")


def bools(**named: Tensor) -> None:
    for name, x in named.items():
        if x.dtype != torch.bool:
            raise ValueError(f"{name} must be a bool tensor, got {x.dtype}")


def scalar(
    name: str, x, *, low: float, high: float | None = None, low_open: bool = False, allow_inf: bool = False
) -> float:
    """A real number in [low, high] ((low, high] with ``low_open``); NaN and bools are refused,
    inf only with ``allow_inf``."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a real number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} must be a real number, got {x!r}") from err
    too_high = high is not None and v > high
    if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < low or (low_open and v == low) or too_high:
        bound = f"in [{low}, {high}]" if high is not None else (f"> {low}" if low_open else f">= {low}")
        raise ValueError(f"{name} must be {bound}{' (inf allowed)' if allow_inf else ''}, got {x!r}")
    return v
