"""The training code a study cell's key includes, and the check that lets a pure move of modules keep
a study's finished cells (``asyncrl study FILE --alias-code REV``).

Training code is every module a run imports; the reporting modules (study runner and report, stats,
plots, ...) are not, so changing them re-runs nothing. Which modules those are is data:

- ``TRAINING_FOLDERS`` None (the flat layout): every module of the package except the
  ``REPORTING_MODULES`` at its top (a hand-kept list);
- ``TRAINING_FOLDERS`` a tuple of folder names: the package's top-level modules (``__init__.py``,
  ``__main__.py``) and every module under those folders: every folder but ``analysis/``.

A move of modules into folders changes every fingerprint although no run changes. ``alias_check``
proves that a revision's training code and this checkout's differ by the layout only: each module,
named by the shortest dotted suffix of its path that no other module of its tree ends with, has the
same syntax tree in both once docstrings are dropped and every import of a package module is written
as the imported module's name. Any other change (a statement, a constant, an import of another
module, a module added or removed) fails the check, and the cells run again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # the asyncrl package (this module is in analysis/)
# Modules that only read or report results in the flat layout of older revisions (a revision's own
# code decides its fingerprint; kept for reading them, see the probe below).
REPORTING_MODULES = {
    "study.py",
    "study_report.py",
    "stats.py",
    "plots.py",
    "lag_report.py",
    "evaluate.py",
    "study_ray.py",
    "provenance.py",
    "study_file.py",
    "study_code.py",
    "study_store.py",
    "study_record.py",
}
# The folders a run imports: every folder of the package but analysis/ (which no run imports:
# tests/test_study_code.py runs a cell and checks both). None: the flat layout (REPORTING_MODULES decides).
TRAINING_FOLDERS: tuple[str, ...] | None = ("algo", "cli", "core", "roles", "run", "tasks", "wire")
# Where a revision's tree keeps training_code_files / training_code_fingerprint (newest first); a
# module that moves adds its new name here, so revisions before and after the move can be probed.
CODE_MODULES = ("asyncrl.analysis.study_code", "asyncrl.study_code", "asyncrl.study")


def training_code_files(
    package: Path = PACKAGE,
    folders: tuple[str, ...] | None = TRAINING_FOLDERS,
    reporting: set[str] | frozenset[str] = frozenset(REPORTING_MODULES),
) -> list[Path]:
    """The modules that can change a run, sorted: see the module docstring."""
    if folders is None:
        return [p for p in sorted(package.rglob("*.py")) if not (p.name in reporting and p.parent == package)]
    files = {p for f in folders for p in (package / f).rglob("*.py")}
    files |= set(package.glob("*.py"))  # the package's __init__.py and __main__.py (the command's entry)
    return sorted(files)


def training_code_fingerprint(package: Path = PACKAGE, folders: tuple[str, ...] | None = TRAINING_FOLDERS) -> str:
    """sha256 (16 hex digits) over the path and source of every training module."""
    h = hashlib.sha256()
    for path in training_code_files(package, folders):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit() -> str:
    """The checkout's commit, with "+dirty" when training code has uncommitted changes; "unknown"
    outside a git checkout."""
    try:

        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=PACKAGE, capture_output=True, text=True, timeout=10).stdout

        sha, top = git("rev-parse", "HEAD").strip(), git("rev-parse", "--show-toplevel").strip()
        status = git("status", "--porcelain", "--", ".").splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    training = set(training_code_files())
    changed = [(Path(top) / line[3:].split(" -> ")[-1].strip('"')).resolve() for line in status]
    dirty = [
        p for p in changed if not p.exists() or any(t == p or t.is_relative_to(p) for t in training)
    ]  # a new folder too
    return (sha or "unknown") + ("+dirty" if dirty else "")


# -- layout check -------------------------------------------------------------------------------


def _module_names(package: Path) -> dict[Path, str]:
    """Dotted name (relative to the package; "" for its own __init__) of every module under it."""
    out = {}
    for p in package.rglob("*.py"):
        parts = p.relative_to(package).with_suffix("").parts
        out[p] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return out


def _identities(names) -> dict[str, str]:
    """Each dotted module name's shortest suffix that no other name ends with (one tree alone)."""
    split = {n: n.split(".") if n else [] for n in names}
    out = {}
    for n, parts in split.items():
        out[n] = "<package>" if not parts else ".".join(parts)
        for k in range(1, len(parts) + 1):
            if not any(o != n and len(ps) >= k and ps[-k:] == parts[-k:] for o, ps in split.items()):
                out[n] = ".".join(parts[-k:])
                break
    return out


