"""learner.device / learner.precision / actor.device: config names, the check for a device this
machine lacks (one line, before anything starts), and the CPU path unchanged by the device plumbing."""

import contextlib
import copy

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.core.config import ConfigError
from asyncrl.core.device import check_device, forward_context, to_device
from asyncrl.core.optim import make_optimizer
from asyncrl.core.state import LearnerState
from asyncrl.tasks import make_task
from asyncrl.tasks.control import update
from asyncrl.tasks.control.envs import VecEnv
from asyncrl.tasks.control.policy import InferencePolicy
from asyncrl.tasks.control.rollout import collect

SMALL = [
    "env.id=asyncrl/Corridor-v0",
    "env.max_episode_steps=12",
    "env.num_envs=4",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---- config names ------------------------------------------------------------------------------


def test_defaults_are_cpu_fp32():
    cfg = config.load(None)
    assert (cfg.learner.device, cfg.learner.precision, cfg.actor.device) == ("cpu", "fp32", "cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_device_names_load_on_any_machine(device, no_cuda):
    # whether the machine has it is asked where a role starts: a GPU run's config.json loads anywhere (asyncrl eval)
    assert config.load(None, [f"learner.device={device}"]).learner.device == device


@pytest.mark.parametrize(
    "override, words",
    [
        ("learner.device=gpu", "learner.device must be cpu, cuda or cuda:N, got 'gpu'"),
        ("learner.device=cuda:x", "learner.device must be"),
        ("learner.device=CUDA", "learner.device must be"),
        ("learner.precision=fp16", "learner.precision must be one of fp32, bf16, got 'fp16'"),
        ("actor.device=cuda", "control actors act with numpy"),
    ],
)
def test_bad_device_settings_one_line(override, words):
    with pytest.raises(ConfigError, match=words) as e:
        config.load(None, [override])
    assert "\n" not in str(e.value)


def test_actor_device_is_for_llm_generators():
    cfg = config.load(None, ["task.kind=llm", "algo.preset=grpo", "actor.device=cuda:1"])
    assert cfg.actor.device == "cuda:1"


# ---- a device this machine lacks ---------------------------------------------------------------


def test_cuda_without_cuda_is_one_line(no_cuda):
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="learner.device = cuda, but torch .* sees no CUDA device") as e:
        check_device("cuda")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="actor.device = cuda:0"):
        check_device("cuda:0", key="actor.device")


def test_missing_device_index_and_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="cuda:1, but this machine has 1 CUDA device"):
        check_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Old GPU")
    with pytest.raises(ConfigError, match="Old GPU does not support bf16"):
        check_device("cuda:0", "bf16")


def test_learner_state_refuses_before_building(no_cuda):
    cfg = config.load(None, SMALL + ["learner.device=cuda"])
    spec = VecEnv(cfg.env.id, 1, seed=0, max_episode_steps=12).spec(16)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        LearnerState(cfg, spec, make_task(cfg, spec=spec))


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--serial", "--device", "cuda"],
        ["run", "--device", "cuda:0"],
        ["learner", "--device", "cuda"],
        ["run", "--serial", "--set", "learner.precision=bf16", "--set", "learner.device=cuda"],
    ],
)
def test_cli_refuses_cuda_before_any_role(args, no_cuda, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, args + ["--env", "asyncrl/Corridor-v0", "--run-dir", str(out)])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "sees no CUDA device" in lines[0], result.output
    assert "Traceback" not in result.output and not out.exists()  # nothing started, no run directory


def test_cli_actor_device_for_control_is_refused():
    result = CliRunner().invoke(main, ["actor", "--env", "asyncrl/Corridor-v0", "--device", "cuda"])
    assert result.exit_code == 2 and "control actors act with numpy" in result.output


# ---- the CPU path ------------------------------------------------------------------------------


def _state_and_batch(*extra):
    cfg = config.load(None, SMALL + list(extra))
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=12)
    env.reset(seeds=list(range(cfg.env.num_envs)))
    state = LearnerState(cfg, env.spec(cfg.env.rollout_length), make_task(cfg, spec=env.spec(cfg.env.rollout_length)))
    actor = InferencePolicy(state.policy, activation="tanh", seed=0)
    slots = []
    for i in range(2):
        arrays = state.spec.allocate()
        collect(env, actor.act, arrays, version=0)
        slots.append((f"a{i}", arrays))
    env.close()
    return state, state.make_batch(slots)


