"""Supervised warm-up: next-token cross-entropy on worked solutions, so RL starts from a model that
solves some problems (GRPO learns nothing from groups whose rewards are all 0).

The loss covers completion tokens only (the worked solution and its EOS), not the prompt. Batches
group problems of similar length (:func:`_epoch_order`) to spend less compute on padding. AdamW with a
linear warm-up then cosine decay of the learning rate, gradient norm clipped at 1. Batches are drawn
from a torch.Generator seeded with ``seed``; on CPU with a fixed thread count the run is deterministic.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from asyncrl.core.metrics import strict_json
from asyncrl.tasks.llm import gsm_problems
from asyncrl.tasks.llm.defaults import (  # noqa: F401
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    DEFAULT_STEPS,
    DEFAULT_THREADS,
    DEFAULT_WARMUP_STEPS,
    WARMUP_STAMP,
)


class WarmupResult(NamedTuple):
    """steps: optimizer steps taken; tokens: supervised (completion) tokens seen; final_loss: mean
    cross-entropy (nats per token) over the last min(20, steps) steps; seconds: wall time of the loop."""

    steps: int
    tokens: int
    final_loss: float
    seconds: float


_ANNOTATION_RESULT = re.compile(r"<<[^<>=]*=([^<>=]*>>)")  # group 1: what a calculator writes ("24>>")


def calculator_positions(tokenizer, completion: str, offsets: Sequence[tuple[int, int]] | None = None) -> list[int]:
    """Indices of the tokens of ``completion`` (tokenised alone) that a calculator writes at sampling
    time: the result and the closing ``>>`` of every annotation ``<<expr=result>>``.

    A token counts when its first character lies in such a span (digits are single tokens and ``=``
    and ``>>`` are not merged with them, so the spans fall on token boundaries with the project's
    tokenizer). ``offsets``: the completion's (start, end) character offsets per token when already
    computed (a batched tokenizer call); None tokenises ``completion`` here."""
    spans = [m.span(1) for m in _ANNOTATION_RESULT.finditer(completion)]
    if not spans:
        return []
    if offsets is None:
        offsets = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    out, k = [], 0
    for i, (a, _) in enumerate(offsets):  # spans and token starts both ascend: one merged pass
        while k < len(spans) and spans[k][1] <= a:
            k += 1
        if k == len(spans):
            break
        if spans[k][0] <= a:
            out.append(i)
    return out


def encode_examples(
    tokenizer, problems: Sequence[gsm_problems.Problem], *, max_len: int = 320, calculator_mask: bool = False
) -> list[tuple[list[int], int, tuple[int, ...]]]:
    """Token ids of prompt + completion + EOS per problem, with the prompt length and the positions
    that get no loss.

    Args:
        tokenizer: the model's tokenizer.
        problems: training problems.
        max_len: rows longer than this are cut (the tail of the solution is lost; keeps memory bounded).
        calculator_mask: no loss on the tokens a calculator writes at sampling time
            (:func:`calculator_positions`): the model then spends no capacity on arithmetic it never
            has to produce; it still reads those tokens as input.

    Returns:
        [(ids, prompt_len, no_loss)] in problem order; no_loss holds row positions (empty when
        calculator_mask is False).
    """
    prompts = tokenizer([gsm_problems.format_prompt(p) for p in problems], add_special_tokens=False)["input_ids"]
    texts = [gsm_problems.format_completion(p) for p in problems]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=calculator_mask)
    comps = enc["input_ids"]
    offsets = enc["offset_mapping"] if calculator_mask else [None] * len(texts)
    eos = tokenizer.eos_token_id
    out = []
    for p, c, text, off in zip(prompts, comps, texts, offsets):
        skip = tuple(len(p) + i for i in calculator_positions(tokenizer, text, off)) if calculator_mask else ()
        out.append(((p + c + [eos])[:max_len], len(p), skip))
    return out


def collate(examples: Sequence[tuple], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded batch: input_ids [B, S] int64, attention_mask [B, S] int64, labels [B, S] int64
    (-100 on prompt and padding positions and on an example's no-loss positions, the token id on
    the other completion positions). Examples are (ids, prompt_len) or (ids, prompt_len, no_loss)."""
    s = max(len(ex[0]) for ex in examples)
    ids = torch.full((len(examples), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), s), dtype=torch.long)
    labels = torch.full((len(examples), s), -100, dtype=torch.long)
    for i, ex in enumerate(examples):
        row, n_prompt = ex[0], ex[1]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, n_prompt : len(row)] = torch.tensor(row[n_prompt:])
        skip = [j for j in (ex[2] if len(ex) > 2 else ()) if j < len(row)]
        if skip:
            labels[i, skip] = -100
    return ids, mask, labels


