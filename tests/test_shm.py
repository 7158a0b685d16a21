"""Shared-memory slot ring (across a spawned process) and the learner's slot ledger."""

import gc
import multiprocessing as mp
import os
import random
import subprocess
import sys
import uuid
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import pytest

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire.shm.dev_shm import _creator_pid, cleanup_stale, remove_run, run_segment_pattern
from asyncrl.wire.shm.layout import HEADER_NBYTES, ShmError
from asyncrl.wire.shm.ledger import Grant, SlotLedger
from asyncrl.wire.shm.ring import SlotRing

pytestmark = pytest.mark.timeout(30)

SPEC = RolloutSpec(obs_dim=3, action_dim=2, discrete=False, rollout_length=4, num_envs=2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _segments(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


@pytest.fixture
def run_id():
    """A unique run id; fails the test if it leaves a segment behind (and removes it anyway)."""
    rid = f"test-{uuid.uuid4().hex[:12]}"
    yield rid
    gc.collect()
    left = _segments(f"asyncrl-{rid}-")
    remove_run(rid)
    assert not left, f"test left shared memory behind: {left}"


def _fill(views: dict, seed: int) -> None:
    """Deterministic content for every field of one slot."""
    rng = np.random.default_rng(seed)
    for _name, a in views.items():
        a[...] = rng.integers(0, 2, a.shape) if a.dtype == np.bool_ else rng.normal(size=a.shape)


def _expected(seed: int) -> dict:
    out = SPEC.allocate()
    _fill(out, seed)
    return out


def _child_write(name: str, spec_dict: dict, num_slots: int, token: bytes, slot: int) -> None:
    """Runs in a spawned process: attach, write one slot, exit without unlinking."""
    ring = SlotRing.attach(name=name, spec=RolloutSpec(**spec_dict), num_slots=num_slots, token=token)
    _fill(ring.views(slot), seed=slot)
    ring.close()


def _spawn(target, *args, timeout=20.0) -> int:
    proc = mp.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        pytest.fail("spawned process hung")
    return proc.exitcode


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


def _raw_segment(name: str) -> None:
    """A bare segment of a given name, left for the test to remove (not tracked)."""
    shm = SharedMemory(name=name, create=True, size=HEADER_NBYTES)
    resource_tracker.unregister(shm._name, "shared_memory")
    shm.close()


# ---------------------------------------------------------------------------- SlotRing


def test_round_trip_across_spawned_process_and_segment_survives_its_exit(run_id):
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=3) as ring:
        assert ring.name == f"asyncrl-{run_id}-{os.getpid()}"
        code = _spawn(_child_write, ring.name, SPEC.to_dict(), 3, ring.token, 1)
        assert code == 0
        got = ring.views(1)
        for name, want in _expected(1).items():
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        assert not ring.views(0)["obs"].any() and not ring.views(2)["rewards"].any()
        # the child attached and exited: the segment must still be there
        assert ring.name in os.listdir("/dev/shm")
        del got
    assert not _segments(f"asyncrl-{run_id}-")  # creator's context exit unlinks


def test_attach_in_independent_process_does_not_unlink_at_exit(run_id):
    """The Python 3.11 resource-tracker trap: a process with its OWN tracker (started by its
    own command, like a real actor) that merely attached must not unlink the learner's ring."""
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=2) as ring:
        ring.views(0)["rewards"][:] = 7.0
        code = (
            f"from asyncrl.wire.shm.ring import SlotRing; from asyncrl.core.spec import RolloutSpec\n"
            f"r = SlotRing.attach(name={ring.name!r}, spec=RolloutSpec(**{SPEC.to_dict()!r}),"
            f" num_slots=2, token={ring.token!r})\n"
            f"assert (r.views(0)['rewards'] == 7.0).all(); r.views(1)['rewards'][:] = 3.0\n"
            f"r.close()\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=20, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "leaked" not in proc.stderr, proc.stderr
        assert ring.name in os.listdir("/dev/shm")
        assert (ring.views(1)["rewards"] == 3.0).all()


def test_attach_mismatches_raise(run_id):
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=2) as ring:
        with pytest.raises(ShmError, match="token"):
            SlotRing.attach(name=ring.name, spec=SPEC, num_slots=2, token=b"x" * 16)
        other = RolloutSpec(obs_dim=4, action_dim=2, discrete=False, rollout_length=4, num_envs=2)
        with pytest.raises(ShmError, match="layout"):
            SlotRing.attach(name=ring.name, spec=other, num_slots=2)
        with pytest.raises(ShmError, match="slots"):
            SlotRing.attach(name=ring.name, spec=SPEC, num_slots=3)
        with SlotRing.attach(name=ring.name, spec=SPEC, num_slots=2, token=ring.token) as peer:
            assert peer.token == ring.token and not peer.owner
            with pytest.raises(ShmError, match="creating"):
                peer.unlink()
    with pytest.raises(ShmError, match="no shared-memory segment"):
        SlotRing.attach(name=f"asyncrl-{run_id}-1", spec=SPEC, num_slots=2)


