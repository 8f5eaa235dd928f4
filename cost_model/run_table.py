"""The run table ``tune validate`` and ``tune calibrate`` read: a CSV of measured runs (the columns of
``benchmarks/data/published_runs.csv``), each row a :class:`Run` or a :class:`RowProblem` naming its bad cell; rows the
model cannot represent keep the reason (:attr:`Run.unrepresentable`).

Conventions for published rows (``shared/data/published_runs.md``): MoE benchmarks force-balance the routing and are
dropless, except the 25.09 ``tokendrop`` rows; Megatron-Bridge and NeMo recipes overlap DP and TP communication; a blank
recompute cell is none, a blank dispatcher alltoall, a blank or ``1*`` ETP 1; the setting columns (Megatron's argument
names) hold what each row's recipe set (``benchmarks/data/published_runs_fixes.md``), else ``key=value`` in
``other_notes``, else fp32 main gradients, native cross-entropy, Adam and the fp8 recipe its precision cell names; two
runs of one configuration :data:`RELEASE_REGRESSION_RATIO` apart are a release's regression: the slower is left out.
A setting reader's ValueError names the cell and makes the row unrepresentable, with that reason."""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from search_spaces.pipeline import stage_layer_counts
from specs import (
    Cluster,
    GPUSpec,
    ModelSpec,
    Precision,
    RunOptions,
    Workload,
    list_gpus,
    list_models,
    load_gpu,
    load_model,
    load_network,
)
from specs.errors import InfeasibleLayout, TunerError
from specs.files import parse_errors, read_user_text
from specs.layout import RECOMPUTE_MODULES, Dispatcher, Layout
from specs.workload import CUDA_GRAPH_IMPLS

#: Columns a run table must have (any order; more columns are ignored).
REQUIRED_COLUMNS = ("model", "gpu_type", "num_gpus", "tp", "pp", "gbs", "seq_len", "precision")

#: Model names used in the published tables -> bundled presets (keys normalised by :func:`_norm`).
#: Llama 3 and Llama 3.1 share the architecture at 8K tokens (only RoPE scaling differs).
_ALIASES = {
    "llama38b": "Llama-3.1-8B", "llama318b": "Llama-3.1-8B", "llama370b": "Llama-3.1-70B",
    "llama3170b": "Llama-3.1-70B", "llama31405b": "Llama-3.1-405B", "llama3405b": "Llama-3.1-405B",
    "qwen330ba3b": "Qwen3-30B-A3B", "qwen3235ba22b": "Qwen3-235B-A22B", "deepseekv3": "DeepSeek-V3",
    "kimik2": "Kimi-K2", "gptoss120b": "GPT-OSS-120B", "mixtral8x7b": "Mixtral-8x7B", "mixtral8x22b": "Mixtral-8x22B",
    "minimaxm2": "MiniMax-M2", "minimaxm3": "MiniMax-M3"}

#: Model-name fragments the cost model has no layer type for, with the reason.
_UNREPRESENTABLE_MODELS = (
    ("nemotron3", "hybrid Mamba / attention MoE model: the cost model has no Mamba layers"),
    ("nemotron_3", "hybrid Mamba / attention MoE model: the cost model has no Mamba layers"),
    ("hybrid", "hybrid Mamba / attention model: the cost model has no Mamba layers"),
    ("qwen3next", "hybrid gated-DeltaNet model: the cost model has no linear-attention layers"),
    ("deepseekv4", "DeepSeek-V4: architecture not published in a form the presets cover"))

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
        return ModelSpec(
            name=name.split(" ")[0], num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            num_query_groups=heads, kv_channels=hidden // heads, ffn_hidden_size=4 * hidden, vocab_size=vocab,
            gated_linear_unit=False, untie_embeddings_and_output_weights=False, moe_layer_freq=(0,) * layers,
            source="Megatron-LM README weak-scaling table (standard GPT: MHA, 4h GeLU MLP)"), ""
    low = _norm(name) + " " + name.lower()
    for frag, why in _UNREPRESENTABLE_MODELS:
        if frag in low:
            return None, why
    return None, f"no bundled preset for model {name!r} (presets: {', '.join(list_models())})"


