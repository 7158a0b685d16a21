"""``asyncrl learner | actor | broadcaster``: one role each, started by hand or by a launcher; and
``asyncrl keys generate`` (the CURVE keys the roles use across hosts). A learner group's other
members: :mod:`.learner_member`."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click

from asyncrl.cli.common import (
    RunFailed,
    UserError,
    _check_devices,
    _common,
    _device_option,
    _env_module,
    _interrupted,
    check_lag_trace,
    load_config,
    main,
)
from asyncrl.cli.rundir import _restart_option, prepare_run_dir, summary_line, write_config_json
from asyncrl.core import exit_status
from asyncrl.core.wording import count_of


def _run_role(role, errors) -> tuple[Any, bool]:
    """Run a role to its end: (what its run() returned, False), or (None, True) after Ctrl-C or
    SIGTERM; its own errors become one line (UserError). The role is always closed."""
    try:
        return role.run(), False
    except errors as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        return None, True
    finally:
        role.close()


def _network(f):
    """--keys and --insecure: CURVE for every socket on a non-loopback address (asyncrl.wire.security)."""
    f = click.option(
        "--insecure", is_flag=True, help="No CURVE encryption or authentication, even across hosts (prints a warning)."
    )(f)
    f = click.option(
        "--keys",
        "keys_dir",
        type=click.Path(file_okay=False),
        help="Key directory from `asyncrl keys generate`: DIR/server on the learner host, "
        "DIR/client-K on an actor host. Needed for any non-loopback address.",
    )(f)
    return f


def _endpoint(value: str | None, default: str) -> str:
    """--bind/--learner/--broadcaster/--upstream: HOST:PORT or tcp://HOST:PORT. Raises UserError."""
    from asyncrl.wire.addresses import normalize_endpoint

    try:
        return normalize_endpoint(value or default)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _security(role: str, keys_dir, insecure: bool):
    from asyncrl.wire.security import Security

    if keys_dir and not Path(keys_dir).is_dir():
        raise UserError(f"{role}: --keys {keys_dir}: no such directory")
    return Security(role, keys_dir, insecure=insecure)


def _role_flags(env_id, num_envs, seed, total_steps=None, env_module=None):
    return {
        ("env", "id"): env_id,
        ("env", "num_envs"): num_envs,
        ("run", "seed"): seed,
        ("run", "total_env_steps"): total_steps,
        ("env", "module"): env_module,
    }


@main.command()
@_common
@_network
@click.option("--env", "env_id", help="Gymnasium env id, or module:callable / module:EnvId.")
@_env_module
@click.option(
    "--bind",
    help="Interface address and port actors connect to, e.g. tcp://0.0.0.0:5555 or "
    "10.0.0.5:5555 (default: config transport.learner_bind, loopback). A non-loopback "
    "address turns CURVE on: give --keys or --insecure.",
)
@click.option(
    "--advertise",
    help="The address actors on other hosts use (HOST or HOST:PORT), if not the bound "
    "one; printed at start-up in the actor command line.",
)
@click.option("--broadcaster", help="The broadcaster's address (default: config transport.broadcaster_bind).")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Directory for this run's outputs.")
@click.option("--run-id", help="Run id (default: made up from the time).")
@click.option("--total-steps", type=int, help="Env-step budget.")
@click.option("--seed", type=int)
@_device_option("learner.device", "Where the learner computes")
@_restart_option
@click.option(
    "--group",
    "group_init",
    help="With learner.num_learners > 1: where the learner group meets (file://PATH on one host, "
    "tcp://HOST:PORT across hosts; docs/learner-group.md); this learner is its rank 0.",
)
@click.option(
    "--supervised",
    is_flag=True,
    hidden=True,
    help="Started by `asyncrl run`: the outcome line goes to stderr (the role's log); the launcher prints the run's.",
)
def learner(
    config_file,
    overrides,
    keys_dir,
    insecure,
    env_id,
    env_module,
    bind,
    advertise,
    broadcaster,
    run_dir,
    run_id,
    total_steps,
    seed,
    device,
    restart,
    group_init,
    supervised,
):
    """The learner: owns the nets and shared memory, consumes rollouts, publishes weights.

    Exit status 0 finished, 1 failed, 2 refused to start, 130 / 143 interrupted by SIGINT / SIGTERM;
    the last line says how it ended (asyncrl.core.exit_status)."""
    from asyncrl.roles.learner import Learner, LearnerError
    from asyncrl.run.launch import new_run_id
    from asyncrl.wire.security import SecurityError
    from asyncrl.wire.shm.layout import ShmError

    exit_status.install_stop_handlers()
    res = load_config(
        config_file,
        overrides,
        {**_role_flags(env_id, None, seed, total_steps, env_module), ("learner", "device"): device},
        resolved=True,
    )
    cfg = res.config
    check_lag_trace(cfg, serial=False)
    _check_devices(cfg, actor=False)
    run_id = run_id or new_run_id()
    out, resume = prepare_run_dir(run_dir, cfg, restart)
    if not resume:
        write_config_json(out, res)
    bind = _endpoint(bind, cfg.transport.learner_bind)
    broadcaster = _endpoint(broadcaster, cfg.transport.broadcaster_bind)
    try:
        role = Learner(
            cfg,
            out,
            run_id=run_id,
            bind=bind,
            broadcaster=broadcaster,
            echo=click.echo,
            security=_security("learner", keys_dir, insecure),
            advertise=advertise,
            resume=resume,
            group_init=group_init,
        )
    except (SecurityError, ValueError, OSError, ShmError) as exc:  # OSError: sockets.AddressError
        raise UserError(f"learner: {exc}" if isinstance(exc, (OSError, ShmError)) else str(exc)) from None
    from asyncrl.core.learner_group import GroupError
    from asyncrl.core.metrics import RunDirError
    from asyncrl.core.state import NonFiniteError

    interrupted = False
    try:
        summary = role.run()
    except (LearnerError, NonFiniteError, GroupError) as exc:
        role.record_failure(exc)
        raise RunFailed(str(exc)) from None
    except RunDirError as exc:  # disk full or read-only: the last good checkpoint stays
        role.record_failure(exc)
        raise RunFailed(f"learner: {exc}") from None
    except KeyboardInterrupt:
        summary, interrupted = role.finish(outcome="interrupted"), True
    except Exception as exc:
        role.record_failure(exc)
        raise
    finally:
        role.close()
    click.echo(summary_line(summary, out), err=supervised)
    if interrupted:
        sys.exit(exit_status.interrupted_status())


