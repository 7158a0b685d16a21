"""A data-parallel learner group takes the optimizer steps one learner takes on the union of the
members' shares (asyncrl.core.learner_group): two member processes over gloo against the single
learner's reference (``shards = 2``), for a preset of each kind; and the check can fail: members
that train on the same share, or skip a reduction, land measurably far from the reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import learner_group_case as case
import pytest
import torch

from asyncrl.core.learner_group import LearnerGroup, column_groups, epoch_permutation, shard_columns

TESTS = Path(__file__).resolve().parent
TOL = 2e-5  # float32 reduction order: the group sums in another order than the reference's means

MEMBER = """
import sys, torch
sys.path.insert(0, {tests!r})
import learner_group_case as case
from asyncrl.core.learner_group import LearnerGroup
rank, world = int(sys.argv[1]), 2
g = LearnerGroup.join(rank, world, init_method={init!r}, timeout_s=60)
algo, policy, opt, batch = case.make_case({preset!r}, {sets!r})
mine = case.share(batch, 0 if {same!r} else rank, world)
if {warm!r}:  # as a member does: compile in a thread first; then the iterations take no compile
    from asyncrl.core.background import Warmup
    from asyncrl.core.spec import RolloutSpec
    from asyncrl.tasks.control.update import warm_up_compiled_step
    T, n = mine["rewards"].shape
    spec = RolloutSpec(obs_dim=case.OBS, action_dim=case.ACT, discrete=False, rollout_length=T, num_envs=n)
    rows = T * n // algo.num_minibatches
    Warmup(lambda: warm_up_compiled_step(policy, opt, algo, rows=rows, spec=spec, group=g)).wait()
    torch._dynamo.config.error_on_recompile = True
params, stats = case.train(algo, policy, opt, mine, group=g, compile_loss={compiled!r})
from asyncrl.tasks.control import fused_step
fused = [not s.broken for d in fused_step._CACHE.values() for s in d.values()]
torch.save({{"params": params, "stats": stats, "fused": fused}}, {out!r} + str(rank))
g.close()
"""


def run_group(tmp_path: Path, preset: str, sets=(), same=False, compiled=False, warm=False) -> list[dict]:
    """Both members' (params, stats), each a process of its own; a hard timeout, killed by pid.
    ``warm``: each compiles its steps in a thread first, and its iterations refuse to compile."""
    init = f"file://{tmp_path / 'store'}"
    script = tmp_path / "member.py"
    out = str(tmp_path / "member")
    fields = dict(tests=str(TESTS), init=init, preset=preset, sets=tuple(sets), same=same, compiled=compiled, warm=warm)
    script.write_text(MEMBER.format(out=out, **fields))
    return run_members(script, out, timeout=240)


def run_members(script: Path, out: str, timeout: float) -> list[dict]:
    """``script`` as ranks 0 and 1, each its own process; a hard timeout, then killed by pid; what
    each saved under ``out`` + rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env) for r in range(2)]
    try:
        for p in procs:
            assert p.wait(timeout=timeout) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [torch.load(out + str(r), weights_only=False) for r in range(2)]


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


CASES = [
    ("decoupled_ppo", ()),  # the default: band, GAE, advantage normalisation
    (
        "vaco",
        ("algo.tv_threshold=0.01", "algo.tv_filter_trigger=iteration"),
    ),  # the filter fires on the union's estimate
    ("ppo", ()),
    ("impala", ()),  # minibatches of whole columns, V-trace per minibatch
]