def sft_loss(model, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> tuple[Tensor, int]:
    """Mean next-token cross-entropy (nats per supervised token) and the number of supervised tokens.

    Args: input_ids, attention_mask, labels: [B, S] from :func:`collate`.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
    )
    return loss, int((target != -100).sum())


def _epoch_order(lengths: list[int], batch_size: int, gen: torch.Generator, pool: int = 8) -> list[int]:
    """One pass over the examples: a random permutation, sorted by length within windows of
    ``pool`` batches and cut into batches whose order is shuffled again. Rows of a batch then have
    similar lengths, so padding (computed and thrown away) drops; the batches stay random."""
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    window = pool * batch_size
    perm = [i for w in range(0, len(perm), window) for i in sorted(perm[w : w + window], key=lengths.__getitem__)]
    batches = [perm[b : b + batch_size] for b in range(0, len(perm) - batch_size + 1, batch_size)]
    return [i for k in torch.randperm(len(batches), generator=gen).tolist() for i in batches[k]]


def warmup(
    model,
    tokenizer,
    problems: Sequence[gsm_problems.Problem],
    *,
    steps: int,
    seed: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    weight_decay: float = 0.0,
    calculator_mask: bool = False,
    max_seconds: float | None = None,
    log: Callable[[int, float], None] | None = None,
    log_every: int = 50,
    stop: Callable[[int], bool] | None = None,
    check_every: int = 100,
) -> WarmupResult:
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
        calculator_mask: no loss on the annotation results a calculator writes at sampling time
            (see :func:`encode_examples`); use it when the model will be sampled with the calculator.
        max_seconds: optional wall-clock budget: the loop stops after the first step that ends past it
            (the learning-rate schedule is still the one planned for ``steps``). Deterministic only
            when ``steps`` binds first; :attr:`WarmupResult.steps` says how many were taken.
        log: optional callback (step, loss) every ``log_every`` steps and at the last.
        stop: optional early stop: called with the number of steps taken after every ``check_every``
            steps (the model in train mode; it may evaluate, and must leave it in train mode); True
            ends the loop there (the learning-rate schedule stays the one planned for ``steps``).
        check_every: >= 1 steps between calls of ``stop``.

    Returns:
        :class:`WarmupResult`.

    Raises:
        ValueError: steps < 1, batch_size < 1, lr <= 0, check_every < 1, or no problems.
    """
    if check_every < 1:
        raise ValueError(f"check_every must be >= 1, got {check_every}")
    if steps < 1 or batch_size < 1 or not lr > 0 or not problems:
        raise ValueError(
            f"need steps >= 1, batch_size >= 1, lr > 0 and problems, got steps={steps}, "
            f"batch_size={batch_size}, lr={lr}, {len(problems)} problems"
        )
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    examples = encode_examples(tokenizer, problems, calculator_mask=calculator_mask)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        frac = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batch_size = min(batch_size, len(examples))
    model.train()
    lengths = [len(ex[0]) for ex in examples]
    order, at, tokens, recent = _epoch_order(lengths, batch_size, gen), 0, 0, []
    t0 = time.perf_counter()
    for step in range(steps):
        if at + batch_size > len(order):
            order, at = _epoch_order(lengths, batch_size, gen), 0
        batch = [examples[i] for i in order[at : at + batch_size]]
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
        over = max_seconds is not None and time.perf_counter() - t0 > max_seconds
        if log is not None and (step % log_every == 0 or step == steps - 1 or over):
            log(step, recent[-1])
        if over or (stop is not None and (step + 1) % check_every == 0 and step + 1 < steps and stop(step + 1)):
            break
    model.eval()
    return WarmupResult(step + 1, tokens, sum(recent) / len(recent), time.perf_counter() - t0)


class WarmStart(NamedTuple):
    """path: the warmed-up model directory; reused: True when a cached directory was kept; stamp: the
    content of its ``asyncrl-warmup.json`` (settings, heldout_accuracy, train_wall_s, train_cpu_s,
    eval_wall_s, steps_taken, final_loss, tokens, load_average)."""

    path: Path
    reused: bool
    stamp: dict


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    n_train: int = 20000,
    n_heldout: int = 500,
    max_new_tokens: int = 160,
    calculator: bool = True,
    max_seconds: float | None = None,
    threads: int | None = DEFAULT_THREADS,
    log: Callable[[int, float], None] | None = None,
) -> WarmStart:
    """Load a model directory, warm it up on the generated train split, score it greedily on the
    held-out split and save it (what ``asyncrl llm warmup`` runs).

    Args:
        model_dir: a Hugging Face causal-LM directory (e.g. from :func:`asyncrl.tasks.llm.model.prepare`).
        out_dir: where the warmed-up model goes; reused when its stamp holds the same settings.
        seed: problems (``gsm_problems.make_splits(seed=seed, ...)``), batch order.
        steps, batch_size, lr: as :func:`warmup`.
        n_train, n_heldout: split sizes.
        max_new_tokens: generation budget of the held-out evaluation.
        calculator: train with the calculator's loss mask and evaluate with the calculator.
        max_seconds: wall-clock budget of the training loop (see :func:`warmup`); part of the cache key.
        threads: torch.set_num_threads before training (None or 0: leave as is).
        log: optional (step, loss) callback every 100 steps.

    Returns:
        :class:`WarmStart`.

    Raises:
        FileExistsError: out_dir exists but was not made with these settings (nothing is overwritten).
        asyncrl.tasks.llm.model.ModelLoadError: model_dir is not loadable.
    """
    import torch

    from asyncrl.tasks.llm import model as m
    from asyncrl.tasks.llm import sampling

    out = Path(out_dir)
    with m.build_lock(out):  # a parallel warm-up of the same directory runs once
        settings = {
            "model": str(Path(model_dir).resolve()),
            "seed": seed,
            "steps": steps,
            "batch_size": batch_size,
            "lr": lr,
            "n_train": n_train,
            "n_heldout": n_heldout,
            "max_new_tokens": max_new_tokens,
            "threads": threads,
            "calculator": calculator,
            "max_seconds": max_seconds,
            "generator_version": gsm_problems.GENERATOR_VERSION,
        }
        if out.exists():
            try:
                old = json.loads((out / WARMUP_STAMP).read_text())
            except (OSError, json.JSONDecodeError):
                old = None
            if isinstance(old, dict) and old.get("settings") == settings:
                return WarmStart(out, True, old)
            raise FileExistsError(
                f"{out} exists and was not warmed up with these settings; remove it or choose another --out"
            )
        if threads:
            torch.set_num_threads(threads)
        loaded = m.load(model_dir)
        splits = gsm_problems.make_splits(seed=seed, n_train=n_train, n_heldout=n_heldout)
        t0, c0 = time.perf_counter(), time.process_time()
        result = warmup(
            loaded.model,
            loaded.tokenizer,
            splits.train,
            steps=steps,
            seed=seed,
            batch_size=batch_size,
            lr=lr,
            calculator_mask=calculator,
            max_seconds=max_seconds,
            log=log,
            log_every=100,
        )
        train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
        t1 = time.perf_counter()
        acc = sampling.evaluate(
            loaded.model,
            loaded.tokenizer,
            splits.heldout,
            greedy=True,
            max_new_tokens=max_new_tokens,
            calculator=calculator,
        )
        stamp = {
            "settings": settings,
            "heldout_accuracy": acc,
            "n_heldout": len(splits.heldout),
            "steps_taken": result.steps,
            "final_loss": result.final_loss,
            "tokens": result.tokens,
            "train_wall_s": round(train_wall, 2),
            "train_cpu_s": round(train_cpu, 2),
            "eval_wall_s": round(time.perf_counter() - t1, 2),
            "load_average": list(os.getloadavg()),
        }
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an interrupted warm-up
        m.save(loaded.model, loaded.tokenizer, tmp)
        (tmp / WARMUP_STAMP).write_text(strict_json(stamp, indent=1) + "\n")
        os.replace(tmp, out)
        return WarmStart(out, False, stamp)