@main.command()
@_common
@_network
@click.option("--learner", "learner_ep", help="Learner address (default: config transport.learner_bind).")
@click.option("--broadcaster", help="Broadcaster address (default: config transport.broadcaster_bind).")
@click.option("--env", "env_id", help="Gymnasium env id (must match the learner's).")
@_env_module
@click.option("--num-envs", type=int, help="Envs in this actor (must match the learner's env.num_envs).")
@click.option("--actor-id", help="Unique name of this actor (default: host-pid).")
@click.option(
    "--seed",
    type=int,
    help="Run seed this actor's env and action streams derive from, with its "
    "actor id and restart count (default: the learner's run.seed).",
)
@click.option("--policy-delay", type=int, help="Act with the weights K versions behind the newest (lag experiments).")
@click.option(
    "--policy-age-buffer", type=int, help="Each rollout acts with a version drawn uniformly from the last K received."
)
@click.option("--slowdown", type=float, help="A straggler: each rollout takes SECONDS longer (spread over its steps).")
@click.option(
    "--rollout-transport",
    type=click.Choice(["auto", "shm", "tcp"]),
    help="auto: shared memory when the learner is on this host, else TCP; shm: fail without shared "
    "memory; tcp: always TCP (default: config actor.rollout_transport).",
)
@click.option("--run-id", help="Join only the learner of this run (refused otherwise).")
@click.option(
    "--host-label",
    help="The host name this actor reports, e.g. for the lag report per host (default: this host's name).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="Keep the learner's token for this actor id here (mode 0600): an actor restarted with the same "
    "--actor-id and file takes its id back at once instead of waiting transport.actor_timeout_s.",
)
@_device_option("actor.device", "llm generator actors: where the model samples")
def actor(
    config_file,
    overrides,
    keys_dir,
    insecure,
    learner_ep,
    broadcaster,
    env_id,
    env_module,
    num_envs,
    actor_id,
    seed,
    policy_delay,
    policy_age_buffer,
    slowdown,
    rollout_transport,
    run_id,
    host_label,
    token_file,
    device,
):
    """An actor: steps envs with the newest weights it has and fills slots for the learner.

    Exit status 0 when its learner told it to stop, 2 refused (by its learner, or bad config), 130 /
    143 interrupted by SIGINT / SIGTERM; the last line says how it ended (asyncrl.core.exit_status)."""
    import os
    import socket

    from asyncrl.roles.actor import Actor
    from asyncrl.roles.actor_session import ActorError, ActorOptions

    exit_status.install_stop_handlers()
    flags = _role_flags(env_id, num_envs, None, env_module=env_module)
    flags.update(
        {
            ("actor", "policy_delay"): policy_delay,
            ("actor", "policy_age_buffer"): policy_age_buffer,
            ("actor", "slowdown_s"): slowdown,
            ("actor", "rollout_transport"): rollout_transport,
            ("actor", "device"): device,
        }
    )
    cfg = load_config(config_file, overrides, flags)
    check_lag_trace(cfg, serial=False)
    _check_devices(cfg, learner=False)
    actor_id = actor_id or f"{host_label or socket.gethostname()}-{os.getpid()}"
    opts = ActorOptions(
        learner=_endpoint(learner_ep, cfg.transport.learner_bind),
        broadcaster=_endpoint(broadcaster, cfg.transport.broadcaster_bind),
        actor_id=actor_id,
        seed=seed,
        run_id=run_id or "",
        host_label=host_label or "",
        token_file=token_file,
        security=_security(f"actor {actor_id}", keys_dir, insecure),
    )
    from asyncrl.tasks.llm.model import ModelLoadError
    from asyncrl.wire.security import SecurityError

    try:
        role = Actor(cfg, opts)
    except (SecurityError, ModelLoadError) as exc:  # ModelLoadError: the llm model its weights queue is sized by
        raise UserError(f"actor {actor_id}: {exc}" if isinstance(exc, ModelLoadError) else str(exc)) from None
    _, interrupted = _run_role(role, ActorError)
    bad = role.bad_numbers.by_reason()
    what = f"actor {opts.actor_id}, {count_of(role.sent, 'rollout')} sent"
    click.echo(
        f"actor {opts.actor_id}: weights: {count_of(role.versions_received, 'version')} received, "
        f"{role.versions_acted} acted with (the last: {role.version})"
        + (f"; {count_of(role.rewinds, 'time')} dropped versions above the learner's (forged)" if role.rewinds else "")
    )
    bad = f"; non-finite numbers from its envs: {bad}" if bad else ""
    if interrupted:
        _interrupted(f"interrupted: {what}{bad}")
    click.echo(f"done: {what}; {role.stopped or 'stopped'}{bad}")


