"""Configuration: frozen dataclasses per concern, loaded from TOML plus ``--set a.b=v`` overrides.

Defaults live in the section modules (the single source of truth); ``configs/default.toml`` lists those
that no preset or task kind sets, and is checked against them by a test. Precedence, lowest first:
built-in defaults < task-kind settings < preset pins < what the user set (:func:`resolve`); a user
value that replaces a pin, or that the chosen preset or task kind does not use, is reported.
Every unknown section or key, every value of the wrong type and every unknown preset raises
:class:`ConfigError` with one line naming it; a key that moved (:data:`MOVED_KEYS`, e.g.
``task.model`` -> ``llm.model_dir``) is refused with a line naming its new name, except in a run's
config.json written before the move, which is read under the new names with a line saying so.

Modules: the sections, one module per group (:mod:`.control_sections`: env, policy;
:mod:`.algo_section`; :mod:`.role_sections`: actor, learner, transport, run; :mod:`.llm_sections`: task,
llm), :mod:`.root` (the whole :class:`Config`), :mod:`.field_meta` (field metadata, value names, preset
pins), :mod:`.resolve` (precedence layers, notes), :mod:`.validate` (cross-field checks), :mod:`.io`
(TOML / JSON, ``--set``, the text of ``asyncrl config show``). The package imports neither the wire nor a task.
"""

from asyncrl.core.config.algo_section import AlgoConfig
from asyncrl.core.config.control_sections import EnvConfig, PolicyConfig
from asyncrl.core.config.field_meta import (
    BAND_RATIOS,
    CONTROL,
    DEVICE_RE,
    FILTER_TRIGGERS,
    LAUNCHERS,
    LLM,
    LLM_ANSWER_FORMATS,
    LLM_AVERAGING,
    LLM_EVAL_MODES,
    LLM_PRESETS,
    LLM_PROMPT_FORMATS,
    LLM_REALIGN,
    LLM_SILENT_GROUPS,
    LLM_TRUNCATED_REWARD,
    NOT_IMPALA,
    PRECISIONS,
    PRESET_SETTINGS,
    PRESETS,
    RATIO_ANCHORS,
    REALIGNING,
    ROLLOUT_TRANSPORTS,
    TASK_KINDS,
    TRACES,
    TV_FILTERED,
    VACO_FAMILY,
    VALUE_TARGETS,
    VTRACE_PRESETS,
    ConfigError,
)
from asyncrl.core.config.io import (
    RUN_RECORD_KEYS,
    STUDY_ONLY_HEADING,
    KeyInfo,
    describe,
    from_dict,
    load,
    load_resolved,
    parse_override,
    to_toml,
    translate_moved_keys,
)
from asyncrl.core.config.llm_sections import MOVED_KEYS, LLMConfig, TaskConfig
from asyncrl.core.config.resolve import TASK_KIND_SETTINGS, Resolved, resolve, unused_reason
from asyncrl.core.config.role_sections import ActorConfig, LearnerConfig, RunConfig, TransportConfig
from asyncrl.core.config.root import Config, toml_value
from asyncrl.core.config.validate import validate, validate_serial

__all__ = [
    "BAND_RATIOS",
    "CONTROL",
    "DEVICE_RE",
    "FILTER_TRIGGERS",
    "LAUNCHERS",
    "LLM",
    "LLM_ANSWER_FORMATS",
    "LLM_AVERAGING",
    "LLM_EVAL_MODES",
    "LLM_PRESETS",
    "LLM_PROMPT_FORMATS",
    "LLM_REALIGN",
    "LLM_SILENT_GROUPS",
    "LLM_TRUNCATED_REWARD",
    "MOVED_KEYS",
    "NOT_IMPALA",
    "PRECISIONS",
    "PRESET_SETTINGS",
    "PRESETS",
    "RATIO_ANCHORS",
    "REALIGNING",
    "ROLLOUT_TRANSPORTS",
    "RUN_RECORD_KEYS",
    "STUDY_ONLY_HEADING",
    "TASK_KIND_SETTINGS",
    "TASK_KINDS",
    "TRACES",
    "TV_FILTERED",
    "VACO_FAMILY",
    "VALUE_TARGETS",
    "VTRACE_PRESETS",
    "ActorConfig",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "KeyInfo",
    "LearnerConfig",
    "LLMConfig",
    "PolicyConfig",
    "Resolved",
    "RunConfig",
    "TaskConfig",
    "TransportConfig",
    "describe",
    "from_dict",
    "load",
    "load_resolved",
    "parse_override",
    "resolve",
    "to_toml",
    "toml_value",
    "translate_moved_keys",
    "unused_reason",
    "validate",
    "validate_serial",
]
