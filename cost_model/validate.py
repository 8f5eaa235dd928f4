"""Validation of the cost model against measured runs (``tune validate``), and the run table it reads.

A run table is a CSV with the columns of ``benchmarks/data/published_runs.csv`` (346 measured
NVIDIA runs with their layouts). Each row becomes a :class:`Run`: the model preset, the
cluster, the workload, the :class:`~specs.layout.Layout` and the
:class:`~specs.RunOptions` (routing, overlaps, CUDA graphs, FSDP) read from the
row, and the published tokens/s/GPU or model TFLOP/s/GPU. Rows the model cannot represent
keep the reason (:attr:`Run.unrepresentable`); rows with bad cells are reported as
:class:`RowProblem` naming the row and column. Nothing is dropped silently.

Conventions for published rows (``shared/data/published_runs.md``):
- NVIDIA's MoE benchmarks force-balance the routing and are dropless (Megatron-Bridge
  performance-summary footnote), except the 25.09 ``tokendrop`` rows;
- Megatron-Bridge and NeMo performance recipes overlap DP communication
  (``overlap_grad_reduce`` / ``overlap_param_gather``) and TP communication
  (``tp_comm_overlap``); rows may override any option with ``key=value`` in ``other_notes``;
- a blank recompute cell means the recipe default (none), a blank dispatcher the
  alltoall dispatcher, a blank or ``1*`` ETP means 1;
- the setting columns (:data:`SETTING_COLUMNS`: FSDP, activation offload, precision-aware optimizer and its
  dtypes, main-gradient dtype, fp8 recipe and parameter gather, fused cross-entropy, recompute, EP A2A overlap,
  CUDA graphs, optimizer) were read in each row's Megatron-Bridge recipe at its tag
  (``benchmarks/data/published_runs_fixes.md``); where they are blank, ``other_notes`` and the defaults apply:
  fp32 main gradients, bf16 weights beside any quantised copy, native cross-entropy, Adam, and ``tensorwise``
  for an fp8 precision cell that says CS (current scaling), else ``delayed``;
- two runs of one configuration :data:`RELEASE_REGRESSION_RATIO` (1.3x) or more apart are a release's regression,
  not a layout effect: the slower is left out, naming the faster (:func:`mark_release_regressions`);
- a run of a NeMo container release before :data:`REFERENCE_RELEASE` (26.08) is predicted slower by
  :data:`RELEASE_GAIN_PER_MONTH` a month of releases (:func:`release_factor`), the gain the same configurations
  published in two releases show (:func:`measure_release_gain`).
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.estimate import estimate_table
from cost_model.flops import megatron_flops_per_token
from search_spaces.pipeline import stage_layer_counts
from specs import Cluster, GPUSpec, ModelSpec, Precision, RunOptions, Workload, list_gpus, list_models, load_gpu, load_model, load_network
from specs.errors import InfeasibleLayout, TunerError
from specs.files import MAX_DATA_BYTES, parse_errors, read_user_text
from specs.layout import RECOMPUTE_MODULES, Dispatcher, Layout, LayoutTable

__all__ = [
    "REQUIRED_COLUMNS",
    "Run",
    "RowProblem",
    "Prediction",
    "read_runs",
    "predict_runs",
    "summarize",
    "spearman",
    "flops_check_rows",
    "model_alias",
    "RunBatch",
    "mark_release_regressions",
    "measure_release_gain",
    "release_factor",
    "RELEASE_GAIN_PER_MONTH",
    "REFERENCE_RELEASE",
]

#: Columns a run table must have (any order; more columns are ignored).
REQUIRED_COLUMNS = ("model", "gpu_type", "num_gpus", "tp", "pp", "gbs", "seq_len", "precision")
#: Columns read when present (blank cells take the defaults in the module docstring).
OPTIONAL_COLUMNS = (
    "id", "vpp", "cp", "ep", "etp", "mbs", "recompute", "dispatcher", "other_notes", "task",
    "framework_version", "confidence", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "implied_gflop_per_token",
    *("use_megatron_fsdp", "cpu_offloading_num_layers", "use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype",
      "grad_reduce_in_fp32", "fp8_recipe", "fp8_param_gather", "fp4_param_gather", "cross_entropy_loss_fusion",
      "cross_entropy_fusion_impl", "te_version", "recompute_granularity", "recompute_method", "recompute_num_layers",
      "recompute_modules", "overlap_moe_expert_parallel_comm", "cuda_graph_impl", "cuda_graph_scope", "optimizer",
      "optimizer_fp8_recipe"),
)
#: The setting columns (Megatron's names) that ``benchmarks/tools/apply_published_fixes.py`` writes from each row's
#: recipe (``benchmarks/data/published_runs_fixes.md``); a non-blank cell wins over a ``key=value`` in
#: ``other_notes``, which wins over the defaults of the module docstring.
SETTING_COLUMNS = OPTIONAL_COLUMNS[15:]

#: Model names used in the published tables -> bundled presets (keys normalised by :func:`_norm`).
#: Llama 3 and Llama 3.1 share the architecture at 8K tokens (only RoPE scaling differs).
_ALIASES = {
    "llama38b": "Llama-3.1-8B",
    "llama318b": "Llama-3.1-8B",
    "llama370b": "Llama-3.1-70B",
    "llama3170b": "Llama-3.1-70B",
    "llama31405b": "Llama-3.1-405B",
    "llama3405b": "Llama-3.1-405B",
    "qwen330ba3b": "Qwen3-30B-A3B",
    "qwen3235ba22b": "Qwen3-235B-A22B",
    "deepseekv3": "DeepSeek-V3",
    "kimik2": "Kimi-K2",
    "gptoss120b": "GPT-OSS-120B",
    "mixtral8x7b": "Mixtral-8x7B",
    "mixtral8x22b": "Mixtral-8x22B",
    "minimaxm2": "MiniMax-M2",
    "minimaxm3": "MiniMax-M3",
}

#: Model-name fragments the cost model has no layer type for, with the reason.
_UNREPRESENTABLE_MODELS = (
    ("nemotron3", "hybrid Mamba / attention MoE model: the cost model has no Mamba layers"),
    ("nemotron_3", "hybrid Mamba / attention MoE model: the cost model has no Mamba layers"),
    ("hybrid", "hybrid Mamba / attention model: the cost model has no Mamba layers"),
    ("qwen3next", "hybrid gated-DeltaNet model: the cost model has no linear-attention layers"),
    ("deepseekv4", "DeepSeek-V4: architecture not published in a form the presets cover"),
)

#: Defaults of the run options a row's settings override.
_DEFAULT_OPTIONS = RunOptions()

_GPT_RE = re.compile(r"^GPT-[\d.]+B\s*\(heads=(\d+),\s*hidden=(\d+),\s*layers=(\d+),\s*vocab=(\d+)\)$")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def model_alias(name: str) -> str | None:
    """The bundled preset a published model name refers to, or None."""
    key = _norm(name)
    presets = {_norm(p): p for p in list_models()}
    return presets.get(key) or _ALIASES.get(key)


def _model_for(name: str, base: Path | None = None) -> tuple[ModelSpec | None, str]:
    """(spec, "") or (None, reason). Megatron README's GPT rows are built from the name's numbers; a name ending in
    ``.json`` is a Hugging Face ``config.json`` (a relative path from the table's folder ``base``, else as given)."""
    if name.strip().lower().endswith(".json"):
        f = Path(name.strip())
        if not f.is_absolute() and base is not None and (base / f).is_file():
            f = base / f
        try:
            return load_model(str(f)), ""
        except TunerError as e:
            return None, f"model {name.strip()[:80]!r}: {e}"
    preset = model_alias(name)
    if preset:
        return load_model(preset), ""
    m = _GPT_RE.match(name.strip())
    if m:
        heads, hidden, layers, vocab = (int(x) for x in m.groups())
        # Megatron-LM README weak-scaling table: standard GPT (MHA, 4h GeLU MLP, tied embeddings).
        return (
            ModelSpec(
                name=name.split(" ")[0], num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                num_query_groups=heads, kv_channels=hidden // heads, ffn_hidden_size=4 * hidden, vocab_size=vocab,
                gated_linear_unit=False, untie_embeddings_and_output_weights=False, moe_layer_freq=(0,) * layers,
                source="Megatron-LM README weak-scaling table (standard GPT: MHA, 4h GeLU MLP)",
            ),
            "",
        )
    low = _norm(name) + " " + name.lower()
    for frag, why in _UNREPRESENTABLE_MODELS:
        if frag in low:
            return None, why
    return None, f"no bundled preset for model {name!r} (presets: {', '.join(list_models())})"


def _first_named(text: str, table: Sequence[tuple[str, Any]]) -> Any:
    """The value of the first ``(word, value)`` of ``table`` whose word is in ``text`` (lower-cased); None if none is."""
    t = text.lower()
    return next((v for word, v in table if word in t), None)


#: Words of a precision cell, checked in this order ("FP8-MX" is MXFP8, "FP8 blockwise" is not plain fp8).
_PRECISION_WORDS = (("fp4", Precision.nvfp4), ("mx", Precision.mxfp8), ("block", Precision.fp8_blockwise),
                    ("fp8", Precision.fp8), ("bf16", Precision.bf16))
#: Words of a dispatcher cell (each dispatcher's ``published_words``), checked in this order: a flex backend's
#: first, the longest first ("alltoall (flex backend unset)" is alltoall; "hybridep" is not "deepep").
_DISPATCHER_WORDS = tuple(sorted(((w, d) for d in Dispatcher for w in d.traits.published_words), key=lambda x: (not x[1].is_flex, -len(x[0]))))


def _precision(text: str) -> Precision | None:
    return cast("Precision | None", _first_named(text, _PRECISION_WORDS))


@dataclass(frozen=True, slots=True)
class RowProblem:
    """A cell that could not be read: the row (1-based data row and its ``id``), the column, why."""

    row: int
    run_id: str
    column: str
    message: str

    def __str__(self) -> str:
        return f"row {self.row} (id {self.run_id}), column {self.column!r}: {self.message}"


@dataclass(slots=True)
class Run:
    """One measured run, ready to estimate (or with the reason it cannot be)."""

    row: int
    """1-based data row of the CSV (the header is row 0)."""
    run_id: str
    model_name: str
    gpu_type: str
    precision: str
    num_gpus: int
    published_tokens: float | None
    """tokens/s/GPU as published (None when not reported)."""
    published_tflops: float | None
    """model TFLOP/s/GPU as published (the source's own FLOPs accounting)."""
    implied_gflop_per_token: float | None
    seq_length: int = 0
    framework_version: str = ""
    task: str = ""
    model: ModelSpec | None = None
    cluster: Cluster | None = None
    workload: Workload | None = None
    layout: Any = None
    options: RunOptions = field(default_factory=RunOptions)
    unrepresentable: str = ""
    """Why the model cannot represent this row ("" when it can)."""
    is_moe: bool = False

    @property
    def metric(self) -> str:
        """The published number a prediction is compared with: ``tokens`` or ``tflops``."""
        return "tokens" if self.published_tokens else "tflops"

    @property
    def published(self) -> float:
        """The published number of :attr:`metric` (0 when neither is published)."""
        return self.published_tokens or self.published_tflops or 0.0

    @property
    def layout_key(self) -> str:
        return self.layout.key() + f"|opts={self.options}" if self.layout is not None else ""


def _cell(r: dict[str, str], row: int, rid: str, problems: list[RowProblem], column: str, integer: bool = True, default: float | None = None) -> float | None:
    """:func:`_num` of column ``column`` of row ``r``."""
    return _num(r.get(column, ""), column, row, rid, problems, integer=integer, default=default)


def _flag(notes: dict[str, str], key: str, default: bool) -> bool:
    """A boolean setting of a row's notes: true, 1 or yes (quotes ignored); ``default`` when absent."""
    v = notes.get(key)
    return default if v is None else v.strip("'\"").lower() in ("true", "1", "yes")


def _num(raw: str, column: str, row: int, rid: str, problems: list[RowProblem], *, integer: bool, default: float | None) -> float | None:
    t = (raw or "").strip().replace(",", "")
    t = re.sub(r"\s*\(derived\)$", "", t)
    if t.endswith("*"):
        t = t[:-1]
    if not t:
        return default
    try:
        v = float(t)
    except ValueError:
        problems.append(RowProblem(row, rid, column, f"{raw!r} is not a number"))
        return None
    if not math.isfinite(v) or v < 0 or (integer and not v.is_integer()):
        problems.append(RowProblem(row, rid, column, f"{raw!r} is not a {'non-negative integer' if integer else 'non-negative number'}"))
        return None
    return v


#: ``key=value`` in a row's notes; keys may hold digits (``moe_a2a_overlap=True``; the digit-free pattern of the
#: first cut could not read it, docs/production_sources.md F10).
_KV_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\]]*\]|[^;|,\s]+)")