@main.command()
@click.option(
    "--bind",
    help="PUB address, HOST:PORT (snapshot requests on PORT + 1); default: config "
    "transport.broadcaster_bind (loopback). A non-loopback address turns CURVE on: "
    "give --keys or --insecure.",
)
@click.option("--advertise", help="The address actors on other hosts use (HOST or HOST:PORT), if not the bound one.")
@click.option(
    "--upstream",
    help="Relay: take the weights from the broadcaster at this PUB address (another host) "
    "and republish them here, so weights cross the network once per host.",
)
@click.option(
    "--summary",
    "summary_file",
    type=click.Path(dir_okay=False),
    help="JSON file of this role's counts: rejected messages and refused connections by reason, weights "
    "published (rewritten every 2 s and at exit).",
)
@click.option(
    "--max-weights-mb",
    type=click.FloatRange(min=0, min_open=True),
    help="The largest weights payload taken, in MiB (parameters x 4 bytes as float32, 2 as bfloat16 or "
    "float16; the learner logs its run's at start, asyncrl run passes it); a peer that sends a larger frame "
    "is disconnected before it is buffered, the learner is told it (a run whose weights are larger stops "
    "with one line), and the weights queues and the memory a peer can make this role hold scale with it. "
    "Default: 1024 (1 GiB).",
)
@_network
@_common
def broadcaster(bind, advertise, upstream, summary_file, max_weights_mb, keys_dir, insecure, config_file, overrides):
    """The weight broadcaster: republishes the learner's newest weights to all actors.

    It runs until stopped: exit status 130 / 143 after SIGINT / SIGTERM (its normal end), 2 refused
    to start (asyncrl.core.exit_status); the last line says how many weight versions it published."""
    from asyncrl.roles.broadcaster import Broadcaster, BroadcasterError
    from asyncrl.wire.security import SecurityError

    exit_status.install_stop_handlers()
    cfg = load_config(config_file, overrides, env=False)
    bind = _endpoint(bind, cfg.transport.broadcaster_bind)
    try:
        role = Broadcaster(
            bind,
            upstream=_endpoint(upstream, "") if upstream else None,
            security=_security("broadcaster", keys_dir, insecure),
            advertise=advertise,
            echo=click.echo,
            summary=summary_file,
            max_weights_bytes=None if max_weights_mb is None else math.ceil(max_weights_mb * (1 << 20)),
        )
    except (SecurityError, ValueError, OSError) as exc:  # OSError: sockets.AddressError
        raise UserError(f"broadcaster: {exc}" if isinstance(exc, OSError) else str(exc)) from None
    _, interrupted = _run_role(role, BroadcasterError)
    what = f"{'relay' if role.upstream else 'broadcaster'}, {count_of(role.published, 'weight version')} published"
    if interrupted:
        _interrupted(f"interrupted: {what}")
    click.echo(f"done: {what}")


@main.group()
def keys():
    """CURVE key pairs for runs across hosts."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--clients", type=int, default=1, show_default=True, help="Client key pairs to make: one per actor host.")
def keys_generate(directory, clients):
    """Make the server key pair and N client key pairs under DIRECTORY.

    \b
    DIRECTORY/server/    copy to the learner host; --keys DIRECTORY/server for the
                         learner and the broadcaster:
        server.key_secret  the server key pair (secret)
        server.key         the server public key
        client.key_secret  the learner's own client key pair (it connects to
                           the broadcaster)
        allowed/*.key      the client public keys accepted (delete one and
                           restart to revoke that client)
    DIRECTORY/client-K/  copy to actor host K; --keys DIRECTORY/client-K for its
                         actors and its relay broadcaster:
        client.key_secret  this host's client key pair (secret)
        server.key         the server public key

    A socket on a non-loopback address (0.0.0.0 included) uses CURVE; on loopback it does not.
    Existing keys are never overwritten: run it again with a larger --clients to add hosts
    (then restart the learner and broadcaster so they accept them).
    """
    from asyncrl.wire.security import generate

    try:
        created = generate(directory, clients)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    for d in created:
        click.echo(f"created {d}")
    if not created:
        click.echo(f"{directory}: every key already exists; nothing created")
