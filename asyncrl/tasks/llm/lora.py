"""Optional LoRA (Hu et al. 2021, arXiv:2106.09685) through ``peft``: the learner trains a low-rank
adapter on the frozen start model, and only the adapter's tensors travel per version (the generators
hold the same frozen base, loaded from the same model directory, and apply the adapter).

``llm.lora_rank`` > 0 turns it on; ``llm.lora_alpha`` (the update is scaled by alpha / rank),
``llm.lora_dropout`` and ``llm.lora_target_modules`` (module names, or peft's "all-linear": every linear
layer but the output head) are peft's ``LoraConfig`` fields. Defaults and why: docs/decisions/llm-weights.md.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import torch


def enabled(llm) -> bool:
    """Whether the config's ``[llm]`` section asks for LoRA (``lora_rank`` > 0)."""
    return llm.lora_rank > 0


def lora_config(llm):
    """peft's ``LoraConfig`` for the config's ``[llm]`` section (a causal LM; biases not trained)."""
    from peft import LoraConfig

    targets = llm.lora_target_modules
    return LoraConfig(
        r=llm.lora_rank,
        lora_alpha=llm.lora_alpha,
        lora_dropout=llm.lora_dropout,
        target_modules=targets[0] if targets == ("all-linear",) else list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def with_adapter(model, llm, *, own_rng: bool = False):
    """``model`` with a fresh LoRA adapter of ``llm``'s settings (peft ``get_peft_model``: base weights
    frozen, adapter trainable; B = 0, so the model's outputs are unchanged), or ``model`` itself when
    LoRA is off. ``own_rng``: draw the adapter's initial A from a forked generator, leaving torch's
    global one as it was (a generator's copy is overwritten by the first weights it is sent).

    Raises ValueError (peft's) for target modules the model does not have."""
    if not enabled(llm):
        return model
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]) if own_rng else contextlib.nullcontext(), warnings.catch_warnings():
        # peft 0.21 reads transformers 5's deprecated alias is_gradient_checkpointing (a FutureWarning in
        # every role's log, about their code, not this run)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, lora_config(llm))


def is_adapted(model) -> bool:
    """Whether ``model`` is a peft model (its flat weights are the adapter's)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft not installed: no model can be one
        return False
    return isinstance(model, PeftModel)


def meta_model(model_dir: str | Path, llm):
    """The model of ``model_dir``'s config.json (with the adapter of ``llm``, if on) on torch's meta
    device: its parameters' names and shapes, no memory, no weights read. For sizing a run's weights
    before any role starts. Raises ModelLoadError (one line) for a directory without a loadable config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncrl.tasks.llm.model import ModelLoadError

    p = Path(model_dir)
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"{p} has no config.json: not a Hugging Face model directory")
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot read the config of {p}: {str(e).strip().splitlines()[0]}") from None
    with torch.device("meta"):
        return with_adapter(AutoModelForCausalLM.from_config(config), llm)


def dropout_forwards(model, context: Callable[[], ContextManager]) -> Callable[[], ContextManager]:
    """A factory of the learner's forward context (``context``'s, e.g. bf16 autocast) that puts the
    adapter's dropout modules of ``model`` in train mode for forwards with gradient (the adapter's
    dropout is on) and in eval mode for those without (log π_T, which must be the policy's own,
    deterministic), back in eval mode after. Every other module stays in eval mode: the base model's
    own dropout (GPT-2's, OPT's, Phi's configs set 0.1) never runs, with or without gradient."""
    drops = [m for name, m in model.named_modules() if "lora_dropout" in name.split(".")]

    @contextlib.contextmanager
    def forward() -> Iterator[None]:
        for m in drops:
            m.training = torch.is_grad_enabled()
        try:
            with context():
                yield
        finally:
            for m in drops:
                m.training = False

    return forward