def _setting(r: dict[str, str], notes: dict[str, str], key: str, default: str) -> str:
    """A run setting: the row's explicit column ``key`` (:data:`SETTING_COLUMNS`) when not blank, else the
    ``key=value`` of its notes, else ``default``."""
    v = (r.get(key) or "").strip()
    if v:
        return v
    return notes.get(key, default).strip("'\"")


#: What the ``cuda_graph_impl`` column accepts (megatron-core 0.19 ``--cuda-graph-impl``: none, local,
#: transformer_engine; ``full_iteration`` is Megatron-Bridge's name for the local whole-iteration graph).
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")


def _setting_choice(r: dict[str, str], notes: dict[str, str], key: str, default: str, accepted: Sequence[str]) -> str:
    """A :func:`_setting` that must be one of ``accepted`` (case-insensitive; blank -> ``default``).

    Raises:
        ValueError: anything else, naming the column and the accepted values (the row is then not representable).
    """
    v = _setting(r, notes, key, default).strip().lower()
    if not v:
        return default
    if v not in accepted:
        raise ValueError(f"{key} {v[:40]!r}: accepted {', '.join(accepted)} (or blank)")
    return v


def _dispatcher_cell(cell: str, notes: dict[str, str]) -> Dispatcher:
    """The token dispatcher of a row: its ``dispatcher`` cell (free text naming alltoall, allgather, DeepEP or
    HybridEP; blank = alltoall, Megatron's default; ``flex`` with no backend = DeepEP, the default of
    ``moe_flex_dispatcher_backend``) or its notes' ``moe_flex_dispatcher_backend`` / ``dispatcher``.

    Raises:
        ValueError: a non-blank cell that names none of them (the row is then not representable, with this reason).
    """
    disp = (cell + " " + notes.get("moe_flex_dispatcher_backend", "")).lower()
    if "dispatcher" in notes:  # a spelling Layout normalises (or rejects, naming the accepted ones)
        return cast(Dispatcher, notes["dispatcher"])
    named = _first_named(disp, _DISPATCHER_WORDS)
    if named is not None:
        return cast(Dispatcher, named)
    if not disp.strip():
        return Dispatcher.alltoall
    if re.search(r"\bflex\b", disp):  # flex's default backend (megatron-core 0.19 TransformerConfig)
        return Dispatcher.flex_deepep
    raise ValueError(f"dispatcher {cell.strip()[:40]!r}: name alltoall, allgather, DeepEP or HybridEP (or leave it blank for alltoall)")


