"""Defaults of the supervised warm-up, shared by :mod:`asyncrl.tasks.llm.warmup` and the ``llm`` CLI
(importing only the config, so the CLI does not load torch to build its options). Those a run can
set are the config's ``[llm]`` defaults (:class:`asyncrl.core.config.LLMConfig`), read from there."""

from asyncrl.core.config import LLMConfig

WARMUP_STAMP = "asyncrl-warmup.json"  # settings and measured figures of a warmed-up directory (its cache key)
DEFAULT_STEPS = 1000  # `asyncrl llm warmup`'s steps (a run's llm.warmup_steps is 0 unless set: no warm-up)
DEFAULT_BATCH_SIZE = LLMConfig.warmup_batch_size  # llm.warmup_batch_size
DEFAULT_THREADS = LLMConfig.warmup_threads  # llm.warmup_threads
DEFAULT_LR = 3e-3  # peak AdamW learning rate of the warm-up (not a run's key)
DEFAULT_WARMUP_STEPS = 30  # linear learning-rate warm-up steps of the supervised warm-up (not a run's key)
