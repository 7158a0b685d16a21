"""Three hosts on one machine: network namespaces joined by veth pairs to a bridge, each with its own
address on 10.77.0.0/24 (no traffic leaves the namespaces this test creates).

    ns L 10.77.0.1 (bridge): learner + broadcaster, bound to 10.77.0.1, CURVE on
    ns A 10.77.0.2: relay broadcaster (loopback) + actors a0, a1 reporting host "hostA"
    ns B 10.77.0.3: relay broadcaster (loopback) + actors b0, b1 reporting host "hostB"

Namespaces share /dev/shm, so each actor runs in its own mount namespace with an empty tmpfs on
/dev/shm: it cannot attach the learner's segment and ships its rollouts over TCP, as on a real
remote host. Root only (skipped otherwise); the namespaces are deleted in a finally block.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_helpers import SMALL, learner_cmd, new_run_id, read_jsonl, wait_for
from test_multiprocess import CORRIDOR, check_run_outputs, start_actor

pytestmark = [pytest.mark.integration, pytest.mark.netns]

SUBNET = "10.77.0"
LEARNER_IP = f"{SUBNET}.1"
EMPTY_SHM = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


def _unavailable() -> str | None:
    """Why this test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"arl-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` is unavailable: {exc}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


def _can_empty_shm(ns: str) -> bool:
    """True if a process in ``ns`` can get a private, empty /dev/shm (unshare --mount + tmpfs)."""
    if shutil.which("unshare") is None:
        return False
    p = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "--mount",
            "sh",
            "-c",
            EMPTY_SHM,
            "sh",
            "sh",
            "-c",
            'test -z "$(ls -A /dev/shm)"',
        ],
        capture_output=True,
        timeout=20,
    )
    return p.returncode == 0


