"""Error bars of the analytical model: 90% intervals of throughput and peak memory per GPU, as multipliers ``[low,
high]`` of the prediction from ``cost_model/data/error_bars.yaml`` (``benchmarks/fit_error_bars.py``).

Throughput: the split-conformal 5% and 95% quantiles of measured / predicted over runs the model was not fitted on (Lei
et al., JASA 2018), by family (dense / MoE, bf16 / fp8), a small family widened towards the pooled spread. Peak memory:
the high end from real trials' measured peaks; the low end the smallest ``HBM / predicted`` of published runs that ran.
Method and coverage: ``docs/error_bars.md``, data ``benchmarks/results/2026-12-07_error_bars/``."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from specs import GPUSpec, ModelSpec, Precision

ERROR_BARS_FILE = Path(__file__).resolve().parent / "data" / "error_bars.yaml"

#: z of the two-sided 90% interval of a normal distribution: converts an interval on log scale to its sigma.
Z90 = 1.6448536269514722

#: Lognormal sigma of the model's error between two layouts of one model on one machine, net of run-to-run noise
#: (``benchmarks/results/2026-12-07_search_simulated/trial_spread.json``: 73 H200 trial rows in 6 model groups, by
#: ``benchmarks/trial_spread.py``). The job's shared error cancels in a ratio of two of its layouts; this does not.
BETWEEN_LAYOUTS_SIGMA = 0.0628


def ratio_within_error() -> float:
    """The predicted gain of one layout over another of the same job below which the two are within the model's 90%
    error on their ratio: ``exp(Z90 sqrt(2) BETWEEN_LAYOUTS_SIGMA) - 1`` (about 0.157)."""
    return math.expm1(Z90 * math.sqrt(2) * BETWEEN_LAYOUTS_SIGMA)


@dataclass(frozen=True, kw_only=True, slots=True)
class Band:
    """A 90% interval as multipliers of the prediction (measured / predicted at the 5th and 95th percentile)."""

    low: float
    high: float
    rows: int = 0
    """Measurements it was read from."""
    spread: float | None = None
    """Standard deviation of ``log(measured / predicted)`` where it is known apart from the band (memory: the real
    trials' own spread, narrower than a band whose low end is the "surely does not fit" bound); None = from the band."""
    shared: float | None = None
    """Share of the variance of ``log(measured / predicted)`` common to every layout of one job (memory: from the real
    trials grouped by model and precision; what :func:`chance_to_fit` learns from one layout about the others)."""

    @property
    def sigma(self) -> float:
        """Standard deviation of ``log(measured / predicted)`` (for the trial policy): :attr:`spread`, else the
        band's width as a normal's on log scale."""
        if self.spread is not None:
            return self.spread
        return (math.log(self.high) - math.log(self.low)) / (2 * Z90)

    @property
    def mu(self) -> float:
        """The band's centre on log scale: the model's bias (0 = unbiased)."""
        return (math.log(self.high) + math.log(self.low)) / 2


@dataclass(frozen=True, kw_only=True, slots=True)
class ErrorBars:
    """The intervals that apply to one model on one GPU at one precision."""

    family: str
    throughput: Band
    memory: Band

    def throughput_interval(self, tokens_per_s_per_gpu: Any) -> tuple[Any, Any]:
        """(low, high) tokens/s/GPU of a prediction (a float or an array)."""
        return tokens_per_s_per_gpu * self.throughput.low, tokens_per_s_per_gpu * self.throughput.high

    def memory_interval(self, peak_bytes: Any) -> tuple[Any, Any]:
        """(low, high) peak bytes per GPU of a prediction (a float or an array)."""
        return peak_bytes * self.memory.low, peak_bytes * self.memory.high

    def fit_verdict(self, peak_bytes: float, hbm_bytes: float) -> str:
        """``fits`` (even the high end of the memory interval fits), ``does not fit`` (not even the low end) or
        ``may not fit``, for a predicted peak (bytes per GPU) on a GPU of ``hbm_bytes``."""
        lo, hi = self.memory_interval(peak_bytes)
        return "fits" if hi <= hbm_bytes else "does not fit" if lo > hbm_bytes else "may not fit"

    def surely_over(self, peak_bytes: npt.NDArray[np.float64], hbm_bytes: float) -> npt.NDArray[np.bool_]:
        """Layouts that do not fit even at the low end of their memory interval."""
        return peak_bytes * self.memory.low > hbm_bytes

    @property
    def headroom(self) -> float:
        """The fraction of HBM a layout must leave free to fit even at the high end of its memory interval."""
        return 1.0 - 1.0 / self.memory.high

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "level": 0.9,
                "throughput": {"low": self.throughput.low, "high": self.throughput.high, "rows": self.throughput.rows},
                "memory": {"low": self.memory.low, "high": self.memory.high, "rows": self.memory.rows}}


def family_of(model: ModelSpec, gpu: GPUSpec, precision: Precision | str) -> tuple[str, ...]:
    """The family keys of a job, most specific first: ``moe-fp8-blackwell``, ``moe-fp8``, ``moe``."""
    arch = "moe" if model.num_experts else "dense"
    prec = "bf16" if str(getattr(precision, "value", precision)).lower() == "bf16" else "fp8"
    return (f"{arch}-{prec}-{gpu.family}", f"{arch}-{prec}", arch)


