"""Sampler (reproducible, masks, behaviour log-probs = learner log-probs at zero lag), evaluation, warm-up smoke."""
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from asyncrl.tasks.llm import gsm, model, sampling, warmup  # noqa: E402

PROBLEMS = gsm.make_splits(seed=11, n_train=64, n_heldout=4)


@pytest.fixture(scope="module")
def micro(micro_dir):
    return model.load(micro_dir)


def _group(micro, seed, temperature=1.0, G=3):
    lm, tok = micro
    prompts = [gsm.format_prompt(p) for p in PROBLEMS.heldout[:2]]
    return sampling.generate_group(lm, tok, prompts, G, temperature=temperature, max_new_tokens=12,
                                   generator=torch.Generator().manual_seed(seed))


def test_generate_group_is_bit_reproducible_and_prompt_major(micro):
    a, b, c = _group(micro, 1), _group(micro, 1), _group(micro, 2)
    for x, y in zip(a, b):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    assert not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape[0] == 6 and a.completion_mask.shape == a.behavior_log_prob.shape
    # rows 0..2 share prompt 0, rows 3..5 prompt 1
    p = a.prompt_len
    assert torch.equal(a.input_ids[0, :p], a.input_ids[2, :p]) and not torch.equal(a.input_ids[0, :p], a.input_ids[3, :p])


def test_masks_stop_after_eos_and_padding_gets_no_log_prob(micro):
    lm, tok = micro
    s = _group(micro, 3)
    comp = s.input_ids[:, s.prompt_len:]
    for row, m, lp in zip(comp, s.completion_mask, s.behavior_log_prob):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()          # a prefix
        assert (row[n:] == tok.pad_token_id).all() and (lp[n:] == 0).all() and (lp[:n] < 0).all()
        eos = (row[:n] == tok.eos_token_id).nonzero()
        assert eos.numel() == 0 or int(eos[0]) == n - 1  # EOS, if any, is the last masked token
    assert torch.equal(s.attention_mask[:, s.prompt_len:], s.completion_mask.long())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_zero_lag_behaviour_log_probs_match_the_learner(micro, temperature):
    lm, _ = micro
    s = _group(micro, 4, temperature)
    with torch.no_grad():
        lp = sampling.completion_log_probs(lm, s.input_ids, s.attention_mask, s.completion_mask,
                                           temperature=temperature)
    assert lp.shape == s.behavior_log_prob.shape and (lp[~s.completion_mask] == 0).all()
    assert (lp - s.behavior_log_prob).abs().max().item() < 1e-4


def test_left_padding_does_not_change_a_row(micro):
    lm, tok = micro
    prompts = [gsm.format_prompt(PROBLEMS.heldout[0])]
    prompts.append(prompts[0].replace("Question:", "Question: and more words here"))
    ids, mask = sampling.encode_prompts(tok, prompts)
    assert mask[0, 0] == 0   # the shorter prompt is left-padded
    both = sampling.sample(lm, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6, greedy=True)
    ids0, mask0 = sampling.encode_prompts(tok, prompts[:1])
    alone = sampling.sample(lm, ids0, mask0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6, greedy=True)
    n = alone.completion_mask.shape[1]
    assert torch.equal(both.input_ids[0, both.prompt_len:both.prompt_len + n], alone.input_ids[0, alone.prompt_len:])
    assert torch.allclose(both.behavior_log_prob[0, :n], alone.behavior_log_prob[0], atol=1e-5)


def test_sampler_rejects_bad_arguments(micro):
    lm, tok = micro
    ids, mask = sampling.encode_prompts(tok, ["Question: x"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        sampling.sample(lm, ids, mask, eos_id=0, pad_id=0, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        sampling.sample(lm, ids, mask, eos_id=0, pad_id=0, max_new_tokens=2, temperature=0.0)
    with pytest.raises(ValueError, match="G >= 1"):
        sampling.generate_group(lm, tok, ["x"], 0, temperature=1.0, max_new_tokens=2, generator=None)


def test_evaluate_is_batching_invariant_and_in_range(micro):
    lm, tok = micro

    acc = sampling.evaluate(lm, tok, PROBLEMS.heldout, max_new_tokens=4, batch_size=3)
    assert acc == sampling.evaluate(lm, tok, PROBLEMS.heldout, max_new_tokens=4, batch_size=2)  # greedy: batching-invariant
    assert 0.0 <= acc <= 1.0 and sampling.evaluate(lm, tok, [], max_new_tokens=4) == 0.0
    assert sum(gsm.reward(gsm.format_completion(p), p.target) for p in PROBLEMS.heldout) == len(PROBLEMS.heldout)


def test_warmup_smoke_lowers_loss_and_is_deterministic(micro_dir):
    runs = []
    for _ in range(2):
        lm, tok = model.load(micro_dir)
        losses = []
        res = warmup.warmup(lm, tok, PROBLEMS.train, steps=8, seed=3, batch_size=8, lr=1e-2, warmup_steps=2,
                            log=lambda s, loss: losses.append(loss), log_every=1)
        runs.append((res, losses, torch.cat([p.detach().flatten() for p in lm.parameters()])))
    (res, losses, params), (res2, _, params2) = runs
    assert res.steps == 8 and res.tokens > 0 and losses[-1] < losses[0]
    assert torch.equal(params, params2) and res.final_loss == res2.final_loss
    with pytest.raises(ValueError, match="steps >= 1"):
        warmup.warmup(lm, tok, PROBLEMS.train, steps=0, seed=0)


def test_epoch_order_uses_each_example_once_in_length_groups():
    lengths = [5, 50, 6, 51, 7, 52, 8, 53, 9, 54]
    order = warmup._epoch_order(lengths, 2, torch.Generator().manual_seed(0), pool=5)
    assert len(order) == len(set(order)) == 10
    assert order == warmup._epoch_order(lengths, 2, torch.Generator().manual_seed(0), pool=5)
    # within a window of 5 batches sorted by length, each batch pairs neighbours
    spans = [abs(lengths[order[i]] - lengths[order[i + 1]]) for i in range(0, 10, 2)]
    assert sorted(spans)[:4] == [1, 1, 1, 1]