def test_not_a_ring_raises_and_a_taken_name_gets_another(run_id):
    name = f"asyncrl-{run_id}-{_dead_pid()}"
    _raw_segment(name)
    try:
        with pytest.raises(ShmError, match="magic"):
            SlotRing.attach(name=name, spec=SPEC, num_slots=1)
    finally:
        os.unlink(f"/dev/shm/{name}")
    # a name that is taken (here a second ring of the run in this process; a stale segment or a
    # file anyone put in /dev/shm alike) is never opened: the second ring gets a name of its own,
    # one that run_segment_pattern (asyncrl clean --run-id, the tests' leak checks) still finds
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1) as first:
        with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1) as second:
            assert second.name != first.name
            assert run_segment_pattern(run_id).fullmatch(second.name), second.name
            assert _creator_pid(second.name, "asyncrl-") == os.getpid()
    assert not _segments(f"asyncrl-{run_id}")
    with pytest.raises(ValueError):
        SlotRing.create(run_id="a/b", spec=SPEC, num_slots=1)


def test_views_index_and_layout(run_id):
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=2) as ring:
        for bad in (-1, 2):
            with pytest.raises(IndexError):
                ring.views(bad)
        v0, v1 = ring.views(0), ring.views(1)
        assert set(v0) == set(SPEC.field_names)
        for f in SPEC.fields:
            assert v0[f.name].shape == f.shape and v0[f.name].dtype == f.dtype
        _fill(v1, seed=5)
        assert not any(a.any() for a in v0.values())  # slots do not overlap
        del v0, v1
        ring.close()
        with pytest.raises(ShmError, match="closed"):
            ring.views(0)


def test_close_with_live_views_is_safe(run_id):
    ring = SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1)
    obs = ring.views(0)["obs"]
    ring.close()  # must neither raise BufferError nor unmap under `obs`
    ring.close()
    obs[...] = 2.0
    assert obs.sum() == 2.0 * obs.size
    ring.unlink()
    del obs
    # a ring garbage-collected while its view lives: the view stays valid
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1) as owner:
        rewards = SlotRing.attach(name=owner.name, spec=SPEC, num_slots=1).views(0)["rewards"]
        gc.collect()
        rewards[...] = 1.0
        assert (owner.views(0)["rewards"] == 1.0).all()
        del rewards


def test_cleanup_stale_removes_dead_creator_keeps_live(run_id):
    dead = f"asyncrl-{run_id}-{_dead_pid()}"
    _raw_segment(dead)
    _raw_segment(f"asyncrl-{run_id}-notapid")
    try:
        with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1) as live:
            assert cleanup_stale(prefix=f"asyncrl-{run_id}-", dry_run=True) == [dead]  # listed, kept
            assert dead in _segments(f"asyncrl-{run_id}-")
            assert cleanup_stale(prefix=f"asyncrl-{run_id}-") == [dead]
            assert _segments(f"asyncrl-{run_id}-") == sorted([live.name, f"asyncrl-{run_id}-notapid"])
    finally:
        os.unlink(f"/dev/shm/asyncrl-{run_id}-notapid")


