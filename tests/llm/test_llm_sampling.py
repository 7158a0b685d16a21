"""Sampler (reproducible, masks, behaviour log-probs = learner log-probs at zero lag), evaluation, warm-up smoke."""

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from asyncrl.tasks.llm import gsm_answers, gsm_problems, model, sampling, warmup  # noqa: E402

PROBLEMS = gsm_problems.make_splits(seed=11, n_train=64, n_heldout=4)


@pytest.fixture(scope="module")
def micro(micro_dir):
    return model.load(micro_dir)


def _group(micro, seed, temperature=1.0, G=3):
    lm, tok = micro
    prompts = [gsm_problems.format_prompt(p) for p in PROBLEMS.heldout[:2]]
    return sampling.generate_group(
        lm, tok, prompts, G, temperature=temperature, max_new_tokens=12, generator=torch.Generator().manual_seed(seed)
    )


def test_generate_group_is_bit_reproducible_and_prompt_major(micro):
    a, b, c = _group(micro, 1), _group(micro, 1), _group(micro, 2)
    for x, y in zip(a, b):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    assert not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape[0] == 6 and a.completion_mask.shape == a.behavior_log_prob.shape
    # rows 0..2 share prompt 0, rows 3..5 prompt 1
    p = a.prompt_len
    assert torch.equal(a.input_ids[0, :p], a.input_ids[2, :p]) and not torch.equal(
        a.input_ids[0, :p], a.input_ids[3, :p]
    )


def test_masks_stop_after_eos_and_padding_gets_no_log_prob(micro):
    lm, tok = micro
    s = _group(micro, 3)
    comp = s.input_ids[:, s.prompt_len :]
    for row, m, lp in zip(comp, s.completion_mask, s.behavior_log_prob):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # a prefix
        assert (row[n:] == tok.pad_token_id).all() and (lp[n:] == 0).all() and (lp[:n] < 0).all()
        eos = (row[:n] == tok.eos_token_id).nonzero()
        assert eos.numel() == 0 or int(eos[0]) == n - 1  # EOS, if any, is the last masked token
    assert torch.equal(s.attention_mask[:, s.prompt_len :], s.completion_mask.long())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_zero_lag_behaviour_log_probs_match_the_learner(micro, temperature):
    lm, _ = micro
    s = _group(micro, 4, temperature)
    with torch.no_grad():
        lp = sampling.completion_log_probs(
            lm, s.input_ids, s.attention_mask, s.completion_mask, temperature=temperature
        )
    assert lp.shape == s.behavior_log_prob.shape and (lp[~s.completion_mask] == 0).all()
    assert (lp - s.behavior_log_prob)[s.policy_mask].abs().max().item() < 1e-4


def test_left_padding_does_not_change_a_row(micro):
    lm, tok = micro
    prompts = [gsm_problems.format_prompt(PROBLEMS.heldout[0])]
    prompts.append(prompts[0].replace("Question:", "Question: and more words here"))
    ids, mask = sampling.encode_prompts(tok, prompts)
    assert mask[0, 0] == 0  # the shorter prompt is left-padded
    both = sampling.sample(
        lm, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6, greedy=True
    )
    ids0, mask0 = sampling.encode_prompts(tok, prompts[:1])
    alone = sampling.sample(
        lm, ids0, mask0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6, greedy=True
    )
    n = alone.completion_mask.shape[1]
    assert torch.equal(both.input_ids[0, both.prompt_len : both.prompt_len + n], alone.input_ids[0, alone.prompt_len :])
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
    assert acc == sampling.evaluate(
        lm, tok, PROBLEMS.heldout, max_new_tokens=4, batch_size=2
    )  # greedy: batching-invariant
    assert 0.0 <= acc <= 1.0 and sampling.evaluate(lm, tok, [], max_new_tokens=4) == 0.0
    assert sum(gsm_answers.reward(gsm_problems.format_completion(p), p.target) for p in PROBLEMS.heldout) == len(
        PROBLEMS.heldout
    )


