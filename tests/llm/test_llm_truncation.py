"""Sampling as users configure it: top-k and top-p (nucleus) after the temperature, by hand; the sampler
draws only from the renormalised kept set and records its log-probs; the learner's recomputation replays
the same transform, so the ratio at zero lag is 1."""

import math

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from asyncrl.core import config  # noqa: E402
from asyncrl.core.config import ConfigError  # noqa: E402
from asyncrl.tasks.llm import gsm_problems, model, sampling  # noqa: E402
from asyncrl.tasks.llm.token_log_probs import (  # noqa: E402
    completion_log_probs,
    truncate_logits,
    truncation_threshold,
)

NEG = float("-inf")


@pytest.fixture(scope="module")
def micro(micro_dir):
    return model.load(micro_dir)


def test_top_k_keeps_the_k_largest_and_their_ties():
    z = torch.tensor([[1.0, 3.0, 2.0, 0.0, 2.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    assert truncation_threshold(z, top_k=0, top_p=1.0) is None  # off: the logits untouched
    assert truncate_logits(z) is z and truncate_logits(z, top_k=5) is z  # k >= V: nothing to remove
    out = truncate_logits(z, top_k=2)
    # row 0: the 2nd largest is 2.0, held by two tokens: both stay (ties with the k-th stay)
    assert out.tolist() == [[NEG, 3.0, 2.0, NEG, 2.0], [5.0, 4.0, NEG, NEG, NEG]]


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    probs = torch.tensor([[0.5, 0.1, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    z = probs.log()
    # row 0 ranked 0.5, 0.3, 0.1, 0.1: 0.5 < 0.7, 0.5 + 0.3 >= 0.7 -> {0, 2}; row 1: ties, all stay
    assert torch.isinf(truncate_logits(z, top_p=0.7)).tolist() == [[False, True, False, True], [False] * 4]
    assert torch.isinf(truncate_logits(z, top_p=0.5)).tolist()[0] == [False, True, True, True]  # 0.5 reaches 0.5
    assert torch.isinf(truncate_logits(z, top_p=0.51)).tolist()[0] == [False, True, False, True]
    tiny = truncate_logits(z, top_p=1e-9)  # the most likely token always stays
    assert torch.isfinite(tiny).sum(1).tolist() == [1, 4]
    # renormalised over the nucleus: 0.5 / 0.8 and 0.3 / 0.8
    lp = torch.log_softmax(truncate_logits(z, top_p=0.7), -1)[0]
    assert lp[0].item() == pytest.approx(math.log(0.5 / 0.8), abs=1e-6)
    assert lp[2].item() == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)


def test_top_p_runs_on_the_top_k_renormalised_distribution_and_keep_forces_a_token():
    z = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top-k 3 renormalises to 4/9, 3/9, 2/9: top_p 0.7 needs 4/9 + 3/9 = 0.78 -> {0, 1}
    assert torch.isfinite(truncate_logits(z, top_k=3, top_p=0.7)).tolist() == [[True, True, False, False]]
    # without top-k the nucleus of 0.75 is {0, 1, 2} (0.4 + 0.3 = 0.7 < 0.75)
    assert torch.isfinite(truncate_logits(z, top_p=0.75)).tolist() == [[True, True, True, False]]
    forced = truncate_logits(z, top_k=1, keep=torch.tensor([3]))
    assert torch.isfinite(forced).tolist() == [[True, False, False, True]]


class _Fixed(torch.nn.Module):
    """A stand-in causal LM whose next-token logits are ``logits`` at every position."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.config = logits, None

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, past_key_values=None):
        out = self.logits.expand(input_ids.shape[0], input_ids.shape[1], -1).clone()
        return type("Out", (), {"logits": out})()


def test_the_sampler_draws_from_the_renormalised_nucleus_only():
    probs = torch.tensor([0.05, 0.4, 0.3, 0.2, 0.05])  # token 0 is EOS (rare), the nucleus of 0.8 is {1, 2, 3}
    lm = _Fixed(probs.log())
    n = 20000
    ids, mask = torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long)
    kw = dict(eos_id=0, pad_id=0, max_new_tokens=1, compact=False, generator=torch.Generator().manual_seed(0))
    out = sampling.sample(lm, ids, mask, top_p=0.8, **kw)
    drawn = out.input_ids[:, 1]
    freq = torch.bincount(drawn, minlength=5).double() / n
    want = torch.tensor([0.0, 0.4, 0.3, 0.2, 0.0], dtype=torch.double) / 0.9
    assert freq[0] == 0 and freq[4] == 0  # outside the nucleus: never drawn
    assert torch.allclose(freq, want, atol=0.015)
    # the behaviour log-prob is that of the renormalised distribution it was drawn from
    assert torch.allclose(out.behavior_log_prob[:, 0], (want.float()[drawn]).log(), atol=1e-6)
    # top_p = 1, top_k = 0 is the plain softmax, bit for bit the draws of a call without them
    plain = sampling.sample(lm, ids, mask, **{**kw, "generator": torch.Generator().manual_seed(0)})
    same = sampling.sample(lm, ids, mask, top_p=1.0, top_k=0, **{**kw, "generator": torch.Generator().manual_seed(0)})
    assert torch.equal(plain.input_ids, same.input_ids) and torch.equal(plain.behavior_log_prob, same.behavior_log_prob)
    assert (plain.input_ids[:, 1] == 4).any()  # the tail is drawn without truncation


def test_top_k_1_or_a_tiny_nucleus_is_greedy_with_log_prob_0(micro):
    lm, tok = micro
    prompts = [gsm_problems.format_prompt(p) for p in gsm_problems.make_splits(seed=2, n_train=0, n_heldout=3).heldout]
    ids, mask = sampling.encode_prompts(tok, prompts)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=8)
    greedy = sampling.sample(lm, ids, mask, greedy=True, **kw)
    for trunc in ({"top_k": 1}, {"top_p": 1e-6}):
        out = sampling.sample(lm, ids, mask, temperature=1.3, generator=torch.Generator().manual_seed(1), **trunc, **kw)
        assert torch.equal(out.input_ids, greedy.input_ids)
        assert (out.behavior_log_prob[out.policy_mask] == 0).all()  # probability 1 after renormalisation


def test_sampler_and_config_refuse_bad_truncation(micro):
    lm, tok = micro
    ids, mask = sampling.encode_prompts(tok, ["Question: x"])
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}):
        with pytest.raises(ValueError, match="top_"):
            sampling.sample(lm, ids, mask, eos_id=0, pad_id=0, max_new_tokens=2, **bad)
    for key in (
        "llm.top_p=0",
        "llm.top_p=1.01",
        "llm.top_k=-2",
        "llm.logprob_chunk_tokens=0",
        "llm.micro_batch_rows=-1",
    ):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            config.load(None, ["task.kind=llm", key])


@pytest.mark.parametrize("trunc", [{"top_k": 12}, {"top_p": 0.8}, {"top_k": 30, "top_p": 0.9}])
def test_zero_lag_ratio_is_1_under_the_sampled_distribution(micro, trunc):
    lm, tok = micro
    prompts = [gsm_problems.format_prompt(p) for p in gsm_problems.make_splits(seed=5, n_train=0, n_heldout=3).heldout]
    s = sampling.generate_group(
        lm, tok, prompts, 3, temperature=0.8, max_new_tokens=16, generator=torch.Generator().manual_seed(3), **trunc
    )
    m = s.policy_mask
    with torch.no_grad():
        lp = completion_log_probs(lm, s.input_ids, s.attention_mask, s.completion_mask, temperature=0.8, **trunc)
        plain = completion_log_probs(lm, s.input_ids, s.attention_mask, s.completion_mask, temperature=0.8)
    ratio = (lp - s.behavior_log_prob)[m].exp()
    assert (ratio - 1).abs().max().item() < 1e-4
    # the test can fail: the untruncated log-probs are those of another distribution (lower: mass outside)
    assert ((plain - s.behavior_log_prob)[m] < -1e-3).any()
    assert (plain[m] <= lp[m] + 1e-6).all()


def test_the_learner_keeps_a_sampled_token_that_left_its_nucleus(micro):
    """After the policy moved (here: the same logits, but a token the nucleus does not hold), the
    learner's log-prob of that token is finite: its logit against the nucleus and itself."""
    lm, tok = micro
    problem = gsm_problems.make_splits(seed=1, n_train=0, n_heldout=1).heldout[0]
    ids, mask = sampling.encode_prompts(tok, [gsm_problems.format_prompt(problem)])
    with torch.no_grad():
        z = lm(input_ids=ids, attention_mask=mask, position_ids=sampling.position_ids(mask)).logits[0, -1]
    outside = int(z.argmin())  # the least likely token: outside any nucleus of 0.5
    full = torch.cat([ids, torch.tensor([[outside]])], 1)
    fmask = torch.ones_like(full)
    with torch.no_grad():
        lp = completion_log_probs(lm, full, fmask, torch.ones(1, 1, dtype=torch.bool), top_p=0.5)
    stays = torch.isfinite(truncate_logits(z[None], top_p=0.5))[0]
    assert not stays[outside]
    want = z[outside] - torch.logsumexp(z[stays | (torch.arange(len(z)) == outside)], 0)
    assert torch.isfinite(lp).all() and lp[0, 0].item() == pytest.approx(want.item(), abs=1e-5)


def test_spaces_name_the_truncation_so_a_mismatched_actor_is_refused(micro_dir):
    from asyncrl.tasks import make_task

    def action(*sets):
        cfg = config.load(None, ["task.kind=llm", f"llm.model_dir={micro_dir}", "llm.warmup_steps=0", *sets])
        return make_task(cfg).spaces["action"]

    assert action() == f"completion tokens [{config.LLMConfig().max_new_tokens}] at temperature 1.0"
    assert action("llm.top_p=0.9") != action() and "top_p 0.9" in action("llm.top_p=0.9")
    assert "top_k 20" in action("llm.top_k=20")
