"""Command line: ``asyncrl run | learner | actor | broadcaster | keys | lag | clean``."""
from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from . import config as config_mod
from .config import Config, ConfigError


class UserError(click.ClickException):
    """One clear line on stderr, exit status 2, no traceback."""

    exit_code = 2


def load_config(config_file, overrides, flags: dict | None = None, *, env: bool = True) -> Config:
    """Defaults <- --config FILE <- CLI flags <- --set overrides; with ``env``, the env must be
    one asyncrl can make here. Raises UserError."""
    extra: dict[str, dict] = {}
    for (section, key), value in (flags or {}).items():
        if value is not None:
            extra.setdefault(section, {})[key] = value
    try:
        cfg = config_mod.load(config_file, overrides, extra)
        if env:
            from .envs import check_env
            check_env(cfg.env.id, cfg.env.max_episode_steps)
    except (ConfigError, ValueError) as exc:  # EnvError is a ValueError
        raise UserError(str(exc)) from None
    return cfg


def fresh_run_dir(run_dir, cfg: Config) -> Path:
    """The run directory (created); refuses one that already holds a run, whose metrics and lag
    records the new run would otherwise be appended to. Raises UserError."""
    out = Path(run_dir) if run_dir else default_run_dir(cfg)
    if (out / "metrics.jsonl").exists() or (out / "lag.jsonl").exists():
        raise UserError(f"run directory {out} already holds a run; choose another --run-dir")
    out.mkdir(parents=True, exist_ok=True)
    return out


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.run.run_dir) / f"{cfg.env.id}-{cfg.algo.preset}-s{cfg.run.seed}-{stamp}"


