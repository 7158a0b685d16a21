"""A study file (TOML; configs/studies/ has examples) and the cells it names.

    name = "quick"                      # results go to studies/<name>/ unless --out says otherwise
    total_env_steps = 500000
    seeds = [101, 102, 103, 104, 105]
    envs = ["HalfCheetah-v5", "Hopper-v5"]
    config = "configs/default.toml"     # optional base config; `set` adds overrides for every cell
    set = ["run.log_every_s=60"]
    [reference]                         # fixed before the study runs: normalised score 1 (STUDY.md)
    "HalfCheetah-v5" = 1443.0
    [modes]                             # optional: split between an env's low and high mode
    "HalfCheetah-v5" = 3000.0
    [traces]                            # optional: lag traces the replay-NAME conditions replay (paths
                                        # as config's: the working directory's, else the study file's)
    main = "bench/results/lag-traces/main-job-halfcheetah.jsonl"
    [[arm]]                             # cells = envs x presets x conditions x sweep x seeds
    presets = ["vaco", "ppo"]           # (an arm may name its own envs and seeds)
    conditions = ["none", "age-8", "async-2", "straggler"]
    [[arm]]
    name = "delta"                      # label prefix (default: the preset)
    presets = ["vaco"]
    conditions = ["age-8"]
    sweep = {"algo.tv_threshold" = [0.05, 0.1, 0.2]}

Lag conditions (STUDY.md): ``none`` (serial), ``age-K`` (policy-age buffer K, serial),
``delay-K`` (policy delay K, serial), ``async-N`` (multi-process, N actors), ``straggler`` or
``straggler-N-S`` (multi-process, N actors, actor0 slowed by S seconds per rollout; default 2, 0.2),
``replay-NAME`` (serial, the lag trace ``traces.NAME`` replayed rollout by rollout: a real run's lag
without its scheduling noise; asyncrl.core.lag_trace). A cell's key holds the trace's sha256, so a
changed trace file runs its cells again.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.core import config as config_mod
from asyncrl.core.lag_trace import DIGEST_MARK, LagTraceError, read_lag_trace, split_digest, trace_digest

CONDITION = re.compile(
    r"^(none|age-(\d+)|delay-(\d+)|async-(\d+)|straggler(?:-(\d+)-([0-9.]+))?|replay-([A-Za-z0-9_.]+))$"
)
STUDY_KEYS = {
    "name",
    "total_env_steps",
    "seeds",
    "envs",
    "config",
    "set",
    "reference",
    "modes",
    "arm",
    "random_episodes",
    "compare",
    "traces",
}
ARM_KEYS = {"name", "presets", "conditions", "set", "sweep", "envs", "seeds"}


# What a cell takes from the study's own fields; a set or sweep naming one would run another cell than
# the one recorded (its preset, env, seed, budget or lag condition in the results).
CELL_IDENTITY = {
    "env.id": "envs",
    "algo.preset": "presets",
    "run.seed": "seeds",
    "run.total_env_steps": "total_env_steps",
    "actor.policy_age_buffer": "conditions (age-K)",
    "actor.policy_delay": "conditions (delay-K)",
    "actor.lag_trace": "conditions (replay-NAME)",
    "run.straggler_slowdown_s": "conditions (straggler-N-S)",
}


class StudyError(ValueError):
    """A study file is wrong; the message names the field."""


def condition_settings(name: str, traces: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(mode, overrides) of a lag condition: mode is "serial" or "multiprocess". ``traces``: the
    study's trace files by name (for replay-NAME).

    Raises:
        StudyError: an unknown condition name, a replay of a trace the study does not name, or a
            trace that cannot be read.
    """
    m = CONDITION.match(name)
    if not m:
        raise StudyError(
            f"unknown lag condition {name!r}; use none, age-K, delay-K, async-N, straggler[-N-S], replay-NAME"
        )
    if m.group(7):
        path = (traces or {}).get(m.group(7))
        if path is None:
            raise StudyError(f"lag condition {name!r}: the study names no trace {m.group(7)!r} under [traces]")
        try:
            read_lag_trace(path)
            digest = trace_digest(path)
        except LagTraceError as exc:
            raise StudyError(f"lag condition {name!r}: {exc}") from None
        return "serial", [f"actor.lag_trace={path}{DIGEST_MARK}{digest}"]
    if name == "none":
        return "serial", []
    if m.group(2):
        return "serial", [f"actor.policy_age_buffer={int(m.group(2))}"]
    if m.group(3):
        return "serial", [f"actor.policy_delay={int(m.group(3))}"]
    if m.group(4):
        return "multiprocess", [f"run.num_actors={int(m.group(4))}"]
    actors, slow = (int(m.group(5)), float(m.group(6))) if m.group(5) else (2, 0.2)
    return "multiprocess", [f"run.num_actors={actors}", f"run.straggler_slowdown_s={slow}"]


