"""Hostile peers, second round: no message, number, name or connection from a peer can
end, stall, fake or exhaust a run. One test per finding of the issue (each failed on main 75409f3),
then tests of the class fixes. Run alone with ``pytest -m hostile``.

The learner runs in the test's own process and is driven by hand (hostile_helpers.live_learner),
so each attack is deterministic and nothing needs killing; /dev/shm attacks use a private folder
(dev_shm.SHM_DIR monkeypatched) so that no other run on this host sees the planted names."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner
from hostile_helpers import CORRIDOR, SPEC, STEPS, Peer, live_learner, raw_report, report, valid_slot

from asyncrl.roles.learner_messages import _gone_here
from asyncrl.roles.learner_peers import ActorInfo
from asyncrl.wire import addresses, codec, protocol, rejects, security, sockets, weights_secret
from asyncrl.wire.shm import dev_shm
from asyncrl.wire.shm.ring import SlotRing

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


def _serve_quietly(learner, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        learner.serve(10)


# ---------------------------------------------------------------- (a) a declared pid ends the learner


@pytest.mark.parametrize("pid", [2**31, 2**40, 2**63 - 1, 2**64 - 1, 0])
def test_declared_pid_beyond_int32_cannot_end_the_learner(tmp_path, ctx, pid):
    """Hello as X with this host's name and a pid os.kill cannot take, then hello as X without its
    token from another connection: on 75409f3 the second hello raised OverflowError out of
    ``serve`` (``_gone_here``) and ended the learner. Now the hello is refused by the schema
    (pid 1..2**22), ``_gone_here`` never trusts a declared pid, and training goes on."""
    with live_learner(tmp_path) as learner:
        first, second, honest = (Peer(ctx, learner.endpoint, n) for n in ("first", "second", "honest"))
        hello = {"proto": protocol.PROTOCOL_VERSION, **first.hello_header("x", host=socket.gethostname(), pid=pid)}
        first.send([msgpack.packb(hello, use_bin_type=True)])
        first.pump(learner)
        second.send([msgpack.packb({**hello, "pid": os.getpid()}, use_bin_type=True)])
        second.pump(learner)  # 75409f3: OverflowError here
        honest.join(learner, "honest")
        honest.say("request", "honest")
        assert honest.wait(learner, "grant")["slot"] in range(learner.cfg.learner.num_slots)
        if not 1 <= pid <= protocol.MAX_PID:
            assert learner.rejects.by_reason().get("schema") == 1, learner.rejects.counts


@pytest.mark.parametrize("pid", [2**31, 2**40, 2**63 - 1, 2**64 - 1, -1, 0])
def test_gone_here_never_raises_for_a_declared_pid(pid):
    assert _gone_here(ActorInfo(socket.gethostname(), pid, 0.0)) is False


# ---------------------------------------------------------------- (b) a name in /dev/shm


@pytest.fixture
def private_shm(tmp_path, monkeypatch):
    """dev_shm.SHM_DIR pointed at a private folder (what cleanup scans; rings are still created in
    /dev/shm), so the names planted here are seen by this test alone."""
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(dev_shm, "SHM_DIR", str(folder))
    return folder


def _dead_pid() -> int:
    """A pid no process has (the largest free one below pid_max)."""
    top = int(open("/proc/sys/kernel/pid_max").read())
    for pid in range(min(top, dev_shm.MAX_PID) - 1, 1, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no free pid")


def _plant_hostile_names(folder) -> dict[str, str]:
    """Names anyone could put in a world-writable /dev/shm; returns {name: what it is}."""
    dead = _dead_pid()
    planted = {
        "asyncrl-x-9999999999": "a 10-digit pid (os.kill: OverflowError on 75409f3)",
        "asyncrl-x-99999999999999999999": "a 20-digit pid",
        "asyncrl-x-0": "pid 0 (os.kill(0, 0) asks about the own process group)",
        "asyncrl-x-\n-7": "a newline in the name",
        f"asyncrl-dir-{dead}": "a directory with a dead pid",
        f"asyncrl-link-{dead}": "a symlink with a dead pid",
        f"asyncrl-other-{dead}": "another user's file with a dead pid",
        f"asyncrl-mine-{dead}": "this user's file with a dead pid: the only one to remove",
    }
    for name in planted:
        path = folder / name
        if name.startswith("asyncrl-dir-"):
            path.mkdir()
            (path / "inside").write_text("x")
        elif name.startswith("asyncrl-link-"):
            path.symlink_to(folder / "target-of-link")
            (folder / "target-of-link").write_text("keep me")
        else:
            path.write_bytes(b"\0" * 64)
            if name.startswith("asyncrl-other-") and os.geteuid() == 0:  # (only root can give a file away)
                os.chown(path, 54321, 54321)
    return planted


def test_names_in_dev_shm_cannot_break_cleanup(private_shm):
    """On 75409f3 ``asyncrl-x-9999999999`` made ``cleanup_stale`` raise OverflowError (and a
    directory of a dead pid IsADirectoryError). Now it removes only this user's regular files of
    dead pids and never raises for a name."""
    _plant_hostile_names(private_shm)
    removed = dev_shm.cleanup_stale()
    left = set(os.listdir(private_shm))
    mine = [n for n in removed if n.startswith("asyncrl-mine-")]
    assert mine and removed == mine, removed
    assert not [n for n in left if n.startswith("asyncrl-mine-")]
    assert (private_shm / "target-of-link").read_text() == "keep me"
    if os.geteuid() == 0:  # another user's file stays: not ours to judge
        assert [n for n in left if n.startswith("asyncrl-other-")]


def test_names_in_dev_shm_cannot_stop_a_learner(tmp_path, private_shm):
    """On 75409f3 the learner's constructor raised OverflowError (cleanup_stale) for a file named
    ``asyncrl-x-9999999999``: any local user could stop every learner from starting."""
    _plant_hostile_names(private_shm)
    with live_learner(tmp_path) as learner:
        assert learner.ring.name.startswith("asyncrl-")


def test_names_in_dev_shm_cannot_break_asyncrl_clean(private_shm, monkeypatch):
    """``asyncrl clean`` crashed the same way on 75409f3."""
    from asyncrl.cli import main

    _plant_hostile_names(private_shm)
    # leave other runs' secrets alone
    monkeypatch.setattr(weights_secret, "remove_stale_weights_secrets", lambda **_: [])
    result = CliRunner().invoke(main, ["clean"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "removed 1 segment" in result.output, result.output
    result = CliRunner().invoke(main, ["clean", "--run-id", "x"])
    assert result.exit_code == 0, (result.output, result.exception)


def test_a_taken_ring_name_does_not_stop_a_learner(tmp_path):
    """A file at the very name a learner will create (``asyncrl-<run id>-<pid>``; the run id is
    often given on command lines): it takes another name instead of failing (ShmError on 75409f3)."""
    from hostile_helpers import SMALL

    from asyncrl.core import config
    from asyncrl.roles.learner import Learner
    from asyncrl.run.launch import free_port

    run_id = f"hostile-taken-{os.getpid()}"
    squatted = f"/dev/shm/asyncrl-{run_id}-{os.getpid()}"
    with open(squatted, "wb") as f:
        f.write(b"\0" * 64)
    try:
        learner = Learner(
            config.load(None, SMALL),
            tmp_path / "run",
            run_id=run_id,
            bind="tcp://127.0.0.1:0",
            broadcaster=f"tcp://127.0.0.1:{free_port()}",
            echo=lambda *_: None,
        )
        try:
            assert learner.ring.name != os.path.basename(squatted)
            assert dev_shm.run_segment_pattern(run_id).fullmatch(learner.ring.name)
        finally:
            learner.close()
        assert not os.path.exists(f"/dev/shm/{learner.ring.name}")
    finally:
        os.unlink(squatted)


# ---------------------------------------------------------------- (c) the refusal counter race


def test_refusal_counter_survives_a_concurrent_writer():
    """The CURVE authenticator's thread counts refusals while the role's thread reads the counts
    for its summary file: on 75409f3 that raised "dictionary changed size during iteration" (many
    times a second). Now the counter takes a lock, and no count is lost."""
    sec = security.Security("broadcaster")
    counter = sec.refused
    stop, written = threading.Event(), [0]

    def authenticator() -> None:  # what _AllowedKeys.callback does for each refused client
        i = 0
        while not stop.is_set():
            counter.reject(
                protocol.ProtocolError("auth", "key not allowed"), f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
            )
            i += 1
            written[0] = i

    thread = threading.Thread(target=authenticator, daemon=True)
    thread.start()
    errors = []
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not errors:
            try:
                counter.by_reason()
                _ = counter.total
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        thread.join(10)
        sec.close()
    assert not errors, errors[0]
    assert counter.total == written[0]


def test_broadcaster_summary_survives_refusals_from_another_thread(tmp_path):
    """The same race through the broadcaster's own ``counts`` / ``write_summary``."""
    from asyncrl.roles.broadcaster import Broadcaster
    from asyncrl.run.launch import free_port_pair

    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", summary=tmp_path / "b.json", echo=lambda *_: None)
    stop = threading.Event()

    def refuse() -> None:
        i = 0
        while not stop.is_set():
            b.security.refused.reject(protocol.ProtocolError("auth", "not allowed"), f"host-{i}")
            i += 1

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            b.counts()
            b.write_summary(force=True)
    finally:
        stop.set()
        thread.join(10)
        b.close()


