"""``tune rl validate``: predict every row of a table of measured RL runs and report the errors.

The columns (:data:`COLUMNS`) give each run's split, layouts (``megatron:tp=2,cp=2,ep=16,pp=8,vpp=1``,
``automodel:cp=8,ep=128``, ``vllm:tp=16,ep=16,pp=1[,gpu_memory_utilization=..,enforce_eager=..,max_num_seqs=..]``) and
workload; a bad cell is reported with its row and column and the other rows still run. ``mean_seq_len`` is NeMo-RL's
published "G-Average Seq len" (``mean_gen_tokens_per_sample``, ``nemo_rl/algorithms/grpo.py``); prompts are taken as
:data:`ASSUMED_MEAN_PROMPT_LEN` tokens. :func:`fit_calibration` fits the per-cluster factors to rows (least absolute log
error of the step time) for ``benchmarks/bench_rl.py``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize

from rl.calibration import DEFAULT_RL_CALIBRATION, RLCalibration
from rl.engine import GenerationPrecision
from rl.layouts import EngineLayout, TrainerLayout, parse_engine_layout, parse_trainer_layout
from rl.lengths import LengthDistribution
from rl.plan import Framework, LatencyProvider, RLJob, RLPlan, default_latency, evaluate_layouts
from specs import DEFAULT_INTER_NODE_BYTES_PER_S, Cluster, Precision, load_gpu, load_model
from specs.errors import TunerError
from specs.table import Column, read_table

__all__ = [
    "ASSUMED_MEAN_PROMPT_LEN", "COLUMNS", "TABLE", "RowResult", "RunRow", "fit_calibration", "fit_calibrations",
    "predict_row", "predict_rows", "read_runs", "recalibrate", "row_job", "summarise",
]

def _positive(name: str, *, optional: bool = False) -> Column:
    return Column(name, float, "s" if name.endswith("_s") else "tokens", low=0, low_open=True, optional=optional)


#: The runs table (``benchmarks/data/rl_runs.csv``): blank optional cells are not published, or BF16 for the precisions.
TABLE = (
    Column("source"),
    Column("framework", Framework),
    Column("model"),
    Column("gpu"),
    *(Column(c, int) for c in ("num_gpus", "gpus_per_node")),
    Column("colocated", lambda t: t in ("1", "true", "True"), choices=("0", "1", "true", "false", "True", "False")),
    Column("async_steps", int, low=0),
    *(Column(c, int) for c in ("trainer_gpus", "rollout_gpus")),
    Column("trainer_layout", lambda t: parse_trainer_layout(t, "trainer_layout")),
    Column("rollout_layout", lambda t: parse_engine_layout(t, "rollout_layout")),
    *(Column(c, int, "tokens") for c in ("max_prompt_len", "max_seq_len")),
    _positive("mean_seq_len"),
    *(Column(c, int) for c in ("prompts_per_step", "generations_per_prompt")),
    _positive("step_time_s"),
    *(_positive(c, optional=True) for c in ("generation_time_s", "training_time_s", "refit_time_s")),
    Column("notes", optional=True, default=""),
    Column("generation_precision", GenerationPrecision, optional=True, default=GenerationPrecision.bf16),
    Column("training_precision", Precision, optional=True, default=Precision.bf16),
)
COLUMNS = tuple(c.name for c in TABLE)

#: Mean prompt tokens of NeMo-RL's OpenMathInstruct-2 / DAPO-Math runs (problem text plus the
#: math prompt template, ``examples/prompts/cot.txt``): an assumption; the tables do not say.
ASSUMED_MEAN_PROMPT_LEN = 150
@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow:
    """One measured run (seconds; ``None`` where not published)."""

    line: int
    source: str
    framework: Framework
    model: str
    gpu: str
    num_gpus: int
    gpus_per_node: int
    colocated: bool
    async_steps: int
    trainer_gpus: int
    rollout_gpus: int
    trainer: TrainerLayout
    rollout: EngineLayout
    max_prompt_len: int
    max_seq_len: int
    mean_seq_len: float
    prompts_per_step: int
    generations_per_prompt: int
    step_time_s: float
    generation_time_s: float | None
    training_time_s: float | None
    refit_time_s: float | None
    notes: str
    generation_precision: GenerationPrecision = GenerationPrecision.bf16
    """The engines' weights (NeMo-RL ``vllm_cfg.precision``; blank = bf16)."""
    training_precision: Precision = Precision.bf16
    """The trainer's GEMMs (``megatron_cfg.fp8_cfg``: blockwise = ``fp8_blockwise``; blank = bf16)."""

    @property
    def label(self) -> str:
        mode = "colocated" if self.colocated else f"split {self.rollout_gpus}+{self.trainer_gpus}, K={self.async_steps}"
        return f"{self.source} {self.model} {self.num_gpus}x{self.gpu} {mode}"