def _setting_int(r: dict[str, str], notes: dict[str, str], key: str, default: int) -> int:
    """A non-negative integer :func:`_setting` (blank -> ``default``).

    Raises:
        ValueError: anything else, naming the column (the row is then not representable, with this reason).
    """
    v = _setting(r, notes, key, "").strip()
    if not v:
        return default
    if not v.isdigit():
        raise ValueError(f"{key} {v[:40]!r}: expected a non-negative integer")
    return int(v)


def _note_fraction(notes: dict[str, str], key: str) -> float:
    """A note's fraction in [0, 1] (absent -> 0).

    Raises:
        ValueError: anything else, naming the key (the row is then not representable, with this reason).
    """
    v = notes.get(key, "").strip("'\"")
    try:
        f = float(v) if v else 0.0
    except ValueError:
        f = float("nan")
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"note {key}={v[:40]!r}: expected a fraction from 0 to 1")
    return f


def _setting_flag(r: dict[str, str], notes: dict[str, str], key: str, default: bool) -> bool:
    """A boolean :func:`_setting`: true / 1 / yes or false / 0 / no.

    Raises:
        ValueError: a setting column holding anything else (the row is then not representable, with this reason).
    """
    v = (r.get(key) or "").strip().strip("'\"").lower()
    if v:
        if v not in ("true", "1", "yes", "false", "0", "no"):
            raise ValueError(f"{key} {r.get(key, '')[:40]!r}: expected true or false")
        return v in ("true", "1", "yes")
    return _flag(notes, key, default)


def _optional(v: str) -> str | None:
    """A setting whose blank or ``none`` means unset."""
    return None if v.strip().lower() in ("", "none") else v.strip()


def _notes(text: str) -> dict[str, str]:
    return {k: v for k, v in _KV_RE.findall(text or "")}


def _list(v: str) -> tuple[str, ...]:
    return tuple(x.strip(" '\"") for x in v.strip("[]").split(",") if x.strip(" '\""))


def _recompute(cell: str, notes: dict[str, str]) -> dict[str, Any]:

    text = (cell or "").strip().lower()
    mods = _list(notes["recompute_modules"]) if "recompute_modules" in notes else ()
    if "recompute_num_layers" in notes or text.startswith("recompute_num_layers") or text.startswith("full"):
        n = int(re.findall(r"\d+", notes.get("recompute_num_layers", text) or "1")[0] if re.findall(r"\d+", notes.get("recompute_num_layers", text)) else 1)
        return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=n)
    if not mods and text.startswith("selective"):
        mods = tuple(m for m in RECOMPUTE_MODULES if re.search(rf"\b{m}\b", text))
    mods = tuple(m for m in mods if m in RECOMPUTE_MODULES)
    if mods:
        return dict(recompute_granularity="selective", recompute_modules=mods)
    return {}


def _pipeline_split(model: ModelSpec, pp: int, vpp: int) -> tuple[int, int] | None:
    """(first, last) stage layers that make ``num_layers`` split over pp x vpp; (0, 0) when even.

    Published runs with an uneven model (DeepSeek-V3's 61 layers) use a
    ``--pipeline-model-parallel-layout``; the closest first/last split stands for it.
    """

    L = model.num_layers
    best: tuple[float, int, int] | None = None
    per = L / pp
    cands = [0] + list(range(1, int(2 * per) + 2)) if pp > 1 else [0]
    for a in cands:
        for b in cands:
            try:
                stage_layer_counts(L, pp, vpp, a, b)
            except InfeasibleLayout:
                continue
            cost = (abs(a - per) if a else 0) + (abs(b - per) if b else 0)
            if best is None or cost < best[0]:
                best = (cost, a, b)
        if best is not None and best[0] == 0:
            break
    return None if best is None else (best[1], best[2])


