"""``tune validate --trials``: predict the rows a real-trial sweep measured (JSON lines of
:mod:`launch.harness.sweep` or ``benchmarks/h200_te.py``) and compare. Each row is predicted as the harness ran it
(model slice, GPUs, workload, :func:`launch.harness.spec.harness_layout`, the run options its stack recorded), with
its stack's calibration: the shipped one with TE, :data:`NO_TE_CALIBRATION_FILE` without (``docs/measurements.md``),
unless ``--calibration`` names one for all.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cost_model.calibration import Calibration, load_calibration
from cost_model.estimate import estimate
from cost_model.validate import spearman
from launch.harness.spec import HarnessEnv, harness_layout, override_model
from specs import (
    HARNESS_RUN_OPTIONS,
    HARNESS_TE_RUN_OPTIONS,
    ModelSpec,
    Precision,
    RunOptions,
    Workload,
    list_models,
    load_model,
    parse_gpus,
)
from specs.errors import InfeasibleLayout, TunerError, enum_member
from specs.files import RepeatedKey, read_user_text, unique_keys
from specs.layout import Layout
from specs.model import slice_model
from tuner.report import _positive as _pos
from tuner.report import pooled_spread

__all__ = ["NO_TE_CALIBRATION_FILE", "SweepRow", "TrialPrediction", "json_lines", "predict_trials", "read_trials",
           "run_spread", "summarize_trials"]

#: Constants of the no-TE trial harness (megatron-core's local spec, SequentialMLP experts): fitted by
#: ``benchmarks/bench_trial_calibration.py --fit-data <1- and 2-GPU sweeps> --out ...`` (docs/measurements.md).
NO_TE_CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "calibration_harness_no_te.yaml"

_MODEL_FIELD = re.compile(r"\s*(?P<name>[^\[]+?)\s*(?:\[(?P<layers>\d+) layers?\])?\s*")


@dataclass(slots=True)
class SweepRow:
    """One finished row of a sweep file, ready to predict."""

    source: str
    """``FILE:LINE``."""
    label: str
    model: ModelSpec
    gpus: str
    workload: Workload
    layout: Layout
    options: RunOptions
    transformer_engine: bool
    step_time_s: float
    peak_reserved_gib: float
    peak_allocated_gib: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrialPrediction:
    """A row and its prediction (step time, peak memory against the reserved peak)."""

    row: SweepRow
    step_time_s: float
    peak_gib: float
    calibration: str

    @property
    def step_error(self) -> float:
        """predicted / measured - 1."""
        return self.step_time_s / self.row.step_time_s - 1.0

    @property
    def memory_error(self) -> float:
        """predicted peak / measured peak reserved - 1."""
        return self.peak_gib / self.row.peak_reserved_gib - 1.0


def _model(field_value: str, where: str) -> ModelSpec:
    m = _MODEL_FIELD.fullmatch(field_value or "")
    name = m["name"] if m else ""
    if not m or name not in list_models():
        raise TunerError(
            f"{where}: model {field_value!r} is not a bundled model or a slice of one (NAME or NAME[N layers]; known: "
            f"{', '.join(list_models())}); is this a row of launch.harness.sweep?"
        )
    layers = int(m["layers"]) if m["layers"] else None
    try:
        return slice_model(load_model(name), layers)
    except TunerError:
        n = load_model(name).num_layers
        raise TunerError(f"{where}: model {field_value!r}: a slice has 1 to {n} layers of {name}") from None


def _flag(v: Any, what: str) -> bool:
    """A row's true / false setting, read strictly (a string such as "false" is not a flag)."""
    if isinstance(v, bool):
        return v
    raise TypeError(f"{what} must be true or false, got {v!r}")