# ---------------------------------------------------------------- (d) one report fakes, ends or stalls the run


def _joined(learner, ctx, name="liar"):
    peer = Peer(ctx, learner.endpoint, name)
    peer.join(learner, name)
    peer.say("request", name)
    peer.say("request", name)
    return peer


@pytest.mark.parametrize("env_steps", [2**62, 2**63 - 1, 0, STEPS - 1, STEPS + 1])
def test_report_env_steps_come_from_the_slot(tmp_path, ctx, env_steps):
    """On 75409f3 one report with env_steps 2**62 ended the run as finished at 4.6e18 steps (2**63:
    a crash in TensorBoard's writer; 0 forever: the budget never reached). Now a report whose
    count is not the slot's E*T is refused (counted "env_steps"), and what counts toward the
    budget is E*T of each trained slot."""
    with live_learner(tmp_path) as learner:
        peer = _joined(learner, ctx)
        g1 = peer.wait(learner, "grant")
        peer.send(report(peer, "liar", g1["grant_id"], env_steps=env_steps))
        g2 = peer.wait(learner, "grant")
        peer.send(report(peer, "liar", g2["grant_id"]))
        g3 = peer.wait(learner, "grant")
        peer.send(report(peer, "liar", g3["grant_id"]))
        peer.pump(learner)
        assert learner.rejects.by_reason() == {"env_steps": 1}, learner.rejects.counts
        assert learner.consume()
        assert learner.state.env_steps == 2 * STEPS
        assert not learner.consumer.done


