"""The frame of the validity rules: :class:`Rule`, :class:`RuleEnv` and the helpers the checks share
(:mod:`search_spaces.rules` holds the registry, :mod:`search_spaces.rule_checks` the checks)."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from search_spaces.pipeline import stage_layer_counts
from specs import NEWEST_MEGATRON_CORE, Cluster, ModelSpec, Network, RunOptions, Workload, megatron_core_version
from specs.errors import InfeasibleLayout
from specs.layout import Layout, LayoutTable

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
CheckFn = Callable[..., BoolArray]
"""``(table, model, workload)`` -> ok per row, or with ``uses_env`` ``(table, model, workload, env)``."""
ExplainFn = Callable[..., str]
"""``(layout, model, workload)`` -> reason, or with ``uses_env`` ``(layout, model, workload, env)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleEnv:
    """What the environment-dependent rules read besides the layout, the model and the workload."""

    megatron_core: tuple[int, int] = megatron_core_version(NEWEST_MEGATRON_CORE)
    """megatron-core release ``(major, minor)`` (``--megatron-core``)."""
    network: Network | None = None
    """The cluster's scale-out fabric; None = not checked (no dispatcher refused for its fabric)."""
    nvlink_size: int = 0
    """GPUs of one NVLink domain (:attr:`specs.Cluster.nvlink_size`); an EP group larger crosses the fabric."""
    cp_comm_type: str = "p2p"
    """``--cp-comm-type`` of the run (:attr:`specs.RunOptions.cp_comm_type`)."""
    cpu_offloading_num_layers: int = 0
    """``--cpu-offloading-num-layers`` of the run (activation offloading; 0 = off)."""
    cuda_graph_impl: str = "none"
    """The CUDA graph implementation megatron-core runs (:attr:`specs.RunOptions.cuda_graph_effective_impl`)."""
    cuda_graph_impl_arg: str = "none"
    """``--cuda-graph-impl`` as written (:attr:`specs.RunOptions.cuda_graph_impl`); before megatron-core 0.18 the
    deprecated scope ``full_iteration`` runs under ``local``."""
    cuda_graph_scope: tuple[str, ...] = ()
    """``--cuda-graph-scope`` values (``full``: whole layers, Megatron's empty scope)."""
    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm`` of the run."""
    optimizer: str = "adam"
    """``--optimizer`` of the run (``adam`` or ``dist_muon``)."""
    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce`` / ``--overlap-param-gather`` of the run."""
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp`` of the run."""
    fp8_param_gather: bool = False
    """``--fp8-param-gather`` of the run (read with an fp8-format precision only)."""
    fp8_recipe: str = "delayed"
    """``--fp8-recipe`` of the ``fp8`` precision (the other fp8 formats are recipes of their own)."""

    @classmethod
    def of(cls, cluster: Cluster | None = None, options: RunOptions | None = None) -> RuleEnv:
        """The environment of a cluster and run options (their release, network, NVLink domain and run flags)."""
        net = cls(network=cluster.network if cluster is not None else None,
                  nvlink_size=cluster.nvlink_size if cluster is not None else 0)
        if options is None:
            return net
        return dataclasses.replace(
            net, megatron_core=options.megatron_core_tuple, cp_comm_type=options.cp_comm_type,
            cpu_offloading_num_layers=options.cpu_offloading_num_layers,
            cuda_graph_impl=options.cuda_graph_effective_impl,
            cuda_graph_impl_arg=options.cuda_graph_impl if options.cuda_graph_scope else "none",
            cuda_graph_scope=options.cuda_graph_scope,
            overlap_moe_expert_parallel_comm=options.overlap_moe_expert_parallel_comm, optimizer=options.optimizer,
            overlap_grad_reduce=options.overlap_grad_reduce, use_megatron_fsdp=options.use_megatron_fsdp,
            fp8_param_gather=options.fp8_param_gather, fp8_recipe=options.fp8_recipe)

    @property
    def version_label(self) -> str:
        return f"{self.megatron_core[0]}.{self.megatron_core[1]}"


#: Every release, no network: the environment a rule check has when none is given.
DEFAULT_RULE_ENV = RuleEnv()

#: Rules that are the tuner's own conventions (one canonical form per layout), not Megatron checks:
#: ``tune check`` reports them as notes, the enumeration still uses them to avoid duplicates.
POLICY_RULES = frozenset({"pipeline_split_canonical", "recompute_none"})

#: ``--recompute-modules`` entries that exist only in MoE layers.
MOE_RECOMPUTE_MODULES = ("moe_act", "moe")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One validity rule: ``id`` (in reports and :class:`InfeasibleLayout`), ``description`` (the check it mirrors, with
    the Megatron file and function), ``columns`` (the :class:`LayoutTable` columns it reads: the enumeration evaluates
    it as soon as they are known), ``check_fn`` (one bool per row, True = ok), ``explain_fn`` (the reason for one
    failing layout) and ``uses_env`` (both take the :class:`RuleEnv` as a fourth argument)."""

    id: str
    description: str
    columns: tuple[str, ...]
    check_fn: CheckFn
    explain_fn: ExplainFn
    uses_env: bool = False

    def check(self, table: LayoutTable, model: ModelSpec, workload: Workload,
              env: RuleEnv = DEFAULT_RULE_ENV) -> BoolArray:
        """Rows of ``table`` that pass (a bool array of ``len(table)``)."""
        raw = self.check_fn(table, model, workload, env) if self.uses_env else self.check_fn(table, model, workload)
        ok = np.asarray(raw, dtype=np.bool_)
        return np.broadcast_to(ok, (len(table),)).copy() if ok.shape != (len(table),) else ok

    def explain(self, layout: Layout, model: ModelSpec, workload: Workload, env: RuleEnv = DEFAULT_RULE_ENV) -> str:
        """Why ``layout`` breaks this rule: the values involved and what would be accepted."""
        return str(self.explain_fn(layout, model, workload, env) if self.uses_env
                   else self.explain_fn(layout, model, workload))



