"""Fitting the named calibration constants to measured runs (``tune calibrate``).

Least squares on ``r_i = w_i log(predicted_i / published_i)`` of each run's published number (tokens/s/GPU, else model
TFLOP/s/GPU) with ``scipy.optimize.least_squares`` (trust-region reflective, bounds below, ``soft_l1`` loss with
``f_scale`` 0.25 so that a few badly missed rows do not drag every constant). Only the constants of :data:`FIT_BOUNDS`
the data can move are fitted (a 10% change moves some prediction by more than 0.1%); none is per row or per model. The
published tables give no memory, so memory constants are not fitted from them.

Real trials (``tune calibrate --study``) measure both: :func:`fit_observations` fits the step-time constants
(:data:`TRIAL_FIT_BOUNDS`, :data:`TRIAL_STEP_NAMES`), then those of :data:`MEMORY_FIT_BOUNDS` to the measured peaks;
such a fit describes the trials' software stack. :func:`kfold_by_model` fits on the other models' runs and predicts each
model's."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.calibration import BASE_CALIBRATION, Calibration
from cost_model.validate import Run, RunBatch, measure_release_gain
from specs import HARNESS_RUN_OPTIONS
from specs.errors import TunerError

#: Constants fitted, with their bounds (same units as :class:`Calibration`).
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.3, 0.95), "grouped_gemm_efficiency": (0.15, 0.95), "attention_efficiency": (0.15, 0.95),
    "gemm_family_factor_ampere": (0.5, 1.5), "gemm_family_factor_blackwell": (0.5, 1.5),
    "gemm_generation_factor_blackwell_ultra": (0.5, 1.5), "fp8_gemm_efficiency_ratio": (0.3, 1.3),
    "fp8_blockwise_gemm_efficiency_ratio": (0.3, 1.3), "mxfp8_gemm_efficiency_ratio": (0.3, 1.3),
    "nvfp4_gemm_efficiency_ratio": (0.15, 1.3), "nvlink_efficiency": (0.2, 0.95), "network_efficiency": (0.2, 0.95),
    "dp_overlap": (0.0, 1.0), "tp_comm_overlap_fraction": (0.0, 1.0), "moe_layer_overhead_s": (0.0, 3e-3),
    "expert_gemm_overhead_s": (0.0, 1e-4), "cuda_graph_overhead_factor": (0.05, 1.0),
    "cuda_graph_partial_overhead_factor": (0.05, 1.0), "moe_load_imbalance": (1.0, 2.0)}

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


def _active(batch: RunBatch, start: Calibration, names: Sequence[str],
            bounds: Mapping[str, tuple[float, float]] = FIT_BOUNDS,
            *, probe_range: bool = False) -> list[str]:
    """Constants that move some prediction by more than 0.1% when changed by 10% (or 0.1 if 0).

    With ``probe_range`` the change is to 10% or 90% of the bound range (whichever is farther), so that a constant an
    earlier fit left at a bound (e.g. ``grouped_gemm_half_rows`` at 8) or at ~0 still counts as movable."""
    base = batch.predicted_metric(start)
    out = []
    for n in names:
        lo, hi = bounds[n]
        v = getattr(start, n)
        if probe_range:
            nv = lo + 0.9 * (hi - lo) if v - lo < 0.5 * (hi - lo) else lo + 0.1 * (hi - lo)
        else:
            step = 0.1 * v if v else 0.1 * (hi - lo)
            nv = min(max(v + step, lo), hi) if v + step <= hi else max(v - step, lo)
        try:
            p = batch.predicted_metric(start.replace(**{n: nv}))
        except TunerError:
            continue
        if np.nanmax(np.abs(p / base - 1)) > 1e-3:
            out.append(n)
    return out


def fit_calibration(runs: Sequence[Run], *, start: Calibration = BASE_CALIBRATION, names: Sequence[str] | None = None,
                    max_nfev: int = 60, progress: Callable[[str], None] | None = None,
                    bounds: Mapping[str, tuple[float, float]] | None = None, probe_range: bool = False,
                    release_gain: float | None = None) -> FitResult:
    """Fit the constants of :data:`FIT_BOUNDS` (or ``bounds``: :data:`TRIAL_FIT_BOUNDS` for real trials on other stacks)
    to the representable ``runs``; ``start`` gives the starting values and those of constants not fitted, ``names``
    limits the constants considered. ``probe_range`` decides which constants the data can move by probing across their
    bounds rather than by a 10% change (:func:`_active`); ``release_gain`` is the gain per month of container releases
    applied to the predictions (default :data:`cost_model.validate.RELEASE_GAIN_PER_MONTH`). ``progress`` gets one line
    per stage.

    Raises TunerError: fewer than 2 representable runs with a published number."""
    from scipy.optimize import least_squares

    batch = RunBatch(runs, release_gain=release_gain)
    if len(batch.runs) < 2:
        raise TunerError(f"calibration needs at least 2 representable measured runs, got {len(batch.runs)}")
    y = np.log(batch.targets())
    w = _weights(batch.runs)
    bounds = FIT_BOUNDS if bounds is None else bounds
    cand = list(names or bounds)
    act = _active(batch, start, cand, bounds, probe_range=probe_range)
    gens = {r.cluster.gpu.generation for r in batch.runs if r.cluster is not None
            and r.cluster.gpu.family == "blackwell"}
    if "gemm_generation_factor_blackwell_ultra" in act and "" not in gens:
        # only Blackwell Ultra rows: its factor and Blackwell's multiply the same peaks and cannot be told apart
        act.remove("gemm_generation_factor_blackwell_ultra")
        if progress:
            progress("gemm_generation_factor_blackwell_ultra not fitted: no B200 / GB200 row to tell it from "
                     "gemm_family_factor_blackwell")
    if not act:
        raise TunerError("no calibration constant changes the predictions of these runs")
    if progress:
        progress(f"fitting {len(act)} constants to {len(batch.runs)} runs: {', '.join(act)}")
    lo = np.array([bounds[n][0] for n in act])
    hi = np.array([bounds[n][1] for n in act])
    scale = np.maximum(np.abs(hi - lo), 1e-12)
    x0 = np.clip(np.array([getattr(start, n) for n in act], dtype=float), lo, hi)
    # Optimise in [0, 1]-scaled coordinates so that seconds and fractions have similar steps.
    u0 = (x0 - lo) / scale

    def cal_of(u: np.ndarray) -> Calibration:
        x = lo + np.clip(u, 0.0, 1.0) * scale
        return start.replace(**{n: float(v) for n, v in zip(act, x)})

    def resid(u: np.ndarray) -> np.ndarray:
        p = batch.predicted_metric(cal_of(u))
        r: np.ndarray = w * (np.log(np.maximum(p, 1e-9)) - y)
        return r

    sol = least_squares(resid, u0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=_F_SCALE, max_nfev=max_nfev,
                        diff_step=1e-3, x_scale=1.0)
    cal = cal_of(sol.x)
    err = np.abs(batch.predicted_metric(cal) / batch.targets() - 1)
    return FitResult(calibration=cal, fitted=tuple(act), rows=len(batch.runs), median_abs_error=float(np.median(err)),
                     cost=float(sol.cost), nfev=int(sol.nfev))


def kfold_by_model(runs: Sequence[Run], *, start: Calibration = BASE_CALIBRATION, max_nfev: int = 60,
                   progress: Callable[[str], None] | None = None, processes: int = 1,
                   models: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Out-of-model error: for each model, fit on the other models' runs and predict this one's.

    ``models`` limits the folds to those models (each still fitted on every other model's runs); None: every model.
    Returns ``{model: {"runs", "predicted", "published", "fit": FitResult, "release_gain"}}`` (``predicted`` in the
    run's metric: tokens/s/GPU, else model TFLOP/s/GPU)."""
    usable = [r for r in runs if not r.unrepresentable and r.layout is not None]
    got = {r.model.name for r in usable}  # type: ignore[union-attr]
    names = sorted(n for n in got if models is None or n in models)
    jobs = [(m, [r for r in usable if r.model.name != m],  # type: ignore[union-attr]
             [r for r in usable if r.model.name == m]) for m in names]  # type: ignore[union-attr]
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
    # the release gain too is measured on the training folds' repeats only, so no number comes from the held-out model
    gain = measure_release_gain(train)["gain_per_month"]
    fit = fit_calibration(train, start=start, max_nfev=max_nfev, release_gain=gain)
    b = RunBatch(test, release_gain=gain)
    return {"runs": b.runs, "predicted": b.predicted_metric(fit.calibration), "published": b.targets(), "fit": fit,
            "release_gain": gain}