def _first_named(text: str, table: Sequence[tuple[str, Any]]) -> Any:
    """The value of the first ``(word, value)`` of ``table`` whose word is in ``text`` (lower-cased), or None."""
    t = text.lower()
    return next((v for word, v in table if word in t), None)


#: Words of a precision cell, checked in this order ("FP8-MX" is MXFP8, "FP8 blockwise" is not plain fp8).
_PRECISION_WORDS = (("fp4", Precision.nvfp4), ("mx", Precision.mxfp8), ("block", Precision.fp8_blockwise),
                    ("fp8", Precision.fp8), ("bf16", Precision.bf16))
#: Words of a dispatcher cell (each dispatcher's ``published_words``), checked in this order: a flex backend's
#: first, the longest first ("alltoall (flex backend unset)" is alltoall; "hybridep" is not "deepep").
_DISPATCHER_WORDS = tuple(sorted(((w, d) for d in Dispatcher for w in d.traits.published_words),
                                 key=lambda x: (not x[1].is_flex, -len(x[0]))))


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


def _num(r: dict[str, str], row: int, rid: str, problems: list[RowProblem], column: str, integer: bool = True,
         default: float | None = None) -> float | None:
    """The number in column ``column`` of row ``r`` (``default`` when blank); None with a problem added when it is
    not a non-negative number (an integer when ``integer``)."""
    raw = r.get(column, "")
    t = raw.strip().replace(",", "")
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
        problems.append(RowProblem(row, rid, column,
                                   f"{raw!r} is not a {'non-negative integer' if integer else 'non-negative number'}"))
        return None
    return v


#: ``key=value`` in a row's notes; keys may hold digits (``moe_a2a_overlap=True``, docs/production_sources.md F10).
_KV_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\]]*\]|[^;|,\s]+)")


def _setting(r: dict[str, str], notes: dict[str, str], key: str, default: str) -> str:
    """The row's column ``key`` when not blank, else the ``key=value`` of its notes, else ``default``."""
    v = (r.get(key) or "").strip()
    if v:
        return v
    return notes.get(key, default).strip("'\"")


def _setting_choice(r: dict[str, str], notes: dict[str, str], key: str, default: str, accepted: Sequence[str]) -> str:
    """A :func:`_setting` that must be one of ``accepted`` (case-insensitive; blank -> ``default``; else ValueError)."""
    v = _setting(r, notes, key, default).strip().lower()
    if not v:
        return default
    if v not in accepted:
        raise ValueError(f"{key} {v[:40]!r}: accepted {', '.join(accepted)} (or blank)")
    return v


def _dispatcher_cell(cell: str, notes: dict[str, str]) -> Dispatcher:
    """The token dispatcher of a row: its ``dispatcher`` cell (free text naming alltoall, allgather, DeepEP or
    HybridEP; blank = alltoall, Megatron's default; ``flex`` with no backend = DeepEP, the default of
    ``moe_flex_dispatcher_backend``) or its notes' ``moe_flex_dispatcher_backend`` / ``dispatcher``; ValueError for a
    non-blank cell that names none of them."""
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
    raise ValueError(f"dispatcher {cell.strip()[:40]!r}: name alltoall, allgather, DeepEP or HybridEP (or leave it "
                     "blank for alltoall)")


def _setting_int(r: dict[str, str], notes: dict[str, str], key: str, default: int) -> int:
    """A non-negative integer :func:`_setting` (blank -> ``default``; else ValueError)."""
    v = _setting(r, notes, key, "").strip()
    if not v:
        return default
    if not v.isdigit():
        raise ValueError(f"{key} {v[:40]!r}: expected a non-negative integer")
    return int(v)


