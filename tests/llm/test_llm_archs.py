"""Architectures and tokenizers other than the tiny Qwen2 and SmolLM2 (tests/llm/tiny_archs.py builds them
here: GPT-2, GPT-NeoX, OPT, Phi, Phi-3, Gemma, Mistral, Llama tied / untied / bf16 / with ChatML, BLOOM;
no pad token, pad == EOS, no EOS, EOS lists, BOS added or not, padded vocabularies). Each one passes the
start checks (asyncrl.tasks.llm.model_checks), trains a LoRA adapter on its own linear layers, sends it
in bfloat16 into a generator's copy whose sampled log-probs the learner recomputes with other padding,
and exports; the ones the task cannot run are refused at start in one line."""

from __future__ import annotations

import contextlib

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
import tiny_archs  # noqa: E402
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import gsm_problems, sampling  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402
from asyncrl.tasks.llm.export import to_pretrained  # noqa: E402
from asyncrl.tasks.llm.model_checks import check_start_model  # noqa: E402
from asyncrl.tasks.llm.token_log_probs import completion_log_probs  # noqa: E402
from asyncrl.tasks.llm.weights import flat_weights, load_flat  # noqa: E402

pytestmark = pytest.mark.timeout(180)
ACCEPTED = [
    "gpt2", "neox", "opt", "phi3", "phi", "gemma", "mistral", "llama-tied", "llama-chat", "bloom", "llama-bf16",
    "llama-noeos",
]  # fmt: skip
REFUSED = {
    "mamba": "depend on the padding",
    "bart": "BartForCausalLM: (sampling and recomputing log-probs failed|.*depend on the padding)",
    "gpt2-short": r"needs 172 positions .* has 64 \(max_position_embeddings\)",
    "llama-small-vocab": "the tokenizer has 400 tokens but the model's embedding has 397 rows",
}
SETS = ["llm.lora_rank=4", "llm.lora_alpha=8", "llm.few_shot=1", "llm.eval_size=2", "llm.temperature=1.5"]
START = [*SETS, "llm.few_shot=0", "llm.train_problems=50", "llm.max_new_tokens=12"]  # a quick prepare_run


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("archs"), {}

    def get(name):
        if name not in made:
            made[name] = tiny_archs.build(name, root / name)
        return made[name]

    return get


def _recomputed(model, s, pad_id, extra=9):
    """The learner's log-probs of ``s``'s completions with ``extra`` more pad tokens in front of each row."""
    b = len(s.input_ids)
    ids = torch.cat([torch.full((b, extra), pad_id), s.input_ids], 1)
    mask = torch.cat([torch.zeros(b, extra, dtype=torch.long), s.attention_mask], 1)
    with torch.no_grad():
        return completion_log_probs(model, ids, mask, s.completion_mask, temperature=1.5)


@pytest.mark.parametrize("name", ACCEPTED)
def test_architecture_samples_trains_its_adapter_sends_it_and_exports(zoo, name, tmp_path):
    path = zoo(name)
    task = make_task(micro_cfg(path, *SETS, "learner.weights_dtype=bfloat16"))
    assert check_start_model(task, path) < 1e-4  # the start checks pass (the adapter starts at zero)
    learner, actor = task.build_policy(), task.build_policy()
    assert any("lora_" in k for k, p in learner.named_parameters() if p.requires_grad)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the adapter moved, its values exactly bfloat16 (what the wire carries)
        for k, p in learner.named_parameters():
            if "lora_" in k:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.3).to(torch.bfloat16).float())
    load_flat(actor, flat_weights(learner, "bfloat16"))
    tok = m.load_tokenizer(path)
    fmt, stops = task.prompt_format(tok), task.stop_ids(tok)
    questions = [p.question for p in gsm_problems.make_splits(seed=0, n_train=0, n_heldout=2).heldout]
    prompts = fmt.encode(tok, [questions[0], questions[1][:25]])
    s = sampling.generate_group(
        actor, tok, prompts, 2, temperature=1.5, max_new_tokens=10, generator=gen, stop_ids=stops, calculator=True
    )
    assert s.input_ids.max() < learner.get_input_embeddings().weight.shape[0]
    ours = _recomputed(learner, s, tok.pad_token_id)
    assert ((ours - s.behavior_log_prob).abs() * s.policy_mask).max() < 1e-4  # generator == learner at one version
    exported = to_pretrained(learner)  # the adapter merged: a plain transformers model, saved and loaded back
    exported.save_pretrained(tmp_path / "out")
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True, dtype=torch.float32)
    assert ((_recomputed(back, s, tok.pad_token_id) - ours).abs() * s.policy_mask).max() < 1e-4


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_model_the_task_cannot_run_is_refused_at_start_in_one_line(zoo, name, tmp_path):
    task = make_task(micro_cfg(zoo(name), *START, "llm.lora_rank=0"))
    with pytest.raises(ValueError, match=REFUSED[name]) as err:
        task.prepare_run(tmp_path / "run", echo=lambda *_: None)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "llm-start.json").exists()


