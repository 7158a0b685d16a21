"""The package's dependency rules (docs/architecture.md), checked on the source: every import
statement of every module, at the top or inside a function, under ``if TYPE_CHECKING`` or not.

Layers, lowest first; a module may import its own folder and the folders listed for it:

    algo      pure math on tensors                       -
    core      config, specs, learner state, lag, metrics  algo
    wire      schemas, codec, sockets, security, ring     algo, core
    tasks     the task interface and the two task kinds   algo, core
    roles     actor, learner, broadcaster                 algo, core, wire, tasks
    run       serial, local supervisor, Ray               algo, core, wire, tasks, roles
    analysis  studies, statistics, plots, lag report      algo, core, tasks, run
    cli       the command line                            everything

``tasks.control`` and ``tasks.llm`` never import each other; ``tasks/__init__`` (the registry) may
import both. Third-party packages with a home: zmq only in wire; gymnasium and mujoco only in
tasks.control; transformers, tokenizers, safetensors and peft only in tasks.llm (and cli's llm
commands); ray only in run and analysis; matplotlib and click only in analysis and cli (click in
cli only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "asyncrl"
ALLOWED = {
    "algo": set(),
    "core": {"algo"},
    "wire": {"algo", "core"},
    "tasks": {"algo", "core"},
    "roles": {"algo", "core", "wire", "tasks"},
    "run": {"algo", "core", "wire", "tasks", "roles"},
    "analysis": {"algo", "core", "tasks", "run"},
    "cli": {"algo", "core", "wire", "tasks", "roles", "run", "analysis"},
}
THIRD_PARTY_HOME = {  # package -> the folders (or subfolders) that may import it
    "zmq": {"wire"},
    "gymnasium": {"tasks.control"},
    "mujoco": {"tasks.control"},
    "transformers": {"tasks.llm", "cli"},
    "tokenizers": {"tasks.llm", "cli"},
    "safetensors": {"tasks.llm", "cli"},
    "peft": {"tasks.llm", "cli"},
    "ray": {"run", "analysis"},
    "matplotlib": {"analysis", "cli"},
    "imageio": {"tasks.control"},
    "click": {"cli"},
}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from asyncrl.tasks import control` imports asyncrl.tasks.control
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names if target.startswith("asyncrl")]
    return found


def folder(module: str) -> str | None:
    """The layer of an asyncrl module ("core", "tasks", ...), None for the package's top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def violations() -> list[str]:
    mods = modules()
    bad = []
    for name, path in sorted(mods.items()):
        own = folder(name)
        rel = path.relative_to(PACKAGE.parent)
        for line, target in imports_of(name, path):
            if target.startswith("asyncrl."):
                if target not in mods:  # a name imported from a module, not a module
                    continue
                dep = folder(target)
                if own is None or dep is None or dep == own:
                    if own == "tasks" and dep == "tasks":
                        kinds = {
                            name.split(".")[2] if len(name.split(".")) > 3 else None,
                            target.split(".")[2] if len(target.split(".")) > 3 else None,
                        }
                        if {"control", "llm"} <= kinds:
                            bad.append(f"{rel}:{line}: {name} imports {target} (task kinds are independent)")
                    continue
                if dep not in ALLOWED[own]:
                    bad.append(
                        f"{rel}:{line}: {own} imports {target} ({own} may import: "
                        f"{', '.join(sorted(ALLOWED[own])) or 'nothing else'})"
                    )
            else:
                top = target.split(".")[0]
                homes = THIRD_PARTY_HOME.get(top)
                if homes and not any(name == "asyncrl." + h or name.startswith("asyncrl." + h + ".") for h in homes):
                    bad.append(f"{rel}:{line}: {name} imports {top} (only {', '.join(sorted(homes))} may)")
    return bad


def test_every_import_follows_the_layer_rules():
    assert violations() == []


def test_every_module_lives_in_a_layer():
    top = sorted(n for n in modules() if folder(n) is None and n not in ("asyncrl", "asyncrl.__main__"))
    assert top == [], f"modules at the top of the package: {top}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import zmq\n", "only wire may"),
        ("def f():\n    from asyncrl.wire import codec\n", "core imports asyncrl.wire.codec"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..tasks import base\n",
            "core imports asyncrl.tasks.base",
        ),
    ],
)
def test_the_checker_sees_lazy_and_type_only_imports(tmp_path, monkeypatch, source, expected):
    probe = PACKAGE / "core" / "_layout_probe.py"
    probe.write_text(source)
    try:
        assert any(expected in v for v in violations()), violations()
    finally:
        probe.unlink()


def test_no_module_is_over_the_size_limit():
    """About 400 lines a module (wc -l, formatted by ruff): past 450 it is split by responsibility."""
    over = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 450
    }
    assert over == {}, f"modules over 450 lines (split them by responsibility): {over}"
