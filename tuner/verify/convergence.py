"""Comparing two training-loss curves: Megatron-Bridge's convergence metrics, stricter about missing data.

Source: ``validate_convergence`` in NVIDIA-NeMo/Megatron-Bridge ``scripts/performance/utils/evaluate.py``
(067f987d), whose defaults are :class:`ConvergenceThresholds`'s:

- **correlation**: Pearson correlation of the two curves >= 0.95;
- **final_loss**: ``|candidate[-1] - reference[-1]| / reference[-1]`` <= 3%;
- **point_wise_tolerance**: ``|candidate - reference| / reference`` within 10% where the reference loss is above
  2.0, 5% in (0.5, 2.0], 2% at or below 0.5, at all but 10% of the steps;
- **outliers**: at most 10% of the steps' residuals over 3 standard deviations from their mean;
- ``skip_first_percent`` (default 0) drops the leading steps from these four.

Stricter than Bridge (where NaN compares false and passes): a NaN or Inf loss fails (**non_finite**), a step in one
curve only fails (**missing_steps**), and a flat curve has no correlation unless both curves are identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specs.errors import TunerError


@dataclass(frozen=True, kw_only=True, slots=True)
class ConvergenceThresholds:
    """Megatron-Bridge ``validate_convergence`` defaults (``convergence_config``; see the module docstring)."""

    correlation_threshold: float = 0.95
    high_loss_tolerance: float = 0.10
    medium_loss_tolerance: float = 0.05
    low_loss_tolerance: float = 0.02
    max_outlier_ratio: float = 0.10
    """Largest fraction of steps allowed out of the point-wise tolerance (and as 3-sigma outliers)."""
    final_loss_tolerance: float = 0.03
    outlier_threshold: float = 3.0
    """Outlier: |residual - mean residual| > this x the residuals' standard deviation."""
    skip_first_percent: float = 0.0
    """Percent of leading steps left out of the checks (0..100)."""

    def tolerance(self, reference_loss: float) -> float:
        """The point-wise relative tolerance for a step whose reference loss is ``reference_loss``."""
        if reference_loss > 2.0:
            return self.high_loss_tolerance
        if reference_loss > 0.5:
            return self.medium_loss_tolerance
        return self.low_loss_tolerance


@dataclass(frozen=True, kw_only=True, slots=True)
class ConvergenceResult:
    """The outcome of :func:`compare_losses`. ``failed_metrics`` names every check that failed."""

    passed: bool
    failed_metrics: tuple[str, ...]
    steps: int
    compared_steps: int
    """Steps in the union of both curves; those the four Bridge checks use (after ``skip_first_percent``)."""
    correlation: float
    final_loss_difference: float
    """Relative difference of the last common step's losses (fraction, not %)."""
    pointwise_failures: int
    pointwise_failure_ratio: float
    outliers: int
    outlier_ratio: float
    missing_steps: tuple[int, ...] = ()
    non_finite_steps: tuple[int, ...] = ()
    messages: tuple[str, ...] = ()
    """One line per failed check, with the values and the threshold."""
    thresholds: ConvergenceThresholds = field(default_factory=ConvergenceThresholds)

    @property
    def result(self) -> str:
        return "pass" if self.passed else "fail"

    def summary(self) -> str:
        """One line: passed, or which metrics failed and by how much."""
        if self.passed:
            return (f"passed: correlation {self.correlation:.7f}, final loss difference "
                    f"{self.final_loss_difference:.4f}, {self.pointwise_failures} point-wise failures, {self.outliers} "
                    f"outliers over {self.compared_steps} steps")
        return "failed " + ", ".join(self.failed_metrics) + ": " + "; ".join(self.messages)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "result": self.result}


def as_curve(values: Mapping[int, float] | Sequence[float], *, first_step: int = 1) -> dict[int, float]:
    """A loss curve as ``{step: loss}``; a sequence is numbered from ``first_step``."""
    items = values.items() if isinstance(values, Mapping) else enumerate(values, start=first_step)
    return {int(k): float(v) for k, v in items}


