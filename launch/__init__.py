"""Backends that turn a Layout into a Measurement, and the exporters of recipes and run commands."""

from __future__ import annotations

from cost_model.errors import TunerError
from launch.base import FailureKind, Measurement, TrialBackend, TrialFailed

__all__ = ["BACKENDS", "FailureKind", "Measurement", "TrialBackend", "TrialFailed", "get_backend"]

#: Backend names the command line accepts, and what each does.
BACKENDS = {
    "model": "analytical cost model (no GPU; every number is a prediction)",
    "local": "torchrun of the megatron-core trial harness on this machine's GPUs (not in this version)",
    "ray": "the trial harness across a Ray cluster (not in this version)",
    "command": "a slime / Megatron-LM command template, log parsed (not in this version)",
}


def get_backend(name: str, **kwargs: object) -> TrialBackend:
    """The backend called ``name``.

    Raises:
        TunerError: unknown name, or a backend this version does not ship yet.
    """
    if name == "model":
        from launch.model_backend import ModelBackend

        return ModelBackend(**kwargs)  # type: ignore[arg-type]
    if name in BACKENDS:
        raise TunerError(
            f"--backend {name}: real trials are not available in this version; use --backend model "
            "(the analytical prediction). The local, ray and command backends are planned."
        )
    raise TunerError(f"--backend {name!r}: unknown backend; accepted: {', '.join(BACKENDS)}")