def test_report_env_steps_of_2_64_is_refused(tmp_path, ctx):
    with live_learner(tmp_path) as learner:
        peer = _joined(learner, ctx)
        g = peer.wait(learner, "grant")
        peer.send(raw_report(peer, "liar", g["grant_id"], env_steps=2**64 - 1))
        peer.pump(learner)
        assert learner.rejects.by_reason() == {"schema": 1}, learner.rejects.counts
        assert learner.ledger.num_full == 0


@pytest.mark.parametrize(
    "returns,lengths",
    [
        ([1e300, 0.0], [6, 10]),
        ([3e38, 1.0], [6, 10]),
        ([1.0, 2.0, 3.0], [1, 1, 1]),
        ([1.0, 2.0], [6, 0]),
        ([1.0], [6, 10]),
    ],
)
def test_report_episode_returns_are_bounded_and_checked_against_the_slot(tmp_path, ctx, returns, lengths):
    """On 75409f3 one report with an episode return of 1e300 made the run's average return 1e300.
    Now returns are bounded in the schema (|x| <= 1e15), and their number is checked against the
    slot's episode ends (two in this slot) and the lengths."""
    with live_learner(tmp_path) as learner:
        peer = _joined(learner, ctx)
        g = peer.wait(learner, "grant")
        peer.send(
            report(peer, "liar", g["grant_id"], episode_returns=returns, episode_lengths=lengths)
            if max(map(abs, returns)) <= protocol.MAX_ABS_FLOAT
            else raw_report(peer, "liar", g["grant_id"], episode_returns=returns, episode_lengths=lengths)
        )
        peer.pump(learner)
        assert learner.rejects.total == 1 and set(learner.rejects.by_reason()) <= {"schema", "episodes"}, (
            learner.rejects.counts
        )
        assert learner.ledger.num_full == 0
        assert learner.consumer.episodes.average_return is None or abs(learner.consumer.episodes.average_return) < 1e6


def _slot_with_an_episode_inside(grant_id: int) -> tuple[dict, list[float], list[int]]:
    """A valid slot whose env 0 also ends at step 3, so its episode of steps 4..9 lies inside the slot,
    and the honest report's (returns, lengths) for its three ends, in the actor's order (step-major)."""
    a = valid_slot(grant_id)
    a["terminated"][3, 0] = True
    inside = float(a["rewards"][4:10, 0].astype(np.float64).sum())
    return a, [0.5, -1.5, inside], [4, 6, 6]


