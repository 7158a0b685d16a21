"""`asyncrl study STUDY.toml`: a grid of envs x presets x lag conditions x seeds x any config axis,
each cell an ordinary `asyncrl run` (serial or multi-process), run ``jobs`` at a time and resumable.

A study file (TOML; configs/studies/ has examples):

    name = "quick"                      # results go to studies/<name>/ unless --out says otherwise
    total_env_steps = 500000
    seeds = [101, 102, 103, 104, 105]
    envs = ["HalfCheetah-v5", "Hopper-v5"]
    config = "configs/default.toml"     # optional base config; `set` adds overrides for every cell
    set = ["run.log_every_s=60"]
    [reference]                         # fixed before the study runs: normalised score 1 (STUDY.md)
    "HalfCheetah-v5" = 1443.0
    [modes]                             # optional: split between an env's low and high mode
    "HalfCheetah-v5" = 3000.0
    [[arm]]                             # cells = envs x presets x conditions x sweep x seeds
    presets = ["vaco", "ppo"]
    conditions = ["none", "age-8", "async-2", "straggler"]
    [[arm]]
    name = "delta"                      # label prefix (default: the preset)
    presets = ["vaco"]
    conditions = ["age-8"]
    sweep = {"algo.tv_threshold" = [0.05, 0.1, 0.2]}

Lag conditions (STUDY.md): ``none`` (serial), ``age-K`` (policy-age buffer K, serial),
``delay-K`` (policy delay K, serial), ``async-N`` (multi-process, N actors), ``straggler`` or
``straggler-N-S`` (multi-process, N actors, actor0 slowed by S seconds per rollout; default 2, 0.2).

Resume: a cell is keyed by the study name, its resolved config, its mode and the fingerprint of the
training code (every asyncrl module a run imports, not the reporting ones): a finished cell with the
same key is skipped, a killed study re-run continues, and a cell whose config or training code
changed gets a new key and runs again. Multi-process cells run alone on the machine (their lag and
speed depend on it); serial cells are bit-reproducible whatever the load.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import config as config_mod
from . import provenance
from .metrics import strict_json
from .pdeathsig import die_with_parent
from .wording import count_of

PACKAGE = Path(__file__).resolve().parent
# Modules that only read or report results: changing them does not change a cell's outcome.
# (study_ray.py only places cells: each Ray task checks its node's training code against the study's.)
REPORTING_MODULES = {"study.py", "study_report.py", "stats.py", "plots.py", "lag_report.py", "evaluate.py",
                     "study_ray.py", "provenance.py"}
CONDITION = re.compile(r"^(none|age-(\d+)|delay-(\d+)|async-(\d+)|straggler(?:-(\d+)-([0-9.]+))?)$")
STUDY_KEYS = {"name", "total_env_steps", "seeds", "envs", "config", "set", "reference", "modes", "arm",
              "random_episodes", "compare"}
ARM_KEYS = {"name", "presets", "conditions", "set", "sweep", "envs"}
CURVE_POINTS = 200
DIAGNOSTICS = ("tv_estimate", "no_grad_fraction", "clip_fraction_two_sided", "approx_kl", "entropy", "rho_mean",
               "filter_fire_rate", "no_grad_fraction_stale", "no_grad_fraction_fresh", "explained_variance")


class StudyError(ValueError):
    """A study file is wrong; the message names the field."""


def condition_settings(name: str) -> tuple[str, list[str]]:
    """(mode, overrides) of a lag condition: mode is "serial" or "multiprocess".

    Raises:
        StudyError: an unknown condition name.
    """
    m = CONDITION.match(name)
    if not m:
        raise StudyError(f"unknown lag condition {name!r}; use none, age-K, delay-K, async-N, straggler[-N-S]")
    if name == "none":
        return "serial", []
    if m.group(2):
        return "serial", [f"actor.policy_age_buffer={int(m.group(2))}"]
    if m.group(3):
        return "serial", [f"actor.policy_delay={int(m.group(3))}"]
    if m.group(4):
        return "multiprocess", [f"run.num_actors={int(m.group(4))}"]
    actors, slow = (int(m.group(5)), float(m.group(6))) if m.group(5) else (2, 0.2)
    return "multiprocess", [f"run.num_actors={actors}", f"run.straggler_slowdown_s={slow}"]


def training_code_fingerprint() -> str:
    """sha256 (16 hex digits) over the source of every asyncrl module that can change a run."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in REPORTING_MODULES and path.parent == PACKAGE:
            continue
        h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit() -> str:
    """The checkout's commit, with "+dirty" when training code has uncommitted changes; "unknown"
    outside a git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=PACKAGE, capture_output=True,
                                text=True, timeout=10).stdout.splitlines()
        dirty = [line for line in status if Path(line[3:]).name not in REPORTING_MODULES]
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if dirty else "")


@dataclass(frozen=True)
class Cell:
    label: str                 # the arm's name (or preset) plus its sweep values
    env: str
    preset: str
    condition: str
    seed: int
    overrides: tuple[str, ...]  # study + arm + sweep + condition settings, in that order
    mode: str                  # "serial" or "multiprocess"
    total_env_steps: int
    config_file: str | None = None

    def command(self, run_dir: Path) -> list[str]:
        """The `asyncrl run` command line of this cell."""
        cmd = [sys.executable, "-m", "asyncrl.cli", "run", *(["--serial"] if self.mode == "serial" else []),
               "--env", self.env, "--preset", self.preset, "--seed", str(self.seed),
               "--total-steps", str(self.total_env_steps), "--run-dir", str(run_dir)]
        if self.config_file:
            cmd += ["--config", self.config_file]
        for o in self.overrides:
            cmd += ["--set", o]
        return cmd + self._absolute_paths()

    def _absolute_paths(self) -> list[str]:
        """A cell runs in its own directory, so an llm cell's relative llm.cache_dir and llm.model_dir
        are made absolute against the study's working directory (every cell then shares one cached
        warm-up). Command line only: the cell's key keeps the paths as the study file gives them."""
        resolved = self.resolved_config()
        if resolved["task"]["kind"] != "llm":
            return []
        llm = resolved["llm"]
        return [a for key in ("cache_dir", "model_dir") if llm[key] and not Path(llm[key]).is_absolute()
                for a in ("--set", f"llm.{key}={Path(llm[key]).resolve()}")]

    def resolved_config(self) -> dict:
        cfg = config_mod.load(self.config_file, self.overrides, {
            "env": {"id": self.env}, "algo": {"preset": self.preset},
            "run": {"seed": self.seed, "total_env_steps": self.total_env_steps}})
        d = cfg.to_dict()
        for k in ("run_dir", "log_every_s"):       # where and how often it logs: not the outcome
            d["run"].pop(k, None)
        d.pop("transport", None)
        return d


