"""Fitting the named calibration constants to measured runs (``tune calibrate``).

Least squares on the log error of each run's published number (tokens/s/GPU, else model
TFLOP/s/GPU): ``r_i = w_i * log(predicted_i / published_i)``, minimised with
``scipy.optimize.least_squares`` (trust-region reflective, bounds below, scipy's
``soft_l1`` robust loss with ``f_scale`` 0.25 so that a few rows the model misses by a
factor do not drag every constant). Only the constants of :data:`FIT_BOUNDS` are fitted,
and of those only the ones the data can move (a 10% change changes some prediction by
more than 0.1%): with no A100 rows, ``gemm_family_factor_ampere`` keeps its value. There
are no per-row or per-model constants.

Memory constants (``allocator_overhead_fraction``, ``cuda_context_bytes``, ...) are not
fitted: the published tables give no memory measurements.

:func:`kfold_by_model` reports out-of-model error: for each model, fit on the runs of
the other models and predict this one's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from cost_model.calibration import BASE_CALIBRATION, Calibration
from cost_model.errors import TunerError
from cost_model.validate import Run, RunBatch

__all__ = ["FIT_BOUNDS", "FitResult", "fit_calibration", "kfold_by_model", "SEED_WEIGHT"]

#: Constants fitted, with their bounds (same units as :class:`Calibration`).
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.3, 0.95),
    "grouped_gemm_efficiency": (0.15, 0.95),
    "grouped_gemm_half_rows": (8.0, 4096.0),
    "attention_efficiency": (0.15, 0.95),
    "gemm_family_factor_ampere": (0.5, 1.5),
    "gemm_family_factor_blackwell": (0.5, 1.5),
    "fp8_gemm_efficiency_ratio": (0.3, 1.3),
    "fp8_blockwise_gemm_efficiency_ratio": (0.3, 1.3),
    "mxfp8_gemm_efficiency_ratio": (0.3, 1.3),
    "nvfp4_gemm_efficiency_ratio": (0.15, 1.3),
    "nvlink_efficiency": (0.2, 0.95),
    "alltoall_nvlink_efficiency": (0.1, 0.95),
    "network_efficiency": (0.2, 0.95),
    "dp_overlap": (0.0, 1.0),
    "tp_comm_overlap_fraction": (0.0, 1.0),
    "ep_a2a_overlap": (0.0, 1.0),
    "moe_layer_overhead_s": (0.0, 3e-3),
    "expert_gemm_overhead_s": (0.0, 1e-4),
    "cuda_graph_overhead_factor": (0.05, 1.0),
    "moe_load_imbalance": (1.0, 2.0),
}

#: Weight of a run whose ``framework_version`` says it is one of the project's own measured
#: runs (the seed, natural routing on H200): the only rows that inform ``moe_load_imbalance``.
SEED_WEIGHT = 3.0

_F_SCALE = 0.25


@dataclass(frozen=True)
class FitResult:
    """A fitted calibration and how well it fits."""

    calibration: Calibration
    fitted: tuple[str, ...]
    """Names of the constants that were fitted (the others keep the start values)."""
    rows: int
    median_abs_error: float
    """Median of |predicted / published - 1| over the fitted rows."""
    cost: float
    nfev: int


def _weights(runs: Sequence[Run]) -> np.ndarray:
    return np.array([SEED_WEIGHT if "seed" in r.framework_version.lower() else 1.0 for r in runs])


def _active(batch: RunBatch, start: Calibration, names: Sequence[str]) -> list[str]:
    """Constants that move some prediction by more than 0.1% when changed by 10% (or 0.1 if 0)."""
    base = batch.predicted_metric(start)
    out = []
    for n in names:
        lo, hi = FIT_BOUNDS[n]
        v = getattr(start, n)
        step = 0.1 * v if v else 0.1 * (hi - lo)
        nv = min(max(v + step, lo), hi) if v + step <= hi else max(v - step, lo)
        try:
            p = batch.predicted_metric(start.replace(**{n: nv}))
        except TunerError:
            continue
        if np.nanmax(np.abs(p / base - 1)) > 1e-3:
            out.append(n)
    return out


def fit_calibration(
    runs: Sequence[Run],
    *,
    start: Calibration = BASE_CALIBRATION,
    names: Sequence[str] | None = None,
    max_nfev: int = 60,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Fit the constants of :data:`FIT_BOUNDS` to ``runs`` (the representable ones).

    Args:
        runs: runs from :func:`cost_model.validate.read_runs` (or a study).
        start: starting values, also the values of constants not fitted.
        names: constants to consider (default: all of :data:`FIT_BOUNDS`).
        max_nfev: most residual evaluations of the optimiser.
        progress: called with one line of text per stage.

    Returns:
        A :class:`FitResult`.

    Raises:
        TunerError: fewer than 2 representable runs with a published number.
    """
    from scipy.optimize import least_squares

    batch = RunBatch(runs)
    if len(batch.runs) < 2:
        raise TunerError(f"calibration needs at least 2 representable measured runs, got {len(batch.runs)}")
    y = np.log(batch.targets())
    w = _weights(batch.runs)
    cand = list(names or FIT_BOUNDS)
    act = _active(batch, start, cand)
    if not act:
        raise TunerError("no calibration constant changes the predictions of these runs")
    if progress:
        progress(f"fitting {len(act)} constants to {len(batch.runs)} runs: {', '.join(act)}")
    lo = np.array([FIT_BOUNDS[n][0] for n in act])
    hi = np.array([FIT_BOUNDS[n][1] for n in act])
    scale = np.maximum(np.abs(hi - lo), 1e-12)
    x0 = np.clip(np.array([getattr(start, n) for n in act], dtype=float), lo, hi)
    # Optimise in [0, 1]-scaled coordinates so that seconds and fractions have similar steps.
    u0 = (x0 - lo) / scale

    def cal_of(u: np.ndarray) -> Calibration:
        x = lo + np.clip(u, 0.0, 1.0) * scale
        return start.replace(**{n: float(v) for n, v in zip(act, x)})

    def resid(u: np.ndarray) -> np.ndarray:
        p = batch.predicted_metric(cal_of(u))
        return w * (np.log(np.maximum(p, 1e-9)) - y)

    sol = least_squares(resid, u0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=_F_SCALE, max_nfev=max_nfev, diff_step=1e-3, x_scale=1.0)
    cal = cal_of(sol.x)
    err = np.abs(batch.predicted_metric(cal) / batch.targets() - 1)
    return FitResult(calibration=cal, fitted=tuple(act), rows=len(batch.runs), median_abs_error=float(np.median(err)), cost=float(sol.cost), nfev=int(sol.nfev))


