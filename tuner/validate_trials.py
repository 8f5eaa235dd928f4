"""``tune validate --trials``: predict the rows a real-trial sweep measured and compare.

Rows are JSON lines written by :mod:`launch.harness.sweep` (and ``benchmarks/h200_te.py``, which writes the same
fields plus the megatron-core configuration each row ran, ``run_options``). Each finished row is predicted as the
harness ran it: the model slice of its ``model`` field (``MiniMax-M2[4 layers]``), its GPUs, its workload and
precision, its layout through :func:`launch.harness.spec.harness_layout`, and the run options of the stack it ran
on: Transformer Engine or not (``run_options.harness.use_transformer_engine``, else ``versions.transformer_engine``),
the harness's unfused SwiGLU, and the grad dtype, fp8 recipe and fused cross-entropy its ``run_options`` record.
Each stack has its calibration: rows with TE the shipped one (``cost_model/data/calibration.yaml``), rows without
TE :data:`NO_TE_CALIBRATION_FILE` (the no-TE harness's constants, fitted on the 1- and 2-GPU H200 trials,
``docs/measurements.md``), unless ``--calibration`` names one for all.
"""

from __future__ import annotations

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
from launch.harness.spec import HarnessEnv, harness_layout, override_model, slice_model
from specs import HARNESS_RUN_OPTIONS, HARNESS_TE_RUN_OPTIONS, ModelSpec, Precision, RunOptions, Workload, list_models, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError, enum_member
from specs.files import RepeatedKey, read_user_text, unique_keys
from specs.layout import Layout
from tuner.report import pooled_spread

__all__ = ["NO_TE_CALIBRATION_FILE", "TrialPrediction", "TrialRow", "json_lines", "predict_trials", "read_trials", "run_spread",
           "summarize_trials"]

#: Constants of the no-TE trial harness (megatron-core's local spec, SequentialMLP experts): fitted by
#: ``benchmarks/bench_trial_calibration.py --fit-data <1- and 2-GPU sweeps> --out ...`` (docs/measurements.md).
NO_TE_CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "calibration_harness_no_te.yaml"

_MODEL_FIELD = re.compile(r"\s*(?P<name>[^\[]+?)\s*(?:\[(?P<layers>\d+) layers?\])?\s*")


@dataclass(slots=True)
class TrialRow:
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

    row: TrialRow
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
        raise TunerError(f"{where}: model {field_value!r}: a slice has 1 to {load_model(name).num_layers} layers of {name}") from None


def _flag(v: Any, what: str) -> bool:
    """A row's true / false setting, read strictly (a string such as "false" is not a flag)."""
    if isinstance(v, bool):
        return v
    raise TypeError(f"{what} must be true or false, got {v!r}")