@pytest.mark.parametrize("lie", ["none", "return", "tiny_return", "length", "boundary_length", "one_left_out"])
def test_episode_returns_inside_the_slot_are_recomputed_from_its_rewards(tmp_path, ctx, lie):
    """A report's episode that starts and ends inside its slot is checked against the slot's rewards
    and done flags (a lie about its return or length is refused, counted "episodes"); an episode that
    began in an earlier slot must be at least as long as its steps in this one. A report that leaves
    an episode out (the actor drops non-finite returns) gets only what the slot shows recorded."""
    with live_learner(tmp_path) as learner:
        peer = _joined(learner, ctx)
        g = peer.wait(learner, "grant")
        arrays, returns, lengths = _slot_with_an_episode_inside(g["grant_id"])
        if lie == "return":
            returns[2] += 1e6
        elif lie == "tiny_return":
            returns[2] += 1e-3
        elif lie == "length":
            lengths[2] = 7
        elif lie == "boundary_length":
            lengths[0] = 3
        elif lie == "one_left_out":
            returns, lengths = [1e12, 1e12], [100, 100]  # unverifiable: nothing of it is recorded
        peer.send(report(peer, "liar", g["grant_id"], arrays, episode_returns=returns, episode_lengths=lengths))
        peer.pump(learner)
        if lie in ("none", "one_left_out"):
            assert learner.rejects.total == 0, learner.rejects.counts
            ((_, meta),) = learner.full_meta.values()
            expected = returns if lie == "none" else [float(arrays["rewards"][4:10, 0].astype(np.float64).sum())]
            assert meta["episode_returns"] == pytest.approx(expected, rel=1e-9)
        else:
            assert learner.rejects.by_reason() == {"episodes": 1}, learner.rejects.counts
            assert learner.ledger.num_full == 0


@pytest.mark.parametrize(
    "timing",
    [
        {"env_s": math.nan},
        {"env_s": -1.0},
        {"wait_s": 1e300},
        {"env_s": math.inf},
        {"inference_s": 3600.0},
        {"env_s": "fast"},
        {"env_s": True},
    ],
)
def test_report_timing_takes_plausible_seconds_only(tmp_path, ctx, timing):
    """On 75409f3 a report's timing dict took NaN and negatives (NaN reached summary.json). Now each
    value must be seconds in 0..(time since the actor's welcome + 1)."""
    with live_learner(tmp_path) as learner:
        peer = _joined(learner, ctx)
        g = peer.wait(learner, "grant")
        peer.send(raw_report(peer, "liar", g["grant_id"], timing=timing))
        peer.pump(learner)
        assert learner.rejects.total == 1, learner.rejects.counts
        assert all(math.isfinite(v) and 0 <= v < 3600 for v in learner.timing.values()), learner.timing


# ---------------------------------------------------------------- (e) one peer hoards every slot


def test_one_actor_cannot_hoard_the_slots(tmp_path, ctx):
    """On 75409f3 a peer that sent ~100 requests and then only heartbeats held every slot, and
    training stalled with no warning. Now an actor holds at most protocol.GRANT_CREDITS grants (granted +
    asked for); further requests are refused ("over_credit"), and an honest actor gets its slots."""
    with live_learner(tmp_path) as learner:
        hoarder = Peer(ctx, learner.endpoint, "hoarder")
        hoarder.join(learner, "hoarder")
        for _ in range(100):
            hoarder.say("request", "hoarder")
        hoarder.pump(learner, 1.0)
        assert len(hoarder.grants()) <= protocol.GRANT_CREDITS
        assert learner.rejects.by_reason().get("over_credit", 0) >= 100 - protocol.GRANT_CREDITS
        honest = Peer(ctx, learner.endpoint, "honest")
        honest.join(learner, "honest")
        for _ in range(protocol.GRANT_CREDITS):
            honest.say("request", "honest")
        grants = [honest.wait(learner, "grant") for _ in range(protocol.GRANT_CREDITS)]
        for g in grants:
            honest.send(report(honest, "honest", g["grant_id"]))
        deadline = time.monotonic() + 10
        while learner.ledger.num_full < 2 and time.monotonic() < deadline:
            honest.pump(learner, 0.05)
        assert learner.consume() and learner.state.iteration == 1


def test_many_ids_on_one_connection_cannot_hoard_the_slots(tmp_path, ctx):
    """The same through many actor ids on one connection: it may speak for a few ids, and all of
    them together hold at most protocol.GRANT_CREDITS grants."""
    with live_learner(tmp_path) as learner:
        hoarder = Peer(ctx, learner.endpoint, "hoarder")
        for k in range(10):
            hoarder.send(codec.encode(hoarder.hello_header(f"h{k}")))
        hoarder.pump(learner, 0.5)
        for h in [h for h in hoarder.inbox if h["type"] == "welcome"]:
            hoarder.run_id = h["run_id"]
        welcomed = [h for h in hoarder.inbox if h["type"] == "welcome"]
        assert len(welcomed) < 10
        for k in range(len(welcomed)):
            hoarder.ids[f"h{k}"] = welcomed[k]["actor_token"]  # (welcomes come in hello order)
            for _ in range(20):
                hoarder.say("request", f"h{k}")
        hoarder.pump(learner, 1.0)
        assert len(hoarder.grants()) <= protocol.GRANT_CREDITS
        assert learner.ledger.num_free >= learner.cfg.learner.num_slots - protocol.GRANT_CREDITS


