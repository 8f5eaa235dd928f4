"""Validation of the cost model against measured runs (``tune validate``): predictions of the runs of a run table
(:mod:`cost_model.run_table`), their errors and rank correlation, and the release trend: a run of a NeMo container
release before :data:`REFERENCE_RELEASE` (26.08) is predicted slower by
:data:`RELEASE_GAIN_PER_MONTH` a month of releases (:func:`release_factor`), the gain the same configurations
published in two releases show (:func:`measure_release_gain`)."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.estimate import estimate_table
from cost_model.run_table import RELEASE_REGRESSION_RATIO as RELEASE_REGRESSION_RATIO
from cost_model.run_table import Run as Run
from cost_model.run_table import _comparable
from cost_model.run_table import read_runs as read_runs
from specs.layout import LayoutTable

#: The NeMo container release the published-run predictions are made for: the newest in
#: ``benchmarks/data/published_runs.csv`` (26.08, Megatron-Bridge v0.6.0). A user's own estimate has no release and is
#: at this one.
REFERENCE_RELEASE = (26, 8)

#: Throughput a NeMo container release gains per month of releases, the same configuration run again
#: (:func:`measure_release_gain`: 30 configurations of the published runs published in two releases 2-7 months apart,
#: geometric mean 1.45% a month, oldest against newest; median pair 1.044x). Measured on the repeats alone, not
#: fitted to the model's errors. A published run of a release ``m`` months before :data:`REFERENCE_RELEASE` is
#: predicted ``(1 + gain) ** -m`` as fast (:func:`release_factor`).
RELEASE_GAIN_PER_MONTH = 0.0145


def container_release(framework_version: str) -> tuple[int, int] | None:
    """``(yy, mm)`` of the NeMo container a run's ``framework_version`` names (``"... container 26.02.01"`` ->
    ``(26, 2)``, any case); None when it names none (a verification card, Megatron-LM, the project's own measurements)
    or a month outside 01-12."""
    m = re.search(r"container (\d\d)\.(\d\d)(?!\d)", framework_version, re.IGNORECASE)
    return (int(m.group(1)), int(m.group(2))) if m and 1 <= int(m.group(2)) <= 12 else None


#: The oldest container release of the published tables (25.09): the trend is measured between it and
#: :data:`REFERENCE_RELEASE`, so an older release is priced as this one (no extrapolation).
OLDEST_MEASURED_RELEASE = (25, 9)


def months_before_reference(framework_version: str) -> int:
    """Months from a run's container release to :data:`REFERENCE_RELEASE` (0 when none is named or it is newer; at
    most the months from :data:`OLDEST_MEASURED_RELEASE`, the span the trend was measured over)."""
    rel = container_release(framework_version)
    if rel is None:
        return 0
    span = (REFERENCE_RELEASE[0] - OLDEST_MEASURED_RELEASE[0]) * 12 + REFERENCE_RELEASE[1] - OLDEST_MEASURED_RELEASE[1]
    return min(span, max(0, (REFERENCE_RELEASE[0] - rel[0]) * 12 + REFERENCE_RELEASE[1] - rel[1]))


def release_factor(framework_version: str, gain_per_month: float = RELEASE_GAIN_PER_MONTH) -> float:
    """Throughput of a run on its release relative to :data:`REFERENCE_RELEASE`: ``(1 + gain) ** -months``
    (1.0 for a run with no container release). Applied to published-run predictions only (:class:`RunBatch`)."""
    return float((1.0 + gain_per_month) ** -months_before_reference(framework_version))


def measure_release_gain(runs: Sequence[Run]) -> dict[str, Any]:
    """The throughput gain per month of releases, from configurations published in two or more releases.

    For each configuration (:func:`_configuration_key`; representable runs, release regressions already left out)
    with runs in releases of different months, the oldest and the newest run:
    ``gain = exp(sum(log(newest / oldest)) / sum(months apart)) - 1``.

    Returns: ``{"gain_per_month", "pairs", "median_ratio", "months"}`` (``pairs``: list of ``(oldest_id, newest_id,
    months, ratio)``); gain 0.0 when no pair exists."""
    pairs = []
    for group in _comparable(runs).values():
        dated = [(container_release(r.framework_version), r) for r in group]
        dated = [(d, r) for d, r in dated if d is not None]
        if len(dated) < 2:
            continue
        dated.sort(key=lambda x: x[0])  # type: ignore[arg-type, return-value]
        (d0, a), (d1, b) = dated[0], dated[-1]
        months = (d1[0] - d0[0]) * 12 + d1[1] - d0[1]  # type: ignore[index]
        if months > 0:
            pairs.append((a.run_id, b.run_id, months, b.published / a.published))
    total = sum(p[2] for p in pairs)
    gain = math.exp(sum(math.log(p[3]) for p in pairs) / total) - 1.0 if total else 0.0
    return {"gain_per_month": gain, "pairs": pairs,
            "median_ratio": statistics.median(p[3] for p in pairs) if pairs else 1.0,
            "months": sorted({p[2] for p in pairs})}


@dataclass(frozen=True, slots=True)
class Prediction:
    """A run and what the model predicts for it."""

    run: Run
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    fits: bool
    peak_gib: float

    @property
    def published(self) -> float:
        return float(self.run.published or float("nan"))

    @property
    def predicted(self) -> float:
        return self.tokens_per_s_per_gpu if self.run.metric == "tokens" else self.model_tflops_per_gpu

    @property
    def error(self) -> float:
        """predicted / published - 1."""
        return self.predicted / self.published - 1.0


def _group_key(run: Run) -> tuple[Any, ...]:
    w, c = run.workload, run.cluster
    return (run.model.name, run.model.mtp_num_layers, c.gpu.name, c.num_gpus, c.gpus_per_node,  # type: ignore[union-attr]
            w.seq_length, w.global_batch_size, w.precision, run.options)  # type: ignore[union-attr]


class RunBatch:
    """Representable runs grouped so that each (model, cluster, workload, options) is one
    vectorised :func:`~cost_model.estimate.estimate_table` call (used by the fit, which
    predicts the same rows hundreds of times)."""

    def __init__(self, runs: Iterable[Run], *, release_gain: float | None = None) -> None:
        """``release_gain``: per month of container releases (default :data:`RELEASE_GAIN_PER_MONTH`)."""

        self.runs = [r for r in runs if not r.unrepresentable and r.layout is not None]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, r in enumerate(self.runs):
            groups.setdefault(_group_key(r), []).append(i)
        self.groups = [(idx, LayoutTable.from_layouts([self.runs[i].layout for i in idx])) for idx in groups.values()]
        gain = RELEASE_GAIN_PER_MONTH if release_gain is None else release_gain
        self.release_factor = np.array([release_factor(r.framework_version, gain) for r in self.runs])
        """Per run, :func:`release_factor` of its container release (multiplies its predicted throughput)."""

    def predict(self, calibration: Calibration) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens/s/GPU, model TFLOP/s/GPU, fits, peak GiB) per run, in ``self.runs`` order; throughput times each
        run's :attr:`release_factor` (the software of its container release, :data:`RELEASE_GAIN_PER_MONTH`)."""

        n = len(self.runs)
        tok, tfl, fits, peak = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n)
        for idx, table in self.groups:
            r = self.runs[idx[0]]
            e = estimate_table(r.model, r.cluster, r.workload, table,  # type: ignore[arg-type]
                               calibration=calibration, memory_headroom=0.0, options=r.options)
            tok[idx], tfl[idx], fits[idx], peak[idx] = (e.tokens_per_s_per_gpu, e.model_tflops_per_gpu, e.fits,
                                                        e.peak_bytes / 2**30)
        return tok * self.release_factor, tfl * self.release_factor, fits, peak

    def targets(self) -> np.ndarray:
        """The published number each run is compared with (tokens/s/GPU, else TFLOP/s/GPU)."""
        return np.array([r.published or float("nan") for r in self.runs])

    def predicted_metric(self, calibration: Calibration) -> np.ndarray:
        tok, tfl, _, _ = self.predict(calibration)
        is_tok = np.array([r.metric == "tokens" for r in self.runs])
        return np.where(is_tok, tok, tfl)


