"""A Learner run in the test's own process (driven by hand with ``Learner.serve``), shared by the
hostile-peer tests of tests/integration and tests/llm: bound to a free loopback port, its broadcaster
address unused, closed (its shared-memory segment removed) when the block ends."""

from __future__ import annotations

import contextlib
import os
import time

from asyncrl.roles.learner import Learner
from asyncrl.run.launch import free_port


@contextlib.contextmanager
def learner_in_process(cfg: dict, run_dir, run_id: str):
    """Yield a Learner of ``cfg`` writing to ``run_dir``; its run id is ``run_id`` made unique per
    process and moment (two tests' learners never share one)."""
    learner = Learner(
        cfg,
        run_dir,
        run_id=f"{run_id}-{os.getpid()}-{time.monotonic_ns() % 10**9}",
        bind="tcp://127.0.0.1:0",
        broadcaster=f"tcp://127.0.0.1:{free_port()}",
        echo=lambda *_: None,
    )
    try:
        yield learner
    finally:
        learner.close()