class Lan:
    """The three namespaces (L, A, B) and their links; ``close`` deletes them."""

    def __init__(self):
        tag = secrets.token_hex(3)
        self.ns = {role: f"arl-{tag}-{role}" for role in ("L", "A", "B")}
        self.ip = {"L": LEARNER_IP, "A": f"{SUBNET}.2", "B": f"{SUBNET}.3"}
        self.created: list[str] = []

    def up(self) -> None:
        for ns in self.ns.values():
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        L = self.ns["L"]
        _ip("-n", L, "link", "add", "br0", "type", "bridge")
        _ip("-n", L, "addr", "add", f"{LEARNER_IP}/24", "dev", "br0")
        _ip("-n", L, "link", "set", "br0", "up")
        for role in ("A", "B"):  # veth: one end on L's bridge, the other eth0 in A or B
            port = f"to{role}"
            _ip("-n", L, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", self.ns[role])
            _ip("-n", L, "link", "set", port, "master", "br0")
            _ip("-n", L, "link", "set", port, "up")
            _ip("-n", self.ns[role], "addr", "add", f"{self.ip[role]}/24", "dev", "eth0")
            _ip("-n", self.ns[role], "link", "set", "eth0", "up")

    def prefix(self, role: str, *, empty_shm: bool = False) -> list[str]:
        """A command prefix that runs the rest in ``role``'s namespace (exec all the way down, so
        the pid the test records is the role's)."""
        cmd = ["ip", "netns", "exec", self.ns[role]]
        return cmd + ["unshare", "--mount", "sh", "-c", EMPTY_SHM, "sh"] if empty_shm else cmd

    def close(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.created.clear()


@pytest.fixture
def lan(procs):
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    net = Lan()
    try:
        net.up()
        yield net
    finally:
        procs.shutdown()  # nothing may outlive its namespace's deletion (no process is left anyway)
        net.close()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(ns in left for ns in net.ns.values()), left


@pytest.mark.timeout(120)
def test_actors_on_two_other_hosts_over_curve(procs, lan, tmp_path):
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 8000
    procs.run_ids.add(run_id)
    keys = tmp_path / "keys"
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "keys", "generate", str(keys), "--clients", "2"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    learner_ep, broadcaster_ep = f"tcp://{LEARNER_IP}:5555", f"tcp://{LEARNER_IP}:5556"
    empty_shm = _can_empty_shm(lan.ns["A"])
    transport = [] if empty_shm else ["--rollout-transport", "tcp"]  # no tmpfs here: force TCP instead

    # actor hosts first: relays and actors wait for the learner host
    actors = {"a0": "A", "a1": "A", "b0": "B", "b1": "B"}
    for role, client in (("A", "client-1"), ("B", "client-2")):
        procs.start(
            f"relay{role}",
            [
                "broadcaster",
                "--upstream",
                broadcaster_ep,
                "--bind",
                "tcp://127.0.0.1:5556",
                "--keys",
                str(keys / client),
            ],
            prefix=lan.prefix(role),
        )
    for i, (name, role) in enumerate(actors.items()):
        procs.start(
            name,
            [
                "actor",
                "--learner",
                learner_ep,
                "--broadcaster",
                "tcp://127.0.0.1:5556",
                "--keys",
                str(keys / ("client-1" if role == "A" else "client-2")),
                "--actor-id",
                name,
                "--host-label",
                f"host{role}",
                "--run-id",
                run_id,
                "--seed",
                str(i + 1),
                "--env",
                CORRIDOR,
                *SMALL,
                *transport,
            ],
            prefix=lan.prefix(role, empty_shm=empty_shm),
        )

    def loaded(name):  # the process has imported ZeroMQ: it is (about to be) saying hello
        try:
            return "zmq" in Path(f"/proc/{procs.popen[name].pid}/maps").read_text()
        except FileNotFoundError:
            return False

    wait_for(lambda: all(loaded(n) for n in actors), 60, "the actors to start", procs=procs)

    procs.start(
        "broadcaster", ["broadcaster", "--bind", broadcaster_ep, "--keys", str(keys / "server")], prefix=lan.prefix("L")
    )
    procs.start(
        "learner",
        learner_cmd(
            learner_ep,
            broadcaster_ep,
            "--keys",
            str(keys / "server"),
            *SMALL,
            run_id=run_id,
            run_dir=run_dir,
            total=total,
        ),
        prefix=lan.prefix("L"),
    )
    assert procs.wait("learner", 90) == 0, procs.dump()
    for name in actors:
        assert procs.wait(name, 20) == 0, procs.dump()
        assert "sent; step budget reached" in procs.out(name), procs.dump()
        if empty_shm:
            assert "shared memory not reachable" in procs.err(name), procs.err(name)

    # every actor's rollouts arrived, all over TCP, with CURVE on and nobody refused
    summary = check_run_outputs(run_dir, total, actors=set(actors))
    rows = read_jsonl(run_dir / "lag.jsonl")
    assert {r["actor"] for r in rows} == set(actors), {r["actor"] for r in rows}
    assert {r["host"] for r in rows} == {"hostA", "hostB"}
    assert summary["rollouts_by_transport"] == {"tcp": summary["slot_counters"]["completed"]}, summary
    assert summary["refused_connections"] == {}, summary
    assert max(r["behavior_version"] for r in rows) >= 10, "new weights did not reach the actors"
    assert "(CURVE)" in procs.out("learner") and f"--learner {learner_ep}" in procs.out("learner")

    p = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "lag", str(run_dir), "--json"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    per_host = json.loads(p.stdout)["per_host"]
    assert set(per_host) == {"hostA", "hostB"}, per_host
    assert all(h["lag_versions"]["count"] > 0 for h in per_host.values()), per_host
    for name in ("broadcaster", "relayA", "relayB"):
        procs.popen[name].send_signal(2)
    deadline = time.monotonic() + 10
    for name in ("broadcaster", "relayA", "relayB"):  # stopped by SIGINT: 130 (asyncrl.core.exit_status)
        assert procs.popen[name].wait(max(0.1, deadline - time.monotonic())) == 130, procs.dump()


@pytest.mark.timeout(240)
def test_learner_group_member_on_another_host(procs, lan, tmp_path):
    """A learner group across hosts, by hand: the learner (rank 0) with the broadcaster and the actors
    on host L, meeting at a store on L's LAN address; its member on host B, which reaches L only over
    the LAN. The member's gloo sockets bind the interface towards the store (eth0 here, not the
    loopback); the run trains to its budget with every iteration taken by both."""
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 4000
    procs.run_ids.add(run_id)
    # the member takes no role flags (--env, --seed): the same settings as --set pairs
    group = ["--set", "learner.num_learners=2", "--set", "learner.group_timeout_s=60", "--set", "run.seed=5", *SMALL]
    store = f"tcp://{LEARNER_IP}:29517"
    procs.start(
        "member",
        ["learner-member", "--rank", "1", "--group", store, "--set", f"env.id={CORRIDOR}", *group],
        prefix=lan.prefix("B"),
    )
    learner_ep, broadcaster_ep = "tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"
    where = dict(run_id=run_id, run_dir=run_dir, total=total)
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep], prefix=lan.prefix("L"))
    procs.start(
        "learner",
        learner_cmd(learner_ep, broadcaster_ep, "--group", store, *group, **where),
        prefix=lan.prefix("L"),
    )
    for i in range(2):
        extra = ("--run-id", run_id, "--seed", str(i + 1))
        start_actor(procs, f"a{i}", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=extra, prefix=lan.prefix("L"))
    assert procs.wait("learner", 200) == 0, procs.dump()
    assert procs.wait("member", 30) == 0, procs.dump()
    summary = check_run_outputs(run_dir, total, actors={"a0", "a1"})
    err = procs.err("member")
    assert "learner member 1 of 2: joined (gloo sockets on eth0)" in err, err
    assert f"finished, {summary['learner_iterations']} iterations" in err, err
    for name in ("a0", "a1"):
        assert procs.wait(name, 30) == 0, procs.dump()
    procs.popen["broadcaster"].send_signal(2)
    assert procs.popen["broadcaster"].wait(10) == 130, procs.dump()
