"""The trial policy of real trials: which candidate to measure next, when to measure one again, and when to stop.

Belief. For every candidate ``i`` the log ratio ``y_i = log(true tokens/s/GPU / predicted)`` is a Gaussian
process whose prior mean is the error band's bias and whose covariance is

    k(i, j) = level^2 + s2 * (rho + (1 - rho) * prod_d c ** [i and j differ in dimension d])

``s2`` is the band's variance (:attr:`cost_model.uncertainty.Band.sigma` squared), ``rho`` the share of it every
layout of the job has in common, ``c`` the correlation kept per search dimension two layouts differ in, and
``level`` the spread of the error common to every layout on the user's own stack (the same configuration published
twice differs by up to 2x between container releases): the first measurement sets the level, the later ones the
ranking. A measurement of ``i`` is ``y_i + e``, ``e ~ N(0, run_sigma^2)`` (twice that for a pruned trial); each
updates every candidate's posterior (Rasmussen & Williams 2006, eq. 2.19, one observation at a time).

Choice. The next trial is the untried candidate with the highest expected improvement over the incumbent (the
measured layout of highest posterior mean; Jones et al. 1998), times its chance to fit in memory, per expected
GPU-hour (a failed fit costs its start-up and one step). When no untried candidate may beat the incumbent by more
than ``min_gain`` with probability ``1 - confidence``, measured layouts that may still do so are measured again
(fewer runs first); then the policy stops. It also stops when the next trial would overrun ``gpu_hours`` or
``max_trials``.

Slices (where the caller gives ``slice_step_time_s``, ``slice_gpus``, ``slice_sigma``). A slice trial runs a few
layers of one pipeline stage at the layout's TP / CP / EP / ETP on the fewest whole nodes that hold them. Its
``log(predicted / measured slice step time)`` observes ``y_i`` with noise ``sqrt(run_sigma^2 + slice_sigma_i^2)``,
``slice_sigma_i`` the error of what the slice does not run (pipeline bubble and point-to-point, data-parallel
gradients at full scale). Once an incumbent exists, the next step is the best per GPU-hour among a full trial and a
slice of each candidate that may beat it, by the augmented expected improvement of Huang et al. 2006 (J. Global
Optim. 34:441): expected improvement x ``alpha1`` (``sd / sqrt(sd^2 + slice_sigma^2)``; 1 for a full trial) x
``alpha2`` (``1 - noise / sqrt(sd^2 + slice_sigma^2 + noise^2)``); under ``gpu_hours``, only a slice that leaves the
budget for a full trial of its layout. A slice never measures memory, never becomes the incumbent and never ends the
search: the answer names a layout measured in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt


def ndtr(x: Any) -> Any:
    """``scipy.special.ndtr``, imported when first asked (the import costs the main job ~0.15 s)."""
    from scipy.special import ndtr as normal_cdf

    return normal_cdf(x)


def fmt_gpu_hours(x: float) -> str:
    """GPU-hours for a message: three significant digits under 100 (0.0123, 7.83), whole hours above (4,957)."""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"

Array = npt.NDArray[np.float64]

#: Standard deviation of one run's log throughput about its layout's mean: the run-to-run spread measured on one H200
#: over every repeated configuration of the TE sweeps (``tune validate --trials``,
#: ``benchmarks/results/h200_te_2026-12-04``).
RUN_SIGMA = 0.085


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyParams:
    """The policy's prior and rules; units: seconds, GPU-hours, fractions."""

    sigma: float
    """Standard deviation and mean (``bias``) of ``log(measured / predicted)`` tokens/s/GPU before any trial (the
    error band's)."""
    bias: float = 0.0
    shared: float = 0.58
    """``rho``: share of the band's variance common to every layout of the job: 1 - (0.102 / 0.158)^2, the held-out
    published residuals' spread within a (model, GPU, precision) group against their whole spread
    (``benchmarks/results/2026-12-07_error_bars/heldout_rows.jsonl``, 201 rows in 36 groups of 3 or more)."""
    level: float = 0.5
    per_dimension: float = 0.6
    """``level`` and ``c`` of the module docstring."""
    run_sigma: float = RUN_SIGMA
    memory_sigma: float = 0.03
    """Standard deviation and mean (``memory_bias``) of ``log(measured / predicted)`` peak memory."""
    memory_bias: float = 0.0
    memory_shared: float = 0.54
    """Share of the memory error's variance common to every layout of the job (the memory band's ``shared``,
    :attr:`cost_model.uncertainty.Band.shared`): a measured peak or an out-of-memory moves every candidate's chance
    to fit through it (:func:`cost_model.uncertainty.chance_to_fit`)."""
    confidence: float = 0.9
    min_gain: float = 0.02
    """The stopping rule: stop when nothing may beat the incumbent by more than ``min_gain`` at ``confidence``."""
    startup_s: float = 300.0
    """Seconds before a trial's first step (process start, model build, warm-up), until a trial measures it."""
    steps: int = 20
    max_runs: int = 3
    """Steps of a full trial; runs of one layout (the first and its repeats)."""
    gpu_hours: float | None = None
    max_trials: int = 48
    """Budget (None: none) and most trials (repeats included, slices not)."""
    slice_startup_s: float = 90.0
    """Seconds before a slice trial's first step (one or two nodes, a few layers to build): an assumption."""
    max_slices: int = 400


