"""How a layout is an Optuna trial's parameters (:class:`CandidateIndex`), and which candidates a run puts in front
of the sampler, in what order (:class:`CandidateQueue`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optuna

from cost_model.estimate import estimate_table
from launch import TrialBackend
from specs.errors import TunerError
from specs.layout import Layout, LayoutTable, categories
from tuner.study.prepare import Prepared
from tuner.study.records import TrialRecord, TrialRow

__all__ = ["DIMENSIONS", "MAX_ENQUEUED", "CandidateIndex", "CandidateQueue"]

#: Most layouts a run enqueues.
MAX_ENQUEUED = 256

#: Search dimensions (Optuna parameters) and the LayoutTable columns each one sets.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "tp": ("tp", "sequence_parallel"), "pp": ("pp",), "vpp": ("vpp",), "cp": ("cp",), "ep": ("ep",), "etp": ("etp",),
    "micro_batch_size": ("micro_batch_size",),
    "recompute": ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
    "optimizer_offload_fraction": ("optimizer_offload_fraction",),
    "overlap_cpu_optimizer_d2h_h2d": ("overlap_cpu_optimizer_d2h_h2d",), "dispatcher": ("dispatcher",),
    "pipeline_split": ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
    "use_distributed_optimizer": ("use_distributed_optimizer",),
    "use_precision_aware_optimizer": ("use_precision_aware_optimizer",),
    "exp_avg_dtype": ("exp_avg_dtype",), "exp_avg_sq_dtype": ("exp_avg_sq_dtype",),
}

#: A dense lookup table is used for integer codes up to this range (else a sort).
_DENSE_RANGE = 1 << 22


def _split_label(first: int, last: int) -> str:
    return "even" if not first and not last else f"{first}/{last}"


def _label(dim: str, layout: Layout) -> str:
    if dim == "recompute":
        return layout.recompute_label
    if dim == "pipeline_split":
        return _split_label(layout.num_layers_in_first_pipeline_stage, layout.num_layers_in_last_pipeline_stage)
    if dim == "tp":
        return str(layout.tp)
    v = getattr(layout, dim)
    if isinstance(v, float):
        return f"{v:g}"
    if hasattr(v, "value"):
        return str(v.value)
    return str(v).lower() if isinstance(v, bool) else str(v)


def _dense_codes(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``np.unique``'s (inverse, first index, count) by a lookup table; None for a wide range."""
    lo, hi = int(a.min()), int(a.max())
    if hi - lo >= _DENSE_RANGE:
        return None
    off = a - lo
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[off] = True
    lut = np.cumsum(present) - 1
    inv = lut[off]
    k = int(lut[-1]) + 1
    first = np.full(k, len(a), dtype=np.int64)
    np.minimum.at(first, inv, np.arange(len(a), dtype=np.int64))
    return inv, first, k


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(inverse, first index, count)`` of ``np.unique`` of an integer array (fast for a small range)."""
    dense = _dense_codes(a) if a.dtype.kind in "biu" else None
    if dense is not None:
        return dense
    _, first, inv = np.unique(a, return_index=True, return_inverse=True)
    return inv.reshape(-1), first, len(first)


def _column_codes(table: LayoutTable, name: str) -> tuple[np.ndarray, int]:
    """Each row's code in a LayoutTable column, and the number of codes."""
    if name not in table.cats:
        col = table[name]
        if col.dtype.kind in "biu":
            inv = _unique(col.astype(np.int64, copy=False))[0]
        else:
            _, inv = np.unique(col, return_inverse=True)
            inv = inv.reshape(-1)
        return inv, int(inv.max()) + 1
    values, codes = table.codes(name)
    used = np.flatnonzero(np.bincount(codes, minlength=len(values)))
    if values.dtype.kind == "U":
        order, _ = categories(values[used])
        rank = {s: i for i, s in enumerate(order)}
        pos_used, k = np.array([rank[str(values[i])] for i in used], dtype=np.int64), len(order)
    else:
        uniq, inv = np.unique(values[used], return_inverse=True)
        pos_used, k = inv.reshape(-1), len(uniq)
    pos = np.zeros(len(values), dtype=np.int64)
    pos[used] = pos_used
    return pos[codes], k


