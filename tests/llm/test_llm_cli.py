"""The ``llm`` click group: prepare is cached, warmup writes a reusable directory, bad paths are one line."""

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
from click.testing import CliRunner  # noqa: E402

from asyncrl.cli.llm import WARMUP_STAMP, llm  # noqa: E402


def test_prepare_then_reuse(tmp_path, micro_config):
    args = [
        "prepare",
        "--out",
        str(tmp_path / "m"),
        "--model-config",
        str(micro_config),
        "--vocab-size",
        "400",
        "--texts",
        "200",
    ]
    first = CliRunner().invoke(llm, args)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith(f"prepared {tmp_path / 'm'} (") and "parameters)" in first.stdout
    again = CliRunner().invoke(llm, args)
    assert again.exit_code == 0 and again.stdout.startswith("reused ")
    other = CliRunner().invoke(llm, args + ["--seed", "1"])
    assert other.exit_code == 2 and "not prepared with these settings" in other.output


def test_warmup_writes_model_and_stamp_then_reuses(tmp_path, micro_dir):
    out = tmp_path / "warm"
    args = [
        "warmup",
        "--model",
        str(micro_dir),
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--train",
        "16",
        "--heldout",
        "3",
        "--max-new-tokens",
        "4",
        "--threads",
        "1",
    ]
    res = CliRunner().invoke(llm, args)
    assert res.exit_code == 0, res.output
    stamp = json.loads((out / WARMUP_STAMP).read_text())
    assert 0.0 <= stamp["heldout_accuracy"] <= 1.0 and stamp["settings"]["steps"] == 2
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    again = CliRunner().invoke(llm, args)
    assert again.exit_code == 0 and again.stdout.startswith(f"reused {out}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["warmup", "--model", "NOPE", "--steps", "1"], "Error: model directory not found: NOPE"),
        (["eval", "--model", "NOPE"], "Error: model directory not found: NOPE"),
        (["eval", "--model", ".", "--file", "missing.jsonl"], "Error: GSM8k file not found: missing.jsonl"),
    ],
)
def test_bad_paths_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(llm, args)
    assert res.exit_code == 2 and res.output.strip() == message


def test_eval_on_a_jsonl_file(tmp_path, micro_dir):
    f = tmp_path / "t.jsonl"
    f.write_text(
        json.dumps({"question": "Tom has 2 cards. He buys 3 more. How many?", "answer": "2+3 = <<2+3=5>>5\n#### 5"})
        + "\n"
    )
    res = CliRunner().invoke(
        llm, ["eval", "--model", str(micro_dir), "--file", str(f), "--max-new-tokens", "3", "--threads", "1"]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() in ("accuracy 0.000 on 1 problem", "accuracy 1.000 on 1 problem")  # not "1 problems"


def test_eval_breakdown_prints_json(tmp_path, micro_dir):
    f = tmp_path / "t.jsonl"
    f.write_text(
        json.dumps({"question": "Tom has 2 cards. He buys 3 more. How many?", "answer": "2+3 = <<2+3=5>>5\n#### 5"})
        + "\n"
    )
    res = CliRunner().invoke(
        llm,
        [
            "eval",
            "--model",
            str(micro_dir),
            "--file",
            str(f),
            "--max-new-tokens",
            "3",
            "--threads",
            "1",
            "--breakdown",
            "--no-calculator",
        ],
    )
    assert res.exit_code == 0, res.output
    first, second = res.stdout.strip().splitlines()
    assert first.startswith("accuracy ") and json.loads(second)["n"] == 1
    assert sum(json.loads(second)["first_error"].values()) == 1


def test_eval_takes_the_run_prompt_and_answer_formats(micro_dir):
    data = Path(__file__).parent / "data" / "gsm-own-test.jsonl"
    base = ["eval", "--model", str(micro_dir), "--file", str(data), "--limit", "2", "--max-new-tokens", "2"]
    res = CliRunner().invoke(llm, [*base, "--answer-format", "boxed", "--lenient", "--system-prompt", "Be brief."])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("accuracy ") and res.stdout.strip().endswith("on 2 problems")
    res = CliRunner().invoke(llm, [*base, "--prompt-format", "chat"])  # the micro tokenizer has no template
    assert res.exit_code == 2 and res.output.strip() == (
        "Error: prompt format 'chat', but the tokenizer has no chat template (use plain or auto)"
    )