def test_warmup_smoke_lowers_loss_and_is_deterministic(micro_dir):
    runs = []
    for _ in range(2):
        lm, tok = model.load(micro_dir)
        losses = []
        res = warmup.warmup(
            lm,
            tok,
            PROBLEMS.train,
            steps=8,
            seed=3,
            batch_size=8,
            lr=1e-2,
            warmup_steps=2,
            log=lambda s, loss, losses=losses: losses.append(loss),
            log_every=1,
        )
        runs.append((res, losses, torch.cat([p.detach().flatten() for p in lm.parameters()])))
    (res, losses, params), (res2, _, params2) = runs
    assert res.steps == 8 and res.tokens > 0 and losses[-1] < losses[0]
    assert torch.equal(params, params2) and res.final_loss == res2.final_loss
    with pytest.raises(ValueError, match="steps >= 1"):
        warmup.warmup(lm, tok, PROBLEMS.train, steps=0, seed=0)


def test_warmup_stops_at_the_first_check_that_says_so(micro_dir):
    lm, tok = model.load(micro_dir)
    calls = []
    res = warmup.warmup(
        lm,
        tok,
        PROBLEMS.train,
        steps=9,
        seed=3,
        batch_size=4,
        check_every=2,
        stop=lambda n: calls.append((n, lm.training)) or n >= 4,
    )
    assert res.steps == 4 and calls == [(2, True), (4, True)] and not lm.training
    calls.clear()  # never at the last step (the budget ends there anyway)
    assert warmup.warmup(
        lm, tok, PROBLEMS.train, steps=4, seed=3, batch_size=4, check_every=2, stop=lambda n: calls.append(n) or False
    ).steps == 4 and calls == [2]
    with pytest.raises(ValueError, match="check_every must be >= 1"):
        warmup.warmup(lm, tok, PROBLEMS.train, steps=4, seed=3, check_every=0, stop=lambda n: True)


def test_epoch_order_uses_each_example_once_in_length_groups():
    lengths = [5, 50, 6, 51, 7, 52, 8, 53, 9, 54]
    order = warmup._epoch_order(lengths, 2, torch.Generator().manual_seed(0), pool=5)
    assert len(order) == len(set(order)) == 10
    assert order == warmup._epoch_order(lengths, 2, torch.Generator().manual_seed(0), pool=5)
    # within a window of 5 batches sorted by length, each batch pairs neighbours
    spans = [abs(lengths[order[i]] - lengths[order[i + 1]]) for i in range(0, 10, 2)]
    assert sorted(spans)[:4] == [1, 1, 1, 1]


class _Scripted(torch.nn.Module):
    """A stand-in causal LM that writes a fixed token script per row (logit 20 on the script's token,
    0 elsewhere; EOS after the script), so the calculator's effect can be checked by hand."""

    def __init__(self, scripts, vocab, eos_id, prompt_len):
        super().__init__()
        self.scripts, self.vocab, self.eos, self.s_p = scripts, vocab, eos_id, prompt_len
        self.config = None

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, past_key_values=None):
        at = attention_mask.shape[1] - self.s_p  # completion position of the next token
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for row, script in enumerate(self.scripts):
            logits[row, -1, script[at] if at < len(script) else self.eos] = 20.0
        return type("Out", (), {"logits": logits})()