def predict_runs(runs: Sequence[Run], calibration: Calibration = DEFAULT_CALIBRATION) -> list[Prediction]:
    """Predictions for the representable runs (others are left to the caller to list with their reason)."""
    batch = RunBatch(runs)
    tok, tfl, fits, peak = batch.predict(calibration)
    return [Prediction(r, float(tok[i]), float(tfl[i]), bool(fits[i]), float(peak[i]))
            for i, r in enumerate(batch.runs)]


def _ranks(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):  # average ranks of ties
        m = a == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 3 points or a constant side."""
    if len(a) < 3:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _layout_groups(preds: Sequence[Prediction]) -> tuple[list[float], list[float]]:
    """Rows that differ in layout (options included): the median of repeated layouts, else each row."""
    by: dict[str, list[Prediction]] = {}
    for p in preds:
        by.setdefault(p.run.layout_key + f"|{p.run.num_gpus}|{p.run.workload}", []).append(p)
    pub = [statistics.median(q.published for q in v) for v in by.values()]
    pred = [statistics.median(q.predicted for q in v) for v in by.values()]
    return pred, pub


def summarize(preds: Sequence[Prediction], key: Any = None) -> list[dict[str, Any]]:
    """Per group (default: GPU type and precision), one dict: ``group``, ``rows``, ``median_abs_error``, ``mape``,
    ``spearman`` (model -> rho, within each model's rows that differ in layout, models with >= 3 such rows) and
    ``spearman_median``."""
    key = key or (lambda p: (p.run.gpu_type, p.run.precision))
    groups: dict[Any, list[Prediction]] = {}
    for p in preds:
        groups.setdefault(key(p), []).append(p)
    out = []
    for g in sorted(groups, key=str):
        ps = groups[g]
        errs = np.abs([p.error for p in ps])
        rhos: dict[str, float] = {}
        by_model: dict[str, list[Prediction]] = {}
        for p in ps:
            by_model.setdefault(p.run.model_name if p.run.model is None else p.run.model.name, []).append(p)
        for m, mp in sorted(by_model.items()):
            pred, pub = _layout_groups(mp)
            rho = spearman(pred, pub)
            if not math.isnan(rho):
                rhos[m] = rho
        out.append({
            "group": g, "rows": len(ps), "median_abs_error": float(np.median(errs)), "mape": float(np.mean(errs)),
            "spearman": rhos, "spearman_median": float(np.median(list(rhos.values()))) if rhos else float("nan")})
    return out
