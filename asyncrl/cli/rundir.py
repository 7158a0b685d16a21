"""A run's directory as the commands see it: create, resume or refuse it, write config.json, and the
one outcome line of a run (:func:`summary_line`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from asyncrl.cli.common import UserError
from asyncrl.core import config as config_mod
from asyncrl.core.config import Config, ConfigError
from asyncrl.core.wording import count_of

RUN_OUTPUTS = (
    "metrics.jsonl",
    "lag.jsonl",
    "lag_trace.jsonl",
    "lag_histograms.jsonl",
    "summary.json",
    "checkpoint.pt",
)


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
        raise UserError(
            f"run directory {out} already holds a run; choose another --run-dir (or --restart resume / overwrite)"
        )
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
        raise UserError(
            f"run directory {out} holds a run that finished ({summary.get('env_steps', 0):,} env steps); "
            f"--restart overwrite to train again there, or choose another --run-dir"
        )
    if not (out / "config.json").exists():
        raise UserError(
            f"run directory {out} holds a run without config.json, which cannot be resumed; "
            f"--restart overwrite, or choose another --run-dir"
        )
    try:
        saved_res = config_mod.load_resolved(out / "config.json")
    except (ConfigError, ValueError) as exc:
        raise UserError(
            f"run directory {out}: its config.json does not load, so the run cannot be resumed: {exc}"
        ) from None
    for line in saved_res.translated:  # an older run's config.json: keys read under their new names
        click.echo(f"config: {line}", err=True)
    saved = saved_res.config.to_dict()
    ours = cfg.to_dict()
    diff = [
        f"{section}.{key} ({saved[section][key]!r} there, {value!r} now)"
        for section, keys in ours.items()
        for key, value in keys.items()
        if (section, key) != ("run", "run_dir") and saved[section][key] != value
    ]
    if diff:
        raise UserError(
            f"run directory {out} holds a run with another config, which cannot be resumed: "
            f"{', '.join(diff[:3])}{' ...' if len(diff) > 3 else ''}; run the same command, or "
            f"--restart overwrite"
        )
    return out, True


def _restart_option(f):
    return click.option(
        "--restart",
        type=click.Choice(["resume", "overwrite", "refuse"]),
        default="resume",
        show_default=True,
        help="When --run-dir already holds a run: resume it from its checkpoint (if it did not "
        "finish and its config is the same), overwrite it, or refuse.",
    )(f)


def write_config_json(out: Path, res: config_mod.Resolved) -> None:
    """The run's resolved config, how it was resolved (what the user set; overrides of a preset or
    task-kind value; values without effect) and where it ran (code commit, package versions, load)."""
    from asyncrl.core.metrics import RunDirError, write_json_atomic
    from asyncrl.core.provenance import provenance

    try:
        # infinities ("off", e.g. algo.behavior_band) as "inf": strict JSON that config.load reads back
        write_json_atomic(
            out / "config.json",
            {**res.config.to_dict(), "resolution": res.record(), "provenance": provenance()},
            inf_as_text=True,
        )
    except RunDirError as exc:
        raise UserError(f"asyncrl: {exc}") from None


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.run.run_dir) / f"{cfg.env.id}-{cfg.algo.preset}-s{cfg.run.seed}-{stamp}"


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
    from asyncrl.tasks import make_task

    try:
        make_task(cfg).prepare_run(out, click.echo)
    except (OSError, ValueError) as exc:  # a missing model directory, a cache made with other settings
        raise UserError(str(exc)) from None


def summary_line(s: dict, run_dir: Path | None = None) -> str:
    """The outcome line of a run from its summary.json: "done: ..." for a finished run, "interrupted: ..."
    or "failed: ..." otherwise; an interrupted or failed one also names the checkpoint a resume starts
    from and, given ``run_dir``, how to resume (the same command with ``--run-dir``: without it a
    command starts a new, time-stamped directory). An empty ``s`` (no summary was written) gives
    "interrupted: before the run wrote its summary"."""
    if "env_steps" not in s:
        return "interrupted: before the run wrote its summary"
    ret = s.get("final_average_return")
    ret_text = f"{ret:.1f}" if ret is not None else "n/a"
    p50, p95 = s.get("lag_p50"), s.get("lag_p95")
    lag_text = "n/a (no batch trained)" if p50 is None and p95 is None else f"{_num(p50)}/{_num(p95)} versions"
    outcome = s.get("outcome", "finished") or "interrupted"  # an interrupted or failed run says so, not "done"
    head = "done" if outcome == "finished" else outcome
    line = (
        f"{head}: {s['env_steps']:,} env steps in {s['wall_time_s']:.0f} s "
        f"({s['env_steps_per_s']:,.0f}/s), {count_of(s['learner_iterations'], 'learner iteration')}, "
        f"average return {ret_text}, lag p50/p95 {lag_text}"
    )
    ck = s.get("resume_checkpoint")
    if outcome != "finished":
        line += (
            f"; a resume starts from {ck['file']} at {ck['env_steps']:,} env steps (version {ck['version']})"
            if ck
            else "; no checkpoint: a resume starts from scratch"
        )
        if ck and run_dir is not None:
            line += f"; to resume, run the same command with --run-dir {run_dir}"
    return line


def resuming_note(s: dict) -> str:
    """What the "run directory:" line adds on a resume: the checkpoint it starts from, as the
    stopped run's summary.json named it ("resume_checkpoint"), when it did."""
    ck = s.get("resume_checkpoint")
    if not isinstance(ck, dict) or "file" not in ck:
        return " (resuming the run there)"
    return f" (resuming the run there from {ck['file']} at {ck['env_steps']:,} env steps, version {ck['version']})"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:g}"