@dataclass(frozen=True)
class Cell:
    label: str  # the arm's name (or preset) plus its sweep values
    env: str
    preset: str
    condition: str
    seed: int
    overrides: tuple[str, ...]  # study + arm + sweep + condition settings, in that order
    mode: str  # "serial" or "multiprocess"
    total_env_steps: int
    config_file: str | None = None
    swept: tuple[str, ...] = ()  # the config keys of its arm's sweep

    def command(self, run_dir: Path) -> list[str]:
        """The `asyncrl run` command line of this cell."""
        cmd = [
            sys.executable,
            "-m",
            "asyncrl",
            "run",
            *(["--serial"] if self.mode == "serial" else []),
            "--env",
            self.env,
            "--preset",
            self.preset,
            "--seed",
            str(self.seed),
            "--total-steps",
            str(self.total_env_steps),
            "--run-dir",
            str(run_dir),
        ]
        if self.config_file:
            cmd += ["--config", self.config_file]
        for o in self.overrides:
            cmd += ["--set", o]
        return cmd + self._absolute_paths()

    def _absolute_paths(self) -> list[str]:
        """A cell runs in its own directory, so its relative paths are made absolute against the
        study's working directory: a replayed lag trace (actor.lag_trace), and an llm cell's
        llm.cache_dir and llm.model_dir (every cell then shares one cached warm-up). Command line
        only: the cell's key keeps the paths as the study file gives them."""
        resolved = self.resolved_config()
        out = []
        trace, digest = split_digest(resolved["actor"]["lag_trace"])
        if trace and not Path(trace).is_absolute():
            out += ["--set", f"actor.lag_trace={Path(trace).resolve()}{DIGEST_MARK + digest if digest else ''}"]
        if resolved["task"]["kind"] != "llm":
            return out
        llm = resolved["llm"]
        return out + [
            a
            for key in ("cache_dir", "model_dir")
            if llm[key] and not Path(llm[key]).is_absolute()
            for a in ("--set", f"llm.{key}={Path(llm[key]).resolve()}")
        ]

    def _resolved(self) -> config_mod.Resolved:
        given: dict[str, str] = {}
        for text in self.overrides:  # the study's set, the arm's set, the sweep: one value per key
            key, _, value = text.partition("=")
            if key in given and given[key] != value:
                raise config_mod.ConfigError(f"{key} is given twice ({given[key]} and {value}): give it once")
            given[key] = value
        return config_mod.load_resolved(
            self.config_file,
            self.overrides,
            {
                "env": {"id": self.env},
                "algo": {"preset": self.preset},
                "run": {"seed": self.seed, "total_env_steps": self.total_env_steps},
            },
        )

    def unused_keys(self) -> dict[str, str]:
        """{"section.key": the line saying why it has no effect} for the values this cell sets that its
        preset or task kind does not use."""
        return {line.split(" = ", 1)[0]: line for line in self._resolved().unused}

    def resolved_config(self) -> dict:
        d = self._resolved().config.to_dict()
        for k in ("run_dir", "log_every_s"):  # where and how often it logs: not the outcome
            d["run"].pop(k, None)
        d.pop("transport", None)
        return d


