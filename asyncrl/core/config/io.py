"""Reading and writing configs: TOML files, a run's config.json, ``--set section.key=value``, and
the description and TOML text that ``asyncrl config show`` prints."""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from asyncrl.core.config.field_meta import ConfigError
from asyncrl.core.config.llm_sections import MOVED_KEYS
from asyncrl.core.config.resolve import Resolved, resolve
from asyncrl.core.config.root import Config, toml_value


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is parsed as a TOML value,
    falling back to a bare string (so ``env.id=Hopper-v5`` works without quotes)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    lhs, rhs = text.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {rhs}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs
    return section, key, value


def load_resolved(
    path: str | Path | None = None, overrides: typing.Iterable[str] = (), extra: dict[str, dict[str, Any]] | None = None
) -> Resolved:
    """Resolve a config from a TOML file (what it names is the user's), or a run directory's
    config.json (a resolved config, taken as it is), then ``extra`` (CLI flags), then ``--set``
    overrides; see :func:`resolve` for the precedence and what is reported. A config.json written
    before keys moved (:data:`MOVED_KEYS`) is read under the new names, and a line of
    :meth:`Resolved.notes` says so; a TOML file, flag or --set naming an old key is refused.

    Raises:
        ConfigError: unreadable file, TOML or JSON syntax error, unknown section/key, wrong type, a
            failed cross-field check, or a preset or task kind changed on a config.json.
    """
    user: dict[str, Any] = {}
    base = record = None
    translated: list[str] = []
    if path is not None:
        data, resolved, record = _section_data(path)
        if resolved:
            data, record, translated = translate_moved_keys(data, record, where=str(path))
        base, user = (data, {}) if resolved else (None, data)
    for section, values in (extra or {}).items():
        if not isinstance(user.setdefault(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table")
        user[section].update(values)
    flagged = {(s, k) for s, kv in (extra or {}).items() for k in kv}
    for text in overrides:  # in order: a later --set of one key wins
        section, key, value = parse_override(text)
        if not isinstance(user.setdefault(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table")
        if (section, key) in flagged and user[section][key] != value:
            raise ConfigError(
                f"{section}.{key} is given twice on one command line, {toml_value(user[section][key])} by "
                f"a flag and {toml_value(value)} by --set: give it once"
            )
        user[section][key] = value
    return resolve(user, base, recorded=record, translated=translated)


def load(
    path: str | Path | None = None, overrides: typing.Iterable[str] = (), extra: dict[str, dict[str, Any]] | None = None
) -> Config:
    """The Config of :func:`load_resolved` (same arguments and errors)."""
    return load_resolved(path, overrides, extra).config


def from_dict(data: dict[str, dict[str, Any]]) -> Config:
    """Rebuild a Config from ``Config.to_dict()`` output (a checkpoint's copy, the learner's welcome):
    a resolved config, taken as it is (no preset or task-kind value re-applied); one written before
    keys moved (:data:`MOVED_KEYS`) is read under the new names. Raises ConfigError."""
    data, _record, _lines = translate_moved_keys(
        {s: v for s, v in data.items() if s not in RUN_RECORD_KEYS}, None, where="a config"
    )
    return resolve({}, {s: dict(v) for s, v in data.items()}).config


def translate_moved_keys(
    data: dict[str, Any], record: dict[str, Any] | None, *, where: str
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """A resolved config written by an older asyncrl (its llm keys under [task]) with those keys
    under their new names (:data:`MOVED_KEYS`), its "resolution" record likewise, and the line that
    says so ([] when nothing moved). Only for resolved configs: a user's file is refused instead.

    Raises:
        ConfigError: ``data`` names a key both under its old and its new name.
    """
    task = data.get("task")
    moved = [k for k in task if f"task.{k}" in MOVED_KEYS] if isinstance(task, dict) else []
    if not moved:
        return data, record, []
    out = {s: dict(v) if isinstance(v, dict) else v for s, v in data.items()}
    if not isinstance(out.setdefault("llm", {}), dict):
        raise ConfigError(f"{where}: [llm] must be a table, got {out['llm']!r}")
    for k in moved:
        section, key = MOVED_KEYS[f"task.{k}"].split(".")
        if key in out[section]:
            raise ConfigError(f"{where} names both task.{k} and its new name {section}.{key}")
        out[section][key] = out["task"].pop(k)
    if record is not None and isinstance(record.get("user"), dict):
        user = {s: dict(v) if isinstance(v, dict) else v for s, v in record["user"].items()}
        for k in [k for k in user.get("task", {}) if f"task.{k}" in MOVED_KEYS]:
            section, key = MOVED_KEYS[f"task.{k}"].split(".")
            user.setdefault(section, {})[key] = user["task"].pop(k)
        record = {**record, "user": {s: kv for s, kv in user.items() if kv}}
    renamed = [f"task.{k} as {MOVED_KEYS[f'task.{k}']}" for k in moved if MOVED_KEYS[f"task.{k}"] != f"llm.{k}"]
    line = (
        f"{where} was written by an older asyncrl: its {len(moved)} language-model keys under [task] are read "
        f"from [llm] ({', '.join(renamed + ['the others under the same name'])})"
    )
    return out, record, [line]


# ---- describing the config: `asyncrl config show` ----


class KeyInfo(typing.NamedTuple):
    section: str
    key: str
    value: Any  # the resolved value
    default: Any  # the dataclass default
    help: str  # one-line meaning (field metadata)
    study_only: bool = False  # an experimental option kept for studies (field metadata)


STUDY_ONLY_HEADING = "study-only (experimental: lag conditions and ablations of the studies, not for training)"


def describe(cfg: Config | None = None) -> list[KeyInfo]:
    """Every key of ``cfg`` (default: the defaults) with its default and one-line meaning, in
    section order; in each section the study-only keys come last. Raises ConfigError if a field
    lacks its help text (a test keeps them all)."""
    cfg = cfg or Config()
    out = []
    for sec in dataclasses.fields(Config):
        values = getattr(cfg, sec.name)
        keys = []
        for f in dataclasses.fields(values):
            if not f.metadata.get("help"):
                raise ConfigError(
                    f"config key {sec.name}.{f.name} has no help text in its section module under asyncrl/core/config/"
                )
            keys.append(
                KeyInfo(
                    sec.name,
                    f.name,
                    getattr(values, f.name),
                    f.default,
                    f.metadata["help"],
                    bool(f.metadata.get("study_only")),
                )
            )
        out += sorted(keys, key=lambda k: k.study_only)  # stable: each group keeps the fields' order
    return out


def to_toml(cfg: Config, *, with_help: bool = True, source: dict[str, str] | None = None) -> str:
    """The resolved config as TOML that :func:`load` reads back; with ``with_help``, each key is
    preceded by a comment line with its meaning, its default (marked when the value differs) and,
    given ``source`` (:attr:`Resolved.source`), the layer its value came from when not the built-in;
    a section's study-only keys follow a heading line, each marked [study-only]."""
    lines: list[str] = []
    section, study_only = None, False
    for k in describe(cfg):
        if k.section != section:
            lines += ([""] if lines else []) + [f"[{k.section}]"]
            section, study_only = k.section, False
        if k.study_only and not study_only and with_help:
            lines.append(f"# --- {STUDY_ONLY_HEADING} ---")
        study_only = k.study_only
        if with_help:
            changed = "" if k.value == k.default else "; CHANGED"
            origin = (source or {}).get(f"{k.section}.{k.key}")
            origin = f"; set by {origin}" if origin and origin != "user" else ""
            mark = "[study-only] " if k.study_only else ""
            lines.append(f"# {mark}{k.help} (default {toml_value(k.default)}{changed}{origin})")
        lines.append(f"{k.key} = {toml_value(k.value)}")
    return "\n".join(lines) + "\n"


def _section_data(path: str | Path) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """(the sections of a TOML config file or a run's config.json, whether it is a resolved config,
    the config.json's "resolution" record or None)."""
    resolved = str(path).endswith(".json")
    try:
        text = Path(path).read_text()
        data = json.loads(text) if resolved else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: invalid {'JSON' if resolved else 'TOML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of config sections")
    recorded = sorted(k for k in RUN_RECORD_KEYS if k in data)
    if recorded and not resolved:
        raise ConfigError(
            f"{path}: [{recorded[0]}] is what a run records in its config.json, not a config setting; "
            f"remove it from the TOML file"
        )
    record = data.get("resolution") if isinstance(data.get("resolution"), dict) else None
    for k in RUN_RECORD_KEYS:  # a run directory's config.json records where it ran and how it was resolved
        data.pop(k, None)
    return data, resolved, record


RUN_RECORD_KEYS = ("provenance", "resolution")
