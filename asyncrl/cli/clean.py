"""``asyncrl clean``: remove what killed runs left behind."""

from __future__ import annotations

import click

from asyncrl.cli.common import main


@main.command()
@click.option("--run-id", help="Remove this run's segments (default: those of dead processes).")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
def clean(run_id, dry_run):
    """Remove shared-memory segments left by killed runs and, without --run-id, the weights secrets
    of killed broadcasters (files of ports no socket listens on) and the private endpoint
    directories of killed `asyncrl run`s (no socket in them accepts a connection)."""
    from asyncrl.run.launch import remove_stale_endpoint_dirs
    from asyncrl.wire.shm.dev_shm import cleanup_stale, remove_run
    from asyncrl.wire.weights_secret import remove_stale_weights_secrets

    verb = "would remove" if dry_run else "removed"
    removed = remove_run(run_id, dry_run=dry_run) if run_id else cleanup_stale(dry_run=dry_run)
    click.echo(f"{verb} {len(removed)} segment(s)" + (": " + ", ".join(removed) if removed else ""))
    if not run_id:
        secrets_removed = remove_stale_weights_secrets(dry_run=dry_run)
        click.echo(
            "weights secrets: listening ports unknown (no /proc/net/tcp), none removed"
            if secrets_removed is None
            else f"{verb} {len(secrets_removed)} stale weights secret(s)"
            + (": " + ", ".join(secrets_removed) if dry_run and secrets_removed else "")
        )
        dirs = remove_stale_endpoint_dirs(dry_run=dry_run)
        click.echo(
            f"{verb} {len(dirs)} stale endpoint director{'y' if len(dirs) == 1 else 'ies'}"
            + (": " + ", ".join(dirs) if dry_run and dirs else "")
        )