@dataclass
class Study:
    name: str
    path: Path
    cells: list[Cell]
    reference: dict[str, float] = field(default_factory=dict)
    modes: dict[str, float] = field(default_factory=dict)
    random_episodes: int = 10
    compare: list[tuple[str, str]] = field(default_factory=list)


def _list(where: str, value, kind) -> list:
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise StudyError(f"{where} must be a non-empty list of {kind.__name__}, got {value!r}")
    return value


def load_study(path: str | Path, *, total_env_steps: int | None = None, seeds: list[int] | None = None,
               envs: list[str] | None = None, presets: list[str] | None = None,
               conditions: list[str] | None = None) -> Study:
    """Parse a study file into its cells; the keyword arguments shrink it (smoke runs).

    Raises:
        StudyError: unreadable file, unknown key, wrong type, unknown condition, or a cell whose
            config is invalid (the message names the cell).
    """
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{path}: invalid TOML: {exc}") from None
    bad = sorted(set(data) - STUDY_KEYS)
    if bad:
        raise StudyError(f"{path}: unknown study key {bad[0]!r}; keys are {sorted(STUDY_KEYS)}")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise StudyError(f"{path}: name must be letters, digits, '_', '.', '-', got {name!r}")
    steps = total_env_steps or data.get("total_env_steps", 1_000_000)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise StudyError(f"{path}: total_env_steps must be a positive integer, got {steps!r}")
    all_seeds = seeds or _list("seeds", data.get("seeds", [1]), int)
    all_envs = envs or _list("envs", data.get("envs", ["HalfCheetah-v5"]), str)
    common = _list("set", data["set"], str) if "set" in data else []
    cfg_file = data.get("config")
    if cfg_file is not None:
        cfg_file = str((path.parent / cfg_file) if not Path(cfg_file).is_absolute() and not Path(cfg_file).exists() else cfg_file)
    arms = data.get("arm")
    if not isinstance(arms, list) or not arms:
        raise StudyError(f"{path}: a study needs at least one [[arm]]")
    cells: list[Cell] = []
    only_presets, only_conditions = set(presets or ()), set(conditions or ())
    for i, arm in enumerate(arms):
        where = f"{path}: arm {i + 1}"
        bad = sorted(set(arm) - ARM_KEYS)
        if bad:
            raise StudyError(f"{where}: unknown key {bad[0]!r}; keys are {sorted(ARM_KEYS)}")
        arm_presets = _list(f"{where}: presets", arm.get("presets"), str)
        arm_conditions = _list(f"{where}: conditions", arm.get("conditions", ["none"]), str)
        arm_set = _list(f"{where}: set", arm["set"], str) if "set" in arm else []
        sweep = arm.get("sweep", {})
        if not isinstance(sweep, dict):
            raise StudyError(f"{where}: sweep must be a table of key = [values]")
        axes = [[(k, v) for v in _list(f"{where}: sweep.{k}", vals, object)] for k, vals in sweep.items()]
        arm_envs = envs or (_list(f"{where}: envs", arm["envs"], str) if "envs" in arm else all_envs)
        for env, preset, cond, combo in itertools.product(arm_envs, arm_presets, arm_conditions,
                                                          itertools.product(*axes)):
            if (only_presets and preset not in only_presets) or (only_conditions and cond not in only_conditions):
                continue
            mode, cond_set = condition_settings(cond)
            swept = [f"{k}={json.dumps(v)}" for k, v in combo]
            label = " ".join([arm.get("name", preset) if len(arm_presets) == 1 or "name" not in arm else f"{arm['name']}:{preset}",
                              *(f"{k.split('.')[-1]}={v}" for k, v in combo)])
            for seed in all_seeds:
                cells.append(Cell(label, env, preset, cond, int(seed), tuple(common + arm_set + swept + cond_set),
                                  mode, steps, cfg_file))
    if not cells:
        raise StudyError(f"{path}: no cell matches the given presets / conditions")
    for c in cells[:: max(1, len(all_seeds))]:       # one check per (arm, env, preset, condition, sweep)
        try:
            c.resolved_config()
        except config_mod.ConfigError as exc:
            raise StudyError(f"{path}: cell {c.label} / {c.env} / {c.condition}: {exc}") from None
    # interleave: seed-major, so a partial study holds every arm's first seeds
    order = {s: k for k, s in enumerate(all_seeds)}
    cells.sort(key=lambda c: order[c.seed])
    compare = [tuple(p) for p in data.get("compare", [])]
    return Study(name, path, cells, reference=dict(data.get("reference", {})), modes=dict(data.get("modes", {})),
                 random_episodes=int(data.get("random_episodes", 10)), compare=compare)  # type: ignore[arg-type]


