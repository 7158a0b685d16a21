"""The llm task's weights on the wire (issue 43): bfloat16 payloads and LoRA adapters through the real
learner, broadcaster and actor code (the learner publishes, the broadcaster relays, the actor loads
them into its copy: the same log-probs as the learner's model), the learner training only the adapter,
LoRA dropout kept out of log π_T, the weights' size computed from the config alone, and the config keys."""

from __future__ import annotations

import contextlib
import copy
import json
import time

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.core import config  # noqa: E402
from asyncrl.core.config import ConfigError  # noqa: E402
from asyncrl.core.lag_control import WeightHistory  # noqa: E402
from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.core.state import LearnerState  # noqa: E402
from asyncrl.roles.actor import Actor  # noqa: E402
from asyncrl.roles.actor_session import ActorOptions  # noqa: E402
from asyncrl.roles.broadcaster import Broadcaster  # noqa: E402
from asyncrl.roles.learner import Learner  # noqa: E402
from asyncrl.run.launch import free_port_pair  # noqa: E402
from asyncrl.run.serial import run_serial  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import answer_formats, lora  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402
from asyncrl.tasks.llm import weights as llm_weights  # noqa: E402
from asyncrl.wire import codec  # noqa: E402

pytestmark = pytest.mark.timeout(180)
LORA = ["llm.lora_rank=4", "llm.lora_alpha=8"]


def _cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.eval_size=8",
        "algo.num_epochs=2",
        "algo.num_minibatches=2",
        "algo.lr=1e-2",
        "learner.slots_per_batch=2",
        "learner.num_slots=2",
        "run.num_actors=1",
        "run.total_env_steps=24",
        "run.log_every_s=1000",
        *extra,
    )


