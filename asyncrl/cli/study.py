"""``asyncrl study``: run a study's grid of cells (resumable) and report it; pack or alias its cells."""

from __future__ import annotations

from pathlib import Path

import click

from asyncrl.cli.common import UserError, _interrupted, main
from asyncrl.core import exit_status
from asyncrl.core.wording import count_of


@main.command()
@click.argument("study_file", type=click.Path(dir_okay=False))
@click.option(
    "--jobs",
    type=int,
    default=1,
    show_default=True,
    help="Serial cells run this many at a time (one core each); multi-process cells run alone.",
)
@click.option("--out", type=click.Path(file_okay=False), help="Results directory (default studies/NAME).")
@click.option("--total-steps", type=int, help="Override the study's env-step budget (smoke runs).")
@click.option("--seeds", help="Override the study's seeds, e.g. 1,2 (smoke runs).")
@click.option("--envs", help="Override the study's envs, e.g. asyncrl/Corridor-v0 (smoke runs).")
@click.option("--presets", "only_presets", help="Only the cells of these presets, e.g. vaco,ppo.")
@click.option("--conditions", "only_conditions", help="Only the cells of these lag conditions, e.g. none,age-8.")
@click.option("--retry-failed", is_flag=True, help="Run again the cells whose record says failed.")
@click.option(
    "--any-code",
    is_flag=True,
    help="With --report-only: also report cells finished under other training code (marked).",
)
@click.option("--dry-run", is_flag=True, help="List the cells and which are finished; run nothing.")
@click.option("--report-only", is_flag=True, help="Write the results table and report from finished cells only.")
@click.option(
    "--launcher",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Run the cells on this machine, or as Ray tasks on a cluster (--jobs cells in flight).",
)
@click.option(
    "--address",
    "ray_address",
    help="--launcher ray: the Ray cluster, e.g. 10.0.0.1:6379 (default: a local one for this study).",
)
@click.option(
    "--archive",
    is_flag=True,
    help="Pack the finished cells' records into OUT/cells.tar.xz (read in place by --report-only and "
    "a resumed study); run nothing.",
)
@click.option(
    "--alias-code",
    "alias_revision",
    metavar="REV",
    help="Let the cells finished under git revision REV's training code count as this checkout's, "
    "if the two differ only by modules moved (checked; refused otherwise); run nothing.",
)
def study(
    study_file,
    jobs,
    out,
    total_steps,
    seeds,
    envs,
    only_presets,
    only_conditions,
    retry_failed,
    any_code,
    dry_run,
    report_only,
    launcher,
    ray_address,
    archive,
    alias_revision,
):
    """Run a grid of envs x presets x lag conditions x seeds (resumable) and report it.

    Finished cells (same study, resolved config and training code) are skipped, so a killed
    study re-run continues. Writes OUT/results.json, results.csv, report.md and plots/.
    """
    from asyncrl.analysis.study import Runner, StudyError, load_study
    from asyncrl.analysis.study_report import write_report

    try:
        seed_list = [int(x) for x in seeds.split(",")] if seeds else None
    except ValueError:
        raise UserError(f"--seeds expects integers separated by commas, got {seeds!r}") from None
    try:
        st = load_study(
            study_file,
            total_env_steps=total_steps,
            seeds=seed_list,
            envs=envs.split(",") if envs else None,
            presets=only_presets.split(",") if only_presets else None,
            conditions=only_conditions.split(",") if only_conditions else None,
        )
        runner = Runner(
            st, Path(out or Path("studies") / st.name), jobs=jobs, echo=click.echo, retry_failed=retry_failed
        )
    except StudyError as exc:
        raise UserError(str(exc)) from None
    if archive:
        in_archive, packed = runner.store.pack()
        click.echo(
            f"packed {count_of(packed, 'cell record')} into {runner.store.archive_path} "
            f"({count_of(in_archive, 'cell')} in it)"
        )
        return
    if alias_revision:
        _alias(runner, alias_revision)
        return
    if dry_run:
        seen: set[str] = set()
        for c in st.cells:
            state = "finished" if runner.finished(c) is not None else "pending"
            shared = " | the same run as an earlier cell" if runner.keys[c] in seen else ""
            seen.add(runner.keys[c])
            click.echo(
                f"{state:8} {runner.keys[c]} {c.label} | {c.env} | {c.condition} | seed {c.seed} | {c.mode}{shared}"
            )
        return
    if not report_only:
        exit_status.install_stop_handlers()
        if launcher == "ray":
            from asyncrl.analysis.study_ray import RayCells
            from asyncrl.run.ray_cluster import LauncherError

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
    records = runner.finished_records(any_code=any_code and report_only)
    if report_only and not records and (runner.out / "report.md").exists():
        raise UserError(
            f"no cell of this selection has finished in {runner.out}, so its report.md is left as it is; "
            "--report-only takes the same --envs/--seeds/--presets/--conditions/--total-steps as the run "
            "(and --any-code for cells finished under other training code)"
        )
    results = write_report(st, records, runner.out)
    click.echo(
        f"report: {runner.out / 'report.md'} ({len(results['cells'])} of {count_of(len(st.cells), 'cell')} finished)"
    )


def _alias(runner, revision: str) -> None:
    """--alias-code REV: record REV's training-code fingerprint as this checkout's (modules moved only)."""
    from asyncrl.analysis.study_code import AliasError, alias_check

    try:
        entry = alias_check(revision)
    except AliasError as exc:
        raise UserError(str(exc)) from None
    if entry["old"] == entry["new"]:
        click.echo(
            f"revision {entry['revision'][:12]} has this checkout's training code ({entry['new']}): nothing to alias"
        )
        return
    runner.store.add_alias({**entry, "checked": "modules moved, syntax trees unchanged (asyncrl.analysis.study_code)"})
    carried = sum(r.get("code_fingerprint") == entry["old"] for r in runner.store.records().values())
    click.echo(
        f"aliased training code {entry['old']} (revision {entry['revision'][:12]}) to {entry['new']}: "
        f"{count_of(carried, 'finished cell')} of {runner.out} ran under it"
    )
