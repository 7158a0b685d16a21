"""Task kinds that asyncrl's roles carry, behind one interface (:mod:`asyncrl.tasks.base`):

  control/  gymnasium envs (MuJoCo and others), the MLP actor-critic, the rollout writer and the
            actor-critic learner iteration (their modules stay at asyncrl/tasks/control/envs.py, policy.py,
            rollout.py, update.py, where users import them; :mod:`asyncrl.tasks.control` binds them)
  llm/      a causal language model on verifiable math: generator actors, GRPO advantages, the same
            losses (:mod:`asyncrl.tasks.llm.task`)

``make_task(cfg)`` picks the kind from ``cfg.task.kind``.
"""

from __future__ import annotations

KINDS = ("control", "llm")


def make_task(cfg, *, spec=None):
    """The :class:`asyncrl.tasks.base.Task` of ``cfg`` (``cfg.task.kind``). ``spec``: a control
    task's rollout spec when the caller has it (no env is built to read the spaces then)."""
    if cfg.task.kind == "llm":
        from asyncrl.tasks.llm.task import LLMTask  # transformers only for language-model runs

        return LLMTask(cfg)
    from asyncrl.tasks.control import ControlTask

    return ControlTask(cfg, spec=spec)
