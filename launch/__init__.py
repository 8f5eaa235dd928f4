"""Backends that turn a Layout into a Measurement, and the exporters of recipes and run commands."""

from __future__ import annotations

from cost_model.errors import TunerError
from launch.base import FailureKind, Measurement, StepReporter, TrialBackend, TrialFailed, TrialStopped

__all__ = ["BACKENDS", "FailureKind", "Measurement", "StepReporter", "TrialBackend", "TrialFailed", "TrialStopped", "get_backend"]

#: Backend names the command line accepts, and what each does.
BACKENDS = {
    "model": "analytical cost model (no GPU; every number is a prediction)",
    "local": "torchrun of the megatron-core trial harness on this machine's GPUs (measured)",
    "ray": "the trial harness under torchrun on the nodes of a Ray cluster, one placement group per trial (measured)",
    "command": "your slime / Megatron-LM launch command from a template (--command-template FILE), its log parsed (measured)",
}


def get_backend(name: str, **kwargs: object) -> TrialBackend:
    """The backend called ``name``.

    ``model`` takes ``calibration`` and ``memory_headroom``; ``local`` takes ``trials_dir``,
    ``num_gpus``, ``steps``, ``warmup_steps``, ``timeout_s``; ``command`` takes ``command_template``,
    ``trials_dir``, ``steps``, ``warmup_steps``, ``timeout_s``; ``ray`` takes ``trials_dir``, ``address``,
    ``gpus_per_node``, ``steps``, ``warmup_steps``, ``timeout_s``, ``extra_env`` (other keywords are ignored).

    Raises:
        TunerError: unknown name, (local) no GPU, (command) no or a bad template, or (ray) no
            Ray cluster to connect to.
    """
    if name == "model":
        from launch.model_backend import ModelBackend

        keep = {k: v for k, v in kwargs.items() if k in ("calibration", "memory_headroom")}
        return ModelBackend(**keep)  # type: ignore[arg-type]
    if name == "local":
        from launch.local_backend import LocalBackend

        return LocalBackend(**kwargs)  # type: ignore[arg-type]
    if name == "command":
        from launch.command_backend import CommandBackend

        return CommandBackend(**kwargs)  # type: ignore[arg-type]
    if name == "ray":
        from launch.ray_backend import RayBackend

        return RayBackend(**kwargs)  # type: ignore[arg-type]
    raise TunerError(f"--backend {name!r}: unknown backend; accepted: {', '.join(BACKENDS)}")
