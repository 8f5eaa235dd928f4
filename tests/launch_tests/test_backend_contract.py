"""The contract every trial backend keeps, as one suite run over every backend (Optuna's ``StorageTestCase``
pattern): ``local`` and ``ray`` (the fake trial program as the harness; Ray on the session's simulated
cluster), ``command`` (the same program printing Megatron's log, through a launch template) and ``model``
where a case applies. No GPU, no torch; no case asserts how long anything took: a trial's end is checked
by its outcome and by the processes it leaves (none), read from the pid files of the fake program.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launch import Measurement, TrialBackend, TrialFailed, TrialStopped, backend_class, backends
from launch.base import FailureKind
from launch.harness.spec import HarnessEnv
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Layout
from specs.model import slice_model

from .fake_trial import FAKE, recorded_pids, survivors, wait_until

GIB = 2**30
WL = Workload(seq_length=8192, global_batch_size=8)
LAYOUT = Layout(world_size=2, ep=2)
STEP_S = 0.01
"""Seconds each fake step sleeps."""
REPORT_S = 0.5
"""The step time the fake reports (seconds)."""
TPS = 8 * 8192 / REPORT_S / 2
"""The tokens/s/GPU that step time gives: global batch x sequence / step time / world size."""
#: The Ray cluster takes seconds to start: its cases are `slow`.
MEASURED = ("local", pytest.param("ray", marks=pytest.mark.slow), "command")


@pytest.fixture(scope="module")
def m2():
    return slice_model(load_model("MiniMax-M2"), 2)


@dataclass
class Kit:
    """Opens one backend on the fake trial program and runs the suite's layout with it."""

    name: str
    tmp: Path
    model: object
    gpu: str = ""
    """The Ray resource of a GPU (``ray``)."""

    @property
    def pid_dir(self) -> Path:
        return self.tmp / "pids"

    @property
    def trials_dir(self) -> Path:
        return self.tmp / "trials"

    @property
    def oom_bytes(self) -> float:
        """The memory reached that the fake reports when it runs out of memory (bytes)."""
        return 138.5 * GIB if self.name == "command" else 150 * GIB

    def backend(
        self, mode: str = "ok", *, steps: int = 4, timeout_s: float = 60.0, program: str | None = None, **fake: object
    ) -> TrialBackend:
        """The backend, with its trials in FAKE_TRIAL_MODE ``mode``; ``fake``: more FAKE_* settings (FAKE_HANG_AFTER=2
        as ``hang_after=2``); ``program``: another program than the fake (one that cannot start)."""
        args = [
            f"--FAKE_TRIAL_MODE={mode}",
            f"--FAKE_PID_DIR={self.pid_dir}",
            f"--FAKE_STEP_S={STEP_S}",
            f"--FAKE_REPORT_STEP_S={REPORT_S}",
            *(f"--FAKE_{k.upper()}={v}" for k, v in fake.items()),
        ]
        common = dict(trials_dir=self.trials_dir, steps=steps, warmup_steps=1, timeout_s=timeout_s, poll_s=0.02)
        launcher = [program] if program else [sys.executable, FAKE, *args]
        if self.name == "local":
            from launch.local_backend import LocalBackend

            return LocalBackend(num_gpus=2, launcher=launcher, env=HarnessEnv(), **common)
        if self.name == "ray":
            from launch.ray_backend import RayBackend

            return RayBackend(
                gpus_per_node=2,
                launcher=launcher,
                gpu_resource=self.gpu,
                env=HarnessEnv(),
                placement_timeout_s=60,
                **common,
            )
        if self.name == "command":
            from launch.command_backend import CommandBackend

            argv = (
                [program.replace("/nonexistent/", "/nonexistent/{tp}/")]
                if program
                else [sys.executable, FAKE, "--FAKE_FORMAT=megatron", "--FAKE_STEPS={steps}", *args]
            )
            tpl = self.tmp / f"template.{mode}.yaml"
            tpl.write_text(yaml.safe_dump({"argv": argv}))
            return CommandBackend(command_template=tpl, **common)
        from launch.model_backend import ModelBackend

        return ModelBackend()

    def run(self, backend: TrialBackend, trial_number: int = 0, reporter=None) -> Measurement:
        return backend.run(
            LAYOUT, model=self.model, cluster=parse_gpus("2xH200"), workload=WL, reporter=reporter,
            trial_number=trial_number,
        )

    def released(self) -> bool:
        """Whether the backend holds nothing of its trials (Ray: every placement group is removed)."""
        if self.name != "ray":
            return True
        import ray

        return all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def _kit(request, tmp_path, m2) -> Kit:
    gpu = request.getfixturevalue("ray_cluster").gpu if request.param == "ray" else ""
    return Kit(request.param, tmp_path, m2, gpu)


