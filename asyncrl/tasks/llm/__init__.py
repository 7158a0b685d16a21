"""RL for language models on verifiable math (GRPO-style), the foundation layer.

Modules, each usable alone:
  gsm_problems  GSM8k-format word problems: a seeded generator, train / held-out split, prompt text,
                a loader for real GSM8k JSONL files (pure Python).
  gsm_answers   the final-answer parser, the reward, the calculator, the error analysis (pure Python).
  model         a locally trained tokenizer and a tiny Qwen2 causal LM in Hugging Face format; loading
                any HF causal-LM directory by path, never from a hub.
  sampling      batched generation with per-token behaviour log-probs (seeded torch.Generator), the
                learner's recomputation of completion log-probs, and exact-match evaluation.
  grpo          pure torch: group-normalised advantages, token broadcast, loss averaging weights, and the
                flattening into the [N] tensors of asyncrl.algo.ppo_losses / vaco_loss (PPO-clip, VACO) on tokens.
  warmup        supervised warm-up of the tiny model to a non-trivial start accuracy.
  cli           the click group ``llm`` (prepare, warmup).

Only ``gsm_problems``, ``gsm_answers`` and ``grpo`` import without the ``llm`` extra (transformers, tokenizers,
safetensors).
"""
