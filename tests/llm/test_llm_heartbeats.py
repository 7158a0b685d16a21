"""Generators keep answering heartbeats while they generate: the generation runs in a worker thread
while the actor's own thread heartbeats (the same tokens, bit for bit), an error or a give-up on
either side ends both, and a straggler's sleep heartbeats too. The multi-process case (a generation
longer than transport.actor_timeout_s, through the real learner) is
tests/integration/test_generator_heartbeats.py."""

import threading
import time

import pytest

pytest.importorskip("transformers")
import numpy as np  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.core import config  # noqa: E402
from asyncrl.core.background import Cancelled, run_with_heartbeats  # noqa: E402
from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402


def test_the_generation_runs_in_a_worker_while_this_thread_heartbeats():
    """The work finishes only once three heartbeats came meanwhile: a load-independent proof that
    heartbeats go on during a generation, from the calling thread (the one that owns the sockets)."""
    caller, beats, three = threading.current_thread(), [], threading.Event()

    def heartbeat():
        beats.append(threading.current_thread() is caller)
        if len(beats) >= 3:
            three.set()

    def work(on_step):
        assert three.wait(60), "no heartbeats while the generation ran"
        on_step()  # not cancelled: a no-op
        return threading.current_thread().name

    assert run_with_heartbeats(work, heartbeat, poll_s=0.01, name="gen") == "gen"
    assert len(beats) >= 3 and all(beats)


def test_an_error_of_the_generation_reaches_the_actor():
    def work(on_step):
        raise ValueError("a prompt of 200 tokens is longer than llm.max_prompt_tokens")

    with pytest.raises(ValueError, match="max_prompt_tokens"):
        run_with_heartbeats(work, lambda: None, poll_s=0.01)


def test_a_heartbeat_that_raises_ends_the_generation_at_its_next_step():
    started, ended, steps = threading.Event(), threading.Event(), []

    def work(on_step):
        started.set()
        try:
            while True:
                on_step()
                steps.append(1)
                time.sleep(0.005)
        finally:
            ended.set()

    def heartbeat():
        if started.is_set():
            raise RuntimeError("the learner refused the connection")

    with pytest.raises(RuntimeError, match="refused"):
        run_with_heartbeats(work, heartbeat, poll_s=0.01)
    assert ended.wait(30)  # the worker raised Cancelled at a step and is gone
    assert issubclass(Cancelled, RuntimeError)


def _cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.max_new_tokens=10",
        *extra,
    )


@pytest.mark.parametrize("sets", [(), ("llm.top_k=40", "llm.top_p=0.9", "llm.temperature=0.7")])
def test_a_slot_generated_in_the_worker_is_bit_identical(micro_dir, sets):
    """collect with a heartbeat (worker thread) and without one (serial mode: this thread) write the
    same slot from the same seeds; the heartbeat came during it, and tick once before it."""
    cfg = _cfg(micro_dir, *sets)
    task = make_task(cfg)
    slots, beats, ticks = [], [], []
    for heartbeat in (None, lambda: beats.append(1)):
        prod = task.producer()
        prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
        prod.reset()
        slot = task.spec.allocate()
        prod.collect(slot, version=2, grant_id=5, tick=lambda: ticks.append(1), heartbeat=heartbeat)
        slots.append(slot)
    for k in slots[0]:
        assert np.array_equal(slots[0][k], slots[1][k]), k
    assert len(beats) >= 1 and len(ticks) == 2  # one tick per slot (the straggler sleeps once a slot)


def test_a_straggler_sleep_heartbeats_in_pieces(monkeypatch):
    """actor.slowdown_s: an llm slot is one step, so its whole delay is one sleep; the actor sleeps it
    in pieces of at most transport.heartbeat_s and heartbeats after each, so a delay longer than
    transport.actor_timeout_s does not make it look dead."""
    from asyncrl.roles.actor import Actor
    from asyncrl.roles.actor_session import ActorOptions

    cfg = config.load(
        None,
        [
            "env.id=asyncrl/Corridor-v0",
            "env.num_envs=1",
            "env.rollout_length=1",
            "algo.num_minibatches=1",
            "actor.slowdown_s=0.3",
            "transport.heartbeat_s=0.1",
        ],
    )
    actor = Actor(cfg, ActorOptions(learner="tcp://127.0.0.1:9", broadcaster="tcp://127.0.0.1:11", actor_id="t"))
    try:
        beats, slept = [], []
        monkeypatch.setattr(actor, "heartbeat", lambda: beats.append(1))
        monkeypatch.setattr(time, "sleep", slept.append)
        actor.tick()
        assert len(slept) == 3 and sum(slept) == pytest.approx(0.3) and max(slept) <= 0.1 + 1e-9
        assert len(beats) == 4  # after every piece, and once more as every tick does
    finally:
        actor.close()