def test_remove_run_removes_only_that_run(run_id):
    neighbour = f"asyncrl-{run_id}-x-{_dead_pid()}"  # run "<run_id>-x", not this run
    mine = f"asyncrl-{run_id}-{_dead_pid()}"
    _raw_segment(neighbour)
    _raw_segment(mine)
    try:
        with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=1) as live:
            assert remove_run(run_id, dry_run=True) == sorted([mine, live.name])
            assert mine in _segments(f"asyncrl-{run_id}-")
            assert remove_run(run_id) == sorted([mine, live.name])
            # the owner still unlinks cleanly after `asyncrl clean` removed its name
        assert _segments(f"asyncrl-{run_id}-") == [neighbour]
    finally:
        os.unlink(f"/dev/shm/{neighbour}")


# ---------------------------------------------------------------------------- SlotLedger


def test_ledger_grants_exhaust_then_backpressure():
    ledger = SlotLedger(3)
    grants = [ledger.grant("a") for _ in range(3)]
    assert sorted(g.slot for g in grants) == [0, 1, 2]
    assert len({g.grant_id for g in grants}) == 3
    assert ledger.grant("b") is None and ledger.counters["backpressure"] == 1
    assert ledger.granted_to("a") == grants


def test_ledger_refuses_duplicate_stale_foreign_completions():
    ledger = SlotLedger(2)
    g = ledger.grant("a")
    assert not ledger.complete("b", g.slot, g.grant_id)  # foreign actor
    assert not ledger.complete("a", g.slot, g.grant_id + 100)  # wrong grant
    assert not ledger.complete("a", 1, g.grant_id)  # slot never granted
    assert not ledger.complete("a", 99, g.grant_id)  # no such slot
    assert ledger.complete("a", g.slot, g.grant_id)
    assert not ledger.complete("a", g.slot, g.grant_id)  # duplicate
    assert ledger.full() == (g.slot,) and ledger.counters["refused"] == 5
    assert ledger.pop_full(1) == [g.slot]
    assert not ledger.complete("a", g.slot, g.grant_id)  # while being consumed
    ledger.release(g.slot)
    assert not ledger.complete("a", g.slot, g.grant_id)  # after release: stale
    assert ledger.num_full == 0 and ledger.num_free == 2


def test_ledger_reclaim_voids_grants_even_after_regrant():
    ledger = SlotLedger(2)
    g0, g1 = ledger.grant("a"), ledger.grant("a")
    assert ledger.complete("a", g1.slot, g1.grant_id)  # completed before dying: stays full
    assert ledger.reclaim("a") == [g0.slot]
    again = ledger.grant("a")  # same actor id restarted, gets the same slot
    assert again.slot == g0.slot and again.grant_id != g0.grant_id
    assert not ledger.complete("a", g0.slot, g0.grant_id)
    assert ledger.complete("a", again.slot, again.grant_id)
    assert ledger.full() == (g1.slot, g0.slot)  # completion order


def test_ledger_pop_and_release_rules():
    ledger = SlotLedger(2)
    g = ledger.grant("a")
    with pytest.raises(ValueError):
        ledger.pop_full(1)  # nothing full
    with pytest.raises(ValueError):
        ledger.release(g.slot)  # granted, not consumed
    ledger.complete("a", *g)
    with pytest.raises(ValueError):
        ledger.release(g.slot)  # full, not consumed
    [slot] = ledger.pop_full(1)
    ledger.release(slot)
    with pytest.raises(ValueError):
        ledger.release(slot)  # twice


