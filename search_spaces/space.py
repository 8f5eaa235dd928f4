"""The search space (a YAML file; the bundled ``default_space.yaml`` documents each key) and its enumeration into valid
layouts: :func:`enumerate_layouts` crosses the dimensions with numpy index arrays and applies
:data:`~search_spaces.rules.RULES` as soon as the dimensions a rule reads are crossed in, so most combinations are
rejected on small partial products, with the same counts :func:`~search_spaces.rules.check_table` gives on the full
product."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import yaml

from search_spaces.rule_options import MUON_DISTOPT_SINCE
from search_spaces.rules import (
    DEFAULT_RULE_ENV,
    RULES,
    Rule,
    RuleEnv,
    applicable_recompute_modules,
    run_option_problems,
)
from specs import ModelSpec, Workload
from specs._data import load_user_yaml
from specs.errors import TunerError
from specs.layout import (
    CODED_COLUMNS,
    RECOMPUTE_MODULES,
    Dispatcher,
    Layout,
    LayoutTable,
    RecomputeGranularity,
    RecomputeMethod,
)

#: Name of the bundled default space inside the ``search_spaces`` package.
DEFAULT_SPACE_FILE = "default_space.yaml"

_DTYPES = ("fp32", "bf16")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RecomputeOption:
    """One recompute candidate (``--recompute-granularity/-method/-num-layers/-modules``)."""

    granularity: RecomputeGranularity = RecomputeGranularity.none
    method: RecomputeMethod = RecomputeMethod.none
    """uniform or block for full recompute; none otherwise."""
    num_layers: int = 0
    """Layers per group (uniform) or per chunk (block) for full recompute; 0 otherwise."""
    modules: tuple[str, ...] = ()
    """Modules for selective recompute; empty otherwise."""

    def to_dict(self) -> dict[str, Any]:
        """The YAML form: ``{granularity: none}``, ``{granularity: selective, modules: [...]}`` or
        ``{granularity: full, method: ..., num_layers: N}``."""
        if self.granularity == RecomputeGranularity.selective:
            return {"granularity": "selective", "modules": list(self.modules)}
        if self.granularity == RecomputeGranularity.full:
            return {"granularity": "full", "method": self.method.value, "num_layers": self.num_layers}
        return {"granularity": "none"}

    @staticmethod
    def parse(entry: Any, where: str) -> list[RecomputeOption]:
        """Options from one YAML entry (``num_layers`` may be a list: one option each).

        Raises TunerError: if the entry is not a mapping, has unknown keys, or a value is not accepted; the message
        names the entry and the accepted values."""
        if not isinstance(entry, Mapping):
            raise TunerError(f"{where}: expected a mapping such as {{granularity: none}}, got {entry!r}")
        gran = entry.get("granularity")
        accepted = {
            "none": {"granularity"}, "selective": {"granularity", "modules"},
            "full": {"granularity", "method", "num_layers"}}
        if gran not in accepted:
            raise TunerError(f"{where}: granularity must be one of none, selective, full; got {gran!r}")
        unknown = set(entry) - accepted[gran]
        if unknown:
            raise TunerError(f"{where}: unknown keys {sorted(map(str, unknown))} for granularity {gran}; "
                             f"accepted: {sorted(accepted[gran])}")
        if gran == "none":
            return [RecomputeOption()]
        if gran == "selective":
            mods = entry.get("modules", ["core_attn"])
            if isinstance(mods, str):
                mods = [mods]
            if not isinstance(mods, list) or not mods or not all(isinstance(x, str) for x in mods):
                raise TunerError(
                    f"{where}: modules must be a non-empty list of names from {', '.join(RECOMPUTE_MODULES)}")
            bad = [x for x in mods if x not in RECOMPUTE_MODULES]
            if bad:
                raise TunerError(f"{where}: unknown recompute modules {bad}; accepted: {', '.join(RECOMPUTE_MODULES)}")
            return [RecomputeOption(granularity=RecomputeGranularity.selective, modules=tuple(dict.fromkeys(mods)))]
        method = entry.get("method")
        if method not in ("uniform", "block"):
            raise TunerError(f"{where}: full recompute needs method uniform or block, got {method!r}")
        counts = _ints(entry.get("num_layers"), f"{where}.num_layers")
        return [RecomputeOption(granularity=RecomputeGranularity.full, method=RecomputeMethod(method), num_layers=n)
                for n in counts]


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSplitSpace:
    """Which pipeline splits to try (see :func:`search_spaces.pipeline.stage_layer_counts`)."""

    even: bool = True
    """Try the even split (``first = last = 0``)."""
    max_stage_deficit: int = 2
    """Try uneven splits whose first/last ranks hold up to this many layers fewer than a middle rank."""

    def options(self, num_layers: int, pp: int) -> list[tuple[int, int]]:
        """Distinct ``(first, last)`` candidates for one pipeline size, even ``(0, 0)`` first. For deficits ``d_f, d_l``
        in ``0..max_stage_deficit`` (not both 0) with ``(num_layers + d_f + d_l) % pp == 0``, the middle ranks hold
        ``m = (num_layers + d_f + d_l) / pp`` layers and the pair is ``(m - d_f, m - d_l)``, both written out. Deficits
        that leave no whole middle size define no split; ``pp == 1`` has only the even split."""
        out: list[tuple[int, int]] = [(0, 0)] if self.even else []
        if pp < 2:
            return out
        for d_f in range(self.max_stage_deficit + 1):
            for d_l in range(self.max_stage_deficit + 1):
                total = num_layers + d_f + d_l
                if (d_f == 0 and d_l == 0) or total % pp:
                    continue
                m = total // pp
                pair = (m - d_f, m - d_l)
                if min(pair) >= 1 and pair not in out:
                    out.append(pair)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"even": self.even, "max_stage_deficit": self.max_stage_deficit}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _unique(values: Sequence[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(values))


def _ints(value: Any, key: str) -> tuple[int, ...]:
    vals = _as_list(value)
    if not vals or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**31 for v in vals):
        raise TunerError(f"{key}: expected a positive integer (below 2**31) or a non-empty list of them, got {value!r}")
    return _unique(vals)


def _bools(value: Any, key: str) -> tuple[bool, ...]:
    vals = _as_list(value)
    if not vals or not all(isinstance(v, bool) for v in vals):
        raise TunerError(f"{key}: expected true, false or a list of them, got {value!r}")
    return _unique(vals)


def _fractions(value: Any, key: str) -> tuple[float, ...]:
    vals = _as_list(value)
    ok = vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0 for v in vals)
    if not ok:
        raise TunerError(f"{key}: expected numbers in [0, 1] (a list or one), got {value!r}")
    return _unique([float(v) for v in vals])


def _choices(value: Any, key: str, accepted: Sequence[str]) -> tuple[str, ...]:
    vals = _as_list(value)
    bad = [v for v in vals if v not in accepted]
    if not vals or bad:
        raise TunerError(f"{key}: unknown values {bad or vals!r}; accepted: {', '.join(accepted)}")
    return _unique([str(v) for v in vals])


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Candidates per dimension; every combination is a candidate layout.

    Made with :meth:`load` (the bundled default, or a YAML file over it) or :meth:`from_dict`; :meth:`to_dict` gives the
    resolved space back for saving with a study. ``default_space.yaml`` documents each field."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    recompute: tuple[RecomputeOption, ...]
    optimizer_offload_fraction: tuple[float, ...]
    overlap_cpu_optimizer_d2h_h2d: tuple[bool, ...]
    dispatcher: tuple[Dispatcher, ...]
    pipeline_split: PipelineSplitSpace
    exp_avg_dtype: tuple[str, ...]
    exp_avg_sq_dtype: tuple[str, ...]
    use_precision_aware_optimizer: tuple[bool, ...]
    use_distributed_optimizer: tuple[bool, ...]

    @staticmethod
    def keys() -> tuple[str, ...]:
        """The accepted top-level YAML keys."""
        return tuple(f.name for f in dataclasses.fields(SearchSpace))

    @classmethod
    def load(cls, path: str | Path | None = None) -> SearchSpace:
        """The bundled default space, or the YAML file ``path`` (``tune --space FILE``) laid over it: keys it leaves out
        keep their default values.

        Raises TunerError: the file cannot be read or parsed, is not a mapping, has unknown keys (listed with the
        accepted ones), or a value is not accepted."""
        default = _read_default()
        if path is None:
            return cls.from_dict(default, source="the default space")
        p = Path(path)
        data = load_user_yaml(p, f"--space {str(p)!r}", "a YAML search space")
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise TunerError(f"--space {str(p)!r}: expected a mapping of dimension names to candidates")
        cls._reject_unknown(data, f"--space {str(p)!r}")
        return cls.from_dict({**default, **data}, source=f"--space {str(p)!r}")

    @classmethod
    def _reject_unknown(cls, data: Mapping[str, Any], source: str) -> None:
        unknown = [str(k) for k in data if k not in cls.keys()]  # noqa: SIM118 - keys() is this class's own method
        if unknown:
            raise TunerError(f"{source}: unknown keys {unknown}; accepted keys: {', '.join(cls.keys())}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "search space") -> SearchSpace:
        """Build from a mapping; missing keys take the bundled default's values.

        Raises TunerError: unknown keys (listed with the accepted ones) or a bad value."""
        cls._reject_unknown(data, source)
        d = {**_read_default(), **data}

        def where(key: str) -> str:
            return f"{source}: {key}"

        rec_raw = d["recompute"]
        if not isinstance(rec_raw, list) or not rec_raw:
            raise TunerError(
                f"{where('recompute')}: expected a non-empty list of options, e.g. [{{granularity: none}}]")
        rec: list[RecomputeOption] = []
        for i, entry in enumerate(rec_raw):
            rec += RecomputeOption.parse(entry, f"{where('recompute')}[{i}]")

        split_raw = d["pipeline_split"]
        if not isinstance(split_raw, Mapping):
            raise TunerError(
                f"{where('pipeline_split')}: expected {{even: true, max_stage_deficit: 2}}, got {split_raw!r}")
        unknown = [str(k) for k in split_raw if k not in ("even", "max_stage_deficit")]
        if unknown:
            raise TunerError(f"{where('pipeline_split')}: unknown keys {unknown}; accepted: even, max_stage_deficit")
        even = split_raw.get("even", True)
        deficit = split_raw.get("max_stage_deficit", 0)
        if not isinstance(even, bool):
            raise TunerError(f"{where('pipeline_split.even')}: expected true or false, got {even!r}")
        if not isinstance(deficit, int) or isinstance(deficit, bool) or not 0 <= deficit <= 64:
            raise TunerError(f"{where('pipeline_split.max_stage_deficit')}: expected an integer from 0 to 64, got "
                             f"{deficit!r}")
        if not even and deficit == 0:
            raise TunerError(
                f"{where('pipeline_split')}: even is false and max_stage_deficit is 0, so no split is left")

        values = {k: read(d[k], where(k)) for k, read in _READERS.items()}
        return cls(recompute=_unique(rec), pipeline_split=PipelineSplitSpace(even=even, max_stage_deficit=deficit),
                   **values)

    def to_dict(self) -> dict[str, Any]:
        """The resolved space as plain YAML/JSON data; ``from_dict(to_dict())`` gives it back."""
        out = {k: getattr(self, k) for k in self.keys()}
        return {**out, **{k: list(v) for k, v in out.items() if isinstance(v, tuple)},
                "recompute": [r.to_dict() for r in self.recompute], "dispatcher": [d.value for d in self.dispatcher],
                "pipeline_split": self.pipeline_split.to_dict()}

    def replace(self, **changes: Any) -> SearchSpace:
        """A copy with some dimensions changed (values as the dataclass holds them)."""
        return dataclasses.replace(self, **changes)


#: How each dimension other than recompute and pipeline_split is read, in the order of :meth:`SearchSpace.keys`.
_READERS: dict[str, Any] = {
    **dict.fromkeys(("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size"), _ints),
    "optimizer_offload_fraction": _fractions, "overlap_cpu_optimizer_d2h_h2d": _bools,
    "dispatcher": lambda v, k: tuple(Dispatcher(x) for x in _choices(v, k, [d.value for d in Dispatcher])),
    **dict.fromkeys(("exp_avg_dtype", "exp_avg_sq_dtype"), lambda v, k: _choices(v, k, _DTYPES)),
    **dict.fromkeys(("use_precision_aware_optimizer", "use_distributed_optimizer"), _bools)}


def _read_default() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(resources.files("search_spaces").joinpath(DEFAULT_SPACE_FILE).read_text())
    return data


@dataclass(frozen=True, kw_only=True, slots=True)
class Enumeration:
    """What :func:`enumerate_layouts` found.

    ``sum(rule_counts.values()) + len(valid) == considered``."""

    considered: int
    """Every combination of the space's dimensions (after the model-specific collapsing in ``notes``)."""
    rule_counts: dict[str, int]
    """Per rule id (check order), the layouts whose first failing rule it is."""
    valid: LayoutTable
    """The layouts that pass every rule."""
    notes: list[str] = field(default_factory=list)
    """How the space was adapted to the model (e.g. EP collapsed for a dense model)."""

    @property
    def rejected(self) -> int:
        return sum(self.rule_counts.values())