def read_runs(paths: str | Path | Sequence[str | Path], *, calibration_only: bool = False) -> tuple[list[Run], list[RowProblem]]:
    """Read one or more run tables.

    Args:
        paths: CSV file(s) with :data:`REQUIRED_COLUMNS` (and any of the optional ones).
        calibration_only: unused; kept for symmetry with :func:`predict_runs`.

    Returns:
        ``(runs, problems)``: one :class:`Run` per row whose cells could be read
        (``unrepresentable`` set when the model cannot estimate it), and one
        :class:`RowProblem` per unreadable cell (that row is left out of ``runs``).

    Raises:
        TunerError: a file is unreadable, not a CSV, or lacks a required column.
    """

    if isinstance(paths, (str, Path)):
        paths = [paths]
    runs: list[Run] = []
    problems: list[RowProblem] = []
    seen_ids: dict[str, str] = {}
    gpu_names = {g.lower(): g for g in list_gpus()}
    for path in paths:
        p = Path(path)
        label = f"--data {str(p)!r}"
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        text = read_user_text(p, label, "a CSV table of runs", limit=MAX_DATA_BYTES, encoding="utf-8-sig")
        reader = csv.DictReader(io.StringIO(text, newline=""))  # not splitlines(): a form feed in a cell is not a row break
        with parse_errors(label, "a CSV table of runs"):  # a cell past csv's field limit, too
            table = list(reader)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        twice = sorted({c for c in cols if c and cols.count(c) > 1})
        if twice:
            raise TunerError(f"--data {str(p)!r}: column(s) {', '.join(twice)} appear twice in the header; a run table "
                             "names each column once (the reader would keep only the last)")
        missing = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing:
            raise TunerError(
                f"--data {str(p)!r}: missing column(s) {', '.join(missing)}; a run table needs "
                f"{', '.join(REQUIRED_COLUMNS)} and tokens_per_s_per_gpu or model_tflops_per_gpu"
            )
        if "tokens_per_s_per_gpu" not in cols and "model_tflops_per_gpu" not in cols:
            raise TunerError(f"--data {str(p)!r}: needs a tokens_per_s_per_gpu or model_tflops_per_gpu column")
        for i, raw in enumerate(table, start=1):
            r = {k.strip(): (v or "") for k, v in raw.items() if k is not None}
            rid = r.get("id", "").strip() or str(i)
            here: list[RowProblem] = []
            extra, short = len(raw.get(None) or []), sum(1 for k, v in raw.items() if k is not None and v is None)
            if extra or short:  # csv.DictReader pads a short row with blanks and keeps a long row's surplus apart
                problems.append(RowProblem(i, rid, "(row)", f"{len(cols) - short + extra} cells where the header has {len(cols)}: "
                                                          "a cell left out, or a comma in a cell that is not quoted"))
                continue
            num = functools.partial(_cell, r, i, rid, here)
            ngpu, tp, pp, gbs, seq = num("num_gpus"), num("tp"), num("pp"), num("gbs"), num("seq_len")
            for c, v in (("num_gpus", ngpu), ("tp", tp), ("pp", pp), ("gbs", gbs), ("seq_len", seq)):
                if v is not None and v < 1:
                    here.append(RowProblem(i, rid, c, f"{r.get(c)!r} must be at least 1"))
                if v is None and not any(pr.column == c for pr in here):
                    here.append(RowProblem(i, rid, c, "empty"))
            vpp_raw = r.get("vpp", "")
            vpp = num("vpp", default=1.0) if not re.search(r"[a-z]", vpp_raw.lower()) else None
            cp, ep, etp, mbs = num("cp", default=1.0), num("ep", default=1.0), num("etp", default=1.0), num("mbs", default=1.0)
            tok = num("tokens_per_s_per_gpu", integer=False)
            tfl = num("model_tflops_per_gpu", integer=False)
            for c, v, top in (("tokens_per_s_per_gpu", tok, MAX_TOKENS_PER_S_PER_GPU), ("model_tflops_per_gpu", tfl, MAX_TFLOPS_PER_GPU)):
                if v is not None and v > top:
                    here.append(RowProblem(i, rid, c, f"{r.get(c)!r} is more than {top:,.0f}: not a measurement of one GPU"))
            if r.get("id", "").strip():  # an explicit id (a blank one is the row's number, which repeats across files)
                if rid in seen_ids:
                    here.append(RowProblem(i, rid, "id", f"id {rid!r} is already the id of row {seen_ids[rid]}; ids name rows "
                                                          "in messages and must be unique"))
                seen_ids.setdefault(rid, f"{i} of {p.name}")
            gflop = num("implied_gflop_per_token", integer=False)
            gname = r.get("gpu_type", "").strip()
            if gname.lower() not in gpu_names:
                here.append(RowProblem(i, rid, "gpu_type", f"unknown GPU type {gname!r}; known: {', '.join(list_gpus())}"))
            prec = _precision(r.get("precision", ""))
            if prec is None:
                here.append(RowProblem(i, rid, "precision", f"{r.get('precision')!r}: expected BF16, FP8 (per-tensor / CS), FP8 blockwise, MXFP8 or NVFP4"))
            if not r.get("model", "").strip():
                here.append(RowProblem(i, rid, "model", "empty"))
            if here:
                problems.extend(here)
                continue
            assert prec is not None and ngpu is not None and seq is not None, "checked above"
            run = Run(
                row=i, run_id=rid, model_name=r["model"].strip(), gpu_type=gpu_names[gname.lower()], precision=prec.value,
                num_gpus=int(ngpu), published_tokens=tok or None, published_tflops=tfl or None,
                implied_gflop_per_token=gflop or None, seq_length=int(seq), framework_version=r.get("framework_version", "").strip(),
                task=r.get("task", "").strip(),
                is_moe=r.get("is_moe", "").strip().upper().startswith("Y"),
            )
            runs.append(run)
            model, why = _model_for(run.model_name, p.parent)
            if model is None:
                run.unrepresentable = why
                continue
            if model.is_moe:
                run.is_moe = True
            notes_text = r.get("other_notes", "")
            notes = _notes(notes_text)
            low_notes = notes_text.lower()
            if model.mtp_num_layers and "w/o mtp" in (low_notes + " " + run.framework_version.lower() + " " + r.get("model", "").lower()):
                model = model.replace(mtp_num_layers=0)
            if "mtp_num_layers" in notes:
                try:  # ModelSpec refuses a negative depth or one above the decoder's layers
                    model = model.replace(mtp_num_layers=int(notes["mtp_num_layers"]))
                except (TunerError, ValueError) as e:
                    run.unrepresentable = f"note mtp_num_layers={notes['mtp_num_layers'][:40]!r}: {e}"
                    continue
            run.model = model
            reasons = []
            if not tok and not tfl:
                reasons.append("neither tokens/s/GPU nor model TFLOP/s/GPU is published")
            if "not megatron-core" in run.framework_version.lower():
                reasons.append("not Megatron-core (NeMo AutoModel: PyTorch FSDP2), whose costs differ")
            task = {"": "pretrain", "pre-training": "pretrain", "sft": "sft", "lora": "lora"}.get(r.get("task", "").strip().lower())
            if task is None:
                reasons.append(f"task {r.get('task')!r}: accepted Pre-Training, SFT or LoRA")
            if r.get("confidence", "").strip().lower().startswith("low"):
                reasons.append(f"confidence {r.get('confidence')!r} in the source table (internally inconsistent)")
            if ("tokendrop" in r.get("model", "").lower() or re.search(r"token[- ]?drop(ping)? (row|run)s? *\(this", low_notes)
                    or "model note: tokendrop" in low_notes or "capacity" in r.get("dispatcher", "").lower()):
                reasons.append("token dropping / fixed expert capacity is not modelled")
            if vpp is None:
                reasons.append(f"vpp {vpp_raw!r} is not a count of virtual stages")
            gpu = load_gpu(run.gpu_type)
            if prec != Precision.bf16 and not gpu.peak_flops(prec):
                reasons.append(f"{gpu.name} has no tensor cores for {prec.value}")
            if reasons:
                run.unrepresentable = "; ".join(reasons)
                continue
            try:
                run.cluster = _cluster(gpu, run.num_gpus)
                run.workload = Workload(seq_length=int(seq), global_batch_size=int(gbs), precision=prec,  # type: ignore[arg-type]
                                        task=task or "pretrain")
            except TunerError as e:  # out-of-range cells (e.g. 2,000,000 GPUs): this row only
                col = "num_gpus" if "GPUs" in str(e) else "seq_len / gbs"
                problems.append(RowProblem(i, rid, col, "out of range: " + str(e).split(': ', 1)[-1].replace('--seq-len and --global-batch', 'seq_len and gbs')))
                runs.pop()
                continue
            setting = functools.partial(_setting, r, notes)
            choice = functools.partial(_setting_choice, r, notes)
            natural = notes.get("routing", "").lower() == "natural"
            flag = functools.partial(_setting_flag, r, notes)
            cs = "cs" in re.split(r"[^a-z]+", r.get("precision", "").lower()) or "current" in r.get("precision", "").lower()
            optimizer = setting("optimizer", "adam")
            try:
                dispatcher = _dispatcher_cell(r.get("dispatcher", ""), notes)
                impl = choice("cuda_graph_impl", "none", CUDA_GRAPH_IMPLS)
                scope: tuple[str, ...] = ()
                if impl != "none":
                    raw_scope = setting("cuda_graph_scope", "")
                    scope = _list(raw_scope) if raw_scope else ("full",)
                if int(vpp) > 1 and int(pp) == 1:  # type: ignore[arg-type]
                    raise ValueError(f"vpp {int(vpp)} with pp 1: Megatron's virtual pipeline needs pp > 1")  # type: ignore[arg-type]
                run.options = RunOptions(
                    moe_router_force_load_balancing=model.is_moe and not natural,
                    cp_comm_type=notes.get("cp_comm_type", "p2p"),
                    overlap_moe_expert_parallel_comm=flag("overlap_moe_expert_parallel_comm", flag("moe_a2a_overlap", False)),
                    cuda_graph_scope=scope,
                    use_megatron_fsdp=flag("use_megatron_fsdp", int(notes.get("FSDP", "0") or 0) > 1 if notes.get("FSDP", "").isdigit() else False),
                    overlap_grad_reduce=flag("overlap_grad_reduce", True),
                    tp_comm_overlap=flag("tp_comm_overlap", True),
                    grad_reduce_in_fp32=flag("grad_reduce_in_fp32", True),
                    fp8_recipe=setting("fp8_recipe", "tensorwise" if cs else "delayed") if prec == Precision.fp8 else "delayed",
                    fp8_param_gather=flag("fp8_param_gather", False),
                    fp4_param_gather=flag("fp4_param_gather", False),
                    cross_entropy_loss_fusion=flag("cross_entropy_loss_fusion", False),
                    cross_entropy_fusion_impl=setting("cross_entropy_fusion_impl", "native"),
                    te_version=setting("te_version", _DEFAULT_OPTIONS.te_version),
                    cpu_offloading_num_layers=_setting_int(r, notes, "cpu_offloading_num_layers", 0),
                    optimizer=optimizer,
                    optimizer_fp8_recipe=_optional(setting("optimizer_fp8_recipe", "")) if prec == Precision.bf16 else None,
                )
                rec = _recompute(r.get("recompute", ""), notes)
                gran = choice("recompute_granularity", "", ("none", "selective", "full"))
                if gran == "none":
                    rec = {}
                elif gran == "selective":
                    mods = tuple(m for m in _list(setting("recompute_modules", "core_attn")) if m in RECOMPUTE_MODULES)
                    rec = dict(recompute_granularity="selective", recompute_modules=mods) if mods else {}
                elif gran == "full":
                    rec = dict(recompute_granularity="full", recompute_method=choice("recompute_method", "uniform", ("uniform", "block")),
                               recompute_num_layers=_setting_int(r, notes, "recompute_num_layers", 1))
                if notes.get("recompute") == "full":
                    rec = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=_setting_int({}, notes, "recompute_num_layers", 1))
                split = _pipeline_split(model, int(pp), int(vpp))  # type: ignore[arg-type]
                if "first_stage_layers" in notes:
                    split = (_setting_int({}, notes, "first_stage_layers", 0), _setting_int({}, notes, "last_stage_layers", 0))
                if split is None:
                    run.unrepresentable = f"{model.num_layers} layers cannot be split over pp {int(pp)} x vpp {int(vpp)}"  # type: ignore[arg-type]
                    continue
                stage_layer_counts(model.num_layers, int(pp), int(vpp), split[0], split[1])  # type: ignore[arg-type]  # a note's first/last split: this row only
                run.layout = Layout(
                    world_size=run.num_gpus, tp=int(tp), pp=int(pp), vpp=int(vpp), cp=int(cp), ep=int(ep) if model.is_moe else 1,  # type: ignore[arg-type]
                    etp=int(etp) if model.is_moe else 1, micro_batch_size=int(mbs), sequence_parallel=int(tp) > 1,  # type: ignore[arg-type]
                    dispatcher=dispatcher, num_layers_in_first_pipeline_stage=split[0], num_layers_in_last_pipeline_stage=split[1],
                    optimizer_offload_fraction=_note_fraction(notes, "optimizer_offload_fraction"),
                    use_precision_aware_optimizer=flag("use_precision_aware_optimizer", False) and optimizer == "adam",
                    exp_avg_dtype=setting("exp_avg_dtype", "fp32") or "fp32", exp_avg_sq_dtype=setting("exp_avg_sq_dtype", "fp32") or "fp32",
                    **rec,
                )
            except (TunerError, ValueError) as e:
                run.unrepresentable = f"layout not representable: {e}"
                continue
            world_ok = run.num_gpus % (int(tp) * int(pp) * int(cp)) == 0 and run.num_gpus % (run.layout.etp * run.layout.ep * int(pp)) == 0  # type: ignore[arg-type]
            if not world_ok:
                run.unrepresentable = f"{run.num_gpus} GPUs are not a multiple of TP x PP x CP or ETP x EP x PP"
                continue
            if model.is_moe and model.num_experts % run.layout.ep:
                run.unrepresentable = f"ep {run.layout.ep} does not divide {model.num_experts} experts"
    mark_release_regressions(runs)
    return runs, problems


