"""What every command shares: the click group ``main``, one-line errors (UserError, RunFailed), the
config loading of the --config / --set options and the device and env-module options."""

from __future__ import annotations

import faulthandler
import logging
import sys
from typing import NoReturn

import click

from asyncrl import __version__
from asyncrl.core import config as config_mod
from asyncrl.core import exit_status
from asyncrl.core.config import Config, ConfigError


class UserError(click.ClickException):
    """One clear line on stderr, exit status 2 (refused: asyncrl.core.exit_status), no traceback."""

    exit_code = exit_status.REFUSED


class RunFailed(click.ClickException):
    """A run or role that failed while running: one line on stderr, exit status 1 (asyncrl.core.exit_status)."""

    exit_code = exit_status.FAILED


def _interrupted(line: str) -> NoReturn:
    """The outcome line of an interrupted command, then its exit status (130 after SIGINT, 143 after SIGTERM)."""
    click.echo(line)
    sys.exit(exit_status.interrupted_status())


def load_config(
    config_file, overrides, flags: dict | None = None, *, env: bool = True, resolved: bool = False, notes: bool = True
):
    """Defaults <- --config FILE <- CLI flags <- --set overrides (asyncrl.core.config.resolve: presets and
    the task kind set their keys unless the user does); each user value that overrides a preset or
    task-kind value, or has no effect, is said once on stderr (with ``notes``). With ``env``, the env must be one
    asyncrl can make here. Returns the Config, or with ``resolved`` the asyncrl.core.config.Resolved.
    Raises UserError."""
    extra: dict[str, dict] = {}
    for (section, key), value in (flags or {}).items():
        if value is not None:
            extra.setdefault(section, {})[key] = value
    try:
        res = config_mod.load_resolved(config_file, overrides, extra)
        if env and res.config.task.kind == "control":
            from asyncrl.tasks.control.envs import check_env

            check_env(res.config.env.id, res.config.env.max_episode_steps, res.config.env.module)
    except (ConfigError, ValueError) as exc:  # EnvError is a ValueError
        raise UserError(str(exc)) from None
    for line in res.notes() if notes else ():
        click.echo(f"config: {line}", err=True)
    return res if resolved else res.config


def _common(f):
    f = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one config value (repeatable), e.g. --set algo.lr=1e-4.",
    )(f)
    f = click.option(
        "--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file (see configs/)."
    )(f)
    return f


class _Command(click.Command):
    """Lists its whole first help line in ``asyncrl --help`` (click cuts it at ~45 characters)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        if self.short_help:
            return self.short_help
        return (self.help or "").strip().split("\n\n")[0].replace("\n", " ").strip()


class _Group(click.Group, _Command):
    command_class = _Command
    group_class = type  # subgroups are _Group too

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
    """asyncrl: asynchronous on-policy RL under real policy lag (decoupled PPO; VACO, arXiv:2603.01365)."""
    # from the first moment: a SIGINT / SIGTERM during start-up is an interruption too
    exit_status.install_stop_handlers()
    # A fatal signal (SIGBUS on a shared-memory page that cannot be backed, SIGSEGV) prints the
    # Python stack to stderr (the role's log) before the process dies of it.
    try:
        faulthandler.enable()
    except (OSError, ValueError, AttributeError):  # stderr without a file descriptor (tests' CliRunner)
        pass
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if not verbose:  # libraries' start-up notes (font cache built, no OpenGL_accelerate) are not ours to print
        for name in ("matplotlib", "OpenGL", "PIL", "torch"):  # torch: FakeTensor cache stats at exit
            logging.getLogger(name).setLevel(logging.WARNING)


def _device_option(key: str, what: str):
    return click.option(
        "--device",
        help=f"{what}: cpu, cuda or cuda:N (config {key}; default cpu). Checked "
        f"before anything starts: cuda on a machine without it is one error line.",
    )


def _check_devices(cfg: Config, *, learner: bool = True, actor: bool = True) -> None:
    """Raise UserError (one line) unless this machine has the devices the roles started here use:
    learner.device (and learner.precision), and actor.device of llm generators."""
    from asyncrl.core.device import check_device

    try:
        if learner:
            check_device(cfg.learner.device, cfg.learner.precision)
        if actor and cfg.task.kind == "llm":
            check_device(cfg.actor.device, key="actor.device")
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _env_module(f):
    return click.option(
        "--env-module",
        "env_module",
        help="Python module to import first, e.g. one that registers your env id "
        "(config env.module); or give --env module:callable.",
    )(f)


def check_lag_trace(cfg: Config, *, serial: bool) -> None:
    """Raise UserError unless ``actor.lag_trace`` is unset, or set in serial mode and names a readable
    trace (asyncrl.core.lag_trace): processes have their own lag, which a trace cannot replace."""
    if not cfg.actor.lag_trace:
        return
    if not serial:
        raise UserError(
            "actor.lag_trace (--lag-trace) replays a run's lag in serial mode only: add --serial "
            "(actor and learner processes have their own lag)"
        )
    from asyncrl.core.lag_trace import LagTraceError, read_lag_trace

    try:
        read_lag_trace(cfg.actor.lag_trace)
    except LagTraceError as exc:
        raise UserError(str(exc)) from None
