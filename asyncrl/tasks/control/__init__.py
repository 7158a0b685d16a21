"""Control tasks (gymnasium, MuJoCo): :class:`ControlTask` and :class:`ControlProducer`.

Imported lazily (PEP 562): ``asyncrl.tasks.control.policy`` and ``.update``, the learner's maths,
import without gymnasium, which a machine that only runs the learner (bench/learner_speed.py on a
lent GPU machine) may lack."""

from __future__ import annotations

from typing import Any

__all__ = ["ControlProducer", "ControlTask"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from asyncrl.tasks.control import task

        return getattr(task, name)
    raise AttributeError(f"module 'asyncrl.tasks.control' has no attribute {name!r}")