@dataclass
class Study:
    name: str
    path: Path
    cells: list[Cell]
    reference: dict[str, float] = field(default_factory=dict)
    modes: dict[str, float] = field(default_factory=dict)
    random_episodes: int = 10
    compare: list[tuple[str, str]] = field(default_factory=list)


def _list(where: str, value, kind) -> list:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
    ):
        raise StudyError(f"{where} must be a non-empty list of {kind.__name__}, got {value!r}")
    return value


def load_study(
    path: str | Path,
    *,
    total_env_steps: int | None = None,
    seeds: list[int] | None = None,
    envs: list[str] | None = None,
    presets: list[str] | None = None,
    conditions: list[str] | None = None,
) -> Study:
    """Parse a study file into its cells; the keyword arguments shrink it (smoke runs).

    Raises:
        StudyError: unreadable file, unknown key, wrong type, unknown condition, or a cell whose
            config is invalid (the message names the cell).
    """
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{path}: invalid TOML: {exc}") from None
    bad = sorted(set(data) - STUDY_KEYS)
    if bad:
        raise StudyError(f"{path}: unknown study key {bad[0]!r}; keys are {sorted(STUDY_KEYS)}")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise StudyError(f"{path}: name must be letters, digits, '_', '.', '-', got {name!r}")
    steps = total_env_steps or data.get("total_env_steps", 1_000_000)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise StudyError(f"{path}: total_env_steps must be a positive integer, got {steps!r}")
    all_seeds = seeds or _list("seeds", data.get("seeds", [1]), int)
    all_envs = envs or _list("envs", data.get("envs", ["HalfCheetah-v5"]), str)
    common = _list("set", data["set"], str) if "set" in data else []
    traces = data.get("traces", {})
    if not isinstance(traces, dict) or not all(isinstance(v, str) for v in traces.values()):
        raise StudyError(f'{path}: traces must be a table of NAME = "path of a lag trace"')
    # like config: relative to the working directory, else to the study file's directory
    traces = {k: v if Path(v).is_absolute() or Path(v).exists() else str(path.parent / v) for k, v in traces.items()}
    cfg_file = data.get("config")
    if cfg_file is not None:
        cfg_file = str(
            (path.parent / cfg_file) if not Path(cfg_file).is_absolute() and not Path(cfg_file).exists() else cfg_file
        )
    arms = data.get("arm")
    if not isinstance(arms, list) or not arms:
        raise StudyError(f"{path}: a study needs at least one [[arm]]")
    cells: list[Cell] = []
    only_presets, only_conditions = set(presets or ()), set(conditions or ())
    for i, arm in enumerate(arms):
        where = f"{path}: arm {i + 1}"
        bad = sorted(set(arm) - ARM_KEYS)
        if bad:
            raise StudyError(f"{where}: unknown key {bad[0]!r}; keys are {sorted(ARM_KEYS)}")
        arm_presets = _list(f"{where}: presets", arm.get("presets"), str)
        arm_conditions = _list(f"{where}: conditions", arm.get("conditions", ["none"]), str)
        arm_set = _list(f"{where}: set", arm["set"], str) if "set" in arm else []
        sweep = arm.get("sweep", {})
        if not isinstance(sweep, dict):
            raise StudyError(f"{where}: sweep must be a table of key = [values]")
        axes = [[(k, v) for v in _list(f"{where}: sweep.{k}", vals, object)] for k, vals in sweep.items()]
        for what, keys in (("set", [o.partition("=")[0].strip() for o in common + arm_set]), ("sweep", list(sweep))):
            for key in keys:
                if key in CELL_IDENTITY:
                    raise StudyError(
                        f"{where}: {what} names {key}, which each cell takes from the study's "
                        f"{CELL_IDENTITY[key]}; the cells would run with another value than they record"
                    )
        arm_envs = envs or (_list(f"{where}: envs", arm["envs"], str) if "envs" in arm else all_envs)
        arm_seeds = seeds or (_list(f"{where}: seeds", arm["seeds"], int) if "seeds" in arm else all_seeds)
        for env, preset, cond, combo in itertools.product(
            arm_envs, arm_presets, arm_conditions, itertools.product(*axes)
        ):
            if (only_presets and preset not in only_presets) or (only_conditions and cond not in only_conditions):
                continue
            mode, cond_set = condition_settings(cond, traces)
            swept = [f"{k}={json.dumps(v)}" for k, v in combo]
            label = " ".join(
                [
                    arm.get("name", preset)
                    if len(arm_presets) == 1 or "name" not in arm
                    else f"{arm['name']}:{preset}",
                    *(f"{k.split('.')[-1]}={v}" for k, v in combo),
                ]
            )
            for seed in arm_seeds:
                cells.append(
                    Cell(
                        label,
                        env,
                        preset,
                        cond,
                        int(seed),
                        tuple(common + arm_set + swept + cond_set),
                        mode,
                        steps,
                        cfg_file,
                        tuple(sweep),
                    )
                )
    if not cells:
        raise StudyError(f"{path}: no cell matches the given presets / conditions")
    checked = set()
    for c in cells:  # one check per (arm, env, preset, condition, sweep)
        if (c.label, c.env, c.preset, c.condition) in checked:
            continue
        checked.add((c.label, c.env, c.preset, c.condition))
        try:
            unused = c.unused_keys()
        except config_mod.ConfigError as exc:
            raise StudyError(f"{path}: cell {c.label} / {c.env} / {c.condition}: {exc}") from None
        swept = [k for k in unused if k in c.swept]
        if swept:
            raise StudyError(
                f"{path}: cell {c.label} / {c.env} / {c.condition}: the sweep of {swept[0]} has no effect there "
                f"({unused[swept[0]]}): its cells would be the same run"
            )
    # interleave: seed-major, so a partial study holds every arm's first seeds
    order = {s: k for k, s in enumerate(dict.fromkeys([*all_seeds, *(c.seed for c in cells)]))}
    cells.sort(key=lambda c: order[c.seed])
    return Study(name, path, cells, **_report_keys(path, data, cells))