def _common_suffix(a: str, b: str) -> int:
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[-1 - k] == pb[-1 - k]:
        k += 1
    return k


def paired_identities(old_names, new_names) -> tuple[dict[str, str], dict[str, str]]:
    """One label per module of two trees, the same for a module and its moved self: modules of one
    file name are paired by the same dotted name first, then by the longest common suffix of their
    dotted names, then the one left on each side with each other (``spec`` and ``core.spec`` beside
    ``tasks.llm.spec`` in both). The label is the new tree's identity (:func:`_identities`); an
    unpaired old module keeps its own, marked as gone."""
    ident_new = _identities(new_names)
    old_label, new_label = {}, dict(ident_new)
    leaf = lambda n: n.rsplit(".", 1)[-1] if n else ""  # noqa: E731
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for n in old_names:
        groups.setdefault(leaf(n), ([], []))[0].append(n)
    for n in new_names:
        groups.setdefault(leaf(n), ([], []))[1].append(n)
    ident_old = _identities(old_names)
    for olds, news in groups.values():
        olds, news = sorted(olds), sorted(news)
        pairs = [(o, o) for o in olds if o in news]
        olds = [o for o in olds if o not in news]
        news = [n for n in news if all(n != b for _, b in pairs)]
        while olds and news:
            best = max((_common_suffix(o, n), o, n) for o in olds for n in news)
            k, o, n = best
            ties = [(o2, n2) for o2 in olds for n2 in news if _common_suffix(o2, n2) == k]
            if len(ties) > 1 and not (len(olds) == 1 and len(news) == 1):
                break  # ambiguous: leave them unpaired (the check then refuses)
            pairs.append((o, n))
            olds.remove(o)
            news.remove(n)
        for o, n in pairs:
            old_label[o] = ident_new[n]
        for o in olds:
            old_label[o] = "gone:" + ident_old[o]
    return old_label, new_label


