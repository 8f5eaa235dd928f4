"""The ``model`` backend: the analytical estimate stands in for a trial."""

from __future__ import annotations

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.estimate import estimate
from launch.base import BackendSettings, Measurement, StepReporter, TrialBackend
from specs import DEFAULT_RUN_OPTIONS, Cluster, ModelSpec, RunOptions, Workload
from specs.layout import Layout
from specs.units import DEFAULT_MEMORY_HEADROOM

__all__ = ["ModelBackend"]


class ModelBackend(TrialBackend):
    """Evaluates a layout with :func:`cost_model.estimate.estimate` (``source == "predicted"``)."""

    name = "model"
    source = "predicted"

    def __init__(self, *, calibration: Calibration = DEFAULT_CALIBRATION,
                 memory_headroom: float = DEFAULT_MEMORY_HEADROOM, options: RunOptions = DEFAULT_RUN_OPTIONS) -> None:
        self.calibration = calibration
        self.memory_headroom = memory_headroom
        self.options = options

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> ModelBackend:
        """Uses ``calibration`` (None: the shipped one), ``memory_headroom`` and ``options`` (None: the defaults)."""
        cal = settings.calibration if settings.calibration is not None else DEFAULT_CALIBRATION
        opts = settings.options if settings.options is not None else DEFAULT_RUN_OPTIONS
        return cls(calibration=cal, memory_headroom=settings.memory_headroom, options=opts)

    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload,
            reporter: StepReporter | None = None, trial_number: int | None = None) -> Measurement:
        """The estimate of ``layout`` (``reporter`` and ``trial_number`` are ignored: nothing runs)."""
        e = estimate(model, cluster, workload, layout, calibration=self.calibration,
                     memory_headroom=self.memory_headroom, options=self.options)
        return Measurement(layout=layout, source=self.source, tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
                           peak_bytes=e.peak_bytes, step_times_s=(e.step_time_s,), extra={"estimate": e})
