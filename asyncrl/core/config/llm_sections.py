"""The config sections of the task kind and the language-model task: ``[task]`` (which kind the roles
carry) and ``[llm]`` (model, warm-up, groups, sampling, evaluation, GRPO's options), each field with its
default and metadata (:mod:`.field_meta`); :data:`MOVED_KEYS`, the keys that left ``[task]`` for ``[llm]``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from asyncrl.core.config.field_meta import LLM, _f

_LORA = ("lora_rank > 0", lambda c: c.llm.lora_rank > 0)


@dataclass(frozen=True)
class TaskConfig:
    kind: str = _f(
        "control",
        "task kind the roles carry: control (gymnasium envs: [env] and [policy]) or llm "
        "(a causal language model on GSM8k-format math: [llm])",
    )


# the generated problems are used: for RL prompts or for the held-out evaluation
_WARMUP = ("llm.warmup_steps > 0", lambda c: c.llm.warmup_steps > 0)
_GENERATED = ("llm.train_file or llm.test_file empty", lambda c: not (c.llm.train_file and c.llm.test_file))


@dataclass(frozen=True)
class LLMConfig:
    """The language-model task's keys (task.kind = llm; docs/decisions/llm-defaults.md)."""

    model_dir: str = _f(
        "",
        "Hugging Face causal-LM directory to start from (loaded with local_files_only); '': the "
        "tiny model `asyncrl llm prepare` makes, cached in llm.cache_dir",
        kinds=LLM,
    )
    cache_dir: str = _f(
        "runs/llm", "where the prepared tiny model, its warm-ups and start evaluations are cached", kinds=LLM
    )
    model_seed: int = _f(
        0, "seed of the tiny model, its warm-up and the train / held-out problems (run.seed seeds RL only)", kinds=LLM
    )
    warmup_steps: int = _f(
        0,
        "supervised warm-up steps of the tiny model on generated worked solutions before RL (asyncrl llm "
        "warmup; cached); 0: none, RL starts from the model as it is (a pretrained llm.model_dir takes none)",
        kinds=LLM,
    )
    warmup_batch_size: int = _f(32, "problems per supervised warm-up step", kinds=LLM, when=_WARMUP)
    warmup_threads: int = _f(
        2,
        "torch threads of the supervised warm-up, fixed so that the start model does not "
        "depend on the machine's cores or OMP_NUM_THREADS (float sums change order with the "
        "thread count); 0: torch's default",
        kinds=LLM,
        when=_WARMUP,
    )
    warmup_target: float = _f(
        0.0,
        "end the supervised warm-up at the first check (every 100 steps) whose accuracy on 200 "
        "validation problems (in neither train nor held-out; the held-out metric: llm.eval_mode at "
        "llm.temperature) reaches this; llm.warmup_steps stays the budget; 0: off",
        kinds=LLM,
        when=_WARMUP,
    )
    group_size: int = _f(8, "G: completions sampled per prompt (a group)", kinds=LLM)
    prompts_per_slot: int = _f(4, "prompts per slot: a slot holds whole groups, prompts_per_slot * G rows", kinds=LLM)
    max_prompt_tokens: int = _f(
        0,
        "prompt width in a slot (left-padded); 0: the longest encoded prompt of the train problems and "
        "the held-out ones (auto); a longer prompt than a width set here is refused at start",
        kinds=LLM,
    )
    max_new_tokens: int = _f(
        160, "completion width in a slot and generation budget (sampling and evaluation)", kinds=LLM
    )
    temperature: float = _f(
        1.0, "sampling temperature of the generators (the learner's log-probs use it too)", kinds=LLM
    )
    top_k: int = _f(
        0,
        "sample from the k most likely tokens only, renormalised (after the temperature; the "
        "behaviour and the learner's log-probs are those of this distribution); 0: off",
        kinds=LLM,
    )
    top_p: float = _f(
        1.0,
        "nucleus sampling (arXiv:1904.09751): sample from the smallest set of most likely tokens "
        "whose probability reaches top_p, renormalised (after temperature and top_k; the behaviour "
        "and the learner's log-probs are those of this distribution); 1: off",
        kinds=LLM,
    )
    problem_steps_min: int = _f(
        2,
        "fewest arithmetic steps of a generated problem (1 to 8; an easier task for a pretrained model "
        "that scores near 0 on the default 2 to 4; the supervised warm-up keeps 2 to 4)",
        kinds=LLM,
        when=_GENERATED,
    )
    problem_steps_max: int = _f(
        4, "most arithmetic steps of a generated problem (>= problem_steps_min, <= 8)", kinds=LLM, when=_GENERATED
    )
    train_problems: int = _f(
        20000,
        "generated train problems the generators draw prompts from",
        kinds=LLM,
        # the supervised warm-up splits its train and validation problems from these even with a train_file
        when=("llm.train_file is '' or llm.warmup_steps > 0", lambda c: not c.llm.train_file or c.llm.warmup_steps > 0),
    )
    train_file: str = _f(
        "",
        "GSM8k-format JSONL file (question, answer with '#### N' per line) the generators draw "
        "prompts from; '': generated problems (llm.train_problems)",
        kinds=LLM,
    )
    test_file: str = _f(
        "",
        "GSM8k-format JSONL file of the held-out evaluation (its first llm.eval_size problems); "
        "'': generated held-out problems",
        kinds=LLM,
    )
    prompt_format: str = _f(
        "auto",
        "plain ('Question: ...\\nAnswer:'), chat (the tokenizer's chat template) or auto (chat when the "
        "tokenizer has a template)",
        kinds=LLM,
    )
    system_prompt: str = _f("", "system prompt before the question (a chat template's system message); ''", kinds=LLM)
    few_shot: int = _f(
        0,
        "worked examples shown before the question: the first N problems of llm.few_shot_file, or of "
        "the train problems (which then leave the prompt source); 0: none",
        kinds=LLM,
    )
    few_shot_file: str = _f(
        "",
        "GSM8k-format JSONL file of the few-shot examples; '': the train problems",
        kinds=LLM,
        when=("llm.few_shot > 0", lambda c: c.llm.few_shot > 0),
    )
    answer_format: str = _f(
        "gsm8k",
        "where the reward reads a completion's answer: gsm8k (the number after '####'), boxed "
        "(the last \\boxed{...}) or last_number",
        kinds=LLM,
    )
    answer_strict: bool = _f(
        True,
        "true: only llm.answer_format's answer counts; false: the last number of the completion "
        "when that format gives none",
        kinds=LLM,
        when=("llm.answer_format is not last_number", lambda c: c.llm.answer_format != "last_number"),
    )
    eval_size: int = _f(
        500,
        "held-out problems of the evaluation before and after RL (and during it: llm.eval_every); 0: none",
        kinds=LLM,
    )
    eval_every: int = _f(
        0,
        "learner iterations between held-out evaluations during RL (the learner's policy, the draws of "
        "the evaluations before and after RL; metrics.jsonl eval_accuracy; the learner pauses for each); "
        "0: none, before and after RL only",
        kinds=LLM,
        when=("llm.eval_size > 0", lambda c: c.llm.eval_size > 0),
    )
    eval_batch_size: int = _f(
        64,
        "prompts per generation batch of the held-out evaluation (a larger batch "
        "amortises each decoding step's fixed cost; its KV cache grows with it)",
        kinds=LLM,
    )
    eval_mode: str = _f(
        "sampled",
        "the held-out evaluation: sampled (one completion per problem at llm.temperature, "
        "the same draws before, during and after RL on any device: problem i's from a CPU stream seeded "
        "by llm.model_seed and i) or greedy (argmax)",
        kinds=LLM,
    )
    averaging: str = _f(
        "token", "loss average over tokens: token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", kinds=LLM
    )
    scale_by_std: bool = _f(True, "divide group-centred rewards by the group's std (GRPO); false: Dr. GRPO", kinds=LLM)
    truncated_reward: str = _f(
        "score",
        "a completion cut at max_new_tokens (no EOS): score (its '####' line "
        "scored like any other) or zero (reward 0 whatever it wrote)",
        kinds=LLM,
    )
    realign: str = _f(
        "none",
        "advantage realignment without a critic: none (baseline = the group's mean reward, "
        "an estimate under beta) or is_baseline (the group's mean weighted by min(algo.rho_bar, "
        "pi_T/beta) per completion: a baseline of pi_T; docs/llm-realignment.md)",
        kinds=LLM,
    )
    silent_groups: str = _f(
        "drop",
        "groups whose G rewards are equal (zero advantage): drop (removed before the "
        "minibatches, as DAPO's dynamic sampling; num_minibatches splits the rest), skip "
        "(kept, but a minibatch without an advantage or a KL term does not step the "
        "optimizer) or step (kept: a minibatch of them alone still steps Adam on its "
        "momentum)",
        kinds=LLM,
    )
    kl_coef: float = _f(
        0.0,
        "weight of the per-token k3 KL(pi_theta || start model) penalty (DeepSeekMath GRPO); "
        "0: off, and the learner holds no reference model",
        kinds=LLM,
    )
    negative_weight: float = _f(
        1.0,
        "factor on negative advantages after group normalisation: 1 is GRPO, 0 keeps "
        "the positive (above-group-mean) completions only (positive-sample "
        "reinforcement, arXiv:2506.01347)",
        kinds=LLM,
    )
    logprob_chunk_tokens: int = _f(
        512,
        "completion tokens per chunk of the learner's log-prob computation (output head and "
        "log-softmax, recomputed in the backward pass): its memory is a few chunk x vocabulary "
        "floats, never rows x tokens x vocabulary",
        kinds=LLM,
    )
    micro_batch_rows: int = _f(
        0,
        "completions per forward / backward of the learner: each minibatch's gradient is "
        "accumulated over micro-batches of this many rows (the same update to float rounding, "
        "one more forward without gradient per micro-batch); 0: the whole minibatch at once",
        kinds=LLM,
    )
    gradient_checkpointing: bool = _f(
        False,
        "recompute each decoder layer's activations in the learner's backward pass "
        "(transformers' activation checkpointing): less memory, about one more forward of time",
        kinds=LLM,
    )
    lora_rank: int = _f(
        0,
        "LoRA through peft: rank r of the adapter the learner trains on the frozen start model (only the "
        "adapter's tensors travel per version); 0: off, every parameter trains and travels",
        kinds=LLM,
    )
    lora_alpha: float = _f(
        32.0, "LoRA: scale of the adapter's update, alpha / rank (peft lora_alpha)", kinds=LLM, when=_LORA
    )
    lora_dropout: float = _f(
        0.0,
        "LoRA: dropout on the adapter's input in the learner's gradient forwards (log pi_T and the "
        "generators run without it)",
        kinds=LLM,
        when=_LORA,
    )
    lora_target_modules: tuple[str, ...] = _f(
        ("all-linear",),
        "LoRA: the modules that get an adapter, by name (e.g. q_proj, v_proj), or all-linear (every "
        "linear layer but the output head)",
        kinds=LLM,
        when=_LORA,
    )


# Keys that left [task] for [llm] (old name -> new name). A config file, flag or --set naming the old
# one is refused with a line naming the new one; a run's config.json written before the move is read
# with them translated (asyncrl.core.config.io.translate_moved_keys), and says so.
# The keys [llm] had when it was split from [task] (keys added since never were in [task]).
_MOVED = (
    "model_dir cache_dir model_seed warmup_steps warmup_batch_size warmup_threads warmup_target group_size "
    "prompts_per_slot max_prompt_tokens max_new_tokens temperature train_problems eval_size eval_batch_size "
    "eval_mode averaging scale_by_std truncated_reward realign silent_groups kl_coef negative_weight"
).split()
MOVED_KEYS: dict[str, str] = {
    f"task.{f.name if f.name != 'model_dir' else 'model'}": f"llm.{f.name}"
    for f in dataclasses.fields(LLMConfig)
    if f.name in _MOVED
}