def test_a_grant_without_a_report_is_taken_back_after_its_lease(tmp_path, ctx):
    """A peer that holds its grants and only heartbeats loses them after the lease
    (transport.grant_lease_s here): the slots' generations change, so its late write stops and a
    late report is refused; it gets its credits back (a slow honest actor is not starved)."""
    with live_learner(tmp_path, "transport.grant_lease_s=1.0") as learner:
        sleeper = Peer(ctx, learner.endpoint, "sleeper")
        welcome = sleeper.join(learner, "sleeper")
        sleeper.say("request", "sleeper")
        g = sleeper.wait(learner, "grant")
        ring = SlotRing.attach(
            name=welcome["shm_name"], spec=SPEC, num_slots=welcome["num_slots"], token=welcome["token"]
        )
        try:
            guard = ring.guard(g["slot"], g["grant_id"])
            assert guard.may_write()
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:  # heartbeats only, past the lease
                sleeper.say("heartbeat", "sleeper")
                sleeper.pump(learner, 0.2)
            assert learner.ledger.counters["lease_expired"] >= 1
            assert not guard.may_write()  # its writer stops: the generation changed
            again = sleeper.grants()
            assert again, "the credit of the taken-back grant was not given back"
            assert all(x["grant_id"] != g["grant_id"] for x in again)
            before = learner.rejects.by_reason().get("stale_grant", 0)
            sleeper.send(report(sleeper, "sleeper", g["grant_id"]))  # late report of the old grant
            sleeper.pump(learner, 0.3)
            assert learner.rejects.by_reason().get("stale_grant", 0) == before + 1
        finally:
            ring.close()


# ---------------------------------------------------------------- class: every handler survives peer input


def test_an_exception_in_a_handler_is_counted_not_fatal(tmp_path, ctx, monkeypatch):
    """Whatever a handler raises for a peer's message (here: a bug simulated in on_hello) is
    counted by reason and the learner goes on; on 75409f3 anything but ProtocolError ended it."""
    with live_learner(tmp_path) as learner:
        real = learner.on_hello

        def broken(identity, h):
            if h["actor_id"] == "trigger":
                raise KeyError("simulated bug")
            return real(identity, h)

        monkeypatch.setattr(learner, "on_hello", broken)
        peer = Peer(ctx, learner.endpoint, "p")
        peer.send(codec.encode(peer.hello_header("trigger")))
        peer.pump(learner)
        assert learner.rejects.by_reason() == {"handler_error:KeyError": 1}
        peer.join(learner, "after")


def test_serve_handles_a_bounded_number_of_messages_per_call(tmp_path, ctx):
    """A flood must not keep ``serve`` from returning (and the learner from training)."""
    from asyncrl.roles.learner_peers import MAX_MESSAGES_PER_SERVE

    with live_learner(tmp_path) as learner:
        peer = Peer(ctx, learner.endpoint, "flood")
        junk = [b"\x93not a map"]
        for _ in range(3 * MAX_MESSAGES_PER_SERVE):
            peer.send(junk)
        time.sleep(1.0)  # let them reach the learner's queue (fewer only make the bound easier)
        deadline = time.monotonic() + 10
        while learner.rejects.total == 0 and time.monotonic() < deadline:
            learner.serve(50)
        assert 0 < learner.rejects.total <= MAX_MESSAGES_PER_SERVE


# ---------------------------------------------------------------- class: the actor does not trust its learner


class FakeLearner:
    """A ROUTER that answers each hello with the next of ``welcomes`` (headers), in a thread."""

    def __init__(self, welcomes: list[dict]):
        from asyncrl.run.launch import free_port

        self.ctx = sockets.context()
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.sock = sockets.router(self.ctx, self.endpoint)
        self.welcomes, self.route, self.done = list(welcomes), None, threading.Event()
        self.thread = threading.Thread(target=self.answer, daemon=True)
        self.thread.start()

    def answer(self) -> None:
        while self.welcomes and not self.done.is_set():
            frames = sockets.recv_multipart_timeout(self.sock, 100)
            if frames is None:
                continue
            self.route = frames[0]
            header, _ = codec.decode(frames[1:])
            if header["type"] == "hello":
                w = self.welcomes.pop(0)
                sockets.send(
                    self.sock,
                    [
                        self.route,
                        msgpack.packb({"proto": protocol.PROTOCOL_VERSION, "type": "welcome", **w}, use_bin_type=True),
                    ],
                )

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        sockets.close(self.sock)
        self.ctx.term()


def _welcome(cfg, **fields) -> dict:
    import json

    return {
        "run_id": "fake",
        "shm_name": "asyncrl-no-such-segment-1",
        "num_slots": 6,
        "spec": SPEC.to_dict(),
        "token": b"t" * 16,
        "config": json.dumps(cfg.to_dict()),
        "restart": 0,
        "epoch": 1,
        "actor_token": b"k" * 16,
        **fields,
    }