def cell_key(study: Study, cell: Cell, fingerprint: str) -> str:
    blob = json.dumps({"study": study.name, "mode": cell.mode, "config": cell.resolved_config(),
                       "code": fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _downsample(points: list, n: int = CURVE_POINTS) -> list:
    if len(points) <= n:
        return points
    idx = sorted({round(i * (len(points) - 1) / (n - 1)) for i in range(n)})
    return [points[i] for i in idx]


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


LLM_FIELDS = ("initial_accuracy", "accuracy_difference", "accuracy_difference_ci95_paired", "eval_problems", "eval_mode")


def cell_record(cell: Cell, run_dir: Path) -> dict:
    """What the results table keeps of a finished run: scores, curve, lag, diagnostics.

    The score (``final_return``) is summary.json's final average return, or for a language-model
    cell (task.kind = llm) its ``final_accuracy`` on the held-out problems (``score_kind``
    "accuracy"; the accuracy before RL and the paired difference are kept beside it)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [[r["env_steps"], round(r["wall_time_s"], 2), r.get("average_return")] for r in rows]
    returns = [p[2] for p in curve if p[2] is not None]
    evals = [r["eval_return"] for r in rows if r.get("eval_return") is not None]
    tail = rows[-max(1, len(rows) // 10):]
    diag = {k: {"mean": _mean(r.get(k) for r in rows), "last": _mean(r.get(k) for r in tail)} for k in DIAGNOSTICS}
    final = summary.get("final_average_return")
    llm = summary.get("task") == "llm"
    if llm:   # the score of a language-model cell is its held-out accuracy after RL (the curve stays mean reward)
        final = summary.get("final_accuracy")
    return {"final_return": final, "score_kind": "accuracy" if llm else "return",
            **({k: summary.get(k) for k in LLM_FIELDS} if llm else {}),
            "auc": _mean(evals) if evals else _mean(returns),
            "auc_source": "eval_return" if evals else "average_return",
            "env_steps": summary.get("env_steps"), "wall_time_s": summary.get("wall_time_s"),
            "env_steps_per_s": summary.get("env_steps_per_s"), "learner_iterations": summary.get("learner_iterations"),
            "lag_p50": summary.get("lag_p50"), "lag_p95": summary.get("lag_p95"),
            "lag_seconds_p50": summary.get("lag_seconds_p50"), "lag_seconds_p95": summary.get("lag_seconds_p95"),
            "diagnostics": diag, "curve": _downsample(curve),
            # no finished episode (final None) is not divergence: a NaN score, or a NaN loss of an
            # iteration that stepped the optimizer, is (an llm iteration whose groups were all silent
            # takes no step and reports a NaN loss: llm.silent_groups). metrics.jsonl writes NaN as
            # null (asyncrl.metrics.strict_json): a policy_loss key holding null is a NaN loss.
            "diverged": (final is not None and final != final) or any(
                "policy_loss" in r and _not_a_number(r["policy_loss"]) and r.get("optimizer_steps", 1) > 0
                for r in rows)}


def _not_a_number(x) -> bool:
    """True for NaN, and for the null strict JSON writes in its place."""
    return x is None or x != x


def machine_info() -> dict:
    """Where a cell ran: host name, CPU model and count, the CPU kernels torch picks, Python and the
    versions of the packages that matter (serial cells repeat bit for bit on one CPU model and kernel
    set, not across them)."""
    return {"host": platform.node(), "cpu_model": provenance.cpu_model(), "cpu_kernels": cpu_kernels(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "packages": _versions()}


@functools.cache
def cpu_kernels() -> str | None:
    """The vector kernels torch's CPU ops use here ("AVX512", "AVX2", "DEFAULT", ...): the CPU's best,
    or the one the ATEN_CPU_CAPABILITY environment variable names (the cells inherit it). Each gives
    other float rounding, so a serial cell repeats bit for bit only under the same kernels. None when
    torch cannot say."""
    try:
        import torch
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:   # noqa: BLE001 - provenance only; never fails a study
        return None


def _versions() -> dict[str, str]:
    from importlib import metadata
    out = {}
    for pkg in ("torch", "numpy", "gymnasium", "mujoco", "pyzmq"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class Runner:
    """Runs a study's cells into ``out``/cells/<key>/ (run/ = the run directory, cell.json = the record)."""

    def __init__(self, study: Study, out: Path, *, jobs: int = 1, echo: Callable[[str], None] = print,
                 retry_failed: bool = False, executor=None):
        if jobs < 1:
            raise StudyError(f"--jobs must be >= 1, got {jobs}")
        self.study, self.out, self.jobs, self.echo = study, Path(out).resolve(), jobs, echo
        self.retry_failed = retry_failed
        # None: cells run on this machine; else an object with execute(cell, cell_dir, run_dir) and
        # abort() (asyncrl.study_ray.RayCells: cells as Ray tasks, placed by Ray)
        self.executor = executor
        self.fingerprint = training_code_fingerprint()
        self.commit = git_commit()
        self.keys = {c: cell_key(study, c, self.fingerprint) for c in study.cells}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._procs: set[subprocess.Popen] = set()

    def record_path(self, cell: Cell) -> Path:
        return self.out / "cells" / self.keys[cell] / "cell.json"

    def pending(self) -> list[Cell]:
        """Cells without a record (and, with retry_failed, those whose record says failed), one per
        key: two arms that resolve to one run (a sweep value equal to the default) run it once."""
        out, keys = [], set()
        for c in self.study.cells:
            if self.keys[c] in keys:
                continue
            if not self.record_path(c).exists() or (
                    self.retry_failed and json.loads(self.record_path(c).read_text()).get("status") == "failed"):
                out.append(c)
                keys.add(self.keys[c])
        return out

    def finished_records(self, *, any_code: bool = False) -> list[dict]:
        """The records of this study's cells. With ``any_code``, a cell without a record under the
        current training code takes the newest record of the same cell (same arm, env, preset,
        condition, seed, overrides and budget) run by other code; its fingerprint shows it."""
        out, others = [], {}
        if any_code:
            for p in sorted((self.out / "cells").glob("*/cell.json")):
                r = json.loads(p.read_text())
                others.setdefault(_identity(r), []).append(r)
        for c in self.study.cells:
            p = self.record_path(c)
            if p.exists():
                rec = json.loads(p.read_text())
            elif any_code and (same := others.get(_identity(c))):
                rec = max(same, key=lambda r: r.get("started", ""))
            else:
                continue
            # two arms can resolve to one run (a sweep value equal to the default): it counts in each arm,
            # under that arm's label, not twice in the arm that ran it
            out.append(rec if rec.get("label") == c.label else {**rec, "label": c.label})
        return out

    def run_cell(self, cell: Cell) -> dict | None:
        cell_dir = self.record_path(cell).parent
        if cell_dir.exists():
            shutil.rmtree(cell_dir)               # what a killed earlier attempt left
        cell_dir.mkdir(parents=True)
        run_dir = cell_dir / "run"
        cmd = cell.command(run_dir)
        t0, started = time.time(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        ran = (self.executor.execute if self.executor else self._execute_local)(cell, cell_dir, run_dir)
        if self._stop.is_set():
            return None                           # interrupted: no record, the cell runs again next time
        rc = ran["rc"]
        rec: dict[str, Any] = {
            "label": cell.label, "env": cell.env, "preset": cell.preset, "condition": cell.condition,
            "seed": cell.seed, "mode": cell.mode, "overrides": list(cell.overrides),
            "total_env_steps": cell.total_env_steps, "key": self.keys[cell], "study": self.study.name,
            "code_fingerprint": self.fingerprint, "commit": self.commit, "command": cmd[2:],
            "started": started, "cell_wall_s": round(time.time() - t0, 1),
            "load_start": ran["load_start"], "load_end": ran["load_end"], "machine": ran["machine"],
            "launcher": "ray" if self.executor else "local", "returncode": rc}
        if rc == 0 and (run_dir / "summary.json").exists():
            rec.update(cell_record(cell, run_dir))
            rec["status"] = "diverged" if rec["diverged"] else "ok"
        else:
            log = cell_dir / "log.txt"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            rec.update(status="failed", final_return=None, auc=None, error="\n".join(lines[-10:]))
        tmp = self.record_path(cell).with_suffix(".tmp")
        tmp.write_text(strict_json(rec) + "\n")
        os.replace(tmp, self.record_path(cell))
        return rec

    def _execute_local(self, cell: Cell, cell_dir: Path, run_dir: Path) -> dict:
        """Run the cell's command on this machine; {"rc", "machine", "load_start", "load_end"}."""
        load0 = os.getloadavg()[0]
        with open(cell_dir / "log.txt", "w") as log:
            # cwd = the cell's directory: `python -m asyncrl.cli` puts its cwd first on sys.path, so
            # a checkout in the study's cwd would otherwise shadow the code the study was started with
            proc = subprocess.Popen(cell.command(run_dir), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cell_dir, env=_child_env(),
                                    preexec_fn=die_with_parent())   # no cell outlives a killed study
            with self._lock:
                self._procs.add(proc)
            rc = proc.wait()
            with self._lock:
                self._procs.discard(proc)
        return {"rc": rc, "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2),
                "machine": machine_info()}

    def _announce(self, rec: dict | None, done: int, total: int) -> None:
        if rec is None:
            return
        score = rec.get("final_return")
        if not isinstance(score, (int, float)):
            text = rec["status"]
        elif rec.get("score_kind") == "accuracy":
            text = f"accuracy {100 * score:.1f} %"
        else:
            text = f"{score:,.0f}"
        with self._lock:
            self.echo(f"[{done}/{total}] {rec['label']} | {rec['env']} | {rec['condition']} | seed {rec['seed']}: "
                      f"{text} ({rec['cell_wall_s']:.0f} s)")

    def run(self) -> int:
        """Run every pending cell; returns how many ran. Multi-process cells first, one at a time
        alone on the machine, in the study's interleaved order; then serial cells ``jobs`` at a
        time (they are bit-reproducible whatever the load, so their order does not matter). With a
        Ray executor ``jobs`` cells are in flight at once and Ray places them (a multi-process cell
        on a whole node)."""
        todo = sorted(self.pending(), key=lambda c: c.mode != "multiprocess")   # stable: keeps the order
        total, runs = len(todo), len(set(self.keys.values()))
        shared = len(self.study.cells) - runs      # cells whose key another arm's cell has too
        cells = count_of(len(self.study.cells), "cell")
        if shared:
            cells += f" ({count_of(runs, 'run')}: {shared} {'shares' if shared == 1 else 'share'} another arm's run)"
        self.echo(f"study {self.study.name}: {cells}, {runs - total} already finished, {total} to run, "
                  f"{self.jobs} at a time; results in {self.out}")
        self._schedule(todo, set(), total)
        return total

    def _abort(self) -> None:
        """Ctrl-C, SIGTERM: stop the running cells at once and record none of them."""
        self._stop.set()
        if self.executor:
            self.executor.abort()
        with self._lock:
            for p in self._procs:
                p.terminate()

    def _schedule(self, todo: list[Cell], running: set[Future], total: int) -> None:
        done = 0
        with ThreadPoolExecutor(self.jobs) as pool:
            def drain(all_: bool) -> None:
                nonlocal done
                while running and (all_ or len(running) >= self.jobs):
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for f in finished:
                        running.discard(f)
                        done += 1
                        self._announce(f.result(), done, total)
            try:                                  # inside the pool: its exit waits for the running cells
                for cell in todo:
                    if cell.mode == "multiprocess" and not self.executor:   # Ray gives it a whole node
                        drain(all_=True)
                        running.add(pool.submit(self.run_cell, cell))
                        drain(all_=True)
                    else:
                        drain(all_=False)
                        running.add(pool.submit(self.run_cell, cell))
                drain(all_=True)
            except BaseException:
                self._abort()
                raise


def _identity(x) -> tuple:
    """What names a cell in its study file (a Cell or a record of one), code aside."""
    get = (lambda k: x[k]) if isinstance(x, dict) else (lambda k: getattr(x, k))
    return (get("label"), get("env"), get("preset"), get("condition"), get("seed"), tuple(get("overrides")),
            get("total_env_steps"), get("mode"))


def _child_env() -> dict[str, str]:
    """The cells import the same asyncrl as this process (its package's parent first on the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), *filter(None, [env.get("PYTHONPATH")])])
    return env
