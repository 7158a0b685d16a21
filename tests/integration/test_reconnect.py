"""Reconnection and hostile-but-well-formed messages: a restarted learner,
a restarted actor proving its id with its token, a restarted broadcaster, a stalled actor, and
forged weights, versions and byes.

Every test starts its processes through the ``procs`` fixture (conftest.py), which stops only
those pids at the end and asserts that none survives and that no /dev/shm segment of the test's
run ids is left. Nothing here asserts on timing, on how many log lines appear, or on their order.
"""

from __future__ import annotations

import json
import re
import signal
import time

import numpy as np
import pytest
from mp_helpers import SMALL, new_run_id, read_jsonl, wait_for
from test_hostile_messages import Spy
from test_multiprocess import CORRIDOR, endpoints, start_actor, start_learner, start_roles

from asyncrl.wire import addresses, codec, sockets

pytestmark = pytest.mark.integration

FAST = ["--set", "transport.actor_timeout_s=2", "--set", "transport.heartbeat_s=0.2"]


def rows_of(run_dir, actor: str) -> list[dict]:
    """lag.jsonl rows of the slots of ``actor`` that were trained on."""
    return [r for r in read_jsonl(run_dir / "lag.jsonl") if r["actor"] == actor and not r.get("dropped")]


def stop_learner(procs, name: str = "learner") -> None:
    procs.expect_failure.add(name)  # an interrupted command exits 130, which check_no_failure must allow
    procs.popen[name].send_signal(signal.SIGINT)
    assert procs.wait(name, 60) == 130, procs.dump()  # interrupted (asyncrl.core.exit_status)


@pytest.mark.timeout(240)
def test_actors_reconnect_to_a_restarted_learner(procs, tmp_path):
    """The learner SIGKILLed and started again by hand on the same addresses: the same actor
    processes notice the new learner, say hello again and fill its batches."""
    run_id, first, second = new_run_id(), tmp_path / "first", tmp_path / "second"
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=first, env_id=CORRIDOR, total_steps=100_000_000, extra=FAST
    )
    actors = {n: start_actor(procs, n, learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=FAST) for n in ("a0", "a1")}
    wait_for(lambda: all(rows_of(first, n) for n in actors), 120, "both actors' slots", procs=procs)
    procs.popen["learner"].kill()
    procs.popen["learner"].wait(10)
    # a new learner (a new run directory: resuming from the checkpoint is not this test's)
    procs.popen.pop("learner")
    start_learner(
        procs,
        learner_ep,
        broadcaster_ep,
        run_id=run_id,
        run_dir=second,
        env_id=CORRIDOR,
        total_steps=100_000_000,
        extra=FAST,
    )
    # slots are logged when they leave the ring, before their update ends: wait for a finished
    # iteration too, or a loaded machine can stop the learner between the two
    wait_for(
        lambda: all(rows_of(second, n) for n in actors) and read_jsonl(second / "metrics.jsonl"),
        120,
        "both actors' slots in the new learner, and one finished iteration",
        procs=procs,
    )
    stop_learner(procs)
    for name, _p in actors.items():
        assert procs.wait(name, 30) == 0, procs.dump()  # the same processes, stopped by the new learner
        assert "saying hello again" in procs.err(name), procs.err(name)
    summary = json.loads((second / "summary.json").read_text())
    assert summary["learner_iterations"] >= 1, summary
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()


