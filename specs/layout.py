"""The parallel layout of one training job, and a columnar table of many.

Field names are Megatron-core's (``ModelParallelConfig`` / ``TransformerConfig``
/ ``OptimizerConfig``) so that a layout maps flag for flag onto a run command."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from specs.errors import TunerError


class RecomputeGranularity(str, Enum):
    """``--recompute-granularity``; ``none`` means the flag is not given."""

    none = "none"
    selective = "selective"
    full = "full"

    def __str__(self) -> str:
        return self.value

    @property
    def recomputes_modules(self) -> bool:
        """Selective: the ``--recompute-modules`` of every layer are re-run in backward, the rest of
        the layer's activations are kept (transformer_layer.py ``_forward_attention`` / ``_forward_mlp``
        checkpoint only those submodules)."""
        return self is RecomputeGranularity.selective

    @property
    def recomputes_whole_layers(self) -> bool:
        """Full: a recomputed layer keeps only its input; its whole forward is re-run in backward
        (transformer_block.py ``_checkpointed_forward``)."""
        return self is RecomputeGranularity.full


class RecomputeMethod(str, Enum):
    """``--recompute-method`` (full recompute only); ``none`` when unset."""

    none = "none"
    uniform = "uniform"
    block = "block"

    def __str__(self) -> str:
        return self.value

    @property
    def recomputes_every_layer(self) -> bool:
        """Uniform: every layer of a chunk is recomputed, in groups of ``recompute_num_layers`` whose
        input is kept once; block: only the first ``recompute_num_layers`` layers of each chunk are
        (transformer_block.py ``_checkpointed_forward``)."""
        return self is RecomputeMethod.uniform


class Dispatcher(str, Enum):
    """MoE token dispatcher: ``--moe-token-dispatcher-type`` plus, for flex, ``--moe-flex-dispatcher-backend``.

    What each member means to Megatron, the cost model, the trial harness and the run tables is its row of
    :data:`_DISPATCHER_TRAITS` (just below): adding a dispatcher is one member here and one row there; the table column,
    the rules, the estimate, the exported flags, the recipe schema's enum, the harness's check and the published-run
    reader read them. Its fabric figures (``specs/data/networks.yaml``) are optional: without them it is priced as NCCL.
    """

    alltoall = "alltoall"
    allgather = "allgather"
    flex_deepep = "flex+deepep"
    flex_hybridep = "flex+hybridep"

    def __str__(self) -> str:
        return self.value

    @property
    def moe_token_dispatcher_type(self) -> str:
        """Megatron's ``--moe-token-dispatcher-type`` value (``allgather``, ``alltoall`` or ``flex``)."""
        return _DISPATCHER_TRAITS[self].moe_token_dispatcher_type

    @property
    def moe_flex_dispatcher_backend(self) -> str | None:
        """Megatron's ``--moe-flex-dispatcher-backend`` value (``deepep``, ``hybridep``); None unless flex."""
        return _DISPATCHER_TRAITS[self].moe_flex_dispatcher_backend

    @property
    def traits(self) -> _DispatcherTraits:
        """Its row of :data:`_DISPATCHER_TRAITS` (library, harness probe, published spellings)."""
        return _DISPATCHER_TRAITS[self]

    @property
    def is_flex(self) -> bool:
        """The flex dispatcher (``MoEFlexTokenDispatcher``, megatron/core/transformer/moe/token_dispatcher.py):
        needs expert TP x EP > 1, sends a token once to each distinct GPU holding one of its experts,
        keeps fixed communication buffers and has no device-to-host sync of the token counts."""
        return self.moe_token_dispatcher_type == "flex"

    @property
    def is_allgather(self) -> bool:
        """The allgather dispatcher (``MoEAllGatherTokenDispatcher``): every token goes to every EP rank."""
        return self.moe_token_dispatcher_type == "allgather"