def _perturb(model, *, adapter_only: bool) -> None:
    """Move the weights that travel off their start values (a fresh adapter's B is 0: a no-op)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or not adapter_only:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def _log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), -1)


@contextlib.contextmanager
def _roles(cfg, tmp_path):
    """A learner (version 0 published), its broadcaster and an actor bound to the learner's config,
    in this process; all closed after."""
    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
    learner = actor = None
    try:
        learner = Learner(
            cfg, tmp_path / "run", run_id="rt", bind="tcp://127.0.0.1:0", broadcaster=b.endpoint, echo=lambda *_: None
        )
        actor = Actor(cfg, ActorOptions(learner="tcp://127.0.0.1:9", broadcaster=b.endpoint, actor_id="a0"))
        actor.run_id, actor.epoch, actor.history = "rt", learner.epoch, WeightHistory()
        actor.producer.bind(cfg, actor_seeds(cfg.run.seed, "a0", 0, cfg.env.num_envs))
        actor.layout_hash, actor.num_params = actor.producer.layout_hash, actor.producer.num_params
        actor.policy = actor.producer
        yield learner, b, actor
    finally:
        for role in (actor, learner, b):
            if role is not None:
                role.close()


def _publish_and_load(learner, b, actor) -> None:
    """The learner's version 0 through the broadcaster into the actor's policy copy (the actor's own
    snapshot request and load code)."""
    deadline = time.monotonic() + 60
    while b.newest != (learner.epoch, 0) and time.monotonic() < deadline:
        learner.serve(10)
        b.serve(10)
    assert b.newest == (learner.epoch, 0)
    actor.ask_snapshot()
    while actor.history.newest < 0 and time.monotonic() < deadline:
        b.serve(10)
        actor.read_snapshots(10)
    assert actor.history.newest == 0 and not actor.rejects.by_reason()
    actor.select_weights()


@pytest.mark.parametrize(
    "extra, dtype, adapter",
    [
        (["learner.precision=bf16"], "bfloat16", False),  # learner.weights_dtype auto: bf16 when trained in bf16
        (LORA, "float32", True),
        ([*LORA, "learner.weights_dtype=bfloat16"], "bfloat16", True),
    ],
    ids=["bf16", "lora", "lora-bf16"],
)
def test_weights_round_trip_learner_broadcaster_actor(micro_dir, tmp_path, extra, dtype, adapter):
    cfg = _cfg(micro_dir, *extra)
    with _roles(cfg, tmp_path) as (learner, b, actor):
        policy = learner.state.policy
        _perturb(policy, adapter_only=adapter)  # before the broadcaster asks for version 0
        _publish_and_load(learner, b, actor)
        sent = b.latest
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        copy_lp, learner_lp = _log_probs(actor.producer.model, ids), _log_probs(policy, ids)
        rounded = copy.deepcopy(policy)  # the learner's model with its weights as the wire carried them
        llm_weights.load_flat(rounded, llm_weights.flat_weights(policy, dtype))
        travelling = dict(llm_weights.param_layout(policy))
        expected = sum(p.numel() for p in travelling.values())
    header, flat = codec.decode_weights(sent)
    assert header["dtype"] == dtype and flat.size == expected and header["nbytes"] == learner.weights.nbytes
    assert learner.weights.nbytes == expected * (2 if dtype == "bfloat16" else 4)
    if adapter:  # only the adapter travels; the generator holds the same frozen base
        assert all("lora_" in name for name in travelling) and expected < sum(p.numel() for p in policy.parameters())
    assert torch.equal(copy_lp, _log_probs(rounded, ids))  # the generator computes what the learner would
    if dtype == "float32":
        assert torch.equal(copy_lp, learner_lp)
    else:  # bfloat16 rounds each weight to 8 bits of mantissa (relative error <= 2**-9)
        assert 0 < float((copy_lp - learner_lp).abs().max()) < 0.05


def test_an_actor_of_another_wire_dtype_refuses_the_weights(micro_dir, tmp_path):
    """The layout hash names the dtype, and the actor checks the header's: a generator bound to a
    float32 layout counts bfloat16 weights as rejects instead of loading misread bytes."""
    cfg = _cfg(micro_dir, "learner.weights_dtype=bfloat16")
    with _roles(cfg, tmp_path) as (learner, b, actor):
        actor.producer.bind(_cfg(micro_dir), actor_seeds(cfg.run.seed, "a0", 0, cfg.env.num_envs))  # float32
        actor.layout_hash = actor.producer.layout_hash
        deadline = time.monotonic() + 60
        while b.newest != (learner.epoch, 0) and time.monotonic() < deadline:
            learner.serve(10)
            b.serve(10)
        actor.ask_snapshot()
        while not actor.rejects.total and time.monotonic() < deadline:
            b.serve(10)
            actor.read_snapshots(10)
        assert actor.rejects.by_reason() == {"layout": 1} and actor.history.newest == -1
        actor.layout_hash = learner.state.layout_hash  # the right layout, the wrong element type
        time.sleep(0.25)
        actor.ask_snapshot()
        while actor.rejects.total < 2 and time.monotonic() < deadline:
            b.serve(10)
            actor.read_snapshots(10)
        assert actor.rejects.by_reason() == {"layout": 1, "dtype": 1} and actor.history.newest == -1


def _slots(cfg, task, state=None):
    """Two slots from a generator of ``cfg`` holding the learner's weights (``state``), rewards unequal in
    every group (a gradient)."""
    prod = task.producer()
    prod.bind(cfg, actor_seeds(cfg.run.seed, "a0", 0, cfg.env.num_envs))
    if state is not None:
        prod.load(state.flat_weights())
    prod.reset()
    out = []
    for i in range(cfg.learner.slots_per_batch):
        slot = task.spec.allocate()
        prod.collect(slot, version=0)
        slot["rewards"][:] = np.arange(len(slot["rewards"])) % 2
        out.append((f"a{i}", slot))
    return out


def test_with_lora_the_learner_trains_only_the_adapter(micro_dir):
    cfg = _cfg(micro_dir, *LORA)
    task = make_task(cfg)
    state = LearnerState(cfg, task.spec, task)
    adapter = dict(llm_weights.param_layout(state.policy))
    trained = [p for g in state.optimizer.param_groups for p in g["params"]]
    assert len(trained) == len(adapter) and all(any(p is q for q in adapter.values()) for p in trained)
    before = {k: v.clone() for k, v in state.policy.state_dict().items()}
    stats = state.iterate(state.make_batch(_slots(cfg, task)))
    assert stats["grad_norm"] > 0 and stats["weights_bytes"] == 4 * sum(p.numel() for p in adapter.values())
    after = state.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)  # the base stayed frozen
    assert any("lora_B" in k for k in changed)


def test_lora_dropout_stays_out_of_the_log_probs_of_pi_t(micro_dir):
    """With lora_dropout the gradient forwards run in train mode; log π_T comes from forwards without
    gradient in eval mode, so at zero lag it equals the generator's log-probs (a first minibatch that
    took π_T from its own dropout forward would not)."""
    model = lora.with_adapter(m.load(micro_dir).model, config.load(None, ["task.kind=llm", *LORA]).llm)
    drops = [x for n, x in model.named_modules() if n.endswith("lora_dropout.default")]
    modes = []
    forward = lora.dropout_forwards(model, contextlib.nullcontext)
    with forward():
        modes.append([x.training for x in drops])
        base = [x.training for n, x in model.named_modules() if isinstance(x, torch.nn.Dropout) and "lora_" not in n]
    with torch.no_grad(), forward():
        modes.append([x.training for x in drops])
    assert drops and modes == [[True] * len(drops), [False] * len(drops)]
    assert not any(x.training for x in drops)
    assert not any(base)  # the base model's own dropout stays off (test_llm_archs: GPT-2's)
    cfg = _cfg(micro_dir, *LORA, "llm.lora_dropout=0.5", "algo.num_epochs=1", "algo.num_minibatches=1")
    task = make_task(cfg)
    state = LearnerState(cfg, task.spec, task)
    _perturb(state.policy, adapter_only=True)  # a zero B would hide the dropout
    stats = state.iterate(state.make_batch(_slots(cfg, task, state)))
    assert stats["optimizer_steps"] == 1 and stats["logprob_mismatch_fresh"] < 1e-4, stats


@pytest.mark.parametrize("extra", [[], LORA, ["learner.precision=bf16"], [*LORA, "llm.lora_target_modules=['q_proj']"]])
def test_the_weights_size_from_the_config_is_the_models(micro_dir, extra):
    task = make_task(_cfg(micro_dir, *extra))
    meta = task.weights_info()  # the model built on the meta device from config.json
    assert meta == task.weights_info(task.build_policy())
    assert meta.nbytes == meta.parameters * (2 if meta.dtype == "bfloat16" else 4)


def test_weights_config_keys_take_sane_values_only(micro_dir):
    for bad, match in (
        ("learner.weights_dtype=int8", "learner.weights_dtype must be one of"),
        ("llm.lora_rank=-1", "llm.lora_rank must be >= 0"),
        ("llm.lora_alpha=0", "llm.lora_alpha must be > 0"),
        ("llm.lora_alpha=inf", "llm.lora_alpha must be a finite number > 0"),
        ("llm.lora_dropout=1.0", r"llm.lora_dropout must be in \[0, 1\)"),
        ("llm.lora_target_modules=[]", "llm.lora_target_modules must be a list of module names"),
        ("llm.lora_target_modules=['']", "llm.lora_target_modules must be a list of module names"),
        ("llm.lora_target_modules=['all-linear', 'q_proj']", "all-linear names every linear layer"),
    ):
        with pytest.raises(ConfigError, match=match):
            _cfg(micro_dir, *LORA, bad)
    with pytest.raises(ConfigError, match="control policies travel as float32"):
        config.load(None, ["learner.weights_dtype=bfloat16"])
    res = config.load_resolved(None, ["task.kind=llm", "llm.lora_alpha=4"])  # LoRA off: no effect
    assert any("llm.lora_alpha" in line for line in res.unused)
    with pytest.raises(ValueError, match="Target modules"):  # peft's own error for a module the model lacks
        make_task(_cfg(micro_dir, *LORA, "llm.lora_target_modules=['no_such_proj']")).build_policy()


def test_a_serial_lora_run_learns_the_adapter_and_reports_its_bytes(micro_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
    cfg = _cfg(micro_dir, *LORA, "run.seed=3")
    make_task(cfg).prepare_run(tmp_path, echo=lambda *_: None)
    summary = run_serial(cfg, tmp_path, echo=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    full = make_task(_cfg(micro_dir)).weights_info()
    assert summary["weights"]["bytes_per_version"] == rows[0]["weights_bytes"] < full.nbytes
    assert summary["weights"]["holds"].startswith("the LoRA adapter (rank 4")
    fresh = [r["logprob_mismatch_fresh"] for r in rows if r["optimizer_steps"]]  # null: no row trained
    assert fresh and all(x < 1e-4 for x in fresh)  # generator vs learner at zero lag
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["policy"]
    start = m.load(micro_dir).model.state_dict()
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in saved.items()}
    base = {k: v for k, v in base.items() if "lora_" not in k}
    assert all(torch.equal(base[k], start[k]) for k in start)  # the base stayed frozen
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in saved.items() if "lora_B" in k)  # B learned


def test_lora_with_gradient_checkpointing_makes_the_same_update(micro_dir):
    """Activation checkpointing under a LoRA adapter: the frozen base's inputs need no gradient
    (non-reentrant checkpointing), so the adapter gets the same update as without checkpointing."""
    after, start = [], None
    for extra in ([], ["llm.gradient_checkpointing=true"]):
        cfg = _cfg(micro_dir, *LORA, "algo.num_epochs=1", "algo.num_minibatches=1", *extra)
        task = make_task(cfg)
        state = LearnerState(cfg, task.spec, task)
        if start is None:
            _perturb(state.policy, adapter_only=True)  # a zero B gives A no gradient
            start = copy.deepcopy(state.policy.state_dict())
        state.policy.load_state_dict(start)
        stats = state.iterate(state.make_batch(_slots(cfg, task, state)))
        assert stats["optimizer_steps"] == 1 and stats["grad_norm"] > 0, stats
        after.append({k: v.clone() for k, v in state.policy.state_dict().items() if "lora_" in k})
    assert after[0].keys() == after[1].keys() and after[0]
    for k in after[0]:
        torch.testing.assert_close(after[1][k], after[0][k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype, big", [("bfloat16", 3.4e38), ("float16", 65520.0)])
def test_a_weight_the_wire_dtype_rounds_to_inf_is_refused_at_the_learner(dtype, big):
    """A finite float32 weight above the wire dtype's largest value (bfloat16: 3.3895e38, rounded up
    to inf; float16: 65504) is refused where the payload is made: the broadcaster would count the
    payload as non-finite and ask for it again every second, and no actor would get a new version."""
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight[0, 0] = big
    assert torch.isfinite(model.weight).all()
    with pytest.raises(ValueError, match=f"overflows {dtype}.*learner.weights_dtype"):
        llm_weights.flat_weights(model, dtype)
    assert np.isfinite(llm_weights.flat_weights(model, "float32")).all()