@pytest.mark.timeout(200)
def test_restarted_actor_takes_its_id_back_with_its_token(procs, tmp_path):
    """An actor SIGKILLed and started again with its id and token file joins at once (the learner
    still counts the dead one as live: actor_timeout_s is long); a claim on a live id without its
    token is refused, and the live actor goes on."""
    run_id, run_dir = new_run_id(), tmp_path / "run"
    slow = ["--set", "transport.actor_timeout_s=300"]  # reaping by silence would come far too late
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=100_000_000, extra=slow
    )
    token = ["--token-file", str(tmp_path / "a0.token"), *slow]
    a0 = start_actor(procs, "a0", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=token)
    start_actor(procs, "a1", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=slow)
    wait_for(lambda: rows_of(run_dir, "a0") and rows_of(run_dir, "a1"), 120, "both actors' slots", procs=procs)
    a0.kill()
    a0.wait(10)
    procs.popen.pop("a0")
    start_actor(procs, "a0", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=token)
    wait_for(
        lambda: "actor a0 left (came back with its token)" in procs.err("learner"),
        120,
        "a0 to come back with its token",
        procs=procs,
    )
    wait_for(
        lambda: re.search(r"actor a0: joined run \S+ \(restart 1\)", procs.err("a0")), 60, "a0's join line", procs=procs
    )

    spy = Spy(learner_ep, actor_id="a1")  # the same id, even the same socket identity prefix
    try:
        for claim in (None, b"\0" * 16):
            refusal = spy.hello(token=claim)
            assert refusal["type"] == "refuse" and "is in use" in refusal["reason"], refusal
        # and no message can speak for a1 without its route and token
        spy.send(codec.encode({"type": "bye", "run_id": run_id, "actor_id": "a1", "token": b"\0" * 16}))
        assert spy.hello(env_id="asyncrl/Constant-v0")["type"] == "refuse"  # barrier: all of the above handled
    finally:
        spy.close()
    seen = len(rows_of(run_dir, "a1"))
    wait_for(lambda: len(rows_of(run_dir, "a1")) > seen, 90, "a1's slots after the claims", procs=procs)
    stop_learner(procs)
    assert procs.wait("a1", 30) == 0 and procs.wait("a0", 30) == 0, procs.dump()
    log = procs.err("learner")
    assert "actor a1 left" not in log, log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_rejoins"] == {"a0": 1}, summary
    assert summary["rejected_messages"] == {"bad_token": 1}, summary
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()


@pytest.mark.timeout(200)
def test_broadcaster_restarted_before_any_actor_holds_weights(procs, tmp_path):
    """The broadcaster SIGKILLed after the learner's first publish and before any actor has
    weights, then started again: the learner publishes to the new one, and the run finishes; the
    actor that waited for weights meanwhile (longer than actor_timeout_s) was never dropped."""
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 3_000
    procs.run_ids.add(run_id)
    learner_ep, broadcaster_ep = endpoints()
    first = tmp_path / "b1.json"
    procs.start("b1", ["broadcaster", "--bind", broadcaster_ep, "--summary", str(first)], expect_failure=True)
    start_learner(
        procs,
        learner_ep,
        broadcaster_ep,
        run_id=run_id,
        run_dir=run_dir,
        env_id=CORRIDOR,
        total_steps=total,
        extra=FAST,
    )
    wait_for(
        lambda: first.exists() and json.loads(first.read_text())["published"] >= 1,
        90,
        "the first broadcaster to hold weights",
        procs=procs,
    )
    procs.popen["b1"].kill()
    procs.popen["b1"].wait(10)
    start_actor(procs, "a0", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=FAST)
    wait_for(lambda: "joined run" in procs.err("a0"), 90, "a0 to join", procs=procs)
    time.sleep(3)  # longer than actor_timeout_s, with no broadcaster: a0 waits for weights
    procs.start("b2", ["broadcaster", "--bind", broadcaster_ep, "--summary", str(tmp_path / "b2.json")])
    assert procs.wait("learner", 150) == 0, procs.dump()
    assert procs.wait("a0", 30) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["env_steps"] >= total, summary
    assert "actor a0 left" not in procs.err("learner"), procs.err("learner")
    procs.popen["b2"].send_signal(signal.SIGINT)
    assert procs.wait("b2", 30) == 130, procs.dump()
    assert json.loads((tmp_path / "b2.json").read_text())["published"] >= 1
    procs.shutdown()