@dataclass(frozen=True, slots=True)
class _DispatcherTraits:
    """What a :class:`Dispatcher` member is: its Megatron flags, the library its kernels come from, what the
    trial harness must find installed to run it, and the words that name it in a published run's table."""

    moe_token_dispatcher_type: str
    moe_flex_dispatcher_backend: str | None
    library: str = ""
    """The communication library of a flex backend (``DeepEP``, ``HybridEP``); "" for Megatron's own."""
    harness_probe: str | None = None
    """The :class:`launch.harness.spec.HarnessEnv` field that must be true for the harness to run it; None: always
    runs."""
    published_words: tuple[str, ...] = ()
    """Lower-case words that name it in a run table's dispatcher cell (:mod:`cost_model.validate` looks for a flex
    backend's words first, the longest first: ``hybridep`` before ``deepep`` before ``allgather``)."""


#: One row per :class:`Dispatcher` member (checked at import below).
_DISPATCHER_TRAITS: dict[Dispatcher, _DispatcherTraits] = {
    Dispatcher.alltoall: _DispatcherTraits("alltoall", None, published_words=("alltoall",)),
    Dispatcher.allgather: _DispatcherTraits("allgather", None, published_words=("allgather",)),
    Dispatcher.flex_deepep: _DispatcherTraits("flex", "deepep", "DeepEP", "deep_ep", ("deepep",)),
    Dispatcher.flex_hybridep: _DispatcherTraits("flex", "hybridep", "HybridEP", "hybrid_ep", ("hybridep",)),
}
assert set(_DISPATCHER_TRAITS) == set(Dispatcher), "every Dispatcher member needs its _DISPATCHER_TRAITS row"


#: ``--recompute-modules`` values accepted by megatron-core 0.16 (slime's pin 1dcf0da),
#: transformer_config.py ``recompute_modules`` docstring / validation.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")

