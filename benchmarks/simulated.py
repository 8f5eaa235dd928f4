"""Simulated clusters: a hidden truth for one (model, cluster, workload), and a backend that measures it.

A :class:`World` draws the truth from the analytical model's measured error structure: each part of the
estimate's step time (:data:`cost_model.estimate.TIME_PARTS`) is scaled by a per-world lognormal factor of its
group (compute, recompute, tensor/context/data-parallel and pipeline point-to-point communication, expert
all-to-all, pipeline bubble, host: optimizer step and offload), the sum by the layout's own lognormal factor, a
deterministic function of the world's seed and the layout's fields: the product of one factor per value of each
feature (:data:`FEATURES`: TP, PP, ..., and pairs such as TP x EP), shared by every layout with that value, and a
small one of the layout alone; the memory parts
(:data:`cost_model.estimate.MEMORY_PARTS`) likewise, weights and optimizer states nearly exact, activations and
the framework's overhead wider. :class:`SimulatedBackend` returns the world's measurement of a layout: run-to-run
and step-to-step noise, out of memory when the true peak exceeds the GPU's HBM, a share of crashes and hangs, and
the GPU-seconds each trial costs. It serves the search benchmark (``benchmarks/bench_search.py``) and the tests;
it is not a registered backend (:mod:`launch.registry`) and no command line offers it.

The sizes (:class:`ErrorStructure`) come from:

* step-time error against the model (:meth:`ErrorStructure.for_model`): by default the error bars' 90% throughput
  band of the job's family (``cost_model/data/error_bars.yaml``: measured / predicted over held-out published runs
  and the H200 trial rows), its width as a lognormal sigma and its centre as the model's bias; or (``kfold``) the
  median absolute error of the k-fold validation held out by model, 0.1453 for MoE (36 rows, H100/B200) and
  0.065 for dense models (100 rows)
  (``benchmarks/results/2026-12-07_kfold_validation/bench_validation.json``). The median
  error over worlds and valid layouts is set to it (:meth:`WorldTable.group_scale`);
* run-to-run spread: repeated runs of one layout on the lent H200s spread 4.4% (the 26-row TE sweep) to 8.5% (every
  TE sweep and probe file, 31 degrees of freedom) (``tune validate --trials``, docs/validation.md), taken as a
  lognormal sigma of 0.06 per run, and 0.02 per step around the run's mean;
* warm-up: a trial's step time falls by 20-40% over its first ~10 steps
  (``benchmarks/results/h200_x2_2026-11-29/step_times.jsonl``), modelled as 1.3x falling linearly to 1x over
  the warm-up steps.

The crash (2%) and hang (1%) shares and the start-up time (300 s at 64 GPUs, growing as the fourth root of
the GPU count: 600 s at 1,024) are assumptions, not measurements.

Slice trials (:meth:`SimulatedBackend.run_slice`, :func:`slice_plan`): a cheaper fidelity. The slice of a layout runs
the layers of one pipeline stage, at most :data:`SLICE_LAYERS`, with pipeline size 1 and the layout's TP, CP, EP,
ETP, micro-batch, recompute, offload, optimizer and dispatcher, on the fewest whole nodes whose GPUs hold both
``tp x cp`` and ``ep x etp`` (``lcm(tp*cp, ep*etp, gpus_per_node)``: one node of 8 unless EP x ETP or TP x CP needs
more), data-parallel only as far as those need, each step the layout's own count of micro-batches. What it sees of
the world's truth:

* seen: the time parts ``compute``, ``recompute``, ``tp_comm``, ``cp_comm``, ``ep_comm`` (its EP groups span as
  many nodes as the full layout's, so an EP across nodes sees the inter-node fabric), ``optimizer`` and
  ``offload`` (host), each with its group's per-world factor; the per-feature factors of every feature but those of
  the pipeline; the model's bias;
* not seen (:data:`SLICE_UNSEEN_PARTS`, :data:`SLICE_UNSEEN_FEATURES`): the pipeline bubble, the pipeline's
  point-to-point, the data-parallel gradient communication at full data-parallel size, the per-feature factors of
  PP, VPP, the pipeline split and PP x VPP, and the layout's own factor (what ties its error to all its fields);
* memory: its peak is not the full layout's (fewer layers; optimizer states sharded over another data-parallel
  size); only its activations per layer match the layout's. It never runs out of memory here and tells the policy
  nothing about memory.

Its step time is the seen parts of the layout's step, scaled by ``slice layers / stage layers``; its measurement the
same run-to-run and step-to-step noise, warm-up, crashes and hangs as a full trial's. Its cost: slice GPUs x (the
slice start-up, :data:`SLICE_STARTUP_S`, an assumption: few layers to build on one or two nodes) + its steps). With
``a2a="in-node"`` (a sensitivity case of the benchmark) a slice sees nothing of the expert all-to-all of a layout
whose EP x ETP spans more than one node (as if it ran on one node at a smaller EP), with ``a2a="none"`` nothing of any
layout's all-to-all; at the same cost.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.estimate import MEMORY_PARTS, EstimateTable, estimate_table
from cost_model.uncertainty import error_bars
from launch.base import FailureKind, Measurement, StepReporter, TrialBackend, TrialFailed, TrialStopped
from specs import DEFAULT_RUN_OPTIONS, Cluster, GPUSpec, ModelSpec, Precision, RunOptions, Workload
from specs.layout import Layout, LayoutTable

__all__ = [
    "FEATURES", "SLICE_A2A", "SLICE_LAYERS", "SLICE_STARTUP_S", "SLICE_UNSEEN_FEATURES", "SLICE_UNSEEN_PARTS",
    "TIME_GROUPS", "SliceMeasurement", "SlicePlan", "ErrorStructure", "SimulatedBackend", "TrialCost", "World",
    "WorldTable", "feature_hashes", "layout_hashes", "layout_normals", "slice_plan", "startup_seconds",
]

#: The groups of step-time parts that share one per-world error factor, and each group's sigma relative to
#: compute's (communication over the network and the host are less well modelled than the GEMMs). The experts'
#: grouped GEMMs are not a part of their own in the estimate (``compute`` holds dense and expert GEMMs): their
#: error as it varies with the local expert count is carried by the EP values' errors (:data:`FEATURES`).
TIME_GROUPS: dict[str, tuple[tuple[str, ...], float]] = {
    "compute": (("compute",), 1.0),
    "recompute": (("recompute",), 1.0),
    "comm": (("tp_comm", "cp_comm", "dp_comm", "pp_p2p"), 1.5),
    "all_to_all": (("ep_comm",), 2.0),
    "pp_bubble": (("pp_bubble",), 1.5),
    "host": (("optimizer", "offload"), 2.0),
}

#: Lognormal sigma of each memory part's per-world factor: parameters, gradients and optimizer states are
#: counted exactly (allocator rounding only); activations, logits and dispatcher buffers depend on kernels'
#: workspaces; the framework's overhead (CUDA context, NCCL buffers, fragmentation) least known.
MEMORY_SIGMAS: dict[str, float] = {
    "weights": 0.01,
    "main_grads": 0.01,
    "optimizer": 0.01,
    "activations": 0.08,
    "logits": 0.05,
    "dispatcher_buffers": 0.15,
    "framework_overhead": 0.25,
}

_SINGLE: dict[str, tuple[str, ...]] = {
    "tp": ("tp", "sequence_parallel"),
    "pp": ("pp",),
    "vpp": ("vpp",),
    "cp": ("cp",),
    "ep": ("ep", "etp"),
    "micro_batch_size": ("micro_batch_size",),
    "recompute": ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
    "offload": ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"),
    "dispatcher": ("dispatcher",),
    "pipeline_split": ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
    "optimizer": ("use_distributed_optimizer", "use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype"),
}
_PAIRS = (("tp", "ep"), ("pp", "vpp"), ("micro_batch_size", "recompute"), ("tp", "cp"), ("ep", "dispatcher"))

#: The layout features whose values carry their own error in a world (each value of each feature, and each
#: combination of values of the pairs that interact most: a layout's error is shared with the layouts that have the
#: same TP, the same TP and EP, ...), as the LayoutTable columns each is made of.
FEATURES: dict[str, tuple[str, ...]] = {**_SINGLE, **{f"{a}*{b}": _SINGLE[a] + _SINGLE[b] for a, b in _PAIRS}}

#: The step-time parts a slice trial does not run (see the module docstring).
SLICE_UNSEEN_PARTS = ("pp_bubble", "pp_p2p", "dp_comm")
#: The features (:data:`FEATURES`) whose error a slice trial does not see: those of the pipeline.
SLICE_UNSEEN_FEATURES = ("pp", "vpp", "pipeline_split", "pp*vpp")
#: What a slice trial sees of the expert all-to-all (:func:`slice_plan`).
SLICE_A2A = ("all", "in-node", "none")
#: Most layers a slice trial runs (the layers of one pipeline stage, at most this many).
SLICE_LAYERS = 4
#: Seconds from a slice trial's launch to its first step: an assumption (a few layers on one or two nodes; a
#: full-scale trial's start-up is :func:`startup_seconds`, 300 s at 64 GPUs).
SLICE_STARTUP_S = 90.0

#: Median absolute step-time error of the model on held-out published runs
#: (``benchmarks/results/2026-12-07_kfold_validation/bench_validation.json``: ``moe_h100_b200``, ``dense``).
HELD_OUT_MEDIAN_ERROR = {"moe": 0.1453, "dense": 0.065}


def startup_seconds(num_gpus: int) -> float:
    """Seconds from launch to the first step (processes, NCCL set-up, model build): 300 s at 64 GPUs, times
    ``(num_gpus / 64) ** 0.25`` (600 s at 1,024). An assumption, not a measurement."""
    return 300.0 * math.pow(num_gpus / 64, 0.25)


@dataclass(frozen=True, kw_only=True, slots=True)
class ErrorStructure:
    """How far a world departs from the model, and how its trials behave (fractions; seconds)."""

    median_step_error: float
    """The median over worlds and valid layouts of |true mean step time / (predicted x bias) - 1|."""
    throughput_bias: float = 0.0
    """The model's bias: the median log(true / predicted) throughput (the error band's centre)."""
    idiosyncratic_share: float = 0.5
    """Share of the log step-time error's variance that is the layout's own (the rest comes from the per-world
    factors of the time groups, shared by all layouts in proportion to their parts). Of it, a lognormal sigma of
    ``layout_sigma`` belongs to the layout alone and the rest is split evenly over the values of the features
    (:data:`FEATURES`)."""
    layout_sigma: float = 0.03
    """Lognormal sigma of the error of a layout alone, below the run-to-run noise: layouts that differ in one
    feature's value differ in that value's error and this much more."""
    memory_sigmas: Mapping[str, float] = field(default_factory=lambda: dict(MEMORY_SIGMAS))
    memory_idiosyncratic_sigma: float = 0.03
    """The layout's own lognormal factor on its activations, logits, buffers and overhead."""
    run_sigma: float = 0.06
    """Lognormal sigma of a run's mean step time around the layout's true mean."""
    step_sigma: float = 0.02
    """Lognormal sigma of one step around its run's mean."""
    warmup_slowdown: float = 0.3
    """The first warm-up step is this much slower, falling linearly to none at the end of the warm-up."""
    crash_rate: float = 0.02
    hang_rate: float = 0.01

    @classmethod
    def for_model(
        cls,
        model: ModelSpec,
        gpu: GPUSpec | None = None,
        precision: Precision | str = "bf16",
        *,
        source: str = "bars",
        **overrides: Any,
    ) -> ErrorStructure:
        """The error of the job's family. ``source="bars"``: the error bars' throughput band
        (:func:`cost_model.uncertainty.error_bars` of ``gpu`` and ``precision``; its width as a lognormal sigma, its
        centre as the bias); ``"kfold"``: the k-fold median error of MoE or dense models
        (:data:`HELD_OUT_MEDIAN_ERROR`), no bias.

        Raises:
            ValueError: another ``source``, or ``"bars"`` without ``gpu``.
        """
        if source == "kfold":
            base: dict[str, Any] = {"median_step_error": HELD_OUT_MEDIAN_ERROR["moe" if model.num_experts else "dense"]}
        elif source == "bars" and gpu is not None:
            band = error_bars(model, gpu, precision).throughput
            base = {"median_step_error": _median_abs_for_lognormal_sigma(band.sigma), "throughput_bias": band.mu}
        else:
            raise ValueError(f"error source {source!r} (gpu {gpu}): accepted 'bars' with a GPU, or 'kfold'")
        return cls(**{**base, **overrides})


