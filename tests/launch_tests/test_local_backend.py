"""The local backend end to end, with a fake trial program standing in for torchrun (no GPU, no torch)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from launch import get_backend
from launch.base import FailureKind, TrialFailed, TrialStopped
from launch.harness.spec import HarnessEnv, slice_model
from launch.local_backend import SAFE_ENV, LocalBackend, machine_gpu_count, visible_device_ids
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

FAKE = str(Path(__file__).with_name("fake_trial.py"))
GIB = 2**30
WL = Workload(seq_length=8192, global_batch_size=8)


@pytest.fixture(scope="module")
def m4():
    return slice_model(load_model("MiniMax-M2"), 4)


@pytest.fixture
def backend(tmp_path):
    return LocalBackend(trials_dir=tmp_path / "trials", num_gpus=4, steps=5, warmup_steps=2, timeout_s=20,
                        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02)


def _run(b, m4, mode, monkeypatch, lay=None, **kw):
    monkeypatch.setenv("FAKE_TRIAL_MODE", mode)
    return b.run(lay or Layout(world_size=4, ep=4), model=m4, cluster=parse_gpus("4xH200"), workload=WL, **kw)


def test_ok_measurement_and_files(backend, m4, monkeypatch, tmp_path):
    m = _run(backend, m4, "ok", monkeypatch, trial_number=7)
    assert m.source == "measured" and m.peak_bytes == 90 * GIB and m.extra["peak_allocated_bytes"] == 80 * GIB
    assert m.tokens_per_s_per_gpu == pytest.approx(8 * 8192 / 0.01 / 4)
    assert len(m.step_times_s) == 3 and len(m.losses) == 5  # median steps exclude the 2 warm-up steps
    d = tmp_path / "trials" / "7"
    assert m.log_path == str(d) and {p.name for p in d.iterdir()} == {"spec.json", "steps.jsonl", "log.txt", "command.txt"}


def test_oom_is_an_outcome_with_memory_reached(backend, m4, monkeypatch):
    with pytest.raises(TrialFailed) as e:
        _run(backend, m4, "oom", monkeypatch)
    assert e.value.kind == FailureKind.oom and e.value.memory_reached_bytes == 150 * GIB
    assert "out of memory on rank(s) 1 at 150.0 GiB" in str(e.value) and Path(e.value.log_path).is_dir()


def test_oom_from_log_text(backend, m4, monkeypatch):
    with pytest.raises(TrialFailed) as e:
        _run(backend, m4, "oom_text", monkeypatch)
    assert e.value.kind == FailureKind.oom and e.value.memory_reached_bytes == pytest.approx(138.5 * GIB)


def test_hang_is_killed_with_its_whole_group(tmp_path, m4, monkeypatch):
    b = LocalBackend(trials_dir=tmp_path / "t", num_gpus=4, steps=5, timeout_s=1.5, launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(TrialFailed) as e:
        _run(b, m4, "hang", monkeypatch)
    assert time.monotonic() - t0 < 30
    assert e.value.kind == FailureKind.timeout and "1 finished step" in str(e.value)
    # the fake's child (sleep 600) was in the trial's process group: nothing of it survives
    out = os.popen("ps -eo args").read()
    assert "time.sleep(600)" not in out


@pytest.mark.parametrize("mode, needle", [("crash", "crash on rank 0: AssertionError"), ("nccl", "NCCL error")])
def test_crashes(backend, m4, monkeypatch, mode, needle):
    with pytest.raises(TrialFailed) as e:
        _run(backend, m4, mode, monkeypatch)
    assert e.value.kind == FailureKind.crash and needle in str(e.value)
    assert (Path(e.value.log_path) / "log.txt").exists()


def test_reporter_stops_a_trial(backend, m4, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_S", "0.3")
    seen = []

    def reporter(tps):
        seen.append(len(tps))
        return "too slow" if len(tps) >= 2 else None

    t0 = time.monotonic()
    with pytest.raises(TrialStopped) as e:
        _run(backend, m4, "ok", monkeypatch, reporter=reporter)
    assert e.value.reason == "too slow" and len(e.value.step_times_s) >= 2 and seen[-1] >= 2
    assert time.monotonic() - t0 < 5 * 0.3 + 0.5  # stopped before the 5 steps were done


def test_refusals_before_any_process(backend, m4, monkeypatch, tmp_path):
    with pytest.raises(InfeasibleLayout, match="for 8 GPUs"):
        _run(backend, m4, "ok", monkeypatch, lay=Layout(world_size=8, ep=8))
    with pytest.raises(InfeasibleLayout, match="needs Transformer Engine"):
        _run(backend, m4, "ok", monkeypatch, lay=Layout(world_size=4, cp=2, ep=2))
    assert not (tmp_path / "trials").exists()
    assert backend.refusal(Layout(world_size=4, ep=4, dispatcher="flex+deepep"), m4, WL) and backend.refusal(Layout(world_size=4, ep=4), m4, WL) is None


def test_safe_environment_and_command(backend):
    assert SAFE_ENV["NCCL_NVLS_ENABLE"] == "0" and SAFE_ENV["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    real = LocalBackend(num_gpus=2, env=HarnessEnv())
    cmd = real.command(Path("s.json"), Path("o.jsonl"))
    assert "torch.distributed.run" in cmd and "--nproc-per-node=2" in cmd and "launch.harness.train" in cmd


def test_gpu_detection_and_registration(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert machine_gpu_count() == 3
    assert get_backend("local").num_gpus == 3 and LocalBackend(env=HarnessEnv()).num_gpus == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(TunerError, match="no GPU found"):
        get_backend("local")
    with pytest.raises(TunerError, match="timeout"):
        LocalBackend(num_gpus=1, timeout_s=0)
    # CUDA reads CUDA_VISIBLE_DEVICES up to the first entry that is not a device (or repeats one)
    for value, ids in (("0,,1", ["0"]), ("abc", []), ("0,-1,1", ["0"]), ("0,0", ["0"]), ("3, 5 ,GPU-ab12", ["3", "5", "GPU-ab12"])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_device_ids() == ids and machine_gpu_count() == len(ids), value


def test_fewer_gpus_than_the_machine_uses_the_first_ones(tmp_path, m4, monkeypatch):
    """A 2-GPU trial on a machine that shows 4 GPUs runs on the first 2 (used on the 2 x H200 machine for
    1-GPU layouts); a trial that uses them all keeps the environment as it is."""
    import json

    dump = tmp_path / "env"
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_ENV_DUMP", str(dump))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    seen = {}
    for n in (2, 4):
        b = LocalBackend(trials_dir=tmp_path / f"t{n}", num_gpus=n, steps=3, warmup_steps=1, timeout_s=20,
                         launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02)
        b.run(Layout(world_size=n, ep=n), model=m4, cluster=parse_gpus(f"{n}xH200"), workload=WL, trial_number=n)
        (f,) = [p for p in dump.iterdir() if json.loads(p.read_text())["out"].startswith(str(tmp_path / f"t{n}"))]
        seen[n] = json.loads(f.read_text())["env"]["CUDA_VISIBLE_DEVICES"]
    assert seen == {2: "3,5", 4: "3,5,6,7"}
