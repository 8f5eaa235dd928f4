"""``tune rl calibrate --log FILE``: read the per-step timing a run printed and fit the per-cluster factors.

Formats read: NeMo-RL (``nemo_rl/algorithms/grpo.py`` at v0.6.0 5fb58893): a ``⏱️  Timing:`` block per step with
``  • Total step time: X.XXs`` and one ``  • <timer>: X.XXs (P%)`` line per timer, ``  • Mean Generation Length: X``
before it; slime (``train_metric_utils.py::log_perf_data`` at 624b824a): ``perf <rollout_id>: {...}`` with
``perf/<timer>_time`` values. Each factor is measured / predicted for the same plan, over the mean of the steps (the
first dropped as warm-up when there are more) (:func:`fit_from_measured`)."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rl.calibration import RLCalibration
from rl.plan import RLPlan
from specs.errors import TunerError
from specs.files import read_user_text

__all__ = ["MeasuredStep", "fit_from_measured", "mean_measured", "read_log"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredStep:
    """One step's timing from a log (seconds; None where the log has no such timer)."""

    step: int
    step_time_s: float
    generation_s: float | None
    logprob_s: float | None
    training_s: float | None
    refit_s: float | None
    switch_s: float | None
    mean_generation_len: float | None
    framework: str
    asynchronous: bool


_NEMO_TIMER = re.compile(r"^\s*•\s*([A-Za-z0-9_/\- ]+?):\s*([0-9.]+)s(?:\s*\([0-9.]+%\))?\s*$")
_NEMO_TIMER_LIKE = re.compile(r"^\s*•\s*([A-Za-z0-9_/\- ]+?):\s*(\S+?)s(?:\s*\(.*\))?\s*$")  # a timer line, any value
_NEMO_LEN = re.compile(r"Mean Generation Length:\s*([0-9.]+)")
_SLIME = re.compile(r"perf (\d+): (\{.*\})\s*$")


def _nemo(lines: list[str]) -> list[MeasuredStep]:
    steps: list[MeasuredStep] = []
    mean_len: float | None = None
    i = 0
    while i < len(lines):
        m = _NEMO_LEN.search(lines[i])
        if m:
            mean_len = float(m.group(1))
        if "Timing:" in lines[i] and "Validation" not in lines[i] and "Initialization" not in lines[i]:
            timers: dict[str, float] = {}
            i += 1
            while i < len(lines):
                t = _NEMO_TIMER.match(lines[i])
                if not t:
                    bad = _NEMO_TIMER_LIKE.match(lines[i])
                    if bad:  # e.g. "nan s" or "-5.00s": a step left out without a word before
                        raise TunerError(f"line {i + 1}: timer {bad.group(1).strip()!r} reads {bad.group(2)!r}, not a "
                                         "number of seconds (NeMo-RL writes '• NAME: 12.34s (5.6%)')")
                    break
                timers[t.group(1).strip()] = float(t.group(2))
                i += 1
            total = timers.get("Total step time")
            if total is not None:
                is_async = "exposed_generation" in timers and "generation" not in timers
                refit = timers.get("weight_sync", timers.get("prepare_for_generation/total"))
                steps.append(MeasuredStep(
                    step=len(steps) + 1, step_time_s=total,
                    generation_s=timers.get("generation", timers.get("exposed_generation")),
                    logprob_s=timers.get("policy_and_reference_logprobs"), training_s=timers.get("policy_training"),
                    refit_s=refit, switch_s=None, mean_generation_len=mean_len, framework="nemo-rl",
                    asynchronous=is_async,
                ))
            continue
        i += 1
    return steps


def _slime(lines: list[str]) -> list[MeasuredStep]:
    merged: dict[int, dict[str, float]] = {}
    for line in lines:
        m = _SLIME.search(line)
        if not m:
            continue
        try:
            d = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        if isinstance(d, dict):
            merged.setdefault(int(m.group(1)), {}).update({str(k): float(v) for k,
                                                           v in d.items() if isinstance(v, (int, float))})
    steps = []
    for rid in sorted(merged):
        d = merged[rid]

        def get(k: str, d: dict[str, float] = d) -> float | None:
            return d.get(f"perf/{k}")

        step = get("step_time")
        if step is None:
            continue
        lp = [v for v in (get("log_probs_time"), get("ref_log_probs_time")) if v is not None]
        sw = [v for v in (get("sleep_time"), get("wake_up_time")) if v is not None]
        steps.append(MeasuredStep(
            step=rid, step_time_s=step, generation_s=get("rollout_time"), logprob_s=sum(lp) if lp else None,
            training_s=get("actor_train_time"), refit_s=get("update_weights_time"), switch_s=sum(sw) if sw else None,
            mean_generation_len=d.get("rollout/response_len/mean"), framework="slime", asynchronous=False,
        ))
    return steps


