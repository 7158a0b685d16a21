"""Fixtures of the multi-process integration tests; helpers live in mp_helpers.py."""

from __future__ import annotations

import pytest
from mp_helpers import Procs

from asyncrl.wire import sockets


@pytest.fixture
def procs(tmp_path):
    """The processes of one test: stopped (only they, by pid) at teardown, which then asserts that
    none is alive and that no shared-memory segment of ``procs.run_ids`` is left."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.shutdown()


@pytest.fixture
def ctx():
    """A ZeroMQ context for a test's own peers, destroyed (linger 0) at teardown."""
    c = sockets.context()
    yield c
    c.destroy(linger=0)
