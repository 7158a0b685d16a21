"""Tiny random causal LMs of several transformers architectures, with tokenizers built here, for the
architecture tests (tests/llm/test_llm_archs.py) and by hand (``python tests/llm/tiny_archs.py OUT``).

Each model: hidden size 64, 2 layers, saved with ``save_pretrained`` beside a byte-level BPE tokenizer
trained on a few hundred generated GSM texts (digits one per token), whose special tokens, BOS rule,
pad token and chat template vary by case (:data:`CASES`). Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# name -> (architecture, tokenizer settings, model settings, generation_config.json or None)
#   tokenizer: eos / bos / pad ("eos": the EOS string; None: none), add_bos (a post-processor puts BOS in
#   front), specials (more special tokens), template (chat template)
#   model: tie (tie_word_embeddings), extra_vocab (embedding rows beyond the tokenizer), dtype
CASES: dict[str, tuple[str, dict, dict, dict | None]] = {
    # GPT-2: absolute learned positions, Conv1D layers (LoRA targets c_attn / c_proj), no pad token, BOS == EOS
    "gpt2": ("gpt2", {"eos": "<|endoftext|>", "bos": "<|endoftext|>", "pad": None}, {}, None),
    # GPT-NeoX: fused query_key_value, pad == EOS, untied head
    "neox": ("gpt_neox", {"eos": "<|endoftext|>", "pad": "eos"}, {"tie": False}, None),
    # OPT: learned positions with an offset, BOS </s> put in front by the tokenizer, its own <pad>
    "opt": ("opt", {"eos": "</s>", "bos": "</s>", "pad": "<pad>", "add_bos": True}, {}, None),
    # Phi-3: chat template, <|end|> end of turn, EOS given as a list in generation_config.json
    "phi3": (
        "phi3",
        {
            "eos": "<|endoftext|>",
            "pad": "<|endoftext|>",
            "specials": ["<|user|>", "<|assistant|>", "<|end|>"],
            "template": PHI3,
        },
        {"tie": False},
        {"eos_token_id": ["<|endoftext|>", "<|end|>"]},
    ),
    # Phi (phi-2): partial rotary, dense layers named q_proj / dense / fc1
    "phi": ("phi", {"eos": "<|endoftext|>", "pad": None}, {"tie": False}, None),
    # Gemma: BOS added, a template that refuses a system message, vocabulary padded beyond the tokenizer
    "gemma": (
        "gemma",
        {
            "eos": "<eos>",
            "bos": "<bos>",
            "pad": "<pad>",
            "add_bos": True,
            "specials": ["<start_of_turn>", "<end_of_turn>"],
            "template": GEMMA,
        },
        {"extra_vocab": 37},
        None,
    ),
    # Mistral: sliding window shorter than a prompt, untied, no pad, BOS added
    "mistral": ("mistral", {"eos": "</s>", "bos": "<s>", "pad": None, "add_bos": True}, {"tie": False}, None),
    # Llama: tied and untied, no BOS, ChatML template
    "llama-tied": ("llama", {"eos": "<|endoftext|>", "pad": "eos"}, {"tie": True}, None),
    "llama-chat": (
        "llama",
        {"eos": "<|endoftext|>", "pad": None, "specials": ["<|im_start|>", "<|im_end|>"], "template": CHATML},
        {"tie": False},
        None,
    ),
    # BLOOM: ALiBi, its forward takes no position_ids
    "bloom": ("bloom", {"eos": "</s>", "bos": "<s>", "pad": "<pad>"}, {}, None),
    # weights stored in bfloat16
    "llama-bf16": ("llama", {"eos": "<|endoftext|>", "pad": None}, {"dtype": "bfloat16"}, None),
    # no EOS or pad token in the tokenizer: the stop id only in generation_config.json
    "llama-noeos": ("llama", {"specials": ["<|endoftext|>"]}, {}, {"eos_token_id": ["<|endoftext|>"]}),
    # Mamba: a recurrent state in the cache (no rows dropped), outputs that depend on left padding: refused
    "mamba": ("mamba", {"eos": "<|endoftext|>", "pad": None}, {}, None),
    # BART's decoder: learned positions counted from the sequence's start, whatever position_ids say: refused
    "bart": ("bart", {"eos": "</s>", "bos": "<s>", "pad": "<pad>"}, {}, None),
    # refused: a context shorter than prompt + completion; a tokenizer larger than the embedding
    "gpt2-short": ("gpt2", {"eos": "<|endoftext|>", "pad": None}, {"positions": 64}, None),
    # GPT-2 with its real dropout (0.1 on residuals, embeddings, attention): off everywhere in the task
    "gpt2-dropout": ("gpt2", {"eos": "<|endoftext|>", "pad": None}, {"dropout": 0.1}, None),
    "llama-small-vocab": ("llama", {"eos": "<|endoftext|>", "pad": None}, {"extra_vocab": -3}, None),
}


def texts(n: int = 300) -> list[str]:
    """Prompts and worked solutions of ``n`` generated train problems (the tokenizer's training text)."""
    from asyncrl.tasks.llm import gsm_problems

    splits = gsm_problems.make_splits(seed=0, n_train=n, n_heldout=0)
    return [gsm_problems.format_prompt(p) + gsm_problems.format_completion(p) for p in splits.train]


def tokenizer(*, eos=None, bos=None, pad=None, add_bos=False, specials=(), template=None, vocab_size=400):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the given special tokens (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    pad_tok = eos if pad == "eos" else pad
    special = list(dict.fromkeys(t for t in (eos, bos, pad_tok, *specials) if t))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    kw = {k: v for k, v in (("eos_token", eos), ("bos_token", bos), ("pad_token", pad_tok)) if v}
    out = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **kw)
    if template:
        out.chat_template = template
    return out


def config(arch: str, vocab: int, tok, *, tie: bool = True, positions: int = 512, dropout: float = 0.0):
    """A transformers config of ``arch``, hidden size 64, 2 layers, for ``vocab`` ids (no dropout unless
    ``dropout``: GPT-2's)."""
    from transformers import AutoConfig

    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    base |= dict(max_position_embeddings=512)
    gqa = base | dict(num_key_value_heads=1)  # grouped-query attention: one key-value head
    small = {
        "gpt2": dict(n_embd=64, n_layer=2, n_head=2, n_positions=positions)
        | dict(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout),
        "gpt_neox": base | dict(rotary_pct=0.5),
        "opt": {k: v for k, v in base.items() if k != "intermediate_size"}
        | dict(ffn_dim=128, word_embed_proj_dim=64, dropout=0.0, attention_dropout=0.0),
        "phi3": gqa | dict(original_max_position_embeddings=512),
        "phi": base | dict(partial_rotary_factor=0.5),
        "gemma": gqa | dict(head_dim=32),
        "mistral": gqa | dict(sliding_window=24),
        "llama": gqa,
        "bloom": dict(hidden_size=64, n_layer=2, n_head=2),
        "mamba": dict(hidden_size=64, num_hidden_layers=2, state_size=8),
        "bart": dict(d_model=64, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=128)
        | dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, dropout=0.0)
        | dict(is_decoder=True, is_encoder_decoder=False, max_position_embeddings=512),
    }[arch]
    ids = {
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    return AutoConfig.for_model(arch, vocab_size=vocab, tie_word_embeddings=tie, **small, **ids)


def build(name: str, out: str | Path, *, seed: int = 0) -> Path:
    """Save the tiny model and tokenizer of case ``name`` (:data:`CASES`) into ``out``; returns ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    arch, tok_kw, model_kw, generation = CASES[name]
    out = Path(out)
    tok = tokenizer(**tok_kw)
    vocab = len(tok) + model_kw.get("extra_vocab", 0)
    kw = {k: model_kw[k] for k in ("tie", "positions", "dropout") if k in model_kw}
    cfg = config(arch, vocab, tok, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    dtype = model_kw.get("dtype")
    if dtype:
        model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if generation is not None:
        ids = [tok.convert_tokens_to_ids(t) for t in generation["eos_token_id"]]
        (out / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": ids}))
    return out


if __name__ == "__main__":  # python tests/llm/tiny_archs.py OUT [NAME ...]
    root = Path(sys.argv[1])
    for n in sys.argv[2:] or list(CASES):
        print(build(n, root / n))
