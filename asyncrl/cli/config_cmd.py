"""``asyncrl config show``: the resolved config."""

from __future__ import annotations

import click

from asyncrl.cli.common import _common, load_config, main
from asyncrl.core import config as config_mod


@main.group("config")
def config_cmd():
    """The configuration: every key, its default and its meaning."""


@config_cmd.command("show")
@_common
@click.option(
    "--preset",
    help=f"Show this preset's config (config algo.preset): {', '.join(config_mod.PRESETS)}; "
    f"task.kind = llm: {', '.join(config_mod.LLM_PRESETS)}.",
)
def config_show(config_file, overrides, preset):
    """Print the resolved config as TOML (usable with --config), each key with its meaning, its default
    and the layer that set it. Precedence, lowest first: built-in defaults < task kind < preset < your
    config file, flags and --set; lines before the keys say which of your values override a preset or
    task-kind value and which have no effect. Study-only options (experimental: the studies' lag
    conditions and ablations) come last in their section, each marked [study-only]."""
    res = load_config(config_file, overrides, {("algo", "preset"): preset}, env=False, resolved=True, notes=False)
    head = ["# asyncrl config: built-in defaults < task kind < preset < your config file and --set"]
    head += [f"# {line}" for line in res.notes()]
    click.echo("\n".join(head) + "\n\n" + config_mod.to_toml(res.config, source=res.source), nl=False)