def read_runs(path: str | Path) -> tuple[list[RunRow], list[str]]:
    """Read a runs CSV (:data:`TABLE`).

    Returns: ``(rows, errors)``: the readable rows, and one message per unreadable row naming its line and column.

    Raises TunerError: an unreadable file, or a header that lacks required columns (listed)."""

    def build(line: int, v: Mapping[str, Any]) -> RunRow:
        named = {k: x for k, x in v.items() if k not in ("trainer_layout", "rollout_layout")}
        return RunRow(line=line, trainer=v["trainer_layout"], rollout=v["rollout_layout"], **named)

    return read_table(path, TABLE, build, what=f"--data {str(path)!r}", table="runs")


# --------------------------------------------------------------------------- prediction


def row_job(row: RunRow, *, mean_prompt_len: float = ASSUMED_MEAN_PROMPT_LEN) -> RLJob:
    """The :class:`RLJob` a row describes.

    Raises TunerError: an unknown model or GPU, or sizes that do not make a job."""
    model = load_model(row.model, allow_config_args=True)
    gpu = load_gpu(row.gpu)
    per_node = gpu.network_bytes_per_s_per_gpu * row.gpus_per_node
    cluster = Cluster(gpu=gpu, num_gpus=row.num_gpus, gpus_per_node=row.gpus_per_node,
                      inter_node_bytes_per_s=per_node if per_node > 0 else DEFAULT_INTER_NODE_BYTES_PER_S)
    prompt = int(min(mean_prompt_len, row.max_prompt_len))
    resp_max = row.max_seq_len - prompt
    if row.mean_seq_len >= resp_max:
        raise TunerError(f"line {row.line}: mean_seq_len {row.mean_seq_len:g} is not below the longest response "
                         f"{resp_max:,}")
    return RLJob(model=model, cluster=cluster, framework=row.framework, engine=row.rollout.engine, prompt_len=prompt,
                 response_len=resp_max, mean_prompt_len=prompt,
                 responses=LengthDistribution.from_mean_max(row.mean_seq_len, resp_max),
                 prompts_per_step=row.prompts_per_step, generations_per_prompt=row.generations_per_prompt,
                 max_seq_len=row.max_seq_len, generation_precision=row.generation_precision,
                 training_precision=row.training_precision)


def predict_row(row: RunRow, *, calibration: RLCalibration = DEFAULT_RL_CALIBRATION,
                latency: LatencyProvider = default_latency) -> RLPlan:
    """Predict one measured run with its own split and layouts.

    Raises TunerError: the row's model, GPU, engine or layout cannot be predicted (the reason named)."""
    return evaluate_layouts(row_job(row), row.rollout, row.trainer, colocated=row.colocated,
                            rollout_gpus=row.rollout_gpus, trainer_gpus=row.trainer_gpus, async_steps=row.async_steps,
                            calibration=calibration, latency=latency)