class _Normalise(ast.NodeTransformer):
    """Drops docstrings; writes each import of a package module (or of a name from one) as a string
    constant naming the module by its identity, so a move leaves the tree unchanged."""

    def __init__(self, root: str, name: str, is_package: bool, ident: dict[str, str]):
        self.root, self.name, self.is_package, self.ident = root, name, is_package, ident

    def _docstring(self, node):
        self.generic_visit(node)
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Pass()])
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _docstring

    def _inside(self, dotted: str) -> str | None:
        if dotted == self.root:
            return ""
        return dotted[len(self.root) + 1 :] if dotted.startswith(self.root + ".") else None

    def visit_Import(self, node):
        if all(self._inside(a.name) is None for a in node.names):
            return node
        return ast.Expr(
            ast.Constant(
                " ".join(
                    "import "
                    + (a.name if self._inside(a.name) is None else "@" + self.ident.get(self._inside(a.name), "?"))
                    + f" as {a.asname or a.name}"
                    for a in node.names
                )
            )
        )

    def visit_ImportFrom(self, node):
        if node.level:
            pkg = self.name.split(".") if self.name else []
            pkg = pkg if self.is_package else pkg[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            base = ".".join(pkg + (node.module.split(".") if node.module else []))
        else:
            base = self._inside(node.module or "")
            if base is None:
                return node
        parts = []
        for a in node.names:
            full = f"{base}.{a.name}" if base else a.name
            what = f"@{self.ident[full]}" if full in self.ident else f"@{self.ident.get(base, '?' + base)}:{a.name}"
            parts.append(f"{what} as {a.asname or a.name}")
        return ast.Expr(ast.Constant("from " + " ".join(parts)))


def layout_signature(
    package: Path, files, root: str = "asyncrl", ident: dict[str, str] | None = None
) -> dict[str, str]:
    """{identity: normalised syntax tree} of ``files`` (modules of ``package``); a package's
    ``__init__.py`` with nothing left once normalised is left out (a new folder's empty one).
    ``ident``: the label of each dotted module name (default: :func:`_identities` of this tree)."""
    names = _module_names(package)
    ident = ident if ident is not None else _identities(names.values())
    out = {}
    for p in files:
        p = Path(p)
        name = names[p]
        tree = _Normalise(root, name, p.name == "__init__.py", ident).visit(ast.parse(p.read_bytes()))
        if p.name == "__init__.py" and not tree.body:
            continue
        out[ident[name]] = ast.dump(tree)
    return out


def layout_difference(old: tuple[Path, list], new: tuple[Path, list], root: str = "asyncrl") -> str | None:
    """None when the training modules of ``new`` (package, training files) are those of ``old`` moved
    (same identity, same normalised tree), for the modules either counts as training code; else one
    line naming the first difference."""
    (old_pkg, old_files), (new_pkg, new_files) = old, new
    names_old, names_new = _module_names(old_pkg), _module_names(new_pkg)
    ident_old, ident_new = paired_identities(list(names_old.values()), list(names_new.values()))
    train_old = {ident_old[names_old[Path(p)]] for p in old_files}
    train_new = {ident_new[names_new[Path(p)]] for p in new_files}
    sig_old = layout_signature(old_pkg, sorted(names_old), root, ident_old)
    sig_new = layout_signature(new_pkg, sorted(names_new), root, ident_new)
    for i in sorted(train_old | train_new):
        if i not in sig_old and i not in sig_new:
            continue  # an empty __init__ on both sides
        if i not in sig_old:
            return f"module {i} is new"
        if i not in sig_new:
            return f"module {i.removeprefix('gone:')} is gone"
        if sig_old[i] != sig_new[i]:
            return f"module {i} changed (not only moved)"
    return None


_PROBE = """
import importlib, json, sys
from pathlib import Path
for name in sys.argv[1].split(","):
    try:
        m = importlib.import_module(name)
    except ImportError:
        continue
    if not Path(m.__file__).resolve().is_relative_to(Path(sys.argv[2]).resolve()):
        continue       # an editable install's finder supplies a module the revision does not have
    if hasattr(m, "training_code_files"):
        files = m.training_code_files()
    elif hasattr(m, "REPORTING_MODULES"):
        files = [p for p in sorted(m.PACKAGE.rglob("*.py"))
                 if not (p.name in m.REPORTING_MODULES and p.parent == m.PACKAGE)]
    else:
        continue
    print(json.dumps({"fingerprint": m.training_code_fingerprint(), "package": str(m.PACKAGE),
                      "files": [str(f) for f in files]}))
    break
"""


class AliasError(ValueError):
    """A revision's training code cannot be aliased to this checkout's; the message says why."""


def alias_check(revision: str, package: Path = PACKAGE, folders: tuple[str, ...] | None = TRAINING_FOLDERS) -> dict:
    """{"old", "new", "revision"}: the training-code fingerprints of git ``revision`` (computed by that
    revision's own code, from its tree) and of ``package``, when the two differ by a move of modules
    only (:func:`layout_difference`).

    Raises:
        AliasError: not a git revision of the package's repository, or more than modules moved.
    """

    def git(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=top or package, capture_output=True, timeout=60, **kw)

    top = ""
    top = git("rev-parse", "--show-toplevel", text=True).stdout.strip()
    sha = git("rev-parse", "--verify", f"{revision}^{{commit}}", text=True).stdout.strip()
    if not top or not sha:
        raise AliasError(f"{revision!r} is not a commit of the git repository holding {package}")
    rel = package.resolve().relative_to(Path(top).resolve())
    with tempfile.TemporaryDirectory(prefix="asyncrl-alias-") as tmp:
        tar = git("archive", "--format=tar", sha, "--", str(rel))
        if tar.returncode:
            raise AliasError(f"git archive {sha} {rel}: {tar.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=tar.stdout, check=True, timeout=60)
        old_root = Path(tmp) / rel.parent
        env = {**os.environ, "PYTHONPATH": str(old_root)}
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, ",".join(CODE_MODULES), tmp],
            cwd=old_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        try:
            got = json.loads(probe.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise AliasError(
                f"revision {sha[:12]}: its fingerprint could not be computed: {probe.stderr.strip()[-500:]}"
            ) from None
        old_pkg = Path(got["package"])
        if not old_pkg.resolve().is_relative_to(Path(tmp).resolve()):
            raise AliasError(f"revision {sha[:12]}: the probe imported {old_pkg}, not the revision's tree")
        new_files = training_code_files(package, folders)
        diff = layout_difference((old_pkg, got["files"]), (package, new_files), root=package.name)
        if diff:
            raise AliasError(
                f"revision {sha[:12]} and this checkout differ by more than a move: {diff}; the cells run again"
            )
    return {"old": got["fingerprint"], "new": training_code_fingerprint(package, folders), "revision": sha}
