"""Resources, in one process: the /dev/shm space check, SIGBUS in the
supervisor's report, run-directory writes that fail, and header limits no legal config overflows.
The multi-process versions are in tests/integration/test_resource_faults.py."""

import errno
import json
import os
import shutil
import uuid

import pytest
import torch

from asyncrl.core import config, metrics
from asyncrl.core.config import ConfigError
from asyncrl.core.metrics import JsonlWriter, RunDirError, write_atomic
from asyncrl.core.spec import RolloutSpec
from asyncrl.wire import codec, protocol
from asyncrl.wire.shm import dev_shm
from asyncrl.wire.shm.layout import ShmSpaceError, segment_nbytes
from asyncrl.wire.shm.ring import SlotRing

pytestmark = pytest.mark.timeout(60)

SPEC = RolloutSpec(obs_dim=3, action_dim=2, discrete=False, rollout_length=4, num_envs=2)


# ----------------------------------------------------------------------------- /dev/shm


def test_ring_that_does_not_fit_is_refused_before_any_segment(monkeypatch):
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(dev_shm, "free_bytes", lambda directory=dev_shm.SHM_DIR: 1000)
    with pytest.raises(ShmSpaceError) as info:
        SlotRing.create(run_id=run_id, spec=SPEC, num_slots=3)
    text = str(info.value)
    need = segment_nbytes(SPEC, 3)
    assert f"needs {need:,} bytes" in text and "has 1,000 free" in text, text
    assert "learner.num_slots" in text and "\n" not in text, text
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"asyncrl-{run_id}-")]


def test_created_ring_has_its_pages_reserved():
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    with SlotRing.create(run_id=run_id, spec=SPEC, num_slots=2) as ring:
        st = os.stat(os.path.join("/dev/shm", ring.name))
        assert st.st_blocks * 512 >= segment_nbytes(SPEC, 2)  # allocated, not a sparse file


def test_supervisor_names_sigbus_a_shared_memory_failure(tmp_path):
    from asyncrl.run.launch import Supervisor

    sup = Supervisor(config.Config(), tmp_path, print)
    shutil.rmtree(sup.endpoint_dir)  # no role is started here
    (sup.logs / "actor0.log").write_text("Fatal Python error: Bus error\n")
    failure = sup.role_failed("actor0", -7)
    assert "shared-memory failure (SIGBUS)" in failure.reason and "/dev/shm" in failure.reason
    assert "status -7" in failure.reason


# ----------------------------------------------------------------------------- run directory


def _enospc_after(n_bytes: int):
    """An os.write that writes at most ``n_bytes`` in all, then fails as a full disk does."""
    left = [n_bytes]
    real = os.write

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done = real(fd, bytes(data)[: left[0]])
        left[0] -= done
        return done

    return write


def test_jsonl_line_cut_by_a_full_disk_is_undone(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path)
    w.write({"iteration": 1})
    monkeypatch.setattr(metrics.os, "write", _enospc_after(5))  # 5 bytes of the next line get through
    with pytest.raises(RunDirError) as info:
        w.write({"iteration": 2, "pad": "x" * 100})
    w.close()
    assert str(info.value) == f"cannot write {path}: No space left on device"
    assert path.read_text() == '{"iteration": 1}\n'


def test_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_atomic(path, b'{"old": 1}\n')
    monkeypatch.setattr(metrics.os, "write", _enospc_after(3))
    with pytest.raises(RunDirError, match="No space left on device"):
        write_atomic(path, b'{"new": 2}\n' * 100)
    assert json.loads(path.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary left


def test_checkpoint_that_cannot_be_written_keeps_the_last_good_one(tmp_path, monkeypatch):
    from asyncrl.core.state import LearnerState
    from asyncrl.tasks import make_task

    cfg = config.Config()
    spec = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=4, num_envs=2)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    path = tmp_path / "checkpoint.pt"
    state.save(path)
    state.iteration = 99
    monkeypatch.setattr(metrics.os, "write", _enospc_after(1000))
    with pytest.raises(RunDirError, match="checkpoint.pt: No space left on device"):
        state.save(path)
    assert torch.load(path, weights_only=True)["iteration"] == 0


def test_writing_to_a_full_device_is_one_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    w = JsonlWriter("/dev/full")
    with pytest.raises(RunDirError) as info:
        w.write({"a": 1})
    w.close()
    assert str(info.value) == "cannot write /dev/full: No space left on device"


# ----------------------------------------------------------------------------- message limits


def _report(episodes: int) -> dict:
    return {
        "type": "ready",
        "run_id": "r",
        "actor_id": "a0",
        "token": bytes(32),
        "grant_id": 1,
        "env_steps": episodes,
        "slot": 0,
        # the longest msgpack numbers the schema takes: float64 (9 bytes), an int up to 2**63 - 1 (9 bytes)
        "episode_returns": [-1.2345678901234e14] * episodes,
        "episode_lengths": [2**63 - 1] * episodes,
        "timing": {"env_s": 0.1},
    }