@dataclass(frozen=True, slots=True)
class Decision:
    """The policy's answer: measure candidate ``index`` (``repeat``: again; ``slice``: its slice), or stop (``index``
    None) and why."""

    index: int | None
    repeat: bool = False
    reason: str = ""
    slice: bool = False


@dataclass(slots=True)
class GainPolicy:
    """The policy over ``n`` candidates: their predicted tokens/s/GPU, step time (s) and peak memory per GPU (bytes),
    arrays of shape ``(n,)``, and ``codes`` in every search dimension, ``(n, d)``; ``hbm_bytes`` the GPU's memory,
    ``gpus`` a trial's. Slice trials (optional): each slice's predicted step time (s), GPUs, and the standard deviation
    of the log error of the step time its slice does not see."""

    predicted: Array
    step_time_s: Array
    peak_bytes: Array
    codes: npt.NDArray[np.int64]
    hbm_bytes: float
    gpus: int
    params: PolicyParams
    spent_gpu_hours: float = 0.0
    trials: int = 0
    """GPU-hours and trials observed (earlier runs' and other workers' included)."""
    run_trials: int = 0
    run_gpu_hours: float = 0.0
    """This run's own trials and GPU-hours (observed with ``own``): what ``max_trials`` and ``gpu_hours`` count."""
    slice_step_time_s: Array | None = None
    slice_gpus: Array | None = None
    slice_sigma: Array | None = None
    slices: int = 0
    runs: npt.NDArray[np.int64] = field(init=False)
    failed: npt.NDArray[np.bool_] = field(init=False)
    pending: npt.NDArray[np.bool_] = field(init=False)
    sliced: npt.NDArray[np.bool_] = field(init=False)
    p_fit: Array = field(init=False)
    """Each candidate's chance to fit in memory: before any trial P(predicted x exp(N(memory_bias, memory_sigma)) <=
    hbm_bytes), then given the measured peaks and out-of-memory failures
    (:func:`cost_model.uncertainty.chance_to_fit`)."""
    _peaks: dict[int, float] = field(init=False, default_factory=dict)
    _oom: set[int] = field(init=False, default_factory=set)
    _v: Array = field(init=False)
    """Rows ``L^-1 K(obs, ·)`` (``L``: the Cholesky factor of the observations' covariance), one per observation."""
    _a: list[float] = field(init=False, default_factory=list)
    """``L^-1 (values - bias)``."""
    _shift: Array = field(init=False)
    _reduce: Array = field(init=False)
    _startup: list[float] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.predicted)
        self.runs = np.zeros(n, dtype=np.int64)
        self.failed = np.zeros(n, dtype=bool)
        self.pending = np.zeros(n, dtype=bool)
        self.sliced = np.zeros(n, dtype=bool)
        self._v = np.zeros((0, n))
        self._shift, self._reduce = np.zeros(n), np.zeros(n)
        p = self.params
        self.p_fit = ndtr((np.log(self.hbm_bytes / np.maximum(self.peak_bytes, 1.0)) - p.memory_bias)
                          / max(p.memory_sigma, 1e-9))

    def _prior_cov(self, i: int) -> Array:
        p = self.params
        differ: npt.NDArray[np.int64] = (self.codes != self.codes[i]).sum(axis=1)
        out: Array = p.level**2 + p.sigma**2 * (p.shared
                                                + (1 - p.shared) * p.per_dimension ** differ.astype(np.float64))
        return out

    def posterior(self) -> tuple[Array, Array]:
        """Mean and standard deviation of ``y`` (log true / predicted) of every candidate."""
        p = self.params
        return p.bias + self._shift, np.sqrt(np.maximum(p.level**2 + p.sigma**2 - self._reduce, 1e-12))

    def _add(self, index: int, value: float, noise: float) -> None:
        """Condition the belief on ``value = y_index + N(0, noise^2)``: one more row of the Cholesky factor of the
        observations' covariance and of ``L^-1 K(obs, ·)`` (Rasmussen & Williams 2006, eq. 2.19, updated one
        observation at a time), so the posterior costs O(n) after it."""
        m = len(self._a)
        cov = self._prior_cov(index)
        lvec = self._v[:m, index]
        d = math.sqrt(max(float(cov[index]) + noise**2 - float(lvec @ lvec), 1e-12))
        row = (cov - lvec @ self._v[:m]) / d
        a = (value - self.params.bias - float(lvec @ np.asarray(self._a))) / d
        if m == len(self._v):
            self._v = np.concatenate([self._v, np.zeros((max(m, 8), len(cov)))])
        self._v[m] = row
        self._a.append(a)
        self._shift += row * a
        self._reduce += row * row

    def observe(self, index: int, tokens_per_s_per_gpu: float | None, *, gpu_hours: float,
                startup_s: float | None = None, pruned: bool = False, failed: bool = False,
                peak_bytes: float | None = None, out_of_memory: bool = False, own: bool = True) -> None:
        """Record a finished trial of candidate ``index``: its throughput (None when it failed), the GPU-hours it cost,
        (when measured) its start-up seconds and peak memory per GPU (bytes), and whether it ran out of memory. A
        pruned trial's few steps count for a fraction of a run. A peak or an out-of-memory updates every candidate's
        chance to fit. Every trial teaches the policy; only this run's own (``own``; not an earlier run's, nor
        another worker's on a shared storage) counts against ``max_trials`` and ``gpu_hours``."""
        self.pending[index] = False
        self.trials += 1
        self.spent_gpu_hours += gpu_hours
        if own:
            self.run_trials += 1
            self.run_gpu_hours += gpu_hours
        if startup_s is not None and math.isfinite(startup_s) and startup_s > 0:
            self._startup.append(startup_s)
        self._learn_memory(index, peak_bytes, out_of_memory)
        if failed or tokens_per_s_per_gpu is None or not tokens_per_s_per_gpu > 0:
            self.failed[index] = True
            return
        self.runs[index] += 1
        noise = self.params.run_sigma * (2.0 if pruned else 1.0)
        self._add(index, math.log(tokens_per_s_per_gpu / self.predicted[index]), noise)

    def _learn_memory(self, index: int, peak_bytes: float | None, out_of_memory: bool) -> None:
        if peak_bytes is not None and math.isfinite(peak_bytes) and peak_bytes > 0 and index not in self._peaks:
            self._peaks[index] = peak_bytes
        elif out_of_memory and index not in self._oom:
            self._oom.add(index)
        else:
            return
        from cost_model.uncertainty import chance_to_fit

        p = self.params
        self.p_fit = chance_to_fit(self.peak_bytes, self.hbm_bytes, sigma=max(p.memory_sigma, 1e-9),
                                   shared=p.memory_shared, bias=p.memory_bias, measured=self._peaks,
                                   out_of_memory=self._oom)

    def observe_slice(self, index: int, speed_ratio: float | None, *, gpu_hours: float, own: bool = True) -> None:
        """Record a finished slice trial of candidate ``index``: predicted / measured slice step time (None when it
        failed: nothing learnt, never sliced again) and the GPU-hours it cost (counted as in :meth:`observe`)."""
        assert self.slice_sigma is not None
        self.pending[index] = False
        self.sliced[index] = True
        self.slices += 1
        self.spent_gpu_hours += gpu_hours
        if own:
            self.run_gpu_hours += gpu_hours
        if speed_ratio is None or not speed_ratio > 0:
            return
        noise = math.hypot(self.params.run_sigma, float(self.slice_sigma[index]))
        self._add(index, math.log(speed_ratio), noise)

    def take(self, index: int) -> None:
        """Mark a candidate as being measured (so a parallel pick does not take it twice)."""
        self.pending[index] = True

    @property
    def startup_s(self) -> float:
        """Start-up seconds of a trial: the median measured, else the prior."""
        return float(np.median(self._startup)) if self._startup else self.params.startup_s

    def trial_gpu_hours(self, index: int | npt.NDArray[np.int64] | slice) -> Array:
        """Expected GPU-hours of a trial: a full one if the layout fits, else start-up and one step."""
        step = self.step_time_s[index]
        full = self.startup_s + self.params.steps * step
        oom = self.startup_s + step
        pf = self.p_fit[index]
        return np.asarray((pf * full + (1 - pf) * oom) * self.gpus / 3600.0)

    def slice_gpu_hours(self, index: int | npt.NDArray[np.int64] | slice) -> Array:
        """Expected GPU-hours of a slice trial: its start-up and steps at its GPUs (a slice is not expected to run out
        of memory: a few layers, the optimizer's states sharded its own way)."""
        assert self.slice_step_time_s is not None and self.slice_gpus is not None
        p = self.params
        return np.asarray((p.slice_startup_s + p.steps * self.slice_step_time_s[index]) * self.slice_gpus[index]
                          / 3600.0)

    def incumbent(self) -> int | None:
        """The measured candidate of highest posterior mean throughput (the answer so far)."""
        measured = np.flatnonzero(self.runs > 0)
        if not len(measured):
            return None
        mean, _ = self.posterior()
        return int(measured[np.argmax(self.predicted[measured] * np.exp(mean[measured]))])

    def _chance_to_beat(self, idx: npt.NDArray[np.int64] | slice, mean: Array, sd: Array, target: float) -> Array:
        """P(true throughput > target) of the candidates ``idx`` under their posterior (``mean``, ``sd``: of all)."""
        return np.asarray(ndtr((mean[idx] + np.log(self.predicted[idx]) - math.log(target)) / sd[idx]))

    def next(self, in_flight: int = 0) -> Decision:
        """What to do next (see the module docstring), with ``in_flight`` trials of this run picked and not yet
        observed (they count against ``max_trials``; a pick another worker runs instead does not)."""
        p = self.params
        if self.run_trials + in_flight >= p.max_trials:
            return Decision(None, reason=f"the {p.max_trials} trials allowed (--trials) are spent")
        mean, sd = self.posterior()
        open_ = (self.runs == 0) & ~self.failed & ~self.pending
        inc = self.incumbent()
        cost = self.trial_gpu_hours(slice(None))
        budget_left = math.inf if p.gpu_hours is None else p.gpu_hours - self.run_gpu_hours
        if inc is None:
            # nothing measured yet: the most promising by expected throughput and chance to fit, per GPU-hour
            value = self.predicted * np.exp(mean + sd**2 / 2) * self.p_fit / cost
        else:
            best = float(self.predicted[inc] * np.exp(mean[inc]))
            target = best * (1 + p.min_gain)
            may_beat = open_ & (self._chance_to_beat(slice(None), mean, sd, target) * self.p_fit >= 1 - p.confidence)
            if not may_beat.any():
                return self._repeat_or_stop(inc, mean, sd, budget_left)
            open_ = may_beat
            # expected improvement of a lognormal over ``best`` (closed form)
            mu = mean + np.log(self.predicted)
            d2 = (mu - math.log(best)) / sd
            ei = np.exp(mu + sd**2 / 2) * ndtr(d2 + sd) - best * ndtr(d2)
            value = ei * self.p_fit / cost
            if self.slice_sigma is not None and self.slices < p.max_slices:
                return self._full_or_slice(open_, ei, sd, cost, budget_left)
        affordable = open_ & (cost <= budget_left)
        if not affordable.any():
            if open_.any():
                return Decision(None, reason=self._budget_reason(float(cost[open_].min())))
            return Decision(None, reason="every candidate has been measured or has failed")
        pick = int(np.flatnonzero(affordable)[np.argmax(value[affordable])])
        return Decision(pick)

    def _full_or_slice(self, open_: npt.NDArray[np.bool_], ei: Array, sd: Array, cost: Array,
                       budget_left: float) -> Decision:
        """The best by augmented expected improvement per GPU-hour among a full trial and a slice of each candidate
        that may beat the incumbent (see the module docstring)."""
        assert self.slice_sigma is not None
        run = self.params.run_sigma
        full = ei * self.p_fit * (1 - run / np.sqrt(sd**2 + run**2)) / cost
        full_ok = open_ & (cost <= budget_left)
        s_cost = self.slice_gpu_hours(slice(None))
        u2 = self.slice_sigma**2
        part = ei * self.p_fit * (sd / np.sqrt(sd**2 + u2)) * (1 - run / np.sqrt(sd**2 + u2 + run**2))
        # a slice is worth something if a full trial can follow
        cut = open_ & ~self.sliced & (s_cost + cost <= budget_left)
        if not full_ok.any() and not cut.any():
            if open_.any():
                return Decision(None, reason=self._budget_reason(float(min(cost[open_].min(), s_cost[open_].min()))))
            return Decision(None, reason="every candidate has been measured or has failed")
        best_full = int(np.flatnonzero(full_ok)[np.argmax(full[full_ok])]) if full_ok.any() else None
        best_cut = int(np.flatnonzero(cut)[np.argmax(part[cut] / s_cost[cut])]) if cut.any() else None
        if best_cut is not None and (best_full is None or part[best_cut] / s_cost[best_cut] > full[best_full]):
            return Decision(best_cut, slice=True)
        assert best_full is not None
        return Decision(best_full)

    def _repeat_or_stop(self, inc: int, mean: Array, sd: Array, budget_left: float) -> Decision:
        p = self.params
        best = float(self.predicted[inc] * np.exp(mean[inc]))
        measured = np.flatnonzero((self.runs > 0) & (self.runs < p.max_runs) & ~self.pending)
        rivals = [int(j) for j in measured if j != inc]
        if rivals:
            beat = self._chance_to_beat(np.asarray(rivals), mean, sd, best * (1 + p.min_gain))
            close = [j for j, b in zip(rivals, beat) if b >= 1 - p.confidence]
            if close:
                j = max(close, key=lambda r: float(self.predicted[r] * np.exp(mean[r])))
                pick = j if self.runs[j] <= self.runs[inc] or self.runs[inc] >= p.max_runs else inc
                if float(self.trial_gpu_hours(pick)) <= budget_left:
                    return Decision(pick, repeat=True)
                return Decision(None, reason=self._budget_reason(float(self.trial_gpu_hours(pick))))
        return Decision(None, reason=f"no untried layout may beat the best by more than {p.min_gain:.0%} "
                                     f"at {p.confidence:.0%} confidence")

    def _budget_reason(self, cheapest: float) -> str:
        return (f"the GPU-hour budget is spent ({fmt_gpu_hours(self.run_gpu_hours)} of "
                f"{fmt_gpu_hours(self.params.gpu_hours or 0.0)}; the cheapest trial left costs "
                f"{fmt_gpu_hours(cheapest)})")
