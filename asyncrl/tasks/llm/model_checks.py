"""Checks that a start model suits the llm task, run by ``asyncrl run`` before any role starts
(:meth:`asyncrl.tasks.llm.heldout_eval.LLMHeldoutEvaluation.prepare_run`, :func:`check_start_model`):
what would otherwise crash a role mid-run, or train on log-probs that are silently wrong, is one line
(:class:`ModelCheckError`) naming the model and the problem. Nothing here depends on an architecture's
name; each check asks the model itself.

- vocabulary: every id the tokenizer can produce indexes the model's embedding (a tokenizer with more
  tokens than the embedding has rows would index past it in a prompt or a calculator token). An
  embedding padded beyond the tokenizer (rows no token names) is fine: a sampled id past the tokenizer
  decodes to no text.
- positions: the slot's prompt width plus ``llm.max_new_tokens`` fits the model's
  ``max_position_embeddings`` (a model with learned absolute positions, GPT-2's or OPT's, indexes past
  them on a longer row; a rotary one leaves the context it was trained on).
- LoRA: the adapter of ``llm.lora_*`` fits the model (peft's error for target modules it lacks, with
  the model's linear layers named).
- log-probs: a few tokens sampled from two prompts of different lengths (the sampler's KV-cached
  decoding, left padding to the batch's longest prompt) and their log-probs recomputed as the learner
  does (one forward, the rows left-padded further): they must agree to :data:`LOGPROB_TOLERANCE`
  nats. A model whose outputs depend on how much padding precedes a row (positions counted from the
  sequence's start whatever ``position_ids`` says, as in BART-style decoders; a recurrent state that
  reads the padding, as Mamba's) fails here instead of training on wrong ratios.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

log = logging.getLogger("asyncrl.llm")

LOGPROB_TOLERANCE = 5e-3  # nats; float32 models measured at 1e-6 (tests/llm/test_llm_archs.py), padding bugs at 0.4-2
CHECK_TOKENS = 6  # tokens sampled per prompt by the log-prob check
EXTRA_PADDING = 5  # pad tokens the learner's view adds in front of the slot width


class ModelCheckError(ValueError):
    """A start model the llm task cannot run correctly (one line)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _name(model) -> str:
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return type(base).__name__


def check_vocabulary(model, tokenizer) -> None:
    """Raise ModelCheckError when the tokenizer has ids past the model's input embedding."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ModelCheckError(
            f"{_name(model)}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows "
            f"(ids {rows}..{len(tokenizer) - 1} index past it): resize it (model.resize_token_embeddings("
            "len(tokenizer))) and save the model again"
        )


def check_positions(model, needed: int, *, prompt_width: int, max_new_tokens: int) -> None:
    """Raise ModelCheckError when a row of ``needed`` tokens exceeds the model's declared context."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < needed:
        raise ModelCheckError(
            f"{_name(model)}: a row needs {needed} positions (prompt width {prompt_width} + llm.max_new_tokens "
            f"{max_new_tokens}) but the model has {limit} (max_position_embeddings): shorten the prompts "
            "(llm.few_shot, llm.max_prompt_tokens) or llm.max_new_tokens"
        )


def with_lora(model, llm):
    """``model`` with the run's LoRA adapter (the adapter starts at zero: the same outputs), or itself.
    Raises ModelCheckError naming the model's linear layers when peft refuses the target modules."""
    from asyncrl.tasks.llm import lora

    if not lora.enabled(llm):
        return model
    try:
        return lora.with_adapter(model, llm, own_rng=True)
    except (ValueError, TypeError, KeyError) as exc:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m)})
        raise ModelCheckError(
            f"{_name(model)}: llm.lora_target_modules = {list(llm.lora_target_modules)} does not fit it "
            f'({_first_line(exc)}); its linear layers: {", ".join(linear)} (or "all-linear")'
        ) from None


def _is_linear(module) -> bool:
    if isinstance(module, torch.nn.Linear):
        return True
    return type(module).__name__ == "Conv1D"  # transformers' GPT-2-style linear layer


def check_log_probs(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    *,
    stop_ids: Sequence[int],
    prompt_width: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    tokens: int = CHECK_TOKENS,
    tolerance: float = LOGPROB_TOLERANCE,
) -> float:
    """Sample ``tokens`` tokens per prompt (seeded), recompute their log-probs as the learner does with
    the rows padded to ``prompt_width`` + :data:`EXTRA_PADDING`, and return the largest gap (nats).

    Raises:
        ModelCheckError: the gap exceeds ``tolerance``, or sampling / recomputing raised (its first line).
    """
    from asyncrl.tasks.llm.sampling import encode_prompts, sample
    from asyncrl.tasks.llm.token_log_probs import completion_log_probs

    name = _name(model)
    pad = tokenizer.pad_token_id
    try:
        ids, mask = encode_prompts(tokenizer, prompts)
        s = sample(
            model,
            ids,
            mask,
            eos_id=list(stop_ids),
            pad_id=pad,
            max_new_tokens=tokens,
            temperature=temperature,
            generator=torch.Generator().manual_seed(0),
            top_k=top_k,
            top_p=top_p,
        )
        extra = max(prompt_width - s.prompt_len, 0) + EXTRA_PADDING
        b = len(s.input_ids)
        input_ids = torch.cat([torch.full((b, extra), pad, dtype=torch.long), s.input_ids], 1)
        attention = torch.cat([torch.zeros(b, extra, dtype=torch.long), s.attention_mask], 1)
        with torch.no_grad():
            lp = completion_log_probs(
                model, input_ids, attention, s.completion_mask, temperature=temperature, top_k=top_k, top_p=top_p
            )
    except Exception as exc:  # noqa: BLE001 - any failure of an unknown architecture becomes one line at start
        log.debug("the log-prob check of %s failed", name, exc_info=True)
        raise ModelCheckError(f"{name}: sampling and recomputing log-probs failed ({_first_line(exc)})") from None
    gap = float(((lp - s.behavior_log_prob).abs() * s.policy_mask).max())
    if not gap <= tolerance:
        raise ModelCheckError(
            f"{name}: the learner's log-probs of sampled tokens differ from the sampler's by {gap:.3g} nats "
            f"(> {tolerance:g}) when the rows are left-padded differently: its outputs depend on the padding "
            "before a row (positions not taken from position_ids, or a recurrent state), which the llm task "
            "cannot train on"
        )
    return gap


def check_start_model(task, start) -> float:
    """Every check above on the start model of ``task`` (an LLMTask) in directory ``start``, with the
    run's prompt format, stop ids, prompt width and sampling settings. Returns the log-prob gap."""
    from asyncrl.tasks.llm import model as m

    llm = task.cfg.llm
    loaded = m.load(start)
    width = task.prompt_width()
    check_vocabulary(loaded.model, loaded.tokenizer)
    check_positions(loaded.model, width + llm.max_new_tokens, prompt_width=width, max_new_tokens=llm.max_new_tokens)
    model = with_lora(loaded.model, llm)
    problems = task.heldout_problems()[:2] or task.rl_problems()[:2]
    questions = [p.question for p in problems]
    questions[-1] = questions[-1][: max(1, len(questions[-1]) // 2)]  # two prompt lengths: the sampler pads one
    prompts = task.prompt_format(loaded.tokenizer).encode(loaded.tokenizer, questions)
    return check_log_probs(
        model,
        loaded.tokenizer,
        prompts,
        stop_ids=task.stop_ids(loaded.tokenizer),
        prompt_width=width,
        temperature=llm.temperature,
        top_k=llm.top_k,
        top_p=llm.top_p,
    )