def _note_fraction(notes: dict[str, str], key: str) -> float:
    """A note's fraction in [0, 1] (absent -> 0; else ValueError)."""
    v = notes.get(key, "").strip("'\"")
    try:
        f = float(v) if v else 0.0
    except ValueError:
        f = float("nan")
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"note {key}={v[:40]!r}: expected a fraction from 0 to 1")
    return f


def _setting_flag(r: dict[str, str], notes: dict[str, str], key: str, default: bool) -> bool:
    """A boolean :func:`_setting`: true / 1 / yes or false / 0 / no (else ValueError)."""
    v = (r.get(key) or "").strip().strip("'\"").lower()
    if v:
        if v not in ("true", "1", "yes", "false", "0", "no"):
            raise ValueError(f"{key} {r.get(key, '')[:40]!r}: expected true or false")
        return v in ("true", "1", "yes")
    n = notes.get(key)  # a note: true, 1 or yes (quotes ignored)
    return default if n is None else n.strip("'\"").lower() in ("true", "1", "yes")


def _optional(v: str) -> str | None:
    """A setting whose blank or ``none`` means unset."""
    return None if v.strip().lower() in ("", "none") else v.strip()


def _notes(text: str) -> dict[str, str]:
    return {k: v for k, v in _KV_RE.findall(text or "")}


def _lora_settings(notes: dict[str, str]) -> dict[str, Any]:
    """A LoRA row's adapters from its notes, Megatron-Bridge's ``LoRA`` fields: ``lora_rank=16`` (``dim``) and
    ``lora_target_modules=[linear_qkv]`` (``target_modules``); absent keys keep :class:`specs.Workload`'s defaults
    (Bridge's ``dim`` 32 on qkv, proj, fc1, fc2).

    Raises TunerError: a rank that is not a positive integer or a module :class:`specs.Workload` does not accept."""
    out: dict[str, Any] = {}
    if "lora_rank" in notes:
        raw = notes["lora_rank"].strip("'\"")
        if not raw.isdigit() or int(raw) <= 0:
            raise TunerError(f"lora_rank={raw[:20]!r}: a positive integer")
        out["lora_rank"] = int(raw)
    if "lora_target_modules" in notes:
        out["lora_target_modules"] = _list(notes["lora_target_modules"])
    if out:
        Workload(task="lora", **out)  # refuses a module it does not know, naming it
    return out


def _list(v: str) -> tuple[str, ...]:
    return tuple(x.strip(" '\"") for x in v.strip("[]").split(",") if x.strip(" '\""))


def _recompute(cell: str, notes: dict[str, str]) -> dict[str, Any]:
    text = (cell or "").strip().lower()
    mods = _list(notes["recompute_modules"]) if "recompute_modules" in notes else ()
    if "recompute_num_layers" in notes or text.startswith("recompute_num_layers") or text.startswith("full"):
        n = int(re.findall(r"\d+", notes.get("recompute_num_layers", text) or "1")[0]
                if re.findall(r"\d+", notes.get("recompute_num_layers", text)) else 1)
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
    ``--pipeline-model-parallel-layout``; the closest first/last split stands for it."""
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


def read_runs(paths: str | Path | Sequence[str | Path]) -> tuple[list[Run], list[RowProblem]]:
    """Read one or more run tables (CSV files with :data:`REQUIRED_COLUMNS`): ``(runs, problems)``, one :class:`Run`
    per row whose cells could be read (``unrepresentable`` set when the model cannot estimate it), and one
    :class:`RowProblem` per unreadable cell (that row is left out of ``runs``).

    Raises TunerError: a file is unreadable, not a CSV, or lacks a required column."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    runs: list[Run] = []
    problems: list[RowProblem] = []
    seen_ids: dict[str, str] = {}
    gpu_names = {g.lower(): g for g in list_gpus()}
    for path in paths:
        p = Path(path)
        table, cols = _read_csv(p)
        for i, raw in enumerate(table, start=1):
            run = _read_row(raw, i, p, cols, gpu_names, seen_ids, problems)
            if run is not None:
                runs.append(run)
    mark_release_regressions(runs)
    return runs, problems


