"""The backend interface: a backend turns a :class:`Layout` into a :class:`Measurement`."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from specs import Cluster, ModelSpec, Workload
from specs.layout import Layout
from specs.units import DEFAULT_MEMORY_HEADROOM

__all__ = ["BackendSettings", "FailureKind", "Measurement", "StepReporter", "TrialBackend", "TrialFailed",
           "TrialStopped", "or_list"]


class FailureKind(str, Enum):
    none = "none"
    oom = "oom"
    timeout = "timeout"
    crash = "crash"
    implausible = "implausible"
    """The run ended, but its numbers cannot be right (:func:`tuner.study.records.implausible`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """What a backend reports for one layout; ``source``: ``"predicted"`` or ``"measured"``."""

    layout: Layout
    source: str
    tokens_per_s_per_gpu: float
    peak_bytes: float  # peak memory per GPU (bytes): predicted, or the max over ranks of reserved memory
    step_times_s: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    grad_norms: tuple[float, ...] = ()
    failure: FailureKind = FailureKind.none
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class TrialFailed(Exception):
    """A trial ended without a measurement; ``memory_reached_bytes`` for ``oom`` (NaN if unknown), ``wall_s`` None
    when the caller's clock tells."""

    def __init__(self, kind: FailureKind, message: str, log_path: str = "", *,
                 memory_reached_bytes: float = float("nan"), wall_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.log_path = log_path
        self.memory_reached_bytes = memory_reached_bytes
        self.wall_s = wall_s


class TrialStopped(Exception):
    """A trial stopped by its reporter (pruned), with the steps measured before (seconds, tokens/s/GPU)."""

    def __init__(self, reason: str, *, step_times_s: Sequence[float] = (), tokens_per_s_per_gpu: Sequence[float] = (),
                 log_path: str = "", wall_s: float | None = None) -> None:
        super().__init__(reason)
        self.wall_s = wall_s
        self.reason = reason
        self.step_times_s = tuple(step_times_s)
        self.tokens_per_s_per_gpu = tuple(tokens_per_s_per_gpu)
        self.log_path = log_path


#: Called by a backend after each measured step with the throughput of every step so
#: far (tokens/s/GPU, warm-up included); returns a reason to stop the trial, or None.
StepReporter = Callable[[Sequence[float]], "str | None"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendSettings:
    """Everything a study hands to the backend it opens; each backend reads the fields it needs
    (:meth:`TrialBackend.from_settings`). Units: seconds, GPUs, bytes."""

    calibration: Any = None
    """:class:`cost_model.calibration.Calibration` of the ``model`` backend (None: the shipped one)."""
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # fraction of HBM kept free (``model`` backend)
    options: Any = None
    """:class:`specs.RunOptions` the ``model`` backend prices a layout with: the study's stack preset and run flags
    (None: the defaults)."""
    trials_dir: Path = Path("results/trials")  # where each trial's folder goes (``results/<study>/trials``)
    num_gpus: int | None = None  # GPUs a ``local`` trial uses (None: this machine's)
    gpus_per_node: int = 8  # GPUs per node of the cluster (``ray``)
    steps: int = 20  # training steps per real trial, warm-up included
    warmup_steps: int = 10  # leading steps left out of a real trial's median
    timeout_s: float = 900.0  # wall-clock limit of one real trial (seconds)
    command_template: str | Path | None = None  # ``--command-template FILE`` (``command``)
    megatron_core: str | None = None
    """``--megatron-core`` release the commands are written for (``command``'s ``{model_args}``; None: the newest)."""
    address: str | None = None  # ``--ray-address`` (``ray``; None: a local Ray instance)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """``--trial-env`` variables of every trial process (``ray``)."""
    profile_step: int | None = None
    """Step of every real trial to profile with ``torch.profiler`` (``local``: the harness's ``profile_step``); None:
    none."""


class TrialBackend(abc.ABC):
    """Runs one layout and reports a :class:`Measurement`; every hook has a default (backends in
    :mod:`launch.registry`)."""

    name: ClassVar[str] = "base"
    source: ClassVar[str] = "predicted"  # ``"predicted"`` (nothing runs) or ``"measured"`` (real trials on GPUs)
    runs_harness: ClassVar[bool] = False
    """Its trials run the megatron-core trial harness (``launch/harness``): their estimate assumes the
    harness's run options, with or without Transformer Engine (:func:`tuner.study.run_options_for_backend`)."""
    own_flags: ClassVar[frozenset[str]] = frozenset()
    """The ``tune`` flags that only this backend reads (e.g. ``--ray-address``); refused with any other backend."""
    parallel_trials: ClassVar[bool] = False
    """Runs ``--parallel-trials`` trials at once (one worker thread each)."""
    opened_by_study: ClassVar[bool] = False
    """Opened (and probed) once, by the study, not before the search as the others are (Ray connects once)."""

    @classmethod
    def check_machine(cls, cluster: Cluster) -> None:
        """Before any output or trial: raises TunerError if this machine cannot run the study's trials on
        ``cluster`` (default: nothing to check)."""
        return None

    @property
    def measured(self) -> bool:
        """True for backends whose trials run on GPUs."""
        return self.source == "measured"

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> TrialBackend:
        """The backend opened for a study.

        Raises:
            TunerError: the settings do not work for this backend.
        """
        return cls()

    @abc.abstractmethod
    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload,
            reporter: StepReporter | None = None, trial_number: int | None = None) -> Measurement:
        """Evaluate ``layout``; ``reporter`` may stop a real trial after a step, ``trial_number`` names its folder.

        Raises:
            TrialFailed: the trial ran out of memory, timed out or crashed.
            TrialStopped: the reporter stopped the trial.
            InfeasibleLayout: the backend cannot run this layout here (before any GPU work).
        """

    def cluster_gpus(self) -> float | None:
        """GPUs this backend can reach (a Ray cluster's), or None when it does not limit the study (default)."""
        return None

    def refusal(self, layout: Layout, model: ModelSpec, workload: Workload) -> str | None:
        """Why this backend cannot run ``layout`` here, before any GPU work; None if it can (default)."""
        return None

    def cancel(self) -> None:  # noqa: B027 - optional hook
        """Stop every running trial now (Ctrl-C with trials in threads; default: nothing to stop)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (default: nothing)."""


def or_list(names: list[str]) -> str:
    """``a``, ``a or b`` or ``a, b or c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
