"""The ``asyncrl`` command (console script) and ``python -m asyncrl``, which launchers and studies use
to start roles and runs.

A stop signal (Ctrl-C, SIGTERM) that arrives while the command line still imports its libraries is
recorded and acted on once they are imported: an exception raised inside an import can leave numpy
half-initialised, or be lost in torch's C++ code (which then aborts, or lets the command go on as if
nothing had happened)."""

from __future__ import annotations

import sys

from asyncrl.core import exit_status

# commands that import torch (and the roles' libraries) anyway: imported here, under the deferral
_PRELOAD = {"run", "learner", "actor", "broadcaster", "eval", "study", "llm"}


def main() -> None:
    exit_status.install_stop_handlers(defer=True)
    try:
        from asyncrl.cli import main as command_line

        if sys.argv[1:2] and sys.argv[1] in _PRELOAD:
            import torch  # noqa: F401
        exit_status.arm()
    except KeyboardInterrupt:
        print("interrupted: before asyncrl started", flush=True)
        sys.exit(exit_status.interrupted_status())
    command_line(prog_name="asyncrl")


if __name__ == "__main__":
    main()
