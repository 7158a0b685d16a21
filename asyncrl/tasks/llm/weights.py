"""The llm task's weights on the wire: the parameters that travel (every distinct parameter of the causal
LM, tied embeddings once, in module order; with LoRA only the adapter's, :mod:`asyncrl.tasks.llm.lora`)
as one flat buffer in the wire dtype, its inverse, and the hash of the layout that actors check before
loading one.

The wire dtype (``learner.weights_dtype``): float32, float16, or bfloat16, carried as the raw 16-bit
patterns (uint16: numpy has no bfloat16; asyncrl.wire.codec.PAYLOAD_DTYPES); "auto" is bfloat16 when the
learner trains in bf16 (``learner.precision``), else float32. A generator loads the buffer into its model's
own dtype (float32: the bfloat16 values exactly). Why: docs/decisions/llm-weights.md.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from asyncrl.tasks.base import WeightsInfo
from asyncrl.tasks.llm import lora

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def wire_dtype(cfg) -> str:
    """The element type of the llm task's weights on the wire: ``learner.weights_dtype``, with "auto"
    resolved (bfloat16 when ``learner.precision`` is bf16, else float32)."""
    name = cfg.learner.weights_dtype
    if name == "auto":
        return "bfloat16" if cfg.learner.precision == "bf16" else "float32"
    return name


def param_layout(model) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of every parameter that travels, in module order: every distinct one (tied
    weights once), or, for a peft model, the adapter's (names with ``lora_``, peft's own rule for a
    LoRA state dict)."""
    if lora.is_adapted(model):
        return [(k, p) for k, p in model.named_parameters() if "lora_" in k]
    return list(model.named_parameters())


def flat_weights(model, dtype: str = "float32") -> np.ndarray:
    """The parameters of :func:`param_layout` as one contiguous [P] array of the wire ``dtype``:
    float32, float16, or bfloat16 as uint16 bit patterns (the broadcaster's payload).

    Raises ValueError if a weight overflows the wire dtype (float16: |w| > 65504; bfloat16: |w| rounds
    above 3.3895e38), which the broadcaster would refuse as non-finite, version after version."""
    flat = torch.cat([p.detach().reshape(-1).to(TORCH_DTYPES[dtype]) for _, p in param_layout(model)]).cpu()
    if dtype != "float32" and not bool(torch.isfinite(flat).all()):
        other = "bfloat16 or float32" if dtype == "float16" else "float32"
        raise ValueError(
            f"a weight overflows {dtype} (|w| > {torch.finfo(TORCH_DTYPES[dtype]).max:.5g}): "
            f"use learner.weights_dtype = {other}"
        )
    if dtype == "bfloat16":
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


def _as_tensor(part: np.ndarray) -> torch.Tensor:
    """A torch copy of a slice of a flat buffer, in its wire dtype (uint16: bfloat16 bit patterns)."""
    if part.dtype == np.uint16:
        return torch.from_numpy(part.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(part))  # a copy: received buffers are read-only


def load_flat(model, flat: np.ndarray) -> None:
    """Inverse of :func:`flat_weights`, into the model's own dtype (one parameter at a time: no
    second copy of the whole buffer). Raises ValueError if the size or element type does not match."""
    params = param_layout(model)
    total = sum(p.numel() for _, p in params)
    if flat.ndim != 1 or flat.size != total:
        raise ValueError(f"flat weights have shape {flat.shape}, expected ({total},)")
    if flat.dtype not in (np.float32, np.float16, np.uint16):
        raise ValueError(f"flat weights of {flat.dtype}: float32, float16 or bfloat16 bits (uint16) expected")
    off = 0
    with torch.no_grad():
        for _, p in params:
            p.copy_(_as_tensor(flat[off : off + p.numel()]).view_as(p))
            off += p.numel()


def layout_hash(model, dtype: str = "float32") -> str:
    """16 hex digits naming the flat buffer's parameters, shapes, order and (when not float32) dtype."""
    text = ";".join(f"{k}:{tuple(p.shape)}" for k, p in param_layout(model))
    if dtype != "float32":  # float32 layouts keep the hash they had before the wire dtype existed
        text += f";dtype={dtype}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_info(model, cfg) -> WeightsInfo:
    """What one published version of ``model`` carries under ``cfg``'s settings."""
    count = sum(p.numel() for _, p in param_layout(model))
    llm = cfg.llm
    if lora.is_adapted(model):
        targets = ", ".join(llm.lora_target_modules)
        holds = f"the LoRA adapter (rank {llm.lora_rank}, alpha {llm.lora_alpha:g}, on {targets})"
    else:
        holds = "every parameter"
    return WeightsInfo(count, wire_dtype(cfg), holds)
