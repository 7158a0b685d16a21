"""The whole config (:class:`Config`: one field per section, the samples per learner iteration) and how a
value is written as TOML (:func:`toml_value`). The sections: :mod:`.control_sections` (env, policy),
:mod:`.algo_section` (algo), :mod:`.role_sections` (actor, learner, transport, run), :mod:`.llm_sections`
(task, llm); their field metadata: :mod:`.field_meta`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from asyncrl.core.config.algo_section import AlgoConfig
from asyncrl.core.config.control_sections import EnvConfig, PolicyConfig
from asyncrl.core.config.llm_sections import LLMConfig, TaskConfig
from asyncrl.core.config.role_sections import ActorConfig, LearnerConfig, RunConfig, TransportConfig


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        """Samples per learner iteration: env steps T * B * E (control), completions
        prompts_per_slot * G * B (llm)."""
        if self.task.kind == "llm":
            return self.llm.prompts_per_slot * self.llm.group_size * self.learner.slots_per_batch
        return self.env.rollout_length * self.learner.slots_per_batch * self.env.num_envs


def toml_value(value: Any) -> str:
    """A config value as TOML text (strings quoted, booleans lower-case, inf as inf, tuples as lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if value == float("inf") else "-inf" if value == float("-inf") else repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)