def _actor(cfg, endpoint: str):
    from asyncrl.roles.actor import Actor
    from asyncrl.roles.actor_session import ActorOptions

    return Actor(
        cfg, ActorOptions(learner=endpoint, broadcaster="tcp://127.0.0.1:11", actor_id="t", connect_timeout_s=30)
    )


def test_actor_survives_a_welcome_it_cannot_use(caplog):
    """A welcome whose config is not JSON, not a config, or names an absurd number of slots: counted
    ("bad_welcome"), and the actor keeps saying hello (on 75409f3 each raised out of ``hello``)."""
    from hostile_helpers import SMALL

    from asyncrl.core import config

    cfg = config.load(None, SMALL)
    fake = FakeLearner(
        [
            _welcome(cfg, config="{not json"),
            _welcome(cfg, config="[1, 2]"),
            _welcome(cfg, config='{"env": {"num_envs": "many"}}'),
            _welcome(cfg, num_slots=2**40),
            _welcome(cfg),
        ]
    )
    actor = _actor(cfg, fake.endpoint)
    try:
        actor.hello(timeout_s=30)
        assert actor.rejects.by_reason().get("bad_welcome") == 4, actor.rejects.counts
        assert actor.run_id == "fake" and actor.local_slot is not None  # no segment: over TCP
        # a grant of a slot the ring does not have is refused, not indexed
        sockets.send(
            fake.sock, [fake.route, *codec.encode({"type": "grant", "run_id": "fake", "slot": 6, "grant_id": 3})]
        )
        sockets.send(
            fake.sock, [fake.route, *codec.encode({"type": "grant", "run_id": "fake", "slot": 5, "grant_id": 4})]
        )
        deadline = time.monotonic() + 10
        while not actor.grants and time.monotonic() < deadline:
            actor.poll_learner(100)
        assert actor.grants == [(5, 4)] and actor.rejects.by_reason().get("bad_grant") == 1
    finally:
        actor.run_id = ""  # no bye to the fake
        actor.close()
        fake.close()


@pytest.mark.parametrize("shm_name", ["no/such/segment", "asyncrl-no-such-1", "x" * 300, "."])
def test_actor_falls_back_to_tcp_for_any_attach_error(shm_name, caplog):
    """A shared-memory name that gives EINVAL, ENAMETOOLONG or no segment: the actor ships its
    rollouts over TCP, with one line saying why (on 75409f3 only ShmError was caught)."""
    from hostile_helpers import SMALL

    from asyncrl.core import config

    cfg = config.load(None, SMALL)
    fake = FakeLearner([_welcome(cfg, shm_name=shm_name)])
    actor = _actor(cfg, fake.endpoint)
    try:
        with caplog.at_level("INFO", logger="asyncrl.actor"):
            actor.hello(timeout_s=30)
        assert actor.ring is None and actor.local_slot is not None
        assert "shipping rollouts over TCP" in caplog.text
    finally:
        actor.run_id = ""
        actor.close()
        fake.close()


# ---------------------------------------------------------------- class: resources per peer


def test_an_oversized_frame_is_never_buffered(tmp_path, ctx):
    """A frame larger than any legal one (a report's header, one field of a slot) is dropped by
    ZeroMQ with its connection (ZMQ_MAXMSGSIZE) before the learner buffers it; on 75409f3 the
    learner took all 64 MiB into memory, then refused it ("oversized")."""
    with live_learner(tmp_path) as learner:
        assert 0 < sockets.max_message_size(learner.router) < 1 << 20
        big = Peer(ctx, learner.endpoint, "big")
        big.send([b"\0" * (64 << 20)])
        big.pump(learner, 1.0)
        assert learner.rejects.total == 0, learner.rejects.counts
        honest = Peer(ctx, learner.endpoint, "honest")
        honest.join(learner, "honest")


def test_broadcaster_answers_snapshots_at_a_bounded_rate_and_survives_its_handlers(tmp_path, monkeypatch):
    """A peer asking for snapshots in a tight loop gets at most one reply per
    SNAPSHOT_INTERVAL_S (the rest counted "snapshot_rate"); an exception in a handler is counted,
    not fatal."""
    from asyncrl.roles import broadcaster as bmod
    from asyncrl.run.launch import free_port_pair

    b = bmod.Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
    c = sockets.context()
    peer = sockets.dealer(c, addresses.snapshot_endpoint(b.endpoint), sockets.route_identity("greedy"))
    try:
        ask = codec.encode({"type": "snapshot", "run_id": "", "actor_id": "greedy"})
        for _ in range(200):
            sockets.send(peer, ask)
        replies, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline and b.rejects.total + replies < 200:
            b.serve(20)
            while sockets.recv_multipart_timeout(peer, 0) is not None:
                replies += 1
        assert replies + b.rejects.by_reason().get("snapshot_rate", 0) == 200
        assert 1 <= replies <= 3 / bmod.SNAPSHOT_INTERVAL_S + 1
        monkeypatch.setattr(b, "answer_snapshot", lambda *a: 1 / 0)
        time.sleep(bmod.SNAPSHOT_INTERVAL_S)
        sockets.send(peer, ask)
        deadline = time.monotonic() + 5
        while "handler_error:ZeroDivisionError" not in b.rejects.by_reason() and time.monotonic() < deadline:
            b.serve(20)
        assert b.rejects.by_reason().get("handler_error:ZeroDivisionError") == 1
    finally:
        sockets.close(peer)
        c.term()
        b.close()


