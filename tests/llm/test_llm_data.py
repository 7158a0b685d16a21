"""Real GSM8k-format JSONL files as the RL prompt source and the held-out evaluation, the prompt width
taken from the data, one-line errors for bad data, and serial RL runs on JSONL prompts (plain and with a
chat template, system prompt, few-shot examples and several stop ids).

tests/llm/data/gsm-own-{train,test}.jsonl: 30 + 12 word problems in GSM8k's format written for these
tests (not taken from GSM8k; their calculator annotations are checked below)."""

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from asyncrl.cli import main  # noqa: E402
from asyncrl.core import config  # noqa: E402
from asyncrl.core.config import ConfigError  # noqa: E402
from asyncrl.run.serial import run_serial  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import answer_formats, gsm_answers, gsm_problems, sampling  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402

DATA = Path(__file__).parent / "data"
TRAIN, TEST = DATA / "gsm-own-train.jsonl", DATA / "gsm-own-test.jsonl"
QUIET = {"echo": lambda *_: None}


def _cfg(model_dir, *extra):
    return config.load(
        None,
        [
            "task.kind=llm",
            f"llm.model_dir={model_dir}",
            "llm.warmup_steps=0",
            "llm.group_size=2",
            "llm.prompts_per_slot=2",
            "llm.max_new_tokens=12",
            "llm.eval_size=8",
            f"llm.train_file={TRAIN}",
            f"llm.test_file={TEST}",
            "algo.num_epochs=1",
            "algo.num_minibatches=2",
            "algo.lr=1e-3",
            "learner.slots_per_batch=2",
            "learner.num_slots=2",
            "run.num_actors=2",
            "run.total_env_steps=24",
            "run.log_every_s=1000",
            *extra,
        ],
    )


def test_the_fixture_is_gsm8k_format_with_correct_annotations():
    for path, n in ((TRAIN, 30), (TEST, 12)):
        problems = gsm_problems.load_jsonl(path)
        assert len(problems) == n and len({p.question for p in problems}) == n
        for p in problems:
            steps = re.findall(r"<<([^<>=]*)=([^<>=]*)>>", p.answer)
            assert steps and all(gsm_answers.calculate(e) == Fraction(r) for e, r in steps)
            assert Fraction(p.target) == Fraction(steps[-1][1]) and p.answer.splitlines()[-1].startswith("#### ")
    assert not {p.question for p in gsm_problems.load_jsonl(TRAIN)} & {
        p.question for p in gsm_problems.load_jsonl(TEST)
    }


def test_files_are_the_prompt_source_and_the_heldout_problems(micro_dir):
    task = make_task(_cfg(micro_dir))
    train, test = gsm_problems.load_jsonl(TRAIN), gsm_problems.load_jsonl(TEST)
    assert task.rl_problems() == train and task.heldout_problems() == test[:8]
    assert make_task(_cfg(micro_dir, "llm.eval_size=50")).heldout_problems() == test  # all of a shorter file
    shots = make_task(_cfg(micro_dir, "llm.few_shot=3"))
    assert shots.few_shot_problems() == train[:3] and shots.rl_problems() == train[3:]  # never its own example
    other = make_task(_cfg(micro_dir, "llm.few_shot=2", f"llm.few_shot_file={TEST}"))
    assert other.few_shot_problems() == test[:2] and other.rl_problems() == train
    with pytest.raises(ConfigError, match=r"^llm.few_shot = 13: llm.few_shot_file has only 12 problems$"):
        make_task(_cfg(micro_dir, "llm.few_shot=13", f"llm.few_shot_file={TEST}")).few_shot_problems()
    generated = make_task(_cfg(micro_dir, "llm.train_file=", "llm.test_file=", "llm.train_problems=50"))
    split = gsm_problems.make_splits(seed=0, n_train=50, n_heldout=8)
    assert generated.rl_problems() == split.train and generated.heldout_problems() == split.heldout


