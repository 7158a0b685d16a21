"""Generation with behaviour log-probs, and exact-match evaluation (the learner's recomputation of the
log-probs, :func:`completion_log_probs`, and the sampling transform, temperature / top-k / top-p, live in
:mod:`asyncrl.tasks.llm.token_log_probs`).

Layout of every batch (B rows): ``[left-padded prompt, S_p tokens | completion, L tokens]``. The
completion of a row ends with its EOS token (kept, mask 1: the policy learns when to stop); positions
after it hold the pad token with mask 0. Position ids are ``cumsum(attention_mask) - 1`` so a row's
first real token has position 0 whatever its left padding, in the sampler and in
:func:`completion_log_probs` alike.

The sampler is a plain loop over the model's forward with its KV cache (not ``model.generate``) so that
it draws from an explicit ``torch.Generator`` (bit-reproducible on CPU for a given seed and thread
count) and returns the log-probability of each drawn token under the distribution it was drawn from
(after temperature, top-k and top-p).
A row that has emitted EOS leaves the decoding batch and the cache (compaction: a step costs what
the rows still decoding cost; 1.17-1.26x faster on the tiny GSM model, lab/llm-gsm-tiny/README.md), and every
draw is an inversion of one uniform per row and step, so no row's tokens depend on when the others end.

Calculator (optional, :class:`Calculator`; GSM8k's own, Cobbe et al. 2021): when a row's completion
ends in an open annotation ``<<expr=``, the sampler writes the value of ``expr`` and ``>>`` for it
(:func:`asyncrl.tasks.llm.gsm_answers.calculator_completion`), one token per decoding step, instead of
sampling. Those inserted tokens are part of the text (completion_mask True, they are attended to)
but are not the policy's actions: ``policy_mask`` is False on them and their behaviour log-prob is 0,
so RL must take its loss, ratios and token counts over ``policy_mask``, not ``completion_mask``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from asyncrl.tasks.llm import gsm_answers, gsm_problems
from asyncrl.tasks.llm.calculator import Calculator, calculator_for
from asyncrl.tasks.llm.kv_cache import cache_kwargs, can_drop_rows
from asyncrl.tasks.llm.token_log_probs import check_sampling, position_ids, truncate_logits, truncates
from asyncrl.tasks.llm.token_log_probs import completion_log_probs as completion_log_probs  # the learner's

if TYPE_CHECKING:
    from asyncrl.tasks.llm.prompts import PromptFormat


class Samples(NamedTuple):
    """Output of :func:`sample` / :func:`generate_group`.

    input_ids: [B, S_p + L] int64, prompt then completion tokens (pad after EOS).
    attention_mask: [B, S_p + L] int64, 1 on prompt tokens and completion tokens up to and including EOS.
    completion_mask: [B, L] bool, True on completion tokens up to and including EOS.
    behavior_log_prob: [B, L] float32, log β(token) under the sampling distribution (nats; 0 where
        policy_mask is False). For greedy decoding: log-softmax of the argmax token at temperature 1.
    prompt_len: S_p (int), so completions are input_ids[:, S_p:].
    policy_mask: [B, L] bool, True on the completion tokens the policy chose: completion_mask without
        the tokens a calculator inserted (equal to completion_mask when no calculator ran). The RL
        loss, its log-prob ratios and its token counts use this mask.
    """

    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    behavior_log_prob: Tensor
    prompt_len: int
    policy_mask: Tensor


@torch.no_grad()
def sample(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    eos_id: int | Sequence[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    calculator: Calculator | None = None,
    compact: bool = True,
    top_k: int = 0,
    top_p: float = 1.0,
    on_step: Callable[[], None] | None = None,
    uniforms: Tensor | None = None,
) -> Samples:
    """Decode up to ``max_new_tokens`` per row, sampling at ``temperature`` (with top-k / top-p) or greedily.

    Each step draws one uniform per batch row from ``generator`` (live or not) and samples the row's
    token by inversion (:func:`inverse_cdf`), so a row's draws are fixed by the seed, the step and its
    row index, whatever the other rows do: two models sampled with the same seed make the same draws
    (the paired evaluation's common random numbers), with or without compaction.

    Args:
        model: a transformers causal LM (put in eval mode here); decoding runs on its device.
        prompt_ids: [B, S_p] int64 left-padded prompts (moved to the model's device).
        prompt_mask: [B, S_p] 0/1 attention mask of the prompts.
        eos_id: the stop token id, or several (asyncrl.tasks.llm.prompts.stop_ids): a row stops after it
            emits any of them (called EOS below; it is kept in the completion).
        pad_id: the padding token id.
        max_new_tokens: >= 1, completion budget L_max (a row that never emits EOS is cut there and
            simply has no EOS).
        temperature: > 0; logits are divided by it (ignored for greedy).
        top_k, top_p: >= 0 and in (0, 1]: sample from the k most likely tokens and from the nucleus of
            mass top_p, renormalised (asyncrl.tasks.llm.token_log_probs; 0 and 1: off, and the draws
            are those of the plain softmax at ``temperature``, bit for bit); ignored for greedy.
            behavior_log_prob is the log-prob under this renormalised distribution; a token outside
            it has probability 0 and is never drawn.
        greedy: argmax decoding (evaluation).
        generator: torch.Generator for the draws, on the model's device (None: the global RNG).
        calculator: a :class:`Calculator` that writes annotation results (None: none). A step that
            inserts a token for a row still draws for every row, so the generator's stream, and
            hence every other row, does not depend on which rows were given calculator tokens.
        compact: drop a row from the decoding batch (and its KV cache) once it has emitted EOS, so
            the cost of a step follows the rows still decoding, not the batch (default). False keeps
            every row to the end (for stand-in models that cannot tell rows apart; a cache with a
            recurrent state, which cannot drop rows, always does: asyncrl.tasks.llm.kv_cache). The
            tokens drawn are the same either way, up to the float rounding of a different batch shape.
        on_step: called after every decoding step (None: nothing); an exception it raises ends the
            generation (the generator actor's worker thread stops there when its actor gives up).
        uniforms: [B, >= max_new_tokens] uniforms in [0, 1) used instead of ``generator`` (row r, step
            t: ``uniforms[r, t]``; moved to the model's device): drawn on the CPU per problem
            (:func:`asyncrl.tasks.llm.eval_draws.problem_uniforms`), the same draws on any device.

    Returns:
        :class:`Samples` on the model's device, with L = the number of decoding steps taken (<=
        max_new_tokens; the loop stops once every row emitted EOS). Inserted tokens count towards
        max_new_tokens.

    Raises:
        ValueError: max_new_tokens < 1, temperature <= 0 when sampling, top_k or top_p out of range,
            or mismatched shapes.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    check_sampling(temperature=temperature if not greedy else 1.0, top_k=top_k, top_p=top_p)
    truncate = not greedy and truncates(top_k=top_k, top_p=top_p)
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids and prompt_mask must be [B, S_p] alike, got {tuple(prompt_ids.shape)} "
            f"and {tuple(prompt_mask.shape)}"
        )
    if uniforms is not None and (
        uniforms.dim() != 2 or len(uniforms) != len(prompt_ids) or uniforms.shape[1] < max_new_tokens
    ):
        raise ValueError(f"uniforms must be [B, >= max_new_tokens], got {tuple(uniforms.shape)}")
    model.eval()
    device = getattr(model, "device", prompt_ids.device)  # transformers models name theirs
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)  # CPU: the same tensors
    uniforms = None if uniforms is None else uniforms.to(device)
    b, s_p = prompt_ids.shape
    stops = torch.as_tensor(eos_id, dtype=torch.long, device=device).reshape(-1)
    mask = prompt_mask.long()
    cache = cache_kwargs(model)  # the KV cache, updated in place by every forward
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True, **cache)
    logits = out.logits[:, -1, :].float()  # [A, V]: the rows in `rows` only
    compact = compact and all(can_drop_rows(c) for c in cache.values())  # not a recurrent state's (kv_cache)
    next_pos = mask.sum(-1, keepdim=True)  # [A, 1] position of the next token
    rows = torch.arange(b, device=device)  # the batch rows still decoding (all of them when not compacting)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    tokens, lps, keep, chosen = [], [], [], []
    queues: dict[int, deque] = {}  # row -> calculator tokens still to insert
    for step in range(max_new_tokens):
        z = logits if greedy else logits / temperature
        logp = torch.log_softmax(truncate_logits(z, top_k=top_k, top_p=top_p) if truncate else z, dim=-1)
        if greedy:
            tok_a = logp.argmax(-1)
        else:  # one uniform per batch row and step, live or not: a row's draws never depend on the others
            u = torch.rand(b, generator=generator, device=device) if uniforms is None else uniforms[:, step]
            tok_a = inverse_cdf(logp.exp(), u[rows])
        tok = torch.full((b,), pad_id, dtype=torch.long, device=device)
        lp = torch.zeros(b, device=device)
        tok[rows] = tok_a
        forced = torch.zeros(b, dtype=torch.bool, device=device)
        if queues:
            for row in list(queues):
                tok[row] = queues[row].popleft()
                forced[row] = True
                if not queues[row]:
                    del queues[row]
        lp[rows] = logp.gather(-1, tok[rows, None]).squeeze(-1)
        live = ~done
        policy = live & ~forced
        tokens.append(torch.where(live, tok, torch.full_like(tok, pad_id)))
        lps.append(torch.where(policy, lp, torch.zeros_like(lp)))
        keep.append(live)
        chosen.append(policy)
        if calculator is not None:
            check = policy & torch.isin(tok, calculator.trigger_ids.to(device))
            for row in check.nonzero().flatten().tolist():
                ins = calculator.insert([int(t[row]) for t in tokens])
                if ins:
                    queues[row] = deque(ins)
        done = done | (live & torch.isin(tok, stops))
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if compact and bool(done[rows].any()):  # drop the rows that just ended from the batch and the cache
            stay = (~done[rows]).nonzero().flatten()
            rows, mask, next_pos = rows[stay], mask[stay], next_pos[stay]
            for c in cache.values():
                c.batch_select_indices(stay)
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=device)], dim=1)
        out = model(
            input_ids=tokens[-1][rows, None], attention_mask=mask, position_ids=next_pos, use_cache=True, **cache
        )
        logits = out.logits[:, -1, :].float()
        next_pos = next_pos + 1
        if on_step is not None:
            on_step()
    completion = torch.stack(tokens, 1)
    completion_mask = torch.stack(keep, 1)
    return Samples(
        input_ids=torch.cat([prompt_ids, completion], 1),
        attention_mask=torch.cat([prompt_mask.long(), completion_mask.long()], 1),
        completion_mask=completion_mask,
        behavior_log_prob=torch.stack(lps, 1),
        prompt_len=s_p,
        policy_mask=torch.stack(chosen, 1),
    )


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Categorical draws by inversion: for each row, the first index whose cumulative probability
    exceeds ``u`` times the row's total (so rows need not sum to exactly 1).

    Args:
        probs: [A, V] non-negative probabilities (float32 or float64).
        u: [A] uniforms in [0, 1).

    Returns:
        [A] int64 indices; an index of zero probability is never drawn. Cumulative sums are taken in
        float64 so that the tail of a 150k-token vocabulary is not lost to rounding.
    """
    cdf = probs.double().cumsum(-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def encode_prompts(tokenizer, prompts: Sequence[str] | Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and mask, both [B, S_p] int64 (S_p: the longest prompt).

    Args:
        tokenizer: pads with its pad token (its padding_side is forced left).
        prompts: texts, encoded here without special tokens; or token ids already encoded (e.g. by
            :meth:`asyncrl.tasks.llm.prompts.PromptFormat.encode`, which adds BOS where it belongs).

    Raises:
        ValueError: an empty prompt of token ids.
    """
    tokenizer.padding_side = "left"
    if all(isinstance(p, str) for p in prompts):
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt of no tokens")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[r, width - len(p) :] = 1
    return ids, mask