def test_lora_target_modules_the_model_lacks_are_one_line_naming_its_layers(zoo, tmp_path):
    task = make_task(micro_cfg(zoo("gpt2"), *START, "llm.lora_target_modules=['q_proj', 'v_proj']"))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel: llm.lora_target_modules .* c_attn, c_fc, c_proj") as err:
        task.prepare_run(tmp_path / "run", echo=lambda *_: None)
    assert "\n" not in str(err.value)


def test_lora_dropout_leaves_the_base_models_own_dropout_off(zoo):
    """GPT-2's config sets dropout 0.1; with llm.lora_dropout the learner's gradient forwards run the
    adapter's dropout only: with the adapter at zero, their log-probs are those without gradient."""
    from asyncrl.tasks.llm import lora

    path = zoo("gpt2-dropout")
    cfg = micro_cfg(path, *SETS, "llm.lora_dropout=0.5")
    model = make_task(cfg).build_policy()
    forward = lora.dropout_forwards(model, contextlib.nullcontext)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    mask, done = torch.ones_like(ids), torch.ones(1, 4, dtype=torch.bool)
    with forward():
        with_grad = completion_log_probs(model, ids, mask, done)
    with torch.no_grad(), forward():
        without = completion_log_probs(model, ids, mask, done)
    assert with_grad.requires_grad and torch.allclose(with_grad, without, atol=1e-6)


def test_a_tokenizer_without_eos_or_pad_pads_with_the_models_stop_token(zoo):
    tok = m.load_tokenizer(zoo("llama-noeos"))
    assert tok.eos_token is None and tok.pad_token == "<|endoftext|>"
    assert make_task(micro_cfg(zoo("llama-noeos"))).stop_ids(tok) == (tok.pad_token_id,)


def test_gpt2_with_lora_runs_serially_and_exports(zoo, tmp_path):
    """GPT-2 (no pad token, absolute positions, Conv1D layers) through `asyncrl run --serial`'s code with a
    LoRA adapter that moves (a reward on the completion's length parity), then `asyncrl llm export`."""
    from click.testing import CliRunner
    from transformers import AutoModelForCausalLM

    from asyncrl.cli.llm import llm
    from asyncrl.cli.rundir import write_config_json
    from asyncrl.core import config
    from asyncrl.run.serial import run_serial
    from asyncrl.tasks.llm import answer_formats

    run, quiet = tmp_path / "run", {"echo": lambda *_: None}
    sets = [*START, "task.kind=llm", f"llm.model_dir={zoo('gpt2')}", "llm.warmup_steps=0", "llm.group_size=2"]
    sets += ["llm.prompts_per_slot=2", "algo.lr=1e-2", "learner.slots_per_batch=1", "learner.num_slots=2"]
    sets += ["run.num_actors=1", "run.total_env_steps=8", "run.log_every_s=1000"]
    res = config.load_resolved(None, sets)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
        make_task(res.config).prepare_run(run, **quiet)
        write_config_json(run, res)
        run_serial(res.config, run, **quiet)
    out = CliRunner().invoke(llm, ["export", str(run), str(tmp_path / "exported")])
    assert out.exit_code == 0, out.output
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True)
    start = m.load(zoo("gpt2")).model
    assert any(not torch.equal(a, b) for a, b in zip(back.parameters(), start.parameters()))  # the adapter moved