def _report_keys(path: Path, data: dict, cells: list[Cell]) -> dict:
    """The study's report settings, checked at load (not after its cells have run): reference and
    modes are {env of the study: number}, compare pairs name the study's cell labels, random_episodes
    is an integer >= 1. Raises StudyError."""
    # the file's own envs: a smoke run's --envs narrows the cells, not what the file may name
    envs = {c.env for c in cells} | {e for e in data.get("envs", ["HalfCheetah-v5"]) if isinstance(e, str)}
    labels, conditions = {c.label for c in cells}, {c.condition for c in cells}
    out: dict = {}
    for key in ("reference", "modes"):
        table = data.get(key, {})
        if not isinstance(table, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in table.values()
        ):
            raise StudyError(f"{path}: {key} must be a table of env = number, got {table!r}")
        stray = sorted(set(table) - envs)
        if stray:
            raise StudyError(f"{path}: {key} names {stray[0]!r}, not an env of the study ({sorted(envs)})")
        out[key] = {k: float(v) for k, v in table.items()}
    episodes = data.get("random_episodes", 10)
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise StudyError(f"{path}: random_episodes must be an integer >= 1, got {episodes!r}")
    out["random_episodes"] = episodes
    compare = data.get("compare", [])
    if not isinstance(compare, list):
        raise StudyError(f"{path}: compare must be a list of [label, label] pairs, got {compare!r}")
    for pair in compare:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise StudyError(f"{path}: compare entries must be [label, label] pairs, got {pair!r}")
        for side in pair:  # LABEL, or LABEL@CONDITION (that side at one lag condition)
            label, at, cond = side.partition("@")
            if label not in labels or (at and cond not in conditions):
                raise StudyError(
                    f"{path}: compare names {side!r}: the study's cell labels are {sorted(labels)} "
                    f"and its conditions {sorted(conditions)} (LABEL or LABEL@CONDITION)"
                )
    out["compare"] = [tuple(p) for p in compare]
    return out
