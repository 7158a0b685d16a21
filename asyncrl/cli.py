"""Command line: ``asyncrl run | learner | actor | broadcaster | eval | plot | lag | config | keys | clean``.

Shell completion (click): ``eval "$(_ASYNCRL_COMPLETE=bash_source asyncrl)"`` in ~/.bashrc
(``zsh_source`` / ``fish_source`` for zsh and fish)."""
from __future__ import annotations

import faulthandler
import json
import logging
import sys
import time
from typing import Any, NoReturn
from pathlib import Path

import click

from . import __version__, exit_status
from . import config as config_mod
from .config import Config, ConfigError
from .wording import count_of


class UserError(click.ClickException):
    """One clear line on stderr, exit status 2 (refused: asyncrl.exit_status), no traceback."""

    exit_code = exit_status.REFUSED


class RunFailed(click.ClickException):
    """A run or role that failed while running: one line on stderr, exit status 1 (asyncrl.exit_status)."""

    exit_code = exit_status.FAILED


def _interrupted(line: str) -> NoReturn:
    """The outcome line of an interrupted command, then its exit status (130 after SIGINT, 143 after SIGTERM)."""
    click.echo(line)
    sys.exit(exit_status.interrupted_status())


def load_config(config_file, overrides, flags: dict | None = None, *, env: bool = True, resolved: bool = False,
                notes: bool = True):
    """Defaults <- --config FILE <- CLI flags <- --set overrides (asyncrl.config.resolve: presets and
    the task kind set their keys unless the user does); each user value that overrides a preset or
    task-kind value, or has no effect, is said once on stderr (with ``notes``). With ``env``, the env must be one
    asyncrl can make here. Returns the Config, or with ``resolved`` the asyncrl.config.Resolved.
    Raises UserError."""
    extra: dict[str, dict] = {}
    for (section, key), value in (flags or {}).items():
        if value is not None:
            extra.setdefault(section, {})[key] = value
    try:
        res = config_mod.load_resolved(config_file, overrides, extra)
        if env and res.config.task.kind == "control":
            from .envs import check_env
            check_env(res.config.env.id, res.config.env.max_episode_steps, res.config.env.module)
    except (ConfigError, ValueError) as exc:  # EnvError is a ValueError
        raise UserError(str(exc)) from None
    for line in res.notes() if notes else ():
        click.echo(f"config: {line}", err=True)
    return res if resolved else res.config


RUN_OUTPUTS = ("metrics.jsonl", "lag.jsonl", "lag_histograms.jsonl", "summary.json", "checkpoint.pt")


def holds_run(out: Path) -> bool:
    """True if ``out`` holds the outputs of a run (metrics, lag records, a summary, checkpoints)."""
    return any((out / name).exists() for name in RUN_OUTPUTS) or any(out.glob("checkpoint.*.pt"))


def prepare_run_dir(run_dir, cfg: Config, restart: str = "resume") -> tuple[Path, bool]:
    """The run directory (created) and whether the run in it is to be resumed. For a directory
    that already holds a run, ``restart`` says what to do: "resume" goes on with it if it did not
    finish and was started with the same config; "overwrite" removes its outputs and starts
    afresh; "refuse" stops. Raises UserError (nothing is changed) for a run that cannot be
    resumed: it finished, its config differs, or it has no config.json."""
    out = Path(run_dir) if run_dir else default_run_dir(cfg)
    if not holds_run(out):
        out.mkdir(parents=True, exist_ok=True)
        return out, False
    if restart == "refuse":
        raise UserError(f"run directory {out} already holds a run; choose another --run-dir (or --restart resume / "
                        f"overwrite)")
    if restart == "overwrite":
        import shutil
        for name in (*RUN_OUTPUTS, "config.json"):
            (out / name).unlink(missing_ok=True)
        for p in out.glob("checkpoint.*.pt"):
            p.unlink()
        for name in ("tb", "logs"):
            shutil.rmtree(out / name, ignore_errors=True)
        return out, False
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    if summary.get("outcome") == "finished":
        raise UserError(f"run directory {out} holds a run that finished ({summary.get('env_steps', 0):,} env steps); "
                        f"--restart overwrite to train again there, or choose another --run-dir")
    if not (out / "config.json").exists():
        raise UserError(f"run directory {out} holds a run without config.json, which cannot be resumed; "
                        f"--restart overwrite, or choose another --run-dir")
    try:
        saved_res = config_mod.load_resolved(out / "config.json")
    except (ConfigError, ValueError) as exc:
        raise UserError(f"run directory {out}: its config.json does not load, so the run cannot be resumed: "
                        f"{exc}") from None
    for line in saved_res.translated:   # an older run's config.json: keys read under their new names
        click.echo(f"config: {line}", err=True)
    saved = saved_res.config.to_dict()
    ours = cfg.to_dict()
    diff = [f"{section}.{key} ({saved[section][key]!r} there, {value!r} now)" for section, keys in ours.items()
            for key, value in keys.items() if (section, key) != ("run", "run_dir") and saved[section][key] != value]
    if diff:
        raise UserError(f"run directory {out} holds a run with another config, which cannot be resumed: "
                        f"{', '.join(diff[:3])}{' ...' if len(diff) > 3 else ''}; run the same command, or "
                        f"--restart overwrite")
    return out, True


