"""Resolving a config: the precedence layers, type checks of what the user set, and the notes (a
user value that replaces a task-kind or preset value, or that has no effect)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from asyncrl.core.config.algo_section import AlgoConfig
from asyncrl.core.config.field_meta import LLM_PRESETS, PRESET_SETTINGS, PRESETS, REMOVED_KEYS, ConfigError
from asyncrl.core.config.llm_sections import MOVED_KEYS, TaskConfig
from asyncrl.core.config.root import Config, toml_value
from asyncrl.core.config.validate import validate


def _section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return tuple(_coerce(f"{where}[{i}]", v, elem) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{where}: unsupported annotation {annotation}")  # not used
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str) and value in (
            "inf",
            "-inf",
        ):  # config.json's spelling (asyncrl.core.metrics.strict_json)
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported annotation {annotation}")


# ---- resolving a config: the layers, and what the user set ----

# Precedence, lowest first (docs/configuration.md): the built-in defaults of the dataclasses above <
# TASK_KIND_SETTINGS[task.kind] < PRESET_SETTINGS[algo.preset] < what the user set (config file, CLI
# flags, --set). A user value that differs from a task-kind or preset value wins and is reported
# (Resolved.overridden); a user value that the preset or task kind does not use is reported too
# (Resolved.unused). A resolved config (a run's config.json) is taken as it is over the layers (which
# give only the keys it lacks), and what the user sets on it is reported against it the same way.
TASK_KIND_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    # Settings for a pretrained language model (docs/decisions/llm-defaults.md): advantages are
    # group-normalised already (a per-minibatch normalisation of token advantages breaks the group's zero
    # mean and averaging weights); one optimizer step per batch at GRPO's usual learning rate (TRL's
    # GRPOConfig and prime-rl default to 1e-6; larger updates lost the tiny model's accuracy), constant, with
    # the gradient clipped at 1.0. The tiny demo's config (configs/gsm-tiny.toml) sets its own values.
    "llm": {
        "algo": {
            "normalize_advantages": False,
            "lr": 1e-6,
            "num_epochs": 1,
            "num_minibatches": 1,
            "anneal_lr": False,
            "max_grad_norm": 1.0,
        },
        # the learner answers heartbeats between iterations, and a language model's iteration takes seconds
        # to minutes on a CPU: at 10 s both gsm-tiny actors rejoined 14 times in a loaded run
        "transport": {"actor_timeout_s": 120.0},
    },
}


class Resolved(typing.NamedTuple):
    """A resolved config and how it was resolved.

    config: the Config. user: {section: {key: value}} as the user set them (file, flags, --set).
    source: {"section.key": the layer that set it, "task kind K", "preset P", "user", or "resolved config"
    (taken from a config.json); keys at their built-in default are absent}.
    overridden: lines, one per user value that replaced a task-kind or preset value.
    unused: lines, one per user value (other than the default it would have) that the chosen preset or
    task kind does not use: it has no effect.
    """

    config: Config
    user: dict[str, dict[str, Any]]
    source: dict[str, str]
    overridden: list[str]
    unused: list[str]
    recorded: dict[str, Any] | None = None  # the "resolution" a resolved base (config.json) carried
    translated: tuple[str, ...] = ()  # lines: keys of an older config.json read under their new names

    def notes(self) -> list[str]:
        """The lines to show once at start (translated keys, then overrides, then unused values)."""
        return list(self.translated) + self.overridden + self.unused

    def record(self) -> dict[str, Any]:
        """For config.json's "resolution": what the user set, and the lines above (for a config
        resolved from a config.json: that file's record, with what the user set on top of it)."""
        if self.recorded is not None:
            user = {s: {**self.recorded.get("user", {}).get(s, {}), **kv} for s, kv in self.user.items()}
            return {**self.recorded, "user": {s: kv for s, kv in user.items() if kv}}
        return {
            "precedence": "built-in < task kind < preset < user",
            "user": {s: kv for s, kv in self.user.items() if kv},
            "overridden": self.overridden,
            "unused": self.unused,
        }


_MISSING = object()


def _layers(preset: str, kind: str) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    return [
        (f"task kind {kind}", TASK_KIND_SETTINGS.get(kind, {})),
        (f"preset {preset}", {"algo": PRESET_SETTINGS.get(preset, {})}),
    ]


