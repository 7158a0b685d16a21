"""The lag target (learner.target_lag_p95): the controller on a simulated ring, the learner's grants
under it, its records, and serial mode's refusal. The multi-process run that holds a target:
tests/integration/test_lag_target_run.py."""

from __future__ import annotations

import json
import math
import random
import time
from collections import deque

import pytest
from click.testing import CliRunner
from slot_examples import example_slot
from test_remote_rollout import SMALL, _fill_granted_slot, _joined_learner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.core.lag import weighted_percentiles
from asyncrl.core.lag_target import (
    MIN_WINDOW_SLOTS,
    LagTarget,
    dead_time,
    initial_slots,
    window_iterations,
)
from asyncrl.run.serial import run_serial


def simulate(ctrl: LagTarget | None, *, num_slots: int, per_batch: int, batches: int, fill=None, late=0.0, seed=0):
    """A queue model of the ring: the learner at version v takes the B oldest full slots; while it
    trains, actors fill free slots (all of them, or ``fill`` a batch: slower actors) under the
    limit with the weights of v (of v - 1 with probability ``late``: weights that arrive after
    the grant). Returns [(effective slots, the batch's slot lags)] per batch."""
    rng, full, version, out = random.Random(seed), deque(), 0, []

    def refill():
        limit = ctrl.slots if ctrl is not None else num_slots
        n = 0
        while len(full) < limit and (fill is None or n < fill):
            full.append(max(0, version - (rng.random() < late)))
            n += 1

    refill()
    while len(out) < batches:
        peak = len(full)
        if len(full) < per_batch:
            refill()
            continue
        lags = [version - full.popleft() for _ in range(per_batch)]
        out.append((ctrl.slots if ctrl is not None else num_slots, lags))
        if ctrl is not None:
            ctrl.observe(lags, peak_in_use=peak)
        refill()
        version += 1
    return out


def p95(batches) -> float:
    lags = sorted({v for _, ls in batches for v in ls})
    counts = [sum(ls.count(v) for _, ls in batches) for v in lags]
    return weighted_percentiles(lags, counts, (95,))[0]


def test_the_derived_counts():
    assert MIN_WINDOW_SLOTS == 20  # 1 / (1 - 0.95)
    assert initial_slots(2, 24, 2) == 4 and initial_slots(0, 12, 4) == 4 and initial_slots(9, 12, 4) == 12
    assert dead_time(0, 4, 2) == 3 and dead_time(12, 11, 4) == 4
    assert window_iterations(4, 2) == 10 and window_iterations(40, 4) == 10 and window_iterations(12, 4) == 5