def _restart_option(f):
    return click.option("--restart", type=click.Choice(["resume", "overwrite", "refuse"]), default="resume",
                        show_default=True,
                        help="When --run-dir already holds a run: resume it from its checkpoint (if it did not "
                             "finish and its config is the same), overwrite it, or refuse.")(f)


def write_config_json(out: Path, res: config_mod.Resolved) -> None:
    """The run's resolved config, how it was resolved (what the user set; overrides of a preset or
    task-kind value; values without effect) and where it ran (code commit, package versions, load)."""
    from .metrics import RunDirError, write_json_atomic
    from .provenance import provenance
    try:
        # infinities ("off", e.g. algo.behavior_band) as "inf": strict JSON that config.load reads back
        write_json_atomic(out / "config.json", {**res.config.to_dict(), "resolution": res.record(),
                                                "provenance": provenance()}, inf_as_text=True)
    except RunDirError as exc:
        raise UserError(f"asyncrl: {exc}") from None


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.run.run_dir) / f"{cfg.env.id}-{cfg.algo.preset}-s{cfg.run.seed}-{stamp}"


def _common(f):
    f = click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="Override one config value (repeatable), e.g. --set algo.lr=1e-4.")(f)
    f = click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="TOML config file (see configs/).")(f)
    return f


class _Command(click.Command):
    """Lists its whole first help line in ``asyncrl --help`` (click cuts it at ~45 characters)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        if self.short_help:
            return self.short_help
        return (self.help or "").strip().split("\n\n")[0].replace("\n", " ").strip()


class _Group(click.Group, _Command):
    command_class = _Command
    group_class = type          # subgroups are _Group too

    def invoke(self, ctx: click.Context):
        """A Ctrl-C (or SIGTERM) that arrives before a command's own handling of it, e.g. while it
        still imports torch, ends it like any interrupted command: one ``interrupted:`` line and
        130 / 143 (click would print "Aborted!" and exit 1)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(f"interrupted: before asyncrl {ctx.invoked_subcommand or ''} started".rstrip())
            sys.exit(exit_status.interrupted_status())


