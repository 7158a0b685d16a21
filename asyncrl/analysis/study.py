"""`asyncrl study STUDY.toml`: a grid of envs x presets x lag conditions x seeds x any config axis,
each cell an ordinary `asyncrl run` (serial or multi-process), run ``jobs`` at a time and resumable.

The study file and its cells: :mod:`asyncrl.analysis.study_file`. Resume: a cell is keyed by the study name,
its resolved config, its mode and the fingerprint of the training code (:mod:`asyncrl.analysis.study_code`:
every asyncrl module a run imports, not the reporting ones): a finished cell with the same key (a
record file, or the study's archive: :mod:`asyncrl.analysis.study_store`) is skipped, a killed study re-run
continues, and a cell whose config or training code changed gets a new key and runs again (unless an
alias proves its code only moved). Multi-process cells run alone on the machine (their lag and speed
depend on it); serial cells are bit-reproducible whatever the load.

This module runs the cells (:class:`Runner`) and re-exports the names callers import from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from asyncrl.analysis.study_code import PACKAGE, REPORTING_MODULES, git_commit, training_code_fingerprint  # noqa: F401
from asyncrl.analysis.study_file import Cell, Study, StudyError, condition_settings, load_study  # noqa: F401
from asyncrl.analysis.study_record import cell_record, cpu_kernels, machine_info  # noqa: F401
from asyncrl.analysis.study_store import CellStore, cell_key  # noqa: F401
from asyncrl.analysis.study_store import identity as _identity
from asyncrl.core.metrics import strict_json
from asyncrl.core.wording import count_of
from asyncrl.run.pdeathsig import die_with_parent


class Runner:
    """Runs a study's cells into ``out``/cells/<key>/ (run/ = the run directory, cell.json = the record)."""

    def __init__(
        self,
        study: Study,
        out: Path,
        *,
        jobs: int = 1,
        echo: Callable[[str], None] = print,
        retry_failed: bool = False,
        executor=None,
    ):
        if jobs < 1:
            raise StudyError(f"--jobs must be >= 1, got {jobs}")
        self.study, self.out, self.jobs, self.echo = study, Path(out).resolve(), jobs, echo
        self.retry_failed = retry_failed
        # None: cells run on this machine; else an object with execute(cell, cell_dir, run_dir) and
        # abort() (asyncrl.analysis.study_ray.RayCells: cells as Ray tasks, placed by Ray)
        self.executor = executor
        self.fingerprint = training_code_fingerprint()
        self.commit = git_commit()
        self.keys = {c: cell_key(study, c, self.fingerprint) for c in study.cells}
        self.store = CellStore(self.out)
        aliased = self.store.equivalent(self.fingerprint)[1:]
        # the keys a finished cell may have: under this code, then under code aliased to it (moved only)
        self.alias_keys = {c: [cell_key(study, c, fp) for fp in aliased] for c in study.cells} if aliased else {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._procs: set[subprocess.Popen] = set()

    def record_path(self, cell: Cell) -> Path:
        """Where the cell's record is written when it runs (under this code's key)."""
        return self.store.record_path(self.keys[cell])

    def finished(self, cell: Cell) -> dict | None:
        """The cell's record (a file or the archive's, under this code's key or an aliased one);
        None if it has not finished."""
        for key in [self.keys[cell], *self.alias_keys.get(cell, ())]:
            rec = self.store.get(key)
            if rec is not None:
                return rec
        return None

    def pending(self) -> list[Cell]:
        """Cells without a record (and, with retry_failed, those whose record says failed), one per
        key: two arms that resolve to one run (a sweep value equal to the default) run it once."""
        out, keys = [], set()
        for c in self.study.cells:
            if self.keys[c] in keys:
                continue
            rec = self.finished(c)
            if rec is None or (self.retry_failed and rec.get("status") == "failed"):
                out.append(c)
                keys.add(self.keys[c])
        return out

    def finished_records(self, *, any_code: bool = False) -> list[dict]:
        """The records of this study's cells. With ``any_code``, a cell without a record under the
        current training code takes the newest record of the same cell (same arm, env, preset,
        condition, seed, overrides and budget) run by other code, or, if that cell never ran as itself,
        of a cell that resolves to the same run today (it shared that cell's run: a sweep value equal
        to the default); its fingerprint shows it."""
        out, others, sharing = [], {}, {}
        if any_code:
            for _, r in sorted(self.store.records().items()):
                others.setdefault(_identity(r), []).append(r)
            for c in self.study.cells:
                sharing.setdefault(self.keys[c], []).append(c)
        for c in self.study.cells:
            rec = self.finished(c)
            if rec is None and any_code:
                # its own records first; a cell that never ran as itself shared a run with a cell that
                # resolves to the same run today (a sweep value equal to the default then and now)
                same = others.get(_identity(c)) or [
                    r for s in sharing[self.keys[c]] for r in others.get(_identity(s), [])
                ]
                rec = max(same, key=lambda r: r.get("started", "")) if same else None
            if rec is None:
                continue
            # two arms can resolve to one run (a sweep value equal to the default): it counts in each arm,
            # under that arm's label, not twice in the arm that ran it
            out.append(rec if rec.get("label") == c.label else {**rec, "label": c.label})
        return out

    def run_cell(self, cell: Cell) -> dict | None:
        cell_dir = self.record_path(cell).parent
        if cell_dir.exists():
            shutil.rmtree(cell_dir)  # what a killed earlier attempt left
        cell_dir.mkdir(parents=True)
        run_dir = cell_dir / "run"
        cmd = cell.command(run_dir)
        t0, started = time.time(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        ran = (self.executor.execute if self.executor else self._execute_local)(cell, cell_dir, run_dir)
        if self._stop.is_set():
            return None  # interrupted: no record, the cell runs again next time
        rc = ran["rc"]
        rec: dict[str, Any] = {
            "label": cell.label,
            "env": cell.env,
            "preset": cell.preset,
            "condition": cell.condition,
            "seed": cell.seed,
            "mode": cell.mode,
            "overrides": list(cell.overrides),
            "total_env_steps": cell.total_env_steps,
            "key": self.keys[cell],
            "study": self.study.name,
            "code_fingerprint": self.fingerprint,
            "commit": self.commit,
            "command": cmd[2:],
            "started": started,
            "cell_wall_s": round(time.time() - t0, 1),
            "load_start": ran["load_start"],
            "load_end": ran["load_end"],
            "machine": ran["machine"],
            "launcher": "ray" if self.executor else "local",
            "returncode": rc,
        }
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
            # cwd = the cell's directory: `python -m asyncrl` puts its cwd first on sys.path, so
            # a checkout in the study's cwd would otherwise shadow the code the study was started with
            proc = subprocess.Popen(
                cell.command(run_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cell_dir,
                env=_child_env(),
                preexec_fn=die_with_parent(),
            )  # no cell outlives a killed study
            with self._lock:
                self._procs.add(proc)
            rc = proc.wait()
            with self._lock:
                self._procs.discard(proc)
        return {
            "rc": rc,
            "load_start": round(load0, 2),
            "load_end": round(os.getloadavg()[0], 2),
            "machine": machine_info(),
        }

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
            self.echo(
                f"[{done}/{total}] {rec['label']} | {rec['env']} | {rec['condition']} | seed {rec['seed']}: "
                f"{text} ({rec['cell_wall_s']:.0f} s)"
            )

    def run(self) -> int:
        """Run every pending cell; returns how many ran. Multi-process cells first, one at a time
        alone on the machine, in the study's interleaved order; then serial cells ``jobs`` at a
        time (they are bit-reproducible whatever the load, so their order does not matter). With a
        Ray executor ``jobs`` cells are in flight at once and Ray places them (a multi-process cell
        on a whole node)."""
        todo = sorted(self.pending(), key=lambda c: c.mode != "multiprocess")  # stable: keeps the order
        total, runs = len(todo), len(set(self.keys.values()))
        shared = len(self.study.cells) - runs  # cells whose key another arm's cell has too
        cells = count_of(len(self.study.cells), "cell")
        if shared:
            cells += f" ({count_of(runs, 'run')}: {shared} {'shares' if shared == 1 else 'share'} another arm's run)"
        self.echo(
            f"study {self.study.name}: {cells}, {runs - total} already finished, {total} to run, "
            f"{self.jobs} at a time; results in {self.out}"
        )
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

            try:  # inside the pool: its exit waits for the running cells
                for cell in todo:
                    if cell.mode == "multiprocess" and not self.executor:  # Ray gives it a whole node
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


def _child_env() -> dict[str, str]:
    """The cells import the same asyncrl as this process (its package's parent first on the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), *filter(None, [env.get("PYTHONPATH")])])
    return env