#: Bounds for fits to real trials: :data:`FIT_BOUNDS` plus NCCL all-to-all's NVLink efficiency, with the fixed per-call
#: costs allowed to be much larger (a stack without Transformer Engine loops over local experts in Python, and pays
#: launch latency for every unfused kernel) and the rows-per-expert constant free.
TRIAL_FIT_BOUNDS: dict[str, tuple[float, float]] = {
    **FIT_BOUNDS,
    # not fitted to the published runs (set from their dispatcher pairs, Calibration.alltoall_nvlink_efficiency);
    # a user's own trials on one NVLink domain measure it
    "alltoall_nvlink_efficiency": (0.1, 0.95),
    "grouped_gemm_half_rows": (8.0, 16384.0),
    "moe_layer_overhead_s": (0.0, 2e-2),
    "expert_gemm_overhead_s": (0.0, 2e-3),
    "moe_host_sync_latency_s": (0.0, 2e-2),
}

#: Step-time constants fitted to real trials by default: the compute efficiencies, the fixed costs per MoE layer and per
#: local expert GEMM, and the NVLink efficiencies (rings and all-to-all). Not fitted by default: ``moe_load_imbalance``,
#: the elementwise byte counts and the precision / GPU-family ratios, which a handful of layouts on one GPU type cannot
#: separate from the constants above.
TRIAL_STEP_NAMES: tuple[str, ...] = (
    "gemm_efficiency", "grouped_gemm_efficiency", "attention_efficiency", "nvlink_efficiency",
    "alltoall_nvlink_efficiency", "expert_gemm_overhead_s", "moe_layer_overhead_s")

