"""The distribution the generators sample from, and the learner's log-probs of the sampled tokens under it.

Sampling transform (in this order, as transformers' and vLLM's samplers apply it): temperature T (the
logits divided by T), top-k (the k largest logits stay; ties with the k-th stay too), top-p (nucleus
sampling, Holtzman et al. 2020, arXiv:1904.09751: the smallest set of most likely tokens whose
probability under the top-k-renormalised distribution reaches p stays; ties with its least likely
member stay too). The tokens that stay are renormalised; every other token has probability 0 (logit
-inf) and is never drawn. top_k = 0 and top_p = 1 leave the logits untouched (the sampler then takes
exactly the path it took before these options existed).

The learner's recomputation (:func:`completion_log_probs`) applies the same transform to its own
logits. Those differ from the sampler's by float rounding (a full forward against a KV-cached one,
another batch shape), so a token at the edge of the nucleus can fall just outside the learner's; and
once the policy has moved, a sampled token may leave the nucleus altogether. The learner therefore
always keeps the sampled token in its set (prime-rl's trainer-side replay does the same): its
log-prob stays finite, a token inside the nucleus (the usual case) gets exactly the sampler's
renormalisation, and at zero lag the ratio is 1 to float tolerance.

Memory (issue 43): the learner never holds [rows, tokens, vocabulary] logits. The model's backbone
gives the last hidden state [B, S, H]; the output head and the log-softmax run on chunks of
``chunk_tokens`` completion positions, each under :func:`torch.utils.checkpoint.checkpoint` when a
gradient is needed, so a chunk's [chunk, V] logits are freed after its forward and recomputed in its
backward. A chunk keeps the gathered logit of the sampled token and a logsumexp, nothing of vocabulary
width. A model that changes its logits after the output head (e.g. Gemma 2's soft-capping) is found
by comparing the split with the model's own logits once per model; it, and a stand-in without an
output head, takes the full logits of its forward instead (chunked afterwards; the bound does not hold).
"""

from __future__ import annotations

import contextlib
import logging
import weakref

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("asyncrl.llm")

DEFAULT_CHUNK_TOKENS = 512  # llm.logprob_chunk_tokens' default (docs/decisions/llm-defaults.md)


def position_ids(attention_mask: Tensor) -> Tensor:
    """[B, S] positions counting only attended tokens: cumsum(mask) - 1, clamped at 0 (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def check_sampling(*, temperature: float, top_k: int, top_p: float) -> None:
    """Raise ValueError (one line) unless temperature > 0, top_k >= 0 (an int) and 0 < top_p <= 1."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")


def truncates(*, top_k: int, top_p: float) -> bool:
    """Whether top-k / top-p change the distribution at all (top_k = 0 and top_p = 1: they do not)."""
    return top_k > 0 or top_p < 1


def truncation_threshold(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor | None:
    """The logit at or above which a token stays under top-k and top-p (module docstring).

    Args:
        logits: [A, V] float logits, already divided by the temperature.
        top_k: >= 0; 0 (or >= V): no top-k.
        top_p: in (0, 1]; 1: no top-p.

    Returns:
        [A, 1] thresholds (a token stays iff its logit >= its row's threshold; the most likely token
        always stays), or None when nothing is truncated. Computed without gradient (the kept set is
        a constant of the update, not a function to differentiate).
    """
    v = logits.shape[-1]
    k = top_k if 0 < top_k < v else 0
    if not k and top_p >= 1:
        return None
    with torch.no_grad():
        if top_p >= 1:
            return logits.topk(k, dim=-1).values[:, -1:]
        ordered = logits.sort(dim=-1, descending=True).values  # [A, V]
        if k:  # top-p on the top-k-renormalised distribution
            ordered = ordered.masked_fill(ordered < ordered[:, k - 1 : k], float("-inf"))
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
        n = (before < top_p).sum(-1, keepdim=True).clamp(min=1)  # the nucleus: a prefix of the ranking
        return ordered.gather(-1, n - 1)


def truncate_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0, keep: Tensor | None = None) -> Tensor:
    """``logits`` with -inf on every token top-k / top-p removes (renormalise with a log-softmax).

    Args:
        logits: [A, V] float logits divided by the temperature.
        top_k, top_p: as :func:`truncation_threshold`.
        keep: [A] int64 token ids that stay whatever their logit (the learner's sampled tokens), or None.

    Returns:
        [A, V] (``logits`` itself when nothing is truncated); differentiable in the kept logits.
    """
    threshold = truncation_threshold(logits, top_k=top_k, top_p=top_p)
    if threshold is None:
        return logits
    with torch.no_grad():
        stays = logits >= threshold
        if keep is not None:
            stays.scatter_(1, keep[:, None], True)
    return logits.masked_fill(~stays, float("-inf"))


