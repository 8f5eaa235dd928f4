"""Serving benchmarks of one engine (``vllm bench serve`` / ``sglang.bench_serving`` rows of
``benchmarks/data/engine_decode.csv``, :data:`COLUMNS`), predicted with the rollout simulator at the same per-iteration
latency as ``tune rl`` (:func:`~rl.engine.aiconfigurator_latency_table`).

Loads: ``closed`` (``--max-concurrency C``: :func:`~rl.simulator.simulate_engine` with ``max_num_seqs = C``, every
request queued at time 0) and ``open`` (``--request-rate inf``: the engine's own ``max_num_seqs``, 1024 on GPUs of >= 70
GiB, ``vllm/engine/arg_utils.py``, and its KV cache bound the batch). Lengths: ``fixed``; ``uniform:R`` (uniform on ``[R
x len, len]``, ``--random-range-ratio R``); ``sharegpt`` (exponential with the published means, cut at 2,048 tokens as
``vllm bench``'s sampler filters: an assumption).

Metrics: ``tpot_ms`` (:attr:`~rl.simulator.EngineRun.mean_tpot_s`) and ``output_tok_s`` (or per GPU) over the makespan.
A row aiconfigurator has no data for is reported with the reason."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rl.engine import (
    Engine,
    EngineShape,
    GenerationPrecision,
    LatencyTable,
    aiconfigurator_latency_table,
    weight_bytes_per_param,
)
from rl.lengths import LengthDistribution
from rl.plan import BLOCK_SIZE, kv_capacity_tokens
from rl.simulator import EngineRun, simulate_engine
from specs import Cluster, load_gpu, load_model
from specs.errors import TunerError
from specs.table import BadCell, Column, read_table

__all__ = [
    "COLUMNS",
    "METRICS",
    "SHAREGPT_MAX_LEN",
    "TABLE",
    "ServingLatency",
    "ServingPrediction",
    "ServingRun",
    "predict_serving",
    "read_serving_runs",
    "serving_requests",
    "silicon_runs",
    "summarise_serving",
]

#: Metrics a row may publish, with their unit.
METRICS = {"tpot_ms": "ms", "output_tok_s": "tok/s", "output_tok_s_per_gpu": "tok/s/GPU"}

#: ``vllm bench serve``'s ShareGPT sampler drops conversations whose prompt + completion exceed
#: 2,048 tokens (``vllm/benchmarks/datasets.py``, ``is_valid_sequence``: ``max_total_len=2048``).
SHAREGPT_MAX_LEN = 2048

#: vLLM's ``max_num_seqs`` default on >= 70 GiB GPUs (``get_batch_defaults``); the cap of an ``open`` load.
OPEN_LOAD_MAX_SEQS = 1024

#: Memory fraction for weights + KV: vLLM's ``gpu_memory_utilization`` default 0.9.
DEFAULT_MEMORY_FRACTION = 0.9


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingRun:
    """One published serving benchmark of one engine (lengths in tokens)."""

    line: int
    id: str
    source: str
    model: str
    """Our model preset (``DeepSeek-V3`` for DeepSeek-R1: the same architecture)."""
    gpu: str
    engine: Engine
    engine_version: str
    precision: str
    """``bf16``, ``fp8`` or ``checkpoint`` (:class:`~rl.engine.GenerationPrecision`); any other
    value (``mxfp8``) is kept and refused at prediction, naming it."""
    shape: EngineShape
    load: str
    """``closed`` (``--max-concurrency``) or ``open`` (``--request-rate inf``)."""
    concurrency: int
    """In-flight requests of a closed load; 0 for an open one."""
    num_prompts: int
    isl: float
    osl: float
    lengths: str
    metric: str
    measured: float
    notes: str

    @property
    def label(self) -> str:
        load = f"c={self.concurrency}" if self.load == "closed" else "rate=inf"
        return (f"{self.id}: {self.model} {self.gpu} {self.engine} {self.precision} {self.shape.label} {load} "
                f"{self.isl:g}/{self.osl:g}")


def _lengths(text: str) -> str:
    """A ``lengths`` cell (:func:`_check_lengths`), kept as written."""
    _check_lengths(text)
    return text


#: The serving-runs table (``benchmarks/data/engine_decode.csv``; lengths in tokens).
TABLE = (
    *(Column(c) for c in ("id", "source", "model", "gpu")),
    Column("engine", Engine),
    Column("engine_version", optional=True, default=""),
    Column("precision"),
    Column("tp", int, low=1),
    Column("ep", int, low=1, optional=True, default=1),
    Column("dp", int, low=1, optional=True, default=1),
    Column("load", choices=("closed", "open")),
    Column("concurrency", int, low=0, optional=True, default=0),
    Column("num_prompts", int, low=1),
    Column("isl", float, "tokens", low=1),
    Column("osl", float, "tokens", low=1),
    Column("lengths", _lengths),
    Column("metric", choices=tuple(METRICS)),
    Column("measured", float, low=0, low_open=True),
    Column("notes", optional=True, default=""),
)
COLUMNS = tuple(c.name for c in TABLE)


def read_serving_runs(path: str | Path) -> tuple[list[ServingRun], list[str]]:
    """Read a serving-runs CSV (:data:`TABLE`; lines starting with ``#`` are comments).

    Returns: ``(rows, errors)``: the readable rows, and one message per unreadable row naming its line and column.

    Raises TunerError: an unreadable file, or a header without the required columns (listed)."""

    def build(line: int, v: Mapping[str, Any]) -> ServingRun:
        if v["load"] == "closed" and v["concurrency"] < 1:
            raise BadCell("concurrency", " (a closed load needs --max-concurrency >= 1)")
        shape = EngineShape(tp=v["tp"], ep=v["ep"], attention_dp=v["dp"])
        named = {k: x for k, x in v.items() if k not in ("tp", "ep", "dp")}
        return ServingRun(line=line, shape=shape, **named)

    return read_table(path, TABLE, build, what=repr(str(path)), table="serving-runs", comment="#")


def _check_lengths(text: str) -> float | None:
    """The range ratio of ``uniform:R`` (None for ``fixed`` / ``sharegpt``).

    Raises ValueError: anything else."""
    if text in ("fixed", "sharegpt"):
        return None
    kind, _, ratio = text.partition(":")
    if kind != "uniform":
        raise ValueError(text)
    r = float(ratio)
    if not 0 <= r <= 1:
        raise ValueError(text)
    return r


def _uniform(mean_top: float, ratio: float, n: int, seed: int) -> npt.NDArray[np.int64]:
    lo = max(1, int(mean_top * ratio))
    hi = max(lo, int(mean_top))
    q = (np.arange(n) + 0.5) / n
    out = np.floor(lo + q * (hi - lo + 1)).clip(lo, hi).astype(np.int64)
    return np.asarray(np.random.default_rng(seed).permutation(out), dtype=np.int64)


def serving_requests(row: ServingRun) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Prompt and output lengths of the row's ``num_prompts`` requests (shape ``(num_prompts,)`` each; see the module
    docstring).

    Raises TunerError: ShareGPT means that do not fit under its 2,048-token cut."""
    n = row.num_prompts
    ratio = _check_lengths(row.lengths)
    if row.lengths == "fixed":
        return np.full(n, int(round(row.isl)), dtype=np.int64), np.full(n, int(round(row.osl)), dtype=np.int64)
    if ratio is not None:
        return _uniform(row.isl, ratio, n, seed=3), _uniform(row.osl, ratio, n, seed=4)
    if not (row.isl < SHAREGPT_MAX_LEN and row.osl < SHAREGPT_MAX_LEN):
        raise TunerError(f"line {row.line}: ShareGPT means {row.isl:g} / {row.osl:g} must be below {SHAREGPT_MAX_LEN}")
    prompt = LengthDistribution.from_mean_max(row.isl, SHAREGPT_MAX_LEN, shape=1.0).draw(n, seed=5)
    out = LengthDistribution.from_mean_max(row.osl, SHAREGPT_MAX_LEN, shape=1.0).draw(n, seed=6)
    return prompt, out


#: ``(row, max_ctx) -> LatencyTable``: where a row's engine latency comes from (aiconfigurator by default; tests pass
#: functions).
ServingLatency = Callable[[ServingRun, int], LatencyTable]


def _precision(row: ServingRun) -> GenerationPrecision:
    try:
        return GenerationPrecision(row.precision)
    except ValueError:
        raise TunerError(
            f"precision {row.precision!r}: the engine model knows {', '.join(p.value for p in GenerationPrecision)} "
            "(aiconfigurator 0.12.0 has no MXFP8 / NVFP4 tables for Hopper)"
        ) from None


def _aiconfigurator(row: ServingRun, max_ctx: int) -> LatencyTable:
    return aiconfigurator_latency_table(row.model, row.gpu, row.engine, row.shape, max_ctx=max_ctx,
                                        precision=_precision(row))


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingPrediction:
    """A row with its prediction (``predicted`` in the row's metric unit), or the reason it has none."""

    row: ServingRun
    predicted: float | None
    run: EngineRun | None = None
    kv_capacity_tokens: int = 0
    latency_source: str = ""
    error: str = ""

    @property
    def rel_error(self) -> float | None:
        """``predicted / measured - 1``; None without a prediction."""
        return None if self.predicted is None else self.predicted / self.row.measured - 1.0


def predict_serving(row: ServingRun, *, latency: ServingLatency = _aiconfigurator,
                    memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> ServingPrediction:
    """Predict one row: simulate its requests on one engine (KV cache :func:`~rl.plan.kv_capacity_tokens` at
    ``memory_fraction`` with CUDA graphs, weights at the row's precision) and read its metric off the run. A row it
    cannot predict carries the reason in :attr:`ServingPrediction.error`."""
    try:
        model = load_model(row.model, allow_config_args=True)
        gpu = load_gpu(row.gpu)
        per_node = 8 if row.shape.gpus >= 8 else row.shape.gpus
        cluster = Cluster(gpu=gpu, num_gpus=max(row.shape.gpus, per_node), gpus_per_node=per_node)
        prompts, outputs = serving_requests(row)
        max_ctx = int((prompts + outputs).max())
        table = latency(row, max_ctx)
        precision = _precision(row)
        kv = kv_capacity_tokens(model, cluster, row.shape, memory_fraction, False,
                                weight_bytes_per_param(row.model, precision))
        if kv <= 0:
            raise TunerError(f"{row.model}'s weights at {row.precision} do not fit {row.shape.gpus} x {row.gpu} at "
                             f"{row.shape.label}")
        cap = row.concurrency if row.load == "closed" else OPEN_LOAD_MAX_SEQS
        run = simulate_engine(prompts, outputs, table, kv_capacity_tokens=kv, max_num_seqs=cap, block_size=BLOCK_SIZE)
    except TunerError as e:
        return ServingPrediction(row=row, predicted=None, error=str(e))
    if row.metric == "tpot_ms":
        value = run.mean_tpot_s * 1e3
    else:
        value = run.generated_tokens / run.makespan_s
        if row.metric == "output_tok_s_per_gpu":
            value /= row.shape.gpus
    return ServingPrediction(row=row, predicted=value, run=run, kv_capacity_tokens=kv, latency_source=table.source)


def summarise_serving(results: Sequence[ServingPrediction]) -> dict[str, object]:
    """Rows, rows predicted, median and max |error| (``None`` when nothing was predicted)."""
    errs = [abs(e) for r in results if (e := r.rel_error) is not None]
    return {
        "rows": len(results),
        "predicted": len(errs),
        "median_abs_error": float(np.median(errs)) if errs else None,
        "max_abs_error": float(max(errs)) if errs else None,
    }


#: aiconfigurator's silicon-sample model ids -> (our preset, precision) for the MoE models we have presets of.
_SILICON_MODELS: dict[str, tuple[str, GenerationPrecision]] = {
    "Qwen/Qwen3-235B-A22B-FP8": ("Qwen3-235B-A22B", GenerationPrecision.fp8),
    "MiniMaxAI/MiniMax-M2.5": ("MiniMax-M2", GenerationPrecision.checkpoint),
    "openai/gpt-oss-120b": ("GPT-OSS-120B", GenerationPrecision.checkpoint),
    "deepseek-ai/DeepSeek-R1": ("DeepSeek-V3", GenerationPrecision.checkpoint),
    "deepseek-ai/DeepSeek-V3": ("DeepSeek-V3", GenerationPrecision.checkpoint),
}


def silicon_runs(systems: Sequence[str] = ("h100_sxm", "h200_sxm")) -> tuple[list[ServingRun], list[str]]:
    """aiconfigurator's own silicon samples (``systems/silicon_sample.csv`` of the installed package) on ``systems`` as
    closed-load rows; not independent of aiconfigurator, so reported apart. A sample from a benchmark workflow is taken
    as the InferenceX harness runs (``10 x concurrency`` prompts, ``--random-range-ratio 0.8``, ``--ignore-eos``), the
    others as fixed lengths: assumptions, the file does not say. Returns ``(rows, skipped)`` (a shape whose ``tp x
    attention_dp`` is not ``moe_tp x moe_ep`` is skipped, with the reason).

    Raises TunerError: aiconfigurator is not installed (the ``rl`` extra named)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        raise TunerError("the silicon samples come with aiconfigurator: pip install 'megatron-layout-tuner[rl]'")
    path = Path(spec.origin).parent / "systems" / "silicon_sample.csv"
    gpus = {"h100_sxm": "H100", "h200_sxm": "H200"}
    out: list[ServingRun] = []
    skipped: list[str] = []
    with path.open(newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            if (r["system"] not in systems or r["backend"] not in ("vllm", "sglang") or r["mode"] != "agg"
                    or r["model_path"] not in _SILICON_MODELS):
                continue
            preset, precision = _SILICON_MODELS[r["model_path"]]
            m = re.search(r"silicon_concurrency=(\d+)", r["silicon_data_source"])
            conc = int(m.group(1)) if m else int(float(r["batch_size"]))
            tp, dp = int(float(r["tp_size"])), int(float(r["attention_dp_size"] or 1))
            ep, moe_tp = int(float(r["moe_ep_size"] or 1)), int(float(r["moe_tp_size"] or 1))
            if tp * dp != ep * moe_tp:
                skipped.append(f"{r['id']}: tp {tp} x attention-dp {dp} is not moe-tp {moe_tp} x moe-ep {ep}")
                continue
            src = r["silicon_data_source"]
            harness = "workflow_run_id" in src or "image=" in src
            out.append(
                ServingRun(
                    line=line, id=r["id"],
                    source=f"aiconfigurator_core/systems/silicon_sample.csv ({r['silicon_data_source'].split(';')[0]})",
                    model=preset, gpu=gpus[r["system"]], engine=Engine(r["backend"]),
                    engine_version=r["backend_version"],
                    precision=str(precision), shape=EngineShape(tp=tp, ep=ep, attention_dp=dp),
                    load="closed", concurrency=conc, num_prompts=10 * conc, isl=float(r["isl"]), osl=float(r["osl"]),
                    lengths="uniform:0.8" if harness else "fixed", metric="tpot_ms",
                    measured=float(r["silicon_tpot_ms"]), notes=r["model_path"],
                )
            )
    return out, skipped