def _common(f):
    f = click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="Override one config value (repeatable), e.g. --set algo.lr=1e-4.")(f)
    f = click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="TOML config file (see configs/).")(f)
    return f


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """asyncrl: asynchronous on-policy RL with VACO (arXiv:2603.01365)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


@main.command()
@_common
@click.option("--env", "env_id", help="Gymnasium env id, e.g. HalfCheetah-v5.")
@click.option("--preset", help="vaco, ppo, ppo_kl, spo, impala, vaco_no_realign, vaco_no_filter.")
@click.option("--num-actors", type=int, help="Actor processes (serial mode: actor env groups).")
@click.option("--total-steps", type=int, help="Env-step budget.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Directory for this run's outputs.")
@click.option("--seed", type=int, help="Run seed.")
@click.option("--serial", is_flag=True, help="Everything in one process (debugging; bit-reproducible).")
def run(config_file, overrides, env_id, preset, num_actors, total_steps, run_dir, seed, serial):
    """Train: learner, broadcaster and actors as local processes (or --serial)."""
    _on_sigterm()   # `kill`, `timeout` and CI cancel stop the whole run, like Ctrl-C
    cfg = load_config(config_file, overrides, {("env", "id"): env_id, ("algo", "preset"): preset,
                                                  ("run", "num_actors"): num_actors,
                                                  ("run", "total_env_steps"): total_steps,
                                                  ("run", "seed"): seed})
    out = fresh_run_dir(run_dir, cfg)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    click.echo(f"run directory: {out}")
    try:
        if serial:
            from .serial import run_serial
            from .state import NonFiniteError
            try:
                summary = run_serial(cfg, out, echo=click.echo)
            except NonFiniteError as exc:
                raise click.ClickException(str(exc)) from None
        else:
            from .launch import RoleFailed, launch
            try:
                summary = launch(cfg, out, echo=click.echo)
            except RoleFailed as exc:
                raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted: the run was stopped; its summary.json and checkpoint.pt were written", err=True)
        sys.exit(130)
    if serial:   # in a multi-process run the learner prints it
        click.echo(summary_line(summary))


def _run_role(role, errors):
    """Run a role to its end: its own errors become one line (UserError), Ctrl-C a quiet stop
    (returns None); the role is always closed."""
    try:
        return role.run()
    except errors as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        return None
    finally:
        role.close()


def _on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every role cleans up (sockets, shared memory).

    Only the first SIGINT/SIGTERM interrupts; later ones are ignored (SIGKILL still works): a
    terminal's Ctrl-C reaches every process of `asyncrl run`, which then signals each role again,
    and a second KeyboardInterrupt would cut the cleanup short (no summary, no checkpoint)."""
    def handler(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:   # started with Ctrl-C ignored: keep it so
        signal.signal(signal.SIGINT, handler)


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


def _role_flags(env_id, num_envs, seed, total_steps=None):
    return {("env", "id"): env_id, ("env", "num_envs"): num_envs, ("run", "seed"): seed,
            ("run", "total_env_steps"): total_steps}


@main.command()
@_common
@_network
@click.option("--env", "env_id", help="Gymnasium env id.")
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
def learner(config_file, overrides, keys_dir, insecure, env_id, bind, advertise, broadcaster, run_dir, run_id,
            total_steps, seed):
    """The learner: owns the nets and shared memory, consumes rollouts, publishes weights."""
    import secrets

    from .roles.learner import Learner, LearnerError
    from .security import SecurityError
    _on_sigterm()
    cfg = load_config(config_file, overrides, _role_flags(env_id, None, seed, total_steps))
    run_id = run_id or f"{time.strftime('%m%d%H%M%S')}-{secrets.token_hex(3)}"
    out = fresh_run_dir(run_dir, cfg)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    bind = _endpoint(bind, cfg.transport.learner_bind)
    broadcaster = _endpoint(broadcaster, cfg.transport.broadcaster_bind)
    try:
        role = Learner(cfg, out, run_id=run_id, bind=bind, broadcaster=broadcaster, echo=click.echo,
                       security=_security("learner", keys_dir, insecure), advertise=advertise)
    except (SecurityError, ValueError, OSError) as exc:   # OSError: transport.AddressError
        raise UserError(f"learner: {exc}" if isinstance(exc, OSError) else str(exc)) from None
    from .state import NonFiniteError
    try:
        summary = role.run()
    except (LearnerError, NonFiniteError) as exc:
        role.record_failure(exc)
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        summary = role.finish(outcome="interrupted")
        click.echo("learner: interrupted", err=True)
    except Exception as exc:
        role.record_failure(exc)
        raise
    finally:
        role.close()
    click.echo(summary_line(summary))


@main.command()
@_common
@_network
@click.option("--learner", "learner_ep", help="Learner address (default: config transport.learner_bind).")
@click.option("--broadcaster", help="Broadcaster address (default: config transport.broadcaster_bind).")
@click.option("--env", "env_id", help="Gymnasium env id (must match the learner's).")
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
def actor(config_file, overrides, keys_dir, insecure, learner_ep, broadcaster, env_id, num_envs, actor_id, seed,
          policy_delay, policy_age_buffer, slowdown, rollout_transport, run_id, host_label):
    """An actor: steps envs with the newest weights it has and fills slots for the learner."""
    import os
    import socket
    from .roles.actor import Actor, ActorError, ActorOptions
    _on_sigterm()
    flags = _role_flags(env_id, num_envs, None)
    flags.update({("actor", "policy_delay"): policy_delay, ("actor", "policy_age_buffer"): policy_age_buffer,
                  ("actor", "slowdown_s"): slowdown, ("actor", "rollout_transport"): rollout_transport})
    cfg = load_config(config_file, overrides, flags)
    actor_id = actor_id or f"{host_label or socket.gethostname()}-{os.getpid()}"
    opts = ActorOptions(learner=_endpoint(learner_ep, cfg.transport.learner_bind),
                        broadcaster=_endpoint(broadcaster, cfg.transport.broadcaster_bind),
                        actor_id=actor_id, seed=seed,
                        run_id=run_id or "", host_label=host_label or "",
                        security=_security(f"actor {actor_id}", keys_dir, insecure))
    from .security import SecurityError
    try:
        role = Actor(cfg, opts)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    n = _run_role(role, ActorError)
    if n is not None:
        bad = role.bad_numbers.by_reason()
        click.echo(f"actor {opts.actor_id}: {n} rollouts sent; {role.stopped or 'stopped'}"
                   + (f"; non-finite numbers from its envs: {bad}" if bad else ""))


@main.command()
@click.option("--bind", help="PUB address, HOST:PORT (snapshot requests on PORT + 1); default: config "
                             "transport.broadcaster_bind (loopback). A non-loopback address turns CURVE on: "
                             "give --keys or --insecure.")
@click.option("--advertise", help="The address actors on other hosts use (HOST or HOST:PORT), if not the bound one.")
@click.option("--upstream", help="Relay: take the weights from the broadcaster at this PUB address (another host) "
                                 "and republish them here, so weights cross the network once per host.")
@_network
@_common
def broadcaster(bind, advertise, upstream, keys_dir, insecure, config_file, overrides):
    """The weight broadcaster: republishes the learner's newest weights to all actors."""
    from .roles.broadcaster import Broadcaster, BroadcasterError
    from .security import SecurityError
    _on_sigterm()
    cfg = load_config(config_file, overrides, env=False)
    bind = _endpoint(bind, cfg.transport.broadcaster_bind)
    try:
        role = Broadcaster(bind, upstream=_endpoint(upstream, "") if upstream else None,
                           security=_security("broadcaster", keys_dir, insecure), advertise=advertise,
                           echo=click.echo)
    except (SecurityError, ValueError, OSError) as exc:   # OSError: transport.AddressError
        raise UserError(f"broadcaster: {exc}" if isinstance(exc, OSError) else str(exc)) from None
    _run_role(role, BroadcasterError)


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
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))
    if plot_path:
        try:
            plot_report(run_dir, plot_path)
        except ImportError as exc:
            raise UserError(str(exc)) from None
        except OSError as exc:
            raise UserError(f"cannot write {plot_path}: {exc.strerror or exc}") from None
        click.echo(f"plot written to {plot_path}", err=as_json)