@click.group(cls=_Group, context_settings={"max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="asyncrl", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """asyncrl: asynchronous on-policy RL with VACO (arXiv:2603.01365)."""
    exit_status.install_stop_handlers()   # from the first moment: a SIGINT / SIGTERM during start-up is an interruption too
    # A fatal signal (SIGBUS on a shared-memory page that cannot be backed, SIGSEGV) prints the
    # Python stack to stderr (the role's log) before the process dies of it.
    try:
        faulthandler.enable()
    except (OSError, ValueError, AttributeError):   # stderr without a file descriptor (tests' CliRunner)
        pass
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if not verbose:   # libraries' start-up notes (font cache built, no OpenGL_accelerate) are not ours to print
        for name in ("matplotlib", "OpenGL", "PIL", "torch"):   # torch: FakeTensor cache stats at exit
            logging.getLogger(name).setLevel(logging.WARNING)


def _device_option(key: str, what: str):
    return click.option("--device", help=f"{what}: cpu, cuda or cuda:N (config {key}; default cpu). Checked "
                                         f"before anything starts: cuda on a machine without it is one error line.")


def _check_devices(cfg: Config, *, learner: bool = True, actor: bool = True) -> None:
    """Raise UserError (one line) unless this machine has the devices the roles started here use:
    learner.device (and learner.precision), and actor.device of llm generators."""
    from .device import check_device
    try:
        if learner:
            check_device(cfg.learner.device, cfg.learner.precision)
        if actor and cfg.task.kind == "llm":
            check_device(cfg.actor.device, key="actor.device")
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _env_module(f):
    return click.option("--env-module", "env_module",
                        help="Python module to import first, e.g. one that registers your env id "
                             "(config env.module); or give --env module:callable.")(f)


@main.command()
@_common
@click.option("--env", "env_id", help="Gymnasium env id (e.g. HalfCheetah-v5), or module:callable / "
                                      "module:EnvId for your own env.")
@_env_module
@click.option("--preset", help=f"Advantage estimator and policy loss (config algo.preset): {', '.join(config_mod.PRESETS)}; "
                               f"task.kind = llm: {', '.join(config_mod.LLM_PRESETS)}.")
@click.option("--num-actors", type=int, help="Actor processes (serial mode: actor env groups).")
@click.option("--total-steps", type=int, help="Env-step budget.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Directory for this run's outputs.")
@click.option("--seed", type=int, help="Run seed.")
@click.option("--serial", is_flag=True, help="Everything in one process (debugging; bit-reproducible).")
@_device_option("learner.device", "Where the learner computes")
@click.option("--launcher", type=click.Choice(["local", "ray"]),
              help="Who starts and restarts the roles: local processes, or a Ray cluster (config run.launcher).")
@click.option("--address", "ray_address", help="--launcher ray: the Ray cluster, e.g. 10.0.0.1:6379 (default: "
                                               "config run.ray_address; empty: a local cluster for this run).")
@_restart_option
def run(config_file, overrides, env_id, env_module, preset, num_actors, total_steps, run_dir, seed, serial, device,
        launcher, ray_address, restart):
    """Train: learner, broadcaster and actors as local processes, on a Ray cluster, or --serial.

    Exit status 0 finished, 1 failed, 2 refused to start, 130 / 143 interrupted by SIGINT / SIGTERM;
    the last line says how it ended (asyncrl.exit_status)."""
    exit_status.install_stop_handlers()   # `kill`, `timeout` and CI cancel stop the whole run, like Ctrl-C
    res = load_config(config_file, overrides, {("env", "id"): env_id, ("env", "module"): env_module,
                                                  ("algo", "preset"): preset,
                                                  ("run", "num_actors"): num_actors,
                                                  ("run", "total_env_steps"): total_steps,
                                                  ("run", "seed"): seed, ("run", "launcher"): launcher,
                                                  ("run", "ray_address"): ray_address, ("learner", "device"): device},
                      resolved=True)
    cfg = res.config
    # the roles run on this host unless Ray places them: the devices are checked before any starts
    _check_devices(cfg, learner=serial or cfg.run.launcher == "local", actor=serial or cfg.run.launcher == "local")
    if cfg.run.launcher == "ray" and not serial:
        from .launch_ray import LauncherError, import_ray
        try:
            import_ray(cfg.run.ray_address or None)   # first: Ray reads its auth mode when imported
        except LauncherError as exc:
            raise UserError(str(exc)) from None
    out, resume = prepare_run_dir(run_dir, cfg, restart)
    if not resume:
        write_config_json(out, res)
    click.echo(f"run directory: {out}" + (" (resuming the run there)" if resume else ""))
    _prepare_task(cfg, out)
    try:
        if serial:
            from .metrics import RunDirError
            from .serial import run_serial
            from .state import NonFiniteError
            try:
                summary = run_serial(cfg, out, echo=click.echo, resume=resume)
            except NonFiniteError as exc:
                raise RunFailed(str(exc)) from None
            except RunDirError as exc:   # disk full or read-only: the last good checkpoint stays
                raise RunFailed(f"asyncrl: {exc}") from None
        elif cfg.run.launcher == "ray":
            from .launch import RoleFailed
            from .launch_ray import LauncherError, launch_ray
            try:
                summary = launch_ray(cfg, out, address=cfg.run.ray_address or None, echo=click.echo, resume=resume)
            except (RoleFailed, LauncherError) as exc:
                raise RunFailed(str(exc)) from None
        else:
            from .launch import RoleFailed, launch
            try:
                summary = launch(cfg, out, echo=click.echo, resume=resume)
            except RoleFailed as exc:
                raise RunFailed(str(exc)) from None
    except KeyboardInterrupt:
        _interrupted(summary_line(_read_summary(out)))
    click.echo(summary_line(summary))   # the run's one outcome line (a learner under `run` writes its own to its log)


def _read_summary(run_dir: Path) -> dict:
    """summary.json of ``run_dir``, or {} when there is none that reads (the run stopped before it wrote one)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _prepare_task(cfg: Config, out: Path) -> None:
    """What the task needs before its roles start (llm: the start model, made and warmed up once and
    cached, and its held-out accuracy before RL); nothing for control tasks. Raises UserError."""
    from .tasks import make_task
    try:
        make_task(cfg).prepare_run(out, click.echo)
    except (OSError, ValueError) as exc:   # a missing model directory, a cache made with other settings
        raise UserError(str(exc)) from None


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
    """--keys and --insecure: CURVE for every socket on a non-loopback address (asyncrl.security)."""
    f = click.option("--insecure", is_flag=True,
                     help="No CURVE encryption or authentication, even across hosts (prints a warning).")(f)
    f = click.option("--keys", "keys_dir", type=click.Path(file_okay=False),
                     help="Key directory from `asyncrl keys generate`: DIR/server on the learner host, "
                          "DIR/client-K on an actor host. Needed for any non-loopback address.")(f)
    return f


def _endpoint(value: str | None, default: str) -> str:
    """--bind/--learner/--broadcaster/--upstream: HOST:PORT or tcp://HOST:PORT. Raises UserError."""
    from .security import normalize_endpoint
    try:
        return normalize_endpoint(value or default)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _security(role: str, keys_dir, insecure: bool):
    from .security import Security
    if keys_dir and not Path(keys_dir).is_dir():
        raise UserError(f"{role}: --keys {keys_dir}: no such directory")
    return Security(role, keys_dir, insecure=insecure)


def _role_flags(env_id, num_envs, seed, total_steps=None, env_module=None):
    return {("env", "id"): env_id, ("env", "num_envs"): num_envs, ("run", "seed"): seed,
            ("run", "total_env_steps"): total_steps, ("env", "module"): env_module}


@main.command()
@_common
@_network
@click.option("--env", "env_id", help="Gymnasium env id, or module:callable / module:EnvId.")
@_env_module
@click.option("--bind", help="Interface address and port actors connect to, e.g. tcp://0.0.0.0:5555 or "
                             "10.0.0.5:5555 (default: config transport.learner_bind, loopback). A non-loopback "
                             "address turns CURVE on: give --keys or --insecure.")
@click.option("--advertise", help="The address actors on other hosts use (HOST or HOST:PORT), if not the bound "
                                  "one; printed at start-up in the actor command line.")
@click.option("--broadcaster", help="The broadcaster's address (default: config transport.broadcaster_bind).")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Directory for this run's outputs.")
@click.option("--run-id", help="Run id (default: made up from the time).")
@click.option("--total-steps", type=int, help="Env-step budget.")
@click.option("--seed", type=int)
@_device_option("learner.device", "Where the learner computes")
@_restart_option
@click.option("--supervised", is_flag=True, hidden=True,
              help="Started by `asyncrl run`: the outcome line goes to stderr (the role's log); the launcher prints the run's.")
def learner(config_file, overrides, keys_dir, insecure, env_id, env_module, bind, advertise, broadcaster, run_dir,
            run_id, total_steps, seed, device, restart, supervised):
    """The learner: owns the nets and shared memory, consumes rollouts, publishes weights.

    Exit status 0 finished, 1 failed, 2 refused to start, 130 / 143 interrupted by SIGINT / SIGTERM;
    the last line says how it ended (asyncrl.exit_status)."""
    from .launch import new_run_id
    from .roles.learner import Learner, LearnerError
    from .security import SecurityError
    from .shm import ShmError
    exit_status.install_stop_handlers()
    res = load_config(config_file, overrides, {**_role_flags(env_id, None, seed, total_steps, env_module),
                                               ("learner", "device"): device}, resolved=True)
    cfg = res.config
    _check_devices(cfg, actor=False)
    run_id = run_id or new_run_id()
    out, resume = prepare_run_dir(run_dir, cfg, restart)
    if not resume:
        write_config_json(out, res)
    bind = _endpoint(bind, cfg.transport.learner_bind)
    broadcaster = _endpoint(broadcaster, cfg.transport.broadcaster_bind)
    try:
        role = Learner(cfg, out, run_id=run_id, bind=bind, broadcaster=broadcaster, echo=click.echo,
                       security=_security("learner", keys_dir, insecure), advertise=advertise, resume=resume)
    except (SecurityError, ValueError, OSError, ShmError) as exc:   # OSError: transport.AddressError
        raise UserError(f"learner: {exc}" if isinstance(exc, (OSError, ShmError)) else str(exc)) from None
    from .metrics import RunDirError
    from .state import NonFiniteError
    interrupted = False
    try:
        summary = role.run()
    except (LearnerError, NonFiniteError) as exc:
        role.record_failure(exc)
        raise RunFailed(str(exc)) from None
    except RunDirError as exc:   # disk full or read-only: the last good checkpoint stays
        role.record_failure(exc)
        raise RunFailed(f"learner: {exc}") from None
    except KeyboardInterrupt:
        summary, interrupted = role.finish(outcome="interrupted"), True
    except Exception as exc:
        role.record_failure(exc)
        raise
    finally:
        role.close()
    click.echo(summary_line(summary), err=supervised)
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
@click.option("--seed", type=int, help="Run seed this actor's env and action streams derive from, with its "
                                       "actor id and restart count (default: the learner's run.seed).")
@click.option("--policy-delay", type=int, help="Act with the weights K versions behind the newest (lag experiments).")
@click.option("--policy-age-buffer", type=int,
              help="Each rollout acts with a version drawn uniformly from the last K received.")
@click.option("--slowdown", type=float, help="A straggler: each rollout takes SECONDS longer (spread over its steps).")
@click.option("--rollout-transport", type=click.Choice(["auto", "shm", "tcp"]),
              help="auto: shared memory when the learner is on this host, else TCP; shm: fail without shared "
                   "memory; tcp: always TCP (default: config actor.rollout_transport).")
@click.option("--run-id", help="Join only the learner of this run (refused otherwise).")
@click.option("--host-label", help="The host name this actor reports, e.g. for the lag report per host "
                                   "(default: this host's name).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Keep the learner's token for this actor id here (mode 0600): an actor restarted with the same "
                   "--actor-id and file takes its id back at once instead of waiting transport.actor_timeout_s.")
@_device_option("actor.device", "llm generator actors: where the model samples")
def actor(config_file, overrides, keys_dir, insecure, learner_ep, broadcaster, env_id, env_module, num_envs, actor_id,
          seed,
          policy_delay, policy_age_buffer, slowdown, rollout_transport, run_id, host_label, token_file, device):
    """An actor: steps envs with the newest weights it has and fills slots for the learner.

    Exit status 0 when its learner told it to stop, 2 refused (by its learner, or bad config), 130 /
    143 interrupted by SIGINT / SIGTERM; the last line says how it ended (asyncrl.exit_status)."""
    import os
    import socket
    from .roles.actor import Actor, ActorError, ActorOptions
    exit_status.install_stop_handlers()
    flags = _role_flags(env_id, num_envs, None, env_module=env_module)
    flags.update({("actor", "policy_delay"): policy_delay, ("actor", "policy_age_buffer"): policy_age_buffer,
                  ("actor", "slowdown_s"): slowdown, ("actor", "rollout_transport"): rollout_transport,
                  ("actor", "device"): device})
    cfg = load_config(config_file, overrides, flags)
    _check_devices(cfg, learner=False)
    actor_id = actor_id or f"{host_label or socket.gethostname()}-{os.getpid()}"
    opts = ActorOptions(learner=_endpoint(learner_ep, cfg.transport.learner_bind),
                        broadcaster=_endpoint(broadcaster, cfg.transport.broadcaster_bind),
                        actor_id=actor_id, seed=seed,
                        run_id=run_id or "", host_label=host_label or "", token_file=token_file,
                        security=_security(f"actor {actor_id}", keys_dir, insecure))
    from .security import SecurityError
    try:
        role = Actor(cfg, opts)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    _, interrupted = _run_role(role, ActorError)
    bad = role.bad_numbers.by_reason()
    what = f"actor {opts.actor_id}, {count_of(role.sent, 'rollout')} sent"
    bad = f"; non-finite numbers from its envs: {bad}" if bad else ""
    if interrupted:
        _interrupted(f"interrupted: {what}{bad}")
    click.echo(f"done: {what}; {role.stopped or 'stopped'}{bad}")


@main.command()
@click.option("--bind", help="PUB address, HOST:PORT (snapshot requests on PORT + 1); default: config "
                             "transport.broadcaster_bind (loopback). A non-loopback address turns CURVE on: "
                             "give --keys or --insecure.")
@click.option("--advertise", help="The address actors on other hosts use (HOST or HOST:PORT), if not the bound one.")
@click.option("--upstream", help="Relay: take the weights from the broadcaster at this PUB address (another host) "
                                 "and republish them here, so weights cross the network once per host.")
@click.option("--summary", "summary_file", type=click.Path(dir_okay=False),
              help="JSON file of this role's counts: rejected messages and refused connections by reason, weights "
                   "published (rewritten every 2 s and at exit).")
@_network
@_common
def broadcaster(bind, advertise, upstream, summary_file, keys_dir, insecure, config_file, overrides):
    """The weight broadcaster: republishes the learner's newest weights to all actors.

    It runs until stopped: exit status 130 / 143 after SIGINT / SIGTERM (its normal end), 2 refused
    to start (asyncrl.exit_status); the last line says how many weight versions it published."""
    from .roles.broadcaster import Broadcaster, BroadcasterError
    from .security import SecurityError
    exit_status.install_stop_handlers()
    cfg = load_config(config_file, overrides, env=False)
    bind = _endpoint(bind, cfg.transport.broadcaster_bind)
    try:
        role = Broadcaster(bind, upstream=_endpoint(upstream, "") if upstream else None,
                           security=_security("broadcaster", keys_dir, insecure), advertise=advertise,
                           echo=click.echo, summary=summary_file)
    except (SecurityError, ValueError, OSError) as exc:   # OSError: transport.AddressError
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
@click.option("--clients", type=int, default=1, show_default=True,
              help="Client key pairs to make: one per actor host.")
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
    from .security import generate
    try:
        created = generate(directory, clients)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    for d in created:
        click.echo(f"created {d}")
    if not created:
        click.echo(f"{directory}: every key already exists; nothing created")


@main.command()
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a PNG of the lag.")
def lag(run_dir, as_json, plot_path):
    """Policy-lag report of a run: versions and seconds, overall, per actor, per host."""
    from .lag_report import ReportError, build_report, format_report, plot_report
    try:
        report = build_report(run_dir)
    except ReportError as exc:
        raise UserError(str(exc)) from None
    from .metrics import strict_json
    click.echo(strict_json(report, indent=2) if as_json else format_report(report))
    if plot_path:
        try:
            plot_report(run_dir, plot_path)
        except ImportError as exc:
            raise UserError(str(exc)) from None
        except OSError as exc:
            raise UserError(f"cannot write {plot_path}: {exc.strerror or exc}") from None
        click.echo(f"plot written to {plot_path}", err=as_json)


@main.command("eval")
@click.argument("target", metavar="RUN_DIR|CHECKPOINT", type=click.Path())
@click.option("--episodes", type=int, default=10, show_default=True, help="Episodes to run.")
@click.option("--stochastic", is_flag=True, help="Sample actions from the policy (default: its mean action).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Episode k starts from env.reset(seed=SEED+k); also seeds --stochastic sampling.")
@click.option("--env", "env_id", help="Evaluate on this env id instead of the run's (its spaces must fit the policy).")
@_env_module
@click.option("--video", type=click.Path(dir_okay=False), help="Also write FILE.mp4 of the first episodes "
                                                                 "(offscreen rendering; MuJoCo needs EGL or OSMesa).")
@click.option("--video-episodes", type=int, default=1, show_default=True, help="Episodes in the video.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (with every episode's return).")
def eval_cmd(target, episodes, stochastic, seed, env_id, env_module, video, video_episodes, as_json):
    """Evaluate a trained policy: mean ± std of return and length over N episodes; optionally an MP4."""
    from .envs import EnvError, follow_with_camera, is_mujoco, make_env
    from .evaluate import EvalError, check_spaces, load_checkpoint, run_episodes
    from .render import INSTALL_GL, RenderError, VideoWriter, choose_gl_backend
    if episodes < 1 or video_episodes < 1:
        raise UserError(f"--episodes and --video-episodes must be >= 1, got {episodes}, {video_episodes}")
    if video and not video.lower().endswith(".mp4"):
        raise UserError(f"--video {video}: the file name must end in .mp4")
    try:
        ckpt = load_checkpoint(target)
        e = ckpt.cfg.env
        env_id, env_module = env_id or e.id, env_module if env_module is not None else e.module
        env = make_env(env_id, module=env_module, max_episode_steps=e.max_episode_steps,
                       render_mode="rgb_array" if video else None)
    except (EvalError, EnvError) as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # the env's own constructor failed: one line
        raise UserError(f"{env_id} cannot be made here: {type(exc).__name__}: {exc}") from None
    writer = None
    try:
        check_spaces(env, ckpt.spec, env_id)
        if video:
            if is_mujoco(env) and choose_gl_backend() is None:
                raise UserError(INSTALL_GL)
            follow_with_camera(env)
            writer = VideoWriter(video, fps=env.metadata.get("render_fps", 30))
        try:
            result = run_episodes(ckpt.policy, env, episodes=episodes, seed=seed, stochastic=stochastic,
                                  on_frame=(lambda k, frame: writer.add(frame)) if writer else None,
                                  record_episodes=video_episodes)
        except (RenderError, EvalError):
            raise
        except Exception as exc:
            if writer is None:
                raise
            import os
            raise UserError(f"rendering failed (MUJOCO_GL={os.environ.get('MUJOCO_GL', 'unset')}): "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    except (EvalError, RenderError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {video}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        _interrupted("interrupted: eval")
    finally:
        if writer is not None:
            writer.close()
        env.close()
    s = result.summary()
    out = {"checkpoint": str(ckpt.path), "version": ckpt.version, "env_steps": ckpt.env_steps, "env_id": env_id,
           "seed": seed, "actions": "sampled" if stochastic else "mean", **s,
           "returns": result.returns, "lengths": result.lengths, "video": video}
    if as_json:
        from .metrics import strict_json
        click.echo(strict_json(out, indent=2))
    else:
        seeds = f"seed {seed}" if episodes == 1 else f"seeds {seed}..{seed + episodes - 1}"
        click.echo(f"{count_of(s['episodes'], 'episode')} of {env_id}, {out['actions']} actions, {seeds} "
                   f"(policy version {ckpt.version}, {ckpt.env_steps:,} env steps): return {s['return_mean']:.1f} ± "
                   f"{s['return_std']:.1f}, length {s['length_mean']:.1f} ± {s['length_std']:.1f} (mean ± std)")
    if video:
        import os
        gl = f", MUJOCO_GL={os.environ['MUJOCO_GL']}" if os.environ.get("MUJOCO_GL") else ""
        click.echo(f"video written to {video} ({writer.frames} frames{gl})", err=as_json)


@main.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=click.Path())
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
@click.option("--label", "labels", multiple=True, help="Label of each RUN_DIR in order (repeat it; default: the "
                                                       "directory names). Runs with the same label form a group.")
@click.option("--group-by", help="Group runs by a config key, e.g. algo.preset: mean and 95% CI band across each "
                                 "group's runs (seeds).")
@click.option("--returns", type=click.Choice(["auto", "train", "eval"]), default="auto", show_default=True,
              help="train: average of the last 20 training episodes; eval: run.eval_every evaluations; auto: "
                   "eval where a run has them.")
@click.option("--title", help="Figure title.")
def plot(run_dirs, out, labels, group_by, returns, title):
    """Learning curves of runs: return vs env steps and wall-clock time, TV estimate, no_grad_fraction, lag."""
    from .plots import PlotError, plot_runs, read_run
    if labels and len(labels) != len(run_dirs):
        raise UserError(f"--label given {len(labels)} times for {len(run_dirs)} run directories")
    try:
        series = [read_run(d, returns=returns) for d in run_dirs]
    except PlotError as exc:
        raise UserError(str(exc)) from None
    if labels:
        for s, label in zip(series, labels):
            s["label"] = label
        counts = {label: labels.count(label) for label in labels}
        for s in series:
            s["group"] = s["label"] if counts[s["label"]] > 1 else None
    if group_by:
        if "." not in group_by:
            raise UserError(f"--group-by expects section.key (e.g. algo.preset), got {group_by!r}")
        section, key = group_by.split(".", 1)
        for s in series:
            if key not in s["config"].get(section, {}):
                raise UserError(f"--group-by {group_by}: {s['label']} has no such key in its config.json")
            s["group"] = f"{group_by}={s['config'][section][key]}"
    try:
        plot_runs(series, out, title=title)
    except PlotError as exc:
        raise UserError(str(exc)) from None
    except ImportError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"plot of {count_of(len(series), 'run')} written to {out}")


@main.group("config")
def config_cmd():
    """The configuration: every key, its default and its meaning."""


@config_cmd.command("show")
@_common
@click.option("--preset", help=f"Show this preset's config (config algo.preset): {', '.join(config_mod.PRESETS)}; "
                               f"task.kind = llm: {', '.join(config_mod.LLM_PRESETS)}.")
def config_show(config_file, overrides, preset):
    """Print the resolved config as TOML (usable with --config), each key with its meaning, its default
    and the layer that set it. Precedence, lowest first: built-in defaults < task kind < preset < your
    config file, flags and --set; lines before the keys say which of your values override a preset or
    task-kind value and which have no effect. Study-only options (experimental: the studies' lag
    conditions and ablations) come last in their section, each marked [study-only]."""
    res = load_config(config_file, overrides, {("algo", "preset"): preset}, env=False, resolved=True,
                      notes=False)
    head = ["# asyncrl config: built-in defaults < task kind < preset < your config file and --set"]
    head += [f"# {line}" for line in res.notes()]
    click.echo("\n".join(head) + "\n\n" + config_mod.to_toml(res.config, source=res.source), nl=False)


@main.command()
@click.option("--run-id", help="Remove this run's segments (default: those of dead processes).")
def clean(run_id):
    """Remove shared-memory segments left by killed runs and, without --run-id, the weights secrets
    of killed broadcasters (files of ports no socket listens on) and the private endpoint
    directories of killed `asyncrl run`s (no socket in them accepts a connection)."""
    from .launch import remove_stale_endpoint_dirs
    from .security import remove_stale_weights_secrets
    from .shm import cleanup_stale, remove_run
    removed = remove_run(run_id) if run_id else cleanup_stale()
    click.echo(f"removed {len(removed)} segment(s)" + (": " + ", ".join(removed) if removed else ""))
    if not run_id:
        secrets_removed = remove_stale_weights_secrets()
        click.echo("weights secrets: listening ports unknown (no /proc/net/tcp), none removed"
                   if secrets_removed is None else f"removed {len(secrets_removed)} stale weights secret(s)")
        dirs = remove_stale_endpoint_dirs()
        click.echo(f"removed {len(dirs)} stale endpoint director{'y' if len(dirs) == 1 else 'ies'}")


@main.command()
@click.argument("study_file", type=click.Path(dir_okay=False))
@click.option("--jobs", type=int, default=1, show_default=True,
              help="Serial cells run this many at a time (one core each); multi-process cells run alone.")
@click.option("--out", type=click.Path(file_okay=False), help="Results directory (default studies/NAME).")
@click.option("--total-steps", type=int, help="Override the study's env-step budget (smoke runs).")
@click.option("--seeds", help="Override the study's seeds, e.g. 1,2 (smoke runs).")
@click.option("--envs", help="Override the study's envs, e.g. asyncrl/Corridor-v0 (smoke runs).")
@click.option("--presets", "only_presets", help="Only the cells of these presets, e.g. vaco,ppo.")
@click.option("--conditions", "only_conditions", help="Only the cells of these lag conditions, e.g. none,age-8.")
@click.option("--retry-failed", is_flag=True, help="Run again the cells whose record says failed.")
@click.option("--any-code", is_flag=True,
              help="With --report-only: also report cells finished under other training code (marked).")
@click.option("--dry-run", is_flag=True, help="List the cells and which are finished; run nothing.")
@click.option("--report-only", is_flag=True, help="Write the results table and report from finished cells only.")
@click.option("--launcher", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Run the cells on this machine, or as Ray tasks on a cluster (--jobs cells in flight).")
@click.option("--address", "ray_address", help="--launcher ray: the Ray cluster, e.g. 10.0.0.1:6379 (default: "
                                               "a local one for this study).")
def study(study_file, jobs, out, total_steps, seeds, envs, only_presets, only_conditions, retry_failed, any_code,
          dry_run, report_only, launcher, ray_address):
    """Run a grid of envs x presets x lag conditions x seeds (resumable) and report it.

    Finished cells (same study, resolved config and training code) are skipped, so a killed
    study re-run continues. Writes OUT/results.json, results.csv, report.md and plots/.
    """
    from .study import Runner, StudyError, load_study
    from .study_report import write_report
    try:
        seed_list = [int(x) for x in seeds.split(",")] if seeds else None
    except ValueError:
        raise UserError(f"--seeds expects integers separated by commas, got {seeds!r}") from None
    try:
        st = load_study(study_file, total_env_steps=total_steps, seeds=seed_list,
                        envs=envs.split(",") if envs else None,
                        presets=only_presets.split(",") if only_presets else None,
                        conditions=only_conditions.split(",") if only_conditions else None)
        runner = Runner(st, Path(out or Path("studies") / st.name), jobs=jobs, echo=click.echo,
                        retry_failed=retry_failed)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    if dry_run:
        seen: set[str] = set()
        for c in st.cells:
            state = "finished" if runner.record_path(c).exists() else "pending"
            shared = " | the same run as an earlier cell" if runner.keys[c] in seen else ""
            seen.add(runner.keys[c])
            click.echo(f"{state:8} {runner.keys[c]} {c.label} | {c.env} | {c.condition} | seed {c.seed} | {c.mode}{shared}")
        return
    if not report_only:
        exit_status.install_stop_handlers()
        if launcher == "ray":
            from .launch_ray import LauncherError
            from .study_ray import RayCells
            try:
                runner.executor = RayCells(ray_address, runner.fingerprint, echo=click.echo)
            except LauncherError as exc:
                raise UserError(str(exc)) from None
        try:
            runner.run()
        except KeyboardInterrupt:
            _interrupted(f"interrupted: study {st.name}; the finished cells are kept, a re-run goes on from them")
        finally:
            if runner.executor:
                runner.executor.close()
    results = write_report(st, runner.finished_records(any_code=any_code and report_only), runner.out)
    click.echo(f"report: {runner.out / 'report.md'} ({len(results['cells'])} of {count_of(len(st.cells), 'cell')} "
               "finished)")


def summary_line(s: dict) -> str:
    """The outcome line of a run from its summary.json: "done: ..." for a finished run, "interrupted: ..."
    or "failed: ..." otherwise; an interrupted or failed one also names the checkpoint a resume starts
    from. An empty ``s`` (no summary was written) gives "interrupted: before the run wrote its summary"."""
    if "env_steps" not in s:
        return "interrupted: before the run wrote its summary"
    ret = s.get("final_average_return")
    ret_text = f"{ret:.1f}" if ret is not None else "n/a"
    outcome = s.get("outcome", "finished") or "interrupted"   # an interrupted or failed run says so, not "done"
    head = "done" if outcome == "finished" else outcome
    line = (f"{head}: {s['env_steps']:,} env steps in {s['wall_time_s']:.0f} s "
            f"({s['env_steps_per_s']:,.0f}/s), {count_of(s['learner_iterations'], 'learner iteration')}, "
            f"average return {ret_text}, lag p50/p95 {_num(s.get('lag_p50'))}/{_num(s.get('lag_p95'))} versions")
    ck = s.get("resume_checkpoint")
    if outcome != "finished":
        line += (f"; a resume starts from {ck['file']} at {ck['env_steps']:,} env steps (version {ck['version']})"
                 if ck else "; no checkpoint: a resume starts from scratch")
    return line


def _num(x) -> str:
    return "n/a" if x is None else f"{x:g}"


from .tasks.llm.cli import llm as _llm_group   # noqa: E402 - imports transformers only when a command runs

main.add_command(_llm_group)

if __name__ == "__main__":  # pragma: no cover
    main()
