"""Defaults of the supervised warm-up, shared by :mod:`asyncrl.tasks.llm.warmup` and the ``llm`` CLI
(kept free of imports so the CLI does not load torch to build its options). Measured in lab/llm-gsm-tiny/warmup.md."""

WARMUP_STAMP = "asyncrl-warmup.json"   # settings and measured figures of a warmed-up directory (its cache key)
DEFAULT_STEPS = 1000  # seed 0: 23.2 % held-out (5.5 % at 500, 19 % at 750: copying arrives in a jump); lab/llm-gsm-tiny/warmup.md
DEFAULT_BATCH_SIZE = 32
DEFAULT_THREADS = 2   # torch threads of a warm-up: the result depends on it (lab/llm-gsm-tiny/README.md, "a lottery between runs")
DEFAULT_LR = 3e-3
DEFAULT_WARMUP_STEPS = 30
