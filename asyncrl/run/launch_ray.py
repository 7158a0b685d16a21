"""``asyncrl run --launcher ray``: the same roles as ``asyncrl run``, placed, started, restarted and
stopped by a Ray cluster (https://docs.ray.io) instead of the local supervisor.

Each role is the same ``python -m asyncrl ROLE ...`` command, run as a child process of one
Ray actor (:class:`asyncrl.run.ray_role_host.RoleHost`) on the node Ray put it on, so the data
path stays ZeroMQ (CURVE across nodes, shared memory where an actor shares the learner's node and
/dev/shm). Placement: the learner and the broadcaster on the node with a ``learner`` custom
resource (else the head node); the actors round-robin over the other nodes (all on the learner's
node when there are none), with a relay broadcaster on each of those nodes, so weights cross the
network once per node. Ray is the one restart authority: a role process that dies makes its Ray actor exit, Ray
restarts the actor (``max_restarts`` = run.max_restarts, no window or backoff: Ray has none) and
the new actor starts the role again; a restarted learner resumes from its checkpoint on its node's
disk (the run directory). A learner group's other members go round-robin over the other nodes with
a ``learner`` resource (else beside the learner) and meet at a store on the learner's node; when one
of the group dies the others fail within learner.group_timeout_s, Ray restarts each, and the group
forms again from the learner's checkpoint. Killing a role's Ray actor ends its process too (PR_SET_PDEATHSIG).

Keys: a CURVE key set per run, made on the driver in a private temporary directory, read into
memory and deleted; each role gets only its node's part as actor arguments and writes it to a
0700 directory of its node (``/tmp/asyncrl-ray-RUNID``). Trust model: whoever can reach the Ray
cluster can run code on it, and so can read those keys; the keys keep out those who can reach
the nodes' asyncrl ports but not Ray.

Ray is an optional extra: ``pip install -e '.[ray]'``. Usage statistics stay off
(RAY_USAGE_STATS_ENABLED=0), and a local cluster started here gets a capped object store.

This module: the driver's side (where each role goes, the run's keys, each role's command line,
following the roles until the learner is done, stopping them, the summary). Joining or starting
the cluster with token authentication: ``ray_cluster``; the role's process on its node:
``ray_role_host``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from asyncrl.core.config import Config
from asyncrl.core.metrics import write_json_atomic
from asyncrl.core.wording import count_of
from asyncrl.run.launch import BROADCASTER_SUMMARY, RoleFailed, max_weights_args, new_run_id
from asyncrl.run.ray_cluster import ROLE_RUNTIME_ENV, LauncherError, connect
from asyncrl.run.ray_role_host import RoleHost, pick_ports
from asyncrl.tasks import make_task

LEARNER_RESOURCE = "learner"


def choose_nodes(nodes: list[dict], num_actors: int) -> tuple[dict, list[dict]]:
    """(learner node, the node of each actor) from ``ray.nodes()``: the learner on the alive node
    with a ``learner`` resource, else the head node, else the first; actors round-robin over the
    other alive nodes (on the learner's node when it is alone). Raises LauncherError."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        raise LauncherError("the Ray cluster has no alive node")
    res = lambda n, k: (n.get("Resources") or {}).get(k, 0)  # noqa: E731
    learner = next((n for n in alive if res(n, LEARNER_RESOURCE) > 0), None) or next(
        (n for n in alive if res(n, "node:__internal_head__") > 0), alive[0]
    )
    others = sorted((n for n in alive if n["NodeID"] != learner["NodeID"]), key=lambda n: n["NodeManagerAddress"])
    pool = others or [learner]
    return learner, [pool[i % len(pool)] for i in range(num_actors)]


def choose_member_nodes(nodes: list[dict], learner: dict, count: int) -> list[dict]:
    """The node of each of a learner group's ``count`` other members (learner.num_learners - 1):
    round-robin over the alive nodes other than the learner's with a ``learner`` resource, else all
    on the learner's node."""
    res = lambda n, k: (n.get("Resources") or {}).get(k, 0)  # noqa: E731
    others = sorted(
        (n for n in nodes if n.get("Alive") and n["NodeID"] != learner["NodeID"] and res(n, LEARNER_RESOURCE) > 0),
        key=lambda n: n["NodeManagerAddress"],
    )
    return [others[i % len(others)] if others else learner for i in range(count)]


def key_files(run_nodes: int) -> tuple[dict[str, bytes], list[dict[str, bytes]]]:
    """A fresh CURVE key set (asyncrl.wire.security.generate) read into memory: the server part and one
    client part per node; the temporary directory it was made in is removed."""
    from asyncrl.wire.security import generate

    tmp = Path(tempfile.mkdtemp(prefix="asyncrl-keys-"))  # 0700
    try:
        generate(tmp, run_nodes)
        read = lambda d: {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}  # noqa: E731
        return read(tmp / "server"), [read(tmp / f"client-{k}") for k in range(1, run_nodes + 1)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _prefixed(files: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {f"{prefix}/{k}": v for k, v in files.items()}


class RayRun:
    """The driver's side of one run on Ray: places and starts the roles, follows them until the
    learner is done, and stops them; the restarts Ray made are counted by each role's actor."""

    def __init__(self, ray, cfg: Config, run_dir: Path, echo, *, resume: bool):
        self.ray, self.cfg, self.run_dir, self.echo, self.resume = ray, cfg, run_dir.resolve(), echo, resume
        self.run_id = new_run_id()
        self.handles: dict[str, object] = {}
        self.nodes: dict[str, str] = {}  # role name -> node IP

    def _remote(self, node: dict, name: str, argv, files, run_files=None):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = self.ray.remote(RoleHost).options(
            name=f"asyncrl-{self.run_id}-{name}",
            num_cpus=0,
            max_restarts=self.cfg.run.max_restarts,
            max_task_retries=0,
            max_concurrency=4,
            runtime_env=ROLE_RUNTIME_ENV,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        )
        self.handles[name] = cls.remote(name, self.run_id, argv, files, run_files)
        self.nodes[name] = node["NodeManagerAddress"]

    def _on(self, node: dict, fn, *args):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = self.ray.remote(fn).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        )
        return self.ray.get(task.remote(*args), timeout=120)

    def start(self) -> None:
        cfg_bytes = (self.run_dir / "config.json").read_bytes()
        learner_node, actor_nodes = choose_nodes(self.ray.nodes(), self.cfg.run.num_actors)
        remote_nodes = sorted(
            {n["NodeID"]: n for n in actor_nodes if n["NodeID"] != learner_node["NodeID"]}.values(),
            key=lambda n: n["NodeManagerAddress"],
        )
        server_keys, client_keys = key_files(max(1, len(remote_nodes)))
        weights = make_task(self.cfg).weights_info()  # the broadcaster's and relays' limits are sized by it
        at = self._on(learner_node, pick_ports)
        learner_ep, bcast_ep = f"tcp://{at['ip']}:{at['port']}", f"tcp://{at['ip']}:{at['pair']}"
        self.echo(
            f"run {self.run_id} on Ray: learner {learner_ep}, broadcaster {bcast_ep}, "
            f"{count_of(self.cfg.run.num_actors, 'actor')} on {count_of(len(remote_nodes) or 1, 'node')}"
        )
        server = _prefixed(server_keys, "keys")
        self._remote(
            learner_node,
            "broadcaster",
            [
                "broadcaster",
                "--bind",
                f"tcp://0.0.0.0:{at['pair']}",
                "--advertise",
                f"{at['ip']}:{at['pair']}",
                "--keys",
                "{dir}/keys",
                "--summary",
                str(self.run_dir / BROADCASTER_SUMMARY),
                *max_weights_args(weights),
            ],
            server,
        )
        restart = "resume" if self.resume else "refuse"
        members = choose_member_nodes(self.ray.nodes(), learner_node, self.cfg.learner.num_learners - 1)
        group = []  # a learner group meets at a store on the learner's node (docs/learner-group.md)
        if members:
            group = ["--group", f"tcp://{at['ip']}:{self._on(learner_node, pick_ports)['port']}"]
        self._remote(
            learner_node,
            "learner",
            [
                "learner",
                "--config",
                str(self.run_dir / "config.json"),
                "--run-dir",
                str(self.run_dir),
                "--run-id",
                self.run_id,
                "--bind",
                f"tcp://0.0.0.0:{at['port']}",
                "--advertise",
                f"{at['ip']}:{at['port']}",
                "--broadcaster",
                bcast_ep,
                "--keys",
                "{dir}/keys",
                "--restart",
                restart,
                *group,
                "--supervised",
            ],
            server,
            {str(self.run_dir / "config.json"): cfg_bytes},
        )
        self.wait_listening()
        for rank, node in enumerate(members, start=1):
            argv = ["learner-member", "--config", "{dir}/config.json", "--rank", str(rank), *group]
            self._remote(node, f"learner-member{rank}", argv, {"config.json": cfg_bytes})
        relays = {}
        for k, node in enumerate(remote_nodes):  # one relay broadcaster per actor node, on its loopback
            ports = self._on(node, pick_ports)
            relay = f"relay{k}"
            self._remote(
                node,
                relay,
                [
                    "broadcaster",
                    "--bind",
                    f"tcp://127.0.0.1:{ports['pair']}",
                    "--upstream",
                    bcast_ep,
                    *max_weights_args(weights),
                    "--keys",
                    "{dir}/keys",
                ],
                _prefixed(client_keys[k], "keys"),
            )
            relays[node["NodeID"]] = (f"tcp://127.0.0.1:{ports['pair']}", client_keys[k])
        for i, node in enumerate(actor_nodes):
            name = f"actor{i}"
            weights, keys = relays.get(node["NodeID"], (bcast_ep, client_keys[0]))
            self._remote(
                node,
                name,
                [
                    "actor",
                    "--config",
                    "{dir}/config.json",
                    "--learner",
                    learner_ep,
                    "--broadcaster",
                    weights,
                    "--actor-id",
                    name,
                    "--run-id",
                    self.run_id,
                    "--keys",
                    "{dir}/keys",
                    "--token-file",
                    "{dir}/token",
                    "--host-label",
                    node["NodeManagerAddress"],
                ],
                {**_prefixed(keys, "keys"), "config.json": cfg_bytes},
            )

    def supervise(self) -> None:
        """Until the learner exits 0. Raises RoleFailed once a role is dead past Ray's restarts, or
        the learner exits non-zero."""
        ray = self.ray
        pending = {h.wait.remote(): name for name, h in self.handles.items()}
        announced: dict[str, float] = {}
        while True:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                name = pending.pop(ref)
                try:
                    rc = ray.get(ref)
                except ray.exceptions.ActorUnavailableError:  # it died; Ray is restarting it
                    if time.monotonic() - announced.get(name, -1e9) > 10.0:
                        self.echo(
                            f"asyncrl run (ray): {name} died; Ray restarts it (run.max_restarts = "
                            f"{self.cfg.run.max_restarts})"
                        )
                    announced[name] = time.monotonic()
                    time.sleep(0.5)
                    pending[self.handles[name].wait.remote()] = name
                    continue
                except ray.exceptions.RayActorError as exc:  # dead for good: restarts spent, or its node gone
                    raise RoleFailed(
                        name,
                        f"died and Ray will not restart it (run.max_restarts = {self.cfg.run.max_restarts})",
                        str(exc)[-2000:],
                    ) from None
                if name == "learner":
                    if rc == 0:
                        return
                    raise RoleFailed(name, f"exited with status {rc}", self._tail(name))

    def _tail(self, name: str, lines: int = 15) -> str:
        data = self._gather({"l": self.handles[name].read.remote("role.log")}, 30).get("l")
        if data is None:
            return "(its log cannot be read)"
        return "\n".join(data.decode(errors="replace").strip().splitlines()[-lines:])

    def _gather(self, refs: dict, timeout_s: float) -> dict:
        """{name: result} of the refs that finish within ``timeout_s`` all together (a dead actor's
        call raises at once and is left out)."""
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        out = {}
        for name, ref in refs.items():
            if ref in ready:
                try:
                    out[name] = self.ray.get(ref)
                except Exception:  # noqa: BLE001 - its actor is dead: nothing to get
                    pass
        return out

    def wait_listening(self, timeout_s: float = 600.0) -> None:
        """Until the learner's log says it listens (actors started before would spend their
        rejoin_timeout_s, and then Ray's restarts, on a learner still importing torch on a busy node).
        Raises RoleFailed if the learner dies or does not listen within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        waiting = self.handles["learner"].wait.remote()
        while time.monotonic() < deadline:
            if b"listening on" in (
                self._gather({"l": self.handles["learner"].read.remote("role.log")}, 30).get("l") or b""
            ):
                return
            done, _ = self.ray.wait([waiting], timeout=1.0)
            if done:
                raise RoleFailed("learner", "exited before it listened", self._tail("learner"))
        raise RoleFailed("learner", f"did not listen within {timeout_s:.0f} s", self._tail("learner"))

    def stop_all(self) -> None:
        """Stop every role at once (SIGINT: each writes its summary and checkpoint; SIGKILL 10 s
        later) and copy each role's log into RUN_DIR/logs on the driver's disk."""
        self._gather({n: h.stop.remote() for n, h in self.handles.items()}, 30)
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for n, data in self._gather({n: h.read.remote("role.log") for n, h in self.handles.items()}, 30).items():
            if data is not None:
                (logs / f"{n}.log").write_bytes(data)

    def remove_all(self) -> None:
        """Remove each role's private directory (its keys with it) and kill the Ray actors."""
        self._gather({n: h.cleanup.remote() for n, h in self.handles.items()}, 30)
        for h in self.handles.values():
            self.ray.kill(h, no_restart=True)

    def record_summary(self, failure: RoleFailed | None) -> dict:
        """The learner's summary.json (read on its node) with the launcher, the restarts Ray made
        of each role and each role's node; written back there and to RUN_DIR on this host."""
        path = self.run_dir / "summary.json"
        data = (
            self._gather({"l": self.handles["learner"].read.remote(str(path))}, 30).get("l")
            if "learner" in self.handles
            else None
        )
        try:
            summary = json.loads(data) if data else {"outcome": None, "failure": None, "run_id": self.run_id}
        except ValueError:
            summary = {"outcome": None, "failure": None, "run_id": self.run_id}
        if failure is not None and summary.get("outcome") != "failed":
            summary["outcome"], summary["failure"] = "failed", {"role": failure.role, "reason": failure.reason}
        summary["launcher"] = "ray"
        counts = self._gather({n: h.restarts.remote() for n, h in self.handles.items()}, 30)
        summary["restarts"] = {n: counts.get(n) for n in self.handles}  # None: its node could not be asked
        summary["restart_authority"] = "ray"
        summary["nodes"] = dict(self.nodes)
        write_json_atomic(path, summary)
        return summary


def launch_ray(cfg: Config, run_dir: Path, *, address: str | None = None, echo=print, resume: bool = False) -> dict:
    """Run a training job on a Ray cluster (``address``: a running cluster, e.g. "10.0.0.1:6379";
    None or "": start a local one for this run); returns the summary. Raises LauncherError (no Ray,
    no node) or RoleFailed (a role died past Ray's restarts, or the learner failed)."""
    ray = connect(address)
    run = RayRun(ray, cfg, run_dir, echo, resume=resume)
    failure = None
    try:
        run.start()
        run.supervise()
    except RoleFailed as exc:
        failure = exc
        raise
    finally:
        try:
            run.stop_all()
            summary = run.record_summary(failure)
            run.remove_all()
        finally:
            ray.shutdown()
    return summary
