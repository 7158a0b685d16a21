"""``asyncrl learner-member``: one more member (rank 1 .. W-1) of a learner group
(learner.num_learners = W > 1), beside ``asyncrl learner --group ...`` (rank 0)."""

from __future__ import annotations

import click

from asyncrl.cli.common import RunFailed, UserError, _common, _interrupted, load_config, main
from asyncrl.core import exit_status


@main.command("learner-member")
@_common
@click.option("--rank", type=int, required=True, help="This member's rank, 1 .. learner.num_learners - 1.")
@click.option(
    "--group",
    "group_init",
    required=True,
    help="Where the group meets: the --group given to `asyncrl learner` (file://PATH or tcp://HOST:PORT).",
)
def learner_member(config_file, overrides, rank, group_init):
    """A learner group's member: trains its share of every batch with the group; the learner (rank 0)
    receives the rollouts, publishes the weights and checkpoints (docs/learner-group.md).

    Exit status 0 when the learner ends the run, 1 when the group fails (a member dead or frozen past
    learner.group_timeout_s), 2 refused to start, 130 / 143 interrupted."""
    from asyncrl.core.learner_group import GroupError
    from asyncrl.roles.learner_member import LearnerMember

    exit_status.install_stop_handlers()
    cfg = load_config(config_file, overrides, {}, resolved=True).config
    try:
        role = LearnerMember(cfg, rank=rank, init_method=group_init)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except GroupError as exc:
        raise RunFailed(str(exc)) from None
    try:
        n = role.run()
    except GroupError as exc:
        raise RunFailed(str(exc)) from None
    except KeyboardInterrupt:
        role.close()
        _interrupted(f"learner member {rank}: interrupted")
    finally:
        role.close()
    click.echo(f"learner member {rank}: finished, {n} iterations", err=True)
