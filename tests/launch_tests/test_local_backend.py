"""What is the local backend's own (no GPU, no torch; the fake trial program stands in for torchrun): its files,
the torchrun command, this machine's GPUs, refusals. What every backend does (a measurement, OOM, crash, timeout,
a stop, cancel) is in test_backend_contract.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launch import get_backend
from launch.base import FailureKind, TrialFailed
from launch.harness.spec import HarnessEnv
from launch.local_backend import SAFE_ENV, LocalBackend, machine_gpu_count, visible_device_ids
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model

FAKE = str(Path(__file__).with_name("fake_trial.py"))
GIB = 2**30
WL = Workload(seq_length=8192, global_batch_size=8)


@pytest.fixture(scope="module")
def m4():
    return slice_model(load_model("MiniMax-M2"), 4)


@pytest.fixture
def backend(tmp_path):
    return LocalBackend(
        trials_dir=tmp_path / "trials", num_gpus=4, steps=5, warmup_steps=2, timeout_s=20,
        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
    )


def _run(b, m4, mode, monkeypatch, lay=None, **kw):
    monkeypatch.setenv("FAKE_TRIAL_MODE", mode)
    return b.run(lay or Layout(world_size=4, ep=4), model=m4, cluster=parse_gpus("4xH200"), workload=WL, **kw)


def test_trial_files_and_measurement_extras(backend, m4, monkeypatch, tmp_path):
    m = _run(backend, m4, "ok", monkeypatch, trial_number=7)
    d = tmp_path / "trials" / "7"
    assert m.log_path == str(d) and {p.name for p in d.iterdir()} == {
        "spec.json",
        "steps.jsonl",
        "log.txt",
        "command.txt",
        "process.json",
    }
    assert (d / "command.txt").read_text().split()[:2] == [sys.executable, FAKE]
    assert (
        m.extra["notes"] == list(m.extra["summary"]["notes"]) and m.extra["data"] == {}
    )  # the spec's notes; synthetic data


def test_oom_from_log_text(backend, m4, monkeypatch):
    with pytest.raises(TrialFailed) as e:
        _run(backend, m4, "oom_text", monkeypatch)
    assert e.value.kind == FailureKind.oom and e.value.memory_reached_bytes == pytest.approx(138.5 * GIB)


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("crash", "crash on rank 0: AssertionError: boom (log: "),
        ("silent", "the harness exited without a summary: crash (exit status 0)"),
    ],
)
def test_failure_messages(backend, m4, monkeypatch, mode, needle):
    with pytest.raises(TrialFailed) as e:
        _run(backend, m4, mode, monkeypatch)
    assert e.value.kind == FailureKind.crash and needle in str(e.value) and str(e.value).endswith("log.txt)")


def test_refusals_before_any_process(backend, m4, monkeypatch, tmp_path):
    with pytest.raises(InfeasibleLayout, match="for 8 GPUs"):
        _run(backend, m4, "ok", monkeypatch, lay=Layout(world_size=8, ep=8))
    with pytest.raises(InfeasibleLayout, match="needs Transformer Engine"):
        _run(backend, m4, "ok", monkeypatch, lay=Layout(world_size=4, cp=2, ep=2))
    assert not (tmp_path / "trials").exists()
    assert (
        backend.refusal(Layout(world_size=4, ep=4, dispatcher="flex+deepep"), m4, WL)
        and backend.refusal(Layout(world_size=4, ep=4), m4, WL) is None
    )


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
    for value, ids in (
        ("0,,1", ["0"]), ("abc", []), ("0,-1,1", ["0"]), ("0,0", ["0"]), ("3, 5 ,GPU-ab12", ["3", "5", "GPU-ab12"]),
    ):
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
        b = LocalBackend(
            trials_dir=tmp_path / f"t{n}", num_gpus=n, steps=3, warmup_steps=1, timeout_s=20,
            launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
        )
        b.run(Layout(world_size=n, ep=n), model=m4, cluster=parse_gpus(f"{n}xH200"), workload=WL, trial_number=n)
        (f,) = [p for p in dump.iterdir() if json.loads(p.read_text())["out"].startswith(str(tmp_path / f"t{n}"))]
        seen[n] = json.loads(f.read_text())["env"]["CUDA_VISIBLE_DEVICES"]
    assert seen == {2: "3,5", 4: "3,5,6,7"}