@dataclass(frozen=True, slots=True)
class _Dim:
    """One dimension of the product: ``size`` options, each a value per column."""

    name: str
    cols: dict[str, npt.NDArray[Any]]
    size: int


#: Column dtypes of a LayoutTable's values, read from an empty one (strings: any width).
_COL_DTYPES: dict[str, np.dtype[Any]] = {k: np.dtype(str) if k in CODED_COLUMNS else v.dtype
                                         for k, v in LayoutTable.from_layouts([]).cols.items()}


def _dim(name: str, cols: Mapping[str, Sequence[Any]]) -> _Dim:
    arrays = {k: np.array(list(v), dtype=str) if k in CODED_COLUMNS else np.asarray(list(v)).astype(_COL_DTYPES[k])
              for k, v in cols.items()}
    sizes = {len(a) for a in arrays.values()}
    assert len(sizes) == 1, (name, sizes)
    return _Dim(name, arrays, sizes.pop())


def _build_dims(space: SearchSpace, model: ModelSpec, notes: list[str], env: RuleEnv) -> list[_Dim]:
    ep, etp, dispatcher = space.ep, space.etp, space.dispatcher
    precision_aware, distopt = space.use_precision_aware_optimizer, space.use_distributed_optimizer
    if env.optimizer == "dist_muon":  # rule dist_muon: the precision-aware optimizer is Adam's only
        if precision_aware != (False,):
            notes.append("--optimizer dist_muon: use_precision_aware_optimizer set to [false] (Adam's only), so no "
                         "optimizer CPU offload")
        precision_aware = (False,)
        if env.megatron_core < MUON_DISTOPT_SINCE:
            if distopt != (False,):
                notes.append(f"--optimizer dist_muon: use_distributed_optimizer set to [false] (megatron-core "
                             f"{env.version_label} refuses it with Muon; accepted from 0.18)")
            distopt = (False,)
    if not model.is_moe:
        if (ep, etp, dispatcher) != ((1,), (1,), (Dispatcher.alltoall,)):
            notes.append(f"model {model.name!r} is dense: ep, etp and dispatcher collapsed to [1], [1], [alltoall]")
        ep, etp, dispatcher = (1,), (1,), (Dispatcher.alltoall,)

    allowed = set(applicable_recompute_modules(model))
    rec: list[RecomputeOption] = []
    dropped: set[str] = set()
    for opt in space.recompute:
        if opt.granularity == RecomputeGranularity.selective:
            keep = tuple(m for m in opt.modules if m in allowed)
            dropped |= set(opt.modules) - set(keep)
            if not keep:
                continue
            opt = RecomputeOption(granularity=opt.granularity, modules=keep)
        if opt not in rec:
            rec.append(opt)
    if dropped:
        notes.append(f"recompute modules {sorted(dropped)} have nothing to recompute in model {model.name!r} and were "
                     "dropped from the selective options (options left empty were removed)")
    if not rec:
        raise TunerError(f"the search space's recompute options leave nothing to try for model {model.name!r}; "
                         f"accepted modules for it: {', '.join(sorted(allowed))}")

    pipe = [(pp, f, la) for pp in space.pp for f, la in space.pipeline_split.options(model.num_layers, pp)]
    one: dict[str, Sequence[Any]] = {"cp": space.cp, "ep": ep, "etp": etp, "micro_batch_size": space.micro_batch_size,
                                     "vpp": space.vpp}
    rest: dict[str, Sequence[Any]] = {
        "optimizer_offload_fraction": space.optimizer_offload_fraction,
        "overlap_cpu_optimizer_d2h_h2d": space.overlap_cpu_optimizer_d2h_h2d, "use_distributed_optimizer": distopt,
        "use_precision_aware_optimizer": precision_aware, "exp_avg_dtype": space.exp_avg_dtype,
        "exp_avg_sq_dtype": space.exp_avg_sq_dtype, "dispatcher": [d.value for d in dispatcher]}
    return [
        _dim("pipeline", {"pp": [p[0] for p in pipe], "num_layers_in_first_pipeline_stage": [p[1] for p in pipe],
                          "num_layers_in_last_pipeline_stage": [p[2] for p in pipe]}),
        _dim("tp", {"tp": space.tp, "sequence_parallel": [t > 1 for t in space.tp]}),
        *(_dim(k, {k: v}) for k, v in one.items()),
        _dim("recompute", {"recompute_granularity": [r.granularity.value for r in rec],
                           "recompute_method": [r.method.value for r in rec],
                           "recompute_num_layers": [r.num_layers for r in rec],
                           "recompute_modules": [",".join(r.modules) for r in rec]}),
        *(_dim(k, {k: v}) for k, v in rest.items())]


