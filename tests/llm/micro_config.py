"""The llm config the unit tests share: the micro model of conftest's ``micro_dir``, no warm-up, groups
of 2, two prompts per slot, short completions; each test adds its own ``--set`` lines (a later one wins)."""

from __future__ import annotations

from asyncrl.core import config


def micro_cfg(micro_dir, *sets: str):
    """``config.load`` of the shared micro-model settings followed by ``sets``."""
    return config.load(
        None,
        [
            "task.kind=llm",
            f"llm.model_dir={micro_dir}",
            "llm.warmup_steps=0",
            "llm.group_size=2",
            "llm.prompts_per_slot=2",
            "llm.max_prompt_tokens=160",
            "llm.max_new_tokens=12",
            *sets,
        ],
    )