_GIB = float(2**30)

#: Memory constants fitted to a measured peak, with bounds. Against the allocator's *reserved*
#: peak they absorb its caching and fragmentation on top of what tensors hold.
MEMORY_FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "allocator_overhead_fraction": (0.0, 1.0), "cuda_context_bytes": (0.0, 32 * _GIB),
    "nccl_bytes_per_communicator": (0.0, 4 * _GIB)}


@dataclass(frozen=True)
class Observation:
    """One measured training run: what ran and what was measured (either measurement may be None)."""

    model: Any
    """:class:`specs.ModelSpec` (a ``--layers`` slice where the trial ran one)."""
    cluster: Any
    workload: Any
    layout: Any
    step_time_s: float | None = None
    """Median step time after warm-up (s)."""
    peak_gib: float | None = None
    """Peak memory per GPU (GiB), max over ranks: reserved or allocated, as the caller chooses."""
    options: Any = None
    """:class:`specs.RunOptions` (None: :data:`specs.HARNESS_RUN_OPTIONS`, the
    trial harness's stack without Transformer Engine, which these observations come from)."""
    label: str = ""

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        if not self.step_time_s:
            return None
        w = self.workload
        tps: float = w.global_batch_size * w.seq_length / self.step_time_s / self.cluster.num_gpus
        return tps


@dataclass(frozen=True)
class ObservationFit:
    """:func:`fit_observations`' result: the calibration, and what was fitted to what."""

    calibration: Calibration
    step: FitResult | None
    """The step-time fit (None when no observation has a step time, or it was not asked for)."""
    memory_fitted: tuple[str, ...]
    memory_rows: int
    memory_median_abs_error: float
    """Median |predicted / measured peak - 1| over the fitted rows (nan without a memory fit)."""

    @property
    def fitted(self) -> tuple[str, ...]:
        return (self.step.fitted if self.step else ()) + self.memory_fitted


def _runs_of(obs: Sequence[Observation], *, need: str) -> list[Run]:

    runs = []
    for i, o in enumerate(obs):
        if need == "step" and not o.step_time_s:
            continue
        if need == "peak" and not o.peak_gib:
            continue
        runs.append(Run(
            row=i, run_id=o.label or f"observation {i}", model_name=o.model.name, gpu_type=o.cluster.gpu.name,
            precision=str(getattr(o.workload.precision, "value", o.workload.precision)), num_gpus=o.cluster.num_gpus,
            published_tokens=o.tokens_per_s_per_gpu if need == "step" else 1.0, published_tflops=None,
            implied_gflop_per_token=None, seq_length=o.workload.seq_length, framework_version="measured trial",
            model=o.model, cluster=o.cluster, workload=o.workload, layout=o.layout,
            options=o.options if o.options is not None else HARNESS_RUN_OPTIONS, is_moe=o.model.is_moe))
    return runs


