"""The held-out evaluation during RL (llm.eval_every) and its draws: one CPU stream per problem, so every
evaluation of a run (before RL on a model loaded from disk, during RL on the learner's policy, after RL)
makes the same draws for a problem, in any batch and on any device."""

import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.core import config  # noqa: E402
from asyncrl.core.config import ConfigError  # noqa: E402
from asyncrl.run.serial import run_serial  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import answer_formats, gsm_problems, sampling  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402
from asyncrl.tasks.llm.eval_draws import problem_seed, problem_uniforms  # noqa: E402

QUIET = {"echo": lambda *_: None}


def _cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.eval_size=8",
        "llm.temperature=1.5",
        "algo.num_epochs=1",
        "algo.num_minibatches=1",
        "algo.lr=1e-3",
        "learner.slots_per_batch=2",
        "learner.num_slots=2",
        "run.num_actors=2",
        "run.total_env_steps=32",  # 4 learner iterations of 8 completions
        "run.log_every_s=1000",
        *extra,
    )


def test_problem_uniforms_are_one_cpu_stream_per_problem():
    u = problem_uniforms(7, 5, 12)
    assert u.shape == (5, 12) and u.dtype == torch.float32 and u.device.type == "cpu"
    assert ((u >= 0) & (u < 1)).all()
    assert torch.equal(problem_uniforms(7, 2, 12, start=3), u[3:])  # a problem's row, whoever is beside it
    assert torch.equal(problem_uniforms(7, 5, 20)[:, :12], u)  # a longer budget extends each row
    expected = torch.rand(12, generator=torch.Generator().manual_seed(problem_seed(7, 4)))
    assert torch.equal(u[4], expected)
    assert not torch.equal(problem_uniforms(8, 5, 12), u) and len({tuple(r.tolist()) for r in u}) == 5
    with pytest.raises(ValueError, match="steps >= 1"):
        problem_uniforms(7, 5, 0)
    with pytest.raises(ValueError, match=">= 0"):
        problem_seed(-1, 0)


