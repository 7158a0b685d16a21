"""Tokenizer and tiny causal LM in Hugging Face format, made locally; loading any HF causal LM by path.

:func:`prepare` trains a byte-level BPE tokenizer (Hugging Face ``tokenizers``) on the generated task's
text and initialises a tiny Qwen2 model (``transformers``) from a config kept in the repo
(configs/llm/tiny-qwen2.json), then saves both with ``save_pretrained`` into one directory
(config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json), so
``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained(PATH, local_files_only=True)`` load it.
The directory is cached: preparing again with the same settings reuses it.

Nothing here contacts a hub: :func:`load` accepts only an existing directory and passes
``local_files_only=True``; the CLI also sets ``HF_HUB_OFFLINE=1``.

The tokenizer splits every digit into its own token (arithmetic on whole numbers is then learnt per
digit, as in Llama's and Qwen's tokenizers) before byte-level BPE merges words.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from asyncrl.core.metrics import strict_json
from asyncrl.tasks.llm import gsm_problems


def build_lock(out: str | Path):
    """An exclusive lock (``filelock.FileLock`` on ``.NAME.lock`` beside ``out``) held while a
    cached directory is checked and, if missing, built: parallel runs (a study's cells, test
    sessions, the roles of one run) that need the same model wait for the first to build it, then
    reuse it, instead of building it twice into one temporary directory or failing at the rename.
    Creates ``out``'s parent directory."""
    from filelock import FileLock

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(out.with_name(f".{out.name}.lock")))


EOS_TOKEN = "<|endoftext|>"  # also the padding token (padding positions are masked, never trained on)
DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "llm" / "tiny-qwen2.json"
STAMP = "asyncrl-prepare.json"  # the settings a prepared directory was made with (its cache key)


class ModelLoadError(RuntimeError):
    """A model directory that is missing or not a Hugging Face causal-LM directory (one-line message)."""


class Loaded(NamedTuple):
    """model: a transformers causal LM (eval mode, float32 on CPU); tokenizer: its fast tokenizer with
    left padding and a pad token."""

    model: object
    tokenizer: object