def test_join_records_of_ids_that_never_delivered_are_bounded(tmp_path, ctx, monkeypatch):
    """Every new actor id used to add a record (``state.actor_joins``, in every checkpoint) for
    ever. Now at most MAX_UNDELIVERED_IDS ids that never delivered a trained slot keep theirs (their
    restart count may start again: none of their samples was trained on), while an id that
    delivered keeps its monotonic count (seeding needs it)."""
    from asyncrl.roles import learner_peers

    monkeypatch.setattr(learner_peers, "MAX_UNDELIVERED_IDS", 3)
    with live_learner(tmp_path) as learner:
        good = Peer(ctx, learner.endpoint, "good")
        good.join(learner, "good")
        for _ in range(protocol.GRANT_CREDITS):
            good.say("request", "good")
        for g in [good.wait(learner, "grant") for _ in range(protocol.GRANT_CREDITS)]:
            good.send(report(good, "good", g["grant_id"]))
        deadline = time.monotonic() + 10
        while learner.ledger.num_full < 2 and time.monotonic() < deadline:
            good.pump(learner, 0.05)
        assert learner.consume()  # "good" delivered a trained slot
        for k in range(20):
            p = Peer(ctx, learner.endpoint, f"p{k}")
            p.join(learner, f"passer-{k}")
            p.say("bye", f"passer-{k}")
            p.pump(learner, 0.05)
            p.close()
        joins = learner.state.actor_joins
        assert len(joins) <= 1 + 3, sorted(joins)
        assert joins["good"] == 1  # kept, though it is the oldest record


# ---------------------------------------------------------------- epochs


def test_a_resumed_learner_has_a_newer_epoch_even_after_the_clock_went_back(tmp_path, monkeypatch):
    """The learner epoch is saved in the checkpoint, and a resumed learner takes a higher one
    whatever the wall clock says; on 75409f3 the epoch was not saved, so after a clock step back
    the resumed learner's epoch was lower and its weights were refused by the broadcaster."""
    from asyncrl.roles import learner as lmod

    with live_learner(tmp_path, run_id="epoch") as first:
        old = first.epoch
        first.finish()
        run_dir = first.run_dir
    real = time.time_ns
    monkeypatch.setattr(lmod.time, "time_ns", lambda: real() - 3600 * 10**9)  # the clock went back an hour
    from hostile_helpers import SMALL

    from asyncrl.core import config
    from asyncrl.run.launch import free_port

    second = lmod.Learner(
        config.load(None, SMALL),
        run_dir,
        run_id="epoch-again",
        bind="tcp://127.0.0.1:0",
        broadcaster=f"tcp://127.0.0.1:{free_port()}",
        echo=lambda *_: None,
        resume=True,
    )
    try:
        assert second.epoch > old
    finally:
        second.close()


def test_broadcaster_takes_a_lower_epoch_once_the_held_one_is_silent(monkeypatch):
    """A learner started after the wall clock stepped back (no checkpoint to continue) has a lower
    epoch: the broadcaster takes its weights once the held epoch's learner has been silent for
    STALE_EPOCH_S (on 75409f3: never, so actors waited for weights for ever)."""
    from asyncrl.roles import broadcaster as bmod
    from asyncrl.run.launch import free_port_pair
    from asyncrl.wire.weights_secret import read_weights_secret

    monkeypatch.setattr(bmod, "STALE_EPOCH_S", 0.5)
    b = bmod.Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
    c = sockets.context()
    learner = sockets.dealer(c, addresses.snapshot_endpoint(b.endpoint), sockets.route_identity("learner"))

    def weights(epoch, version):
        return codec.sign_weights(
            codec.encode_weights(
                run_id="r",
                epoch=epoch,
                version=version,
                publish_time=0.0,
                layout_hash="h",
                payload=np.ones(4, np.float32),
            ),
            read_weights_secret(b.endpoint),
        )

    def serve_until(pred, seconds=10):
        deadline = time.monotonic() + seconds
        while not pred() and time.monotonic() < deadline:
            b.serve(20)
        return pred()

    try:
        sockets.send(learner, weights(1000, 5))
        assert serve_until(lambda: b.newest == (1000, 5))
        sockets.send(learner, weights(10, 0))  # at once: the held epoch's learner may still be there
        serve_until(lambda: False, 0.2)
        assert b.newest == (1000, 5)
        time.sleep(0.6)
        sockets.send(learner, weights(10, 1))
        assert serve_until(lambda: b.newest == (10, 1))
    finally:
        sockets.close(learner)
        c.term()
        b.close()