class _Flat(torch.nn.Module):
    """The micro model with every logit replaced by 0: each token is drawn uniformly from the vocabulary,
    so the tokens of a row are a function of that row's uniforms alone (EOS included), and two runs
    that draw alike must write the same tokens exactly, whatever else their float sums do."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.config = lm, lm.config

    @property
    def device(self):
        return next(self.lm.parameters()).device

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, cache=None):
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            cache=cache,
        )
        out.logits = torch.zeros_like(out.logits)
        return out


def _flat_texts(model, tok, problems, uniforms, batch_size):
    return sampling.eval_completions(
        model, tok, problems, greedy=False, max_new_tokens=10, batch_size=batch_size, uniforms=uniforms
    )


def test_a_problems_draws_do_not_depend_on_its_batch_or_the_device(micro_dir):
    loaded = m.load(micro_dir)
    flat, tok = _Flat(loaded.model), loaded.tokenizer
    problems = gsm_problems.make_splits(seed=0, n_train=0, n_heldout=7).heldout
    u = problem_uniforms(0, len(problems), 10)
    one = _flat_texts(flat, tok, problems, u, batch_size=7)
    assert len(set(one)) == 7  # 10 uniform draws from the whole vocabulary: every problem its own text
    assert _flat_texts(flat, tok, problems, u, batch_size=3) == one
    assert _flat_texts(flat, tok, problems, u, batch_size=1) == one
    assert _flat_texts(flat, tok, problems[4:], u[4:], batch_size=2) == one[4:]  # the problems beside it
    with pytest.raises(ValueError, match=r"uniforms must be \[B, >= max_new_tokens\]"):
        _flat_texts(flat, tok, problems, u[:, :5], batch_size=7)
    if torch.cuda.is_available():  # the device the learner's policy may be on: the same draws, moved there
        assert _flat_texts(_Flat(m.load(micro_dir).model.cuda()), tok, problems, u, batch_size=4) == one


def _spy_eval_texts(monkeypatch) -> list:
    """The texts of every call of sampling.eval_completions (the held-out evaluation's batches)."""
    calls, real = [], sampling.eval_completions
    monkeypatch.setattr(sampling, "eval_completions", lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
    return calls


def test_every_evaluation_of_a_run_makes_the_same_draws(micro_dir, tmp_path, monkeypatch):
    """Before RL (prepare_run: a model loaded from disk), during RL (the learner's policy in the
    consumer, after each iteration) and after RL (final_summary): the same texts for every problem when
    the policy has not moved (a constant reward: every group is silent and dropped, no optimizer step)."""
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: 0.0)
    calls = _spy_eval_texts(monkeypatch)
    cfg = _cfg(micro_dir, "llm.eval_every=1", "llm.eval_batch_size=3")
    make_task(cfg).prepare_run(tmp_path, **QUIET)
    summary = run_serial(cfg, tmp_path, **QUIET)
    texts = [sum(calls[i : i + 3], []) for i in range(0, len(calls), 3)]  # 8 problems in batches of 3
    assert len(texts) == 5  # before, after iterations 1-3 (not after the last: the final evaluation is that)
    assert all(t == texts[0] for t in texts) and len(set(texts[0])) > 1
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_accuracy" in r]
    assert [(r["iteration"], r["eval_version"]) for r in evals] == [(1, 1), (2, 2), (3, 3)]
    assert all(r["eval_solved_only_before"] == r["eval_solved_only_after"] == 0 for r in evals)
    assert summary["solved_only_before"] == summary["solved_only_after"] == 0


def test_evaluations_during_rl_in_metrics_and_summary(micro_dir, tmp_path, monkeypatch):
    # the untrained micro model solves nothing: a reward on the completion's length parity makes groups
    # informative (the learner moves) and the held-out scores differ between versions
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
    cfg = _cfg(micro_dir, "llm.eval_every=2")
    make_task(cfg).prepare_run(tmp_path, **QUIET)
    lines = []
    summary = run_serial(cfg, tmp_path, echo=lines.append)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    (ev,) = [r for r in rows if "eval_accuracy" in r]  # iteration 2; 4 is the run's last: the final evaluation
    assert ev["iteration"] == ev["eval_version"] == 2 and ev["eval_problems"] == 8 and ev["eval_s"] > 0
    n = 8
    diff = (ev["eval_solved_only_after"] - ev["eval_solved_only_before"]) / n
    assert ev["eval_accuracy_difference"] == pytest.approx(diff)
    assert ev["eval_accuracy"] == pytest.approx(summary["initial_accuracy"] + diff)
    assert ev["eval_accuracy_difference_ci95_paired_low"] <= diff <= ev["eval_accuracy_difference_ci95_paired_high"]
    assert any(line.startswith("llm: held-out accuracy") and "(version 2," in line for line in lines)
    curve = summary["evaluations"]
    assert [(c["when"], c["version"]) for c in curve] == [("before", 0), ("during", 2), ("after", 4)]
    assert curve[1]["accuracy"] == ev["eval_accuracy"] and curve[-1]["accuracy"] == summary["final_accuracy"]
    assert curve[-1]["accuracy_difference_ci95_paired"] == summary["accuracy_difference_ci95_paired"]
    assert summary["periodic_eval_s"] == pytest.approx(ev["eval_s"])
    # evaluation draws nothing from training: the same run without it learns the same weights
    other = tmp_path / "off"
    make_task(_cfg(micro_dir)).prepare_run(other, **QUIET)
    run_serial(_cfg(micro_dir), other, **QUIET)
    a = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["policy"]
    b = torch.load(other / "checkpoint.pt", weights_only=True)["policy"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any("eval_accuracy" in json.loads(x) for x in (other / "metrics.jsonl").read_text().splitlines())


def test_eval_every_is_checked_and_reported_without_effect():
    with pytest.raises(ConfigError, match=r"^llm.eval_every must be >= 0, got -1$"):
        config.load(None, ["task.kind=llm", "llm.eval_every=-1"])
    notes = "\n".join(config.load_resolved(None, ["task.kind=llm", "llm.eval_size=0", "llm.eval_every=5"]).notes())
    assert "llm.eval_every = 5 has no effect: used only when llm.eval_size > 0" in notes