@pytest.fixture(params=MEASURED)
def kit(request, tmp_path, m2):
    """Each backend whose trials run processes."""
    return _kit(request, tmp_path, m2)


@pytest.fixture(params=(*MEASURED, "model"))
def any_kit(request, tmp_path, m2):
    """Every backend."""
    return _kit(request, tmp_path, m2)


# --------------------------------------------------------------------------- the cases


def test_ok_is_a_measurement_with_step_times_throughput_and_peak_memory(any_kit):
    seen: list[int] = []

    def reporter(tps):
        seen.append(len(tps))
        assert tps and all(t == pytest.approx(TPS) for t in tps)

    b = any_kit.backend("ok", steps=4)
    m = any_kit.run(b, trial_number=7, reporter=reporter)
    assert (
        m.layout == LAYOUT
        and m.tokens_per_s_per_gpu > 0
        and m.peak_bytes > 0
        and m.step_times_s
        and min(m.step_times_s) > 0
    )
    if any_kit.name == "model":
        assert m.source == "predicted" and not b.measured and seen == []  # nothing runs: no step to report
        return
    assert m.source == "measured" and b.measured
    assert m.tokens_per_s_per_gpu == pytest.approx(TPS)
    assert m.step_times_s == pytest.approx((REPORT_S,) * 3)  # the 1 warm-up step left out
    assert len(m.losses) == len(m.grad_norms) == 4
    assert m.peak_bytes == 90 * GIB and m.extra["peak_allocated_bytes"] == 80 * GIB
    assert {"summary", "wall_s", "step_time_cv", "notes"} <= set(m.extra)
    assert m.log_path == str(any_kit.trials_dir / "7") and Path(m.log_path).is_dir()
    assert seen == sorted(set(seen)) and all(n <= 4 for n in seen)  # called only when a step was added
    assert not survivors(any_kit.pid_dir) and any_kit.released()


def test_out_of_memory_fails_with_kind_oom_and_the_memory_reached(kit):
    with pytest.raises(TrialFailed) as e:
        kit.run(kit.backend("oom"), trial_number=3)
    assert e.value.kind == FailureKind.oom and e.value.memory_reached_bytes == pytest.approx(kit.oom_bytes)
    assert "out of memory" in str(e.value) and f"at {kit.oom_bytes / GIB:.1f} GiB" in str(e.value)
    assert e.value.log_path == str(kit.trials_dir / "3") and e.value.log_path in str(e.value)
    assert not survivors(kit.pid_dir) and kit.released()


@pytest.mark.parametrize(("mode", "needle"), [("crash", "crash"), ("nccl", "NCCL error"), ("silent", "exit status 0")])
def test_a_crash_fails_with_kind_crash_and_the_log(kit, mode, needle):
    with pytest.raises(TrialFailed) as e:
        kit.run(kit.backend(mode), trial_number=4)
    assert e.value.kind == FailureKind.crash and needle in str(e.value)
    assert Path(e.value.log_path).is_dir() and e.value.log_path in str(e.value)  # the message points at the logs
    assert any(p.name.startswith("log") for p in Path(e.value.log_path).iterdir())
    assert not survivors(kit.pid_dir) and kit.released()


def test_a_program_that_cannot_start_is_a_crash_not_an_exception(kit):
    with pytest.raises(TrialFailed) as e:
        kit.run(kit.backend(program="/nonexistent/launcher"))
    assert e.value.kind == FailureKind.crash and "start" in str(e.value) and Path(e.value.log_path).is_dir()
    assert kit.released()


