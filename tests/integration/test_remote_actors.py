"""Actors of other hosts, on one host: CURVE keys on a non-loopback address (a wrong or missing key
is refused and logged while training goes on), a relay broadcaster, rollouts forced over TCP, and
handshake refusals (run id, protocol version). Env id and rollout length refusals are covered by
test_multiprocess.py::test_mismatched_actor_refused; the multi-host run is test_netns.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from mp_helpers import SMALL, free_port, free_port_pair, learner_cmd, new_run_id, read_jsonl, wait_for
from test_multiprocess import CORRIDOR

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire import codec, protocol, sockets
from asyncrl.wire.security import Security

pytestmark = pytest.mark.integration

SPEC = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=16, num_envs=2)  # = SMALL


def lan_address() -> str | None:
    """A non-loopback IPv4 address of this host (traffic to it stays on this host), or None."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    return None


def generate_keys(tmp_path, clients: int):
    keys = tmp_path / "keys"
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "keys", "generate", str(keys), "--clients", str(clients)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return keys


def one_error_line(procs, name: str) -> str:
    """The one "Error: ..." line of a refused role. Log lines (INFO "waiting for the learner" when the
    learner is slow under load, WARNINGs) may come before it and do not count."""
    lines = [ln for ln in procs.err(name).splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, procs.err(name)
    assert "Traceback" not in procs.err(name)
    return lines[0]


@pytest.mark.timeout(150)
def test_actor_with_wrong_or_missing_key_is_refused_and_training_goes_on(procs, tmp_path):
    host = lan_address()
    if host is None:
        pytest.skip("no non-loopback IPv4 address on this host (CURVE is only on for such addresses)")
    keys = generate_keys(tmp_path, clients=1)
    other = tmp_path / "other"  # the keys of another deployment
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "keys", "generate", str(other)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    stranger = tmp_path / "stranger"  # a client key pair the learner does not list, the right server key
    stranger.mkdir()
    for name in ("client.key", "client.key_secret"):
        shutil.copy(other / "client-1" / name, stranger / name)
    shutil.copy(keys / "client-1" / "server.key", stranger / "server.key")
    # a budget no loaded machine reaches within the test: the learner must outlive every refusal
    # (a learner that finished first would fail the bad actors for another reason); stopped below
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 100_000_000
    procs.run_ids.add(run_id)
    learner_ep, broadcaster_ep = f"tcp://{host}:{free_port(host)}", f"tcp://{host}:{free_port_pair(host)}"
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep, "--keys", str(keys / "server")])
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
    )

    def actor(name, *extra, expect_failure=False):
        procs.start(
            name,
            [
                "actor",
                "--learner",
                learner_ep,
                "--broadcaster",
                broadcaster_ep,
                "--actor-id",
                name,
                "--env",
                CORRIDOR,
                *SMALL,
                *extra,
            ],
            expect_failure=expect_failure,
        )

    actor("good", "--keys", str(keys / "client-1"))
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 2, 90, "2 learner iterations", procs=procs)
    actor("stranger", "--keys", str(stranger), expect_failure=True)  # a key not listed
    actor("foreign", "--keys", str(other / "client-1"), expect_failure=True)  # trusts another server
    actor("keyless", "--insecure", expect_failure=True)  # no CURVE at all
    actor("unkeyed", expect_failure=True)  # neither: stops before connecting
    # the learner or the broadcaster, whichever handshake fails first
    refused = r"the (learner|broadcaster) at tcp://[0-9.:]+ refused the connection: "
    expected = {
        "stranger": refused + re.escape("the server refused the client's CURVE key"),
        "foreign": refused + "(the peer dropped the connection|CURVE decryption failed)",
        # it sees the mismatch, or the server hanging up first; the server always sees the mismatch
        "keyless": refused,
        "unkeyed": re.escape(f"{learner_ep} is reachable from other hosts, so CURVE is on: give --keys DIR"),
    }
    for name, pattern in expected.items():
        assert procs.wait(name, 60) == 2, procs.dump()
        line = one_error_line(procs, name)
        assert re.search(pattern, line), line

    # an actor host's key may ask the broadcaster for weights, but not hand it any
    ctx = sockets.context()
    request_ep = f"{broadcaster_ep.rsplit(':', 1)[0]}:{int(broadcaster_ep.rsplit(':', 1)[1]) + 1}"
    spy = sockets.dealer(ctx, request_ep, "forger", security=Security("spy", keys / "client-1").client(request_ep))
    try:
        sockets.send(
            spy,
            codec.encode_weights(
                run_id=run_id, version=10**6, publish_time=0.0, layout_hash="x", payload=np.zeros(4, np.float32)
            ),
        )
        wait_for(
            lambda: "rejected message from forger: not_learner" in procs.err("broadcaster"),
            30,
            "the broadcaster to refuse forged weights",
            procs=procs,
        )
    finally:
        sockets.close(spy)
        ctx.term()

    # training went on through every refusal: still running, and more iterations since
    done = len(read_jsonl(run_dir / "metrics.jsonl"))
    wait_for(
        lambda: len(read_jsonl(run_dir / "metrics.jsonl")) > done,
        90,
        "a learner iteration after the refusals",
        procs=procs,
    )
    assert procs.popen["learner"].poll() is None, procs.dump()
    procs.popen["learner"].send_signal(signal.SIGINT)
    assert procs.wait("learner", 60) == 130, procs.dump()
    log = procs.err("learner") + procs.err("broadcaster")
    stranger_key = (stranger / "client.key").read_text().split('public-key = "')[1][:40]
    assert f"refused connection from {host}: unknown_client_key: CURVE client key {stranger_key}" in log, log
    # under load one of the two mechanism-level refusals may be logged after training ended; each
    # bad actor's own one-line refusal is checked above
    assert "mechanism_mismatch" in log or "cryptographic" in log, log
    summary = json.loads((run_dir / "summary.json").read_text())  # stopped by us, so interrupted
    assert summary["outcome"] == "interrupted" and summary["failure"] is None, summary
    assert {r["actor"] for r in read_jsonl(run_dir / "lag.jsonl")} == {"good"}  # nothing of a bad actor trained on
    # the learner counts the refusals it saw (a bad actor stops at its first refusal, which may
    # have come from the broadcaster); the logs above hold every kind
    assert set(summary["refused_connections"]) <= {
        "unknown_client_key",
        "mechanism_mismatch",
        "cryptographic",
        "no_detail",
        "protocol",
    }, summary
    procs.popen["broadcaster"].send_signal(2)
    procs.shutdown()