def _read_csv(p: Path) -> tuple[list[dict[Any, Any]], list[str]]:
    """The rows of one run table and its header.

    Raises TunerError: unreadable, not a CSV, a column named twice, or a required column missing."""
    label = f"--data {str(p)!r}"
    # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
    text = read_user_text(p, label, "a CSV table of runs", encoding="utf-8-sig")
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
        raise TunerError(f"--data {str(p)!r}: missing column(s) {', '.join(missing)}; a run table needs "
                         f"{', '.join(REQUIRED_COLUMNS)} and tokens_per_s_per_gpu or model_tflops_per_gpu")
    if "tokens_per_s_per_gpu" not in cols and "model_tflops_per_gpu" not in cols:
        raise TunerError(f"--data {str(p)!r}: needs a tokens_per_s_per_gpu or model_tflops_per_gpu column")
    return table, cols


@dataclass(slots=True)
class _Cells:
    """The numeric cells of one row (None: unreadable, or blank where required) and its precision."""

    ngpu: float | None
    tp: float | None
    pp: float | None
    gbs: float | None
    seq: float | None
    vpp: float | None
    cp: float | None
    ep: float | None
    etp: float | None
    mbs: float | None
    tok: float | None
    tfl: float | None
    gflop: float | None
    prec: Precision | None


def _row_cells(r: dict[str, str], i: int, rid: str, here: list[RowProblem], p: Path, seen_ids: dict[str, str],
               gpu_names: dict[str, str]) -> _Cells:
    """Read a row's cells, adding a :class:`RowProblem` to ``here`` for each one that cannot be read."""
    num = functools.partial(_num, r, i, rid, here)
    ngpu, tp, pp, gbs, seq = num("num_gpus"), num("tp"), num("pp"), num("gbs"), num("seq_len")
    for c, v in (("num_gpus", ngpu), ("tp", tp), ("pp", pp), ("gbs", gbs), ("seq_len", seq)):
        if v is not None and v < 1:
            here.append(RowProblem(i, rid, c, f"{r.get(c)!r} must be at least 1"))
        if v is None and not any(pr.column == c for pr in here):
            here.append(RowProblem(i, rid, c, "empty"))
    vpp = num("vpp", default=1.0) if not re.search(r"[a-z]", r.get("vpp", "").lower()) else None
    cp, ep, etp, mbs = num("cp", default=1.0), num("ep", default=1.0), num("etp", default=1.0), num("mbs", default=1.0)
    tok = num("tokens_per_s_per_gpu", integer=False)
    tfl = num("model_tflops_per_gpu", integer=False)
    if r.get("id", "").strip():  # an explicit id (a blank one is the row's number, which repeats across files)
        if rid in seen_ids:
            here.append(RowProblem(i, rid, "id", f"id {rid!r} is already the id of row {seen_ids[rid]}; ids name rows "
                                                  "in messages and must be unique"))
        seen_ids.setdefault(rid, f"{i} of {p.name}")
    gflop = num("implied_gflop_per_token", integer=False)
    gname = r.get("gpu_type", "").strip()
    if gname.lower() not in gpu_names:
        here.append(RowProblem(i, rid, "gpu_type", f"unknown GPU type {gname!r}; known: {', '.join(list_gpus())}"))
    prec = cast("Precision | None", _first_named(r.get("precision", ""), _PRECISION_WORDS))
    if prec is None:
        here.append(RowProblem(i, rid, "precision",
                               f"{r.get('precision')!r}: expected BF16, FP8 (per-tensor / CS), FP8 blockwise, MXFP8 or "
                               "NVFP4"))
    if not r.get("model", "").strip():
        here.append(RowProblem(i, rid, "model", "empty"))
    return _Cells(ngpu, tp, pp, gbs, seq, vpp, cp, ep, etp, mbs, tok, tfl, gflop, prec)


