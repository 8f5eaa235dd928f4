"""The backend interface: a backend turns a :class:`Layout` into a :class:`Measurement`."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from cost_model.specs import Cluster, ModelSpec, Workload
from search_spaces.layout import Layout

__all__ = ["FailureKind", "Measurement", "StepReporter", "TrialBackend", "TrialFailed", "TrialStopped"]


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
    """A trial ended without a measurement (out of memory, timeout, crash).

    Attributes:
        kind: what went wrong.
        log_path: the trial's log (``results/<study>/trials/<n>/``), "" if none.
        memory_reached_bytes: for ``oom``, the memory the failing rank had reached (bytes; NaN if unknown).
    """

    def __init__(self, kind: FailureKind, message: str, log_path: str = "", *, memory_reached_bytes: float = float("nan")) -> None:
        super().__init__(message)
        self.kind = kind
        self.log_path = log_path
        self.memory_reached_bytes = memory_reached_bytes


class TrialStopped(Exception):
    """A trial was stopped early because its reporter asked for it (pruned: clearly slower than the best).

    Attributes:
        reason: the reporter's reason.
        step_times_s: the steps measured before it was stopped (seconds, warm-up included).
        tokens_per_s_per_gpu: throughput of those steps.
        log_path: the trial's log folder.
    """

    def __init__(self, reason: str, *, step_times_s: Sequence[float] = (), tokens_per_s_per_gpu: Sequence[float] = (), log_path: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.step_times_s = tuple(step_times_s)
        self.tokens_per_s_per_gpu = tuple(tokens_per_s_per_gpu)
        self.log_path = log_path


#: Called by a backend after each measured step with the throughput of every step so
#: far (tokens/s/GPU, warm-up included); returns a reason to stop the trial, or None.
StepReporter = Callable[[Sequence[float]], "str | None"]


class TrialBackend(abc.ABC):
    """Runs one layout and reports a :class:`Measurement`.

    Implementations: ``model`` (the analytical estimate) and ``local`` (the trial
    harness under torchrun on this machine's GPUs); ``ray`` and ``command`` later.
    """

    name: str = "base"
    source: str = "predicted"

    @abc.abstractmethod
    def run(
        self,
        layout: Layout,
        *,
        model: ModelSpec,
        cluster: Cluster,
        workload: Workload,
        reporter: StepReporter | None = None,
        trial_number: int | None = None,
    ) -> Measurement:
        """Evaluate ``layout``.

        Args:
            reporter: called after each step a real trial measures; when it returns a
                reason the backend stops the trial (backends without steps ignore it).
            trial_number: the Optuna trial number (names the trial's log folder).

        Raises:
            TrialFailed: the trial ran out of memory, timed out or crashed.
            TrialStopped: the reporter stopped the trial.
            InfeasibleLayout: the backend cannot run this layout here (before any GPU work).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (default: nothing)."""


def check_trial_limits(backend: str, steps: int, warmup_steps: int, timeout_s: float) -> None:
    """The limits every real-trial backend takes, checked once.

    Raises:
        TunerError: ``steps`` < 1, warm-up steps outside ``[0, steps)``, or a timeout that is not > 0 s.
    """
    from cost_model.errors import TunerError

    if steps < 1 or not 0 <= warmup_steps < steps:
        raise TunerError(f"--backend {backend}: steps must be >= 1 and warm-up steps in [0, steps), got {steps}, {warmup_steps}")
    if not timeout_s > 0:
        raise TunerError(f"--backend {backend}: the trial timeout must be > 0 s, got {timeout_s}")
