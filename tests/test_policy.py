import numpy as np
import pytest
import torch

from asyncrl.algo.running_stats import RunningMeanStd
from asyncrl.tasks.control.policy import ActorCritic, InferencePolicy, flatten_weights, layout_hash, load_flat_weights


@pytest.mark.parametrize("discrete, activation", [(False, "tanh"), (False, "relu"), (True, "tanh"), (True, "elu")])
def test_inference_policy_matches_torch_log_prob(discrete, activation):
    torch.manual_seed(0)
    p = ActorCritic(5, 3, discrete=discrete, hidden_sizes=(16, 16), activation=activation, init_log_std=-0.3)
    with torch.no_grad():
        for param in p.pi.parameters():
            param.normal_(0, 0.5)
    rms = RunningMeanStd((5,))
    rms.update(np.random.default_rng(0).normal(2.0, 3.0, (100, 5)))
    p.set_obs_stats(rms)
    inf = InferencePolicy(p, activation=activation, seed=1)
    obs = np.random.default_rng(1).normal(0, 4, (64, 5)).astype(np.float32)
    actions, log_prob = inf.act(obs)
    with torch.no_grad():
        dist = p(torch.from_numpy(obs)).dist
        expected = dist.log_prob(torch.from_numpy(actions)).numpy()
    np.testing.assert_allclose(log_prob, expected, rtol=1e-5, atol=1e-5)


def test_inference_policy_samples_the_distribution():
    p = ActorCritic(2, 1, discrete=False, hidden_sizes=(4,), init_log_std=np.log(0.5))
    inf = InferencePolicy(p, activation="tanh", seed=0)
    actions, _ = inf.act(np.zeros((20000, 2), np.float32))
    assert abs(actions.mean()) < 0.02 and abs(actions.std() - 0.5) < 0.02


def test_flat_weights_round_trip_and_layout_hash():
    a, b = ActorCritic(4, 2, discrete=False), ActorCritic(4, 2, discrete=False)
    load_flat_weights(b, flatten_weights(a))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    assert layout_hash(a) == layout_hash(b) != layout_hash(ActorCritic(4, 2, discrete=False, hidden_sizes=(32,)))
    with pytest.raises(ValueError, match="expected"):
        load_flat_weights(b, np.zeros(3, np.float32))


def test_running_mean_std_matches_numpy():
    x = np.random.default_rng(0).normal(1.0, 2.0, (1000, 3))
    rms = RunningMeanStd((3,))
    for chunk in np.split(x, 10):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, x.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, x.var(0), rtol=1e-3)