@pytest.mark.parametrize("preset,sets", CASES, ids=[c[0] for c in CASES])
def test_group_takes_the_steps_of_one_learner_on_the_union(tmp_path, preset, sets):
    members = run_group(tmp_path, preset, sets)
    algo, policy, opt, batch = case.make_case(preset, sets)
    ref, ref_stats = case.train(algo, policy, opt, batch, shards=2)
    # every member holds the same weights, and they are the reference's
    assert distance(members[0]["params"], members[1]["params"]) == 0.0
    assert distance(members[0]["params"], ref) < TOL
    for got, want in zip(members[0]["stats"], ref_stats):  # the diagnostics are the union's
        for key in ("policy_loss", "value_loss", "approx_kl", "tv_estimate", "no_grad_fraction", "explained_variance"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key
        if "filter_fire_rate" in want:
            assert got["filter_fire_rate"] == want["filter_fire_rate"]
    if preset == "vaco":
        assert max(s["filter_fire_rate"] for s in ref_stats) > 0  # the filter's decision was put to the test
    # the check discriminates: members on the same share, or a member that skips the reductions,
    # land far outside the tolerance
    algo, policy, opt, batch = case.make_case(preset, sets)
    first = case.share(batch, 0, 2)
    doubled = {k: torch.cat([v, v], dim=1) for k, v in first.items()}
    same_data, _ = case.train(algo, policy, opt, doubled, shards=2)
    assert distance(same_data, ref) > 50 * TOL
    algo, policy, opt, batch = case.make_case(preset, sets)
    alone, _ = case.train(algo, policy, opt, case.share(batch, 0, 2), group=SilentGroup())
    assert distance(alone, ref) > 50 * TOL


@pytest.mark.compiles
@pytest.mark.parametrize("preset,warm", [("decoupled_ppo", True), ("ppo", False)], ids=["decoupled_ppo", "ppo"])
def test_compiled_group_members_take_the_steps_of_one_learner_on_the_union(tmp_path, preset, warm):
    """Members taking compiled steps (the gradient graph, the group's average, the update graph) land
    where the eager single learner on the union does, to float rounding; with ``warm``, the members
    compiled both graphs in a thread first (as asyncrl learner-member does) and no step compiled again
    (dynamo's error_on_recompile: a recompile would fall back to eager, and ``fused`` says so)."""
    members = run_group(tmp_path, preset, compiled=True, warm=warm)
    assert all(m["fused"] == [True] for m in members)  # the compiled steps ran, no eager fallback
    algo, policy, opt, batch = case.make_case(preset)
    ref, ref_stats = case.train(algo, policy, opt, batch, shards=2)
    assert distance(members[0]["params"], members[1]["params"]) == 0.0
    assert distance(members[0]["params"], ref) < 1e-4
    for got, want in zip(members[0]["stats"], ref_stats):
        for key in ("policy_loss", "value_loss", "approx_kl", "no_grad_fraction"):
            assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), key


def test_members_on_the_same_share_are_caught(tmp_path):
    """Two real members fed the same share end on the weights of the doubled share, not the union's."""
    members = run_group(tmp_path, "decoupled_ppo", same=True)
    algo, policy, opt, batch = case.make_case("decoupled_ppo")
    ref, _ = case.train(algo, policy, opt, batch, shards=2)
    assert distance(members[0]["params"], ref) > 50 * TOL


class SilentGroup(LearnerGroup):
    """A member of two that never hears from the other: every collective as if the other held the
    same data (what a member that skipped the reductions computes)."""

    def __init__(self):
        super().__init__(0, 2)

    def sum(self, t):
        return t.detach() * 2

    def max(self, t):
        return t.detach().clone()

    def average_gradients(self, params, flat=None):
        pass