def predict_observations(obs: Sequence[Observation], calibration: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(predicted step time s, predicted peak GiB) per observation, in order."""
    runs = _runs_of(obs, need="")
    tok, _, _, peak = RunBatch(runs).predict(calibration)
    step = np.array([o.workload.global_batch_size * o.workload.seq_length / o.cluster.num_gpus for o in obs]) / tok
    return step, peak


def _fit_memory(runs: Sequence[Run], measured: np.ndarray, start: Calibration, names: Sequence[str],
                max_nfev: int) -> tuple[Calibration, tuple[str, ...], float]:
    from scipy.optimize import least_squares

    batch = RunBatch(runs)

    def peak(cal: Calibration) -> np.ndarray:
        return batch.predict(cal)[3]

    base = peak(start)
    act = []
    for n in names:
        n_lo, n_hi = MEMORY_FIT_BOUNDS[n]
        v = getattr(start, n)
        nv = n_lo + 0.9 * (n_hi - n_lo) if v - n_lo < 0.5 * (n_hi - n_lo) else n_lo + 0.1 * (n_hi - n_lo)
        if np.nanmax(np.abs(peak(start.replace(**{n: nv})) / base - 1)) > 1e-3:
            act.append(n)
    if not act:
        return start, (), float(np.median(np.abs(base / measured - 1)))
    lo = np.array([MEMORY_FIT_BOUNDS[n][0] for n in act])
    hi = np.array([MEMORY_FIT_BOUNDS[n][1] for n in act])
    scale = hi - lo
    u0 = (np.clip([getattr(start, n) for n in act], lo, hi) - lo) / scale

    def cal_of(u: np.ndarray) -> Calibration:
        return start.replace(**{n: float(v) for n, v in zip(act, lo + np.clip(u, 0.0, 1.0) * scale)})

    def resid(u: np.ndarray) -> np.ndarray:
        r: np.ndarray = np.log(np.maximum(peak(cal_of(u)), 1e-9)) - np.log(measured)
        return r

    sol = least_squares(resid, u0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=_F_SCALE, max_nfev=max_nfev,
                        diff_step=1e-3)
    cal = cal_of(sol.x)
    return cal, tuple(act), float(np.median(np.abs(peak(cal) / measured - 1)))


def fit_observations(obs: Sequence[Observation], *, start: Calibration = BASE_CALIBRATION,
                     step_names: Sequence[str] | None = TRIAL_STEP_NAMES,
                     memory_names: Sequence[str] | None = tuple(MEMORY_FIT_BOUNDS),
                     bounds: Mapping[str, tuple[float, float]] = TRIAL_FIT_BOUNDS, max_nfev: int = 200,
                     progress: Callable[[str], None] | None = None) -> ObservationFit:
    """Fit step-time constants (``step_names``, within ``bounds``) to the observations' step times, then memory
    constants (``memory_names`` of :data:`MEMORY_FIT_BOUNDS`) to their peaks; None or empty skips a fit. Observations
    without a step time (peak) are left out of that fit. The step fit is :func:`fit_calibration` on the observations as
    runs, probing over the bound range; the two sets of constants do not interact.

    Raises TunerError: fewer than 2 observations for a fit that was asked for, or nothing to fit."""
    cal = start
    step_fit = None
    if step_names:
        runs = _runs_of(obs, need="step")
        step_fit = fit_calibration(runs, start=start, names=step_names, max_nfev=max_nfev, progress=progress,
                                   bounds=bounds, probe_range=True)
        cal = step_fit.calibration
    mem_fitted: tuple[str, ...] = ()
    mem_err = float("nan")
    mem_rows = 0
    if memory_names:
        unknown = sorted(set(memory_names) - set(MEMORY_FIT_BOUNDS))
        if unknown:
            raise TunerError(f"memory constants {unknown} cannot be fitted; accepted: {sorted(MEMORY_FIT_BOUNDS)}")
        with_peak = [o for o in obs if o.peak_gib]
        if len(with_peak) < 2:
            raise TunerError(f"a memory fit needs at least 2 observations with a measured peak, got {len(with_peak)}")
        if progress:
            progress(f"fitting memory constants to the peaks of {len(with_peak)} runs: {', '.join(memory_names)}")
        cal, mem_fitted, mem_err = _fit_memory(_runs_of(with_peak, need="peak"),
                                               np.array([o.peak_gib for o in with_peak], dtype=float), cal,
                                               memory_names, max_nfev)
        mem_rows = len(with_peak)
    if step_fit is None and not memory_names:
        raise TunerError("nothing to fit: give step_names or memory_names")
    return ObservationFit(calibration=cal, step=step_fit, memory_fitted=mem_fitted, memory_rows=mem_rows,
                          memory_median_abs_error=mem_err)