def generate_group(
    model,
    tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    G: int,
    *,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    calculator: bool = True,
    top_k: int = 0,
    top_p: float = 1.0,
    on_step: Callable[[], None] | None = None,
    stop_ids: Sequence[int] | None = None,
) -> Samples:
    """G sampled completions of each prompt (GRPO's group), rows prompt-major: row p * G + g.

    Args:
        model, tokenizer: from :func:`asyncrl.tasks.llm.model.load`.
        prompts: P prompts, texts or token ids (as :func:`encode_prompts`).
        G: >= 1 completions per prompt.
        temperature, max_new_tokens, top_k, top_p, on_step: as :func:`sample`.
        generator: seeded CPU torch.Generator (same seed, same model, same thread count: same tokens).
        calculator: write the value of each ``<<expr=`` annotation for the model (default; those
            tokens get policy_mask False). False: the model writes every token itself.
        stop_ids: the token ids that end a completion (:func:`asyncrl.tasks.llm.prompts.stop_ids`);
            None: the tokenizer's EOS alone.

    Returns:
        :class:`Samples` with B = P * G.

    Raises:
        ValueError: G < 1, no prompts, or as :func:`sample`.
    """
    if G < 1 or not prompts:
        raise ValueError(f"need G >= 1 and at least one prompt, got G={G}, {len(prompts)} prompts")
    ids, mask = encode_prompts(tokenizer, [p for p in prompts for _ in range(G)])
    return sample(
        model,
        ids,
        mask,
        eos_id=tokenizer.eos_token_id if stop_ids is None else stop_ids,
        pad_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        generator=generator,
        calculator=calculator_for(tokenizer) if calculator else None,
        top_k=top_k,
        top_p=top_p,
        on_step=on_step,
    )


