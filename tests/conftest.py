"""Shared by every test folder: pytest puts this folder on sys.path (it holds a conftest.py), so
helper modules here (slot_examples.py) import from tests/ and tests/integration/ alike.

The learner compiles its optimizer step by default (``learner.compile``; docs/decisions/learner-compile.md):
several seconds of CPU per learner process, which the suite's hundreds of short runs would each pay.
The processes a test starts therefore inherit torch's ``TORCH_COMPILE_DISABLE=1`` and run the
compiled step's code eagerly, while this process (torch imported first) compiles for real, and the
tests marked ``compiles`` (a compiled multi-process run, compiled learner-group members) give their
processes the real compile. The compiled step's arithmetic is checked against the eager step's in
tests/test_fused_step.py. ``TORCH_COMPILE_DISABLE=0 make test`` compiles everywhere."""

from __future__ import annotations

import os

import pytest
import torch._dynamo  # noqa: F401  (its config read before the variable is set: this process keeps compiling)

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")


@pytest.fixture(autouse=True)
def _real_compile_in_child_processes(request, monkeypatch):
    """Tests marked ``compiles``: the processes they start compile (no TORCH_COMPILE_DISABLE)."""
    if request.node.get_closest_marker("compiles") is not None:
        monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    yield