def _read_row(raw: dict[Any, Any], i: int, p: Path, cols: list[str], gpu_names: dict[str, str],
              seen_ids: dict[str, str],
              problems: list[RowProblem]) -> Run | None:
    """One data row as a :class:`Run` (``unrepresentable`` set when the model cannot estimate it), or None with its
    cells' problems added to ``problems``."""
    r = {k.strip(): (v or "") for k, v in raw.items() if k is not None}
    rid = r.get("id", "").strip() or str(i)
    extra, short = len(raw.get(None) or []), sum(1 for k, v in raw.items() if k is not None and v is None)
    if extra or short:  # csv.DictReader pads a short row with blanks and keeps a long row's surplus apart
        problems.append(RowProblem(i, rid, "(row)",
                                   f"{len(cols) - short + extra} cells where the header has {len(cols)}: "
                                                  "a cell left out, or a comma in a cell that is not quoted"))
        return None
    here: list[RowProblem] = []
    c = _row_cells(r, i, rid, here, p, seen_ids, gpu_names)
    if here:
        problems.extend(here)
        return None
    assert c.prec is not None and c.ngpu is not None and c.seq is not None, "checked above"
    gname = r.get("gpu_type", "").strip()
    run = Run(
        row=i, run_id=rid, model_name=r["model"].strip(), gpu_type=gpu_names[gname.lower()], precision=c.prec.value,
        num_gpus=int(c.ngpu), published_tokens=c.tok or None, published_tflops=c.tfl or None,
        implied_gflop_per_token=c.gflop or None, seq_length=int(c.seq),
        framework_version=r.get("framework_version", "").strip(), task=r.get("task", "").strip(),
        is_moe=r.get("is_moe", "").strip().upper().startswith("Y"))
    notes_text = r.get("other_notes", "")
    notes = _notes(notes_text)
    model = _row_model(run, r, notes, p)
    if model is None:
        return run
    reasons, task, gpu = _unrepresentable_reasons(run, r, c, notes_text.lower())
    if reasons:
        run.unrepresentable = "; ".join(reasons)
        return run
    try:
        adapters = _lora_settings(notes) if task == "lora" else {}
    except TunerError as e:
        run.unrepresentable = f"notes: {e}"
        return run
    try:
        run.cluster = _cluster(gpu, run.num_gpus)
        run.workload = Workload(seq_length=int(c.seq), global_batch_size=int(c.gbs),  # type: ignore[arg-type]
                                precision=c.prec, task=task or "pretrain", **adapters)
    except TunerError as e:  # out-of-range cells (e.g. 2,000,000 GPUs): this row only
        col = "num_gpus" if "GPUs" in str(e) else "seq_len / gbs"
        problems.append(RowProblem(i, rid, col, "out of range: "
                                   + str(e).split(': ', 1)[-1].replace('--seq-len and --global-batch',
                                                                       'seq_len and gbs')))
        return None
    _read_layout(run, r, notes, model, c)
    return run


def _row_model(run: Run, r: dict[str, str], notes: dict[str, str], p: Path) -> ModelSpec | None:
    """The row's model (its MTP layers as the row says), set on ``run``; None with ``run.unrepresentable`` set when
    there is none."""
    model, why = _model_for(run.model_name, p.parent)
    if model is None:
        run.unrepresentable = why
        return None
    if model.is_moe:
        run.is_moe = True
    low_notes = r.get("other_notes", "").lower()
    if model.mtp_num_layers and "w/o mtp" in (low_notes + " " + run.framework_version.lower() + " "
                                              + r.get("model", "").lower()):
        model = model.replace(mtp_num_layers=0)
    if "mtp_num_layers" in notes:
        try:  # ModelSpec refuses a negative depth or one above the decoder's layers
            model = model.replace(mtp_num_layers=int(notes["mtp_num_layers"]))
        except (TunerError, ValueError) as e:
            run.unrepresentable = f"note mtp_num_layers={notes['mtp_num_layers'][:40]!r}: {e}"
            return None
    run.model = model
    return model