def decode_completions(tokenizer, samples: Samples) -> list[str]:
    """The completion text of each row (EOS and padding dropped)."""
    comp = samples.input_ids[:, samples.prompt_len :]
    return [
        tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(comp, samples.completion_mask)
    ]


def eval_completions(
    model,
    tokenizer,
    problems: Sequence[gsm_problems.Problem],
    *,
    greedy: bool = True,
    max_new_tokens: int = 160,
    batch_size: int = 64,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    calculator: bool = True,
    top_k: int = 0,
    top_p: float = 1.0,
    prompt_format: PromptFormat | None = None,
    stop_ids: Sequence[int] | None = None,
    uniforms: Tensor | None = None,
) -> list[str]:
    """One completion per problem (the texts :func:`evaluate` scores), in problem order.

    Arguments as :func:`evaluate`, and:
        prompt_format: how a question becomes prompt tokens (:mod:`asyncrl.tasks.llm.prompts`); None:
            the plain :func:`asyncrl.tasks.llm.gsm_problems.format_prompt` text.
        stop_ids: as :func:`generate_group`.
        uniforms: [N, >= max_new_tokens], row i problem i's draws (as :func:`sample`), instead of
            ``generator``: a problem's draws do not depend on its batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    calc = calculator_for(tokenizer) if calculator else None
    texts: list[str] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        if prompt_format is None:
            ids, mask = encode_prompts(tokenizer, [gsm_problems.format_prompt(p) for p in chunk])
        else:
            ids, mask = encode_prompts(tokenizer, prompt_format.encode(tokenizer, [p.question for p in chunk]))
        out = sample(
            model,
            ids,
            mask,
            eos_id=tokenizer.eos_token_id if stop_ids is None else stop_ids,
            pad_id=tokenizer.pad_token_id,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            greedy=greedy,
            generator=generator,
            calculator=calc,
            top_k=top_k,
            top_p=top_p,
            uniforms=None if uniforms is None else uniforms[i : i + batch_size],
        )
        texts += decode_completions(tokenizer, out)
    return texts


def evaluate(
    model,
    tokenizer,
    problems: Sequence[gsm_problems.Problem],
    *,
    greedy: bool = True,
    max_new_tokens: int = 160,
    batch_size: int = 64,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    calculator: bool = True,
    top_k: int = 0,
    top_p: float = 1.0,
) -> float:
    """Exact-match accuracy: the mean :func:`asyncrl.tasks.llm.gsm_answers.reward` of one completion per problem.

    Batched generation with left padding (``batch_size`` prompts at a time) on the
    :func:`asyncrl.tasks.llm.gsm_problems.format_prompt` prompts; greedy by default (the held-out metric).

    Args:
        model, tokenizer: a causal LM and its tokenizer.
        problems: the problems (e.g. the held-out split).
        greedy: argmax decoding; False samples at ``temperature`` (and ``top_k``, ``top_p``: as
            :func:`sample`) with ``generator``.
        max_new_tokens: completion budget per problem.
        batch_size: >= 1 prompts per generation batch.
        calculator: as :func:`generate_group` (default on, as in GSM8k's evaluation with a calculator).

    Returns:
        Accuracy in [0, 1] (0.0 for no problems).

    Raises:
        ValueError: batch_size < 1, or as :func:`sample`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not problems:
        return 0.0
    texts = eval_completions(
        model,
        tokenizer,
        problems,
        greedy=greedy,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        temperature=temperature,
        generator=generator,
        calculator=calculator,
        top_k=top_k,
        top_p=top_p,
    )
    return sum(gsm_answers.reward(text, p.target) for text, p in zip(texts, problems)) / len(problems)