#: Upper bounds of a published figure per GPU: a tokens/s/GPU above 10 M (the fastest published row is 45,275) or a model
#: TFLOP/s/GPU above 100,000 (GB300's dense fp4 peak is 15,000) is a typo, and would outrank the real runs it repeats
#: (:func:`mark_release_regressions`).
MAX_TOKENS_PER_S_PER_GPU = 1e7
MAX_TFLOPS_PER_GPU = 1e5

#: Two published runs of one configuration (model, GPUs, sequence, batch, precision, layout and every recipe setting
#: the model reads) further apart than this are not two measurements of a layout: the slower is a regression of its
#: release. In ``benchmarks/data/published_runs.csv`` the 58 configurations published more than once agree within
#: 1.16x; three are 1.58-1.77x apart (rows 59 / 60, 211 / 208, 212 / 209), and the page itself footnotes 211 and 212
#: as "GPT-OSS perf regression known issue (cudnn-frontend #256)" (benchmarks/data/published_runs.md).
RELEASE_REGRESSION_RATIO = 1.3


def _configuration_key(r: Run) -> tuple[Any, ...]:
    """What makes two published runs the same configuration: model, GPU, GPUs, sequence, global batch, precision,
    the published metric and the layout with every setting the reader takes (``layout_key``)."""
    return (r.model_name.lower(), r.gpu_type, r.num_gpus, r.seq_length, r.workload.global_batch_size,  # type: ignore[union-attr]
            r.precision, r.metric, r.layout_key)


