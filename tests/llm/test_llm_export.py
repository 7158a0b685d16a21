"""``asyncrl llm export RUN DIR``: a run's trained policy as a Hugging Face directory that transformers
loads and that computes the learner's log-probs; the start model's tokenizer, chat template and the
run's stop ids with it; one line for what cannot be exported."""

import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from asyncrl.cli.llm import llm  # noqa: E402
from asyncrl.cli.rundir import write_config_json  # noqa: E402
from asyncrl.core import config  # noqa: E402
from asyncrl.core.state import LearnerState  # noqa: E402
from asyncrl.run.serial import run_serial  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import answer_formats, gsm_problems, sampling  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402
from asyncrl.tasks.llm.export import EXPORT_STAMP, ExportError, to_pretrained  # noqa: E402

QUIET = {"echo": lambda *_: None}
SETS = [
    "task.kind=llm",
    "llm.warmup_steps=0",
    "llm.group_size=2",
    "llm.prompts_per_slot=2",
    "llm.max_new_tokens=12",
    "llm.eval_size=4",
    "llm.temperature=1.5",
    "algo.num_epochs=1",
    "algo.num_minibatches=1",
    "algo.lr=1e-2",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "run.num_actors=2",
    "run.total_env_steps=16",
    "run.log_every_s=1000",
]


@pytest.fixture(scope="module")
def chat_run(chat_model, tmp_path_factory):
    """(run directory, config) of a serial RL run from the chat model that moved its weights (a reward on
    the completion's length parity: the untrained model solves nothing)."""
    run = tmp_path_factory.mktemp("run") / "run"
    res = config.load_resolved(None, [*SETS, f"llm.model_dir={chat_model}"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
        make_task(res.config).prepare_run(run, **QUIET)
        write_config_json(run, res)
        run_serial(res.config, run, **QUIET)
    return run, res.config


def test_export_loads_with_transformers_and_gives_the_learners_log_probs(chat_run, chat_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    run, cfg = chat_run
    out = tmp_path / "exported"
    res = CliRunner().invoke(llm, ["export", str(run), str(out)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"exported {out}: policy version 2 of {run}")
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    # the learner's model: its state as a resumed learner reads it from the run's checkpoint
    task = make_task(cfg)
    state = LearnerState(cfg, task.spec, task)
    state.load(run / "checkpoint.pt")
    assert state.version == 2
    start = m.load(chat_model)
    assert any(not torch.equal(a, b) for a, b in zip(state.policy.parameters(), start.model.parameters()))
    # a batch: sampled completions of chat-templated prompts, scored by both at the run's temperature
    fmt, stops = task.prompt_format(start.tokenizer), task.stop_ids(start.tokenizer)
    questions = [p.question for p in gsm_problems.make_splits(seed=0, n_train=0, n_heldout=3).heldout]
    prompts = fmt.encode(start.tokenizer, questions)
    s = sampling.generate_group(
        state.policy,
        start.tokenizer,
        prompts,
        2,
        temperature=1.5,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(0),
        stop_ids=stops,
    )
    with torch.no_grad():
        lp = [
            sampling.completion_log_probs(
                net, s.input_ids, s.attention_mask, s.completion_mask, temperature=cfg.llm.temperature
            )
            for net in (state.policy, model)
        ]
    assert torch.equal(lp[0], lp[1])
    assert next(model.parameters()).dtype == torch.float32  # the dtype the learner trained in
    # the start model's tokenizer and chat template, the run's stop ids
    assert tok.chat_template == start.tokenizer.chat_template and tok.chat_template
    assert fmt.encode(tok, questions) == prompts
    assert GenerationConfig.from_pretrained(out).eos_token_id == list(stops) and len(stops) == 2
    stamp = json.loads((out / EXPORT_STAMP).read_text())
    assert stamp["checkpoint"] == {"file": "checkpoint.pt", "version": 2, "learner_iterations": 2, "env_steps": 16}
    assert stamp["run_dir"] == str(run.resolve()) and stamp["dtype"] == "float32" and not stamp["adapter_merged"]
    assert stamp["stop_ids"] == list(stops) and stamp["start_model"] == str(chat_model.resolve())


def test_what_cannot_be_exported_is_one_line(chat_run, micro_dir, tmp_path):
    run, _ = chat_run

    def refused(args, message):
        res = CliRunner().invoke(llm, ["export", *map(str, args)])
        assert res.exit_code == 2 and res.output.strip() == f"Error: {message}"

    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    refused([run, full], f"{full} exists and is not an empty directory; name a new one")
    refused([tmp_path / "nope", tmp_path / "o"], f"run directory not found: {tmp_path / 'nope'}")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused([empty, tmp_path / "o"], f"{empty} is not a run directory (no config.json, no checkpoint)")
    unfinished = tmp_path / "unfinished"  # a run stopped before its first checkpoint
    unfinished.mkdir()
    write_config_json(unfinished, config.load_resolved(None, [*SETS, f"llm.model_dir={micro_dir}"]))
    refused(
        [unfinished, tmp_path / "o"],
        f"{unfinished} has no readable checkpoint to export (a run writes checkpoint.pt when it ends)",
    )
    control = tmp_path / "control"
    control.mkdir()
    write_config_json(control, config.load_resolved(None, ["env.id=asyncrl/Corridor-v0"]))
    refused(
        [control, tmp_path / "o"], f"{control} is a control-task run; export writes language models (task.kind = llm)"
    )
    assert not (tmp_path / "o").exists()
    # an empty DIR is fine
    (tmp_path / "e").mkdir()
    assert CliRunner().invoke(llm, ["export", str(run), str(tmp_path / "e")]).exit_code == 0
    assert (tmp_path / "e" / "model.safetensors").is_file()


def test_to_pretrained_keeps_full_weights_and_refuses_other_modules(micro_dir):
    lm = m.load(micro_dir).model
    assert to_pretrained(lm) is lm
    with pytest.raises(ExportError, match="cannot export a Linear"):
        to_pretrained(torch.nn.Linear(2, 2))


def test_to_pretrained_merges_a_lora_adapter(micro_dir):
    """The hook for LoRA runs: a peft model becomes a plain transformers model with the adapter merged
    into its weights, computing the same logits."""
    peft = pytest.importorskip("peft")
    from transformers import PreTrainedModel

    lm = m.load(micro_dir).model
    lora = peft.get_peft_model(lm, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))  # B starts at 0: move it
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        want = lora(input_ids=ids).logits
        merged = to_pretrained(lora)
        got = merged(input_ids=ids).logits
    assert isinstance(merged, PreTrainedModel) and not any("lora" in n for n, _ in merged.named_parameters())
    assert (got - want).abs().max() < 1e-4
