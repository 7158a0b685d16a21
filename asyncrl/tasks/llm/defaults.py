"""Defaults of the supervised warm-up, shared by :mod:`asyncrl.tasks.llm.warmup` and the ``llm`` CLI
(kept free of imports so the CLI does not load torch to build its options). Measured in docs/llm-warmup.md."""

WARMUP_STAMP = "asyncrl-warmup.json"   # settings and measured figures of a warmed-up directory (its cache key)
DEFAULT_STEPS = 500   # fills ~3 min of the idle machine (0.34 s per step at 2 threads); accuracy at 500 not measured yet
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 3e-3
DEFAULT_WARMUP_STEPS = 30
