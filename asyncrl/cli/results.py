"""``asyncrl lag | eval | plot``: read a finished (or running) run: its policy lag, its policy's
return (and a video), its curves."""

from __future__ import annotations

import click

from asyncrl.cli.common import UserError, _env_module, _interrupted, main
from asyncrl.core.wording import count_of


@main.command()
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a PNG of the lag.")
def lag(run_dir, as_json, plot_path):
    """Policy-lag report of a run: versions and seconds, overall, per actor, per host."""
    from asyncrl.analysis.lag_report import ReportError, build_report, format_report, plot_report

    try:
        report = build_report(run_dir)
    except ReportError as exc:
        raise UserError(str(exc)) from None
    from asyncrl.core.metrics import strict_json

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
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Episode k starts from env.reset(seed=SEED+k); also seeds --stochastic sampling.",
)
@click.option("--env", "env_id", help="Evaluate on this env id instead of the run's (its spaces must fit the policy).")
@_env_module
@click.option(
    "--video",
    type=click.Path(dir_okay=False),
    help="Also write FILE.mp4 of the first episodes (offscreen rendering; MuJoCo needs EGL or OSMesa).",
)
@click.option("--video-episodes", type=int, default=1, show_default=True, help="Episodes in the video.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (with every episode's return).")
def eval_cmd(target, episodes, stochastic, seed, env_id, env_module, video, video_episodes, as_json):
    """Evaluate a trained policy: mean ± std of return and length over N episodes; optionally an MP4."""
    from asyncrl.tasks.control.envs import EnvError, follow_with_camera, is_mujoco, make_env
    from asyncrl.tasks.control.evaluate import EvalError, check_spaces, load_checkpoint, run_episodes
    from asyncrl.tasks.control.render import INSTALL_GL, RenderError, VideoWriter, choose_gl_backend

    if episodes < 1 or video_episodes < 1:
        raise UserError(f"--episodes and --video-episodes must be >= 1, got {episodes}, {video_episodes}")
    if video and not video.lower().endswith(".mp4"):
        raise UserError(f"--video {video}: the file name must end in .mp4")
    try:
        ckpt = load_checkpoint(target)
        e = ckpt.cfg.env
        env_id, env_module = env_id or e.id, env_module if env_module is not None else e.module
        env = make_env(
            env_id, module=env_module, max_episode_steps=e.max_episode_steps, render_mode="rgb_array" if video else None
        )
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
            result = run_episodes(
                ckpt.policy,
                env,
                episodes=episodes,
                seed=seed,
                stochastic=stochastic,
                on_frame=(lambda k, frame: writer.add(frame)) if writer else None,
                record_episodes=video_episodes,
            )
        except (RenderError, EvalError):
            raise
        except Exception as exc:
            if writer is None:
                raise
            import os

            raise UserError(
                f"rendering failed (MUJOCO_GL={os.environ.get('MUJOCO_GL', 'unset')}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
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
    out = {
        "checkpoint": str(ckpt.path),
        "version": ckpt.version,
        "env_steps": ckpt.env_steps,
        "env_id": env_id,
        "seed": seed,
        "actions": "sampled" if stochastic else "mean",
        **s,
        "returns": result.returns,
        "lengths": result.lengths,
        "video": video,
    }
    if as_json:
        from asyncrl.core.metrics import strict_json

        click.echo(strict_json(out, indent=2))
    else:
        seeds = f"seed {seed}" if episodes == 1 else f"seeds {seed}..{seed + episodes - 1}"
        click.echo(
            f"{count_of(s['episodes'], 'episode')} of {env_id}, {out['actions']} actions, {seeds} "
            f"(policy version {ckpt.version}, {ckpt.env_steps:,} env steps): return {s['return_mean']:.1f} ± "
            f"{s['return_std']:.1f}, length {s['length_mean']:.1f} ± {s['length_std']:.1f} (mean ± std)"
        )
    if video:
        import os

        gl = f", MUJOCO_GL={os.environ['MUJOCO_GL']}" if os.environ.get("MUJOCO_GL") else ""
        click.echo(f"video written to {video} ({writer.frames} frames{gl})", err=as_json)


@main.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=click.Path())
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Label of each RUN_DIR in order (repeat it; default: the "
    "directory names). Runs with the same label form a group.",
)
@click.option(
    "--group-by",
    help="Group runs by a config key, e.g. algo.preset: mean and 95% CI band across each group's runs (seeds).",
)
@click.option(
    "--returns",
    type=click.Choice(["auto", "train", "eval"]),
    default="auto",
    show_default=True,
    help="train: average of the last 20 training episodes; eval: run.eval_every evaluations; auto: "
    "eval where a run has them.",
)
@click.option("--title", help="Figure title.")
def plot(run_dirs, out, labels, group_by, returns, title):
    """Learning curves of runs: return vs env steps and wall-clock time, TV estimate, no_grad_fraction, lag."""
    from asyncrl.analysis.plots import PlotError, plot_runs, read_run

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
