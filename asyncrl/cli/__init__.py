"""Command line: ``asyncrl run | learner | learner-member | actor | broadcaster | eval | plot | lag | config
| keys | clean | study | llm``.

One module per command group: :mod:`.run`, :mod:`.roles` (learner, actor, broadcaster, keys),
:mod:`.learner_member`,
:mod:`.results` (lag, eval, plot), :mod:`.config_cmd`, :mod:`.clean`, :mod:`.study`; what they share
is in :mod:`.common` (the click group ``main``, errors, config loading) and :mod:`.rundir` (run
directories, the outcome line). ``python -m asyncrl`` runs ``main`` (asyncrl.__main__).

Shell completion (click): ``eval "$(_ASYNCRL_COMPLETE=bash_source asyncrl)"`` in ~/.bashrc
(``zsh_source`` / ``fish_source`` for zsh and fish)."""

from __future__ import annotations

from asyncrl.cli import clean, config_cmd, learner_member, results, roles, run, study  # noqa: F401 - each adds its commands to main
from asyncrl.cli.common import RunFailed, UserError, load_config, main
from asyncrl.cli.llm import llm as _llm_group  # imports transformers only when a command runs
from asyncrl.cli.rundir import holds_run, prepare_run_dir, summary_line, write_config_json

main.add_command(_llm_group)

__all__ = [
    "main",
    "UserError",
    "RunFailed",
    "load_config",
    "holds_run",
    "prepare_run_dir",
    "summary_line",
    "write_config_json",
]