def test_a_saturated_ring_of_s_slots_lags_s_over_b_versions():
    """The model the controller's start and docstring rest on (no controller): fast actors fill a
    ring of S slots, and each sample waits S / B iterations."""
    for s, b in ((12, 4), (24, 2), (8, 8)):
        batches = simulate(None, num_slots=s, per_batch=b, batches=100)[s // b + 1 :]
        assert {v for _, lags in batches for v in lags} == {s // b}


@pytest.mark.parametrize(
    "target, num_slots, per_batch, late",
    [(2, 24, 2, 0.0), (2, 24, 2, 0.3), (3, 24, 4, 0.1), (1, 12, 4, 0.0), (5, 12, 2, 0.2), (4, 64, 8, 0.05)],
)
def test_holds_the_target_on_a_saturated_ring(target, num_slots, per_batch, late):
    """Fast actors (the uncontrolled lag would be S / B, above the target): once settled, the lag
    p95 is the target, and the size stays in [B, S] throughout."""
    ctrl = LagTarget(target, num_slots=num_slots, slots_per_batch=per_batch)
    batches = simulate(ctrl, num_slots=num_slots, per_batch=per_batch, batches=600, late=late, seed=target)
    assert num_slots // per_batch > target
    assert all(per_batch <= s <= num_slots for s, _ in batches)
    settled = batches[len(batches) // 2 :]
    assert p95(settled) == target, ctrl.summary()
    assert ctrl.summary()["lag_p95_controlled"] == target


def test_a_target_below_reach_holds_b_slots():
    """Lag 0 needs a synchronous system: the controller holds the ring at B, where lag is 1."""
    ctrl = LagTarget(0, num_slots=12, slots_per_batch=4)
    batches = simulate(ctrl, num_slots=12, per_batch=4, batches=200)
    assert {s for s, _ in batches} == {4} and ctrl.steps["up"] == ctrl.steps["down"] == 0
    assert p95(batches[50:]) == 1


def test_a_limit_that_does_not_bind_is_not_raised():
    """Slow actors never fill the ring: the lag is below the target whatever the size, and the
    size stays where it is (raising it would only have to be undone once the actors speed up)."""
    ctrl = LagTarget(3, num_slots=24, slots_per_batch=2)
    batches = simulate(ctrl, num_slots=24, per_batch=2, batches=300, fill=1)
    assert p95(batches[50:]) < 3 and ctrl.slots == ctrl.initial == 6 and ctrl.steps["up"] == 0


def test_follows_actors_that_speed_up():
    """Slow actors, then fast ones: the lag rises, and the controller brings it back to the target."""
    ctrl = LagTarget(2, num_slots=24, slots_per_batch=2)
    simulate(ctrl, num_slots=24, per_batch=2, batches=200, fill=1)
    after = simulate(ctrl, num_slots=24, per_batch=2, batches=400, late=0.3)
    assert p95(after[200:]) == 2


def test_a_size_that_overshoots_is_retried_ever_more_rarely():
    """Where k - 1 slots give a lag below the target and k above it, the controller tries k again
    after a wait that doubles at each failure: k's share of the iterations shrinks."""
    target, k, per_batch = 3, 9, 2
    ctrl = LagTarget(target, num_slots=24, slots_per_batch=per_batch)
    sizes = []
    for _ in range(3000):
        sizes.append(ctrl.slots)
        lag = target - 1 if ctrl.slots < k else target + 1
        ctrl.observe([lag] * per_batch, peak_in_use=ctrl.slots)
    at_k = [i for i, s in enumerate(sizes) if s == k]
    assert at_k and max(sizes) == k
    assert ctrl.steps["down"] <= math.log2(len(sizes)) + 1, ctrl.steps
    assert len(at_k) / len(sizes) < 0.05
    assert sum(1 for i in at_k if i >= 1500) < sum(1 for i in at_k if i < 1500)


def test_stays_within_the_ring_whatever_it_is_told():
    rng = random.Random(7)
    for trial in range(50):
        per_batch = rng.randint(1, 8)
        num_slots = per_batch + rng.randint(0, 30)
        ctrl = LagTarget(rng.randint(0, 10), num_slots=num_slots, slots_per_batch=per_batch)
        for _ in range(300):
            ctrl.observe([rng.randint(0, 20) for _ in range(per_batch)], peak_in_use=rng.randint(0, num_slots))
            assert per_batch <= ctrl.slots <= num_slots, (trial, ctrl.summary())


def test_refuses_what_it_cannot_hold():
    for target, s, b in ((-1, 12, 4), (2, 3, 4), (2, 4, 0)):
        with pytest.raises(ValueError, match="target_p95 >= 0"):
            LagTarget(target, num_slots=s, slots_per_batch=b)


# ---- in the learner ----


def _report_one(c, learner, ring, arrays) -> None:
    g = _fill_granted_slot(c, learner, ring, arrays)
    full = learner.ledger.num_full
    c.send(
        "ready", slot=g["slot"], grant_id=g["grant_id"], env_steps=32, episode_returns=[], episode_lengths=[], timing={}
    )
    deadline = time.monotonic() + 10
    while learner.ledger.num_full == full and time.monotonic() < deadline:
        learner.serve(20)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", [-1, 0])
def test_grants_keep_to_the_effective_ring_size(tmp_path, target):
    """Target 0: the ring's effective size is B = 2 of its 6 slots; an actor that reported two
    slots gets no new grant until the learner takes them. Off (-1): it gets them at once, and
    neither metrics.jsonl nor summary.json says anything of a lag target."""
    cfg = config.load(None, [*SMALL, f"learner.target_lag_p95={target}"])
    with _joined_learner(cfg, tmp_path, f"utest-target{target + 1}") as (learner, c, ring):
        arrays = example_slot(seed=3)
        for _ in range(2):
            _report_one(c, learner, ring, arrays)
        for _ in range(5):
            learner.serve(20)
        assert learner.ledger.num_full == 2
        assert learner.ledger.num_granted == (0 if target == 0 else 2)
        assert learner.consume() and learner.state.iteration == 1
        learner.serve(20)
        assert learner.ledger.num_granted == 2
        record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
        summary = learner.finish()
    if target == 0:
        assert record["effective_slots"] == 2
        block = summary["lag_target"]
        assert block["target_p95"] == 0 and block["effective_slots"]["initial"] == 2
        assert block["actors_wait_s"] == 0.0 and block["env_steps_per_s"] > 0
    else:
        assert learner.lag_target is None and "effective_slots" not in record and "lag_target" not in summary


def test_serial_mode_refuses_a_lag_target(tmp_path):
    cfg = config.load(None, ["env.id=asyncrl/Corridor-v0", "learner.target_lag_p95=2"])
    with pytest.raises(config.ConfigError, match="learner.target_lag_p95 = 2: serial mode has no slot ring"):
        run_serial(cfg, tmp_path / "serial")
    r = CliRunner().invoke(
        main,
        [
            "run",
            "--serial",
            "--env",
            "asyncrl/Corridor-v0",
            "--run-dir",
            str(tmp_path / "cli"),
            "--set",
            "learner.target_lag_p95=2",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "learner.target_lag_p95 = 2: serial mode has no slot ring" in r.output
    assert not (tmp_path / "cli").exists()


def test_a_target_below_minus_one_is_refused():
    with pytest.raises(config.ConfigError, match="learner.target_lag_p95 must be >= -1, got -2"):
        config.load(None, ["learner.target_lag_p95=-2"])
