"""The training code a study cell's key includes (asyncrl.analysis.study_code): which modules count, and the
check that lets a pure move of modules keep the finished cells while any real change re-runs them."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from asyncrl.analysis import study_code
from asyncrl.analysis.study_code import (
    AliasError,
    alias_check,
    layout_difference,
    training_code_files,
    training_code_fingerprint,
)


def _copy(tmp_path, name="pkg"):
    root = tmp_path / name
    shutil.copytree(study_code.PACKAGE, root / "asyncrl", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "asyncrl"


def _move_pdeathsig(pkg):
    """Move asyncrl/run/pdeathsig.py to asyncrl/core/pdeathsig.py and fix its imports."""
    (pkg / "run" / "pdeathsig.py").rename(pkg / "core" / "pdeathsig.py")
    for p in pkg.rglob("*.py"):
        text = p.read_text()
        new = re.sub(r"from asyncrl\.run\.pdeathsig import", "from asyncrl.core.pdeathsig import", text)
        new = re.sub(r"from asyncrl\.run import pdeathsig", "from asyncrl.core import pdeathsig", new)
        if new != text:
            p.write_text(new)


def test_a_move_keeps_the_layout_and_any_other_change_does_not(tmp_path):
    old, new = _copy(tmp_path, "old"), _copy(tmp_path, "new")
    _move_pdeathsig(new)
    assert training_code_fingerprint(old) != training_code_fingerprint(new)  # the move re-keys ...
    assert layout_difference((old, training_code_files(old)), (new, training_code_files(new))) is None  # ... only
    # comments and docstrings do not change a run
    moved = new / "core" / "pdeathsig.py"
    moved.write_text(re.sub(r'^"""', '"""Moved. ', moved.read_text(), count=1) + "\n# a comment\n")
    assert layout_difference((old, training_code_files(old)), (new, training_code_files(new))) is None
    # a statement does
    moved.write_text(moved.read_text() + "\nEXTRA = 1\n")
    assert (
        layout_difference((old, training_code_files(old)), (new, training_code_files(new)))
        == "module pdeathsig changed (not only moved)"
    )
    moved.write_text(moved.read_text().replace("\nEXTRA = 1\n", "\n"))
    # an import of another module does (config instead of metrics, under the same local name)
    launch = new / "run" / "launch.py"
    text = launch.read_text()
    launch.write_text(text.replace("from asyncrl.core.metrics import", "from asyncrl.core.config import", 1))
    assert "module launch changed" in layout_difference(
        (old, training_code_files(old)), (new, training_code_files(new))
    )
    launch.write_text(text)
    # a module added
    (new / "extra.py").write_text("X = 1\n")
    assert layout_difference((old, training_code_files(old)), (new, training_code_files(new))) == "module extra is new"


def test_the_training_folders_are_data(tmp_path):
    pkg = _copy(tmp_path)
    files = training_code_files(pkg, ("algo",))
    assert pkg / "__init__.py" in files and pkg / "__main__.py" in files and pkg / "algo" / "vaco_loss.py" in files
    assert all(p.parent in (pkg / "algo", pkg) for p in files)
    base = training_code_fingerprint(pkg, ("algo",))
    spec = pkg / "core" / "spec.py"
    spec.write_text(spec.read_text() + "\nX = 1\n")  # outside the folders
    assert training_code_fingerprint(pkg, ("algo",)) == base
    (pkg / "algo" / "vaco_loss.py").write_text((pkg / "algo" / "vaco_loss.py").read_text() + "\nX = 1\n")
    assert training_code_fingerprint(pkg, ("algo",)) != base
    # the default: every folder but analysis/
    default = training_code_files(pkg)
    assert spec in default and not any(p.is_relative_to(pkg / "analysis") for p in default)


def _git(repo, *args):
    subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(repo),
            "PATH": "/usr/bin:/bin",
        },
    )


def test_alias_check_computes_the_old_fingerprint_with_the_old_code(tmp_path):
    """The revision's fingerprint is what that revision's own code says (a probe imports its tree,
    not this checkout's); the alias holds when only modules moved and is refused otherwise."""
    pkg = _copy(tmp_path)
    repo = pkg.parent
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "old layout")
    before = training_code_fingerprint(pkg)
    _move_pdeathsig(pkg)
    got = alias_check("HEAD", package=pkg)
    assert got["old"] == before and got["new"] == training_code_fingerprint(pkg) != before
    lag = pkg / "core" / "lag.py"
    lag.write_text(lag.read_text() + "\nX = 1\n")
    with pytest.raises(AliasError, match="module lag changed"):
        alias_check("HEAD", package=pkg)
    with pytest.raises(AliasError, match="not a commit"):
        alias_check("no-such-revision", package=pkg)


def test_every_module_a_run_imports_is_training_code(tmp_path):
    """A serial run (the command's entry, the cli's run command, the learner state, the control task)
    and the role modules a multi-process run starts: each asyncrl module they import is in
    training_code_files, and none of them is under analysis/ (which the fingerprint leaves out)."""
    code = f"""
import json, sys
from click.testing import CliRunner
import asyncrl.__main__
from asyncrl.cli import main
r = CliRunner().invoke(main, ["run", "--serial", "--env", "asyncrl/Corridor-v0", "--total-steps", "256",
    "--run-dir", {str(tmp_path / "run")!r}, "--set", "env.num_envs=2", "--set", "env.rollout_length=16",
    "--set", "learner.slots_per_batch=2", "--set", "learner.num_slots=4"])
assert r.exit_code == 0, r.output
import asyncrl.run.launch, asyncrl.roles.learner, asyncrl.roles.actor, asyncrl.roles.broadcaster
mods = [m for n, m in sys.modules.items() if n.startswith("asyncrl")]
print(json.dumps(sorted(m.__file__ for m in mods if getattr(m, "__file__", None))))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    imported = set(json.loads(res.stdout.strip().splitlines()[-1]))
    counted = {str(p) for p in training_code_files()}
    uncounted = {str(p.relative_to(study_code.PACKAGE)) for p in map(study_code.Path, imported - counted)}
    assert uncounted == set()
    assert not any("/analysis/" in f for f in imported)
    assert len(imported) > 30  # the probe saw a real run's modules