def _band(d: dict[str, Any]) -> Band:
    spread, shared = d.get("sigma"), d.get("shared")
    return Band(low=float(d["low"]), high=float(d["high"]), rows=int(d.get("rows", 0)),
                spread=None if spread is None else float(spread), shared=None if shared is None else float(shared))


@cache
def load_error_bars(path: Path = ERROR_BARS_FILE) -> tuple[dict[str, Band], dict[str, Band]]:
    """The throughput and memory bands of every family in ``path`` (each section has an ``all`` family)."""
    d = yaml.safe_load(path.read_text(encoding="utf-8"))
    return ({str(k): _band(v) for k, v in d["throughput"].items()},
            {str(k): _band(v) for k, v in d["memory"].items()})


def error_bars(model: ModelSpec, gpu: GPUSpec, precision: Precision | str, path: Path = ERROR_BARS_FILE) -> ErrorBars:
    """The error bars of a job: for each quantity, the most specific family the file has, else ``all``."""
    tput, mem = load_error_bars(path)
    keys = family_of(model, gpu, precision)
    t_key = next((k for k in keys if k in tput), "all")
    m_key = next((k for k in keys if k in mem), "all")
    return ErrorBars(family=t_key, throughput=tput[t_key], memory=mem[m_key])


def memory_headroom(model: ModelSpec, gpu: GPUSpec, precision: Precision | str, given: float | None) -> float:
    """The fraction of HBM kept free: ``given`` (``--memory-headroom``), else the error bars'
    (:attr:`ErrorBars.headroom`)."""
    return given if given is not None else error_bars(model, gpu, precision).headroom


#: Points of the grids :func:`chance_to_fit` integrates on (the job's shared error, and the margin ``log(HBM /
#: predicted)``).
_GRID = 1001


def chance_to_fit(peak_bytes: npt.NDArray[np.float64], hbm_bytes: float, *, sigma: float, shared: float,
                  bias: float = 0.0,
                  measured: Mapping[int, float] | None = None,
                  out_of_memory: Collection[int] = ()) -> npt.NDArray[np.float64]:
    """Each layout's chance to fit the GPU, shape ``(n,)``, given the measured peaks (bytes per GPU by index) and the
    out-of-memory failures of those tried.

    Model: ``z_i = log(true peak / predicted peak) = b + u_i``, ``b ~ N(bias, shared sigma^2)`` common to the job's
    layouts and ``u_i ~ N(0, (1 - shared) sigma^2)`` the layout's own. A measured peak is ``z_i``; an out-of-memory says
    ``z_i > t_i = log(hbm_bytes / peak_i)`` (censored). The posterior of ``b`` (normal likelihoods and ``Phi((b - t_j) /
    s)`` per out-of-memory, on a grid) gives ``E[Phi((t_i - b) / s)]``; with nothing observed that is ``Phi((t_i - bias)
    / sigma)``, the prior of :class:`tuner.study.policy.GainPolicy`'s ``p_fit``. A layout measured is 1; one out of
    memory is 0."""
    from scipy.special import log_ndtr, ndtr

    peak = np.maximum(np.asarray(peak_bytes, dtype=float), 1.0)
    measured = dict(measured or {})
    oom = sorted(set(out_of_memory) - set(measured))
    t = np.log(hbm_bytes / peak)
    tau, s = sigma * math.sqrt(shared), max(sigma * math.sqrt(1 - shared), 1e-9 * sigma)
    if tau == 0 or not (measured or oom):
        out = np.asarray(ndtr((t - bias) / sigma), dtype=float)
    else:
        # the measured peaks' normal posterior of b (conjugate), then the out-of-memory likelihoods on a grid
        idx = np.fromiter(measured, dtype=np.int64, count=len(measured))
        z = np.log(np.fromiter(measured.values(), dtype=float, count=len(measured)) / peak[idx])
        prec = 1 / tau**2 + len(z) / s**2
        m0, sd0 = (bias / tau**2 + z.sum() / s**2) / prec, prec**-0.5
        lo, hi = m0 - 8 * sd0, max(m0 + 8 * sd0, float(t[oom].max()) + 8 * s if oom else -math.inf)
        b = np.linspace(lo, hi, _GRID)
        logw = -0.5 * ((b - m0) / sd0) ** 2
        for j in oom:
            logw = logw + log_ndtr((b - t[j]) / s)
        w = np.exp(logw - logw.max())
        w /= w.sum()
        # the chance to fit as a function of the margin t, on a grid wide enough to reach 0 and 1, read per layout
        tg = np.linspace(lo - 8 * s, hi + 8 * s, _GRID)
        fit_at = np.asarray(ndtr((tg[:, None] - b[None, :]) / s), dtype=float) @ w
        out = np.interp(t, tg, fit_at)
    out[oom] = 0.0
    out[list(measured)] = 1.0
    return out