class _Product:
    """A partial cartesian product of dimensions: per crossed dimension of more than one option, each row's option
    (an unsigned array as narrow as the dimension's size allows)."""

    def __init__(self, dims: list[_Dim], world_size: int) -> None:
        self.dims = {d.name: d for d in dims}
        self.order = [d.name for d in dims]
        self.col_dim = {c: d.name for d in dims for c in d.cols}
        self.idx: dict[str, npt.NDArray[np.unsignedinteger[Any]]] = {}
        self.crossed: set[str] = set()
        self.rows = 1
        self.world_size = world_size
        fill = LayoutTable.from_layouts([Layout(world_size=world_size)])
        self.fill = {k: fill[k] for k in fill.cols}

    def missing(self, columns: Sequence[str]) -> list[str]:
        need = {self.col_dim[c] for c in columns if c in self.col_dim}
        return [n for n in self.order if n in need and n not in self.crossed]

    def rest_size(self) -> int:
        return math.prod(self.dims[n].size for n in self.order if n not in self.crossed)

    def cross(self, names: Sequence[str]) -> None:
        """Cross in dimensions: every current row is repeated once per option (row-major)."""
        for name in names:
            self.crossed.add(name)
            n = self.dims[name].size
            if n == 1:
                continue
            self.idx = {k: np.repeat(v, n) for k, v in self.idx.items()}
            self.idx[name] = np.tile(np.arange(n, dtype=np.min_scalar_type(n - 1)), self.rows)
            self.rows *= n

    def keep(self, mask: npt.NDArray[np.bool_]) -> None:
        self.idx = {k: v[mask] for k, v in self.idx.items()}
        self.rows = int(np.count_nonzero(mask))

    def table(self, rows: int | None = None, idx: Mapping[str, npt.NDArray[Any]] | None = None) -> LayoutTable:
        """The rows so far as a table of codes into the dimensions' options (the columns of a dimension share its
        array; a dimension not crossed yet holds a placeholder). ``rows`` and ``idx`` stand for other rows' options."""
        n = self.rows if rows is None else rows
        idx = self.idx if idx is None else idx
        zero = np.broadcast_to(np.zeros(1, dtype=np.uint8), (n,))
        cols: dict[str, npt.NDArray[Any]] = {}
        cats: dict[str, npt.NDArray[Any]] = {}
        for c in _COL_DTYPES:
            d = self.col_dim.get(c)
            if d is not None and d in self.crossed:
                cols[c], cats[c] = idx.get(d, zero), self.dims[d].cols[c]
            elif c == "world_size":
                cols[c], cats[c] = zero, np.array([self.world_size])
            else:
                cols[c], cats[c] = zero, self.fill[c]
        return LayoutTable(cols, cats)

    def distinct(self, columns: Sequence[str]) -> tuple[LayoutTable, npt.NDArray[Any] | None]:
        """A table of every combination of the options of the crossed dimensions that hold ``columns``, and each row's
        index into it; when there are at least as many combinations as rows, the rows themselves and None."""
        need = {self.col_dim[c] for c in columns if c in self.col_dim}
        names = [n for n in self.order if n in need and n in self.idx]
        sizes = [self.dims[n].size for n in names]
        combos = math.prod(sizes)
        if combos >= self.rows:
            return self.table(), None
        code_type = np.min_scalar_type(combos - 1)
        grid = np.indices(sizes, dtype=code_type).reshape(len(sizes), combos)
        key = np.zeros(self.rows, dtype=code_type)
        for name, size in zip(names, sizes, strict=True):
            key *= code_type.type(size)
            key += self.idx[name]
        return self.table(combos, dict(zip(names, grid, strict=True))), key