@main.command()
@click.option("--run-id", help="Remove this run's segments (default: those of dead processes).")
def clean(run_id):
    """Remove shared-memory segments left by killed runs."""
    from .shm import cleanup_stale, remove_run
    removed = remove_run(run_id) if run_id else cleanup_stale()
    click.echo(f"removed {len(removed)} segment(s)" + (": " + ", ".join(removed) if removed else ""))


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
@click.option("--dry-run", is_flag=True, help="List the cells and which are finished; run nothing.")
@click.option("--report-only", is_flag=True, help="Write the results table and report from finished cells only.")
def study(study_file, jobs, out, total_steps, seeds, envs, only_presets, only_conditions, dry_run, report_only):
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
        runner = Runner(st, Path(out or Path("studies") / st.name), jobs=jobs, echo=click.echo)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    if dry_run:
        for c in st.cells:
            state = "finished" if runner.record_path(c).exists() else "pending"
            click.echo(f"{state:8} {runner.keys[c]} {c.label} | {c.env} | {c.condition} | seed {c.seed} | {c.mode}")
        return
    if not report_only:
        _on_sigterm()
        runner.run()
    results = write_report(st, runner.finished_records(), runner.out)
    click.echo(f"report: {runner.out / 'report.md'} ({len(results['cells'])} of {len(st.cells)} cells finished)")


def summary_line(s: dict) -> str:
    ret = s.get("final_average_return")
    ret_text = f"{ret:.1f}" if ret is not None else "n/a"
    return (f"done: {s['env_steps']:,} env steps in {s['wall_time_s']:.0f} s "
            f"({s['env_steps_per_s']:,.0f}/s), {s['learner_iterations']} learner iterations, "
            f"average return {ret_text}, lag p50/p95 {_num(s.get('lag_p50'))}/{_num(s.get('lag_p95'))} versions")


def _num(x) -> str:
    return "n/a" if x is None else f"{x:g}"


if __name__ == "__main__":  # pragma: no cover
    main()