def _unrepresentable_reasons(run: Run, r: dict[str, str], c: _Cells, low_notes: str) -> tuple[list[str], str | None,
                                                                                              GPUSpec]:
    """Why the model cannot estimate the row (empty when it can), its task and its GPU."""
    reasons = []
    if not c.tok and not c.tfl:
        reasons.append("neither tokens/s/GPU nor model TFLOP/s/GPU is published")
    if "not megatron-core" in run.framework_version.lower():
        reasons.append("not Megatron-core (NeMo AutoModel: PyTorch FSDP2), whose costs differ")
    task = {"": "pretrain", "pre-training": "pretrain", "sft": "sft",
            "lora": "lora"}.get(r.get("task", "").strip().lower())
    if task is None:
        reasons.append(f"task {r.get('task')!r}: accepted Pre-Training, SFT or LoRA")
    if r.get("confidence", "").strip().lower().startswith("low"):
        reasons.append(f"confidence {r.get('confidence')!r} in the source table (internally inconsistent)")
    if ("tokendrop" in r.get("model", "").lower() or re.search(r"token[- ]?drop(ping)? (row|run)s? *\(this", low_notes)
            or "model note: tokendrop" in low_notes or "capacity" in r.get("dispatcher", "").lower()):
        reasons.append("token dropping / fixed expert capacity is not modelled")
    if c.vpp is None:
        reasons.append(f"vpp {r.get('vpp', '')!r} is not a count of virtual stages")
    gpu = load_gpu(run.gpu_type)
    assert c.prec is not None
    if c.prec != Precision.bf16 and not gpu.peak_flops(c.prec):
        reasons.append(f"{gpu.name} has no tensor cores for {c.prec.value}")
    return reasons, task, gpu


def _cuda_graph_scope(r: dict[str, str], notes: dict[str, str]) -> tuple[str, ...]:
    """The row's CUDA graph scope (``full`` when a graph implementation is named without one; none without);
    ValueError for an implementation not in :data:`CUDA_GRAPH_IMPLS`."""
    if _setting_choice(r, notes, "cuda_graph_impl", "none", CUDA_GRAPH_IMPLS) == "none":
        return ()
    raw_scope = _setting(r, notes, "cuda_graph_scope", "")
    return _list(raw_scope) if raw_scope else ("full",)


def _row_options(r: dict[str, str], notes: dict[str, str], model: ModelSpec, prec: Precision,
                 scope: tuple[str, ...]) -> RunOptions:
    """The row's run options: its setting columns, else its notes, else the defaults of the module docstring."""
    setting = functools.partial(_setting, r, notes)
    flag = functools.partial(_setting_flag, r, notes)
    cs = "cs" in re.split(r"[^a-z]+", r.get("precision", "").lower()) or "current" in r.get("precision", "").lower()
    return RunOptions(
        moe_router_force_load_balancing=model.is_moe and notes.get("routing", "").lower() != "natural",
        cp_comm_type=notes.get("cp_comm_type", "p2p"),
        overlap_moe_expert_parallel_comm=flag("overlap_moe_expert_parallel_comm", flag("moe_a2a_overlap", False)),
        cuda_graph_scope=scope,
        use_megatron_fsdp=flag("use_megatron_fsdp", int(notes.get("FSDP", "0") or 0) > 1
                               if notes.get("FSDP", "").isdigit() else False),
        overlap_grad_reduce=flag("overlap_grad_reduce", True), tp_comm_overlap=flag("tp_comm_overlap", True),
        grad_reduce_in_fp32=flag("grad_reduce_in_fp32", True),
        fp8_recipe=setting("fp8_recipe", "tensorwise" if cs else "delayed") if prec == Precision.fp8 else "delayed",
        fp8_param_gather=flag("fp8_param_gather", False), fp4_param_gather=flag("fp4_param_gather", False),
        cross_entropy_loss_fusion=flag("cross_entropy_loss_fusion", False),
        cross_entropy_fusion_impl=setting("cross_entropy_fusion_impl", "native"),
        te_version=setting("te_version", _DEFAULT_OPTIONS.te_version),
        cpu_offloading_num_layers=_setting_int(r, notes, "cpu_offloading_num_layers", 0),
        optimizer=setting("optimizer", "adam"),
        optimizer_fp8_recipe=_optional(setting("optimizer_fp8_recipe", "")) if prec == Precision.bf16 else None)