def test_a_hang_is_killed_at_the_timeout_with_its_whole_process_group(kit):
    with pytest.raises(TrialFailed) as e:
        kit.run(kit.backend("hang", timeout_s=1.5))
    assert (
        e.value.kind == FailureKind.timeout
        and "timed out after" in str(e.value)
        and "process group was killed" in str(e.value)
    )
    assert recorded_pids(kit.pid_dir)["fake"]  # it did start
    assert not survivors(kit.pid_dir)  # the fake and the child it started in its group are gone
    assert kit.released()


def test_the_reporter_stops_a_trial_with_the_steps_so_far(kit):
    seen: list[int] = []

    def reporter(tps):
        seen.append(len(tps))
        return "too slow" if len(tps) >= 2 else None

    with pytest.raises(TrialStopped) as e:  # it hangs after 2 steps: only the reporter can end it before the timeout
        kit.run(kit.backend("hang", steps=6, hang_after=2), trial_number=5, reporter=reporter)
    assert e.value.reason == "too slow" and seen[-1] == 2
    assert len(e.value.step_times_s) == 2 and e.value.tokens_per_s_per_gpu == pytest.approx((TPS, TPS))
    assert e.value.log_path == str(kit.trials_dir / "5")
    assert recorded_pids(kit.pid_dir)["child"] and not survivors(kit.pid_dir) and kit.released()


def test_cancel_ends_a_running_trial_and_leaves_no_process(kit):
    b = kit.backend("hang")
    box: dict[str, BaseException] = {}

    def go():
        try:
            kit.run(b, trial_number=6)
        except BaseException as e:  # noqa: BLE001 - the outcome is checked below
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    assert wait_until(
        lambda: bool(recorded_pids(kit.pid_dir)["child"]) or not t.is_alive()
    )  # the trial runs (it hangs)
    b.cancel()
    t.join(timeout=60)
    assert not t.is_alive() and isinstance(box.get("e"), KeyboardInterrupt), box
    assert not survivors(kit.pid_dir) and kit.released()
    with pytest.raises(KeyboardInterrupt):  # a cancelled backend starts nothing more
        kit.run(b, trial_number=8)
    assert not (kit.trials_dir / "8").exists()


def test_hooks(any_kit):
    b = any_kit.backend()
    assert type(b) is backend_class(any_kit.name) and b.name == any_kit.name
    assert b.measured == (any_kit.name != "model") and b.source == ("measured" if b.measured else "predicted")
    assert b.refusal(LAYOUT, any_kit.model, WL) is None  # it can run the suite's layout
    gpus = b.cluster_gpus()
    assert gpus is None if any_kit.name != "ray" else gpus >= LAYOUT.world_size
    b.cancel()  # nothing runs: nothing to stop
    b.close()
    b.close()  # closing twice is harmless
    if any_kit.name == "ray":
        import ray

        assert ray.is_initialized()  # a backend closes only the Ray instance it started itself


#: A value of each backend-only flag (its TuneConfig field is the flag's name).
OWN_FLAG_VALUES = {
    "--trial-profile-step": 1,
    "--command-template": "run.sh.tmpl",
    "--ray-address": "auto",
    "--parallel-trials": 2,
    "--trial-env": ("NCCL_DEBUG=INFO",),
}


@pytest.mark.parametrize("name", list(backends()))
def test_its_own_flags_are_tune_flags_refused_with_every_other_backend(name):
    """A backend's traits are class attributes (``source``, ``runs_harness``, ``own_flags``); the checks of
    the flags read them, so every other backend refuses its flags with one message naming it."""
    import typer

    from tuner.cli import app
    from tuner.study import TuneConfig, _validate_config

    cls = backend_class(name)
    assert (
        cls.name == name
        and cls.source in ("predicted", "measured")
        and not (cls.runs_harness and cls.source != "measured")
    )
    options = {o for p in typer.main.get_command(app).params for o in p.opts}
    for flag in cls.own_flags:
        assert flag in options
        field = {flag.removeprefix("--").replace("-", "_"): OWN_FLAG_VALUES[flag]}
        for other in set(backends()) - {name}:
            if flag in backend_class(other).own_flags:
                continue
            with pytest.raises(TunerError, match=f"{flag}.* --backend {name}"):
                _validate_config(TuneConfig.from_dict(dict(model="m", gpus="8xH200", backend=other, **field)))
