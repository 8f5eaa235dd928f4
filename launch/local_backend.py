"""The ``local`` backend: each trial is the trial harness under torchrun on this machine's GPUs.

A trial writes ``results/<study>/trials/<n>/spec.json``, runs torchrun in a process group of its own (``log.txt``,
the JSON lines in ``steps.jsonl``) and is followed by :mod:`launch._trial`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from launch._trial import SAFE_ENV, HarnessLines, LocalProcess, MeasuredBackend, free_port
from launch.base import BackendSettings, Measurement, StepReporter
from launch.harness.spec import HarnessEnv, build_spec, harness_args, importable, torchrun_command, unsupported_reasons
from specs import Cluster, ModelSpec, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

__all__ = ["LocalBackend", "check_local_gpus", "machine_gpu_count", "visible_device_ids", "SAFE_ENV"]


def visible_device_ids() -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` entries CUDA honours (it stops at the first entry that is not an index or a
    ``GPU-`` / ``MIG-`` UUID, or repeats one); None when unset."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return None
    ids: list[str] = []
    for x in (t.strip() for t in vis.split(",")):
        if not (x.isdigit() or x.startswith(("GPU-", "MIG-"))) or x in ids:
            break
        ids.append(x)
    return ids


def machine_gpu_count() -> int:
    """GPUs this process may use: :func:`visible_device_ids` if set, else ``nvidia-smi -L``; 0 if none."""
    ids = visible_device_ids()
    if ids is not None:
        return len(ids)
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def check_local_gpus(cluster: Cluster, what: str, *, nodes_fix: str | None = None, gpus_fix: str | None = None) -> None:
    """Raises TunerError (naming ``what``) unless the cluster is one node and this machine shows its GPUs;
    ``nodes_fix`` / ``gpus_fix``: what the message tells the user to do instead."""
    slice_fix = "use a study of a slice that fits one machine (--layers N, --gpus KxGPU)"
    if cluster.num_gpus > cluster.gpus_per_node:
        raise TunerError(f"{what} runs on one machine; {cluster.label} is {cluster.num_gpus // cluster.gpus_per_node} "
                         f"nodes: {nodes_fix or slice_fix}")
    have = machine_gpu_count()
    if have < cluster.num_gpus:
        raise TunerError(f"{what} needs {cluster.num_gpus} GPU{'s' if cluster.num_gpus != 1 else ''} and this machine "
                         f"shows {have} (nvidia-smi / CUDA_VISIBLE_DEVICES): "
                         f"{gpus_fix or 'run it on a machine with that many, or ' + slice_fix}")


def check_harness_dependencies(what: str = "--backend local") -> None:
    """Fail before any search when torch or megatron-core is not importable.

    Raises:
        TunerError: the ``gpu`` extra is not installed.
    """
    missing = [m for m in ("torch", "megatron.core") if not importable(m)]
    if missing:
        raise TunerError(
            f"{what} needs {' and '.join(missing)} on this machine: install the gpu extra "
            "(pip install -e '.[gpu]': torch and megatron-core; Transformer Engine is used when present)"
        )


class LocalBackend(MeasuredBackend):
    """Runs each layout with the trial harness on this machine's GPUs.

    ``num_gpus`` (default: :func:`machine_gpu_count`): GPUs a trial uses, the first visible ones; ``launcher`` replaces
    torchrun (tests); ``harness_options``: further :class:`HarnessSpec` fields (``tune verify``).

    Raises:
        TunerError: no GPU found, or bad ``steps`` / ``timeout_s``.
    """

    name = "local"
    runs_harness = True
    own_flags = frozenset({"--trial-profile-step"})

    @classmethod
    def check_machine(cls, cluster: Cluster) -> None:
        """This machine shows the cluster's GPUs (one node) and has the harness's dependencies (torch,
        megatron-core). Raises TunerError naming ``--backend local`` and what to use instead."""
        have = machine_gpu_count()
        check_local_gpus(cluster, "--backend local",
                         nodes_fix=f"use --gpus {cluster.num_gpus}x{cluster.gpu.name} for one node of that size, or "
                         "--backend ray for several",
                         gpus_fix=f"use at most --gpus {have}x{cluster.gpu.name} (this machine's {have} "
                                  f"GPU{'s' if have != 1 else ''}; slice a model with --layers to make it fit)")
        check_harness_dependencies()

    def __init__(self, *, trials_dir: str | Path = "results/trials", num_gpus: int | None = None, steps: int = 8,
                 warmup_steps: int = 2, timeout_s: float = 600.0, launcher: Sequence[str] | None = None,
                 env: HarnessEnv | None = None, poll_s: float = 0.5,
                 harness_options: dict[str, object] | None = None) -> None:
        n = machine_gpu_count() if num_gpus is None else num_gpus
        if n < 1:
            why = ("CUDA_VISIBLE_DEVICES lists none" if os.environ.get("CUDA_VISIBLE_DEVICES") is not None
                   else "nvidia-smi -L lists none" if shutil.which("nvidia-smi") else "nvidia-smi is not installed")
            raise TunerError(f"--backend local: no GPU found on this machine ({why})")
        super().__init__(Path(trials_dir), steps, warmup_steps, timeout_s, poll_s)
        self.num_gpus = n
        self.launcher = list(launcher) if launcher is not None else None
        self.env = env if env is not None else HarnessEnv.detect()
        self.harness_options = dict(harness_options or {})

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> LocalBackend:
        return cls(trials_dir=settings.trials_dir, num_gpus=settings.num_gpus, steps=settings.steps,
                   warmup_steps=settings.warmup_steps, timeout_s=settings.timeout_s,
                   harness_options=None if settings.profile_step is None else {"profile_step": settings.profile_step})

    def _other_gpus(self, layout: Layout) -> str | None:
        if layout.world_size == self.num_gpus:
            return None
        return f"the layout is for {layout.world_size} GPUs but the local backend uses this machine's {self.num_gpus}"

    def refusal(self, layout: Layout, model: ModelSpec, workload: Workload) -> str | None:
        if why := self._other_gpus(layout):
            return why
        return "; ".join(unsupported_reasons(layout, model, workload, self.env)) or None

    def _device_env(self) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` of the first ``num_gpus`` visible GPUs when the trial uses fewer than the machine
        has; else empty."""
        ids = visible_device_ids()
        if ids is None:
            ids = [str(i) for i in range(machine_gpu_count())]
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids[: self.num_gpus])} if len(ids) > self.num_gpus else {}

    def command(self, spec_path: Path, out_path: Path) -> list[str]:
        if self.launcher is not None:
            return [*self.launcher, *harness_args(spec_path, out_path)]
        return torchrun_command(self.num_gpus, spec_path, out_path, master_port=free_port(), python=sys.executable)

    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload,
            reporter: StepReporter | None = None, trial_number: int | None = None,
            trial_dir: str | None = None) -> Measurement:
        """Run ``layout`` as the harness; ``trial_dir`` names its folder (default: the trial number).

        Raises:
            InfeasibleLayout: (rule ``harness_env``) another GPU count, or something not installed; nothing was started.
            TrialFailed: out of memory, timeout, crash / NCCL error, or a launcher that cannot be started.
            TrialStopped: the reporter stopped the trial.
            KeyboardInterrupt: the backend was cancelled; the trial's processes were killed.
        """
        if why := self._other_gpus(layout):
            raise InfeasibleLayout("harness_env", why)
        spec = build_spec(model, layout, workload, env=self.env, steps=self.steps, warmup_steps=self.warmup_steps,
                          options=self.harness_options)
        _, tdir = self._trial_folder(trial_number, trial_dir)
        spec_path, out_path, log_path = tdir / "spec.json", tdir / "steps.jsonl", tdir / "log.txt"
        spec_path.write_text(spec.to_json())
        cmd = self.command(spec_path, out_path)
        (tdir / "command.txt").write_text(" ".join(cmd) + "\n")
        trial = self._trial(layout, tdir, reporter, logs=f"log: {log_path}",
                            no_result="the harness exited without a summary: ")
        proc = LocalProcess(cmd, log_path=log_path, env={**os.environ, **SAFE_ENV, **self._device_env()},
                            trial_dir=tdir)
        return trial.follow(proc, HarnessLines.file(out_path),
                            extra=lambda got: {"notes": list(spec.notes), "data": got.result.data})