@pytest.mark.parametrize("num_envs, rollout_length", [(64, 64), (1, 1), (256, 512)])
def test_a_report_of_every_env_ending_every_step_fits(num_envs, rollout_length):
    """E*T episodes (the most a rollout can end), each with the longest msgpack number: encoded
    and decoded under report_limits(E, T)."""
    episodes = num_envs * rollout_length
    limits = protocol.report_limits(num_envs, rollout_length)
    frames = codec.encode(_report(episodes), limits=limits)
    header, _ = codec.decode(frames, limits=limits)
    assert len(header["episode_returns"]) == episodes
    if len(frames[0]) > protocol.MAX_HEADER_BYTES:  # what overflowed before: the default limits refuse it
        with pytest.raises(protocol.ProtocolError, match="oversized"):
            codec.decode(frames)


def test_config_too_long_for_the_welcome_is_refused():
    with pytest.raises(ConfigError, match="bytes as JSON, over the 4,096"):
        config.load(None, ["run.run_dir=" + "d" * 5000])
    config.load(None, ["run.run_dir=" + "d" * 1000])  # long, but fits


def test_progress_line_omits_a_nan_tv_and_no_grad_fraction():
    # an llm iteration whose groups were all silent takes no optimizer step: its step scalars are NaN
    line = metrics.progress_line(
        env_steps=64, total=128, steps_per_s=3.0, avg_return=0.2, tv=float("nan"), no_grad=float("nan")
    )
    assert "nan" not in line and "tv" not in line and "no grad" not in line
    line = metrics.progress_line(env_steps=64, total=128, steps_per_s=3.0, avg_return=0.2, tv=0.05, no_grad=0.25)
    assert "tv 0.050" in line and "no grad 0.25" in line


def test_progress_line_says_lag_is_not_known_before_the_first_batch():
    line = metrics.progress_line(env_steps=0, total=128, steps_per_s=0.0, avg_return=None, lag=(None, None, None, None))
    assert "return      n/a" in line and "lag p50/p95 n/a" in line
    line = metrics.progress_line(env_steps=64, total=128, steps_per_s=3.0, avg_return=None, lag=(1, 2, 0.1, 0.3))
    assert "lag p50/p95 1/2 v | 0.10/0.30 s" in line


def test_checkpoint_put_off_while_no_file_descriptor_is_free(tmp_path):
    """A periodic checkpoint that fails for want of file descriptors (EMFILE: peers' connections
    can take them all) does not end the run: the learner goes on, and the next iteration writes
    it once descriptors are free again. Other write errors still raise (the test above)."""
    import resource

    from asyncrl.core.consume import Consumer, SlotData
    from asyncrl.tasks import make_task

    spec = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=8, num_envs=2)
    cfg = config.load(
        None,
        ["learner.slots_per_batch=1", "learner.num_slots=2", "learner.checkpoint_every=1", "algo.num_minibatches=2"],
    )
    c = Consumer(cfg, spec, tmp_path, task=make_task(cfg, spec=spec))

    def slot():
        a = spec.allocate()
        a["rewards"][:] = 1.0
        return SlotData("a", "h", a, spec.num_envs * spec.rollout_length, [])

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        c.consume([slot()])
        c.end_iteration()  # iteration 1: written
        assert _iteration_saved(tmp_path) == 1
        c.consume([slot()])
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
        try:  # take every descriptor left, as a connection flood would
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        c.end_iteration()  # iteration 2: no descriptor: put off, no error
        for fd in held:
            os.close(fd)
        held.clear()
        assert _iteration_saved(tmp_path) == 1
        c.consume([slot()])
        c.end_iteration()  # iteration 3: written
        assert _iteration_saved(tmp_path) == 3
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        c.close()


def _iteration_saved(run_dir) -> int:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"]


def test_tensorboard_writes_without_a_free_descriptor_stop_tensorboard_not_the_run(tmp_path, caplog):
    """TensorBoard opens its event file for every write: with every descriptor taken (EMFILE) the
    learner drops its writer with one warning and goes on (metrics.jsonl keeps the record); a full
    disk still ends the run as one line (RunDirError)."""
    from asyncrl.core.consume import Consumer, SlotData
    from asyncrl.core.metrics import tensorboard_kept
    from asyncrl.tasks import make_task

    class Broken:
        def __init__(self, code):
            self.code = code

        def add_scalar(self, *a, **k):
            raise OSError(self.code, os.strerror(self.code))

        add_histogram = add_scalar

        def close(self):
            pass

    assert tensorboard_kept(lambda: None)
    assert not tensorboard_kept(Broken(errno.EMFILE).add_scalar)
    with pytest.raises(OSError):
        tensorboard_kept(Broken(errno.ENOSPC).add_scalar)

    spec = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=8, num_envs=2)
    cfg = config.load(None, ["learner.slots_per_batch=1", "learner.num_slots=2", "algo.num_minibatches=2"])
    c = Consumer(cfg, spec, tmp_path, task=make_task(cfg, spec=spec))
    try:
        if c.tb is not None:
            c.tb.close()
        c.tb = c.lag.tb = Broken(errno.EMFILE)
        a = spec.allocate()
        a["rewards"][:] = 1.0
        assert c.consume([SlotData("a", "h", a, spec.num_envs * spec.rollout_length, [])]) is not None
        assert c.tb is None and c.lag.tb is None
        assert "TensorBoard output stopped" in caplog.text
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert any("policy_loss" in r for r in rows)
        c.tb = Broken(errno.ENOSPC)
        with pytest.raises(RunDirError):
            c.consume([SlotData("a", "h", a, spec.num_envs * spec.rollout_length, [])])
    finally:
        c.tb = None
        c.close()
