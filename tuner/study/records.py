"""What a study records on each trial (:class:`TrialRecord`: Optuna user attributes, one per field, under the
field's name) and the reads built on it (:func:`trial_rows`, :func:`is_settled`, :func:`claimed_elsewhere`)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import optuna
from optuna.trial import FrozenTrial, TrialState

from cost_model.flops import mfu
from cost_model.types import Estimate
from cost_model.uncertainty import Band
from launch import Measurement, TrialFailed, TrialStopped
from specs import Cluster, ModelSpec
from specs.errors import TunerError
from specs.layout import Layout
from tuner.study import _optuna

__all__ = ["SUMMARY_FIELDS", "RunFailure", "TrialRecord", "TrialRow", "best_measured", "claimed_elsewhere",
           "is_settled", "retried_numbers", "summary_of", "trial_rows"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """The user attributes of one trial; None = not recorded. Each field is stored under its own name."""

    key: str | None = None
    """:meth:`Layout.key` of the trial's layout (a layout is evaluated once per study)."""
    enqueued: str | None = None
    """Why the layout was queued (predicted front, fastest predicted, ...); None for a sampled one."""
    repeat_of: int | None = None
    """A confirmation run (``--confirm-runs``) of this trial number's layout."""
    result: dict[str, Any] | None = None
    """The evaluation (:func:`result_of`): layout, source, tokens/s/GPU, memory (GiB), prediction, measured steps."""
    failure: dict[str, Any] | None = None
    """A real trial that ran out of memory, timed out or crashed (:func:`failure_of`)."""
    pruned: dict[str, Any] | None = None
    """A real trial the pruner stopped early (:func:`pruned_of`)."""
    skipped: str | None = None
    """Why this proposal was not evaluated (breaks a rule, does not fit, evaluated before, ...): it costs no budget."""
    interrupted: str | None = None
    """Cut off (Ctrl-C, or left RUNNING by a run or worker that stopped): its layout is evaluated again."""
    error: str | None = None
    """An unexpected error of the backend (a bug): the layout is not retried."""
    retried: str | None = None
    """This trial runs again the layout of a trial whose worker stopped sending heartbeats (and which was failed)."""
    intermediate_tokens_per_s_per_gpu: list[float] | None = None
    """Throughput of each step a real trial reported so far (tokens/s/GPU, warm-up included)."""
    gpu_hours: float | None = None
    """GPU-hours the trial cost: its wall time (start-up included) times the cluster's GPUs."""
    # flat copies of the outcome's, for Optuna's dashboard (:func:`summary_of`)
    label: str | None = None
    source: str | None = None
    tokens_per_s_per_gpu: float | None = None
    peak_gib: float | None = None

    @classmethod
    def of(cls, trial: FrozenTrial | optuna.Trial | Mapping[str, Any]) -> TrialRecord:
        """The record of a trial (or of its user attributes); attributes this class does not declare are ignored."""
        attrs = trial if isinstance(trial, Mapping) else trial.user_attrs
        return cls(**{f: attrs[f] for f in _FIELDS if f in attrs})

    def attrs(self) -> dict[str, Any]:
        """The recorded fields as user attributes (for a trial written in one go)."""
        return {f: getattr(self, f) for f in _FIELDS if getattr(self, f) is not None}

    @staticmethod
    def write(trial: optuna.Trial, **fields: Any) -> None:
        """Record ``fields`` on a running trial, one storage write each (TypeError: a name of no field)."""
        bad = set(fields) - set(_FIELDS)
        if bad:
            raise TypeError(f"not TrialRecord fields: {sorted(bad)}")
        for k, v in fields.items():
            trial.set_user_attr(k, v)


_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord))


#: The record fields :func:`summary_of` copies out of a result (flat, for Optuna's dashboard).
SUMMARY_FIELDS = ("label", "source", "tokens_per_s_per_gpu", "peak_gib")