def test_reject_counts_and_their_log_lines_are_bounded_whatever_the_senders(caplog):
    """A peer that makes up a new sender name per message (a new connection identity, a new source
    address at the authenticator) used to add a counter key and a log line each time: now the keys
    stop at ``max_keys`` (the rest are counted under "(others)") and the lines at the budget."""
    import logging

    counter = rejects.RejectCounter("learner", budget=rejects.LogBudget(per_window=5, window_s=3600.0), max_keys=100)
    with caplog.at_level(logging.WARNING, logger="asyncrl.wire.transport"):
        for i in range(1000):
            counter.reject(protocol.ProtocolError("malformed", "junk"), f"peer-{i}")
    assert len(counter.counts) == 101 and counter.total == 1000
    assert counter.counts[("malformed", "(others)")] == 900
    assert len([r for r in caplog.records if "rejected message" in r.getMessage()]) == 5


# ---------------------------------------------------------------- (e) end to end, as the issue measured it


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_hoarding_peer_does_not_stall_a_real_run(procs, tmp_path, ctx):
    """The finding as it was first measured, with real processes: a peer says hello, sends 100
    requests and then only heartbeats; an honest actor joins afterwards. On 75409f3 the peer held
    every slot and the run never got past its first iteration; now the run finishes."""
    from mp_helpers import SMALL as MP_SMALL
    from mp_helpers import free_port, free_port_pair, learner_cmd, new_run_id, read_jsonl, wait_for

    run_id, run_dir = new_run_id(), tmp_path / "run"
    procs.run_ids.add(run_id)
    learner_ep, broadcaster_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port_pair()}"
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    procs.start(
        "learner",
        learner_cmd(learner_ep, broadcaster_ep, *MP_SMALL, run_id=run_id, run_dir=run_dir, total="4000"),
    )
    hoarder = sockets.dealer(ctx, learner_ep, sockets.route_identity("hoarder"))
    try:
        sockets.send(
            hoarder,
            codec.encode(
                {
                    "type": "hello",
                    "run_id": "",
                    "actor_id": "hoarder",
                    "host": "elsewhere",
                    "pid": 1,
                    "env_id": CORRIDOR,
                    "spec": SPEC.to_dict(),
                    "shm_token": None,
                    "token": None,
                }
            ),
        )
        frames = sockets.recv_multipart_timeout(hoarder, 60_000)
        assert frames is not None, procs.dump()
        welcome, _ = codec.decode(frames)
        assert welcome["type"] == "welcome", welcome
        me = {"run_id": welcome["run_id"], "actor_id": "hoarder", "token": welcome["actor_token"]}
        for _ in range(100):
            sockets.send(hoarder, codec.encode({"type": "request", **me}))
        grants, deadline = 0, time.monotonic() + 5
        while time.monotonic() < deadline:  # take what it is given
            frames = sockets.recv_multipart_timeout(hoarder, 200)
            if frames is not None and codec.decode(frames)[0]["type"] == "grant":
                grants += 1
        procs.start(
            "honest",
            [
                "actor",
                "--learner",
                learner_ep,
                "--broadcaster",
                broadcaster_ep,
                "--actor-id",
                "honest",
                "--env",
                CORRIDOR,
                *MP_SMALL,
            ],
        )
        learner = procs.popen["learner"]
        last_beat = 0.0

        def finished() -> bool:
            nonlocal last_beat
            if time.monotonic() - last_beat > 0.5:  # only heartbeats from now on
                sockets.send(hoarder, codec.encode({"type": "heartbeat", **me}), block=False)
                sockets.drain_all(hoarder)
                last_beat = time.monotonic()
            return learner.poll() is not None

        wait_for(finished, 180, "the run to finish beside the hoarding peer", procs=procs)
    finally:
        sockets.close(hoarder)
    assert procs.wait("learner", 10) == 0, procs.dump()
    assert grants <= protocol.GRANT_CREDITS, grants
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["env_steps"] >= 4000, summary
    assert summary["rejected_messages"].get("over_credit", 0) >= 100 - protocol.GRANT_CREDITS, summary
    assert {r["actor"] for r in read_jsonl(run_dir / "lag.jsonl")} == {"honest"}
    procs.wait("honest", 30)
    procs.shutdown()
