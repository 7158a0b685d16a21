"""Supervised warm-up: next-token cross-entropy on worked solutions, so RL starts from a model that
solves some problems (GRPO learns nothing from groups whose rewards are all 0).

The loss covers completion tokens only (the worked solution and its EOS), not the prompt. Batches
group problems of similar length (:func:`_epoch_order`) to spend less compute on padding. AdamW with a
linear warm-up then cosine decay of the learning rate, gradient norm clipped at 1. Batches are drawn
from a torch.Generator seeded with ``seed``; on CPU with a fixed thread count the run is deterministic.
"""
from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from . import gsm


class WarmupResult(NamedTuple):
    """steps: optimizer steps taken; tokens: supervised (completion) tokens seen; final_loss: mean
    cross-entropy (nats per token) over the last min(20, steps) steps; seconds: wall time of the loop."""

    steps: int
    tokens: int
    final_loss: float
    seconds: float


def encode_examples(tokenizer, problems: Sequence[gsm.Problem], *, max_len: int = 320) -> list[tuple[list[int], int]]:
    """Token ids of prompt + completion + EOS per problem, with the prompt length.

    Args:
        tokenizer: the model's tokenizer.
        problems: training problems.
        max_len: rows longer than this are cut (the tail of the solution is lost; keeps memory bounded).

    Returns:
        [(ids, prompt_len)] in problem order.
    """
    prompts = tokenizer([gsm.format_prompt(p) for p in problems], add_special_tokens=False)["input_ids"]
    comps = tokenizer([gsm.format_completion(p) for p in problems], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [((p + c + [eos])[:max_len], len(p)) for p, c in zip(prompts, comps)]


def collate(examples: Sequence[tuple[list[int], int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded batch: input_ids [B, S] int64, attention_mask [B, S] int64, labels [B, S] int64
    (-100 on prompt and padding positions, the token id on completion positions)."""
    s = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), s), dtype=torch.long)
    labels = torch.full((len(examples), s), -100, dtype=torch.long)
    for i, (row, n_prompt) in enumerate(examples):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
        labels[i, n_prompt:len(row)] = torch.tensor(row[n_prompt:])
    return ids, mask, labels


def sft_loss(model, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> tuple[Tensor, int]:
    """Mean next-token cross-entropy (nats per supervised token) and the number of supervised tokens.

    Args: input_ids, attention_mask, labels: [B, S] from :func:`collate`.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                             ignore_index=-100)
    return loss, int((target != -100).sum())


def _epoch_order(lengths: list[int], batch_size: int, gen: torch.Generator, pool: int = 8) -> list[int]:
    """One pass over the examples: a random permutation, sorted by length within windows of
    ``pool`` batches and cut into batches whose order is shuffled again. Rows of a batch then have
    similar lengths, so padding (computed and thrown away) drops; the batches stay random."""
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    window = pool * batch_size
    perm = [i for w in range(0, len(perm), window) for i in sorted(perm[w:w + window], key=lengths.__getitem__)]
    batches = [perm[b:b + batch_size] for b in range(0, len(perm) - batch_size + 1, batch_size)]
    return [i for k in torch.randperm(len(batches), generator=gen).tolist() for i in batches[k]]


def warmup(model, tokenizer, problems: Sequence[gsm.Problem], *, steps: int, seed: int, batch_size: int = 32,
           lr: float = 3e-3, warmup_steps: int = 30, weight_decay: float = 0.0,
           log: Callable[[int, float], None] | None = None, log_every: int = 50) -> WarmupResult:
    """Train ``model`` in place on ``problems`` for ``steps`` optimizer steps.

    Args:
        model: a transformers causal LM (left in eval mode on return).
        tokenizer: its tokenizer (pad token used for padding).
        problems: the train split.
        steps: >= 1 optimizer steps.
        seed: seeds batch sampling (torch.Generator) and the global torch RNG (dropout, if any).
        batch_size: >= 1 problems per step, drawn without replacement within each pass over the data.
        lr: peak AdamW learning rate (> 0).
        warmup_steps: >= 0 steps of linear learning-rate warm-up before the cosine decay to 10 % of lr.
        weight_decay: AdamW decoupled weight decay.
        log: optional callback (step, loss) every ``log_every`` steps and at the last.

    Returns:
        :class:`WarmupResult`.

    Raises:
        ValueError: steps < 1, batch_size < 1, lr <= 0, or no problems.
    """
    if steps < 1 or batch_size < 1 or not lr > 0 or not problems:
        raise ValueError(f"need steps >= 1, batch_size >= 1, lr > 0 and problems, got steps={steps}, "
                         f"batch_size={batch_size}, lr={lr}, {len(problems)} problems")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    examples = encode_examples(tokenizer, problems)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        frac = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batch_size = min(batch_size, len(examples))
    model.train()
    lengths = [len(ids) for ids, _ in examples]
    order, at, tokens, recent = _epoch_order(lengths, batch_size, gen), 0, 0, []
    t0 = time.perf_counter()
    for step in range(steps):
        if at + batch_size > len(order):
            order, at = _epoch_order(lengths, batch_size, gen), 0
        batch = [examples[i] for i in order[at:at + batch_size]]
        at += batch_size
        ids, mask, labels = collate(batch, tokenizer.pad_token_id)
        loss, n = sft_loss(model, ids, mask, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens += n
        recent = (recent + [loss.item()])[-20:]
        if log is not None and (step % log_every == 0 or step == steps - 1):
            log(step, recent[-1])
    model.eval()
    return WarmupResult(steps, tokens, sum(recent) / len(recent), time.perf_counter() - t0)