#: ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` values the tuner searches (bf16 needs the precision-aware optimizer).
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One candidate parallel layout of a training job.

    ``dp`` and ``edp`` are derived (Megatron's ``parallel_state``):
    ``dp = world_size / (tp * pp * cp)`` and ``edp = world_size / (etp * ep * pp)``."""

    world_size: int
    """GPUs in the job."""
    tp: int = 1
    """``--tensor-model-parallel-size``."""
    pp: int = 1
    """``--pipeline-model-parallel-size``."""
    vpp: int = 1
    """Virtual pipeline stages per pipeline rank; 1 = not interleaved."""
    cp: int = 1
    """``--context-parallel-size``."""
    ep: int = 1
    """``--expert-model-parallel-size``."""
    etp: int = 1
    """``--expert-tensor-parallel-size``."""
    micro_batch_size: int = 1
    """Rows (sequences of ``seq_length`` tokens) per micro-batch."""
    sequence_parallel: bool = False
    """``--sequence-parallel``; the search turns it on whenever tp > 1."""
    recompute_granularity: RecomputeGranularity = RecomputeGranularity.none
    recompute_method: RecomputeMethod = RecomputeMethod.none
    recompute_num_layers: int = 0
    """Layers per recompute group (uniform) or recomputed per chunk (block); 0 when unset."""
    recompute_modules: tuple[str, ...] = ()
    """``--recompute-modules`` for selective recompute."""
    optimizer_offload_fraction: float = 0.0
    """Share of optimizer states kept and stepped on the CPU (``--optimizer-cpu-offload``); 0 = none."""
    overlap_cpu_optimizer_d2h_h2d: bool = True
    """``--overlap-cpu-optimizer-d2h-h2d`` when offloading."""
    dispatcher: Dispatcher = Dispatcher.alltoall
    use_distributed_optimizer: bool = True
    use_precision_aware_optimizer: bool = True
    exp_avg_dtype: str = "fp32"
    """``--exp-avg-dtype`` (fp32 or bf16; bf16 needs the precision-aware optimizer)."""
    exp_avg_sq_dtype: str = "fp32"
    """``--exp-avg-sq-dtype``."""
    num_layers_in_first_pipeline_stage: int = 0
    """Decoder layers on pipeline rank 0 (over all its virtual stages); 0 = even split."""
    num_layers_in_last_pipeline_stage: int = 0
    """Decoder layers on the last pipeline rank; 0 = even split."""

    def __post_init__(self) -> None:
        sizes = ("world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size")
        for f in sizes:
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise TunerError(f"layout {f} must be a positive integer, got {v!r}")
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise TunerError(f"optimizer_offload_fraction must be in [0, 1], got {self.optimizer_offload_fraction}")
        for m in self.recompute_modules:
            if m not in RECOMPUTE_MODULES:
                raise TunerError(f"recompute module {m!r} is unknown; accepted: {', '.join(RECOMPUTE_MODULES)}")
        for f in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(self, f) not in OPTIMIZER_STATE_DTYPES:
                raise TunerError(f"{f} must be fp32 or bf16, got {getattr(self, f)!r}")
        # Normalise enums given as strings.
        for name, enum, flag in (
            ("recompute_granularity", RecomputeGranularity, "--recompute"),
            ("recompute_method", RecomputeMethod, "--recompute-method"), ("dispatcher", Dispatcher, "--dispatcher")):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))
            except ValueError:
                accepted = ", ".join(e.value for e in enum)
                raise TunerError(f"{flag} {getattr(self, name)!r}: accepted {accepted}") from None
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense grid, ``world / (tp*pp*cp)`` (floor; rules check divisibility)."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size, ``world / (etp*ep*pp)`` (CP folds into it)."""
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def offload_label(self) -> str:
        if self.optimizer_offload_fraction <= 0:
            return "none"
        return f"optimizer {self.optimizer_offload_fraction:g}"

    @property
    def recompute_label(self) -> str:
        g = self.recompute_granularity
        if g == RecomputeGranularity.none:
            return "none"
        if g == RecomputeGranularity.selective:
            return "selective " + "+".join(self.recompute_modules or ("core_attn",))
        return f"full {self.recompute_method.value} {self.recompute_num_layers}"

    @property
    def label(self) -> str:
        """Short label in the seed's style, e.g. ``TP1 PP8 VPP4 EP8 DP8``."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"] + [f"{name}{n}" for name, n in (
            ("VPP", self.vpp), ("CP", self.cp), ("EP", self.ep), ("ETP", self.etp)) if n != 1]
        mp = self.tp * self.pp * self.cp
        parts.append(f"DP{self.dp}" if self.world_size % mp == 0 else "DP?")
        return " ".join(parts)

    def key(self) -> str:
        """A canonical string that identifies the layout (used to never run one twice)."""
        d = self.to_dict()
        return "|".join(f"{k}={d[k]}" for k in sorted(d))

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (enums as strings, tuples as lists) for YAML/JSON."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, np.generic):
                v = v.item()
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Layout:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`TunerError`."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"dp", "edp", "label"}
        if unknown:
            raise TunerError(f"unknown layout keys {sorted(unknown)}; accepted: {sorted(names)}")
        kw = {k: v for k, v in d.items() if k in names}
        if "recompute_modules" in kw:
            mods = kw["recompute_modules"]
            kw["recompute_modules"] = tuple(m for m in (mods.split(",") if isinstance(mods, str) else mods or ()) if m)
        return cls(**kw)

    def replace(self, **changes: Any) -> Layout:
        return dataclasses.replace(self, **changes)


def categories(values: npt.NDArray[Any]) -> tuple[list[str], npt.NDArray[np.intp]]:
    """Distinct strings of a unicode column and each row's index into them.

    Hashes the UCS-4 code points (only the character positions used by some row)
    to uint64 first: ``np.unique`` on unicode arrays sorts strings and is several
    times slower on the ~10^6-row tables of a search space."""
    if len(values) == 0:
        return [], np.zeros(0, dtype=np.intp)
    width = values.dtype.itemsize // 4
    cps = np.ascontiguousarray(values).view(np.uint32).reshape(len(values), width)
    used = np.flatnonzero(cps.any(axis=0))
    h = np.zeros(len(values), dtype=np.uint64)
    for j in used:
        h = h * np.uint64(1_000_003) ^ cps[:, j].astype(np.uint64)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    uniq = values[first]
    if not np.array_equal(uniq[inv], values):  # a hash collision: fall back to sorting strings
        u2, inv2 = np.unique(values, return_inverse=True)
        return [str(v) for v in u2], np.asarray(inv2, dtype=np.intp).reshape(-1)
    return [str(v) for v in uniq], np.asarray(inv, dtype=np.intp)


def _encode(values: npt.NDArray[Any]) -> tuple[npt.NDArray[np.str_], npt.NDArray[np.int16]]:
    """A string column as its categories and each row's :data:`CODE_DTYPE` code: for a few rows the distinct values
    in order of appearance, else :func:`categories`' order.

    Raises ValueError: more distinct values than the codes can count."""
    strings = values if values.dtype.kind == "U" else values.astype(str)
    if len(strings) <= 64:
        first = {v: i for i, v in enumerate(dict.fromkeys(strings.reshape(-1).tolist()))}
        return np.array(list(first), dtype=str), np.array([first[v] for v in strings.reshape(-1).tolist()],
                                                          dtype=CODE_DTYPE)
    uniq, inv = categories(strings.reshape(-1))
    if len(uniq) > np.iinfo(CODE_DTYPE).max:
        raise ValueError(f"a LayoutTable string column holds {len(uniq)} distinct values, more than its codes count")
    return np.array(uniq, dtype=str), inv.astype(CODE_DTYPE)


_E = TypeVar("_E", bound=Enum)


def enum_mask(table: LayoutTable, column: str, enum: type[_E],
              predicate: Callable[[_E], bool]) -> npt.NDArray[np.bool_]:
    """``predicate`` of each row's member of ``enum`` in the string ``column`` of ``table``, a bool array of shape
    ``(len(table),)``; the predicate (e.g. ``lambda d: d.is_flex``) runs once per category (:meth:`LayoutTable.where`).
    How rules and the cost model read what a setting means, instead of comparing spellings."""
    holds = {member.value: predicate(member) for member in enum}
    return table.where(column, lambda v: holds.get(v, False))


#: Column dtypes of a :class:`LayoutTable` (one per Layout field), as ``table[name]`` gives them. ``str``
#: columns (enum values, the comma-joined recompute modules) are held as codes into categories.
_COLUMNS: dict[str, Any] = {f.name: {"int": np.int64, "bool": np.bool_, "float": np.float64}.get(str(f.type), str)
                            for f in dataclasses.fields(Layout)}

#: The string columns of a :class:`LayoutTable`: always held as codes.
CODED_COLUMNS: tuple[str, ...] = tuple(k for k, v in _COLUMNS.items() if v is str)

#: dtype of the codes of a string column given as strings.
CODE_DTYPE = np.int16


def _as_column(name: str, values: Any) -> npt.NDArray[Any]:
    """``values`` as numeric column ``name``'s dtype."""
    return np.asarray(values).astype(_COLUMNS[name], copy=False)


class LayoutTable:
    """Many layouts as numpy columns (struct of arrays), for vectorised rules and estimates.

    Columns are the :class:`Layout` field names (``dp`` and ``edp`` derived; ``recompute_modules`` comma-joined).
    ``cols`` holds each column's values, or integer codes into ``categories[name]`` (``table[name]`` is then
    ``categories[name][codes]``, a new array each call); categories may repeat a value and columns may share one codes
    array (:func:`search_spaces.space.enumerate_layouts`). String columns (:data:`CODED_COLUMNS`) are always coded.

    Raises ValueError: a column missing, lengths that differ, a string column's codes without categories, or values with
    categories."""

    __slots__ = ("cols", "cats")

    def __init__(self, cols: Mapping[str, npt.NDArray[Any]],
                 categories: Mapping[str, npt.NDArray[Any]] | None = None) -> None:
        missing = set(_COLUMNS) - set(cols)
        if missing:
            raise ValueError(f"LayoutTable is missing columns {sorted(missing)}")
        n = {len(np.asarray(v)) for v in cols.values()}
        if len(n) > 1:
            raise ValueError(f"LayoutTable columns differ in length: {n}")
        given = categories or {}
        self.cols: dict[str, npt.NDArray[Any]] = {}
        self.cats: dict[str, npt.NDArray[Any]] = {}
        for k, dtype in _COLUMNS.items():
            v = np.asarray(cols[k])
            if k in given:
                if v.dtype.kind not in "iu":
                    raise ValueError(f"LayoutTable column {k}: categories given with {v.dtype} values, not codes")
                self.cols[k] = v
                self.cats[k] = np.asarray(given[k]) if dtype is str else np.asarray(given[k]).astype(dtype, copy=False)
            elif dtype is not str:
                self.cols[k] = _as_column(k, v)
            elif v.dtype.kind in "UO" or not len(v):
                self.cats[k], self.cols[k] = _encode(v)
            else:
                raise ValueError(f"LayoutTable column {k}: {v.dtype} values without categories, not strings")

    def __len__(self) -> int:
        return len(self.cols["tp"])

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        """Column ``name``'s values, shape ``(n,)`` (decoded from its codes, a new array, when coded)."""
        if name in self.cats:
            decoded: npt.NDArray[Any] = self.cats[name][self.cols[name]]
            return decoded
        return self.cols[name]

    def codes(self, name: str) -> tuple[npt.NDArray[Any], npt.NDArray[np.integer[Any]]]:
        """Column ``name`` as categories and each row's code into them (shape ``(n,)``); a column held as
        values gives its distinct values."""
        if name in self.cats:
            return self.cats[name], self.cols[name]
        uniq, inv = np.unique(self.cols[name], return_inverse=True)
        return uniq, inv.reshape(-1)

    def where(self, name: str, predicate: Callable[[Any], bool]) -> npt.NDArray[np.bool_]:
        """``predicate`` of each row's value of column ``name``, run once per category; shape ``(n,)``."""
        cats, codes = self.codes(name)
        per_category = np.array([bool(predicate(c)) for c in cats.tolist()], dtype=np.bool_)
        out: npt.NDArray[np.bool_] = per_category[codes]
        return out

    def isin(self, name: str, *values: Any) -> npt.NDArray[np.bool_]:
        """Rows whose column ``name`` is one of ``values``; shape ``(n,)``."""
        return self.where(name, lambda v: v in values)

    @property
    def dp(self) -> np.ndarray:
        """Dense data-parallel size per row, ``world / (tp pp cp)``."""
        out: np.ndarray = self["world_size"] // (self["tp"] * self["pp"] * self["cp"])
        return out

    @property
    def edp(self) -> np.ndarray:
        """Expert data-parallel size per row, ``world / (etp ep pp)``."""
        out: np.ndarray = self["world_size"] // (self["etp"] * self["ep"] * self["pp"])
        return out

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> LayoutTable:
        cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        for lay in layouts:
            d = lay.to_dict()
            for k in _COLUMNS:
                v = d[k]
                cols[k].append(",".join(v) if k == "recompute_modules" else v)
        return cls({k: np.array(v) if v else np.zeros(0, dtype=_COLUMNS[k]) for k, v in cols.items()})

    def append(self, other: LayoutTable) -> LayoutTable:
        """This table's rows, then ``other``'s: a coded column stays coded (``other``'s values mapped to this table's
        categories, new ones added), so a wide enumeration is not decoded to add a few rows."""
        cols: dict[str, npt.NDArray[Any]] = {}
        cats: dict[str, npt.NDArray[Any]] = {}
        for k in _COLUMNS:
            if k not in self.cats:
                cols[k] = np.concatenate([self.cols[k], np.asarray(other[k]).astype(self.cols[k].dtype)])
                continue
            mine = self.cats[k].tolist()
            where = {v: i for i, v in reversed(list(enumerate(mine)))}
            theirs, codes = other.codes(k)
            for v in theirs.tolist():
                if v not in where:
                    where[v] = len(mine)
                    mine.append(v)
            dt = np.promote_types(self.cols[k].dtype, np.min_scalar_type(len(mine)))
            mapped = np.array([where[v] for v in theirs.tolist()], dtype=dt)
            cols[k] = np.concatenate([self.cols[k].astype(dt, copy=False), mapped[codes]])
            cats[k] = np.asarray(mine)
        return LayoutTable(cols, cats)

    def select(self, mask_or_index: npt.NDArray[Any] | slice) -> LayoutTable:
        """The rows a bool mask, an index array or a slice picks (a slice gives views; shared codes stay shared)."""
        picked: dict[int, npt.NDArray[Any]] = {}
        for v in self.cols.values():
            if id(v) not in picked:
                picked[id(v)] = v[mask_or_index]
        return LayoutTable({k: picked[id(v)] for k, v in self.cols.items()}, self.cats)

    def row(self, i: int) -> Layout:
        d: dict[str, Any] = {}
        for k in _COLUMNS:
            v = self.cols[k][i]
            if k in self.cats:
                v = self.cats[k][int(v)]
            d[k] = v.item() if isinstance(v, np.generic) else v
        return Layout.from_dict(d)

    def __iter__(self) -> Iterator[Layout]:
        for i in range(len(self)):
            yield self.row(i)