def _row_recompute(r: dict[str, str], notes: dict[str, str]) -> dict[str, Any]:
    """The row's recompute fields of :class:`Layout`: its recompute columns win over its notes and cell."""
    choice = functools.partial(_setting_choice, r, notes)
    rec = _recompute(r.get("recompute", ""), notes)
    gran = choice("recompute_granularity", "", ("none", "selective", "full"))
    if gran == "none":
        rec = {}
    elif gran == "selective":
        mods = tuple(m for m in _list(_setting(r, notes, "recompute_modules", "core_attn")) if m in RECOMPUTE_MODULES)
        rec = dict(recompute_granularity="selective", recompute_modules=mods) if mods else {}
    elif gran == "full":
        rec = dict(recompute_granularity="full", recompute_method=choice("recompute_method", "uniform",
                                                                         ("uniform", "block")),
                   recompute_num_layers=_setting_int(r, notes, "recompute_num_layers", 1))
    if notes.get("recompute") == "full":
        rec = dict(recompute_granularity="full", recompute_method="uniform",
                   recompute_num_layers=_setting_int({}, notes, "recompute_num_layers", 1))
    return rec


def _read_layout(run: Run, r: dict[str, str], notes: dict[str, str], model: ModelSpec, c: _Cells) -> None:
    """Set the row's options and layout on ``run``, or ``run.unrepresentable`` with the reason."""
    sizes = (c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp, c.mbs)
    tp, pp, vpp, cp, ep, etp, mbs = (int(x) for x in sizes)  # type: ignore[arg-type]
    assert c.prec is not None
    try:
        dispatcher = _dispatcher_cell(r.get("dispatcher", ""), notes)
        scope = _cuda_graph_scope(r, notes)
        if vpp > 1 and pp == 1:
            raise ValueError(f"vpp {vpp} with pp 1: Megatron's virtual pipeline needs pp > 1")
        run.options = _row_options(r, notes, model, c.prec, scope)
        rec = _row_recompute(r, notes)
        split = _pipeline_split(model, pp, vpp)
        if "first_stage_layers" in notes:
            split = (_setting_int({}, notes, "first_stage_layers", 0), _setting_int({}, notes, "last_stage_layers", 0))
        if split is None:
            run.unrepresentable = f"{model.num_layers} layers cannot be split over pp {pp} x vpp {vpp}"
            return
        stage_layer_counts(model.num_layers, pp, vpp, split[0], split[1])  # a note's first/last split: this row only
        run.layout = Layout(
            world_size=run.num_gpus, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep if model.is_moe else 1,
            etp=etp if model.is_moe else 1, micro_batch_size=mbs, sequence_parallel=tp > 1,
            dispatcher=dispatcher, num_layers_in_first_pipeline_stage=split[0],
            num_layers_in_last_pipeline_stage=split[1],
            optimizer_offload_fraction=_note_fraction(notes, "optimizer_offload_fraction"),
            use_precision_aware_optimizer=_setting_flag(r, notes, "use_precision_aware_optimizer", False)
            and _setting(r, notes, "optimizer", "adam") == "adam",
            exp_avg_dtype=_setting(r, notes, "exp_avg_dtype", "fp32") or "fp32",
            exp_avg_sq_dtype=_setting(r, notes, "exp_avg_sq_dtype", "fp32") or "fp32",
            **rec,
        )
    except (TunerError, ValueError) as e:
        run.unrepresentable = f"layout not representable: {e}"
        return
    if run.num_gpus % (tp * pp * cp) or run.num_gpus % (run.layout.etp * run.layout.ep * pp):
        run.unrepresentable = f"{run.num_gpus} GPUs are not a multiple of TP x PP x CP or ETP x EP x PP"
        return
    if model.is_moe and model.num_experts % run.layout.ep:
        run.unrepresentable = f"ep {run.layout.ep} does not divide {model.num_experts} experts"


