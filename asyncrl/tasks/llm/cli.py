"""``llm`` click group: prepare (tokenizer + tiny model), warmup (supervised start), eval (exact match).

Wire it into the main CLI with ``main.add_command(asyncrl.tasks.llm.cli.llm)``. Every command works
offline: HF_HUB_OFFLINE=1 is set before transformers is imported, and models load by path only.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import click

WARMUP_STAMP = "asyncrl-warmup.json"


class LLMUserError(click.ClickException):
    """One clear line on stderr, exit status 2 (as asyncrl.cli.UserError)."""

    exit_code = 2


@click.group("llm", short_help="Language-model tasks: tiny models for verifiable math (GSM8k format).")
def llm() -> None:
    """Language-model tasks: tiny models for verifiable math (GSM8k format)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _threads(n: int | None) -> None:
    import torch
    if n:
        torch.set_num_threads(n)


@llm.command(short_help="Train a tokenizer on the generated task and initialise a tiny causal LM.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory to write (default runs/llm/tiny-qwen2-s<seed>); reused if prepared with the same settings.")
@click.option("--seed", type=int, default=0, show_default=True, help="Tokenizer data and initial weights.")
@click.option("--model-config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="transformers JSON config (default configs/llm/tiny-qwen2.json).")
@click.option("--vocab-size", type=int, default=1024, show_default=True, help="Tokenizer vocabulary size (upper bound).")
@click.option("--texts", "n_texts", type=int, default=20000, show_default=True,
              help="Generated train problems the tokenizer is trained on.")
def prepare(out_dir, seed, config_path, vocab_size, n_texts) -> None:
    """Train a tokenizer on the generated task and initialise a tiny causal LM (Hugging Face format)."""
    from . import model as m
    out = Path(out_dir) if out_dir else Path("runs/llm") / f"tiny-qwen2-s{seed}"
    try:
        path, reused = m.prepare(out, seed=seed, config_path=config_path or m.DEFAULT_CONFIG,
                                 vocab_size=vocab_size, n_texts=n_texts)
        stamp = json.loads((path / m.STAMP).read_text())
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        raise LLMUserError(str(e)) from None
    click.echo(f"{'reused' if reused else 'prepared'} {path} ({stamp['num_parameters']:,} parameters)")


@llm.command(short_help="Supervised warm-up on generated problems, then held-out greedy accuracy.")
@click.option("--model", "model_dir", type=click.Path(), required=True, help="Hugging Face causal-LM directory (e.g. from llm prepare).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for the warmed-up model (default <model>-warm-s<seed>-n<steps>); reused if made with the same settings.")
@click.option("--seed", type=int, default=0, show_default=True, help="Problem generation and batch order.")
@click.option("--steps", type=int, default=300, show_default=True, help="Optimizer steps.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Problems per step.")
@click.option("--lr", type=float, default=3e-3, show_default=True, help="Peak AdamW learning rate.")
@click.option("--train", "n_train", type=int, default=20000, show_default=True, help="Generated train problems.")
@click.option("--heldout", "n_heldout", type=int, default=500, show_default=True, help="Held-out problems evaluated.")
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Generation budget in evaluation.")
@click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads (0: torch's default).")
def warmup(model_dir, out_dir, seed, steps, batch_size, lr, n_train, n_heldout, max_new_tokens, threads) -> None:
    """Supervised warm-up on generated problems, then greedy exact-match accuracy on the held-out split."""
    from . import gsm, model as m, sampling, warmup as w
    _threads(threads)
    out = Path(out_dir) if out_dir else Path(f"{str(model_dir).rstrip('/')}-warm-s{seed}-n{steps}")
    settings = {"model": str(Path(model_dir).resolve()), "seed": seed, "steps": steps, "batch_size": batch_size,
                "lr": lr, "n_train": n_train, "n_heldout": n_heldout, "max_new_tokens": max_new_tokens,
                "threads": threads, "generator_version": gsm.GENERATOR_VERSION}
    if out.exists():
        try:
            old = json.loads((out / WARMUP_STAMP).read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if isinstance(old, dict) and old.get("settings") == settings:
            click.echo(f"reused {out}: held-out accuracy {old['heldout_accuracy']:.3f}")
            return
        raise LLMUserError(f"{out} exists and was not warmed up with these settings; remove it or choose another --out")
    try:
        loaded = m.load(model_dir)
    except m.ModelLoadError as e:
        raise LLMUserError(str(e)) from None
    splits = gsm.make_splits(seed=seed, n_train=n_train, n_heldout=n_heldout)
    t0, c0 = time.perf_counter(), time.process_time()
    result = w.warmup(loaded.model, loaded.tokenizer, splits.train, steps=steps, seed=seed, batch_size=batch_size,
                      lr=lr, log=lambda s, loss: click.echo(f"step {s} loss {loss:.3f}", err=True), log_every=100)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    acc = sampling.evaluate(loaded.model, loaded.tokenizer, splits.heldout, greedy=True, max_new_tokens=max_new_tokens)
    eval_wall = time.perf_counter() - t1
    stamp = {"settings": settings, "heldout_accuracy": acc, "final_loss": result.final_loss, "tokens": result.tokens,
             "train_wall_s": round(train_wall, 2), "train_cpu_s": round(train_cpu, 2), "eval_wall_s": round(eval_wall, 2),
             "load_average": list(os.getloadavg())}
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)   # a leftover of an interrupted warmup
    m.save(loaded.model, loaded.tokenizer, tmp)
    (tmp / WARMUP_STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(tmp, out)
    click.echo(f"warmed up {out}: held-out accuracy {acc:.3f} on {len(splits.heldout)} problems, "
               f"train {train_wall:.0f} s wall ({train_cpu:.0f} s CPU), eval {eval_wall:.0f} s")


@llm.command("eval", short_help="Greedy exact-match accuracy of a model on GSM8k-format problems.")
@click.option("--model", "model_dir", type=click.Path(), required=True, help="Hugging Face causal-LM directory.")
@click.option("--file", "jsonl", type=click.Path(), default=None,
              help="GSM8k JSONL file to evaluate on (default: the generated held-out split of --seed).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated held-out split.")
@click.option("--limit", type=int, default=500, show_default=True, help="Evaluate the first N problems.")
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Generation budget.")
@click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads (0: torch's default).")
def eval_cmd(model_dir, jsonl, seed, limit, max_new_tokens, threads) -> None:
    """Greedy exact-match accuracy of a model on GSM8k-format problems."""
    from . import gsm, model as m, sampling
    _threads(threads)
    try:
        problems = gsm.load_jsonl(jsonl) if jsonl else gsm.make_splits(seed=seed, n_train=0, n_heldout=limit).heldout
        loaded = m.load(model_dir)
    except (FileNotFoundError, gsm.GSMFormatError, m.ModelLoadError) as e:
        raise LLMUserError(str(e)) from None
    problems = problems[:limit]
    acc = sampling.evaluate(loaded.model, loaded.tokenizer, problems, greedy=True, max_new_tokens=max_new_tokens)
    click.echo(f"accuracy {acc:.3f} on {len(problems)} problems")


if __name__ == "__main__":   # python -m asyncrl.tasks.llm.cli ... until the main CLI wires the group in
    llm()