def _count(v: Any, what: str) -> int:
    """A row's positive whole number, read strictly (no bool, no fraction, nothing infinite or NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) or v != int(v) or v < 1:
        raise ValueError(f"{what} must be a whole number >= 1, got {v!r}")
    return int(v)


#: Layout fields a row must state: the parallel sizes and the micro-batch, which launch.harness.sweep always writes
#: (a missing one would default to 1 and predict another layout).
REQUIRED_LAYOUT_KEYS = ("world_size", "tp", "pp", "cp", "ep", "micro_batch_size")


#: What ``versions.transformer_engine`` says when the harness ran without Transformer Engine (launch.harness.sweep
#: writes "not installed"; older rows left it empty or wrote None).
TE_ABSENT = ("", "not installed", "None")


def _te_version(d: dict[str, Any]) -> str | None:
    """The row's Transformer Engine release as "MAJOR.MINOR", or None when it ran without TE.

    Raises:
        ValueError: ``versions.transformer_engine`` is neither absent ("not installed", "", None) nor a version string
            of TE 1.0 or later such as "2.20.2" or "2.20rc1" (read as "2.20"); a number, a list or free text would
            have been read as TE present, of an unknown release.
    """
    v = (d.get("versions") or {}).get("transformer_engine")
    if v is None or (isinstance(v, str) and v.strip() in TE_ABSENT):
        return None
    m = re.match(r"^(\d+)\.(\d+)(?:$|[.+a-z])", v.strip()) if isinstance(v, str) else None
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"versions.transformer_engine must be a version string of TE 1.0 or later such as \"2.20.2\", "
                         f"or \"not installed\"; got {v!r:.40}")
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
        raise ValueError(f"run_options.harness.fp8_recipe {h['fp8_recipe']!r:.40}: the trials reader predicts the delayed and "
                         "tensorwise recipes (a blockwise row is not read)")
    if "fp8_param_gather" in h and _flag(h["fp8_param_gather"], "run_options.harness.fp8_param_gather"):
        kw["fp8_param_gather"] = True
    asked: dict[str, Any] = d["options"] if isinstance(d.get("options"), dict) else {}
    fused = _flag(h["megatron_fusions"], "run_options.harness.megatron_fusions") if "megatron_fusions" in h else None
    if "megatron_fusions" in asked:
        want = _flag(asked["megatron_fusions"], "options.megatron_fusions")
        if fused is not None and want != fused:
            raise ValueError(f"options.megatron_fusions {want} but run_options.harness.megatron_fusions {fused}: the row contradicts "
                             "itself (the harness records what it ran in run_options.harness)")
        fused = want if fused is None else fused
    if fused:
        kw["apply_rope_fusion"] = True  # launch/harness/train.py: the fusions Megatron-LM runs by default
    if "cross_entropy_fusion" in h and _flag(h["cross_entropy_fusion"], "run_options.harness.cross_entropy_fusion"):
        kw.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    tev = _te_version(d)
    if tev is not None:
        kw["te_version"] = tev
    return RunOptions(**{**_fields(base), **kw})


def _fields(o: RunOptions) -> dict[str, Any]:
    return {k: getattr(o, k) for k in o.__dataclass_fields__}


def json_lines(path: str | Path, label: str, expected: str) -> Iterator[tuple[int, str, Any]]:
    """The non-blank lines of a JSON-lines file, parsed: ``(line number, "LABEL, line N", value)`` (also read by the
    device benchmarks' comparisons, e.g. ``benchmarks/h200_recompute.py --compare``).

    Args:
        label: how the file is named in messages (``--trials PATH``, or the path).
        expected: what the file should hold, appended to a message about a line that is not JSON.

    Raises:
        TunerError: the file cannot be read (as UTF-8), or a line is not JSON, repeats a key in one object or is nested
            too deeply to read, named by ``label`` and its line.
    """
    lines = read_user_text(path, label, expected).splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{label}, line {i}"
        try:
            value = json.loads(line, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            raise TunerError(f"{where}: not JSON ({e.msg}); {expected}") from None
        except RepeatedKey as e:
            raise TunerError(f"{where}: key {e.args[0]!r:.60} appears twice in one object (JSON keeps only the last); "
                             f"{expected}") from None
        except RecursionError:
            raise TunerError(f"{where}: JSON nested too deeply to read; {expected}") from None
        except ValueError as e:  # an integer past Python's 4,300 digits
            raise TunerError(f"{where}: cannot read it ({str(e)[:120]}); {expected}") from None
        yield i, where, value


#: TransformerConfig fields a sweep row records (``run_options.transformer``) and the ModelSpec field each must equal.
_RAN_MODEL_FIELDS = (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("num_attention_heads", "num_attention_heads"),
                     ("num_query_groups", "num_query_groups"), ("num_moe_experts", "num_experts"), ("moe_router_topk", "moe_router_topk"))


def _check_ran_model(d: dict[str, Any], model: ModelSpec, where: str) -> None:
    """A row's ``model`` field must be the model its ``run_options.transformer`` says megatron-core built, and a row
    without ``precision`` (older sweeps: bf16) must not have run fp8.

    Raises:
        TunerError: a field of ``run_options.transformer`` that differs from the model named (or its overrides), or
            ``transformer.fp8`` set on a row with no ``precision``.
    """
    ran = (d.get("run_options") or {}).get("transformer") if isinstance(d.get("run_options"), dict) else None
    if ran is None:
        return
    if not isinstance(ran, dict):
        raise TunerError(f"{where}: 'run_options.transformer' must be an object (as launch.harness.sweep writes it), got {ran!r:.60}")
    for cfg_key, spec_key in _RAN_MODEL_FIELDS:
        v = ran.get(cfg_key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
            raise TunerError(f"{where}: run_options.transformer.{cfg_key} must be an integer (as megatron-core records it), got {v!r:.40}")
        want = getattr(model, spec_key) or None  # a dense model: num_experts 0, the config's None
        if int(v) != want:
            raise TunerError(f"{where}: the row's model {d.get('model')!r} has {spec_key} {want}, but megatron-core ran "
                             f"{cfg_key} {int(v)} (run_options.transformer): the row is of another model or slice")
    precision = str(d.get("precision") or "")
    if ran.get("fp8") and not precision.lower().startswith("fp8"):
        raise TunerError(f"{where}: the row's precision is {precision or 'not given'!s} but it ran fp8 "
                         f"(run_options.transformer.fp8 {ran.get('fp8')!r}); give its precision (fp8)")


def read_trials(paths: list[str | Path]) -> tuple[list[TrialRow], list[str]]:
    """Read sweep JSON-lines files.

    Returns:
        ``(rows, skipped)``: the finished rows (status ``ok`` with a step time and a reserved peak) and one line per
        row left out (not finished, with its status).

    Raises:
        TunerError: a file that cannot be read, a line that is not JSON, a row without a layout, or a row of a model
            that is not a bundled preset (or a slice of one): nothing is predicted then.
    """
    rows: list[TrialRow] = []
    skipped: list[str] = []
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        p = Path(path)
        try:  # one file given twice (again, through a link or another path) would count each row as two runs
            st = p.stat()
            if (st.st_dev, st.st_ino) in seen:
                raise TunerError(f"--trials {str(p)!r:.120}: the same file as --trials {seen[(st.st_dev, st.st_ino)]!r:.120}; give each "
                                 "file once")
            seen[(st.st_dev, st.st_ino)] = str(p)
        except OSError:
            pass  # json_lines names a file it cannot read
        # the file's folder names it (call12/sweep.jsonl); a generic folder (callNN/sweep/sweep.jsonl) takes its parent too
        name = "/".join(x for x in (p.parent.parent.name if p.parent.name == p.stem else "", p.parent.name, p.name) if x)
        for i, where, d in json_lines(p, f"--trials {p}", "a trials file holds the JSON lines of launch.harness.sweep"):
            if isinstance(d, dict) and not isinstance(d.get("layout"), dict) and d.get("status") in ("skipped", "refused"):
                skipped.append(f"{name}:{i} {d.get('id') or d.get('label') or ''}: status {d.get('status')!r} ({str(d.get('reason') or d.get('message') or '')[:80]})")
                continue
            if not isinstance(d, dict):
                raise TunerError(f"{where}: the line is a JSON {type(d).__name__}, not an object; a trials file holds the JSON lines "
                                 "(one object each) of launch.harness.sweep")
            if not isinstance(d.get("layout"), dict):
                raise TunerError(f"{where}: the row has no layout (a 'layout' object); a trials file holds the JSON lines of launch.harness.sweep")
            model = _model(str(d.get("model", "")), where)
            # benchmarks/h200_te.py: ModelSpec fields replaced in the slice (an EP rank's experts, a feature off)
            model = override_model(model, d.get("model_overrides"), where)
            label = str(d.get("id") or d.get("label") or f"line {i}")
            _check_ran_model(d, model, where)
            if d.get("status") != "ok":
                skipped.append(f"{name}:{i} {label}: status {d.get('status')!r}")
                continue
            for key in ("versions", "run_options", "options"):
                if d.get(key) is not None and not isinstance(d[key], dict):
                    raise TunerError(f"{where}: {key!r} must be an object (as launch.harness.sweep writes it), got {d[key]!r:.60}")
            h = (d.get("run_options") or {}).get("harness")
            if h is not None and not isinstance(h, dict):
                raise TunerError(f"{where}: 'run_options.harness' must be an object (as launch.harness.sweep writes it), got {h!r:.60}")
            missing = [k for k in REQUIRED_LAYOUT_KEYS if k not in d["layout"]]
            if missing:
                raise TunerError(f"{where}: the layout lacks {', '.join(missing)} (launch.harness.sweep writes every field; a "
                                 "missing size would be read as 1, another layout)")
            absent = [k for k in ("gpus", "seq_length", "global_batch_size") if k not in d]
            if absent:
                raise TunerError(f"{where}: the row lacks {', '.join(absent)} (launch.harness.sweep writes them)")
            harness_opts = {**(d["options"] if isinstance(d.get("options"), dict) else {}),
                            **((((d.get("run_options") or {}).get("harness")) or {}) if isinstance(d.get("run_options"), dict) else {})}
            if harness_opts.get("gc_after_build") is True:
                skipped.append(f"{name}:{i} {label}: a control run with gc.collect() after the optimizer build (gc_after_build); "
                               "the model predicts the first steps' peak, before any collection")
                continue
            if not _pos(d.get("step_time_s")) or not _pos(d.get("peak_reserved_gib")):
                skipped.append(f"{name}:{i} {label}: status 'ok' but step_time_s {d.get('step_time_s')!r} / peak_reserved_gib "
                               f"{d.get('peak_reserved_gib')!r} is not a positive number")
                continue
            try:
                te = _te(d)
                opts = _options(d, te)
                wl = Workload(seq_length=_count(d["seq_length"], "seq_length"), global_batch_size=_count(d["global_batch_size"], "global_batch_size"),
                              precision=enum_member(Precision, d.get("precision") or "bf16", "--precision"))
                lay = harness_layout(Layout.from_dict(d["layout"]), HarnessEnv(transformer_engine=te))
            except (KeyError, TypeError, ValueError, AttributeError, TunerError) as e:
                msg = str(e).splitlines()[0] if str(e) else ""
                raise TunerError(f"{where}: cannot read the row ({f'no field {msg}' if isinstance(e, KeyError) else msg or type(e).__name__}); "
                                 "a row is one object as launch.harness.sweep writes it") from None
            try:
                cluster = parse_gpus(str(d["gpus"]), name="the row's gpus")
            except TunerError as e:
                raise TunerError(f"{where}: {e}") from None
            _check_measured(d, cluster.gpu.hbm_bytes / 2**30, where)
            ran_as = (cluster.num_gpus, cluster.gpus_per_node, cluster.gpu.name, *_timing_settings(d))
            rows.append(TrialRow(source=f"{name}:{i}", label=label, model=model, gpus=str(d["gpus"]), workload=wl, layout=lay,
                                 options=opts, transformer_engine=te, step_time_s=float(d["step_time_s"]),
                                 peak_reserved_gib=float(d["peak_reserved_gib"]),
                                 peak_allocated_gib=float(d["peak_allocated_gib"]) if _pos(d.get("peak_allocated_gib")) else None,
                                 extra={"ran_as": ran_as}))
    return rows, skipped


#: The longest training step a trials row may report (s): a day. The harness times a few steps of a short trial
#: (seconds each on the device: docs/measurements.md); a larger figure is a unit slip (ms or us written as s).
MAX_STEP_TIME_S = 86_400.0
#: The shortest step and the smallest peak a measured row may give: a training step takes at least a kernel launch's
#: microseconds and a training process holds at least its CUDA context's megabytes; below these the error is a unit slip
#: (or 1e-320), and the ratio of a prediction to it is not a number to print.
MIN_STEP_TIME_S = 1e-6
MIN_PEAK_GIB = 1e-3


def _check_measured(d: dict[str, Any], hbm_gib: float, where: str) -> None:
    """Refuse a row whose measured figures cannot be true of the GPU it names.

    Args:
        d: the row (its ``step_time_s`` and ``peak_reserved_gib``/``peak_allocated_gib`` already positive numbers).
        hbm_gib: the GPU's memory (GiB, ``specs/data/gpus/*.yaml`` ``hbm_mib``): the caching allocator cannot reserve
            more than the device holds.

    Raises:
        TunerError: a step over :data:`MAX_STEP_TIME_S`, or a peak above ``hbm_gib``, naming the row and the range.
    """
    if float(d["step_time_s"]) > MAX_STEP_TIME_S:
        raise TunerError(f"{where}: step_time_s {d['step_time_s']!r} is more than a day ({MAX_STEP_TIME_S:,.0f} s); the "
                         "harness writes seconds per training step")
    if float(d["step_time_s"]) < MIN_STEP_TIME_S:
        raise TunerError(f"{where}: step_time_s {d['step_time_s']!r} is less than {MIN_STEP_TIME_S:g} s; the harness writes "
                         "seconds per training step")
    for key in ("peak_reserved_gib", "peak_allocated_gib"):
        if _pos(d.get(key)) and float(d[key]) > hbm_gib:
            raise TunerError(f"{where}: {key} {d[key]!r} is more than the {d['gpus']} GPU holds ({hbm_gib:.1f} GiB); the "
                             "harness writes GiB per GPU (2**30 bytes)")
        if _pos(d.get(key)) and float(d[key]) < MIN_PEAK_GIB:
            raise TunerError(f"{where}: {key} {d[key]!r} is less than {MIN_PEAK_GIB:g} GiB; the harness writes GiB per GPU "
                             "(2**30 bytes)")


def _pos(v: Any) -> bool:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v) and v > 0
    except OverflowError:  # an integer too large for a float
        return False


def predict_trials(rows: list[TrialRow], calibration: str | Path | None = None) -> list[TrialPrediction]:
    """Predict each row with the calibration of its stack (``calibration`` for all when given).

    Raises:
        TunerError: an unreadable calibration file, or a row whose layout breaks a rule.
    """
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
            raise TunerError(f"--trials {r.source} ({r.label}): the layout breaks rule {ex.rule_id}: {ex.reason}") from None
        except TunerError as ex:  # e.g. the layout's world size is not the row's GPUs: name the row
            raise TunerError(f"--trials {r.source} ({r.label}): {ex}") from None
        out.append(TrialPrediction(row=r, step_time_s=e.step_time_s, peak_gib=e.peak_gib, calibration=name))
    return out


#: Median of |x| for x ~ N(0, 1): a model exact on each layout's mean shows this times the run-to-run spread as its
#: median |error| on single runs (normal noise; the probit of 0.75).
HALF_NORMAL_MEDIAN = 0.6745


#: Harness settings that change a trial's timed steps without changing what the cost model is given (its
#: :class:`~specs.RunOptions`): TE's fused token permutation, megatron-core's other fusions (gradient-accumulation and
#: bias-dropout fusion come with the fused RoPE), and a ``torch.profiler`` step among the timed ones. Runs that differ in
#: one are not runs of one configuration.
TIMING_SETTINGS = ("moe_permute_fusion", "megatron_fusions", "profile_step")


def _timing_settings(d: dict[str, Any]) -> tuple[bool, ...]:
    """Whether each of :data:`TIMING_SETTINGS` was on in row ``d`` (its ``options``, ``run_options.harness`` or
    ``run_options.transformer``; absent, false and null read as off)."""
    ro: dict[str, Any] = d["run_options"] if isinstance(d.get("run_options"), dict) else {}
    where = [x for x in (d.get("options"), ro.get("harness"), ro.get("transformer")) if isinstance(x, dict)]
    return tuple(any(w.get(k) not in (None, False, 0) for w in where) for k in TIMING_SETTINGS)


def _configuration(r: TrialRow) -> tuple[Any, ...]:
    """What ran, without where it was written: two rows with the same key are runs of one layout (the GPUs as parsed,
    so ``1xh200`` and ``1xH200`` are one machine; the harness settings of :data:`TIMING_SETTINGS` apart)."""
    return (r.model, r.extra.get("ran_as", r.gpus), r.workload, r.layout, r.options, r.transformer_engine)


def run_spread(preds: list[TrialPrediction]) -> dict[str, Any]:
    """How far separate runs of one configuration (model slice, GPUs, workload, layout, options and stack) spread, and
    what that allows a model on single runs.

    ``spread``: the step times' pooled relative standard deviation over the configurations run more than once
    (:func:`tuner.report.pooled_spread`, as a study's repeated trials are pooled). ``noise_floor``: :data:`HALF_NORMAL_MEDIAN` x ``spread``, the median |error| a model exact
    on every configuration's mean would show on single runs if the runs spread normally. ``step_median_abs_error_of_means``:
    the predictions' median |error| against each configuration's mean step time (every configuration, run once or more).

    A row whose step time and peaks equal another row's of the same configuration to the last digit is a copy of that
    run (a file copied, a line pasted twice), counted once (``identical_rows``).

    Returns:
        ``{"configurations", "repeated", "repeat_runs", "dof", "identical_rows", "spread", "noise_floor",
        "step_median_abs_error_of_means"}``; the spread and the floor are None when no configuration ran twice.
    """
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
    return {"configurations": len(groups), "repeated": repeated, "repeat_runs": runs, "dof": dof, "identical_rows": identical, "spread": spread,
            "noise_floor": HALF_NORMAL_MEDIAN * spread if spread is not None else None,
            "step_median_abs_error_of_means": float(statistics.median(of_means)) if of_means else None}


def summarize_trials(preds: list[TrialPrediction]) -> dict[str, Any]:
    """Median and max |error| of step time and of peak memory (against the reserved peak), Spearman of step time,
    over all rows and per stack (``te`` / ``no_te``)."""

    def one(ps: list[TrialPrediction]) -> dict[str, Any]:
        if not ps:
            return {"rows": 0}
        s = np.abs([p.step_error for p in ps])
        m = np.abs([p.memory_error for p in ps])
        return {
            "rows": len(ps),
            "step_median_abs_error": float(statistics.median(s)),
            "step_max_abs_error": float(s.max()),
            "memory_median_abs_error": float(statistics.median(m)),
            "memory_max_abs_error": float(m.max()),
            "step_spearman": spearman([p.step_time_s for p in ps], [p.row.step_time_s for p in ps]),
        }

    return {"all": one(preds), "te": one([p for p in preds if p.row.transformer_engine]),
            "no_te": one([p for p in preds if not p.row.transformer_engine]), "run_spread": run_spread(preds)}
