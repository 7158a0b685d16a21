"""Tokenizer and tiny model: Hugging Face format on disk, cache, save/load round trip, offline loading."""

import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from asyncrl.tasks.llm import gsm_problems, model  # noqa: E402

TEXT = "Question: Tom has 48 cards. He buys 7 more.\nAnswer: Tom has 48+7 = <<48+7=55>>55 cards.\n#### 55"


def test_prepare_writes_hf_directory_and_reuses_it(micro_dir, micro_config):
    for f in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        model.STAMP,
    ):
        assert (micro_dir / f).is_file(), f
    stamp = json.loads((micro_dir / model.STAMP).read_text())
    assert stamp["settings"]["seed"] == 0 and stamp["num_parameters"] > 0
    before = (micro_dir / "model.safetensors").stat().st_mtime_ns
    out, reused = model.prepare(micro_dir, seed=0, config_path=micro_config, vocab_size=400, n_texts=300)
    assert reused and out == micro_dir and (micro_dir / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(FileExistsError, match="not prepared with these settings"):
        model.prepare(micro_dir, seed=1, config_path=micro_config, vocab_size=400, n_texts=300)


@pytest.mark.timeout(300)
def test_parallel_prepares_of_one_directory_build_it_once(tmp_path, micro_config):
    """Two processes preparing the same model directory at once (a study's parallel cells): one
    builds it, the other waits on the build lock and reuses it. Before the lock the second's rename
    failed ("Directory not empty") and its cell ended failed."""
    import subprocess
    import sys

    out = tmp_path / "cache" / "micro"
    code = (
        "import sys; from asyncrl.tasks.llm import model; "
        f"o, r = model.prepare({str(out)!r}, seed=0, config_path={str(micro_config)!r}, vocab_size=400, n_texts=300); "
        "print('reused' if r else 'built')"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    said = sorted(p.communicate(timeout=240)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0] and said == ["built", "reused"], said
    assert model._prepared_key(out) is not None
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".micro.") and p.is_dir()]
    assert not left, left  # no temporary directory left


def test_auto_classes_load_by_path_offline(micro_dir):
    tok = AutoTokenizer.from_pretrained(micro_dir, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(micro_dir, local_files_only=True)
    assert tok.eos_token == tok.pad_token == model.EOS_TOKEN and tok.padding_side == "left"
    assert lm.config.model_type == "qwen2" and lm.config.vocab_size == len(tok)
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT
    # digits are single tokens: numbers are learnt digit by digit
    pieces = [tok.decode([i]) for i in tok("Tom has 480 cards")["input_ids"]]
    assert [x for x in pieces if any(ch.isdigit() for ch in x)] == ["4", "8", "0"]


def test_save_load_round_trip_same_logits(micro_dir, tmp_path):
    lm, tok = model.load(micro_dir)
    ids = tok([TEXT], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = lm(input_ids=ids).logits
    model.save(lm, tok, tmp_path / "copy")
    lm2, tok2 = model.load(tmp_path / "copy")
    with torch.no_grad():
        after = lm2(input_ids=ids).logits
    assert torch.equal(before, after)
    assert tok2(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
    assert tok2.padding_side == "left" and tok2.pad_token_id == tok.eos_token_id


def test_initial_weights_follow_the_seed(micro_config):
    tok = model.train_tokenizer([TEXT] * 3, vocab_size=300)
    a = model.tiny_model(micro_config, tok, seed=5)
    b = model.tiny_model(micro_config, tok, seed=5)
    c = model.tiny_model(micro_config, tok, seed=6)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(model.ModelLoadError, match="model directory not found: .*nope$"):
        model.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(model.ModelLoadError, match="has no config.json"):
        model.load(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    with pytest.raises(model.ModelLoadError) as e:
        model.load(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"cannot load {bad}")


def test_bad_model_config(tmp_path):
    tok = model.train_tokenizer([TEXT], vocab_size=300)
    with pytest.raises(FileNotFoundError, match="model config not found"):
        model.tiny_model(tmp_path / "none.json", tok, seed=0)
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="known model_type"):
        model.tiny_model(tmp_path / "c.json", tok, seed=0)
    with pytest.raises(ValueError, match="vocab_size must be >= 300"):
        model.train_tokenizer([TEXT], vocab_size=100)


def test_repo_config_is_a_few_hundred_thousand_to_few_million_parameters():
    cfg = json.loads(model.DEFAULT_CONFIG.read_text())
    assert cfg["model_type"] == "qwen2" and cfg["attention_dropout"] == 0.0
    tok = model.train_tokenizer(
        [
            gsm_problems.format_prompt(p) + gsm_problems.format_completion(p)
            for p in gsm_problems.make_splits(seed=0, n_train=200, n_heldout=0).train
        ],
        vocab_size=600,
    )
    n = model.num_parameters(model.tiny_model(model.DEFAULT_CONFIG, tok, seed=0))
    assert 5e5 < n < 5e6
