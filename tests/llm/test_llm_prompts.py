"""Prompt formats (plain, chat template, system prompt, few-shot), BOS handling with a SentencePiece
tokenizer, and stop tokens: every stop id of a model ends a row in the sampler."""

import json
import shutil

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from asyncrl.tasks.llm import gsm_problems, prompts, sampling  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402

PROBLEMS = gsm_problems.make_splits(seed=5, n_train=6, n_heldout=0).train
# ChatML, written for these tests (the layout Qwen's and SmolLM2's templates render)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NO_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}" + CHATML
# [INST] style with the BOS written by the template, as Llama 2 / Mistral templates do
INST = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)


def chatml_tokenizer(micro_dir):
    tok = m.load_tokenizer(micro_dir)
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def sp_tok(sentencepiece_dir):
    return m.load_tokenizer(sentencepiece_dir)


# ---- plain ----


def test_plain_format_is_the_tiny_models_prompt_token_for_token(micro_dir):
    tok = m.load_tokenizer(micro_dir)
    fmt = prompts.make_format(tok, "auto")  # no chat template: plain
    assert not fmt.chat and fmt.bos_id is None and prompts.stop_ids(tok) == (tok.eos_token_id,)
    texts = [gsm_problems.format_prompt(p) for p in PROBLEMS]
    assert fmt.texts(tok, [p.question for p in PROBLEMS]) == texts
    ids = fmt.encode(tok, [p.question for p in PROBLEMS])
    assert ids == tok(texts, add_special_tokens=False)["input_ids"]
    a, b = sampling.encode_prompts(tok, texts), sampling.encode_prompts(tok, ids)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # left-padded alike


def test_plain_system_prompt_and_few_shot_text():
    text = prompts.plain_text("Q?", system_prompt="Be brief.", few_shot=[("A?", "1\n#### 1"), ("B?", "#### 2")])
    assert (
        text == "Be brief.\n\nQuestion: A?\nAnswer: 1\n#### 1\n\nQuestion: B?\nAnswer: #### 2\n\nQuestion: Q?\nAnswer:"
    )


# ---- chat template ----


def test_chat_template_with_generation_prompt_system_and_few_shot(micro_dir):
    tok = chatml_tokenizer(micro_dir)
    fmt = prompts.make_format(tok, "auto", system_prompt="Think.", few_shot=[("A?", "#### 1")])
    assert fmt.chat and fmt.bos_id is None
    assert fmt.texts(tok, ["Q?"]) == [
        "<|im_start|>system\nThink.<|im_end|>\n<|im_start|>user\nA?<|im_end|>\n<|im_start|>assistant\n#### 1"
        "<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    ]
    ids = fmt.encode(tok, ["Q?"])[0]
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(start) == 5 and ids.count(end) == 4 and tok.decode(ids) == fmt.texts(tok, ["Q?"])[0]
    assert not prompts.make_format(tok, "plain").chat


def test_chat_errors_are_one_line(micro_dir):
    tok = m.load_tokenizer(micro_dir)
    with pytest.raises(prompts.PromptError, match="has no chat template"):
        prompts.make_format(tok, "chat")
    tok = chatml_tokenizer(micro_dir)
    tok.chat_template = NO_SYSTEM
    fmt = prompts.make_format(tok, "chat", system_prompt="S")
    with pytest.raises(prompts.PromptError) as e:
        fmt.encode(tok, ["Q?"])
    assert "leave llm.system_prompt empty" in str(e.value) and "no system role" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="prompt format must be one of auto, plain, chat"):
        prompts.make_format(tok, "chatml")


def test_stop_ids_are_eos_generation_config_and_end_of_turn(micro_dir):
    tok = chatml_tokenizer(micro_dir)
    eos, end = tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")
    assert prompts.end_of_turn_id(tok) == end
    assert prompts.stop_ids(tok) == (eos, end)
    assert prompts.stop_ids(tok, [eos, 7, end]) == (eos, 7, end)  # generation_config.json's list, each once
    assert prompts.stop_ids(tok, 9) == (eos, 9, end)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # writes no end-of-turn token
    assert prompts.end_of_turn_id(tok) is None and prompts.stop_ids(tok) == (eos,)


# ---- BOS with a SentencePiece tokenizer ----


def test_sentencepiece_prompts_start_with_exactly_one_bos(sp_tok):
    assert prompts.tokenizer_adds_bos(sp_tok) and sp_tok.bos_token_id == 1
    q = PROBLEMS[0].question
    plain = prompts.make_format(sp_tok, "auto")  # no template: plain, BOS added as the tokenizer would
    assert not plain.chat and plain.bos_id == 1
    ids = plain.encode(sp_tok, [q])[0]
    assert ids == [1, *sp_tok(gsm_problems.format_prompt(PROBLEMS[0]), add_special_tokens=False)["input_ids"]]
    assert ids == sp_tok(gsm_problems.format_prompt(PROBLEMS[0]))["input_ids"]  # what the tokenizer itself does
    sp_tok.chat_template = INST  # the template writes <s> itself: not a second one
    try:
        chat = prompts.make_format(sp_tok, "auto", few_shot=[("A?", "#### 1")])
        text = chat.texts(sp_tok, [q])[0]
        assert text.startswith("<s>[INST] A? [/INST]#### 1</s>[INST] ")
        ids = chat.encode(sp_tok, [q])[0]
        assert ids[0] == 1 and ids[1] != 1 and ids.count(1) == 1
        assert prompts.stop_ids(sp_tok) == (2,)  # the template's end of turn is EOS itself
        sp_tok.chat_template = INST.replace("{{ bos_token }}", "")  # a template without it: BOS added once
        ids = prompts.make_format(sp_tok, "chat").encode(sp_tok, [q])[0]
        assert ids[0] == 1 and ids.count(1) == 1
    finally:
        sp_tok.chat_template = None
    ids, mask = sampling.encode_prompts(sp_tok, plain.encode(sp_tok, ["Hi", q]))
    assert ids[0, mask[0].argmax()] == 1 and ids[1, 0] == 1  # left padding, then BOS


