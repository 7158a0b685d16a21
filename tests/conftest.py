"""Shared by every test folder: pytest puts this folder on sys.path (it holds a conftest.py), so
helper modules here (slot_examples.py) import from tests/ and tests/integration/ alike.

The learner compiles its optimizer step by default (``learner.compile``; docs/decisions/learner-compile.md):
several seconds of CPU per learner process, which the suite's hundreds of short runs would each pay,
and in one long-lived process (pytest's own) every new learner is one more recompile of the same
function, until torch's recompile limit turns later learners eager in the middle of a comparison.
So the suite runs with torch's ``TORCH_COMPILE_DISABLE=1`` (set here before torch is imported: this
process and every process a test starts run the compiled step's code uncompiled), and the tests
marked ``compiles`` compile for real: in this process, from a reset compile cache, in every thread
(the warm-up thread too), and in the processes they start. The compiled step's arithmetic is
checked against the eager step's in tests/test_fused_step.py."""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

import pytest  # noqa: E402
import torch._dynamo  # noqa: E402


@pytest.fixture(autouse=True)
def _real_compile_where_marked(request, monkeypatch):
    """Tests marked ``compiles``: torch.compile compiles, here (every thread) and in their processes."""
    if request.node.get_closest_marker("compiles") is None:
        yield
        return
    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    # dynamo's config keeps a user's setting per thread; its default is read by every thread
    monkeypatch.setattr(torch._dynamo.config._config["disable"], "default", False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