def summary_of(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar :data:`SUMMARY_FIELDS` of an outcome dict, as :class:`TrialRecord` fields."""
    return {k: outcome[k] for k in SUMMARY_FIELDS
            if isinstance(outcome.get(k), (str, int, float)) and not isinstance(outcome.get(k), bool)}


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def prediction_of(pred: Estimate) -> dict[str, float]:
    """The single-layout prediction as a record stores it (tokens/s/GPU, GiB, seconds)."""
    return {"pred_tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu, "pred_peak_gib": _gib(pred.peak_bytes),
            "pred_step_time_s": pred.step_time_s}


def result_of(layout: Layout, m: Measurement, pred: Estimate, *, model: ModelSpec, cluster: Cluster,
              task: str = "pretrain") -> dict[str, Any]:
    """A trial's ``result``: what the backend reported and what was predicted. Units: tokens/s/GPU, GiB per GPU,
    seconds (median step), MFU as a fraction (:func:`cost_model.flops.mfu`), US$ per 1M tokens."""
    gpu = cluster.gpu
    tps = m.tokens_per_s_per_gpu
    res: dict[str, Any] = {
        "layout": layout.to_dict(), "label": layout.label, "source": m.source, "tokens_per_s_per_gpu": tps,
        "peak_gib": _gib(m.peak_bytes), "headroom_gib": _gib(gpu.hbm_bytes - m.peak_bytes),
        "step_time_s": statistics.median(map(float, m.step_times_s)) if m.step_times_s else float("nan"),
        "mfu": mfu(model, tps, gpu.peak_flops_bf16, task),
        "usd_per_million_tokens": cluster.usd_per_gpu_hour / (tps * 3600) * 1e6, **prediction_of(pred),
        "pred_model_tflops_per_gpu": pred.model_tflops_per_gpu,
    }
    if m.source == "measured":
        res.update(step_times_s=[float(x) for x in m.step_times_s], losses=[float(x) for x in m.losses],
                   peak_allocated_gib=_gib(float(m.extra.get("peak_allocated_bytes", float("nan")))),
                   step_time_cv=m.extra.get("step_time_cv"), wall_s=m.extra.get("wall_s"), log_path=m.log_path,
                   notes=m.extra.get("notes", []))
    return res


def implausible(result: Mapping[str, Any], band: Band | None = None) -> str | None:
    """Why a measured ``result`` cannot be right (the run did less work per step than the study assumes), or None:
    MFU above 100%, or measured / predicted above ``high * high / low`` of the throughput ``band`` (about 4.9
    standard deviations on its log-normal reading, ``cost_model.uncertainty``; None: MFU only)."""
    if result.get("source") != "measured":
        return None
    ask = "does the launch template pass {global_batch_size} and {seq_length}?"
    mfu_ = result.get("mfu")
    if isinstance(mfu_, float) and mfu_ > 1.0:
        return (f"measured MFU {mfu_:.0%} is above 100% of the GPU's peak, so the run did less work per step than the "
                f"study's batch and sequence: {ask}")
    tps, pred = result.get("tokens_per_s_per_gpu"), result.get("pred_tokens_per_s_per_gpu")
    if band is not None and isinstance(tps, float) and isinstance(pred, float) and pred > 0:
        ratio, floor = tps / pred, band.high * band.high / band.low
        if ratio > floor:
            return (f"measured throughput is {ratio:.2f} x the prediction, past the model's fastest step "
                    f"({band.high:.2f} x) by more than its error bar (over {floor:.2f} x), so the run likely did less "
                    f"work per step than the study's batch and sequence: {ask}")
    return None


def failure_of(layout: Layout, e: TrialFailed, prediction: Mapping[str, float]) -> dict[str, Any]:
    """A failed trial's ``failure``: kind, message, log, layout, prediction, memory reached."""
    fail: dict[str, Any] = {"kind": e.kind.value, "message": str(e), "log_path": e.log_path, "layout": layout.to_dict(),
                            "label": layout.label, **prediction}
    if not math.isnan(e.memory_reached_bytes):
        fail["memory_reached_gib"] = _gib(e.memory_reached_bytes)
    return fail


def pruned_of(layout: Layout, e: TrialStopped, prediction: Mapping[str, float]) -> dict[str, Any]:
    """A pruned trial's ``pruned``: the pruner's reason, the steps measured before it stopped, the prediction."""
    return {
        "reason": e.reason, "layout": layout.to_dict(), "label": layout.label, "log_path": e.log_path,
        "step_times_s": list(e.step_times_s), "tokens_per_s_per_gpu": list(e.tokens_per_s_per_gpu), **prediction,
    }


def retried_numbers(trials: Iterable[FrozenTrial]) -> set[int]:
    """Numbers of the trials a heartbeat-stale retry runs again (Optuna's ``RetryHeartbeatStaleTrialCallback``)."""
    out: set[int] = set()
    for t in trials:
        out.update(_optuna.retry_history(t))
    return out


def is_settled(t: FrozenTrial, retried: Collection[int] = ()) -> bool:
    """The trial's layout has an outcome: finished, and not an ``interrupted`` or retried FAIL."""
    if not t.state.is_finished():
        return False
    return not (t.state == TrialState.FAIL and (TrialRecord.of(t).interrupted or t.number in retried))


def evaluated_keys(trials: Sequence[FrozenTrial]) -> set[str]:
    """Layouts the study has an outcome for (not a trial skipped as a duplicate)."""
    retried = retried_numbers(trials)
    out = set()
    for t in trials:
        r = TrialRecord.of(t)
        if r.key is not None and is_settled(t, retried) and not str(r.skipped or "").startswith("duplicate"):
            out.add(r.key)
    return out


def claimed_elsewhere(trials: Sequence[FrozenTrial], trial_id: int | None, key: str, *,
                      stale_before: datetime.datetime | None = None) -> bool:
    """Another trial than ``trial_id`` (Optuna's ``_trial_id``, not the number: PostgreSQL can give two trials one
    number) has this layout, settled or RUNNING since ``stale_before``. Called after the trial's own key is written,
    so of two workers picking a layout at once at least one yields."""
    retried = retried_numbers(trials)
    for t in trials:
        if t._trial_id == trial_id:
            continue
        r = TrialRecord.of(t)
        if r.key != key or r.skipped is not None:
            continue
        if is_settled(t, retried):
            return True
        fresh = stale_before is None or t.datetime_start is None or t.datetime_start >= stale_before
        if t.state == TrialState.RUNNING and fresh:
            return True
    return False


def best_measured(trials: Iterable[FrozenTrial]) -> float | None:
    """Highest measured tokens/s/GPU of the COMPLETE trials but confirmation runs, or None."""
    best = None
    for t in trials:
        if t.state != TrialState.COMPLETE:
            continue
        r = TrialRecord.of(t)
        res = r.result or {}
        if res.get("source") == "measured" and r.repeat_of is None:
            v = float(res.get("tokens_per_s_per_gpu", 0.0))
            best = v if best is None or v > best else best
    return best


class RunFailure(NamedTuple):
    """A failed confirmation run: its trial, kind (``oom``, ...) and the memory it reached (GiB)."""

    trial: int
    kind: str | None
    memory_reached_gib: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRow:
    """A finished trial of a study (:func:`trial_rows`), in :func:`result_of`'s units."""

    trial: int
    layout: Layout
    tokens_per_s_per_gpu: float
    peak_gib: float
    key: str = ""
    source: str = "predicted"
    headroom_gib: float = math.nan
    step_time_s: float = math.nan
    mfu: float = math.nan
    usd_per_million_tokens: float = math.nan
    pred_tokens_per_s_per_gpu: float = math.nan
    pred_peak_gib: float = math.nan
    step_times_s: tuple[float, ...] = ()
    log_path: str = ""
    notes: tuple[str, ...] = ()
    runs: int = 1
    runs_tokens_per_s_per_gpu: tuple[float, ...] = ()
    runs_failed: tuple[RunFailure, ...] = ()

    @classmethod
    def of(cls, trial: int, key: str, result: Mapping[str, Any] | None) -> TrialRow | None:
        """The row of trial ``trial``'s ``result``; None without a layout, throughput or peak."""
        if not result or not {"layout", "tokens_per_s_per_gpu", "peak_gib"} <= result.keys():
            return None
        kw: dict[str, Any] = {f: float(result[f]) for f in _NUMBERS if result.get(f) is not None}
        kw.update({f: tuple(v) for f in ("step_times_s", "notes") if isinstance(v := result.get(f), list)})
        return cls(trial=trial, key=key, layout=Layout.from_dict(result["layout"]),
                   source=str(result.get("source", "predicted")), log_path=str(result.get("log_path") or ""), **kw)

    def measurement(self) -> Measurement | None:
        """The :class:`launch.Measurement` of a measured row, or None for a predicted one."""
        if self.source != "measured":
            return None
        return Measurement(layout=self.layout, source="measured", tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
                           peak_bytes=self.peak_gib * 2**30, step_times_s=self.step_times_s, log_path=self.log_path)


#: The :class:`TrialRow` fields :meth:`TrialRow.of` reads from a result as numbers.
_NUMBERS = ("tokens_per_s_per_gpu", "peak_gib", "headroom_gib", "step_time_s", "mfu", "usd_per_million_tokens",
            "pred_tokens_per_s_per_gpu", "pred_peak_gib")


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    """Finished trials as rows, confirmation runs folded into the trial they repeat."""
    rows: list[TrialRow] = []
    repeats: dict[int, list[TrialRow]] = {}
    failed: dict[int, list[RunFailure]] = {}
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.of(t)
        if t.state == TrialState.FAIL and r.repeat_of is not None and r.failure is not None:
            f = r.failure
            failed.setdefault(int(r.repeat_of), []).append(RunFailure(t.number, f.get("kind"),
                                                                      f.get("memory_reached_gib")))
            continue
        try:
            row = TrialRow.of(t.number, r.key or "", r.result) if t.state == TrialState.COMPLETE else None
        except (TunerError, TypeError, ValueError) as e:
            raise TunerError(f"study {study.study_name!r}, trial {t.number}: its result cannot be read ({e})") from None
        if row is not None:
            (rows if r.repeat_of is None else repeats.setdefault(int(r.repeat_of), [])).append(row)
    return [_folded(row, repeats.get(row.trial, []), failed.get(row.trial, [])) for row in rows]


def _folded(row: TrialRow, more: list[TrialRow], failed: list[RunFailure]) -> TrialRow:
    """``row`` with its confirmation runs ``more`` and the failed ones (:func:`trial_rows`)."""
    if not more:
        return dataclasses.replace(row, runs_failed=tuple(failed)) if failed else row
    runs = [row, *more]
    tps = tuple(x.tokens_per_s_per_gpu for x in runs)
    mean = len(tps) / sum(1.0 / x for x in tps)
    first = row.tokens_per_s_per_gpu
    return dataclasses.replace(
        row, runs_failed=tuple(failed), runs=len(runs), runs_tokens_per_s_per_gpu=tps, tokens_per_s_per_gpu=mean,
        step_time_s=sum(x.step_time_s for x in runs) / len(runs), peak_gib=max(x.peak_gib for x in runs),
        headroom_gib=min(x.headroom_gib for x in runs), mfu=row.mfu * mean / first,
        usd_per_million_tokens=row.usd_per_million_tokens * first / mean)
