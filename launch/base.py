"""The backend interface: a backend turns a :class:`Layout` into a :class:`Measurement`."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from cost_model.specs import Cluster, ModelSpec, Workload
from search_spaces.layout import Layout

__all__ = ["FailureKind", "Measurement", "TrialBackend", "TrialFailed"]


class FailureKind(str, Enum):
    none = "none"
    oom = "oom"
    timeout = "timeout"
    crash = "crash"


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """What a backend reports for one layout.

    ``source`` is ``"predicted"`` for the analytical ``model`` backend and
    ``"measured"`` for backends that ran the layout on GPUs.
    """

    layout: Layout
    source: str
    tokens_per_s_per_gpu: float
    peak_bytes: float
    """Peak memory per GPU (bytes): predicted, or the max over ranks of reserved memory."""
    step_times_s: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    grad_norms: tuple[float, ...] = ()
    failure: FailureKind = FailureKind.none
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class TrialFailed(Exception):
    """A trial ended without a measurement (out of memory, timeout, crash)."""

    def __init__(self, kind: FailureKind, message: str, log_path: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.log_path = log_path


class TrialBackend(abc.ABC):
    """Runs one layout and reports a :class:`Measurement`.

    Implementations: ``model`` (the analytical estimate, this package), and later
    ``local``, ``ray`` and ``command`` (real trials).
    """

    name: str = "base"
    source: str = "predicted"

    @abc.abstractmethod
    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload) -> Measurement:
        """Evaluate ``layout``.

        Raises:
            TrialFailed: the trial ran out of memory, timed out or crashed.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (default: nothing)."""