def test_ledger_random_operations_never_consume_twice():
    rng, ledger, n = random.Random(0), SlotLedger(4), 4
    outstanding: list[tuple[str, Grant]] = []  # every grant ever made, valid or not
    consumed_grants = set()
    holding: list[int] = []
    for _ in range(3000):
        op = rng.random()
        actor = rng.choice("abc")
        if op < 0.3:
            if (g := ledger.grant(actor)) is not None:
                outstanding.append((actor, g))
        elif op < 0.6 and outstanding:
            a, g = rng.choice(outstanding)
            a = a if rng.random() < 0.8 else rng.choice("abc")
            if ledger.complete(a, *g):
                assert (a, g) not in consumed_grants
                consumed_grants.add((a, g))
        elif op < 0.75 and ledger.num_full:
            slots = ledger.pop_full(rng.randint(1, ledger.num_full))
            assert not set(slots) & set(holding)
            holding += slots
        elif op < 0.9 and holding:
            ledger.release(holding.pop(rng.randrange(len(holding))))
        else:
            ledger.reclaim(actor)
        assert ledger.num_free + ledger.num_granted + ledger.num_full + ledger.num_consuming == n
        assert len(set(ledger.full())) == ledger.num_full
    assert ledger.counters["completed"] == len(consumed_grants)


# ---------------------------------------------------------------------------------- slot integrity


def test_revoked_writer_stops_and_its_late_row_is_caught(run_id):
    """The interleavings of slot integrity, played by hand: writer A (grant 5) is revoked while it
    is frozen; B (grant 9) writes the slot; A's row written late marks it, and the learner's check
    after its copy refuses it. A clean rollout passes."""
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=2) as ring:
        ring.arm(0, 5)
        a = ring.guard(0, 5)
        assert a.may_write() and a.wrote() and ring.intact(0, 5)  # A writes row 0: all fine
        assert a.may_write()  # A passes the check for row 1, freezes
        ring.disarm(0)  # the learner reclaims grant 5 ...
        assert ring.generation(0) == 0
        ring.arm(0, 9)  # ... and grants the slot to B
        b = ring.guard(0, 9)
        assert b.may_write() and b.wrote()  # B writes its whole rollout
        assert ring.intact(0, 9)
        ring.views(0)["rewards"][1] = -1.0  # A wakes up: its row 1 lands in B's slot
        assert not a.wrote() and a.revoked  # A notices, marks the slot, stops
        assert not a.may_write()
        assert not ring.intact(0, 9)  # the learner drops B's (mixed) copy
        assert b.wrote() is True  # B itself is unaffected
        ring.arm(0, 10)  # the next grant starts clean
        assert ring.intact(0, 10) and not ring.intact(0, 9)
        # a writer that notices before writing leaves no mark
        ring.arm(1, 11)
        c = ring.guard(1, 11)
        ring.disarm(1)
        assert not c.may_write()
        ring.arm(1, 12)
        assert ring.intact(1, 12)
        with pytest.raises(ValueError):
            ring.arm(1, 0)


def test_collect_stops_when_its_grant_is_revoked(run_id):
    """collect() with a guard stops writing the moment the grant is revoked, and says so."""
    from asyncrl.tasks.control.envs import VecEnv
    from asyncrl.tasks.control.rollout import collect

    env = VecEnv("asyncrl/Corridor-v0", 2, seed=0)
    spec = env.spec(8)
    env.reset()
    with SlotRing.create(run_id=run_id, spec=spec, num_slots=1) as ring:
        ring.arm(0, 3)
        views = ring.views(0)
        calls = {"n": 0}

        def act(obs):
            calls["n"] += 1
            if calls["n"] == 4:  # revoked while it chooses the 4th action
                ring.disarm(0)
            return np.ones((2, 1), np.float32), np.zeros(2, np.float32)

        stats = collect(env, act, views, version=1, guard=ring.guard(0, 3))
        # the row in flight (t = 3) is finished, then the check after it stops the rollout
        assert stats.revoked and stats.env_steps == 4 * 2
        assert (views["behavior_version"][:4] == 1).all() and (views["behavior_version"][4:] == 0).all()
        assert (views["grant_id"][:4] == 3).all() and (views["grant_id"][4:] == 0).all()  # the row audit's tags
        ring.arm(0, 4)
        stats = collect(env, act, views, version=2, guard=ring.guard(0, 4))
        assert not stats.revoked and stats.env_steps == 16 and ring.intact(0, 4)
        assert (views["grant_id"] == 4).all()
        del views
    env.close()