def test_epoch_permutation_is_randperm_for_one_learner_and_the_union_of_shares_for_a_group():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(epoch_permutation(16, 8, 4, g1), torch.randperm(128, generator=g2))
    T, N, W, M = 16, 8, 2, 4
    union = epoch_permutation(T, N, M, torch.Generator().manual_seed(3), shards=W).view(M, -1)
    local = epoch_permutation(T, N // W, M, torch.Generator().manual_seed(3)).view(M, -1)  # what each member draws
    for k in range(M):
        t, n = union[k] // N, union[k] % N
        for member in range(W):
            mine = (n // (N // W)) == member
            assert torch.equal(t[mine] * (N // W) + n[mine] % (N // W), local[k])  # its own slice k, in order
    assert sorted(union.reshape(-1).tolist()) == list(range(T * N))
    cols = column_groups(8, 2, torch.Generator().manual_seed(1), shards=2)
    assert sorted(torch.cat(cols).tolist()) == list(range(8)) and all(len(c) == 4 for c in cols)


def test_unequal_shares_are_refused():
    with pytest.raises(ValueError, match="equal shares"):
        shard_columns(10, 3)
    algo, policy, opt, batch = case.make_case("ppo")
    with pytest.raises(ValueError, match="equal shares"):
        case.train(algo, policy, opt, batch, shards=3)


SYNC = """
import sys, torch
sys.path.insert(0, {tests!r})
import learner_group_case as case
from asyncrl.core import group_sync
from asyncrl.core.learner_group import GroupError, LearnerGroup
from asyncrl.core.previous_policy import PreviousPolicy
rank = int(sys.argv[1])
g = LearnerGroup.join(rank, 2, init_method={init!r}, timeout_s=30)
algo, policy, opt, batch = case.make_case("ppo")
class State: pass
s = State(); s.policy, s.optimizer, s.generator, s.version = policy, opt, torch.Generator().manual_seed(rank), 0
s.previous = PreviousPolicy(lambda: case.make_case("ppo")[1])  # the policy one version back (ratio_anchor = previous)
if rank == 0:
    s.previous.start(policy)
    s.previous.finish()  # the leader keeps its weights before this iteration
    case.train(algo, policy, opt, batch, iterations=1)  # the leader is ahead: Adam state, new weights
    s.generator.manual_seed(11); s.version = 9
    group_sync.send_state(g, s)
    group_sync.send_idle(g)
    own = group_sync.send_iteration(g, batch, lr=1e-4, version=9)
    result = {{k: v for k, v in own.items()}}
else:
    group_sync.receive_state(g, s)
    got = group_sync.receive_iteration(g)
    result = {{k: v for k, v in got[0].items()}}
    result["lr_version"] = torch.tensor([got[1], got[2]], dtype=torch.float64)
    result["generator"] = s.generator.get_state()
result["params"] = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
result["previous"] = torch.cat([p.detach().reshape(-1) for p in s.previous.module.parameters()])
result["adam"] = len(opt.state)
if {diverge!r} and rank == 1:
    with torch.no_grad():
        next(policy.parameters()).add_(1e-6)
try:
    group_sync.after_iteration(g, policy)
    result["agree"] = True
except GroupError:
    result["agree"] = False
if rank == 0:
    group_sync.send_stop(g)
else:
    result["stopped"] = group_sync.receive_iteration(g) is None
torch.save(result, {out!r} + str(rank))
g.close()
"""


@pytest.mark.parametrize("diverge", [False, True])
def test_group_sync_gives_members_the_leaders_state_and_their_shares(tmp_path, diverge):
    """The leader's state (weights, Adam's moments, the generator, the version, π_{T-1}) reaches a member; an
    idle header is skipped; each member gets its own block of columns with dtypes (bool included);
    stop ends the member's loop; weights that differ by one ulp-sized nudge fail both members."""
    script, out = tmp_path / "sync.py", str(tmp_path / "out")
    script.write_text(SYNC.format(tests=str(TESTS), init=f"file://{tmp_path / 'store'}", diverge=diverge, out=out))
    lead, member = run_members(script, out, timeout=120)
    assert torch.equal(lead["params"], member["params"])  # before the nudge
    assert torch.equal(lead["previous"], member["previous"]) and not torch.equal(lead["previous"], lead["params"])
    assert member["adam"] == lead["adam"] > 0 and member["stopped"]
    assert member["lr_version"].tolist() == [1e-4, 9.0]
    assert torch.equal(member["generator"], torch.Generator().manual_seed(11).get_state())
    _, _, _, batch = case.make_case("ppo")  # in this process: its thread count may round differently
    for k, v in batch.items():
        for got, want in ((lead[k], case.share(batch, 0, 2)[k]), (member[k], case.share(batch, 1, 2)[k])):
            assert got.dtype == want.dtype and got.shape == want.shape, k
            assert (
                torch.equal(got, want) if not v.is_floating_point() else torch.allclose(got, want, rtol=0, atol=1e-5)
            ), k
    assert lead["agree"] == member["agree"] == (not diverge)


CLOSE = """
import gc, sys, weakref
from asyncrl.core.learner_group import LearnerGroup
g = LearnerGroup.join(0, 1, init_method={init!r}, timeout_s=30)
import torch._dynamo  # what the learner's first optimizer (or compile) imports after the group opened
alive = weakref.ref(g.pg)
g.close()
gc.collect()
sys.exit(3 if alive() is not None else 0)
"""


def test_closing_the_group_frees_it_and_its_gloo_threads(tmp_path):
    """After close() nothing keeps the process group (and gloo's worker threads) alive, even when
    torch.distributed.nn.functional is imported after the group opened (torch._dynamo imports it; its
    collectives' ``group=group.WORLD`` defaults would keep the group): a worker left alive can release
    a collective's tensors while the interpreter exits, which aborts the process (SIGABRT) in about
    one exit in ten under load. A fresh process, so no earlier import decides the outcome."""
    script = tmp_path / "close.py"
    script.write_text(CLOSE.format(init=f"file://{tmp_path / 'store'}"))
    done = subprocess.run([sys.executable, str(script)], env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert done.returncode == 0, "the process group outlived close()" if done.returncode == 3 else done.returncode