def kfold_by_model(
    runs: Sequence[Run],
    *,
    start: Calibration = BASE_CALIBRATION,
    max_nfev: int = 60,
    progress: Callable[[str], None] | None = None,
    processes: int = 1,
) -> dict[str, dict[str, Any]]:
    """Out-of-model error: for each model, fit on the other models' runs and predict this one's.

    Returns:
        ``{model: {"runs": [...], "predicted": array, "published": array, "fit": FitResult}}``
        (``predicted`` is in the run's metric: tokens/s/GPU, else model TFLOP/s/GPU).
    """
    usable = [r for r in runs if not r.unrepresentable and r.layout is not None]
    models = sorted({r.model.name for r in usable})  # type: ignore[union-attr]
    jobs = [(m, [r for r in usable if r.model.name != m], [r for r in usable if r.model.name == m]) for m in models]  # type: ignore[union-attr]
    if processes > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(processes) as pool:
            outs = pool.starmap(_fold, [(tr, te, start, max_nfev) for _, tr, te in jobs])
    else:
        outs = []
        for m, tr, te in jobs:
            if progress:
                progress(f"fold {m}: fit on {len(tr)} runs of other models, predict {len(te)}")
            outs.append(_fold(tr, te, start, max_nfev))
    return {m: o for (m, _, _), o in zip(jobs, outs)}


def _fold(train: Sequence[Run], test: Sequence[Run], start: Calibration, max_nfev: int) -> dict[str, Any]:
    fit = fit_calibration(train, start=start, max_nfev=max_nfev)
    b = RunBatch(test)
    return {"runs": b.runs, "predicted": b.predicted_metric(fit.calibration), "published": b.targets(), "fit": fit}


def relative_errors(pred: np.ndarray, pub: np.ndarray) -> np.ndarray:
    """predicted / published - 1, elementwise."""
    return np.asarray(pred) / np.asarray(pub) - 1.0


def _finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)
