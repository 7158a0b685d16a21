"""The llm task's weights on the wire: every distinct parameter of the causal LM (tied embeddings once),
in module order, as one flat float32 buffer (the broadcaster's payload, as the control policy's), its
inverse, and the hash of the layout that actors check before loading one."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def param_layout(model) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of every distinct parameter (tied weights once), in module order."""
    return list(model.named_parameters())


def flat_weights(model) -> np.ndarray:
    """Every parameter as one contiguous float32 array [P] (the broadcaster's payload)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for _, p in param_layout(model)]).cpu().numpy()


def load_flat(model, flat: np.ndarray) -> None:
    """Inverse of :func:`flat_weights`. Raises ValueError if the size does not match."""
    params = param_layout(model)
    total = sum(p.numel() for _, p in params)
    if flat.ndim != 1 or flat.size != total:
        raise ValueError(f"flat weights have shape {flat.shape}, expected ({total},)")
    src = torch.from_numpy(np.array(flat, np.float32))  # a copy: received buffers are read-only
    off = 0
    with torch.no_grad():
        for _, p in params:
            p.copy_(src[off : off + p.numel()].view_as(p))
            off += p.numel()


def layout_hash(model) -> str:
    text = ";".join(f"{k}:{tuple(p.shape)}" for k, p in param_layout(model))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
