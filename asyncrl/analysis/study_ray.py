"""``asyncrl study --launcher ray``: a study's cells as Ray tasks across a cluster.

Each cell is the same ``asyncrl run`` command as in a local study (:meth:`asyncrl.analysis.study.Cell.command`),
run by a Ray task on whichever node Ray picks, in a temporary directory of that node; the task sends
back the run directory's files and the log, and the driver writes them where a local study would
(``OUT/cells/KEY/``), so resume, the results table and the report are the local study's. A serial
cell asks Ray for one CPU; a multi-process cell for all the CPUs of the cluster's largest node, so
it runs alone on a node as the local study runs it alone on the machine (its lag and speed depend on
it). A node whose asyncrl training code differs from the driver's (another fingerprint) fails the
cell with a message that says so, rather than recording a result of other code under this key.

Ray is the optional extra (``pip install -e '.[ray]'``); usage statistics stay off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUN_DIR = "{run_dir}"  # stands for the node's run directory in the command sent to it
MAX_FILE_BYTES = 64 * 2**20  # a run directory's file larger than this stays on the node (named in the log)


def run_cell_on_node(argv: list[str], fingerprint: str) -> dict:
    """A Ray task: run ``python -m asyncrl ARGV`` (RUN_DIR replaced by a fresh directory of this
    node) and return {"rc", "log" (bytes), "files" ({relative path: bytes}), "machine", "load_start",
    "load_end"}; the directory is removed. rc is None, and nothing runs, when this node's training
    code differs from ``fingerprint``."""
    import ray

    from asyncrl.analysis.study import _child_env, machine_info, training_code_fingerprint
    from asyncrl.run.pdeathsig import die_with_parent

    machine = {**machine_info(), "node_ip": ray.util.get_node_ip_address()}
    mine = training_code_fingerprint()
    if mine != fingerprint:
        return {
            "rc": None,
            "machine": machine,
            "files": {},
            "load_start": None,
            "load_end": None,
            "log": (
                f"node {machine['node_ip']} ({machine['host']}) runs other asyncrl training code: "
                f"fingerprint {mine}, the study's {fingerprint}; install the same asyncrl there\n"
            ).encode(),
        }
    tmp = Path(tempfile.mkdtemp(prefix="asyncrl-cell-"))
    try:
        run_dir = tmp / "run"
        cmd = [sys.executable, "-m", "asyncrl", *(str(run_dir) if a == RUN_DIR else a for a in argv)]
        load0 = os.getloadavg()[0]
        with open(tmp / "log.txt", "wb") as log:
            rc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmp,
                env=_child_env(),
                preexec_fn=die_with_parent(),
            ).returncode
        files, kept = {}, []
        for p in sorted(run_dir.rglob("*")) if run_dir.exists() else []:
            if p.is_file():
                if p.stat().st_size <= MAX_FILE_BYTES:
                    files[str(p.relative_to(run_dir))] = p.read_bytes()
                else:
                    kept.append(p.name)
        log_bytes = (tmp / "log.txt").read_bytes()
        if kept:
            log_bytes += (
                f"(left on node {machine['node_ip']}, over {MAX_FILE_BYTES} bytes: {', '.join(kept)})\n".encode()
            )
        return {
            "rc": rc,
            "log": log_bytes,
            "files": files,
            "machine": machine,
            "load_start": round(load0, 2),
            "load_end": round(os.getloadavg()[0], 2),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def inside(root: Path, rel) -> Path | None:
    """``root / rel`` if ``rel`` is a relative path (a str) that stays inside ``root`` after resolving
    ``..`` and symbolic links, else None: files taken from a remote node land in the run directory only."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or Path(rel).is_absolute():
        return None
    base = root.resolve()
    target = (base / rel).resolve()
    return target if target != base and target.is_relative_to(base) else None


class RayCells:
    """The study Runner's executor for a Ray cluster: :meth:`execute` runs one cell there and writes
    its run directory and log into the cell's directory on this host."""

    def __init__(self, address: str | None, fingerprint: str, echo=print):
        from asyncrl.run.ray_cluster import ROLE_RUNTIME_ENV, connect

        self.ray, self.fingerprint, self.echo = connect(address), fingerprint, echo
        cpus = [n.get("Resources", {}).get("CPU", 0) for n in self.ray.nodes() if n.get("Alive")]
        self.node_cpus = max(cpus, default=0)
        if self.node_cpus < 1:
            self.close()
            from asyncrl.run.ray_cluster import LauncherError

            raise LauncherError("the Ray cluster has no alive node with a CPU")
        # SPREAD: a study's cells over the whole cluster, not packed onto the driver's node first
        self.task = self.ray.remote(run_cell_on_node)
        self.task_options = dict(runtime_env=ROLE_RUNTIME_ENV, max_retries=2, scheduling_strategy="SPREAD")
        self.refs: set = set()
        echo(
            f"study on Ray: {len(cpus)} node(s), {sum(cpus):g} CPUs; a multi-process cell takes a whole "
            f"{self.node_cpus:g}-CPU node"
        )

    def execute(self, cell, cell_dir: Path, run_dir: Path) -> dict:
        """Run ``cell`` on the cluster; returns {"rc", "machine", "load_start", "load_end"} (rc None:
        it could not run there; the log says why)."""
        cpus = 1 if cell.mode == "serial" else self.node_cpus
        ref = self.task.options(num_cpus=cpus, **self.task_options).remote(
            cell.command(Path(RUN_DIR))[3:], self.fingerprint
        )
        self.refs.add(ref)
        try:
            out = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return {"rc": None, "machine": None, "load_start": None, "load_end": None}
        except self.ray.exceptions.RayError as exc:  # its node died past the retries, or a worker crashed
            out = {
                "rc": None,
                "log": f"the cell's Ray task failed: {exc}\n".encode(),
                "files": {},
                "machine": None,
                "load_start": None,
                "load_end": None,
            }
        finally:
            self.refs.discard(ref)
        files = out.pop("files")
        for rel, data in files.items() if isinstance(files, dict) else ():
            p = inside(run_dir, rel)
            if p is None or not isinstance(data, bytes):
                self.echo(
                    f"study on Ray: a file name from the node is not inside the run directory, not written: "
                    f"{str(rel)[:200]!r}"
                )
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        log = out.pop("log")
        (cell_dir / "log.txt").write_bytes(log if isinstance(log, bytes) else b"")
        return out

    def abort(self) -> None:
        """Ctrl-C, SIGTERM: cancel the running cells (their processes die with their Ray workers)."""
        for ref in list(self.refs):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or its node is gone
                pass

    def close(self) -> None:
        self.ray.shutdown()