def compare_losses(candidate: Mapping[int, float] | Sequence[float], reference: Mapping[int, float] | Sequence[float],
                   thresholds: ConvergenceThresholds | None = None) -> ConvergenceResult:
    """Compare the losses of the layout under test with the reference's (each ``{step: loss}`` or a list from step
    1; ``thresholds`` default to Bridge's): ``failed_metrics`` among ``missing_steps``, ``non_finite``,
    ``correlation``, ``point_wise_tolerance``, ``final_loss``, ``outliers`` and ``too_few_steps`` (fewer than 2
    steps compare). Raises TunerError: both curves are empty."""
    th = thresholds or ConvergenceThresholds()
    cand, ref = as_curve(candidate), as_curve(reference)
    steps = sorted(set(cand) | set(ref))
    if not steps:
        raise TunerError("both loss curves are empty: nothing to compare")
    failed: list[str] = []
    msgs: list[str] = []
    missing = tuple(s for s in steps if s not in cand or s not in ref)
    if missing:
        failed.append("missing_steps")
        who = ["candidate" if s not in cand else "reference" for s in missing]
        listed = ", ".join(f"{s} in {w}" for s, w in list(zip(missing, who))[:5]) + (" ..." if len(missing) > 5 else "")
        msgs.append(f"{len(missing)} steps missing ({listed})")
    common = [s for s in steps if s in cand and s in ref]
    bad = tuple(s for s in common if not (math.isfinite(cand[s]) and math.isfinite(ref[s])))
    if bad:
        failed.append("non_finite")
        msgs.append(f"NaN or Inf loss at steps {list(bad[:5])}{' ...' if len(bad) > 5 else ''}")
    good = [s for s in common if s not in bad]
    skip = int(len(good) * th.skip_first_percent / 100.0)
    good = good[skip:]
    nan = float("nan")
    if len(good) < 2:
        failed.append("too_few_steps")
        msgs.append(f"{len(good)} comparable steps; need at least 2")
        m: dict[str, Any] = {"correlation": nan, "final_loss_difference": nan, "pointwise_failures": 0,
                             "pointwise_failure_ratio": nan, "outliers": 0, "outlier_ratio": nan}
    else:
        c = np.array([cand[s] for s in good], dtype=float)
        g = np.array([ref[s] for s in good], dtype=float)
        m, m_failed, m_msgs = _curve_metrics(c, g, good, th)
        failed += m_failed
        msgs += m_msgs
    return ConvergenceResult(passed=not failed, failed_metrics=tuple(failed), steps=len(steps),
                             compared_steps=len(good), missing_steps=missing, non_finite_steps=bad,
                             messages=tuple(msgs), thresholds=th, **m)


def _curve_metrics(c: np.ndarray, g: np.ndarray, good: Sequence[int],
                   th: ConvergenceThresholds) -> tuple[dict[str, Any], list[str], list[str]]:
    """Bridge's four metrics of the candidate ``c`` against the reference ``g`` (same steps ``good``, finite, >= 2):
    the values, the failed metrics' names and their messages."""
    failed: list[str] = []
    msgs: list[str] = []
    nan = float("nan")
    # correlation (Pearson, scale-free: computed on the curves divided by their largest magnitude so that
    # huge losses do not overflow); undefined for a flat curve
    scale = float(max(np.max(np.abs(c)), np.max(np.abs(g)), 1e-300))
    cs, gs = c / scale, g / scale
    if np.array_equal(c, g):
        corr = 1.0
    elif np.ptp(c) == 0 or np.ptp(g) == 0:
        corr = nan
    else:
        corr = float(np.corrcoef(cs, gs)[0, 1])
    if not (corr >= th.correlation_threshold):
        failed.append("correlation")
        msgs.append(f"correlation {corr:.4f} < {th.correlation_threshold}" if corr == corr else "correlation "
                    "undefined: one curve is flat")

    # point-wise relative tolerance, keyed on the reference value
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.abs(cs - gs) / np.abs(gs)
    rel = np.where(g == 0, np.where(c == 0, 0.0, np.inf), rel)
    tol = np.array([th.tolerance(x) for x in g])
    pw = int(np.sum(rel > tol))
    pw_ratio = pw / len(good)
    if pw_ratio > th.max_outlier_ratio:
        failed.append("point_wise_tolerance")
        worst = int(np.argmax(rel - tol))
        msgs.append(f"{pw} of {len(good)} steps out of tolerance ({pw_ratio:.0%} > {th.max_outlier_ratio:.0%}; worst "
                    f"step {good[worst]}: {c[worst]:.5g} vs {g[worst]:.5g}, {rel[worst]:.1%} > {tol[worst]:.0%})")

    # final loss
    fin = float(abs(cs[-1] - gs[-1]) / abs(gs[-1])) if gs[-1] != 0 else (0.0 if cs[-1] == 0 else float("inf"))
    if fin > th.final_loss_tolerance:
        failed.append("final_loss")
        msgs.append(f"final loss {c[-1]:.5g} vs {g[-1]:.5g} at step {good[-1]}: {fin:.2%} > "
                    f"{th.final_loss_tolerance:.0%}")

    # outliers of the residuals (scaled like the correlation)
    res = cs - gs
    sd = float(np.std(res))
    n_out = int(np.sum(np.abs(res - res.mean()) > th.outlier_threshold * sd)) if sd > 0 else 0
    out_ratio = n_out / len(good)
    if out_ratio > th.max_outlier_ratio:
        failed.append("outliers")
        msgs.append(f"{n_out} of {len(good)} steps are {th.outlier_threshold:g}-sigma outliers of the residual "
                    f"({out_ratio:.0%} > {th.max_outlier_ratio:.0%})")

    return ({"correlation": corr, "final_loss_difference": fin, "pointwise_failures": pw,
             "pointwise_failure_ratio": pw_ratio, "outliers": n_out, "outlier_ratio": out_ratio}, failed, msgs)
