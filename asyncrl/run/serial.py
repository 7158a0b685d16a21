"""Serial mode: actors and learner in one process with the same modules and an in-process
transport (plain arrays instead of shared-memory slots), for every task kind (asyncrl.tasks). The
way to debug, and bit-reproducible
for a given seed. Actors act with the newest weights (policy lag 0) unless the lag controls of
[actor] say otherwise (asyncrl.core.lag_control), exactly as actor processes would, or a run's lag
is replayed (``actor.lag_trace``: asyncrl.core.lag_trace)."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import numpy as np
import torch

from asyncrl.core.config import Config, validate_serial
from asyncrl.core.consume import Consumer, SlotData
from asyncrl.core.lag_control import WeightHistory
from asyncrl.core.lag_parts import SlotTiming
from asyncrl.core.lag_trace import LagReplay, read_lag_trace
from asyncrl.core.seeding import actor_seeds
from asyncrl.core.slot_checks import SlotError, check_slot
from asyncrl.tasks import make_task

_log = logging.getLogger("asyncrl.run.serial")


def run_serial(
    cfg: Config, run_dir: str | Path, *, max_iterations: int | None = None, echo=print, resume: bool = False
) -> dict:
    """Train until ``cfg.run.total_env_steps`` (or ``max_iterations``); returns the summary.

    ``resume``: go on from the run directory's newest checkpoint (Consumer). Checkpoints are
    taken between iterations and hold the envs, the action and lag-control generators and the
    weight histories, so a run stopped at any moment (even by SIGKILL) and resumed ends
    bit-identical to one that was not stopped, for envs whose state can be saved
    (:func:`asyncrl.tasks.control.envs.env_state`: MuJoCo and the toy envs); other envs start fresh episodes
    (from streams of restart number ``resumes``) and the run goes on from there.

    Raises ConfigError for what serial mode cannot honour (asyncrl.core.config.validate_serial), and
    LagTraceError (``actor.lag_trace`` names no readable trace), before anything is written."""
    validate_serial(cfg)
    torch.set_num_threads(cfg.learner.torch_threads)
    replay = None
    if cfg.actor.lag_trace:  # the i-th rollout acts with the weights lags[i] versions behind the newest
        replay = LagReplay(read_lag_trace(cfg.actor.lag_trace), source=cfg.actor.lag_trace, log=_log)
    # actor env group i draws from the streams of actor id "actor{i}", as `asyncrl run`'s actor i does
    names = [f"actor{i}" for i in range(cfg.run.num_actors)]
    task = make_task(cfg)
    producers = [task.producer() for _ in names]  # control: each makes its envs
    consumer = Consumer(
        cfg, producers[0].spec, run_dir, resume=resume, task=task, lag_ramp=replay.depth - 1 if replay else 0
    )
    state = consumer.state
    saved = consumer.resumed_extra
    restored = saved is not None and all(p.load_source_state(e) for p, e in zip(producers, saved["envs"]))
    # a resume without saved envs draws fresh streams, as a restarted actor does
    restart = 0 if restored or state.iteration == 0 and state.env_steps == 0 else state.resumes
    seeds = [actor_seeds(cfg.run.seed, name, restart, cfg.env.num_envs) for name in names]
    for p, s in zip(producers, seeds):  # the learner's policy is the template: nothing more drawn from torch's RNG
        p.bind(cfg, s, template=state.policy)
    # each actor env group keeps the versions it was sent, as an actor process does (lag controls)
    histories = [
        WeightHistory(
            policy_delay=cfg.actor.policy_delay,
            policy_age_buffer=cfg.actor.policy_age_buffer,
            seed=s.lag,
            replay_depth=replay.depth if replay else 0,
        )
        for s in seeds
    ]
    for h in histories:
        h.add(state.version, state.flat_weights())
    host, next_actor = socket.gethostname(), 0
    weights = state.task.weights_info(state.policy).to_dict()  # what one version carries (summary.json)
    if restored:
        for p, h, rng, hist in zip(producers, histories, saved["policy_rng"], saved["histories"]):
            p.load_rng_state(rng)
            h.load_state_dict(hist)
        next_actor = int(saved["next_actor"])
        if replay is not None:
            replay.position = int(saved.get("replay_position", 0))
    else:
        if resume and state.iteration:
            _log.warning("serial: the envs of %s cannot be saved; the resumed run starts fresh episodes", task.id)
        for p in producers:
            p.reset()

    def own_state() -> dict:  # what a checkpoint between iterations needs to go on bit-identically
        own = [p.state_dict() for p in producers]
        return {
            "envs": [o["source"] for o in own],
            "policy_rng": [o["rng"] for o in own],
            "histories": [h.state_dict() for h in histories],
            "next_actor": next_actor,
            "replay_position": replay.position if replay else 0,
        }

    try:
        while not consumer.done and (max_iterations is None or state.iteration < max_iterations):
            slots = []
            while len(slots) < cfg.learner.slots_per_batch and not consumer.done:
                history = histories[next_actor]
                version, flat = history.lagging(replay.next_lag()) if replay else history.choose()
                producers[next_actor].load(flat)
                arrays = consumer.state.spec.allocate()
                t_first = time.time()
                stats = producers[next_actor].collect(arrays, version=version)
                t_report = time.time()
                timing = SlotTiming(t_report, t_report - t_first, 0.0)  # no grant to wait for
                name, next_actor = names[next_actor], (next_actor + 1) % len(producers)
                try:  # the checks the learner applies to an actor's slot, and the same counting
                    check_slot(arrays, consumer.state.spec, version=state.version)
                except SlotError as exc:
                    consumer.reject_slot(name, exc.reason, env_steps=stats.env_steps)
                    n = sum(consumer.rejected_slots.values())
                    if n & (n - 1) == 0:  # 1st, 2nd, 4th, ...: a broken env cannot flood the log
                        _log.warning("serial: slot of %s not trained on: %s (%d so far)", name, exc, n)
                    continue
                returns = [r for r in stats.episode_returns if np.isfinite(r)]
                slots.append(SlotData(name, host, arrays, stats.env_steps, returns, timing))
            if len(slots) < cfg.learner.slots_per_batch:  # the budget went on rejected slots
                break
            if consumer.consume(slots) is not None:
                flat = state.flat_weights()  # what the broadcaster sends between processes
                for h in histories:
                    h.add(state.version, flat)
            consumer.end_iteration(own_state())
            consumer.progress(echo)
    except KeyboardInterrupt:
        consumer.finish(outcome="interrupted", mode="serial", weights=weights)  # Ctrl-C keeps what was learned
        raise
    except Exception as exc:
        _record_failure(consumer, exc)
        raise
    else:
        return consumer.finish(mode="serial", weights=weights)
    finally:
        consumer.close()
        for p in producers:
            p.close()


def _record_failure(consumer: Consumer, exc: Exception) -> None:
    """summary.json of a serial run that failed: outcome "failed", the learner's reason. A failure
    to write it (e.g. the cause was the run directory) must not hide the original error."""
    try:
        consumer.finish(outcome="failed", failed_role="learner", reason=f"{type(exc).__name__}: {exc}", mode="serial")
    except Exception as inner:  # noqa: BLE001 - reported, and the original error is re-raised
        logging.getLogger("asyncrl.run.serial").error(
            "serial: could not write the summary of the failed run: %s", inner
        )