def train_tokenizer(texts: list[str], *, vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer with single-digit pre-tokenisation on ``texts``.

    Args:
        texts: training strings (prompts and completions of the train split).
        vocab_size: target vocabulary size including the 256 byte symbols and EOS; >= 300.

    Returns:
        transformers.PreTrainedTokenizerFast with eos_token = pad_token = ``<|endoftext|>``,
        padding_side = "left" (batched generation), no BOS.

    Raises:
        ValueError: vocab_size < 300 or no texts.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + merges), got {vocab_size}")
    if not texts:
        raise ValueError("train_tokenizer needs at least one text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def tiny_model(config_path: str | Path, tokenizer, *, seed: int):
    """A freshly initialised causal LM from a JSON config (``model_type`` picks the architecture).

    Args:
        config_path: JSON file of a transformers config (e.g. configs/llm/tiny-qwen2.json);
            vocab_size and the special token ids are taken from ``tokenizer``.
        tokenizer: the tokenizer the model will use.
        seed: torch seed for the initial weights (the global torch RNG is reseeded).

    Returns:
        transformers PreTrainedModel in float32, train mode off.

    Raises:
        FileNotFoundError: no config file. ValueError: the file is not a JSON object with a known
            ``model_type``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"model config not found: {path}")
    try:
        spec = json.loads(path.read_text())
        model_type = spec.pop("model_type")
        cfg = AutoConfig.for_model(model_type, **spec)
    except (json.JSONDecodeError, KeyError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a transformers config with a known model_type ({e})") from None
    cfg.vocab_size = len(tokenizer)
    cfg.eos_token_id = cfg.pad_token_id = tokenizer.eos_token_id
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def num_parameters(model) -> int:
    """Distinct parameters of ``model`` (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def _settings(config_path: Path, seed: int, vocab_size: int, n_texts: int) -> dict:
    import tokenizers
    import transformers

    return {
        "config": json.loads(config_path.read_text()),
        "seed": seed,
        "vocab_size": vocab_size,
        "n_texts": n_texts,
        "generator_version": gsm_problems.GENERATOR_VERSION,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def settings_key(settings: dict) -> str:
    """sha256 (hex, 16 chars) of the canonical JSON of ``settings``: the cache key of a prepared directory."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def prepare(
    out_dir: str | Path,
    *,
    seed: int = 0,
    config_path: str | Path = DEFAULT_CONFIG,
    vocab_size: int = 1024,
    n_texts: int = 20000,
) -> tuple[Path, bool]:
    """Make (or reuse) a directory holding the tokenizer and the freshly initialised tiny model.

    The tokenizer is trained on the prompts + completions of ``gsm_problems.make_splits(seed=seed,
    n_train=n_texts)``'s train split; the model is initialised with torch seed ``seed``.
    The settings (config file content, seed, vocab_size, n_texts, generator and library versions) are
    written to ``out_dir/asyncrl-prepare.json``; a directory whose stamp matches is reused as it is.
    The directory is written to a temporary sibling and renamed into place, so an interrupted prepare
    leaves nothing half-made.

    Args:
        out_dir: target directory (created).
        seed: tokenizer data and initial weights.
        config_path: transformers JSON config of the architecture.
        vocab_size: tokenizer vocabulary size.
        n_texts: generated training problems the tokenizer is trained on.

    Returns:
        (out_dir as a Path, reused) where reused is True when the cached directory was kept.

    Raises:
        FileExistsError: out_dir exists but was made with other settings, or is not a prepared
            directory (nothing is overwritten).
        FileNotFoundError / ValueError: from :func:`tiny_model`.
    """
    out, cfg_path = Path(out_dir), Path(config_path)
    if not cfg_path.is_file():
        raise FileNotFoundError(f"model config not found: {cfg_path}")
    settings = _settings(cfg_path, seed, vocab_size, n_texts)
    key = settings_key(settings)
    with build_lock(out):  # a parallel prepare of the same directory builds it once
        if out.exists():
            if _prepared_key(out) == key:
                return out, True
            raise FileExistsError(
                f"{out} exists and was not prepared with these settings; remove it or choose another directory"
            )
        splits = gsm_problems.make_splits(seed=seed, n_train=n_texts, n_heldout=0)
        texts = [gsm_problems.format_prompt(p) + gsm_problems.format_completion(p) for p in splits.train]
        tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
        model = tiny_model(cfg_path, tokenizer, seed=seed)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            stamp = {"key": key, "settings": settings, "num_parameters": num_parameters(model)}
            save(model, tokenizer, tmp, stamp=stamp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out, False


def _prepared_key(out: Path) -> str | None:
    """The settings key of a complete prepared directory (stamp, config, weights, tokenizer), else None."""
    try:
        key = json.loads((out / STAMP).read_text()).get("key")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    complete = all((out / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))
    return key if complete else None


def save(model, tokenizer, out_dir: str | Path, *, stamp: dict | None = None) -> Path:
    """save_pretrained of model (safetensors) and tokenizer into ``out_dir``, plus an optional JSON stamp
    (``asyncrl-prepare.json``, or any dict given: it records how the weights were made)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if stamp is not None:
        (out / STAMP).write_text(strict_json(stamp, indent=1, sort_keys=True) + "\n")
    return out


def load(path: str | Path) -> Loaded:
    """Load any Hugging Face causal-LM directory on disk (model + tokenizer), never from a hub.

    Args:
        path: a directory written by ``save_pretrained`` (config.json, weights, tokenizer files).

    Returns:
        :class:`Loaded` (model in eval mode, float32; tokenizer with padding_side "left" and a pad
        token: EOS, or the first stop token, when the tokenizer had none).

    Raises:
        ModelLoadError: path missing, not a directory, without config.json, or not loadable as a
            causal LM and tokenizer (one line, with the cause).
    """
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    require_model_dir(p)
    tokenizer = load_tokenizer(p)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load {p}: {_first_line(e)}") from None
    return Loaded(model.eval(), tokenizer)


def require_model_dir(p: Path) -> None:
    """Raise ModelLoadError (one line) unless ``p`` is a directory with a config.json (what :func:`load`
    checks before it reads anything)."""
    _require_dir(p)
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"{p} has no config.json: not a Hugging Face model directory")


def _require_dir(p: Path) -> None:
    """Raise ModelLoadError (one line) unless ``p`` is a directory; for the example model's directory
    name, with the command that makes it."""
    if p.is_dir():
        return
    from asyncrl.tasks.llm.example_model import DEFAULT_NAME

    hint = " (make it with: asyncrl llm example-model)" if p.name == DEFAULT_NAME else ""
    raise ModelLoadError(f"model directory not found: {p}{hint}")


def load_tokenizer(path: str | Path):
    """The tokenizer of a model directory as :func:`load` gives it (left padding; EOS, or the first stop
    token, as the pad token when it has none), without loading the weights. Raises ModelLoadError (one line)."""
    from transformers import AutoTokenizer

    p = Path(path)
    _require_dir(p)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load {p}: {_first_line(e)}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = _pad_token(tokenizer, p)
    return tokenizer


def _pad_token(tokenizer, path: Path) -> str | None:
    """The pad token of a tokenizer without one: its EOS, else the first stop token of the model
    (generation_config.json's ``eos_token_id``, the chat template's end of turn), else None (the run is
    then refused for having no stop token). Padding is masked, so any token does; a stop token is
    special, so decoding with ``skip_special_tokens`` drops it, as it drops the EOS."""
    if tokenizer.eos_token is not None:
        return tokenizer.eos_token
    from asyncrl.core.config import ConfigError
    from asyncrl.tasks.llm import prompts
    from asyncrl.tasks.llm.datasets import generation_eos

    try:
        return tokenizer.convert_ids_to_tokens(prompts.stop_ids(tokenizer, generation_eos(path))[0])
    except (prompts.PromptError, ConfigError):
        return None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