def enumerate_layouts(space: SearchSpace, model: ModelSpec, cluster_world_size: int, workload: Workload,
                      env: RuleEnv = DEFAULT_RULE_ENV) -> Enumeration:
    """Every combination of the space, checked against the rules: the count of combinations, the count rejected by each
    rule (first failure), the valid layouts (codes into each dimension's options, :class:`~specs.layout.LayoutTable`)
    and notes. For a dense model ep/etp/dispatcher collapse to ``[1]/[1]/[alltoall]``; recompute modules the model
    lacks are dropped; with ``env.optimizer`` ``dist_muon`` the precision-aware optimizer (and, before megatron-core
    0.18, the distributed optimizer) is off (each said in ``notes``). Rules run in :data:`~search_spaces.rules.RULES`
    order on partial products, once per combination of the options they read, so ``rule_counts`` equals
    :func:`~search_spaces.rules.check_table` on the full product.

    Raises TunerError: the run options in ``env`` break a rule whatever the layout
    (:func:`~search_spaces.rules.run_option_problems`), or no recompute option left for the model."""
    notes: list[str] = []
    dims = _build_dims(space, model, notes, env)
    prod = _Product(dims, cluster_world_size)
    considered = math.prod(d.size for d in dims)
    counts = {r.id: 0 for r in RULES}

    i = 0
    while i < len(RULES) and prod.rows:
        prod.cross(prod.missing(RULES[i].columns))
        batch: list[Rule] = []
        while i < len(RULES) and not prod.missing(RULES[i].columns):
            batch.append(RULES[i])
            i += 1
        table, key = prod.distinct([c for rule in batch for c in rule.columns])
        rest = prod.rest_size()
        alive = np.ones(prod.rows, dtype=np.bool_)
        for rule in batch:
            ok = rule.check(table, model, workload, env)
            if key is not None:
                ok = ok[key]
            counts[rule.id] += int(np.count_nonzero(alive & ~ok)) * rest
            alive &= ok
        prod.keep(alive)
    prod.cross([n for n in prod.order if n not in prod.crossed])
    valid = prod.table()
    assert sum(counts.values()) + len(valid) == considered, (sum(counts.values()), len(valid), considered)
    broken = run_option_problems(model, workload, env) if not len(valid) else []
    if broken:
        raise TunerError("no layout can run with these run options: " + "; ".join(f"[{r}] {why}" for r, why in broken))
    return Enumeration(considered=considered, rule_counts=counts, valid=valid, notes=notes)