@dataclass(frozen=True, kw_only=True, slots=True)
class RowResult:
    """A row and its prediction (or the reason it has none)."""

    row: RunRow
    plan: RLPlan | None
    error: str = ""

    def rel_error(self, part: str) -> float | None:
        """(predicted - measured) / measured for ``step``, ``generation``, ``training`` or ``refit``; None when
        unpublished."""
        if self.plan is None:
            return None
        measured = {"step": self.row.step_time_s, "generation": self.row.generation_time_s,
                    "training": self.row.training_time_s, "refit": self.row.refit_time_s}[part]
        if measured is None or measured <= 0:
            return None
        p = self.plan.parts
        predicted = {"step": p.step_time_s, "generation": p.generation_s, "training": p.training_s + p.logprob_s,
                     "refit": p.refit_s}[part]
        return predicted / measured - 1.0


def predict_rows(rows: Sequence[RunRow], *, calibration: RLCalibration = DEFAULT_RL_CALIBRATION,
                 latency: LatencyProvider = default_latency) -> list[RowResult]:
    """Predict each row; a row that cannot be predicted carries its error instead."""
    out = []
    for r in rows:
        try:
            out.append(RowResult(row=r, plan=predict_row(r, calibration=calibration, latency=latency)))
        except TunerError as e:
            out.append(RowResult(row=r, plan=None, error=f"line {r.line}: {e}"))
    return out


def summarise(results: Sequence[RowResult]) -> dict[str, object]:
    """Median and max |error| per part, the count predicted, and the colocated-vs-split verdicts.

    Verdicts: for each (source, model, gpu, num_gpus) with both a colocated and a split row,
    whether the predicted faster one is the measured faster one.
    """
    out: dict[str, object] = {"rows": len(results), "predicted": sum(r.plan is not None for r in results)}
    for part in ("step", "generation", "training", "refit"):
        errs = [abs(e) for r in results if (e := r.rel_error(part)) is not None]
        out[part] = {"n": len(errs), "median_abs_error": float(np.median(errs)) if errs else None,
                     "max_abs_error": max(errs) if errs else None}
    groups: dict[tuple[str, str, str, int], dict[bool, RowResult]] = {}
    for r in results:
        if r.plan is not None:
            groups.setdefault((r.row.source, r.row.model, r.row.gpu, r.row.num_gpus), {})[r.row.colocated] = r
    verdicts = []
    for key, g in sorted(groups.items()):
        if True in g and False in g:
            c, s = g[True], g[False]
            assert c.plan is not None and s.plan is not None
            measured_split_faster = s.row.step_time_s < c.row.step_time_s
            predicted_split_faster = s.plan.step_time_s < c.plan.step_time_s
            verdicts.append({"group": " ".join(map(str, key)),
                             "measured": "split" if measured_split_faster else "colocated",
                             "predicted": "split" if predicted_split_faster else "colocated",
                             "agree": measured_split_faster == predicted_split_faster})
    out["colocated_vs_split"] = verdicts
    return out


# --------------------------------------------------------------------------- calibration on a set of rows


def recalibrate(plan: RLPlan, old: RLCalibration, new: RLCalibration) -> float:
    """The step time of ``plan`` (predicted under ``old``) under ``new`` factors, without re-simulating.

    The simulator's event order does not depend on latency values, so generation scales with
    ``generation_scale``; training and log-prob with their scales; the switch and per-step
    overheads shift by the change of their fixed parts. Refit rates are held.
    """
    p = plan.parts
    parts = dataclasses.replace(
        p,
        generation_s=p.generation_s * new.generation_scale / old.generation_scale,
        training_s=p.training_s * new.training_scale / old.training_scale,
        logprob_s=p.logprob_s * new.logprob_scale / old.logprob_scale,
        switch_s=max(0.0, p.switch_s - old.switch_fixed_s + new.switch_fixed_s) if p.colocated else 0.0,
        overhead_s=new.step_overhead_s,
    )
    return parts.step_time_s


def fit_calibration(results: Sequence[RowResult], *, base: RLCalibration = DEFAULT_RL_CALIBRATION,
                    source: str = "fit") -> RLCalibration:
    """One set of factors for all rows (:func:`_fit`).

    Raises TunerError: no predicted row to fit."""
    return _fit(results, base, lambda r: "", lambda g: source)[""]