def test_calculator_inserts_results_with_policy_mask_false(micro):
    _, tok = micro
    written = ["Tom: <<2+3=7>>7 and <<12/4=9>>9\n#### 9", "no annotation here\n#### 4"]
    scripts = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in written]
    ids, mask = sampling.encode_prompts(tok, ["Question: a", "Question: bb"])
    lm = _Scripted(scripts, len(tok), tok.eos_token_id, ids.shape[1])
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=40, greedy=True, compact=False)
    plain = sampling.sample(lm, ids, mask, **kw)
    calc = sampling.sample(lm, ids, mask, calculator=sampling.Calculator(tok), **kw)
    assert sampling.decode_completions(tok, plain) == written
    assert torch.equal(plain.policy_mask, plain.completion_mask)
    # the calculator writes 5>> and 3>> over the script's 7>> and 9>>; the model still copies its own 7 and 9
    assert sampling.decode_completions(tok, calc) == ["Tom: <<2+3=5>>7 and <<12/4=3>>9\n#### 9", written[1]]
    comp = calc.input_ids[:, calc.prompt_len :]
    inserted = [
        tok.decode([int(t)]) for t, c, p in zip(comp[0], calc.completion_mask[0], calc.policy_mask[0]) if c and not p
    ]
    assert "".join(inserted) == "5>>3>>"
    assert torch.equal(calc.policy_mask[1], calc.completion_mask[1])
    assert (calc.behavior_log_prob[~calc.policy_mask] == 0).all()
    assert (calc.policy_mask <= calc.completion_mask).all()
    assert torch.equal(calc.attention_mask[:, calc.prompt_len :], calc.completion_mask.long())


def test_calculator_changes_nothing_without_annotations(micro):
    lm, tok = micro
    prompts = [gsm_problems.format_prompt(p) for p in PROBLEMS.heldout[:2]]
    kw = dict(temperature=1.0, max_new_tokens=12)
    a = sampling.generate_group(lm, tok, prompts, 2, generator=torch.Generator().manual_seed(5), calculator=True, **kw)
    b = sampling.generate_group(lm, tok, prompts, 2, generator=torch.Generator().manual_seed(5), calculator=False, **kw)
    # the micro model never opens an annotation, so both are identical
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.policy_mask, a.completion_mask)


def test_calculator_positions_cover_exactly_what_the_calculator_writes(micro):
    _, tok = micro
    text = " Tom has 6+3 = <<6+3=9>>9 cards.\nAfter that, Tom has 9*12 = <<9*12=108>>108 cards.\n#### 108"
    pos = warmup.calculator_positions(tok, text)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert "".join(tok.decode([ids[i]]) for i in pos) == "9>>108>>"
    # consecutive runs: "9>>" right after the first annotation's '=', "108>>" after the second's
    first = [tok.decode([i]) for i in ids].index("=")
    assert pos[0] == first + 1
    assert warmup.calculator_positions(tok, "no annotation 6+3=9") == []


def test_calculator_mask_takes_those_tokens_out_of_the_loss(micro):
    _, tok = micro
    probs = PROBLEMS.train[:3]
    plain = warmup.encode_examples(tok, probs)
    masked = warmup.encode_examples(tok, probs, calculator_mask=True)
    assert [e[:2] for e in plain] == [e[:2] for e in masked] and all(e[2] == () for e in plain)
    _, _, lab_plain = warmup.collate(plain, tok.pad_token_id)
    ids, _, lab = warmup.collate(masked, tok.pad_token_id)
    for row, ex, p in zip(range(3), masked, probs):
        n_ann = p.answer.count("<<")
        assert len(ex[2]) >= 2 * n_ann  # at least one digit and '>>' each
        assert (lab[row, list(ex[2])] == -100).all() and (lab_plain[row, list(ex[2])] != -100).all()
        assert int((lab_plain[row] != -100).sum() - (lab[row] != -100).sum()) == len(ex[2])
        assert tok.decode(ids[row, list(ex[2])]).count(">>") == n_ann


def test_warmup_max_seconds_stops_early(micro_dir):
    lm, tok = model.load(micro_dir)
    res = warmup.warmup(lm, tok, PROBLEMS.train, steps=50, seed=0, batch_size=4, max_seconds=0.0)
    assert res.steps == 1