@pytest.mark.timeout(150)
def test_relay_tcp_rollouts_and_handshake_refusals(procs, tmp_path):
    """Weights through a relay broadcaster to an actor that ships its rollouts over TCP; actors of
    another run id or protocol version are refused with one line naming the field and both values."""
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 6000
    procs.run_ids.add(run_id)
    learner_ep = f"tcp://127.0.0.1:{free_port()}"
    upstream_ep, relay_ep = f"tcp://127.0.0.1:{free_port_pair()}", f"tcp://127.0.0.1:{free_port_pair()}"
    procs.start("broadcaster", ["broadcaster", "--bind", upstream_ep])
    procs.start("relay", ["broadcaster", "--bind", relay_ep, "--upstream", upstream_ep])
    procs.start(
        "learner",
        learner_cmd(learner_ep, upstream_ep, *SMALL, run_id=run_id, run_dir=run_dir, total=total),
    )
    # refused before any good actor joins: nothing of it can be consumed
    procs.start(
        "other_run",
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            relay_ep,
            "--actor-id",
            "other_run",
            "--env",
            CORRIDOR,
            "--run-id",
            "some-old-run",
            *SMALL,
        ],
        expect_failure=True,
    )
    assert procs.wait("other_run", 90) == 2, procs.dump()
    line = one_error_line(procs, "other_run")
    assert f"refused by the learner: run_id: actor has 'some-old-run', learner has '{run_id}'" in line, line

    # a hello of another protocol version (msgpack by hand: codec.encode refuses to build it)
    ctx = sockets.context()
    spy = sockets.dealer(ctx, learner_ep, "future")
    try:
        hello = {
            "type": "hello",
            "proto": protocol.PROTOCOL_VERSION + 1,
            "run_id": "",
            "actor_id": "future",
            "host": "h",
            "pid": os.getpid(),
            "env_id": CORRIDOR,
            "spec": SPEC.to_dict(),
            "shm_token": None,
        }
        sockets.send(spy, [msgpack.packb(hello)])
        frames = sockets.recv_multipart_timeout(spy, 30_000)
        assert frames is not None, "no answer to a hello of another protocol version"
        reply, _ = codec.decode(frames)
        assert reply["type"] == "refuse", reply
        assert reply["reason"] == (
            f"proto: actor has protocol {protocol.PROTOCOL_VERSION + 1}, learner has {protocol.PROTOCOL_VERSION}"
        ), reply
    finally:
        sockets.close(spy)
        ctx.term()

    procs.start(
        "tcp",
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            relay_ep,
            "--actor-id",
            "tcp",
            "--env",
            CORRIDOR,
            "--rollout-transport",
            "tcp",
            "--run-id",
            run_id,
            "--host-label",
            "elsewhere",
            *SMALL,
        ],
    )
    assert procs.wait("learner", 120) == 0, procs.dump()
    assert procs.wait("tcp", 20) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= total
    assert summary["rollouts_by_transport"] == {"tcp": summary["slot_counters"]["completed"]}, summary
    assert summary["rejected_messages"] == {"proto": 1}, summary
    rows = read_jsonl(run_dir / "lag.jsonl")
    assert {r["actor"] for r in rows} == {"tcp"} and {r["host"] for r in rows} == {"elsewhere"}
    assert max(r["behavior_version"] for r in rows) >= 5, "the relay passed on no new weights"
    assert "refused actor other_run" in procs.err("learner")
    for name in ("broadcaster", "relay"):
        procs.popen[name].send_signal(signal.SIGINT)
        assert procs.wait(name, 10) == 130, procs.dump()  # stopped by Ctrl-C: interrupted (asyncrl.core.exit_status)
    procs.shutdown()