@pytest.mark.parametrize("key", ["train_file", "test_file", "few_shot_file"])
def test_bad_data_is_one_line_naming_the_file_and_line(micro_dir, tmp_path, key):
    extra = ["llm.few_shot=1"] if key == "few_shot_file" else []
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ConfigError) as e:
        make_task(_cfg(micro_dir, f"llm.{key}={missing}", *extra)).prepare_run(tmp_path / "run", **QUIET)
    assert str(e.value) == f"llm.{key}: GSM8k file not found: {missing}"
    bad = tmp_path / "bad.jsonl"
    lines = TRAIN.read_text().splitlines()
    lines[4] = '{"question": "How many?", "answer": "We do not know."}'
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as e:
        make_task(_cfg(micro_dir, f"llm.{key}={bad}", *extra)).prepare_run(tmp_path / "run", **QUIET)
    assert str(e.value) == f"llm.{key}: {bad}:5: answer has no final '#### <number>' line"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=f"^llm.{key}: no problems in {empty}$"):
        make_task(_cfg(micro_dir, f"llm.{key}={empty}", *extra)).prepare_run(tmp_path / "run", **QUIET)
    assert not (tmp_path / "run" / "llm-start.json").exists()


def test_asyncrl_run_reports_a_malformed_line_in_one_line(micro_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TRAIN.read_text() + "{not json\n")
    sets = [
        "task.kind=llm",
        f"llm.model_dir={micro_dir}",
        "llm.warmup_steps=0",
        f"llm.train_file={bad}",
        "llm.eval_size=4",
        "run.total_env_steps=64",
    ]
    args = ["run", "--serial", "--run-dir", str(tmp_path / "run")] + [a for s in sets for a in ("--set", s)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code != 0
    assert f"llm.train_file: {bad}:31: not valid JSON (" in out.output.strip().splitlines()[-1]


def _longest(tok, fmt, problems):
    return max(len(ids) for ids in fmt.encode(tok, [p.question for p in problems]))


def test_prompt_width_is_the_longest_prompt_or_a_config_error_at_start(micro_dir, tmp_path):
    tok = m.load_tokenizer(micro_dir)
    plain = gsm_problems.format_prompt
    longest = max(len(tok(plain(p), add_special_tokens=False)["input_ids"]) for p in gsm_problems.load_jsonl(TRAIN))
    longest = max(longest, *(len(tok(plain(p))["input_ids"]) for p in gsm_problems.load_jsonl(TEST)[:8]))
    auto = make_task(_cfg(micro_dir, "llm.max_prompt_tokens=0"))
    assert auto.spec.prompt_tokens == longest and auto.spec.prompt_tokens > 20
    assert make_task(_cfg(micro_dir, f"llm.max_prompt_tokens={longest + 5}")).spec.prompt_tokens == longest + 5
    with pytest.raises(ConfigError) as e:
        make_task(_cfg(micro_dir, "llm.max_prompt_tokens=20")).prepare_run(tmp_path, **QUIET)
    assert re.fullmatch(
        rf"llm.max_prompt_tokens = 20, but (train|held-out) problem \d+ \(.*\.jsonl\) is {longest} tokens in its "
        rf"prompt format: set llm.max_prompt_tokens >= {longest}, or 0 for the longest prompt of the data",
        str(e.value),
    )
    shots = make_task(_cfg(micro_dir, "llm.few_shot=2", "llm.system_prompt=Solve it."))  # longer prompts: wider
    assert shots.spec.prompt_tokens == _longest(
        tok, shots.prompt_format(), shots.rl_problems() + shots.heldout_problems()
    )
    assert shots.spec.prompt_tokens > longest + 100


def _spy_prompts(monkeypatch):
    seen = []
    real = sampling.generate_group

    def spy(model, tokenizer, prompts, G, **kw):
        seen.extend(prompts)
        return real(model, tokenizer, prompts, G, **kw)

    monkeypatch.setattr(sampling, "generate_group", spy)
    return seen


def test_serial_rl_run_on_jsonl_prompts(micro_dir, tmp_path, monkeypatch):
    cfg = _cfg(micro_dir, "run.seed=5", "llm.max_prompt_tokens=0")
    # the untrained micro model solves nothing: a reward on the completion's length parity gives the groups
    # unequal rewards, so the learner steps
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
    seen = _spy_prompts(monkeypatch)
    start = make_task(cfg).prepare_run(tmp_path, **QUIET)
    summary = run_serial(cfg, tmp_path, echo=lambda *_: None)
    assert summary["outcome"] == "finished" and summary["learner_iterations"] == 3 and summary["env_steps"] == 24
    assert summary["eval_problems"] == 8 and start["eval_problems"] == 8
    tok = m.load_tokenizer(micro_dir)
    questions = {gsm_problems.format_prompt(p) for p in gsm_problems.load_jsonl(TRAIN)}
    assert len(seen) == 6 * 2 and all(tok.decode(ids) in questions for ids in seen)  # 6 slots of 2 prompts
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any((r["grad_norm"] or 0) > 0 for r in rows) and start["prompt_tokens"] == make_task(cfg).spec.prompt_tokens


def test_serial_rl_run_with_a_chat_template_few_shot_and_stop_ids(chat_model, tmp_path, monkeypatch):
    cfg = _cfg(
        chat_model,
        "llm.few_shot=2",
        "llm.system_prompt=Solve the problem.",
        "llm.answer_format=boxed",
        "llm.answer_strict=false",
        "llm.max_prompt_tokens=0",
    )
    task = make_task(cfg)
    tok = m.load_tokenizer(chat_model)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert task.prompt_format().chat and task.stop_ids() == (tok.eos_token_id, end)
    scored = []
    real = answer_formats.reward
    monkeypatch.setattr(
        answer_formats, "reward", lambda text, target, **kw: scored.append(kw) or real(text, target, **kw)
    )
    seen = _spy_prompts(monkeypatch)
    stops = []
    real_sample = sampling.sample
    monkeypatch.setattr(sampling, "sample", lambda *a, **kw: stops.append(kw["eos_id"]) or real_sample(*a, **kw))
    task.prepare_run(tmp_path, **QUIET)
    summary = run_serial(cfg, tmp_path, echo=lambda *_: None)
    assert summary["outcome"] == "finished" and summary["env_steps"] == 24
    assert {tuple(s) for s in stops} == {(tok.eos_token_id, end)}  # generators and evaluations alike
    assert scored and all(kw == {"answer_format": "boxed", "strict": False} for kw in scored)
    texts = [tok.decode(ids) for ids in seen]
    assert all(t.startswith("<|im_start|>system\nSolve the problem.<|im_end|>\n<|im_start|>user\n") for t in texts)
    assert all(t.endswith("<|im_end|>\n<|im_start|>assistant\n") and t.count("<|im_start|>user") == 3 for t in texts)
    width = task.spec.prompt_tokens
    assert width == _longest(tok, task.prompt_format(), task.rl_problems() + task.heldout_problems())
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["policy"]
    assert any(v.shape[0] == len(tok) for v in ckpt.values())  # the resized vocabulary trained


@pytest.mark.parametrize(
    "sets, message",
    [
        (["llm.prompt_format=chatml"], "llm.prompt_format must be one of auto, plain, chat, got 'chatml'"),
        (["llm.answer_format=hash"], "llm.answer_format must be one of gsm8k, boxed, last_number, got 'hash'"),
        (["llm.max_prompt_tokens=-1"], "llm.max_prompt_tokens must be >= 0, got -1"),
        (["llm.few_shot=-2"], "llm.few_shot must be >= 0, got -2"),
    ],
)
def test_bad_keys_are_one_line(sets, message):
    with pytest.raises(ConfigError) as e:
        config.load(None, ["task.kind=llm", *sets])
    assert str(e.value) == message


def test_keys_without_effect_are_reported():
    res = config.load_resolved(
        None,
        [
            "task.kind=llm",
            "llm.train_file=x.jsonl",
            "llm.train_problems=10",
            "llm.few_shot_file=y.jsonl",
            "llm.answer_format=last_number",
            "llm.answer_strict=false",
        ],
    )
    notes = "\n".join(res.notes())
    assert "llm.train_problems = 10 has no effect: used only when llm.train_file is ''" in notes
    assert 'llm.few_shot_file = "y.jsonl" has no effect: used only when llm.few_shot > 0' in notes
    assert "llm.answer_strict = false has no effect: used only when llm.answer_format is not last_number" in notes


def test_a_start_record_of_other_prompts_is_not_paired(micro_dir, tmp_path):
    model = m.load(micro_dir).model
    make_task(_cfg(micro_dir, "llm.eval_size=4")).prepare_run(tmp_path, **QUIET)
    same = make_task(_cfg(micro_dir, "llm.eval_size=4")).final_summary(model, tmp_path)
    assert same["initial_accuracy"] is not None and "accuracy_difference_ci95_paired" in same
    other = make_task(_cfg(micro_dir, "llm.eval_size=4", "llm.system_prompt=Be exact.")).final_summary(model, tmp_path)
    assert other["initial_accuracy"] is None and "accuracy_difference_ci95_paired" not in other