def read_log(path: str | Path) -> list[MeasuredStep]:
    """Every step's timing in a NeMo-RL or slime log (format detected).

    Raises TunerError: an unreadable file, or one with no step timing in either format."""
    p = Path(path)
    lines = read_user_text(p, f"--log {str(p)!r}", "a NeMo-RL or slime log", errors="replace").splitlines()
    try:
        steps = _nemo(lines) or _slime(lines)
    except TunerError as e:
        raise TunerError(f"--log {str(p)!r}: {e}") from None
    if not steps:
        raise TunerError(
            f"--log {str(p)!r}: no step timing found; expected NeMo-RL's '⏱️  Timing:' blocks "
            "(nemo_rl/algorithms/grpo.py) or slime's 'perf N: {...}' lines (slime/observability/train_metric_utils.py)"
        )
    return steps


def mean_measured(steps: list[MeasuredStep]) -> dict[str, float | None]:
    """Mean of each part over the steps, the first dropped as warm-up when there are more than two."""
    use = steps[1:] if len(steps) > 2 else steps

    def mean(attr: str) -> float | None:
        vals = [getattr(s, attr) for s in use if getattr(s, attr) is not None]
        return float(np.mean(vals)) if vals else None

    return {k: mean(k) for k in ("step_time_s", "generation_s", "logprob_s", "training_s", "refit_s", "switch_s",
                                 "mean_generation_len")}


def fit_from_measured(plan: RLPlan, measured: dict[str, float | None], base: RLCalibration, *,
                      source: str) -> RLCalibration:
    """Factors that make ``plan`` (predicted under ``base``) reproduce the measured parts: the generation, training and
    log-prob scales become measured / predicted; the refit rate of the plan's path is scaled to its variable part;
    ``step_overhead_s`` takes the rest of a synchronous run's step. Parts the log lacks keep ``base``'s values.

    Raises TunerError: a plan or measurement with no step time."""
    p = plan.parts
    step = measured.get("step_time_s")
    if not step or step <= 0:
        raise TunerError("the log has no step time to calibrate on")
    ch: dict[str, float] = {}
    asynchronous = plan.choice.async_steps > 0
    g = measured.get("generation_s")
    if g and p.generation_s > 0 and not asynchronous:
        ch["generation_scale"] = base.generation_scale * g / p.generation_s
    t = measured.get("training_s")
    if t and p.training_s > 0:
        ch["training_scale"] = base.training_scale * t / p.training_s
    lp = measured.get("logprob_s")
    if lp and p.logprob_s > 0:
        ch["logprob_scale"] = base.logprob_scale * lp / p.logprob_s
    r = measured.get("refit_s")
    var_pred = p.refit_s - base.refit_fixed_s
    if r and r > base.refit_fixed_s and var_pred > 0:
        key = "refit_ipc_bytes_per_s" if plan.choice.colocated else "refit_nccl_bytes_per_s"
        ch[key] = getattr(base, key) * var_pred / (r - base.refit_fixed_s)
    if not asynchronous and all(measured.get(k) is not None for k in ("generation_s", "logprob_s", "training_s",
                                                                      "refit_s")):
        parts = sum(float(measured[k] or 0.0) for k in ("generation_s", "logprob_s", "training_s", "refit_s",
                                                        "switch_s"))
        ch["step_overhead_s"] = max(0.0, step - parts - (p.switch_s if measured.get("switch_s") is None
                                                         and plan.choice.colocated else 0.0))
    bad = {k: v for k, v in ch.items() if not math.isfinite(v) or v < 0}
    if bad:
        raise TunerError(f"calibration from the log gave unusable factors {bad}")
    return dataclasses.replace(base, **ch, source=source)