def _median_abs_for_lognormal_sigma(sigma: float) -> float:
    """The median of ``|exp(sigma Z) - 1|``, by bisection (the inverse of :func:`_lognormal_sigma_for_median_abs`)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        m = (lo + hi) / 2
        if float(ndtr(math.log1p(m) / sigma) - ndtr(math.log1p(-m) / sigma)) < 0.5:
            lo = m
        else:
            hi = m
    return (lo + hi) / 2


def _lognormal_sigma_for_median_abs(m: float) -> float:
    """The sigma of ``X = exp(sigma Z)`` whose median of ``|X - 1|`` is ``m`` (0 < m < 1), by bisection."""
    lo, hi = 1e-6, 5.0
    a, b = math.log1p(-m), math.log1p(m)
    for _ in range(80):
        s = (lo + hi) / 2
        if float(ndtr(b / s) - ndtr(a / s)) > 0.5:
            lo = s
        else:
            hi = s
    return (lo + hi) / 2


def _column_bits(col: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """A column's values as 64-bit words: integers and booleans as themselves, floats by their bits, strings by
    their CRC-32 (stable across processes and Python versions)."""
    if col.dtype.kind == "U":
        uniq, inv = np.unique(col, return_inverse=True)
        codes = np.array([zlib.crc32(str(s).encode()) for s in uniq], dtype=np.uint64)
        return codes[inv.reshape(-1)]
    if col.dtype.kind == "f":
        return col.astype(np.float64).view(np.uint64)
    return col.astype(np.int64).view(np.uint64)


def _mix(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser (Steele et al. 2014), elementwise."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: npt.NDArray[np.uint64] = h ^ (h >> np.uint64(31))
    return out


def layout_hashes(table: LayoutTable, columns: tuple[str, ...] | None = None) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each row's ``columns`` (None: every field), shape ``(n,)``: the same layout gets the same hash
    whether it comes in a table or alone (:meth:`LayoutTable.from_layouts`)."""
    h = np.zeros(len(table), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in sorted(columns if columns is not None else table.cols):
            h = _mix(h ^ _column_bits(table[name]))
    return h


#: A feature's distinct hashes and each row's index into them.
_Codes = tuple[npt.NDArray[np.uint64], npt.NDArray[np.intp]]


def feature_hashes(table: LayoutTable) -> dict[str, _Codes]:
    """:func:`layout_hashes` of each feature's columns (:data:`FEATURES`) and of the whole layout (``"layout"``), as
    the distinct hashes and each row's index into them."""
    out: dict[str, _Codes] = {}
    for name, cols in FEATURES.items():
        uniq, inv = np.unique(layout_hashes(table, cols), return_inverse=True)
        out[name] = (uniq, inv.reshape(-1))
    out["layout"] = (layout_hashes(table), np.arange(len(table)))
    return out


def layout_normals(hashes: npt.NDArray[np.uint64], seed: int, stream: int) -> npt.NDArray[np.float64]:
    """One standard normal per layout hash (:func:`layout_hashes`), a deterministic function of the hash, ``seed``
    and ``stream`` (independent streams for the layout's own step time, its memory and each feature). Shape ``(n,)``."""
    with np.errstate(over="ignore"):
        salt = np.uint64((seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03 + 1) % 2**64)
        h = _mix(_mix(hashes ^ salt))
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    out: npt.NDArray[np.float64] = ndtri(u)
    return out


class WorldTable:
    """The valid layouts of one (model, cluster, workload), their estimates and hashes: what every :class:`World`
    drawn on them shares (built once; a world then costs a few vectorised passes over the rows).

    Args:
        table: the valid layouts (``Prepared.enumeration.valid``).
        estimates: their estimate (``Prepared.estimates``); computed here when None.
        calibration, options: what the estimates assume (``Prepared.calibration``, ``Prepared.options``).
    """

    def __init__(
        self,
        model: ModelSpec,
        cluster: Cluster,
        workload: Workload,
        table: LayoutTable,
        *,
        estimates: EstimateTable | None = None,
        calibration: Calibration = DEFAULT_CALIBRATION,
        options: RunOptions = DEFAULT_RUN_OPTIONS,
    ) -> None:
        self.model, self.cluster, self.workload, self.table = model, cluster, workload, table
        self.calibration, self.options = calibration, options
        self.estimates = estimates if estimates is not None else self.estimate(table)
        self.hashes = feature_hashes(table)
        """:func:`feature_hashes` of the rows."""
        self.weights = _group_weights(self.estimates)
        """Each time group's share of each row's predicted step time, ``(n, len(TIME_GROUPS))``."""
        self._scales: dict[tuple[float, float], float] = {}

    def group_scale(self, errors: ErrorStructure) -> float:
        """The sigma of the per-world factor of a time group of relative sigma 1 (:data:`TIME_GROUPS`), solved by
        bisection so that over 64 reference worlds (fixed draws) and up to 1,000 of the rows, the median of
        |true / predicted - 1| is ``errors.median_step_error``, with the layouts' own factor of sigma
        ``sqrt(idiosyncratic_share) * sigma`` (``sigma``: the lognormal sigma of that median alone).
        0 when the layouts' own factor alone reaches it."""
        key = (errors.median_step_error, errors.idiosyncratic_share)
        if key in self._scales:
            return self._scales[key]
        rng = np.random.default_rng(20_000)
        n = len(self.weights)
        w = (
            self.weights[rng.choice(n, size=min(n, 1000), replace=False)]
            if n
            else np.ones((1, len(TIME_GROUPS))) / len(TIME_GROUPS)
        )
        r = np.array([rel for _, rel in TIME_GROUPS.values()])
        z = rng.standard_normal((64, len(r)))
        own = np.exp(
            math.sqrt(errors.idiosyncratic_share)
            * _lognormal_sigma_for_median_abs(errors.median_step_error)
            * rng.standard_normal((64, len(w)))
        )

        def median_error(scale: float) -> float:
            return float(np.median(np.abs(np.exp(scale * r * z) @ w.T * own - 1.0)))

        lo, hi = 0.0, 2.0
        if median_error(lo) >= errors.median_step_error:
            hi = 0.0
        for _ in range(30 if hi else 0):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if median_error(mid) < errors.median_step_error else (lo, mid)
        self._scales[key] = (lo + hi) / 2
        return self._scales[key]

    def estimate(self, table: LayoutTable) -> EstimateTable:
        """The estimate of ``table`` as the world's truth builds on it (the shipped headroom; fit is not used)."""
        return estimate_table(
            self.model, self.cluster, self.workload, table, calibration=self.calibration, options=self.options
        )


def _group_weights(est: EstimateTable) -> npt.NDArray[np.float64]:
    """Each time group's share of the predicted step time, shape ``(n, len(TIME_GROUPS))``."""
    total = np.asarray(est.step_time_s, dtype=np.float64)
    if not len(total):
        return np.zeros((0, len(TIME_GROUPS)))
    cols = [
        sum((np.asarray(est.time[p]) for p in parts), np.zeros_like(total)) / total for parts, _ in TIME_GROUPS.values()
    ]
    return np.stack(cols, axis=1)


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """The slice trial of each row of a table (:func:`slice_plan`), arrays of shape ``(n,)``."""

    gpus: npt.NDArray[np.int64]
    """GPUs the slice takes: ``lcm(tp*cp, ep*etp, gpus_per_node)``."""
    scale: npt.NDArray[np.float64]
    """Slice layers / layers of one pipeline stage."""
    seen: dict[str, npt.NDArray[np.bool_]]
    """Per time part (:data:`cost_model.estimate.TIME_PARTS`): the rows whose slice runs it."""
    predicted_step_time_s: npt.NDArray[np.float64]
    """The model's step time of the slice: the seen parts x ``scale``."""


def slice_plan(
    model: ModelSpec, cluster: Cluster, table: LayoutTable, est: EstimateTable, *, a2a: str = "all"
) -> SlicePlan:
    """The slice trial of every row of ``table`` (its estimate ``est``): see the module docstring. ``a2a``: the
    all-to-all (``ep_comm``) the slice sees: ``"all"``; ``"in-node"``: not where ``ep * etp`` exceeds a node;
    ``"none"``.

    Raises:
        ValueError: another ``a2a``.
    """
    if a2a not in SLICE_A2A:
        raise ValueError(f"a2a {a2a!r}: accepted {', '.join(SLICE_A2A)}")
    tp, cp, ep, etp, pp = (np.asarray(table[c], dtype=np.int64) for c in ("tp", "cp", "ep", "etp", "pp"))
    gpus = np.lcm(np.lcm(tp * cp, ep * etp), cluster.gpus_per_node)
    stage_layers = np.ceil(model.num_layers / pp)
    scale = np.minimum(stage_layers, SLICE_LAYERS) / stage_layers
    n = len(table)
    seen = {p: np.full(n, p not in SLICE_UNSEEN_PARTS) for p in est.time}
    if a2a != "all":
        seen["ep_comm"] = (ep * etp <= cluster.gpus_per_node) & (a2a == "in-node")
    pred = sum((np.asarray(est.time[p], dtype=np.float64) * seen[p] for p in est.time), np.zeros(n)) * scale
    return SlicePlan(gpus=gpus, scale=scale, seen=seen, predicted_step_time_s=pred)


@dataclass(frozen=True, slots=True)
class _Truth:
    step_time_s: npt.NDArray[np.float64]
    peak_bytes: npt.NDArray[np.float64]


class World:
    """The hidden truth of one (model, cluster, workload), drawn from :class:`ErrorStructure` with ``seed``.

    The per-group sigmas are :meth:`WorldTable.group_scale` times each group's relative sigma, so that the median
    error over worlds and layouts is ``errors.median_step_error``.

    Attributes:
        true_step_time_s, true_peak_bytes: the truth of every row of ``base.table``, shape ``(n,)`` (seconds, bytes).
        fits: rows whose true peak is at most the GPU's HBM.
        time_factors, memory_factors: the per-world factor of each time group (:data:`TIME_GROUPS`) and memory part.
    """

    def __init__(self, base: WorldTable, *, seed: int, errors: ErrorStructure | None = None) -> None:
        self.base = base
        self.model, self.cluster, self.workload = base.model, base.cluster, base.workload
        self.seed = int(seed)
        self.errors = (
            errors
            if errors is not None
            else ErrorStructure.for_model(base.model, base.cluster.gpu, base.workload.precision)
        )
        self.idiosyncratic_sigma = math.sqrt(self.errors.idiosyncratic_share) * _lognormal_sigma_for_median_abs(
            self.errors.median_step_error
        )
        r = np.array([rel for _, rel in TIME_GROUPS.values()])
        rng = np.random.default_rng([self.seed, 1])
        self.time_factors = dict(
            zip(
                TIME_GROUPS,
                np.exp(r * base.group_scale(self.errors) * rng.standard_normal(len(r))).tolist(),
                strict=True,
            )
        )
        sig = np.array([self.errors.memory_sigmas.get(p, 0.0) for p in MEMORY_PARTS])
        self.memory_factors = dict(zip(MEMORY_PARTS, np.exp(sig * rng.standard_normal(len(sig))).tolist(), strict=True))
        own_var = self.idiosyncratic_sigma**2 - self.errors.layout_sigma**2
        self.feature_sigma = math.sqrt(max(own_var, 0.0) / len(FEATURES))
        """Lognormal sigma of each feature value's error (:data:`FEATURES`)."""
        truth = self._truth(base.hashes, base.estimates)
        self.true_step_time_s = truth.step_time_s
        self.true_peak_bytes = truth.peak_bytes
        self.fits = truth.peak_bytes <= self.cluster.gpu.hbm_bytes

    def _truth(self, hashes: dict[str, _Codes], est: EstimateTable) -> _Truth:
        n = len(hashes["layout"][1])
        step = np.zeros(n)
        for g, (parts, _) in TIME_GROUPS.items():
            for p in parts:
                step = step + np.asarray(est.time[p]) * self.time_factors[g]
        own = self.errors.layout_sigma * layout_normals(hashes["layout"][0], self.seed, 2)
        for k, name in enumerate(FEATURES):
            uniq, inv = hashes[name]
            own = own + self.feature_sigma * layout_normals(uniq, self.seed, 10 + k)[inv]
        step = step * np.exp(own - self.errors.throughput_bias)
        exact = np.zeros(n)
        loose = np.zeros(n)
        for p in MEMORY_PARTS:
            v = np.asarray(est.memory[p]) * self.memory_factors[p]
            if p in ("weights", "main_grads", "optimizer"):
                exact = exact + v
            else:
                loose = loose + v
        peak = exact + loose * np.exp(
            self.errors.memory_idiosyncratic_sigma * layout_normals(hashes["layout"][0], self.seed, 3)
        )
        return _Truth(step_time_s=step, peak_bytes=peak)

    def _slice_truth(self, hashes: dict[str, _Codes], est: EstimateTable, plan: SlicePlan) -> npt.NDArray[np.float64]:
        """The slice's true mean step time (seconds) of each row: its seen parts with their groups' factors, times the
        seen features' factors and the bias, times ``plan.scale``."""
        n = len(hashes["layout"][1])
        step = np.zeros(n)
        for g, (parts, _) in TIME_GROUPS.items():
            for p in parts:
                step = step + np.asarray(est.time[p]) * plan.seen[p] * self.time_factors[g]
        own = np.zeros(n)
        for k, name in enumerate(FEATURES):
            if name in SLICE_UNSEEN_FEATURES:
                continue
            uniq, inv = hashes[name]
            own = own + self.feature_sigma * layout_normals(uniq, self.seed, 10 + k)[inv]
        out: npt.NDArray[np.float64] = step * np.exp(own - self.errors.throughput_bias) * plan.scale
        return out

    def slice_truth_of(self, layout: Layout, *, a2a: str = "all") -> tuple[float, float, int]:
        """``(true mean step time, predicted step time, GPUs)`` of one layout's slice trial (:func:`slice_plan`)."""
        table = LayoutTable.from_layouts([layout])
        est = self.base.estimate(table)
        plan = slice_plan(self.model, self.cluster, table, est, a2a=a2a)
        true = self._slice_truth(feature_hashes(table), est, plan)
        return float(true[0]), float(plan.predicted_step_time_s[0]), int(plan.gpus[0])

    def slice_unseen_sigma(self, plan: SlicePlan) -> npt.NDArray[np.float64]:
        """Standard deviation of the log error of each row's step time that its slice does not see, shape ``(n,)``:
        each time group's unseen share of the predicted step time x the group's sigma (independent groups), the
        unseen features' sigmas and the layout's own (:attr:`ErrorStructure.layout_sigma`)."""
        est = self.base.estimates
        total = np.asarray(est.step_time_s, dtype=np.float64)
        scale = self.base.group_scale(self.errors)
        var = np.zeros(len(total))
        for parts, rel in TIME_GROUPS.values():
            share = sum((np.asarray(est.time[p]) * ~plan.seen[p] for p in parts), np.zeros(len(total))) / np.maximum(
                total, 1e-12
            )
            var = var + (share * rel * scale) ** 2
        var = var + len(SLICE_UNSEEN_FEATURES) * self.feature_sigma**2 + self.errors.layout_sigma**2
        out: npt.NDArray[np.float64] = np.sqrt(var)
        return out

    def truth_of(self, layout: Layout) -> tuple[float, float]:
        """``(true mean step time in s, true peak bytes per GPU)`` of one layout: the same numbers as its row of the
        table (the estimate of a one-row table, the same hash)."""
        table = LayoutTable.from_layouts([layout])
        t = self._truth(feature_hashes(table), self.base.estimate(table))
        return float(t.step_time_s[0]), float(t.peak_bytes[0])

    def tokens_per_s_per_gpu(self, step_time_s: Any) -> Any:
        """Throughput of a step time (seconds; scalar or array): global batch x sequence length / step time / GPUs."""
        return (
            self.workload.global_batch_size * self.workload.seq_length / np.asarray(step_time_s) / self.cluster.num_gpus
        )

    @property
    def true_tokens_per_s_per_gpu(self) -> npt.NDArray[np.float64]:
        """True mean throughput of every row (tokens/s/GPU)."""
        out: npt.NDArray[np.float64] = self.tokens_per_s_per_gpu(self.true_step_time_s)
        return out

    def best_row(self, mask: npt.NDArray[np.bool_] | None = None) -> int | None:
        """The row with the highest true throughput among those that truly fit (and ``mask``); None if none."""
        ok = self.fits if mask is None else self.fits & mask
        if not ok.any():
            return None
        return int(np.flatnonzero(ok)[np.argmin(self.true_step_time_s[ok])])

    def step_errors(self) -> npt.NDArray[np.float64]:
        """true mean step time / predicted - 1 of every row."""
        out: npt.NDArray[np.float64] = self.true_step_time_s / np.asarray(self.base.estimates.step_time_s) - 1.0
        return out


@dataclass(frozen=True, slots=True)
class SliceMeasurement:
    """A slice trial's result (:meth:`SimulatedBackend.run_slice`)."""

    step_time_s: float
    """Median measured step time after the warm-up, seconds."""
    predicted_step_time_s: float
    """The model's step time of the slice (:attr:`SlicePlan.predicted_step_time_s`)."""
    gpus: int
    gpu_seconds: float


@dataclass(frozen=True, slots=True)
class TrialCost:
    """What one simulated trial cost and how it ended."""

    layout_key: str
    outcome: str
    """``measured``, ``pruned``, ``oom``, ``crash`` or ``timeout``; a slice trial's: ``slice``, ``slice_crash``,
    ``slice_timeout``."""
    gpu_seconds: float
    steps: int
    true_step_time_s: float = math.nan
    """The layout's true mean step time (seconds; for the benchmark's reading, never shown to a policy)."""


class SimulatedBackend(TrialBackend):
    """Measures the :class:`World`'s truth: a real-trial backend (``source == "measured"``) without GPUs.

    Each run: start-up (:func:`startup_seconds`), then ``steps`` steps, the reporter called after each with every
    step's throughput so far; the warm-up steps are left out of the measurement. Its noise is a deterministic
    function of the world's seed, the layout and how many times this backend ran it. Cost of a trial (GPU-seconds,
    at the cluster's GPU count): start-up plus the steps run; out of memory: start-up and one step; a hang: the
    timeout. :attr:`gpu_seconds` is the running total, :attr:`trials` each trial's cost.

    Args:
        world: the truth.
        steps: steps per trial, warm-up included (the study's ``--trial-steps``).
        warmup_steps: leading steps left out of the measurement.
        timeout_s: wall-clock limit of a trial, start-up included (a hang costs it).
        startup_s: seconds to the first step (None: :func:`startup_seconds` of the cluster).
    """

    name = "simulated"
    source = "measured"

    def __init__(
        self,
        world: World,
        *,
        steps: int = 20,
        warmup_steps: int = 10,
        timeout_s: float = 900.0,
        startup_s: float | None = None,
    ) -> None:
        self.world = world
        self.steps, self.warmup_steps, self.timeout_s = steps, warmup_steps, timeout_s
        self.startup_s = startup_seconds(world.cluster.num_gpus) if startup_s is None else startup_s
        self.gpu_seconds = 0.0
        self.trials: list[TrialCost] = []
        self._runs: dict[str, int] = {}
        self._slice_runs: dict[str, int] = {}
        self._cancelled = False

    @property
    def gpu_hours(self) -> float:
        """GPU-hours spent by every trial so far."""
        return self.gpu_seconds / 3600.0

    def _charge(
        self, key: str, outcome: str, seconds: float, steps: int, true_step_time_s: float, gpus: int | None = None
    ) -> None:
        g = seconds * (self.world.cluster.num_gpus if gpus is None else gpus)
        self.gpu_seconds += g
        self.trials.append(TrialCost(key, outcome, g, steps, true_step_time_s))

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
        """The world's measurement of ``layout`` (``model``, ``cluster``, ``workload`` are the world's own).

        Raises:
            TrialFailed: out of memory (true peak over HBM; ``memory_reached_bytes`` = the HBM), a crash, or a hang
                or a run longer than ``timeout_s`` (``timeout``).
            TrialStopped: the reporter stopped it.
            KeyboardInterrupt: :meth:`cancel` was called.
        """
        if self._cancelled:
            raise KeyboardInterrupt
        w = self.world
        key = layout.key()
        k = self._runs.get(key, 0)
        self._runs[key] = k + 1
        # this run's random numbers: from the world's seed, the layout's hash and its run count
        h = int(layout_hashes(LayoutTable.from_layouts([layout]))[0])
        rng = np.random.default_rng([w.seed, 4, k, h])
        mean_s, peak = w.truth_of(layout)
        hbm = w.cluster.gpu.hbm_bytes
        where = f"simulated trial {trial_number if trial_number is not None else '-'} ({layout.label})"
        if peak > hbm:
            self._charge(key, "oom", self.startup_s + mean_s, 1, mean_s)
            raise TrialFailed(
                FailureKind.oom, f"{where}: out of memory at {hbm / 2**30:.1f} GiB (true peak {peak / 2**30:.1f} GiB)",
                memory_reached_bytes=hbm, wall_s=self.startup_s + mean_s,
            )
        u = float(rng.random())
        hang = u < w.errors.hang_rate
        crash_at = (
            int(rng.integers(1, self.steps + 1))
            if w.errors.hang_rate <= u < w.errors.hang_rate + w.errors.crash_rate
            else None
        )
        run_mean = mean_s * math.exp(w.errors.run_sigma * float(rng.standard_normal()))
        noise = np.exp(w.errors.step_sigma * rng.standard_normal(self.steps))
        ramp = np.zeros(self.steps)
        if self.warmup_steps:
            ramp[: self.warmup_steps] = w.errors.warmup_slowdown * (
                1 - np.arange(self.warmup_steps) / self.warmup_steps
            )
        times = run_mean * noise * (1 + ramp)
        tps_all = w.tokens_per_s_per_gpu(times)
        elapsed = self.startup_s
        for i in range(self.steps):
            if hang and i >= self.steps // 2:
                self._charge(key, "timeout", self.timeout_s, i, mean_s)
                raise TrialFailed(
                    FailureKind.timeout,
                    f"{where}: timed out after {self.timeout_s:g} s (hung at step {i + 1})",
                    wall_s=self.timeout_s,
                )
            elapsed += float(times[i])
            if elapsed > self.timeout_s:
                self._charge(key, "timeout", self.timeout_s, i, mean_s)
                raise TrialFailed(
                    FailureKind.timeout,
                    f"{where}: timed out after {self.timeout_s:g} s at step {i + 1}",
                    wall_s=self.timeout_s,
                )
            if crash_at is not None and i + 1 == crash_at:
                self._charge(key, "crash", elapsed, i + 1, mean_s)
                raise TrialFailed(FailureKind.crash, f"{where}: crashed at step {i + 1}", wall_s=elapsed)
            if reporter is not None:
                why = reporter([float(x) for x in tps_all[: i + 1]])
                if why is not None:
                    self._charge(key, "pruned", elapsed, i + 1, mean_s)
                    raise TrialStopped(
                        why,
                        step_times_s=[float(x) for x in times[: i + 1]],
                        tokens_per_s_per_gpu=[float(x) for x in tps_all[: i + 1]],
                        wall_s=elapsed,
                    )
        self._charge(key, "measured", elapsed, self.steps, mean_s)
        kept = times[self.warmup_steps :]
        med = float(np.median(kept))
        return Measurement(
            layout=layout,
            source=self.source,
            tokens_per_s_per_gpu=float(w.tokens_per_s_per_gpu(med)),
            peak_bytes=peak,
            step_times_s=tuple(float(x) for x in kept),
            extra={
                "peak_allocated_bytes": peak,
                "step_time_cv": float(np.std(kept) / np.mean(kept)),
                "wall_s": elapsed,
                "notes": [],
                "summary": {},
                "true_step_time_s": mean_s,
            },
        )

    def run_slice(self, layout: Layout, *, a2a: str = "all", startup_s: float = SLICE_STARTUP_S) -> SliceMeasurement:
        """The world's measurement of ``layout``'s slice trial (see the module docstring; ``a2a``: as
        :func:`slice_plan`): ``steps`` steps after ``startup_s``, the warm-up left out, at the slice's GPUs.

        Raises:
            TrialFailed: a crash or a hang (``timeout``), the same shares as a full trial's.
        """
        w = self.world
        key = layout.key()
        k = self._slice_runs.get(key, 0)
        self._slice_runs[key] = k + 1
        h = int(layout_hashes(LayoutTable.from_layouts([layout]))[0])
        rng = np.random.default_rng([w.seed, 6, k, h])
        mean_s, pred_s, gpus = w.slice_truth_of(layout, a2a=a2a)
        where = f"simulated slice of {layout.label}"
        u = float(rng.random())
        run_mean = mean_s * math.exp(w.errors.run_sigma * float(rng.standard_normal()))
        times = run_mean * np.exp(w.errors.step_sigma * rng.standard_normal(self.steps))
        if self.warmup_steps:
            times[: self.warmup_steps] *= 1 + w.errors.warmup_slowdown * (
                1 - np.arange(self.warmup_steps) / self.warmup_steps
            )
        if u < w.errors.hang_rate:
            self._charge(key, "slice_timeout", self.timeout_s, self.steps // 2, mean_s, gpus)
            raise TrialFailed(
                FailureKind.timeout, f"{where}: timed out after {self.timeout_s:g} s", wall_s=self.timeout_s
            )
        if u < w.errors.hang_rate + w.errors.crash_rate:
            at = int(rng.integers(1, self.steps + 1))
            wall = startup_s + float(times[:at].sum())
            self._charge(key, "slice_crash", wall, at, mean_s, gpus)
            raise TrialFailed(FailureKind.crash, f"{where}: crashed at step {at}", wall_s=wall)
        wall = startup_s + float(times.sum())
        self._charge(key, "slice", wall, self.steps, mean_s, gpus)
        return SliceMeasurement(
            step_time_s=float(np.median(times[self.warmup_steps :])),
            predicted_step_time_s=pred_s,
            gpus=gpus,
            gpu_seconds=wall * gpus,
        )

    def cancel(self) -> None:
        """Every later run raises KeyboardInterrupt (nothing runs in the background)."""
        self._cancelled = True
