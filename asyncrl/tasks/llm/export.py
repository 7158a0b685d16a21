"""``asyncrl llm export RUN DIR``: the trained policy of an llm run as a Hugging Face directory.

DIR gets what ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load: the weights of the run's newest readable checkpoint
(safetensors, in the dtype the learner held them in), the start model's config, tokenizer and chat
template (as the start model's own files give them), its generation_config.json with the stop ids the
run used (``eos_token_id``) and its pad id, and ``asyncrl-export.json``, a stamp saying which run,
asyncrl version and checkpoint the weights came from.

The learner's trainable module becomes a plain transformers model in :func:`to_pretrained`: today the
module itself (full weights are trained); a module with adapters (peft's LoRA) gets them merged into
its base weights there, so the exported directory never needs peft to load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from asyncrl.core.metrics import strict_json

EXPORT_STAMP = "asyncrl-export.json"


class ExportError(ValueError):
    """What keeps a run from being exported (one line)."""


def to_pretrained(module) -> Any:
    """The learner's trainable module as a plain transformers ``PreTrainedModel`` to save.

    Args:
        module: what ``LLMTask.build_policy`` makes and the learner trains: a transformers causal LM
            (full weights, today's only case), or a peft model whose adapters (LoRA) are merged into
            the base weights here (``merge_and_unload``: the merged model computes what base + adapter
            computed, up to float rounding).

    Returns:
        A ``transformers.PreTrainedModel`` (for full weights: ``module`` itself).

    Raises:
        ExportError: a module that is neither.
    """
    from transformers import PreTrainedModel

    if hasattr(module, "merge_and_unload") and hasattr(module, "peft_config"):  # peft: merge the adapters
        module = module.merge_and_unload()
    if not isinstance(module, PreTrainedModel):
        raise ExportError(f"cannot export a {type(module).__name__}: not a transformers model or a peft model of one")
    return module


def run_config(run_dir: Path, checkpoint: dict | None):
    """The run's config: its checkpoint's (the learner's own) or, without one, config.json's.
    Raises ExportError when neither reads."""
    from asyncrl.core.config import ConfigError, from_dict, load

    try:
        if checkpoint is not None:
            return from_dict(checkpoint["config"])
        if (run_dir / "config.json").is_file():
            return load(run_dir / "config.json")
    except (ConfigError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{run_dir}: its config does not load here: {exc}") from None
    raise ExportError(f"{run_dir} is not a run directory (no config.json, no checkpoint)")


def export_run(run_dir: str | Path, out_dir: str | Path, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the trained policy of the llm run in ``run_dir`` (its newest readable checkpoint) into
    ``out_dir`` (new or empty) as a Hugging Face directory. Returns the stamp written.

    Raises:
        ExportError (one line, nothing written): ``run_dir`` missing or not a run directory, a run of
            another task kind, no readable checkpoint, ``out_dir`` not empty, the run's start model (its
            config and tokenizer) gone from its place, or a checkpoint whose weights do not fit it.
    """
    from asyncrl.core.state import read_checkpoint
    from asyncrl.tasks import make_task
    from asyncrl.tasks.llm import model as m

    run, out = Path(run_dir), Path(out_dir)
    if not run.is_dir():
        raise ExportError(f"run directory not found: {run}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory; name a new one")
    found = read_checkpoint(run)
    cfg = run_config(run, found[0] if found else None)
    if cfg.task.kind != "llm":
        raise ExportError(f"{run} is a {cfg.task.kind}-task run; export writes language models (task.kind = llm)")
    if found is None:
        raise ExportError(f"{run} has no readable checkpoint to export (a run writes checkpoint.pt when it ends)")
    ck, path, skipped = found
    for line in skipped:
        echo(f"export: {line}; using an older checkpoint")
    task = make_task(cfg)
    start = task.start_dir()
    try:
        module = task.build_policy()  # the learner's trainable module, as it starts
        tokenizer = m.load_tokenizer(start)
    except m.ModelLoadError as exc:
        raise ExportError(f"the run's start model is needed for its config and tokenizer: {exc}") from None
    if task.layout_hash(module) != ck.get("layout_hash"):
        raise ExportError(f"{path}: its weights do not fit the run's start model {start} (another layout)")
    dtypes = {t.dtype for t in ck["policy"].values() if t.is_floating_point()}
    if len(dtypes) == 1:  # the dtype the learner held the weights in (several: each tensor keeps the module's)
        module.to(dtypes.pop())
    try:
        module.load_state_dict(ck["policy"])
    except RuntimeError as exc:
        raise ExportError(f"{path}: weights do not fit the run's start model: {str(exc).splitlines()[0]}") from None
    model = to_pretrained(module)
    dtype = next(model.parameters()).dtype
    stop_ids = list(task.stop_ids(tokenizer))
    stamp = {
        "run_dir": str(run.resolve()),
        "checkpoint": {
            "file": path.name,
            "version": int(ck["version"]),
            "learner_iterations": int(ck["iteration"]),
            "env_steps": int(ck["env_steps"]),
        },
        "asyncrl_version": _version(),
        "code": _code(run),
        "start_model": str(start.resolve()),
        "preset": cfg.algo.preset,
        "seed": cfg.run.seed,
        "dtype": str(dtype).removeprefix("torch."),
        "adapter_merged": model is not module,
        "stop_ids": stop_ids,
        "temperature": cfg.llm.temperature,  # RL trained the policy softmax(logits / temperature)
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write(model, start, out, stop_ids=stop_ids, pad_id=tokenizer.pad_token_id, stamp=stamp)
    return stamp


def _write(model, start: Path, out: Path, *, stop_ids: list[int], pad_id: int | None, stamp: dict) -> None:
    """save_pretrained of the model (safetensors), the start model's own tokenizer files (as
    AutoTokenizer reads and writes them, not the run's padded copy), its generation config with the
    run's stop ids and pad id, and the stamp."""

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # renamed into place when whole
    try:
        _save(model, start, tmp, stop_ids=stop_ids, pad_id=pad_id, stamp=stamp)
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.iterdir():  # as files are made here (mkdtemp's directory and the weights come 0600)
            os.chmod(f, 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        os.replace(tmp, out)  # onto an empty directory too
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save(model, start: Path, out: Path, *, stop_ids: list[int], pad_id: int | None, stamp: dict) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(start, local_files_only=True)
    except OSError:  # a start model without generation_config.json
        generation = GenerationConfig.from_model_config(model.config)
    generation.eos_token_id = stop_ids[0] if len(stop_ids) == 1 else stop_ids
    generation.pad_token_id = pad_id
    model.generation_config = generation
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(start, local_files_only=True).save_pretrained(out)
    (out / EXPORT_STAMP).write_text(strict_json(stamp, indent=1) + "\n")


def _version() -> str | None:
    try:
        return metadata.version("asyncrl")
    except metadata.PackageNotFoundError:
        return None


def _code(run: Path) -> dict | None:
    """The code commit the run recorded in config.json (provenance), or None."""
    try:
        return json.loads((run / "config.json").read_text())["provenance"]["code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