def _comparable(runs: Sequence[Run]) -> dict[tuple[Any, ...], list[Run]]:
    groups: dict[tuple[Any, ...], list[Run]] = {}
    for r in runs:
        if r.unrepresentable or r.layout is None or r.workload is None or not r.published:
            continue
        groups.setdefault(_configuration_key(r), []).append(r)
    return groups


def mark_release_regressions(runs: Sequence[Run]) -> list[Run]:
    """Leave out (``unrepresentable``) each run that another run of the same configuration beat by at least
    :data:`RELEASE_REGRESSION_RATIO`: a software regression of its release, which no layout term can explain.

    Args:
        runs: as :func:`read_runs` builds them; only representable runs with a layout are compared, by
            ``(model, GPU, GPUs, seq_length, global_batch_size, precision, layout_key)`` and the published metric.

    Returns:
        The runs marked (in place), slowest first within each configuration.
    """
    marked: list[Run] = []
    for group in _comparable(runs).values():
        best = max(group, key=lambda r: r.published)
        for r in sorted(group, key=lambda r: r.published):
            ratio = best.published / r.published
            if ratio >= RELEASE_REGRESSION_RATIO:
                r.unrepresentable = (f"a release regression: row {best.run_id} ({best.framework_version or 'another release'}) ran "
                                     f"this configuration {ratio:.2f}x faster; two runs of one configuration {RELEASE_REGRESSION_RATIO:g}x or more "
                                     "apart are not a layout effect (benchmarks/data/published_runs.md)")
                marked.append(r)
    return marked


#: The NeMo container release the published-run predictions are made for: the newest in
#: ``benchmarks/data/published_runs.csv`` (26.08, Megatron-Bridge v0.6.0). A user's own estimate has no release and is
#: at this one.
REFERENCE_RELEASE = (26, 8)

#: Throughput a NeMo container release gains per month of releases, the same configuration run again
#: (:func:`measure_release_gain`: 30 configurations of the published runs published in two releases 2-7 months apart,
#: geometric mean 1.45% a month, oldest against newest; median pair 1.044x). Measured on the repeats alone, not
#: fitted to the model's errors. A published run of a release ``m`` months before :data:`REFERENCE_RELEASE` is
#: predicted ``(1 + gain) ** -m`` as fast (:func:`release_factor`).
RELEASE_GAIN_PER_MONTH = 0.0145


def container_release(framework_version: str) -> tuple[int, int] | None:
    """``(yy, mm)`` of the NeMo container a run's ``framework_version`` names (``"... container 26.02.01"`` ->
    ``(26, 2)``, any case); None when it names none (a verification card, Megatron-LM, the project's own measurements)
    or a month outside 01-12."""
    m = re.search(r"container (\d\d)\.(\d\d)(?!\d)", framework_version, re.IGNORECASE)
    return (int(m.group(1)), int(m.group(2))) if m and 1 <= int(m.group(2)) <= 12 else None