def _count(v: Any, what: str) -> int:
    """A row's positive whole number (no bool, no fraction)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 1:
        raise ValueError(f"{what} must be a whole number >= 1, got {v!r}")
    return int(v)


#: Layout fields a row must state: the parallel sizes and the micro-batch, which launch.harness.sweep always writes
#: (a missing one would default to 1 and predict another layout).
REQUIRED_LAYOUT_KEYS = ("world_size", "tp", "pp", "cp", "ep", "micro_batch_size")


#: What ``versions.transformer_engine`` says when the harness ran without Transformer Engine (launch.harness.sweep
#: writes "not installed"; older rows left it empty or wrote None).
TE_ABSENT = ("", "not installed", "None")


def _te_version(d: dict[str, Any]) -> str | None:
    """The row's TE release as "MAJOR.MINOR", or None when it ran without TE."""
    v = (d.get("versions") or {}).get("transformer_engine")
    if v is None or (isinstance(v, str) and v.strip() in TE_ABSENT):
        return None
    m = re.match(r"^(\d+)\.(\d+)(?:$|[.+a-z])", v.strip()) if isinstance(v, str) else None
    if m is None:
        raise ValueError(f"versions.transformer_engine must be a version string such as \"2.20.2\", or \"not "
                         f"installed\"; got {v!r:.40}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def _te(d: dict[str, Any]) -> bool:
    harness = ((d.get("run_options") or {}).get("harness")) or {}
    version = _te_version(d)  # read (and refused when garbled) even where the harness flag decides
    if "use_transformer_engine" in harness:
        return _flag(harness["use_transformer_engine"], "run_options.harness.use_transformer_engine")
    return version is not None


def _options(d: dict[str, Any], te: bool) -> RunOptions:
    """The run options of the stack a row ran on."""
    base = HARNESS_TE_RUN_OPTIONS if te else HARNESS_RUN_OPTIONS
    h = ((d.get("run_options") or {}).get("harness")) or {}
    kw: dict[str, Any] = {}
    if "grad_reduce_in_fp32" in h:
        kw["grad_reduce_in_fp32"] = _flag(h["grad_reduce_in_fp32"], "run_options.harness.grad_reduce_in_fp32")
    if h.get("fp8_recipe") in ("delayed", "tensorwise"):
        kw["fp8_recipe"] = h["fp8_recipe"]
    elif h.get("fp8_recipe") is not None:
        raise ValueError(f"run_options.harness.fp8_recipe {h['fp8_recipe']!r:.40}: the trials reader predicts the "
                         "delayed and tensorwise recipes (a blockwise row is not read)")
    if "fp8_param_gather" in h and _flag(h["fp8_param_gather"], "run_options.harness.fp8_param_gather"):
        kw["fp8_param_gather"] = True
    asked: dict[str, Any] = d["options"] if isinstance(d.get("options"), dict) else {}
    fused = _flag(h["megatron_fusions"], "run_options.harness.megatron_fusions") if "megatron_fusions" in h else None
    if "megatron_fusions" in asked:
        want = _flag(asked["megatron_fusions"], "options.megatron_fusions")
        if fused is not None and want != fused:
            raise ValueError(f"options.megatron_fusions {want} but run_options.harness.megatron_fusions {fused}: "
                             "the row contradicts itself (the harness records what it ran in run_options.harness)")
        fused = want if fused is None else fused
    if fused:
        kw["apply_rope_fusion"] = True  # launch/harness/train.py: the fusions Megatron-LM runs by default
    if "cross_entropy_fusion" in h and _flag(h["cross_entropy_fusion"], "run_options.harness.cross_entropy_fusion"):
        kw.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    tev = _te_version(d)
    if tev is not None:
        kw["te_version"] = tev
    return dataclasses.replace(base, **kw)


def json_lines(path: str | Path, label: str, expected: str) -> Iterator[tuple[int, str, Any]]:
    """``(line number, "LABEL, line N", value)`` of each non-blank line of a JSON-lines file."""
    lines = read_user_text(path, label, expected).splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{label}, line {i}"
        try:
            value = json.loads(line, object_pairs_hook=unique_keys)
        except RepeatedKey as e:
            raise TunerError(f"{where}: key {e.args[0]!r:.60} appears twice in one object (JSON keeps only the last); "
                             f"{expected}") from None
        except (ValueError, RecursionError) as e:  # not JSON, or JSON past the parser's limits
            raise TunerError(f"{where}: not JSON ({getattr(e, 'msg', 'too deep or too long')}); {expected}") from None
        yield i, where, value


#: TransformerConfig fields a sweep row records (``run_options.transformer``) and the ModelSpec field each must equal.
_RAN_MODEL_FIELDS = (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                     ("num_attention_heads", "num_attention_heads"), ("num_query_groups", "num_query_groups"),
                     ("num_moe_experts", "num_experts"), ("moe_router_topk", "moe_router_topk"))


def _check_ran_model(d: dict[str, Any], model: ModelSpec, where: str) -> None:
    """Refuse (TunerError) a row whose model is not the one megatron-core built, or fp8 without a precision."""
    ran = (d.get("run_options") or {}).get("transformer")
    if ran is None:
        return
    for cfg_key, spec_key in _RAN_MODEL_FIELDS:
        v = ran.get(cfg_key)
        if v is None:
            continue
        want = getattr(model, spec_key) or None  # a dense model: num_experts 0, the config's None
        if int(v) != want:
            raise TunerError(f"{where}: the row's model {d.get('model')!r} has {spec_key} {want}, but megatron-core "
                             f"ran {cfg_key} {int(v)} (run_options.transformer): the row is of another model or slice")
    precision = str(d.get("precision") or "")
    if ran.get("fp8") and not precision.lower().startswith("fp8"):
        raise TunerError(f"{where}: the row's precision is {precision or 'not given'!s} but it ran fp8 "
                         f"(run_options.transformer.fp8 {ran.get('fp8')!r}); give its precision (fp8)")


def read_trials(paths: list[str | Path]) -> tuple[list[SweepRow], list[str]]:
    """``(rows, skipped)`` of sweep JSON-lines files: the finished rows and one line per row left out."""
    rows: list[SweepRow] = []
    skipped: list[str] = []
    seen: dict[Path, str] = {}
    for path in paths:
        p = Path(path)
        if p.resolve() in seen:  # each of its rows would count as two runs
            raise TunerError(f"--trials {str(p)!r}: the same file as --trials {seen[p.resolve()]!r}; give each once")
        seen[p.resolve()] = str(p)
        # the file's folder names it (call12/sweep.jsonl); a generic one (callNN/sweep/sweep.jsonl) takes its parent too
        up = p.parent.parent.name if p.parent.name == p.stem else ""
        name = "/".join(x for x in (up, p.parent.name, p.name) if x)
        for i, where, d in json_lines(p, f"--trials {p}", "a trials file holds the JSON lines of launch.harness.sweep"):
            if not isinstance(d, dict):
                raise TunerError(f"{where}: the line is a JSON {type(d).__name__}, not an object; a trials file holds "
                                 "the JSON lines (one object each) of launch.harness.sweep")
            label = str(d.get("id") or d.get("label") or f"line {i}")
            try:
                row = _read_row(d, where, label, f"{name}:{i}")
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                msg = str(e).splitlines()[0] if str(e) else ""
                msg = f"no field {msg}" if isinstance(e, KeyError) else msg or type(e).__name__
                raise TunerError(f"{where}: cannot read the row ({msg}); a row is one object as launch.harness.sweep "
                                 "writes it") from None
            if isinstance(row, str):
                skipped.append(f"{name}:{i} {label}: {row}")
            else:
                rows.append(row)
    return rows, skipped


def _read_row(d: dict[str, Any], where: str, label: str, source: str) -> SweepRow | str:
    """A sweep row as a :class:`SweepRow`, or why it is left out."""
    if not isinstance(d.get("layout"), dict) and d.get("status") in ("skipped", "refused"):
        return f"status {d.get('status')!r} ({str(d.get('reason') or d.get('message') or '')[:80]})"
    if not isinstance(d.get("layout"), dict):
        raise TunerError(f"{where}: the row has no layout (a 'layout' object); a trials file holds the JSON lines of "
                         "launch.harness.sweep")
    # benchmarks/h200_te.py: ModelSpec fields replaced in the slice (an EP rank's experts, a feature off)
    model = override_model(_model(str(d.get("model", "")), where), d.get("model_overrides"), where)
    _check_ran_model(d, model, where)
    if d.get("status") != "ok":
        return f"status {d.get('status')!r}"
    missing = [k for k in REQUIRED_LAYOUT_KEYS if k not in d["layout"]]
    if missing:
        raise TunerError(f"{where}: the layout lacks {', '.join(missing)} (launch.harness.sweep writes every field; "
                         "a missing size would be read as 1, another layout)")
    absent = [k for k in ("gpus", "seq_length", "global_batch_size") if k not in d]
    if absent:
        raise TunerError(f"{where}: the row lacks {', '.join(absent)} (launch.harness.sweep writes them)")
    harness = (d.get("run_options") or {}).get("harness") or {}
    if {**(d.get("options") or {}), **harness}.get("gc_after_build") is True:
        return ("a control run with gc.collect() after the optimizer build (gc_after_build); the model predicts the "
                "first steps' peak, before any collection")
    if not _pos(d.get("step_time_s")) or not _pos(d.get("peak_reserved_gib")):
        return (f"status 'ok' but step_time_s {d.get('step_time_s')!r} / peak_reserved_gib "
                f"{d.get('peak_reserved_gib')!r} is not a positive number")
    te = _te(d)
    seq, gbs = _count(d["seq_length"], "seq_length"), _count(d["global_batch_size"], "global_batch_size")
    try:
        wl = Workload(seq_length=seq, global_batch_size=gbs,
                      precision=enum_member(Precision, d.get("precision") or "bf16", "--precision"))
        lay = harness_layout(Layout.from_dict(d["layout"]), HarnessEnv(transformer_engine=te))
        cluster = parse_gpus(str(d["gpus"]), name="the row's gpus")
    except TunerError as e:
        raise TunerError(f"{where}: {e}") from None
    ran_as = (cluster.num_gpus, cluster.gpus_per_node, cluster.gpu.name, *_timing_settings(d))
    peak_allocated = float(d["peak_allocated_gib"]) if _pos(d.get("peak_allocated_gib")) else None
    return SweepRow(source=source, label=label, model=model, gpus=str(d["gpus"]), workload=wl, layout=lay,
                    options=_options(d, te), transformer_engine=te, step_time_s=float(d["step_time_s"]),
                    peak_reserved_gib=float(d["peak_reserved_gib"]), peak_allocated_gib=peak_allocated,
                    extra={"ran_as": ran_as})


def predict_trials(rows: list[SweepRow], calibration: str | Path | None = None) -> list[TrialPrediction]:
    """Predict each row with the calibration of its stack (``calibration`` for all when given)."""
    cals: dict[bool, tuple[Calibration, str]] = {}
    if calibration is not None:
        c = load_calibration(calibration)
        cals = {True: (c, str(calibration)), False: (c, str(calibration))}
    else:
        cals[True] = (load_calibration(None), "shipped (TE)")
        no_te = NO_TE_CALIBRATION_FILE if NO_TE_CALIBRATION_FILE.is_file() else None
        cals[False] = (load_calibration(no_te), "no-TE harness" if no_te else "shipped (no no-TE file)")
    out = []
    for r in rows:
        cal, name = cals[r.transformer_engine]
        try:
            e = estimate(r.model, parse_gpus(r.gpus), r.workload, r.layout, calibration=cal, options=r.options)
        except InfeasibleLayout as ex:
            raise TunerError(f"--trials {r.source} ({r.label}): the layout breaks rule {ex.rule_id}: "
                             f"{ex.reason}") from None
        except TunerError as ex:  # e.g. the layout's world size is not the row's GPUs: name the row
            raise TunerError(f"--trials {r.source} ({r.label}): {ex}") from None
        out.append(TrialPrediction(row=r, step_time_s=e.step_time_s, peak_gib=e.peak_gib, calibration=name))
    return out


#: Median of |x| for x ~ N(0, 1): a model exact on each layout's mean shows this times the run-to-run spread as its
#: median |error| on single runs (normal noise; the probit of 0.75).
HALF_NORMAL_MEDIAN = 0.6745


#: Harness settings that change a trial's timed steps without changing what the cost model is given (its
#: :class:`~specs.RunOptions`): TE's fused token permutation, megatron-core's other fusions (gradient-accumulation and
#: bias-dropout fusion come with the fused RoPE), and a ``torch.profiler`` step among the timed ones. Runs that differ
#: in one are not runs of one configuration.
TIMING_SETTINGS = ("moe_permute_fusion", "megatron_fusions", "profile_step")


def _timing_settings(d: dict[str, Any]) -> tuple[bool, ...]:
    """Whether each of :data:`TIMING_SETTINGS` was on in row ``d``."""
    ro: dict[str, Any] = d["run_options"] if isinstance(d.get("run_options"), dict) else {}
    where = [x for x in (d.get("options"), ro.get("harness"), ro.get("transformer")) if isinstance(x, dict)]
    return tuple(any(w.get(k) not in (None, False, 0) for w in where) for k in TIMING_SETTINGS)


def _configuration(r: SweepRow) -> tuple[Any, ...]:
    """What ran: rows with the same key are runs of one configuration."""
    return (r.model, r.extra.get("ran_as", r.gpus), r.workload, r.layout, r.options, r.transformer_engine)


def run_spread(preds: list[TrialPrediction]) -> dict[str, Any]:
    """How far separate runs of one configuration spread: the step times' pooled relative SD
    (:func:`tuner.report.pooled_spread`), :data:`HALF_NORMAL_MEDIAN` x that (the median |error| of a model exact on
    every mean), the predictions' error against each mean; a row equal to another's to the last digit counts once."""
    groups: dict[tuple[Any, ...], list[TrialPrediction]] = {}
    measured: set[tuple[Any, ...]] = set()
    identical = 0
    for p in preds:
        key = _configuration(p.row)
        # a row that repeats another's measurement to the last digit is a copy of it, not a second run
        same = (key, p.row.step_time_s, p.row.peak_reserved_gib, p.row.peak_allocated_gib)
        if same in measured:
            identical += 1
            continue
        measured.add(same)
        groups.setdefault(key, []).append(p)
    repeats = [[p.row.step_time_s for p in ps] for ps in groups.values() if len(ps) >= 2]
    spread, dof = pooled_spread(repeats)
    repeated, runs = len(repeats), sum(len(t) for t in repeats)
    of_means = [abs(ps[0].step_time_s / statistics.fmean(p.row.step_time_s for p in ps) - 1) for ps in groups.values()]
    return {"configurations": len(groups), "repeated": repeated, "repeat_runs": runs, "dof": dof,
            "identical_rows": identical, "spread": spread,
            "noise_floor": HALF_NORMAL_MEDIAN * spread if spread is not None else None,
            "step_median_abs_error_of_means": float(statistics.median(of_means)) if of_means else None}


def summarize_trials(preds: list[TrialPrediction]) -> dict[str, Any]:
    """Median and max |error| of step time and peak memory, Spearman, over all rows and per stack."""

    def one(ps: list[TrialPrediction]) -> dict[str, Any]:
        if not ps:
            return {"rows": 0}
        s = np.abs([p.step_error for p in ps])
        m = np.abs([p.memory_error for p in ps])
        return {"rows": len(ps), "step_median_abs_error": float(statistics.median(s)),
                "step_max_abs_error": float(s.max()), "memory_median_abs_error": float(statistics.median(m)),
                "memory_max_abs_error": float(m.max()),
                "step_spearman": spearman([p.step_time_s for p in ps], [p.row.step_time_s for p in ps])}

    return {"all": one(preds), "te": one([p for p in preds if p.row.transformer_engine]),
            "no_te": one([p for p in preds if not p.row.transformer_engine]), "run_spread": run_spread(preds)}
