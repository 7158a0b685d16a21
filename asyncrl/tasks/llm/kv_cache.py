"""The sampler's KV cache (:func:`asyncrl.tasks.llm.sampling.sample`): a fresh ``DynamicCache`` under the
keyword the model's forward takes, and whether the cache can drop the batch rows that finished.

A cache whose layers only hold keys and values (full or sliding-window attention) drops rows with
``batch_select_indices``. Layers that hold a recurrent state (transformers' linear-attention layers:
Mamba, RecurrentGemma and the hybrids that mix them with attention) either have no such method or select
the keys and values only, leaving the recurrent state at its old batch size: the sampler keeps every
row of such a cache to the end of the batch instead (the same tokens, no compaction).
"""

from __future__ import annotations

import inspect


def cache_kwargs(model) -> dict:
    """A fresh DynamicCache under the keyword this transformers version takes (``cache`` from 5.x,
    ``past_key_values`` before; the old name is deprecated in 5.x); a peft model's base model says which."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x: no config argument
        cache = DynamicCache()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes it on
    name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    return {name: cache}


def can_drop_rows(cache) -> bool:
    """Whether every layer of ``cache`` (after a forward filled it) drops batch rows completely with
    ``batch_select_indices``: attention layers do; a layer with a recurrent state does not."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin as Recurrent
    except ImportError:  # a transformers without linear-attention layers
        Recurrent = ()
    if not hasattr(cache, "batch_select_indices"):
        return False
    layers = getattr(cache, "layers", None)
    if layers is None:  # a legacy cache: no layers to inspect
        return True
    return all(hasattr(layer, "batch_select_indices") and not isinstance(layer, Recurrent) for layer in layers)
