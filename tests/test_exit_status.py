"""Stop signals during a command's start-up (asyncrl.core.exit_status): recorded while libraries import,
raised once the command is armed; an interrupt a library swallowed still ends a waiting role. Each
case runs in a child process, so pytest's own signal handlers stay untouched."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _child(body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a child whose SIGINT is at its default, as in a terminal: a suite started in
    the background (``.ci/run &``) passes SIGINT down ignored, and exit_status keeps an ignored SIGINT."""
    from asyncrl.run.pdeathsig import sigint_as_in_a_terminal

    code = "import os, signal\nimport asyncrl.core.exit_status as exit_status\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        preexec_fn=sigint_as_in_a_terminal,
    )


def test_a_stop_during_deferred_start_up_is_raised_by_arm_not_inside_the_import():
    out = _child("""
        exit_status.install_stop_handlers(defer=True)
        os.kill(os.getpid(), signal.SIGTERM)      # arrives "inside an import": nothing is raised
        print("import finished")
        try:
            exit_status.arm()
        except KeyboardInterrupt:
            print("raised by arm", exit_status.interrupted_status())
    """)
    assert out.stdout.splitlines() == ["import finished", "raised by arm 143"], out


def test_after_arm_a_stop_raises_at_once_and_later_ones_are_ignored():
    out = _child("""
        exit_status.install_stop_handlers(defer=True)
        exit_status.arm()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            print("not raised")
        except KeyboardInterrupt:
            print("raised", exit_status.interrupted_status())
        os.kill(os.getpid(), signal.SIGINT)        # a second one: ignored, the cleanup goes on
        print("cleanup done")
    """)
    assert out.stdout.splitlines() == ["raised 130", "cleanup done"], out


def test_check_stop_raises_an_interrupt_that_was_swallowed():
    out = _child("""
        exit_status.install_stop_handlers()
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            pass                                     # a library's bare except
        try:
            exit_status.check_stop()
            print("lost")
        except KeyboardInterrupt:
            print("stopped", exit_status.interrupted_status())
    """)
    assert out.stdout.splitlines() == ["stopped 130"], out


def test_check_stop_is_quiet_without_a_signal():
    out = _child("""
        exit_status.install_stop_handlers()
        exit_status.check_stop()
        print("ok")
    """)
    assert out.stdout.splitlines() == ["ok"], out