def _row_codes(table: LayoutTable, cols: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """``(inverse, first index, count)`` of the distinct value combinations of ``cols``, row by row."""
    n = len(table)
    key = np.zeros(n, dtype=np.int64)
    for c in cols:
        inv, radix = _column_codes(table, c) if n else (np.zeros(0, dtype=np.int64), 1)
        key = key * radix + inv
    return _unique(key) if n else (key, np.zeros(0, dtype=np.int64), 0)


#: A dimension whose columns share one code array with at most this many categories is coded per category.
_FEW_CATEGORIES = 256


def _dimension_codes(table: LayoutTable, cols: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`_row_codes` of a search dimension, coded per category when its columns share one."""
    shared = {id(table.cols[c]) for c in cols}
    codes = table.cols[cols[0]]
    if (len(shared) > 1 or any(c not in table.cats for c in cols) or not len(table)
            or max(len(table.cats[c]) for c in cols) > _FEW_CATEGORIES):
        return _row_codes(table, cols)
    first_row = np.full(len(table.cats[cols[0]]), len(table), dtype=np.int64)
    np.minimum.at(first_row, codes, np.arange(len(table)))  # each category's first row
    used = np.flatnonzero(first_row < len(table))
    first_of = first_row[used]
    inv_used, _, k = _row_codes(table.select(first_of), cols)
    first = np.full(k, len(table), dtype=np.int64)
    np.minimum.at(first, inv_used, first_of)
    lut = np.zeros(len(table.cats[cols[0]]), dtype=np.min_scalar_type(max(k - 1, 0)))
    lut[used] = inv_used
    return lut[codes], first, k


class CandidateIndex:
    """Maps search-dimension labels to rows of the valid table (mixed-radix codes, binary search)."""

    def __init__(self, valid: LayoutTable, fits: np.ndarray) -> None:
        self.valid = valid
        n = len(valid)
        self.codes: dict[str, np.ndarray] = {}
        self.labels: dict[str, list[str]] = {}
        self.rep_row: dict[str, list[int]] = {}
        code = np.zeros(n, dtype=np.int64)
        for dim, cols in DIMENSIONS.items():
            inv, first, k = _dimension_codes(valid, cols)
            reps = [int(i) for i in first]
            self.codes[dim] = inv
            self.rep_row[dim] = reps
            self.labels[dim] = [_label(dim, valid.row(i)) for i in reps]
            code *= k
            code += inv
        fit_rows = np.flatnonzero(fits)
        order = np.argsort(code[fit_rows])
        self._fit_sorted_codes = code[fit_rows][order]
        self._fit_sorted_rows = fit_rows[order]
        self._label_index = {d: {lab: i for i, lab in enumerate(labs)} for d, labs in self.labels.items()}

    @property
    def params(self) -> list[str]:
        """Dimensions with more than one choice: the Optuna parameters."""
        return [d for d in DIMENSIONS if len(self.labels[d]) > 1]

    def distributions(self) -> dict[str, optuna.distributions.CategoricalDistribution]:
        """Optuna's distribution of each parameter (the categorical choice of its labels)."""
        return {p: optuna.distributions.CategoricalDistribution(self.labels[p]) for p in self.params}

    def params_of_row(self, row: int) -> dict[str, str]:
        """The Optuna parameters (labels) of a row of the valid table."""
        return {d: self.labels[d][int(self.codes[d][row])] for d in self.params}

    def find_fitting(self, params: dict[str, str]) -> int | None:
        """Row of the valid table with these labels, if it exists and fits; else None."""
        code = 0
        for d in DIMENSIONS:
            idx = self._label_index[d].get(params.get(d, self.labels[d][0]))
            if idx is None:
                return None
            code = code * len(self.labels[d]) + idx
        pos = int(np.searchsorted(self._fit_sorted_codes, code))
        if pos < len(self._fit_sorted_codes) and self._fit_sorted_codes[pos] == code:
            return int(self._fit_sorted_rows[pos])
        return None

    def build(self, params: dict[str, str]) -> Layout:
        """A layout with these labels, valid or not (to explain why it was skipped)."""
        base = self.valid.row(0).to_dict()
        for d, cols in DIMENSIONS.items():
            lab = params.get(d, self.labels[d][0])
            rep = self.valid.row(self.rep_row[d][self._label_index[d][lab]]).to_dict()
            for c in cols:
                base[c] = rep[c]
        base["sequence_parallel"] = base["tp"] > 1
        return Layout.from_dict(base)


def _spread(front: np.ndarray, peak: np.ndarray, k: int) -> list[int]:
    """Up to ``k`` points of the front spread evenly over its memory range, both ends included."""
    if len(front) <= k:
        return [int(i) for i in front]
    by_mem = front[np.argsort(peak[front])]
    picks = sorted(set(np.round(np.linspace(0, len(by_mem) - 1, k)).astype(int).tolist()))  # not np.unique: numpy.ma
    return [int(by_mem[i]) for i in picks]


class CandidateQueue:
    """The candidates (rows of the valid table) a run puts in front of Optuna's sampler, in order: the predicted
    front spread over memory and the fastest predicted, at most three quarters of the run's layouts (less
    ``queued_already``) and :data:`MAX_ENQUEUED`, none evaluated (``seen``) or refused. With real trials and
    ``recalibrate_after`` K only :attr:`first` (``parallel`` rows) is enqueued; :attr:`rest` waits, re-ranked after
    every K measured trials (:meth:`recalibrate`). Not thread-safe: the run holds its lock."""

    def __init__(self, prep: Prepared, index: CandidateIndex, backend: TrialBackend, *, seen: set[str], n_trials: int,
                 queued_already: int = 0, recalibrate_after: int = 0, parallel: int = 1) -> None:
        self.prep = prep
        self.index = index
        self.backend = backend
        self.every = recalibrate_after if backend.measured else 0
        self.fits_done = 0
        self.calibration = prep.calibration
        est = prep.estimates
        fit_idx = np.flatnonzero(prep.fits)
        fastest = fit_idx[np.argsort(-est.tokens_per_s_per_gpu[fit_idx])[: 4 * min(n_trials, MAX_ENQUEUED)]]
        spread = _spread(prep.front, est.peak_bytes, max(2, n_trials // 2))
        sure = np.flatnonzero(prep.surely_fits)
        sure_fastest = [int(i) for i in sure[np.argsort(-est.tokens_per_s_per_gpu[sure], kind="stable")[:4]]]
        # the model backend evaluates the fastest layouts that surely fit first: the best it names is the table's
        order = ([int(i) for i in fastest] + spread if backend.measured
                 else sure_fastest + spread + [int(i) for i in fastest])
        if prep.baseline_row is not None and prep.fits[prep.baseline_row]:
            order.insert(0, prep.baseline_row)  # the user's own layout (tune --from) is always evaluated
        budget = min(MAX_ENQUEUED, max(1, (3 * n_trials) // 4)) - queued_already
        queued: list[int] = []
        keys: set[str] = set()
        for i in order:
            if len(queued) >= budget:
                break
            lay = prep.enumeration.valid.row(i)
            k = lay.key()
            if k in seen or k in keys or self.refuses(lay):
                continue
            queued.append(i)
            keys.add(k)
        n_first = max(1, parallel) if self.every else len(queued)
        self.first: list[int] = queued[:n_first]
        """Rows enqueued at the start."""
        self.rest: list[int] = queued[n_first:]
        """Rows enqueued one at a time after each trial (a lazy queue)."""
        self._by_speed: np.ndarray | None = None
        self._cursor = 0

    @property
    def lazy(self) -> bool:
        """Real trials with ``--recalibrate-after K`` > 0: the queue is enqueued one trial at a time."""
        return self.every > 0

    def refuses(self, layout: Layout) -> bool:
        """The backend cannot run this layout here (do not spend a trial on it)."""
        return self.backend.refusal(layout, self.prep.model, self.prep.workload) is not None

    @property
    def label(self) -> str:
        """What a row of :attr:`rest` is recorded as when it is enqueued (``enqueued``)."""
        return "fastest predicted" + (" after recalibration" if self.fits_done else "")

    def pop_rest(self, seen: set[str]) -> int | None:
        """The next waiting row whose layout has not been evaluated (None: none waits)."""
        while self.rest:
            i = self.rest.pop(0)
            if self.prep.enumeration.valid.row(i).key() not in seen:
                return i
        return None

    def next_unevaluated(self, exclude: set[str]) -> int | None:
        """The fastest predicted candidate not in ``exclude`` nor refused; None when the space ran out."""
        if self._by_speed is None:
            fit_idx = np.flatnonzero(self.prep.fits)
            self._by_speed = fit_idx[np.argsort(-self.prep.estimates.tokens_per_s_per_gpu[fit_idx], kind="stable")]
        while self._cursor < len(self._by_speed):
            i = int(self._by_speed[self._cursor])
            self._cursor += 1
            lay = self.prep.enumeration.valid.row(i)
            if lay.key() not in exclude and not self.refuses(lay):
                return i
        return None

    def recalibrate(self, study: optuna.Study) -> None:
        """Every ``K`` measured trials: refit, re-rank :attr:`rest`, record it (``recalibrations``)."""
        from cost_model.calibrate import Observation, fit_observations

        measured = []
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            r = TrialRecord.of(t)
            row = TrialRow.of(t.number, r.key or "", r.result)
            if row is not None and row.source == "measured" and r.repeat_of is None:
                measured.append(row)
        n = len(measured)
        if not (self.every and n >= self.every * (self.fits_done + 1) and n >= 2):
            return
        prep = self.prep
        obs = []
        for row in measured:
            peak, st_s = row.peak_gib, row.step_time_s or math.nan
            obs.append(Observation(model=prep.model, cluster=prep.cluster, workload=prep.workload, layout=row.layout,
                                   step_time_s=st_s if math.isfinite(st_s) and st_s > 0 else None,
                                   peak_gib=peak if peak and math.isfinite(peak) else None,
                                   label=f"trial {row.trial}"))
        record: dict[str, Any] = {"after_measured_trials": n}
        try:
            fit = fit_observations(obs, start=self.calibration, max_nfev=100)
            self.calibration = fit.calibration
            if self.rest:
                sub = prep.enumeration.valid.select(np.asarray(self.rest))
                est = estimate_table(prep.model, prep.cluster, prep.workload, sub, calibration=fit.calibration,
                                     memory_headroom=prep.headroom, options=prep.options)
                order = np.argsort(-est.tokens_per_s_per_gpu, kind="stable")
                self.rest[:] = [self.rest[int(j)] for j in order]
            record.update(step_median_abs_error=(fit.step.median_abs_error if fit.step else None),
                          memory_median_abs_error=fit.memory_median_abs_error, constants=fit.calibration.to_dict(),
                          next=[prep.enumeration.valid.row(i).label for i in self.rest[:3]])
        except TunerError as e:
            record["error"] = str(e)
        self.fits_done += 1
        study.set_user_attr("recalibrations", [*study.user_attrs.get("recalibrations", []), record])