def test_warm_start_saves_then_reuses(micro_dir, tmp_path):
    kw = dict(seed=1, steps=2, batch_size=4, n_train=16, n_heldout=3, max_new_tokens=4, threads=1)
    first = warmup.warm_start(micro_dir, tmp_path / "w", **kw)
    assert not first.reused and first.stamp["steps_taken"] == 2 and first.stamp["n_heldout"] == 3
    assert first.stamp["settings"]["calculator"] is True and 0.0 <= first.stamp["heldout_accuracy"] <= 1.0
    again = warmup.warm_start(micro_dir, tmp_path / "w", **kw)
    assert again.reused and again.stamp == first.stamp
    with pytest.raises(FileExistsError):
        warmup.warm_start(micro_dir, tmp_path / "w", **{**kw, "steps": 3})


class _EndsEarly(torch.nn.Module):
    """The micro model with EOS made the argmax once a row's position reaches ``end_at``: rows with
    longer prompts end sooner, each at a step fixed by its own prompt (so a compacted batch must give
    it the same end)."""

    def __init__(self, lm, eos_id, end_at):
        super().__init__()
        self.lm, self.eos, self.end_at, self.config, self.device = lm, eos_id, end_at, lm.config, lm.device

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, cache=None):
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            cache=cache,
        )
        ends = position_ids >= self.end_at  # [B, S]: every position, as the learner's full forward sees them
        out.logits[..., self.eos] = torch.where(ends, 1e4, out.logits[..., self.eos])
        return out


@pytest.mark.parametrize("greedy", [True, False])
def test_compaction_drops_ended_rows_without_changing_any_row(micro, greedy):
    lm, tok = micro
    ids, mask = sampling.encode_prompts(tok, [gsm_problems.format_prompt(p) for p in PROBLEMS.train[:8]])
    ends = _EndsEarly(lm, tok.eos_token_id, end_at=int(mask.sum(1).min()) + 12)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=24, greedy=greedy, temperature=1.0)
    full = sampling.sample(ends, ids, mask, compact=False, generator=torch.Generator().manual_seed(9), **kw)
    part = sampling.sample(ends, ids, mask, compact=True, generator=torch.Generator().manual_seed(9), **kw)
    lengths = full.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows end at different steps, so compaction had rows to drop
    assert torch.equal(full.input_ids, part.input_ids) and torch.equal(full.completion_mask, part.completion_mask)
    assert torch.allclose(full.behavior_log_prob, part.behavior_log_prob, atol=1e-5)
    with torch.no_grad():  # the compacted behaviour log-probs are still the learner's at zero lag
        lp = sampling.completion_log_probs(ends, part.input_ids, part.attention_mask, part.completion_mask)
    assert (lp - part.behavior_log_prob)[part.policy_mask].abs().max().item() < 1e-4


def test_inverse_cdf_draws_the_distribution_and_never_a_zero():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.2, 0.3, 0.5, 0.0]])
    assert sampling.inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [1, 0]
    assert sampling.inverse_cdf(probs, torch.tensor([0.5, 0.49])).tolist() == [3, 1]
    assert sampling.inverse_cdf(probs, torch.tensor([0.999999, 0.999999])).tolist() == [3, 2]
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    draws = sampling.inverse_cdf(probs[1:].expand(20000, 4) * 3.0, u)  # rows need not sum to 1
    freq = torch.bincount(draws, minlength=4).double() / 20000
    assert torch.allclose(freq, torch.tensor([0.2, 0.3, 0.5, 0.0], dtype=torch.double), atol=0.015)


def test_batched_calculator_mask_equals_the_per_text_definition(micro):
    _, tok = micro
    probs = gsm_problems.make_splits(seed=3, n_train=200, n_heldout=0).train
    got = warmup.encode_examples(tok, probs, calculator_mask=True)
    for p, (_ids, n_prompt, skip) in zip(probs, got):
        text = gsm_problems.format_completion(p)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        spans = [m.span(1) for m in warmup._ANNOTATION_RESULT.finditer(text)]
        want = [i for i, (a, _) in enumerate(offsets) if any(lo <= a < hi for lo, hi in spans)]
        assert list(skip) == [n_prompt + i for i in want] and want