def fit_calibrations(results: Sequence[RowResult], *, base: RLCalibration = DEFAULT_RL_CALIBRATION,
                     source: str = "fit") -> dict[str, RLCalibration]:
    """One :class:`RLCalibration` per GPU of the rows (:func:`_fit`): per-GPU scales, and one ``switch_fixed_s`` and
    ``step_overhead_s`` for all, the framework's host-side work per step whatever the GPU (fitted per GPU they are not
    identified by a few rows).

    Raises TunerError: no predicted row to fit."""
    return _fit(results, base, lambda r: r.row.gpu, lambda g: f"{source} ({g} scales, shared fixed costs)")


def _fit(results: Sequence[RowResult], base: RLCalibration, group: Callable[[RowResult], str],
         source: Callable[[str], str]) -> dict[str, RLCalibration]:
    """Per ``group`` of rows ``generation_scale`` and ``training_scale`` (``logprob_scale`` tied to it), and one
    ``switch_fixed_s`` and ``step_overhead_s`` for all: the least sum of |log(predicted / measured)| of the step times
    (:func:`_minimise` over log-factors) from ``base``, under which the rows were predicted.

    Raises TunerError: no predicted row to fit."""
    use = [r for r in results if r.plan is not None]
    if not use:
        raise TunerError("no predicted row to calibrate on")
    groups = sorted({group(r) for r in use})

    def cals(x: np.ndarray) -> dict[str, RLCalibration]:
        e = np.exp(x)
        return {g: base.replace(generation_scale=float(e[2 * i]), training_scale=float(e[2 * i + 1]),
                                logprob_scale=float(e[2 * i + 1]), switch_fixed_s=float(e[-2]),
                                step_overhead_s=float(e[-1]), source=source(g)) for i, g in enumerate(groups)}

    def residuals(x: np.ndarray) -> np.ndarray:
        c = cals(x)
        return np.array([math.log(recalibrate(r.plan, base, c[group(r)]) / r.row.step_time_s) for r in use
                         if r.plan is not None])

    x0 = np.log([base.generation_scale, base.training_scale] * len(groups)
                + [max(base.switch_fixed_s, 0.1), max(base.step_overhead_s, 0.1)])
    return cals(_minimise(residuals, x0))


#: Factors and fixed costs are searched within e^-12 .. e^12 (6e-6 .. 1.6e5; seconds for the fixed costs).
_LOG_FACTOR_BOUND = 12.0


def _minimise(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray) -> np.ndarray:
    """The log-factors that minimise ``sum |residuals(x)|`` within :data:`_LOG_FACTOR_BOUND`: Nelder-Mead restarted from
    its own result until it stops improving (a fresh simplex escapes a collapsed one), run from ``x0`` and from the
    smooth least-squares fit (``soft_l1``, within the bounds), since the absolute-error surface has corners a simplex
    stops in; the lower of the two."""

    def loss(x: np.ndarray) -> float:
        if not np.all(np.abs(x) <= _LOG_FACTOR_BOUND):  # the simplex can wander to factors of e^700 (inf): out of range
            return float("inf")
        return float(np.sum(np.abs(residuals(x))))

    def descend(start: np.ndarray) -> tuple[np.ndarray, float]:
        x, best = start, loss(start)
        for _ in range(8):
            res = optimize.minimize(loss, x, method="Nelder-Mead",
                                    options={"xatol": 1e-5, "fatol": 1e-8, "maxiter": 2000 * len(x)})
            if best - res.fun < 1e-7:
                break
            x, best = res.x, float(res.fun)
        return x, best

    x0 = np.clip(np.asarray(x0, dtype=float), -_LOG_FACTOR_BOUND, _LOG_FACTOR_BOUND)
    runs = [descend(x0)]
    smooth = optimize.least_squares(residuals, x0, bounds=(-_LOG_FACTOR_BOUND, _LOG_FACTOR_BOUND), loss="soft_l1",
                                    f_scale=0.1)
    runs.append(descend(np.asarray(smooth.x, dtype=float)))
    return min(runs, key=lambda xb: xb[1])[0]


