"""The config sections of the roles and the run: ``[actor]`` (device, threads, the lag controls of the
studies), ``[learner]`` (device, slots, batches, checkpoints), ``[transport]`` (addresses, timeouts,
rollout transport) and ``[run]`` (steps, seed, outputs, evaluation, launcher, restarts); each field with
its default and metadata (:mod:`.field_meta`)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.config.field_meta import CONTROL, LLM, _f, corrects_backward_lag


@dataclass(frozen=True)
class ActorConfig:
    # Lag controls of the studies' lag conditions (asyncrl.core.lag_control); 0 / 1 / 0.0: none.
    policy_delay: int = _f(
        0, "act with the weights K versions behind the newest received; 0: the newest", study_only=True
    )
    policy_age_buffer: int = _f(
        1, "each rollout acts with a version drawn uniformly from the last K received; 1: the newest", study_only=True
    )
    slowdown_s: float = _f(
        0.0, "a straggler: each rollout takes this many seconds longer (actor processes)", study_only=True
    )
    lag_trace: str = _f(
        "",
        "serial mode: replay the lag of a run, rollout by rollout (its run directory or lag_trace.jsonl; "
        "asyncrl/core/lag_trace.py); '': none",
        study_only=True,
    )
    rollout_transport: str = _f("auto", "auto (shared memory if the learner's segment attaches, else TCP), shm or tcp")
    device: str = _f(
        "cpu",
        "llm generator actors: where the model samples, cpu, cuda or cuda:N (float32; control "
        "actors act with numpy: cpu only)",
        kinds=LLM,
    )


@dataclass(frozen=True)
class LearnerConfig:
    slots_per_batch: int = _f(4, "B: slots of E rollouts per batch ([T, B*E])")
    num_slots: int = _f(12, "S: slots in the shared-memory ring")
    max_policy_lag: int = _f(-1, "drop samples more versions behind than this; -1: keep all")
    target_lag_p95: int = _f(
        -1,
        "a lag target: hold the consumed samples' lag p95 near this many versions by limiting the "
        "ring slots in use (B to num_slots; about 1 is the lowest reachable), at a cost in env steps "
        "a second; -1: off (asyncrl run's processes, not --serial)",
    )
    reward_scaling: bool = _f(
        True, "divide rewards by the running std of the discounted return, per env stream", kinds=CONTROL
    )
    reward_clip: float = _f(10.0, "clip scaled rewards to +-this", kinds=CONTROL)
    checkpoint_every: int = _f(50, "learner iterations between checkpoints; 0: only at the end")
    keep_checkpoints: int = _f(
        3, "checkpoints kept (checkpoint.pt, checkpoint.1.pt, ...); a corrupt newest one falls back to the next"
    )
    max_consecutive_skips: int = _f(
        20, "optimizer steps skipped in a row (non-finite loss or gradient) before the run fails"
    )
    torch_threads: int = _f(1, "torch threads of the learner")
    compile: bool = _f(
        True,
        "take each control optimizer step as one torch.compile graph (forward, loss, gradient, clip, Adam; the "
        "same arithmetic to float rounding; 0.47x the learner's CPU per iteration); the learner compiles in a "
        "thread while it serves, before its first iteration; on by default since its learning studies "
        "(docs/decisions/learner-compile.md); a compiler failure falls back to the eager step with one warning",
        kinds=CONTROL,
    )
    num_learners: int = _f(
        1,
        "learner processes that train one policy (data-parallel: each an equal share of every batch, "
        "gradients and minibatch statistics reduced over the group; docs/learner-group.md); asyncrl run's "
        "processes, not --serial",
        kinds=CONTROL,
    )
    group_timeout_s: float = _f(
        60.0,
        "seconds a learner-group member waits for the others before the group fails (a dead or frozen "
        "member: asyncrl run restarts the group from its checkpoint)",
        kinds=CONTROL,
        when=("learner.num_learners > 1", lambda c: c.learner.num_learners > 1),
    )
    device: str = _f("cpu", "where the learner's policy, optimizer and batches live: cpu, cuda or cuda:N")
    precision: str = _f(
        "fp32",
        "learner forward passes: fp32, or bf16 (autocast of the network forwards; "
        "log-probs, losses, gradients and weights stay float32; see asyncrl/core/device.py)",
    )
    weights_dtype: str = _f(
        "auto",
        "element type of the weights each version sends to the generators: float32, bfloat16, float16, or "
        "auto (bfloat16 when learner.precision = bf16, else float32); the learner keeps float32 weights, "
        "generators load them into their model's dtype (docs/decisions/llm-weights.md)",
        kinds=LLM,
    )


@dataclass(frozen=True)
class TransportConfig:
    learner_bind: str = _f("tcp://127.0.0.1:5555", "learner ROUTER address: hello, grants, reports, heartbeats")
    broadcaster_bind: str = _f(
        "tcp://127.0.0.1:5556", "broadcaster PUB address; its snapshot ROUTER takes the next port"
    )
    heartbeat_s: float = _f(1.0, "seconds between actor heartbeats")
    actor_timeout_s: float = _f(10.0, "seconds of silence after which learner and actor give each other up")
    rejoin_timeout_s: float = _f(
        60.0,
        "seconds an actor whose learner ended its session (restarted, or dropped it) "
        "keeps saying hello before it gives up",
    )
    grant_lease_s: float = _f(
        0.0,
        "seconds a granted slot may go unreported before the learner takes it back (the "
        "slot generation stops its writer); 0: derived, 6 x actor_timeout_s or 4 x the "
        "slowest report interval seen, whichever is longer",
    )


@dataclass(frozen=True)
class RunConfig:
    seed: int = _f(1, "run seed (nets, actors' envs and actions)")
    total_env_steps: int = _f(1_000_000, "env-step budget (consumed by the learner)")
    num_actors: int = _f(2, "actor processes (serial mode: actor env groups)")
    straggler_slowdown_s: float = _f(
        0.0, "asyncrl run: actor0 alone is slowed by this many seconds per rollout", study_only=True
    )
    lag_warning_p95: int = _f(
        1,
        "warn once (log, summary.json warnings) when a preset that does not correct backward lag "
        "trains on samples whose lag p95 reaches this many versions; -1: never",
        when=(
            "the run does not correct backward lag (ppo, ...; llm.realign = none)",
            lambda c: not corrects_backward_lag(c),
        ),
    )
    run_dir: str = _f("runs", "parent directory of the default run directory")
    log_every_s: float = _f(5.0, "seconds between progress lines and lag-histogram windows (0: every iteration)")
    eval_every: int = _f(
        0, "env steps between evaluations (mean action, separate env and seed) in metrics.jsonl; 0: none", kinds=CONTROL
    )
    eval_episodes: int = _f(5, "episodes per periodic evaluation", kinds=CONTROL)
    max_restarts: int = _f(
        3,
        "asyncrl run: restarts of each role (actor, broadcaster, learner) within "
        "run.restart_window_s before the next death fails the run",
    )
    restart_backoff_s: float = _f(
        1.0, "asyncrl run: seconds before a role's first restart, doubled for each next one within run.restart_window_s"
    )
    launcher: str = _f(
        "local",
        "asyncrl run: who starts and restarts the roles: local (this host's supervisor) or "
        "ray (a Ray cluster; the extra asyncrl[ray])",
    )
    ray_address: str = _f(
        "", "asyncrl run --launcher ray: the cluster to join, e.g. 10.0.0.1:6379 ('': start a local one for the run)"
    )
    restart_window_s: float = _f(
        60.0,
        "asyncrl run: only restarts this recent count against run.max_restarts "
        "and the backoff (a role that stays up this long is healthy again); 0: all count",
    )