@pytest.mark.timeout(240)
def test_stalled_actor_rejoins_and_acts_with_the_newest_weights(procs, tmp_path):
    """An actor SIGSTOPped for longer than actor_timeout_s while another goes on: once continued it
    rejoins (the run goes on), and its first slot trained on after that was collected with weights
    at least as new as the learner's version when it was continued."""
    run_id, run_dir = new_run_id(), tmp_path / "run"
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=100_000_000, extra=FAST
    )
    frozen = start_actor(procs, "frozen", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=FAST)
    start_actor(procs, "good", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=FAST)
    wait_for(lambda: rows_of(run_dir, "frozen") and rows_of(run_dir, "good"), 120, "both actors' slots", procs=procs)
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "actor frozen left (silent" in procs.err("learner"), 60, "the learner to drop it", procs=procs)
        done = len(read_jsonl(run_dir / "metrics.jsonl"))
        wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= done + 3, 90, "3 more iterations", procs=procs)
        version = len(read_jsonl(run_dir / "metrics.jsonl"))  # iteration k publishes version k
        before = len(rows_of(run_dir, "frozen"))
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: len(rows_of(run_dir, "frozen")) > before, 90, "frozen's slots after it rejoined", procs=procs)
    first = rows_of(run_dir, "frozen")[before]
    assert first["behavior_version"] >= version, (first, version)
    stop_learner(procs)
    assert procs.wait("frozen", 30) == 0 and procs.wait("good", 30) == 0, procs.dump()
    assert "saying hello again" in procs.err("frozen"), procs.err("frozen")
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()


@pytest.mark.timeout(200)
def test_forged_weights_and_bye_under_asyncrl_run(procs, tmp_path):
    """`asyncrl run` (loopback, no keys): weights sent to its broadcaster by a non-learner (with a
    huge version, or signed with a guessed secret) and a bye for its actor from another process
    are rejected and counted; the run finishes, its summary.json holds the broadcaster's counts."""
    run_dir, total = tmp_path / "run", 20_000
    procs.start(
        "run",
        ["run", "--env", CORRIDOR, "--num-actors", "1", "--total-steps", str(total), "--run-dir", str(run_dir), *SMALL],
    )
    m = wait_for(
        lambda: re.search(r"^run (\S+): learner (\S+), broadcaster (\S+),", procs.out("run"), re.M),
        60,
        "the run line",
        procs=procs,
    )
    run_id, learner_ep, broadcaster_ep = m.group(1), m.group(2), m.group(3)
    procs.run_ids.add(run_id)
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 2, 90, "2 learner iterations", procs=procs)

    ctx = sockets.context()
    forger = sockets.dealer(ctx, addresses.snapshot_endpoint(broadcaster_ep), "forger")
    try:
        weights = codec.encode_weights(
            run_id=run_id,
            epoch=2**63 - 1,
            version=2**62,
            publish_time=0.0,
            layout_hash="x",
            payload=np.zeros(4, np.float32),
        )
        sockets.send(forger, weights)
        sockets.send(forger, codec.sign_weights(weights, b"a guessed secret"))
        # barrier: the broadcaster answers this snapshot request after handling the two above
        sockets.send(forger, codec.encode({"type": "snapshot", "run_id": run_id, "actor_id": "forger"}))
        assert sockets.recv_multipart_timeout(forger, 20_000) is not None
    finally:
        sockets.close(forger)
        ctx.term()
    spy = Spy(learner_ep, actor_id="actor0")
    try:
        spy.send(codec.encode({"type": "bye", "run_id": run_id, "actor_id": "actor0", "token": b"\0" * 16}))
        assert spy.hello(env_id="asyncrl/Constant-v0")["type"] == "refuse"  # barrier
    finally:
        spy.close()
    seen = len(read_jsonl(run_dir / "metrics.jsonl"))

    assert procs.wait("run", 150) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["learner_iterations"] > seen, summary
    assert summary["rejected_messages"] == {"bad_token": 1}, summary
    assert summary["broadcaster"]["rejected_messages"] == {"not_learner": 2}, summary
    own = json.loads((run_dir / "broadcaster-summary.json").read_text())
    assert own["rejected_messages"] == {"not_learner": 2} and own["epoch"] < 2**63 - 1, own
    assert "the broadcaster rejected messages" in procs.out("run") + procs.err("run")
    assert "actor actor0 left" not in (run_dir / "logs" / "learner.log").read_text()
    assert {r["actor"] for r in read_jsonl(run_dir / "lag.jsonl")} == {"actor0"}
    procs.shutdown()