#: Every rule, in the order :func:`rule` registered them (their order in :mod:`search_spaces.rule_checks`).
REGISTERED: list[Rule] = []


def rule(id: str, columns: tuple[str, ...], *, explain: ExplainFn) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated check as a :class:`Rule` named ``id``: its docstring is the rule's description (the
    check it mirrors and its source), ``explain`` gives the reason for one failing layout, and a check of four
    arguments reads the :class:`RuleEnv` (``uses_env``)."""

    def register(check: CheckFn) -> CheckFn:
        REGISTERED.append(Rule(id=id, description=" ".join((check.__doc__ or "").split()), columns=columns,
                               check_fn=check,
                               explain_fn=explain, uses_env=len(inspect.signature(check).parameters) == 4))
        return check

    return register


def options_rule(id: str) -> Callable[[Callable[[ModelSpec, RuleEnv], str | None]],
                                      Callable[[ModelSpec, RuleEnv], str | None]]:
    """Register a rule of the run options alone (no layout column: every layout fails alike). The decorated
    ``problem(model, env)`` says why megatron-core refuses the options, None when it does not; its docstring is the
    rule's description."""

    def register(problem: Callable[[ModelSpec, RuleEnv], str | None]) -> Callable[[ModelSpec, RuleEnv], str | None]:
        def check(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
            return _b(np.full(len(t), problem(m, env) is None))

        def explain(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
            return problem(m, env) or "the run options are accepted"

        REGISTERED.append(Rule(id=id, description=" ".join((problem.__doc__ or "").split()), columns=(),
                               check_fn=check, explain_fn=explain, uses_env=True))
        return problem

    return register


def _b(values: Any) -> BoolArray:
    """A rule's result as a bool array."""
    return np.asarray(values, dtype=np.bool_)


def _dp(table: LayoutTable) -> IntArray:
    return np.asarray(table["world_size"] // (table["tp"] * table["pp"] * table["cp"]), dtype=np.int64)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True)
class _SplitStats:
    feasible: BoolArray
    """The split is possible (:func:`stage_layer_counts` does not raise)."""
    max_chunk: IntArray
    """Largest chunk (decoder layers); 0 where infeasible."""
    chunk_gcd: IntArray
    """GCD of the non-empty chunk sizes; 0 where infeasible."""
    same_as_even: BoolArray
    """Uneven first/last that yields exactly the even split's chunks."""


def _split_stats(table: LayoutTable, model: ModelSpec, rows: IntArray | None = None) -> _SplitStats:
    """Per-row facts about the pipeline split, computed once per distinct (pp, vpp, first, last).

    ``rows`` restricts the result to those row indices (in that order)."""
    names = ("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
    cols = [table[c] if rows is None else table[c][rows] for c in names]
    n = len(cols[0])
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return _SplitStats(z.astype(np.bool_), z, z, z.astype(np.bool_))
    lows = [int(c.min()) for c in cols]
    dims = tuple(int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True))
    if math.prod(dims) < 2**62:
        key = np.ravel_multi_index(tuple(c - lo for c, lo in zip(cols, lows, strict=True)), dims)
        uniq, first_row, inv = np.unique(key, return_index=True, return_inverse=True)
    else:
        uniq, first_row, inv = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    feas = np.zeros(len(uniq), dtype=np.bool_)
    mx = np.zeros(len(uniq), dtype=np.int64)
    g = np.zeros(len(uniq), dtype=np.int64)
    same = np.zeros(len(uniq), dtype=np.bool_)
    for j, r in enumerate(first_row):
        pp, vpp, f, la = (int(c[r]) for c in cols)
        try:
            counts = stage_layer_counts(model.num_layers, pp, vpp, f, la)
        except InfeasibleLayout:
            continue
        feas[j] = True
        flat = [x for row in counts for x in row]
        mx[j] = max(flat)
        g[j] = math.gcd(*[x for x in flat if x])
        if f or la:
            try:
                same[j] = counts == stage_layer_counts(model.num_layers, pp, vpp)
            except InfeasibleLayout:
                pass
    inv = inv.reshape(-1)
    return _SplitStats(feas[inv], mx[inv], g[inv], same[inv])


def _split_reason(layout: Layout, model: ModelSpec) -> str | None:
    try:
        stage_layer_counts(
            model.num_layers, layout.pp, layout.vpp, layout.num_layers_in_first_pipeline_stage,
            layout.num_layers_in_last_pipeline_stage)
    except InfeasibleLayout as e:
        return e.reason
    return None


def _layout_counts(layout: Layout, model: ModelSpec) -> list[list[int]] | None:
    try:
        return stage_layer_counts(
            model.num_layers, layout.pp, layout.vpp, layout.num_layers_in_first_pipeline_stage,
            layout.num_layers_in_last_pipeline_stage)
    except InfeasibleLayout:
        return None


def applicable_recompute_modules(model: ModelSpec) -> tuple[str, ...]:
    """``--recompute-modules`` entries that have something to recompute in ``model``.

    ``moe_act``/``moe`` need MoE layers, ``shared_experts`` a shared expert, ``mla_up_proj`` multi-latent attention
    (``TransformerConfig.__post_init__``, ``megatron/core/transformer/transformer_config.py``, raises for
    ``mla_up_proj`` without MLA; the others would silently do nothing), and ``mlp`` dense layers
    (``TransformerLayer.__init__`` in ``transformer_layer.py`` sets ``recompute_mlp`` only for a layer that is not MoE).
    """
    out = ["core_attn", "layernorm"]
    if model.num_dense_layers > 0:
        out.append("mlp")
    if model.is_moe:
        out += list(MOE_RECOMPUTE_MODULES)
        if model.moe_shared_expert_intermediate_size > 0:
            out.append("shared_experts")
    if model.is_mla:
        out.append("mla_up_proj")
    return tuple(out)