def test_a_bos_token_the_tokenizer_never_adds_is_not_added(micro_dir):
    tok = m.load_tokenizer(micro_dir)
    tok.bos_token = tok.eos_token  # named, as GPT-2 style tokenizers do, but not put in front when encoding
    assert tok.bos_token_id is not None and not prompts.tokenizer_adds_bos(tok)
    assert prompts.make_format(tok, "plain").bos_id is None


# ---- the sampler stops on any stop id ----


class _Script(torch.nn.Module):
    """A stand-in LM that writes a fixed token script per row (logit 20 on the script's next token)."""

    def __init__(self, scripts, vocab, s_p):
        super().__init__()
        self.scripts, self.vocab, self.s_p, self.config = scripts, vocab, s_p, None

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, past_key_values=None):
        at = attention_mask.shape[1] - self.s_p
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for row, script in enumerate(self.scripts):
            logits[row, -1, script[min(at, len(script) - 1)]] = 20.0
        return type("Out", (), {"logits": logits})()


def test_each_stop_id_ends_its_row(micro_dir):
    tok = chatml_tokenizer(micro_dir)
    eos, end, other = tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"), 7
    body = tok("#### 4", add_special_tokens=False)["input_ids"]
    filler = tok(" more text", add_special_tokens=False)["input_ids"] * 4
    scripts = [body + [end] + filler, body + [eos] + filler, body + [other] + filler, body + filler]
    ids, mask = sampling.encode_prompts(tok, ["Q"] * 4)
    lm = _Script(scripts, len(tok), ids.shape[1])
    kw = dict(pad_id=tok.pad_token_id, max_new_tokens=len(scripts[0]), greedy=True, compact=False)
    out = sampling.sample(lm, ids, mask, eos_id=(eos, other, end), **kw)
    lengths = out.completion_mask.sum(1).tolist()
    assert lengths == [len(body) + 1] * 3 + [len(scripts[0])]  # the stop token is kept; row 3 runs to the budget
    assert out.input_ids[0, out.prompt_len + len(body)] == end
    only_eos = sampling.sample(lm, ids, mask, eos_id=eos, **kw)
    assert only_eos.completion_mask.sum(1).tolist() == [len(scripts[0]), len(body) + 1] + [len(scripts[0])] * 2


def test_a_stop_set_cuts_real_samples_at_their_first_stop(micro_dir):
    lm, tok = m.load(micro_dir)
    prompt = [gsm_problems.format_prompt(p) for p in PROBLEMS[:4]]
    ids, mask = sampling.encode_prompts(tok, prompt)
    kw = dict(pad_id=tok.pad_token_id, max_new_tokens=10, temperature=1.0, compact=False)
    base = sampling.sample(lm, ids, mask, eos_id=tok.eos_token_id, generator=torch.Generator().manual_seed(3), **kw)
    same = sampling.sample(lm, ids, mask, eos_id=(tok.eos_token_id,), generator=torch.Generator().manual_seed(3), **kw)
    assert all(torch.equal(a, b) for a, b in zip(base[:4], same[:4]))  # one stop id in a list: the same draws
    comp = base.input_ids[:, base.prompt_len :]
    extra = int(comp[0, 2])  # a token row 0 drew
    cut = sampling.sample(
        lm, ids, mask, eos_id=(tok.eos_token_id, extra), generator=torch.Generator().manual_seed(3), **kw
    )
    for r in range(4):
        n = int(base.completion_mask[r].sum())
        row = comp[r, :n].tolist()
        stop = row.index(extra) + 1 if extra in row else n
        assert cut.input_ids[r, cut.prompt_len : cut.prompt_len + stop].tolist() == row[:stop]
        assert int(cut.completion_mask[r].sum()) == stop


def test_generation_eos_is_read_from_the_model_directory(micro_dir, tmp_path):
    from asyncrl.tasks.llm.datasets import generation_eos

    d = tmp_path / "model"
    shutil.copytree(micro_dir, d)
    assert generation_eos(d) == m.load_tokenizer(micro_dir).eos_token_id
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    assert generation_eos(d) == [0, 5]


def test_a_warmup_for_a_chat_templated_model_is_refused_in_one_line(micro_dir, tmp_path):
    """The supervised warm-up trains the tiny model's plain prompt: for a model whose prompts are
    chat-templated (a pretrained instruct model) it is refused before any step."""
    from micro_config import micro_cfg

    from asyncrl.tasks import make_task

    chat_dir = tmp_path / "chat"
    shutil.copytree(micro_dir, chat_dir)
    chatml_tokenizer(micro_dir).save_pretrained(chat_dir)
    task = make_task(micro_cfg(chat_dir, f"llm.cache_dir={tmp_path / 'cache'}", "llm.warmup_steps=5"))
    with pytest.raises(m.ModelLoadError, match=r"llm.warmup_steps = 5 for \S+chat, whose prompts are chat-templated"):
        task.prepare_model(echo=lambda *_: None)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