#: The oldest container release of the published tables (25.09): the trend is measured between it and
#: :data:`REFERENCE_RELEASE`, so an older release is priced as this one (no extrapolation).
OLDEST_MEASURED_RELEASE = (25, 9)


def months_before_reference(framework_version: str) -> int:
    """Months from a run's container release to :data:`REFERENCE_RELEASE` (0 when none is named or it is newer; at
    most the months from :data:`OLDEST_MEASURED_RELEASE`, the span the trend was measured over)."""
    rel = container_release(framework_version)
    if rel is None:
        return 0
    span = (REFERENCE_RELEASE[0] - OLDEST_MEASURED_RELEASE[0]) * 12 + REFERENCE_RELEASE[1] - OLDEST_MEASURED_RELEASE[1]
    return min(span, max(0, (REFERENCE_RELEASE[0] - rel[0]) * 12 + REFERENCE_RELEASE[1] - rel[1]))


def release_factor(framework_version: str, gain_per_month: float = RELEASE_GAIN_PER_MONTH) -> float:
    """Throughput of a run on its release relative to :data:`REFERENCE_RELEASE`: ``(1 + gain) ** -months``
    (1.0 for a run with no container release). Applied to published-run predictions only (:class:`RunBatch`)."""
    return float((1.0 + gain_per_month) ** -months_before_reference(framework_version))


def measure_release_gain(runs: Sequence[Run]) -> dict[str, Any]:
    """The throughput gain per month of releases, from configurations published in two or more releases.

    For each configuration (:func:`_configuration_key`; representable runs, release regressions already left out)
    with runs in releases of different months, the oldest and the newest run:
    ``gain = exp(sum(log(newest / oldest)) / sum(months apart)) - 1``.

    Returns:
        ``{"gain_per_month", "pairs", "median_ratio", "months"}`` (``pairs``: list of
        ``(oldest_id, newest_id, months, ratio)``); gain 0.0 when no pair exists.
    """
    pairs = []
    for group in _comparable(runs).values():
        dated = [(container_release(r.framework_version), r) for r in group]
        dated = [(d, r) for d, r in dated if d is not None]
        if len(dated) < 2:
            continue
        dated.sort(key=lambda x: x[0])  # type: ignore[arg-type, return-value]
        (d0, a), (d1, b) = dated[0], dated[-1]
        months = (d1[0] - d0[0]) * 12 + d1[1] - d0[1]  # type: ignore[index]
        if months > 0:
            pairs.append((a.run_id, b.run_id, months, b.published / a.published))
    total = sum(p[2] for p in pairs)
    gain = math.exp(sum(math.log(p[3]) for p in pairs) / total) - 1.0 if total else 0.0
    return {"gain_per_month": gain, "pairs": pairs, "median_ratio": statistics.median(p[3] for p in pairs) if pairs else 1.0,
            "months": sorted({p[2] for p in pairs})}


def _cluster(gpu: GPUSpec, num_gpus: int) -> Cluster:
    """The reference system of a GPU type: its usual node size, one NIC per GPU and its server type's fabric
    (:attr:`specs.GPUSpec.network`: InfiniBand on NVIDIA's DGX / NVL72 systems, the published runs' machines)."""
    per = min(gpu.gpus_per_node, num_gpus)
    if num_gpus % per:
        per = math.gcd(per, num_gpus)
    net = (gpu.network_bytes_per_s_per_gpu or 50e9) * per
    fabric = load_network("ib-ndr" if gpu.network.startswith("efa") else gpu.network) if gpu.network else None
    return Cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=per, inter_node_bytes_per_s=net, network=fabric)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A run and what the model predicts for it."""

    run: Run
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    fits: bool
    peak_gib: float

    @property
    def published(self) -> float:
        return float(self.run.published or float("nan"))

    @property
    def predicted(self) -> float:
        return self.tokens_per_s_per_gpu if self.run.metric == "tokens" else self.model_tflops_per_gpu

    @property
    def error(self) -> float:
        """predicted / published - 1."""
        return self.predicted / self.published - 1.0


def _group_key(run: Run) -> tuple[Any, ...]:
    w, c = run.workload, run.cluster
    return (run.model.name, run.model.mtp_num_layers, c.gpu.name, c.num_gpus, c.gpus_per_node, w.seq_length, w.global_batch_size, w.precision, run.options)  # type: ignore[union-attr]


class RunBatch:
    """Representable runs grouped so that each (model, cluster, workload, options) is one
    vectorised :func:`~cost_model.estimate.estimate_table` call (used by the fit, which
    predicts the same rows hundreds of times)."""

    def __init__(self, runs: Iterable[Run], *, release_gain: float | None = None) -> None:
        """``release_gain``: per month of container releases (default :data:`RELEASE_GAIN_PER_MONTH`)."""

        self.runs = [r for r in runs if not r.unrepresentable and r.layout is not None]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, r in enumerate(self.runs):
            groups.setdefault(_group_key(r), []).append(i)
        self.groups = [(idx, LayoutTable.from_layouts([self.runs[i].layout for i in idx])) for idx in groups.values()]
        gain = RELEASE_GAIN_PER_MONTH if release_gain is None else release_gain
        self.release_factor = np.array([release_factor(r.framework_version, gain) for r in self.runs])
        """Per run, :func:`release_factor` of its container release (multiplies its predicted throughput)."""

    def predict(self, calibration: Calibration) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens/s/GPU, model TFLOP/s/GPU, fits, peak GiB) per run, in ``self.runs`` order; throughput times each
        run's :attr:`release_factor` (the software of its container release, :data:`RELEASE_GAIN_PER_MONTH`)."""

        n = len(self.runs)
        tok, tfl, fits, peak = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n)
        for idx, table in self.groups:
            r = self.runs[idx[0]]
            e = estimate_table(r.model, r.cluster, r.workload, table, calibration=calibration, memory_headroom=0.0, options=r.options)  # type: ignore[arg-type]
            tok[idx], tfl[idx], fits[idx], peak[idx] = e.tokens_per_s_per_gpu, e.model_tflops_per_gpu, e.fits, e.peak_bytes / 2**30
        return tok * self.release_factor, tfl * self.release_factor, fits, peak

    def targets(self) -> np.ndarray:
        """The published number each run is compared with (tokens/s/GPU, else TFLOP/s/GPU)."""
        return np.array([r.published or float("nan") for r in self.runs])

    def predicted_metric(self, calibration: Calibration) -> np.ndarray:
        tok, tfl, _, _ = self.predict(calibration)
        is_tok = np.array([r.metric == "tokens" for r in self.runs])
        return np.where(is_tok, tok, tfl)