def test_to_device_on_cpu_is_the_batch_itself():
    batch = {"x": torch.zeros(3), "y": torch.ones(2, dtype=torch.bool)}
    assert to_device(batch, torch.device("cpu")) is batch
    assert forward_context(torch.device("cpu"), "fp32") is contextlib.nullcontext


@pytest.mark.parametrize("preset", ["vaco", "impala"])
def test_cpu_learner_bit_identical_to_the_plain_iteration(preset):
    """LearnerState on learner.device = cpu (the move, the forward context) against the update function
    called as before the device keys existed, from the same weights, optimizer and generator."""
    state, batch = _state_and_batch(f"algo.preset={preset}", "learner.device=cpu", "algo.anneal_lr=false")
    policy, opt = copy.deepcopy(state.policy), None
    opt = make_optimizer(policy.parameters(), lr=state.cfg.algo.lr, eps=state.cfg.algo.adam_eps)
    gen = torch.Generator().manual_seed(state.cfg.run.seed)
    plain = update.learner_iteration(
        policy, opt, batch, cfg=state.cfg.algo, generator=gen, version=0, compile_loss=state.cfg.learner.compile
    )
    stats = state.iterate(batch)
    for (name, a), b in zip(state.policy.named_parameters(), policy.parameters()):
        assert torch.equal(a, b), name
    assert stats["policy_loss"] == plain["policy_loss"] and stats["minibatches"] == plain["minibatches"]
    flat = state.flat_weights()
    assert isinstance(flat, np.ndarray) and flat.dtype == np.float32 and flat.ndim == 1


def test_bf16_forward_keeps_losses_and_weights_float32():
    """bf16 autocast (here on the CPU, the same code path as cuda) changes the numbers a little, not
    their dtypes: log-probs and values reach the losses as float32, the weights stay float32."""
    state, batch = _state_and_batch("learner.precision=bf16")
    fwd = state.forward_context
    with torch.no_grad():
        x = state.policy.normalize(batch["obs"][0])
        out, log_prob, values = update._forward(state.policy, x, batch["actions"][0], fwd)
        with fwd():
            assert state.policy.pi(batch["obs"][0]).dtype == torch.bfloat16  # the matrix products ran in bf16
    assert log_prob.dtype == values.dtype == torch.float32
    ref, ref_batch = _state_and_batch()
    stats = state.iterate(batch)
    ref.iterate(ref_batch)
    assert all(p.dtype == torch.float32 for p in state.policy.parameters())
    assert all(np.isfinite(stats[k]) for k in ("policy_loss", "value_loss", "grad_norm", "rho_mean"))
    assert any(not torch.equal(a, b) for a, b in zip(state.policy.parameters(), ref.policy.parameters()))
    assert state.flat_weights().dtype == np.float32


# ---- bench/learner_speed.py (bench/gpu_check.sh) ----------------------------------------------


def _learner_speed():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "learner_speed.py"
    spec = importlib.util.spec_from_file_location("learner_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path.parents[1]


def test_learner_speed_reads_configs_as_config_load_does():
    mod, root = _learner_speed()
    assert mod.read_config(None) == config.load(None)
    assert mod.read_config(root / "configs" / "gsm-tiny.toml") == config.load(root / "configs" / "gsm-tiny.toml")


def test_learner_speed_halfcheetah_shapes():
    from asyncrl.tasks.control.envs import rollout_spec

    mod, _ = _learner_speed()
    spec = rollout_spec("HalfCheetah-v5", num_envs=1, rollout_length=1)
    assert (spec.obs_dim, spec.action_dim, spec.discrete) == (
        mod.HALFCHEETAH_OBS_DIM,
        mod.HALFCHEETAH_ACTION_DIM,
        False,
    )


def test_learner_speed_control_case_runs_one_iteration():
    mod, _ = _learner_speed()
    step, counts = mod.control_case(mod.read_config(None), torch.device("cpu"), contextlib.nullcontext)
    stats = step()
    assert counts == {"samples": 2048} and np.isfinite(stats["policy_loss"]) and len(stats["minibatches"]) == 80