#: Two published runs of one configuration (model, GPUs, sequence, batch, precision, layout and every recipe setting
#: the model reads) further apart than this are not two measurements of a layout: the slower is a regression of its
#: release. In ``benchmarks/data/published_runs.csv`` the 58 configurations published more than once agree within
#: 1.16x; three are 1.58-1.77x apart (rows 59 / 60, 211 / 208, 212 / 209), and the page itself footnotes 211 and 212
#: as "GPT-OSS perf regression known issue (cudnn-frontend #256)" (benchmarks/data/published_runs.md).
RELEASE_REGRESSION_RATIO = 1.3


def _configuration_key(r: Run) -> tuple[Any, ...]:
    """What makes two published runs the same configuration: model, GPU, GPUs, sequence, global batch, precision,
    the published metric and the layout with every setting the reader takes (``layout_key``)."""
    return (r.model_name.lower(), r.gpu_type, r.num_gpus, r.seq_length,
            r.workload.global_batch_size, r.precision, r.metric, r.layout_key)  # type: ignore[union-attr]


def _comparable(runs: Sequence[Run]) -> dict[tuple[Any, ...], list[Run]]:
    groups: dict[tuple[Any, ...], list[Run]] = {}
    for r in runs:
        if r.unrepresentable or r.layout is None or r.workload is None or not r.published:
            continue
        groups.setdefault(_configuration_key(r), []).append(r)
    return groups


def mark_release_regressions(runs: Sequence[Run]) -> list[Run]:
    """Leave out (``unrepresentable``) each run that another run of the same configuration (:func:`_configuration_key`;
    representable runs with a layout) beat by at least :data:`RELEASE_REGRESSION_RATIO`: a software regression of its
    release, which no layout term can explain. Returns the runs marked (in place), slowest first per configuration."""
    marked: list[Run] = []
    for group in _comparable(runs).values():
        best = max(group, key=lambda r: r.published)
        for r in sorted(group, key=lambda r: r.published):
            ratio = best.published / r.published
            if ratio >= RELEASE_REGRESSION_RATIO:
                r.unrepresentable = (f"a release regression: row {best.run_id} "
                                     f"({best.framework_version or 'another release'}) ran "
                                     f"this configuration {ratio:.2f}x faster; two runs of one configuration "
                                     f"{RELEASE_REGRESSION_RATIO:g}x or more "
                                     "apart are not a layout effect (benchmarks/data/published_runs.md)")
                marked.append(r)
    return marked


def _cluster(gpu: GPUSpec, num_gpus: int) -> Cluster:
    """The reference system of a GPU type: its usual node size, one NIC per GPU and its server type's fabric
    (:attr:`specs.GPUSpec.network`: InfiniBand on NVIDIA's DGX / NVL72 systems, the published runs' machines)."""
    per = min(gpu.gpus_per_node, num_gpus)
    if num_gpus % per:
        per = math.gcd(per, num_gpus)
    net = (gpu.network_bytes_per_s_per_gpu or 50e9) * per
    fabric = load_network("ib-ndr" if gpu.network.startswith("efa") else gpu.network) if gpu.network else None
    return Cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=per, inter_node_bytes_per_s=net, network=fabric)