def predict_runs(runs: Sequence[Run], calibration: Calibration = DEFAULT_CALIBRATION) -> list[Prediction]:
    """Predictions for the representable runs (others are left to the caller to list with their reason)."""
    batch = RunBatch(runs)
    tok, tfl, fits, peak = batch.predict(calibration)
    return [Prediction(r, float(tok[i]), float(tfl[i]), bool(fits[i]), float(peak[i])) for i, r in enumerate(batch.runs)]


def _ranks(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):  # average ranks of ties
        m = a == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 3 points or a constant side."""
    if len(a) < 3:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _layout_groups(preds: Sequence[Prediction]) -> tuple[list[float], list[float]]:
    """Rows that differ in layout (options included): the median of repeated layouts, else each row."""
    by: dict[str, list[Prediction]] = {}
    for p in preds:
        by.setdefault(p.run.layout_key + f"|{p.run.num_gpus}|{p.run.workload}", []).append(p)
    pub = [statistics.median(q.published for q in v) for v in by.values()]
    pred = [statistics.median(q.predicted for q in v) for v in by.values()]
    return pred, pub


def summarize(preds: Sequence[Prediction], key: Any = None) -> list[dict[str, Any]]:
    """Per group (default: GPU type and precision): rows, median absolute error, MAPE, and
    Spearman within each model's rows that differ in layout (models with >= 3 such rows).

    Returns:
        One dict per group: ``group``, ``rows``, ``median_abs_error``, ``mape``,
        ``spearman`` (model -> rho) and ``spearman_median``.
    """
    key = key or (lambda p: (p.run.gpu_type, p.run.precision))
    groups: dict[Any, list[Prediction]] = {}
    for p in preds:
        groups.setdefault(key(p), []).append(p)
    out = []
    for g in sorted(groups, key=str):
        ps = groups[g]
        errs = np.abs([p.error for p in ps])
        rhos: dict[str, float] = {}
        by_model: dict[str, list[Prediction]] = {}
        for p in ps:
            by_model.setdefault(p.run.model_name if p.run.model is None else p.run.model.name, []).append(p)
        for m, mp in sorted(by_model.items()):
            pred, pub = _layout_groups(mp)
            rho = spearman(pred, pub)
            if not math.isnan(rho):
                rhos[m] = rho
        out.append({
            "group": g,
            "rows": len(ps),
            "median_abs_error": float(np.median(errs)),
            "mape": float(np.mean(errs)),
            "spearman": rhos,
            "spearman_median": float(np.median(list(rhos.values()))) if rhos else float("nan"),
        })
    return out


def flops_check_rows(runs: Sequence[Run], tolerance: float = 0.015) -> list[dict[str, Any]]:
    """Our FLOPs per token against each pre-training row's ``implied_gflop_per_token``.

    Rule for accounting changes (stated, not a hand-picked list): for each model, the rows of
    the newest Megatron release that published it define the reference accounting, as the
    median of ``implied / ours`` over those rows; a row whose ``implied / ours`` differs from
    that reference by more than ``tolerance`` (1.5%: beyond the rounding of the published
    tokens/s and TFLOP/s, whose ratio gives ``implied``) is excluded with the reason. This removes
    GPT-OSS-120B's rows up to 26.04.01 (27.2 GFLOP/token at 4K: Megatron-Bridge then counted
    its experts as non-gated and its sliding-window layers as full attention; 32.6 from
    26.06), NeMo 24.07's older Llama-3 formula, NeMo AutoModel's own formula, and any row whose
    tokens/s and TFLOP/s disagree in the source (Llama-3-70B row 101, 26.04.01: 439.3 where the
    other rows of its model give 449). Fine-tuning rows (LoRA / SFT) count
    differently (frozen weights) and are not checked.

    Returns:
        One dict per checked row: ``run``, ``ours`` and ``implied`` (GFLOP/token),
        ``error`` (ours / implied - 1), ``excluded`` ("" or the reason).
    """
    def release(r: Run) -> tuple[int, ...]:
        m = re.search(r"(\d\d)\.(\d\d)(?:\.(\d\d))?", r.framework_version)
        return tuple(int(x or 0) for x in m.groups()) if m else (0,)

    def megatron(r: Run) -> bool:
        f = r.framework_version.lower()
        return ("megatron" in f or "nemo" in f) and "automodel" not in f

    rows = [r for r in runs if r.model is not None and r.implied_gflop_per_token and r.task.lower() in ("", "pre-training")]
    ours = {id(r): megatron_flops_per_token(r.model, r.seq_length) / 1e9 for r in rows}  # type: ignore[arg-type]
    by_model: dict[str, list[Run]] = {}
    for r in rows:
        by_model.setdefault(r.model.name, []).append(r)  # type: ignore[union-attr]
    out = []
    for rs in by_model.values():
        mc = [r for r in rs if megatron(r)]
        newest = max((release(r) for r in mc), default=(0,))
        ref_ratios = [r.implied_gflop_per_token / ours[id(r)] for r in mc if release(r) == newest]  # type: ignore[operator]
        ref = statistics.median(ref_ratios) if ref_ratios else 1.0
        newest_label = ".".join(f"{x:02d}" for x in newest)
        for r in rs:
            o = ours[id(r)]
            ratio = r.implied_gflop_per_token / o  # type: ignore[operator]
            excluded = ""
            if abs(ratio / ref - 1) > tolerance:
                excluded = (
                    f"implied {r.implied_gflop_per_token:g} GFLOP/token differs by {(ratio / ref - 1) * 100:+.1f}% from the "
                    f"accounting of the newest release ({newest_label}) for this model"
                )
            out.append({"run": r, "ours": o, "implied": r.implied_gflop_per_token, "error": o / r.implied_gflop_per_token - 1, "excluded": excluded})  # type: ignore[operator]
    return out
