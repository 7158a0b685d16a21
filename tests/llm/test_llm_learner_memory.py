"""The learner's memory: log-probs of the sampled tokens in chunks (equal to the full-logits computation,
values and gradients; peak memory set by the chunk, not by rows x tokens x vocabulary), micro-batches
with gradient accumulation (the same update), activation checkpointing (the same gradients)."""

import json
import os

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import token_log_probs  # noqa: E402
from asyncrl.tasks.llm.token_log_probs import completion_log_probs, enable_checkpointing, position_ids  # noqa: E402

V = 16384  # a vocabulary much wider than the model, as in real LMs (150k against a hidden size of 1-4k)


def _lm(vocab=V, hidden=8, **kw):
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        **kw,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _batch(rows, s=40, length=32, vocab=V, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, s), generator=g)
    mask = torch.ones(rows, s, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    comp = torch.ones(rows, length, dtype=torch.bool)
    comp[1, 20:] = False  # a row that ended early
    mask[1, s - length + 20 :] = 0
    return ids, mask, comp


def _reference(lm, ids, mask, comp, temperature=1.0):
    """The plain full-logits computation: log-softmax over [B, L, V], gathered."""
    s, length = ids.shape[1], comp.shape[1]
    logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    logp = torch.log_softmax(logits[:, s - length - 1 : s - 1].float() / temperature, -1)
    lp = logp.gather(-1, ids[:, s - length :, None]).squeeze(-1)
    return torch.where(comp, lp, torch.zeros_like(lp))


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_log_probs_and_gradients_equal_the_full_logits_ones(chunk):
    lm = _lm(vocab=512, hidden=16)
    ids, mask, comp = _batch(4, vocab=512)
    ref = _reference(lm, ids, mask, comp, temperature=0.7)
    (ref * torch.linspace(-1, 1, ref.numel()).view_as(ref)).sum().backward()
    want = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    lp = completion_log_probs(lm, ids, mask, comp, temperature=0.7, chunk_tokens=chunk)
    assert lp.dtype == torch.float32 and (lp[~comp] == 0).all()
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    for n, p in lm.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-6, rtol=1e-4)


def _peak_bytes(fn, tmp_path) -> int:
    """The most bytes the CPU allocator held during ``fn()`` beyond what it held before: the running
    "Total Allocated" of torch's profiler memory events, in allocation order. It counts every
    allocation and free of the process's tensors, so it depends on the computation, not on the
    machine's load (one torch thread: no per-thread scratch)."""
    from torch.profiler import ProfilerActivity, profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        torch.set_num_threads(threads)
    trace = tmp_path / f"trace-{os.getpid()}.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    trace.unlink()
    mem = sorted(
        (e["args"]["Ev Idx"], e["args"]["Total Allocated"], e["args"]["Bytes"])
        for e in events
        if e.get("name") == "[memory]"
    )
    base = mem[0][1] - mem[0][2]
    return max(total for _, total, _ in mem) - base


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_peak_memory_of_the_log_probs_is_set_by_the_chunk_not_the_batch(tmp_path, top_p):
    """Forward and backward of the completion log-probs: with chunks of c = 32 tokens the allocator
    never holds more than 10 c V floats (measured with this model at 16 and 32 rows: 4.8-5.3 without
    top-p, 7.0-7.6 with its sort), for about 250 or 500 completion tokens (8 or 16 times the chunk),
    and doubling the tokens moves the peak by less than one chunk; in one chunk, the peak is above
    N V floats (one float32 copy of the batch's logits), so the measure sees the logits."""
    lm, chunk, unit = _lm(), 32, 32 * V * 4  # bytes of one [chunk, V] float32 tensor

    def run(ids, mask, comp, chunk_tokens):
        def fn():
            lp = completion_log_probs(lm, ids, mask, comp, top_p=top_p, chunk_tokens=chunk_tokens)
            lp.sum().backward()
            lm.zero_grad(set_to_none=True)

        fn()  # once before measuring: lazily made buffers do not count
        return _peak_bytes(fn, tmp_path)

    peaks = []
    for rows in (8, 16):
        ids, mask, comp = _batch(rows)
        n = int(comp.sum())
        peaks.append(run(ids, mask, comp, chunk))
        assert peaks[-1] <= 10 * unit, f"{rows} rows: peak {peaks[-1] / unit:.1f} chunks of logits"
    # twice the tokens (about 250 more: 8 chunks of logits more, if they were held) move the peak by
    # less than one chunk (the rest grows with the rows: hidden states, attention)
    assert peaks[1] - peaks[0] < unit
    if top_p == 1:
        assert run(ids, mask, comp, n) > n * V * 4  # all tokens in one chunk