def _chunk_log_probs(head, hidden: Tensor, tokens: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """[c] log-probs of ``tokens`` [c] under the sampling transform of ``head(hidden)`` ([c, H] -> [c, V])."""
    z = head(hidden).float()
    if temperature != 1.0:
        z = z / temperature
    picked = z.gather(1, tokens[:, None]).squeeze(1)
    return picked - torch.logsumexp(truncate_logits(z, top_k=top_k, top_p=top_p, keep=tokens), dim=-1)


_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (backbone, head) or None


def output_head(model, input_ids: Tensor | None = None, attention_mask: Tensor | None = None):
    """(backbone, head) of a transformers causal LM (a peft model: of its base model) whose logits are
    ``head(backbone(...).last_hidden_state)``, or None (a stand-in without an output head, or a model
    whose logits differ from that split: checked once per model on the first 4 attended tokens of
    the first row of ``input_ids``, and cached)."""
    if model in _SPLITS:
        return _SPLITS[model]
    hf = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    get_head, backbone = getattr(hf, "get_output_embeddings", None), getattr(hf, "base_model", None)
    head = get_head() if callable(get_head) else None
    split = None if head is None or backbone is None or backbone is hf else (backbone, head)
    if split is not None and input_ids is not None:
        ids = input_ids[0][attention_mask[0].bool()][None, :4]  # attended tokens only: no all-masked rows
        mask = torch.ones_like(ids)
        with torch.no_grad():  # the head on the same [1, n, H] states as the model's own call: equal bit for bit
            kw = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False)
            want = model(**kw).logits.float()
            got = head(backbone(**kw).last_hidden_state).float()
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            log.warning(
                "the logits of %s are not its output head's (it changes them afterwards): the learner's "
                "log-probs take its full logits, and llm.logprob_chunk_tokens does not bound their memory",
                type(hf).__name__,
            )
            split = None
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is checked every time
        _SPLITS[model] = split
    return split


@contextlib.contextmanager
def checkpointed_layers(model):
    """Within: the layers that transformers' activation checkpointing marked (``gradient_checkpointing``
    True) run in training mode, which is when they checkpoint; no other module changes mode, so
    dropout stays off in an eval-mode model. A no-op for a model without checkpointing."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and not m.training]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


def enable_checkpointing(model) -> None:
    """Turn on transformers' activation checkpointing (non-reentrant) of ``model``'s decoder layers: in
    the learner's forwards with gradient (:func:`completion_log_probs`) each layer keeps its input only
    and recomputes the rest in the backward pass.

    Raises:
        ValueError: the model's config sets a dropout probability > 0 (its checkpointed layers run in
            training mode, which would turn a layer's own dropout on), or the model does not support it.
    """
    hf = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    config = getattr(hf, "config", None)
    drop = {
        k: v
        for k, v in (config.to_dict() if config is not None else {}).items()
        if "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    }
    if drop:
        raise ValueError(
            f"llm.gradient_checkpointing needs a model without dropout (its checkpointed layers run in "
            f"training mode), but its config sets {', '.join(f'{k} = {v}' for k, v in sorted(drop.items()))}"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers 5.x; the old name warns there
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(hf, "gradient_checkpointing_enable"):
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"llm.gradient_checkpointing: {type(hf).__name__} does not support activation checkpointing")


def completion_log_probs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Tensor:
    """Per-token log-probs of the completion tokens under ``model`` and the sampling transform (the
    learner's π_θ; carries gradient when grad mode is on).

    Args:
        model: a transformers causal LM (or a peft model of one).
        input_ids: [B, S] int64, left-padded prompt then completion (the last L positions).
        attention_mask: [B, S] 0/1 (as sampling.Samples gives it).
        completion_mask: [B, L] bool, which of the last L positions are completion tokens.
        temperature, top_k, top_p: the sampler's (:func:`check_sampling`): pass the generators' values
            so that zero lag means equal log-probs. The sampled token always stays in the kept set.
        chunk_tokens: >= 1 completion positions per chunk of the output head and log-softmax: the
            peak memory of that part is a few chunk_tokens x V floats, whatever B and L.

    Returns:
        [B, L] float32 log π(token_t | tokens_<t) (nats), 0 where completion_mask is False.

    Raises:
        ValueError: shapes that do not fit (L >= S, batch sizes differ), chunk_tokens < 1, or as
            :func:`check_sampling`.
    """
    check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    b, s = input_ids.shape
    bl, length = completion_mask.shape
    if attention_mask.shape != input_ids.shape or bl != b or not 0 < length < s:
        raise ValueError(
            f"need input_ids/attention_mask [B, S] and completion_mask [B, L] with 0 < L < S, got "
            f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(completion_mask.shape)}"
        )
    completion_mask = completion_mask.bool()
    rows, cols = completion_mask.nonzero(as_tuple=True)  # [N] completion positions, row-major
    tokens = input_ids[rows, s - length + cols]  # [N] the tokens whose log-probs we want
    before = s - length - 1 + cols  # position j predicts token j + 1
    kw = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    split = output_head(model, input_ids, attention_mask)
    with checkpointed_layers(model) if torch.is_grad_enabled() else contextlib.nullcontext():
        if split is None:
            hidden, head = model(**kw).logits[rows, before], torch.nn.Identity()  # [N, V]
        else:
            backbone, head = split
            hidden = backbone(**kw, use_cache=False).last_hidden_state[rows, before]  # [N, H]
    parts = []
    for h, t in zip(hidden.split(chunk_tokens), tokens.split(chunk_tokens)):
        args = (head, h, t, temperature, top_k, top_p)
        if torch.is_grad_enabled() and h.requires_grad:  # the chunk's logits are recomputed in its backward
            parts.append(checkpoint(_chunk_log_probs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_log_probs(*args))
    out = torch.zeros(b, length, dtype=torch.float32, device=input_ids.device)
    return out.masked_scatter(completion_mask, torch.cat(parts)) if parts else out