def _check_sections(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``data`` with every section a table of known, type-checked keys; raises ConfigError."""
    sections = _section_types()
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"unknown config section [{unknown[0]}]; sections are {sorted(sections)}")
    out = {}
    for name, cls in sections.items():
        raw = data.get(name, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"[{name}] must be a table, got {raw!r}")
        hints = typing.get_type_hints(cls)
        moved = sorted(f"{name}.{k}" for k in raw if f"{name}.{k}" in MOVED_KEYS)
        if moved:
            raise ConfigError(
                f"config key {moved[0]} moved to {MOVED_KEYS[moved[0]]}: the language-model task's "
                f"keys are in [{MOVED_KEYS[moved[0]].split('.')[0]}]"
            )
        removed = sorted(f"{name}.{k}" for k in raw if f"{name}.{k}" in REMOVED_KEYS)
        if removed:
            raise ConfigError(f"config key {removed[0]} was removed: {REMOVED_KEYS[removed[0]]}")
        bad = sorted(set(raw) - set(hints))
        if bad:
            raise ConfigError(f"unknown config key {name}.{bad[0]}; keys of [{name}] are {sorted(hints)}")
        out[name] = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in raw.items()}
    return out


def resolve(
    user: dict[str, Any],
    base: dict[str, Any] | None = None,
    *,
    check: bool = True,
    recorded: dict[str, Any] | None = None,
    translated: typing.Sequence[str] = (),
) -> Resolved:
    """Resolve a config from what the user set, by the precedence above.

    Args:
        user: {section: {key: value}}: what a config file, CLI flags and --set name.
        base: a resolved config ({section: {key: value}}, e.g. a run's config.json) taken as it is
            under ``user``, instead of the layers; keys it lacks (older files) come from the layers.
        check: run :func:`asyncrl.core.config.validate.validate` (the cross-field checks).
        recorded: the "resolution" record that came with ``base`` (kept in :meth:`Resolved.record`).
        translated: lines saying which keys of an older ``base`` were read under their new names.

    Raises:
        ConfigError: unknown section or key (or one that moved: :data:`MOVED_KEYS`), wrong type, a
            failed cross-field check, or ``user``
            changing algo.preset or task.kind of a resolved ``base`` (its other keys were resolved for
            the old ones).
    """
    user = _check_sections(user)
    base = _check_sections(base) if base is not None else None
    merged = {s: {**(base or {}).get(s, {}), **user[s]} for s in user}
    preset = merged["algo"].get("preset", AlgoConfig.preset)
    kind = merged["task"].get("kind", TaskConfig.kind)
    if base is not None:
        for s, k in (("algo", "preset"), ("task", "kind")):
            if k in user[s] and k in base[s] and user[s][k] != base[s][k]:
                raise ConfigError(
                    f"{s}.{k} cannot change on a resolved config (a run's config.json: its other keys "
                    f"were resolved for {s}.{k} = {base[s][k]!r}); start from a TOML config file"
                )
    values: dict[str, dict[str, Any]] = {s: {} for s in user}
    source: dict[str, str] = {}
    for layer, settings in _layers(preset, kind):  # under a resolved base too: for the keys it lacks
        for s, kv in settings.items():
            for k, v in kv.items():
                values[s][k], source[f"{s}.{k}"] = v, layer
    for s, kv in (base or {}).items():
        for k, v in kv.items():
            if values[s].get(k, _MISSING) != v:  # a value equal to its layer's keeps that layer as its source
                values[s][k], source[f"{s}.{k}"] = v, "resolved config"
    layered = {s: dict(kv) for s, kv in values.items()}  # what a key is without the user
    overridden = []
    for s, kv in user.items():
        for k, v in kv.items():
            where = f"{s}.{k}"
            if where in source and values[s][k] != v:
                by = "the resolved config (config.json)" if source[where] == "resolved config" else source[where]
                overridden.append(f"{where} = {toml_value(v)} overrides {by}'s {toml_value(values[s][k])}")
            if where not in source or values[s][k] != v:  # a user value equal to the layer's leaves it the source
                values[s][k], source[where] = v, "user"
    cfg = Config(**{s: cls(**values[s]) for s, cls in _section_types().items()})
    if check:
        validate(cfg)
    defaults = Config().to_dict()
    unused = [
        f"{s}.{k} = {toml_value(v)} has no effect: {why}"
        for s, kv in user.items()
        for k, v in kv.items()
        if v != layered[s].get(k, defaults[s][k])
        for why in [unused_reason(cfg, s, k)]
        if why
    ]
    if base is not None and recorded is None:
        recorded = {}
    return Resolved(cfg, user, source, overridden, unused, recorded, tuple(translated))


def unused_reason(cfg: Config, section: str, key: str) -> str:
    """'' if ``cfg``'s preset and task kind use ``section.key`` (its field metadata), else why not."""
    f = {f.name: f for f in dataclasses.fields(getattr(cfg, section))}[key]
    kinds, presets, when = f.metadata["kinds"], f.metadata["presets"], f.metadata["when"]
    if cfg.task.kind not in kinds:
        return f"task.kind = {cfg.task.kind} does not use it (used by task kinds: {', '.join(kinds)})"
    if presets is not None and cfg.algo.preset not in presets:
        users = ", ".join(p for p in presets if p in (PRESETS if cfg.task.kind == "control" else LLM_PRESETS))
        return f"preset {cfg.algo.preset} does not use it (used by: {users or 'the other task kind'})"
    if when is not None and not when[1](cfg):
        return f"used only when {when[0]}"
    return ""
