"""``asyncrl run``: train (learner, broadcaster and actors as local processes, on Ray, or --serial)."""

from __future__ import annotations

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
from asyncrl.cli.rundir import (
    _prepare_task,
    _read_summary,
    _restart_option,
    prepare_run_dir,
    resuming_note,
    summary_line,
    write_config_json,
)
from asyncrl.core import config as config_mod
from asyncrl.core import exit_status


@main.command()
@_common
@click.option(
    "--env",
    "env_id",
    help="Gymnasium env id (e.g. HalfCheetah-v5), or module:callable / module:EnvId for your own env.",
)
@_env_module
@click.option(
    "--preset",
    help=f"Advantage estimator and policy loss (config algo.preset): {', '.join(config_mod.PRESETS)}; "
    f"task.kind = llm: {', '.join(config_mod.LLM_PRESETS)}.",
)
@click.option("--num-actors", type=int, help="Actor processes (serial mode: actor env groups).")
@click.option(
    "--learners",
    "num_learners",
    type=int,
    help="Learner processes training the one policy, data-parallel "
    "(config learner.num_learners; docs/learner-group.md).",
)
@click.option("--total-steps", type=int, help="Env-step budget.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Directory for this run's outputs.")
@click.option("--seed", type=int, help="Run seed.")
@click.option("--serial", is_flag=True, help="Everything in one process (debugging; bit-reproducible).")
@click.option(
    "--lag-trace",
    type=click.Path(),
    help="--serial: replay the lag of a run, rollout by rollout (its run directory or lag_trace.jsonl; "
    "config actor.lag_trace).",
)
@_device_option("learner.device", "Where the learner computes")
@click.option(
    "--launcher",
    type=click.Choice(["local", "ray"]),
    help="Who starts and restarts the roles: local processes, or a Ray cluster (config run.launcher).",
)
@click.option(
    "--address",
    "ray_address",
    help="--launcher ray: the Ray cluster, e.g. 10.0.0.1:6379 (default: "
    "config run.ray_address; empty: a local cluster for this run).",
)
@_restart_option
def run(
    config_file,
    overrides,
    env_id,
    env_module,
    preset,
    num_actors,
    num_learners,
    total_steps,
    run_dir,
    seed,
    serial,
    lag_trace,
    device,
    launcher,
    ray_address,
    restart,
):
    """Train: learner, broadcaster and actors as local processes, on a Ray cluster, or --serial.

    Exit status 0 finished, 1 failed, 2 refused to start, 130 / 143 interrupted by SIGINT / SIGTERM;
    the last line says how it ended (asyncrl.core.exit_status)."""
    exit_status.install_stop_handlers()  # `kill`, `timeout` and CI cancel stop the whole run, like Ctrl-C
    res = load_config(
        config_file,
        overrides,
        {
            ("env", "id"): env_id,
            ("env", "module"): env_module,
            ("algo", "preset"): preset,
            ("run", "num_actors"): num_actors,
            ("learner", "num_learners"): num_learners,
            ("run", "total_env_steps"): total_steps,
            ("run", "seed"): seed,
            ("run", "launcher"): launcher,
            ("run", "ray_address"): ray_address,
            ("learner", "device"): device,
            ("actor", "lag_trace"): lag_trace,
        },
        resolved=True,
    )
    cfg = res.config
    check_lag_trace(cfg, serial=serial)
    if serial:
        try:
            config_mod.validate_serial(cfg)
        except config_mod.ConfigError as exc:
            raise UserError(str(exc)) from None
    # the roles run on this host unless Ray places them: the devices are checked before any starts
    _check_devices(cfg, learner=serial or cfg.run.launcher == "local", actor=serial or cfg.run.launcher == "local")
    if cfg.run.launcher == "ray" and not serial:
        from asyncrl.run.ray_cluster import LauncherError, import_ray

        try:
            import_ray(cfg.run.ray_address or None)  # first: Ray reads its auth mode when imported
        except LauncherError as exc:
            raise UserError(str(exc)) from None
    out, resume = prepare_run_dir(run_dir, cfg, restart)
    if not resume:
        write_config_json(out, res)
    click.echo(f"run directory: {out}" + (resuming_note(_read_summary(out)) if resume else ""))
    _prepare_task(cfg, out)
    try:
        if serial:
            from asyncrl.core.metrics import RunDirError
            from asyncrl.core.state import NonFiniteError
            from asyncrl.run.serial import run_serial

            try:
                summary = run_serial(cfg, out, echo=click.echo, resume=resume)
            except NonFiniteError as exc:
                raise RunFailed(str(exc)) from None
            except RunDirError as exc:  # disk full or read-only: the last good checkpoint stays
                raise RunFailed(f"asyncrl: {exc}") from None
        elif cfg.run.launcher == "ray":
            from asyncrl.run.launch import RoleFailed
            from asyncrl.run.launch_ray import launch_ray
            from asyncrl.run.ray_cluster import LauncherError

            try:
                summary = launch_ray(cfg, out, address=cfg.run.ray_address or None, echo=click.echo, resume=resume)
            except (RoleFailed, LauncherError) as exc:
                raise RunFailed(str(exc)) from None
        else:
            from asyncrl.run.launch import RoleFailed, launch

            try:
                summary = launch(cfg, out, echo=click.echo, resume=resume)
            except RoleFailed as exc:
                raise RunFailed(str(exc)) from None
    except KeyboardInterrupt:
        _interrupted(summary_line(_read_summary(out), out))
    # the run's one outcome line (a learner under `run` writes its own to its log)
    click.echo(summary_line(summary, out))