def test_the_split_is_checked_and_a_model_that_changes_its_logits_gets_its_own(caplog):
    """A model whose logits are not its output head's (here: scaled after the head, as soft-capping
    or logit scaling models do) is found by the one-time check and takes its own logits."""

    class Scaled(Qwen2ForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    torch.manual_seed(0)
    plain = _lm(vocab=256, hidden=16)
    scaled = Scaled(plain.config).eval()
    scaled.load_state_dict(plain.state_dict())
    ids, mask, comp = _batch(3, vocab=256)
    assert token_log_probs.output_head(plain, ids, mask) is not None
    with caplog.at_level("WARNING", logger="asyncrl.llm"):
        assert token_log_probs.output_head(scaled, ids, mask) is None
    assert "not its output head" in caplog.text
    with torch.no_grad():
        got = completion_log_probs(scaled, ids, mask, comp, chunk_tokens=5)
        torch.testing.assert_close(got, _reference(scaled, ids, mask, comp), atol=1e-5, rtol=1e-5)


def test_gradient_checkpointing_recomputes_layers_and_keeps_the_gradients():
    lm = _lm(vocab=256, hidden=16)
    ids, mask, comp = _batch(3, vocab=256)
    assert token_log_probs.output_head(lm, ids, mask) is not None  # its one-time check, not counted below
    calls = []
    for layer in lm.model.layers:  # a submodule: transformers replays a checkpointed layer's forward, not its hooks
        layer.mlp.register_forward_pre_hook(lambda mod, args: calls.append(torch.is_grad_enabled()))

    def grads():
        lm.zero_grad(set_to_none=True)
        calls.clear()
        completion_log_probs(lm, ids, mask, comp, chunk_tokens=16).sum().backward()
        return {n: p.grad.clone() for n, p in lm.named_parameters()}, len(calls)

    plain, plain_calls = grads()
    enable_checkpointing(lm)
    ckpt, ckpt_calls = grads()
    assert plain_calls == 2 and ckpt_calls == 4  # each layer runs again in the backward pass
    for n in plain:
        torch.testing.assert_close(ckpt[n], plain[n], atol=1e-6, rtol=1e-5)
    assert not lm.training and not any(m.training for m in lm.modules())  # dropout stays off
    with torch.no_grad():  # without gradient: no recomputation, eval mode untouched
        calls.clear()
        completion_log_probs(lm, ids, mask, comp)
        assert len(calls) == 2
    with pytest.raises(ValueError, match="attention_dropout = 0.1"):
        enable_checkpointing(_lm(vocab=64, attention_dropout=0.1))


def _tiny_cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.prompts_per_slot=3",
        "llm.silent_groups=step",
        "algo.num_epochs=2",
        "algo.num_minibatches=1",
        "algo.lr=1e-3",
        *extra,
    )


@pytest.mark.parametrize(
    "sets",
    [
        ("algo.preset=grpo",),
        ("algo.preset=vaco", "llm.kl_coef=0.1"),
        ("algo.preset=vaco", "algo.tv_threshold=0.001", "llm.top_p=0.9", "llm.realign=is_baseline"),
    ],
)
def test_micro_batches_accumulate_the_same_update(micro_dir, sets):
    """One iteration (2 epochs: the second from moved weights, where VACO's TV filter can fire) with
    micro-batches of 1, 2 and 4 rows against the whole minibatch at once: the same weights and
    statistics to float rounding."""
    from asyncrl.tasks.llm.learn import llm_iteration

    results = []
    for rows in (0, 1, 2, 4):
        cfg = _tiny_cfg(micro_dir, f"llm.micro_batch_rows={rows}", *sets)
        task = make_task(cfg)
        prod = task.producer()
        prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
        prod.reset()
        slot = task.spec.allocate()
        prod.collect(slot, version=0)
        batch = {k: torch.from_numpy(v.copy()) for k, v in slot.items()}
        batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
        lm = task.build_policy()
        opt = torch.optim.SGD(lm.parameters(), lr=0.1)  # linear in the gradient (Adam divides rounding by rounding)
        stats = llm_iteration(
            lm,
            opt,
            batch,
            algo=cfg.algo,
            llm=cfg.llm,
            generator=torch.Generator().manual_seed(0),
            version=0,
            reference=task.reference(),
        )
        results.append((lm.state_dict(), stats))
    (w0, s0), rest = results[0], results[1:]
    moved = max((w0[k] - v).abs().max().item() for k, v in task.build_policy().state_dict().items())
    assert moved > 1e-4  # the update did something
    for w, s in rest:
        for k in w0:
            torch.testing.assert_close(w[k], w0[k], atol=2e-6, rtol=1e-5)
        for k in ("policy_loss", "tv_estimate", "no_grad_fraction", "grad_norm", "rho_mean", "optimizer_steps"):
            assert s[k] == pytest.approx(s0[k], rel=1e-4, abs=1e-6), k
