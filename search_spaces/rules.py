"""Megatron-core's validity rules, vectorised over a :class:`LayoutTable`.

Each rule is a small pure function over numpy columns (``True`` = the layout
passes) plus a one-layout explanation that names the values involved and what
would be accepted. Sources are megatron-core at slime's pin ``1dcf0daf``
(core 0.16.0rc0) unless a rule says otherwise; see ``shared/notes/megatron_rules.md``
sections 1-5. A few rules are the tuner's own policy (canonical forms that stop the
search from trying one configuration twice); their descriptions say so.

Usage::

    ok, first_failures = check_table(table, model, workload, env=RuleEnv.of(cluster, options))
    problems = check_layout(layout, model, workload)   # [(rule_id, reason), ...]

Rules that depend on more than the layout, the model and the workload read a :class:`RuleEnv`: the
megatron-core release (rules that changed between releases, ``docs/megatron_versions.md``) and the
cluster's network (which dispatchers run across its fabric, ``specs/data/networks.yaml``). Without one
(the default) they check what every release and fabric accept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from search_spaces.pipeline import stage_layer_counts
from specs import NEWEST_MEGATRON_CORE, Cluster, ModelSpec, Network, RunOptions, Workload, megatron_core_version
from specs.errors import InfeasibleLayout
from specs.layout import Dispatcher, Layout, LayoutTable, enum_mask

__all__ = [
    "DEFAULT_RULE_ENV",
    "Rule",
    "RuleEnv",
    "RULES",
    "RULE_IDS",
    "MOE_RECOMPUTE_MODULES",
    "POLICY_RULES",
    "check_table",
    "check_layout",
    "applicable_recompute_modules",
    "layout_warnings",
]

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

    @classmethod
    def of(cls, cluster: Cluster | None = None, options: RunOptions | None = None) -> RuleEnv:
        """The environment of a cluster and run options (their release, network and NVLink domain)."""
        return cls(
            megatron_core=options.megatron_core_tuple if options is not None else megatron_core_version(NEWEST_MEGATRON_CORE),
            network=cluster.network if cluster is not None else None,
            nvlink_size=cluster.nvlink_size if cluster is not None else 0,
            cp_comm_type=options.cp_comm_type if options is not None else "p2p",
        )

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
    """One validity rule.

    Attributes:
        id: short id used in reports and in :class:`InfeasibleLayout`.
        description: the check it mirrors, with the Megatron file and function.
        columns: the :class:`LayoutTable` columns the check reads; the enumeration
            evaluates a rule as soon as these are known.
        check_fn: vectorised check, one bool per row (True = ok).
        explain_fn: reason for one failing layout, naming the values.
        uses_env: the functions take a fourth argument, the :class:`RuleEnv`.
    """

    id: str
    description: str
    columns: tuple[str, ...]
    check_fn: CheckFn
    explain_fn: ExplainFn
    uses_env: bool = False

    def check(self, table: LayoutTable, model: ModelSpec, workload: Workload, env: RuleEnv = DEFAULT_RULE_ENV) -> BoolArray:
        """Rows of ``table`` that pass (a bool array of ``len(table)``)."""
        raw = self.check_fn(table, model, workload, env) if self.uses_env else self.check_fn(table, model, workload)
        ok = np.asarray(raw, dtype=np.bool_)
        return np.broadcast_to(ok, (len(table),)).copy() if ok.shape != (len(table),) else ok

    def explain(self, layout: Layout, model: ModelSpec, workload: Workload, env: RuleEnv = DEFAULT_RULE_ENV) -> str:
        """Why ``layout`` breaks this rule: the values involved and what would be accepted."""
        return str(self.explain_fn(layout, model, workload, env) if self.uses_env else self.explain_fn(layout, model, workload))


# --------------------------------------------------------------------------- helpers


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

    ``rows`` restricts the result to those row indices (in that order).
    """
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
            model.num_layers,
            layout.pp,
            layout.vpp,
            layout.num_layers_in_first_pipeline_stage,
            layout.num_layers_in_last_pipeline_stage,
        )
    except InfeasibleLayout as e:
        return e.reason
    return None


def _layout_counts(layout: Layout, model: ModelSpec) -> list[list[int]] | None:
    try:
        return stage_layer_counts(
            model.num_layers,
            layout.pp,
            layout.vpp,
            layout.num_layers_in_first_pipeline_stage,
            layout.num_layers_in_last_pipeline_stage,
        )
    except InfeasibleLayout:
        return None


def applicable_recompute_modules(model: ModelSpec) -> tuple[str, ...]:
    """``--recompute-modules`` entries that have something to recompute in ``model``.

    ``moe_act``/``moe`` need MoE layers, ``shared_experts`` a shared expert,
    ``mla_up_proj`` multi-latent attention (``TransformerConfig.__post_init__``,
    ``megatron/core/transformer/transformer_config.py``, raises for ``mla_up_proj``
    without MLA; the others would silently do nothing), and ``mlp`` dense layers
    (``TransformerLayer.__init__`` in ``transformer_layer.py`` sets ``recompute_mlp``
    only for a layer that is not MoE).
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


# --------------------------------------------------------------------------- parallel sizes


def _world_tp_pp_cp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``world_div_tp_pp_cp``: world_size % (tp*pp*cp) == 0; dp = world/(tp*pp*cp)
    (megatron/core/parallel_state.py initialize_model_parallel; megatron/training/arguments.py
    validate_args).
    """
    return _b(t["world_size"] % (t["tp"] * t["pp"] * t["cp"]) == 0)


def _world_tp_pp_cp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    prod = lay.tp * lay.pp * lay.cp
    return (
        f"world_size ({lay.world_size}) must be a multiple of tp*pp*cp = {lay.tp}*{lay.pp}*{lay.cp} = {prod}; "
        f"accepted: tp*pp*cp in {_divisors(lay.world_size)}"
    )


def _world_etp_ep_pp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``world_div_etp_ep_pp``: world_size % (etp*ep*pp) == 0 for the expert grid; edp =
    world/(etp*ep*pp) (megatron/core/parallel_state.py initialize_model_parallel, expert RankGenerator).
    """
    return _b(t["world_size"] % (t["etp"] * t["ep"] * t["pp"]) == 0)


def _world_etp_ep_pp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    prod = lay.etp * lay.ep * lay.pp
    return (
        f"world_size ({lay.world_size}) must be a multiple of etp*ep*pp = {lay.etp}*{lay.ep}*{lay.pp} = {prod} "
        f"(the expert grid); accepted: etp*ep*pp in {_divisors(lay.world_size)}"
    )


def _heads_tp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``heads_div_tp``: num_attention_heads % tp == 0 (megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__).
    """
    return _b(m.num_attention_heads % t["tp"] == 0)


def _heads_tp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"num_attention_heads ({m.num_attention_heads}) must be a multiple of tp ({lay.tp}); "
        f"accepted tp: {_divisors(m.num_attention_heads)}"
    )


#: The first megatron-core release that accepts TP above the query-group count (a multiple of it: KV heads
#: replicated over TP): transformer_config.py ``TransformerConfig.__post_init__``, core_v0.16.0 l.939-946;
#: core_v0.15.0 l.758 still raised "must be a multiple of tensor_model_parallel_size" (docs/megatron_versions.md).
TP_ABOVE_QUERY_GROUPS_SINCE = (0, 16)


def _groups_tp(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """Rule ``query_groups_tp``: num_query_groups % tp == 0, or from megatron-core 0.16 also tp % num_query_groups
    == 0 (:data:`TP_ABOVE_QUERY_GROUPS_SINCE`; transformer_config.py TransformerConfig.__post_init__).
    """
    tp = t["tp"]
    g = m.num_query_groups
    if env.megatron_core < TP_ABOVE_QUERY_GROUPS_SINCE:
        return _b(g % tp == 0)
    return _b((g % tp == 0) | (tp % g == 0))


def _groups_tp_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    g = m.num_query_groups
    if env.megatron_core < TP_ABOVE_QUERY_GROUPS_SINCE:
        return (
            f"num_query_groups ({g}) must be a multiple of tp ({lay.tp}) in megatron-core {env.version_label} (TP above the "
            f"query-group count needs 0.16 or later, --megatron-core); accepted tp: {_divisors(g)}"
        )
    return (
        f"num_query_groups ({g}) must be a multiple or a divisor of tp ({lay.tp}) (megatron-core >= 0.16; "
        f"core <= 0.15 needs a multiple); accepted tp: divisors or multiples of {g}, e.g. {_divisors(g)} or {2 * g}"
    )


def _ffn_tp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``ffn_div_tp``: ffn_hidden_size (dense layers) and the shared-expert width % tp == 0
    (megatron/core/tensor_parallel/layers.py ColumnParallelLinear/RowParallelLinear, divide()).
    """
    tp = t["tp"]
    ok = np.ones(len(t), dtype=np.bool_)
    if m.num_dense_layers > 0 and m.ffn_hidden_size > 0:
        ok &= m.ffn_hidden_size % tp == 0
    if m.is_moe and m.moe_shared_expert_intermediate_size > 0:
        ok &= m.moe_shared_expert_intermediate_size % tp == 0
    return ok


def _ffn_tp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    parts = []
    if m.num_dense_layers > 0 and m.ffn_hidden_size > 0 and m.ffn_hidden_size % lay.tp:
        parts.append(f"ffn_hidden_size ({m.ffn_hidden_size}) of the dense layers")
    if m.is_moe and m.moe_shared_expert_intermediate_size > 0 and m.moe_shared_expert_intermediate_size % lay.tp:
        parts.append(f"moe_shared_expert_intermediate_size ({m.moe_shared_expert_intermediate_size})")
    what = " and ".join(parts) or "the FFN width"
    return f"{what} must be a multiple of tp ({lay.tp}): the MLP weights are split over tp"


def _experts_ep(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``experts_div_ep``: num_experts % ep == 0 (megatron/training/arguments.py validate_args;
    megatron/core/transformer/moe/moe_layer.py MoELayer.__init__).
    """
    if not m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b(m.num_experts % t["ep"] == 0)


def _experts_ep_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return f"num_experts ({m.num_experts}) must be a multiple of ep ({lay.ep}); accepted ep: {_divisors(m.num_experts)}"


def _moe_ffn_etp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``moe_ffn_div_etp``: moe_ffn_hidden_size % etp == 0 (megatron/core/transformer/moe/experts.py
    TEGroupedMLP, tensor_parallel/layers.py divide()).
    """
    if not m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b(m.moe_ffn_hidden_size % t["etp"] == 0)


def _moe_ffn_etp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"moe_ffn_hidden_size ({m.moe_ffn_hidden_size}) must be a multiple of etp ({lay.etp}): "
        "each expert's weights are split over etp"
    )


def _dense_ep(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``dense_no_expert_parallel``: a dense model needs ep == 1 and etp == 1 (arguments.py
    validate_args: EP > 1 needs --num-experts; etp is meaningless without experts, tuner policy).
    """
    if m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b((t["ep"] == 1) & (t["etp"] == 1))


def _dense_ep_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"model {m.name!r} is dense (num_experts 0): ep ({lay.ep}) and etp ({lay.etp}) must both be 1; "
        "expert parallelism needs a MoE model (Megatron's --num-experts)"
    )


def _seq_cp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``seq_div_2cp``: cp > 1: seq_length % (2*cp) == 0 (megatron/training/arguments.py validate_args)."""
    cp = t["cp"]
    return _b((cp == 1) | (w.seq_length % (2 * cp) == 0))


def _seq_cp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"with cp {lay.cp} > 1, seq_length ({w.seq_length}) must be a multiple of 2*cp = {2 * lay.cp} "
        "(each sequence is cut into 2*cp load-balanced chunks)"
    )


def _sp_policy(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``sequence_parallel``: sequence_parallel needs tp > 1 (megatron/core/model_parallel_config.py
    ModelParallelConfig.__post_init__ raises); tuner policy: sequence_parallel whenever tp > 1 (core >=
    0.15 only warns for ep > 1 and tp > 1 without it, core <= 0.14 raises).
    """
    return _b(t["sequence_parallel"] == (t["tp"] > 1))


def _sp_policy_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.sequence_parallel:
        return f"sequence_parallel needs tp > 1, got tp {lay.tp}; turn sequence_parallel off"
    return (
        f"tp is {lay.tp} but sequence_parallel is off; the tuner always uses sequence parallelism when tp > 1 "
        "(megatron-core <= 0.14 raises for ep > 1 and tp > 1 without it, >= 0.15 warns)"
    )


def _sp_seq(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``sp_seq_div_tp``: sequence parallel: (seq_length/cp) % tp == 0
    (megatron/core/tensor_parallel/mappings.py _split_along_first_dim).
    """
    return _b(~t["sequence_parallel"] | (w.seq_length % (t["cp"] * t["tp"]) == 0))


def _sp_seq_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    per_cp = w.seq_length / lay.cp
    return (
        f"with sequence_parallel, the tokens per context-parallel rank seq_length/cp = {w.seq_length}/{lay.cp} "
        f"= {per_cp:g} must be a multiple of tp ({lay.tp})"
    )


# --------------------------------------------------------------------------- batch and pipeline


def _batch(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``batch_div_mbs_dp``: global_batch_size % (micro_batch_size*dp) == 0
    (megatron/core/num_microbatches_calculator.py ConstantNumMicroBatchesCalculator.__init__).
    """
    step = t["micro_batch_size"] * _dp(t)
    return _b((step > 0) & (w.global_batch_size % np.maximum(step, 1) == 0))


def _batch_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.world_size % (lay.tp * lay.pp * lay.cp):
        return (
            f"dp = world_size/(tp*pp*cp) = {lay.world_size}/{lay.tp * lay.pp * lay.cp} is not a whole number, so "
            f"global_batch_size ({w.global_batch_size}) cannot be cut into micro-batches"
        )
    step = lay.micro_batch_size * lay.dp
    ok_mbs = [b for b in range(1, w.global_batch_size + 1) if w.global_batch_size % (b * lay.dp) == 0]
    return (
        f"global_batch_size ({w.global_batch_size}) must be a multiple of micro_batch_size*dp = "
        f"{lay.micro_batch_size}*{lay.dp} = {step}; accepted micro_batch_size at dp {lay.dp}: {ok_mbs or 'none'}"
    )


def _split(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``pipeline_split``: the decoder layers split over pp ranks and vpp chunks as first/last ask
    (search_spaces.pipeline.stage_layer_counts; megatron/core/transformer/pipeline_parallel_layer_layout.py
    validate_layer_layout).
    """
    return _split_stats(t, m).feasible


def _split_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return _split_reason(lay, m) or "the pipeline split is feasible"


def _split_canonical(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``pipeline_split_canonical``: tuner policy: an uneven first/last that gives the even split's
    chunks is a duplicate (Megatron accepts it).
    """
    return _b(~_split_stats(t, m).same_as_even)


def _split_canonical_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    counts = _layout_counts(lay, m)
    return (
        f"first ({lay.num_layers_in_first_pipeline_stage}) and last ({lay.num_layers_in_last_pipeline_stage}) give "
        f"the same layers per chunk as the even split ({counts}); leave both 0 (tuner policy: one form per split)"
    )


def _interleaved(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``interleaved_schedule``: vpp > 1 needs pp > 1 (arguments.py validate_args;
    parallel_state.initialize_model_parallel) and num_microbatches M >= pp with M % pp == 0 for the default
    microbatch group of pp (megatron/core/pipeline_parallel/schedules.py
    forward_backward_pipelining_with_interleaving).
    """
    vpp, pp = t["vpp"], t["pp"]
    step = t["micro_batch_size"] * _dp(t)
    defined = (step > 0) & (w.global_batch_size % np.maximum(step, 1) == 0)
    nmb = w.global_batch_size // np.maximum(step, 1)
    sched_ok = ~defined | ((nmb >= pp) & (nmb % pp == 0))
    return _b((vpp == 1) | ((pp > 1) & sched_ok))


def _interleaved_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.pp <= 1:
        return f"vpp ({lay.vpp}) > 1 needs pp > 1, got pp {lay.pp}"
    step = lay.micro_batch_size * lay.dp
    nmb = w.global_batch_size // step if step else 0
    return (
        f"the interleaved schedule (vpp {lay.vpp}) needs the number of microbatches "
        f"M = global_batch_size/(micro_batch_size*dp) = "
        f"{w.global_batch_size}/({lay.micro_batch_size}*{lay.dp}) = {nmb} "
        f"to be >= pp ({lay.pp}) and a multiple of pp"
    )


# --------------------------------------------------------------------------- recompute


def _recompute_full(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``recompute_full``: full recompute: method uniform|block and recompute_num_layers >= 1
    (transformer_config.py TransformerConfig.__post_init__); MTP needs uniform 1 (multi_token_prediction.py
    MultiTokenPredictionLayer._checkpointed_forward); uniform groups must tile every chunk (core 0.16
    transformer_block.py TransformerBlock._checkpointed_forward indexes past the chunk); block <= largest
    chunk (tuner policy: more is the same as all).
    """
    full = t.isin("recompute_granularity", "full")
    if not full.any():
        return np.ones(len(t), dtype=np.bool_)
    uniform, block, n = t.isin("recompute_method", "uniform"), t.isin("recompute_method", "block"), t["recompute_num_layers"]
    ok = (uniform | block) & (n >= 1) & t.isin("recompute_modules", "")
    if m.mtp_num_layers > 0:
        ok &= ~uniform | (n == 1)
    sub = np.flatnonzero(full)
    stats = _split_stats(t, m, sub)
    n_sub = n[sub]
    safe_n = np.maximum(n_sub, 1)
    chunk_ok = ~stats.feasible | (
        (~block[sub] | (n_sub <= stats.max_chunk))
        & (~uniform[sub] | (stats.chunk_gcd % safe_n == 0))
    )
    ok_sub = ok[sub] & chunk_ok
    out = np.ones(len(t), dtype=np.bool_)
    out[sub] = ok_sub
    return out


def _recompute_full_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    method, n = lay.recompute_method.value, lay.recompute_num_layers
    parts: list[str] = []
    if method not in ("uniform", "block"):
        parts.append(f"full recompute needs recompute_method uniform or block, got {method}")
    if n < 1:
        parts.append(f"full recompute needs recompute_num_layers >= 1, got {n}")
    if lay.recompute_modules:
        parts.append(
            f"recompute_modules ({','.join(lay.recompute_modules)}) apply to selective recompute only; leave them empty"
        )
    if m.mtp_num_layers > 0 and method == "uniform" and n != 1:
        parts.append(f"with {m.mtp_num_layers} MTP layer(s), uniform recompute needs recompute_num_layers 1, got {n}")
    counts = _layout_counts(lay, m)
    if counts is not None and n >= 1:
        chunks = [x for row in counts for x in row]
        if method == "block" and n > max(chunks):
            parts.append(
                f"block recompute of {n} layers per chunk exceeds the largest chunk ({max(chunks)} layers); "
                f"accepted: 1..{max(chunks)}"
            )
        if method == "uniform":
            bad = sorted({x for x in chunks if x and x % n})
            if bad:
                parts.append(
                    f"uniform recompute in groups of {n} layers needs every chunk's layer count to be a multiple "
                    f"of {n}, but chunks hold {bad} layers (megatron-core 0.16 indexes past the chunk)"
                )
    return "; ".join(parts) or "full recompute settings are valid"


def _recompute_selective(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``recompute_selective``: selective recompute: no recompute_method (arguments.py validate_args),
    recompute_num_layers None (transformer_config.py TransformerConfig.__post_init__), at least one module.
    """
    sel = t.isin("recompute_granularity", "selective")
    ok = t.isin("recompute_method", "none") & (t["recompute_num_layers"] == 0) & ~t.isin("recompute_modules", "")
    return _b(~sel | ok)


def _recompute_selective_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    parts: list[str] = []
    if lay.recompute_method.value != "none":
        parts.append(f"selective recompute takes no recompute_method, got {lay.recompute_method.value}")
    if lay.recompute_num_layers:
        parts.append(f"selective recompute needs recompute_num_layers unset (0), got {lay.recompute_num_layers}")
    if not lay.recompute_modules:
        parts.append("selective recompute needs at least one of recompute_modules (e.g. core_attn)")
    return "; ".join(parts) or "selective recompute settings are valid"


def _recompute_none(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``recompute_none``: no recompute: method, num_layers and modules unset (tuner policy: one form per
    setting).
    """
    none = t.isin("recompute_granularity", "none")
    ok = t.isin("recompute_method", "none") & (t["recompute_num_layers"] == 0) & t.isin("recompute_modules", "")
    return _b(~none | ok)


def _recompute_none_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"recompute_granularity is none, so recompute_method ({lay.recompute_method.value}), recompute_num_layers "
        f"({lay.recompute_num_layers}) and recompute_modules ({','.join(lay.recompute_modules) or 'empty'}) must be "
        "unset (none, 0, empty)"
    )


def _recompute_modules(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``recompute_modules_model``: moe_act/moe need MoE layers, mlp dense layers, shared_experts a
    shared expert, mla_up_proj MLA (transformer_config.py TransformerConfig.__post_init__ raises for
    mla_up_proj without MLA and moe_act without grouped GEMM, which the tuner always uses for MoE).
    """
    allowed = set(applicable_recompute_modules(m))
    return t.where("recompute_modules", lambda s: all(x in allowed for x in s.split(",") if x))


def _recompute_modules_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    allowed = applicable_recompute_modules(m)
    bad = [x for x in lay.recompute_modules if x not in allowed]
    return (
        f"recompute_modules {bad} have nothing to recompute in model {m.name!r} (moe_act/moe need MoE layers, "
        f"mlp dense layers, shared_experts a shared expert, mla_up_proj MLA); accepted for this model: "
        f"{', '.join(allowed)}"
    )


# --------------------------------------------------------------------------- optimizer and dispatcher


def _offload(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``offload_needs_precision_aware``: --optimizer-cpu-offload needs --use-precision-aware-optimizer
    (megatron/training/arguments.py validate_args).
    """
    return _b((t["optimizer_offload_fraction"] <= 0) | t["use_precision_aware_optimizer"])


def _offload_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"optimizer_offload_fraction {lay.optimizer_offload_fraction:g} > 0 (--optimizer-cpu-offload) needs "
        "use_precision_aware_optimizer; set it, or use offload fraction 0"
    )


def _pa_distopt(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``precision_aware_needs_distopt``: --use-precision-aware-optimizer needs the distributed optimizer
    (megatron/core/optimizer/optimizer_config.py OptimizerConfig.__post_init__).
    """
    return _b(~t["use_precision_aware_optimizer"] | t["use_distributed_optimizer"])


def _pa_distopt_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return "use_precision_aware_optimizer needs use_distributed_optimizer (it is off); turn it on"


def _dtypes(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``optimizer_dtypes``: exp_avg/exp_avg_sq dtypes other than fp32 need the precision-aware optimizer
    (optimizer_config.py OptimizerConfig.__post_init__).
    """
    fp32 = t.isin("exp_avg_dtype", "fp32") & t.isin("exp_avg_sq_dtype", "fp32")
    return _b(fp32 | t["use_precision_aware_optimizer"])


def _dtypes_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"exp_avg_dtype ({lay.exp_avg_dtype}) and exp_avg_sq_dtype ({lay.exp_avg_sq_dtype}) other than fp32 need "
        "use_precision_aware_optimizer; accepted without it: fp32"
    )


def _dispatcher(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """Rule ``dispatcher``: flex dispatcher needs etp*ep > 1
    (megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher.__init__, 'Flex token
    dispatcher requires TPxEP > 1', where TP is the expert TP); a dense model has no dispatcher: alltoall
    only (tuner policy).
    """
    if not m.is_moe:
        return t.isin("dispatcher", Dispatcher.alltoall.value)
    flex = enum_mask(t, "dispatcher", Dispatcher, lambda x: x.is_flex)
    return _b(~flex | (t["etp"] * t["ep"] > 1))


def _dispatcher_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if not m.is_moe:
        return (
            f"model {m.name!r} is dense: it has no token dispatcher, so dispatcher must be alltoall "
            f"(got {lay.dispatcher.value})"
        )
    return (
        f"the flex dispatcher ({lay.dispatcher.value}) needs etp*ep > 1, got etp {lay.etp} * ep {lay.ep} = "
        f"{lay.etp * lay.ep}; use alltoall or allgather, or ep > 1"
    )


#: The first megatron-core release with ``moe_flex_dispatcher_backend`` (``--moe-flex-dispatcher-backend deepep|hybridep``,
#: the flags this tool writes for a flex dispatcher): absent from core_v0.15.0 .. core_v0.15.3, which have only
#: ``--moe-enable-deepep``; in core_v0.16.0 transformer/moe/token_dispatcher.py and moe/README.md.
FLEX_BACKEND_SINCE = (0, 16)


def _dispatcher_release(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """Rule ``dispatcher_release``: a flex dispatcher (its ``--moe-flex-dispatcher-backend``) needs megatron-core 0.16
    or later (:data:`FLEX_BACKEND_SINCE`, ``--megatron-core``)."""
    if env.megatron_core >= FLEX_BACKEND_SINCE or not m.is_moe:
        return _b(np.ones(len(t), dtype=bool))
    return _b(~enum_mask(t, "dispatcher", Dispatcher, lambda x: x.is_flex))


def _dispatcher_release_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    return (f"the flex dispatcher ({lay.dispatcher.value}) is written as --moe-flex-dispatcher-backend, which megatron-core "
            f"{env.version_label} does not have (it arrived in 0.16; --megatron-core); use alltoall or allgather, or a newer release")


def _dispatcher_fabric(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """Rule ``dispatcher_fabric``: a flex backend whose inter-node kernels do not run on the cluster's fabric
    (``runs: false`` in ``specs/data/networks.yaml``) cannot have an EP group (``etp x ep`` consecutive ranks) that
    leaves the NVLink domain: on AWS EFA DeepEP's inter-node kernels need NVSHMEM IBGDA, which EFA lacks
    (deepseek-ai/DeepEP issue 369), and HybridEP traps without an mlx5 NIC (NVIDIA-NeMo/Megatron-Bridge issue 3343).
    Inside one NVLink domain their NVLink kernels need no NIC. No network named: not checked.
    """
    net = env.network
    if net is None or not m.is_moe or not net.not_across:
        return np.ones(len(t), dtype=np.bool_)
    bad = enum_mask(t, "dispatcher", Dispatcher, lambda d: not net.dispatcher(d).runs_across)
    crosses = t["etp"] * t["ep"] > max(env.nvlink_size, 1)
    return _b(~(bad & crosses))


def _dispatcher_fabric_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    net = env.network
    assert net is not None, "only a check with a network fails"
    on = net.dispatcher(lay.dispatcher)
    return (
        f"the {lay.dispatcher.value} dispatcher does not run across {net.name} ({net.key}): its EP group of etp {lay.etp} x "
        f"ep {lay.ep} = {lay.etp * lay.ep} GPUs leaves the NVLink domain of {env.nvlink_size} ({on.source}); use ep x etp <= "
        f"{env.nvlink_size}, or a dispatcher that runs there ({', '.join(d.value for d in Dispatcher if net.dispatcher(d).runs_across)})"
    )


def _cp_attention(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """Rule ``cp_attention_variant``: with context parallelism, Transformer Engine runs attention sinks (``softmax_type``
    not vanilla) only with ``--cp-comm-type a2a`` (transformer_engine/pytorch/attention/dot_product_attention/utils.py,
    ``get_attention_backend``: FusedAttention is disabled for CP with another cp_comm_type and no other backend takes a
    non-vanilla softmax under CP) and sliding-window attention only with ``a2a`` or ``all_gather`` (context_parallel.py,
    "Context parallelism does not support sliding window attention"); this tool models ``p2p`` and ``a2a``."""
    if env.cp_comm_type == "a2a" or not (m.softmax_type != "vanilla" or m.num_window_layers):
        return np.ones(len(t), dtype=np.bool_)
    return _b(t["cp"] == 1)


def _cp_attention_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    what = " and ".join(x for x in ((f"softmax_type {m.softmax_type}" if m.softmax_type != "vanilla" else ""),
                                     ("sliding-window attention" if m.num_window_layers else "")) if x)
    return (f"cp {lay.cp} with {what} ({m.name}) needs Megatron's --cp-comm-type a2a in Transformer Engine, and the run uses "
            f"{env.cp_comm_type} (the commands this tool writes keep Megatron's default, p2p); use cp 1")


def layout_warnings(layout: Layout, model: ModelSpec, options: RunOptions) -> list[str]:
    """Things Megatron accepts that are reported to fail, for one layout: with EP all-to-all overlap
    (``overlap_moe_expert_parallel_comm``) an odd number of MoE layers on a pipeline stage (a virtual stage with
    VPP) was reported to hang (NVIDIA/Megatron-LM issue 1810, cited by issue 1852; affected releases unknown).

    Returns:
        One line per warning (empty when none).
    """
    out: list[str] = []
    if options.overlap_moe_expert_parallel_comm and model.is_moe:
        counts = _layout_counts(layout, model)
        if counts is not None:
            freq = model.moe_layer_freq
            odd: list[tuple[int, int, int]] = []
            start = 0
            for v in range(layout.vpp):
                for p in range(layout.pp):
                    n = counts[p][v]
                    moe = sum(1 for i in range(start, start + n) if freq[i])
                    if moe % 2:
                        odd.append((p, v, moe))
                    start += n
            if odd:
                where = ", ".join(f"rank {p} stage {v}: {k}" for p, v, k in odd[:4]) + (" ..." if len(odd) > 4 else "")
                out.append(
                    f"EP all-to-all overlap with an odd number of MoE layers on a pipeline stage ({where}) was reported to hang "
                    "(NVIDIA/Megatron-LM issue 1810, via issue 1852); prefer a split with an even number per stage"
                )
    return out


# --------------------------------------------------------------------------- registry

_R = Rule

#: Every rule, in the order they are checked. Rules over the parallel sizes come
#: first so that the enumeration can apply them before crossing in the rest.
RULES: tuple[Rule, ...] = (
    _R(
        id="world_div_tp_pp_cp",
        description="world_size % (tp*pp*cp) == 0; dp = world/(tp*pp*cp) "
        "(megatron/core/parallel_state.py initialize_model_parallel; megatron/training/arguments.py validate_args)",
        columns=("world_size", "tp", "pp", "cp"),
        check_fn=_world_tp_pp_cp,
        explain_fn=_world_tp_pp_cp_x,
    ),
    _R(
        id="world_div_etp_ep_pp",
        description="world_size % (etp*ep*pp) == 0 for the expert grid; edp = world/(etp*ep*pp) "
        "(megatron/core/parallel_state.py initialize_model_parallel, expert RankGenerator)",
        columns=("world_size", "etp", "ep", "pp"),
        check_fn=_world_etp_ep_pp,
        explain_fn=_world_etp_ep_pp_x,
    ),
    _R(
        id="heads_div_tp",
        description="num_attention_heads % tp == 0 (megatron/core/transformer/transformer_config.py "
        "TransformerConfig.__post_init__)",
        columns=("tp",),
        check_fn=_heads_tp,
        explain_fn=_heads_tp_x,
    ),
    _R(
        id="query_groups_tp",
        description="num_query_groups % tp == 0, or from megatron-core 0.16 tp % num_query_groups == 0 "
        "(core <= 0.15: multiple only; --megatron-core) (transformer_config.py TransformerConfig.__post_init__)",
        columns=("tp",),
        check_fn=_groups_tp,
        explain_fn=_groups_tp_x,
        uses_env=True,
    ),
    _R(
        id="ffn_div_tp",
        description="ffn_hidden_size (dense layers) and the shared-expert width % tp == 0 "
        "(megatron/core/tensor_parallel/layers.py ColumnParallelLinear/RowParallelLinear, divide())",
        columns=("tp",),
        check_fn=_ffn_tp,
        explain_fn=_ffn_tp_x,
    ),
    _R(
        id="experts_div_ep",
        description="num_experts % ep == 0 (megatron/training/arguments.py validate_args; "
        "megatron/core/transformer/moe/moe_layer.py MoELayer.__init__)",
        columns=("ep",),
        check_fn=_experts_ep,
        explain_fn=_experts_ep_x,
    ),
    _R(
        id="moe_ffn_div_etp",
        description="moe_ffn_hidden_size % etp == 0 (megatron/core/transformer/moe/experts.py TEGroupedMLP, "
        "tensor_parallel/layers.py divide())",
        columns=("etp",),
        check_fn=_moe_ffn_etp,
        explain_fn=_moe_ffn_etp_x,
    ),
    _R(
        id="dense_no_expert_parallel",
        description="a dense model needs ep == 1 and etp == 1 (arguments.py validate_args: EP > 1 needs "
        "--num-experts; etp is meaningless without experts, tuner policy)",
        columns=("ep", "etp"),
        check_fn=_dense_ep,
        explain_fn=_dense_ep_x,
    ),
    _R(
        id="seq_div_2cp",
        description="cp > 1: seq_length % (2*cp) == 0 (megatron/training/arguments.py validate_args)",
        columns=("cp",),
        check_fn=_seq_cp,
        explain_fn=_seq_cp_x,
    ),
    _R(
        id="sequence_parallel",
        description="sequence_parallel needs tp > 1 (megatron/core/model_parallel_config.py "
        "ModelParallelConfig.__post_init__ raises); tuner policy: sequence_parallel whenever tp > 1 "
        "(core >= 0.15 only warns for ep > 1 and tp > 1 without it, core <= 0.14 raises)",
        columns=("tp", "sequence_parallel"),
        check_fn=_sp_policy,
        explain_fn=_sp_policy_x,
    ),
    _R(
        id="sp_seq_div_tp",
        description="sequence parallel: (seq_length/cp) % tp == 0 (megatron/core/tensor_parallel/mappings.py "
        "_split_along_first_dim)",
        columns=("tp", "cp", "sequence_parallel"),
        check_fn=_sp_seq,
        explain_fn=_sp_seq_x,
    ),
    _R(
        id="batch_div_mbs_dp",
        description="global_batch_size % (micro_batch_size*dp) == 0 (megatron/core/num_microbatches_calculator.py "
        "ConstantNumMicroBatchesCalculator.__init__)",
        columns=("world_size", "tp", "pp", "cp", "micro_batch_size"),
        check_fn=_batch,
        explain_fn=_batch_x,
    ),
    _R(
        id="pipeline_split",
        description="the decoder layers split over pp ranks and vpp chunks as first/last ask (search_spaces.pipeline."
        "stage_layer_counts; megatron/core/transformer/pipeline_parallel_layer_layout.py validate_layer_layout)",
        columns=("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
        check_fn=_split,
        explain_fn=_split_x,
    ),
    _R(
        id="pipeline_split_canonical",
        description="tuner policy: an uneven first/last that gives the even split's chunks is a duplicate "
        "(Megatron accepts it)",
        columns=("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
        check_fn=_split_canonical,
        explain_fn=_split_canonical_x,
    ),
    _R(
        id="interleaved_schedule",
        description="vpp > 1 needs pp > 1 (arguments.py validate_args; parallel_state.initialize_model_parallel) and "
        "num_microbatches M >= pp with M % pp == 0 for the default microbatch group of pp "
        "(megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving)",
        columns=("vpp", "pp", "world_size", "tp", "cp", "micro_batch_size"),
        check_fn=_interleaved,
        explain_fn=_interleaved_x,
    ),
    _R(
        id="recompute_full",
        description="full recompute: method uniform|block and recompute_num_layers >= 1 (transformer_config.py "
        "TransformerConfig.__post_init__); MTP needs uniform 1 (multi_token_prediction.py "
        "MultiTokenPredictionLayer._checkpointed_forward); uniform groups must tile every chunk (core 0.16 "
        "transformer_block.py TransformerBlock._checkpointed_forward indexes past the chunk); block <= largest "
        "chunk (tuner policy: more is the same as all)",
        columns=(
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
            "recompute_modules",
            "pp",
            "vpp",
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
        ),
        check_fn=_recompute_full,
        explain_fn=_recompute_full_x,
    ),
    _R(
        id="recompute_selective",
        description="selective recompute: no recompute_method (arguments.py validate_args), recompute_num_layers "
        "None (transformer_config.py TransformerConfig.__post_init__), at least one module",
        columns=("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
        check_fn=_recompute_selective,
        explain_fn=_recompute_selective_x,
    ),
    _R(
        id="recompute_none",
        description="no recompute: method, num_layers and modules unset (tuner policy: one form per setting)",
        columns=("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
        check_fn=_recompute_none,
        explain_fn=_recompute_none_x,
    ),
    _R(
        id="recompute_modules_model",
        description="moe_act/moe need MoE layers, mlp dense layers, shared_experts a shared expert, mla_up_proj MLA "
        "(transformer_config.py TransformerConfig.__post_init__ raises for mla_up_proj without MLA and "
        "moe_act without grouped GEMM, which the tuner always uses for MoE)",
        columns=("recompute_modules",),
        check_fn=_recompute_modules,
        explain_fn=_recompute_modules_x,
    ),
    _R(
        id="offload_needs_precision_aware",
        description="--optimizer-cpu-offload needs --use-precision-aware-optimizer "
        "(megatron/training/arguments.py validate_args)",
        columns=("optimizer_offload_fraction", "use_precision_aware_optimizer"),
        check_fn=_offload,
        explain_fn=_offload_x,
    ),
    _R(
        id="precision_aware_needs_distopt",
        description="--use-precision-aware-optimizer needs the distributed optimizer "
        "(megatron/core/optimizer/optimizer_config.py OptimizerConfig.__post_init__)",
        columns=("use_precision_aware_optimizer", "use_distributed_optimizer"),
        check_fn=_pa_distopt,
        explain_fn=_pa_distopt_x,
    ),
    _R(
        id="optimizer_dtypes",
        description="exp_avg/exp_avg_sq dtypes other than fp32 need the precision-aware optimizer "
        "(optimizer_config.py OptimizerConfig.__post_init__)",
        columns=("exp_avg_dtype", "exp_avg_sq_dtype", "use_precision_aware_optimizer"),
        check_fn=_dtypes,
        explain_fn=_dtypes_x,
    ),
    _R(
        id="dispatcher",
        description="flex dispatcher needs etp*ep > 1 (megatron/core/transformer/moe/token_dispatcher.py "
        "MoEFlexTokenDispatcher.__init__, 'Flex token dispatcher requires TPxEP > 1', where TP is the expert TP); "
        "a dense model has no dispatcher: alltoall only (tuner policy)",
        columns=("dispatcher", "etp", "ep"),
        check_fn=_dispatcher,
        explain_fn=_dispatcher_x,
    ),
    _R(
        id="dispatcher_release",
        description="a flex dispatcher needs megatron-core >= 0.16 (--moe-flex-dispatcher-backend; core <= 0.15 has only "
        "--moe-enable-deepep) (--megatron-core; megatron/core/transformer/moe/token_dispatcher.py)",
        columns=("dispatcher",),
        check_fn=_dispatcher_release,
        explain_fn=_dispatcher_release_x,
        uses_env=True,
    ),
    _R(
        id="dispatcher_fabric",
        description="a flex backend (megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher) whose "
        "inter-node kernels do not run on the cluster's fabric (specs/data/networks.yaml) stays inside one NVLink domain: "
        "etp*ep <= NVLink domain (AWS EFA: deepseek-ai/DeepEP issue 369, NVIDIA-NeMo/Megatron-Bridge issue 3343)",
        columns=("dispatcher", "etp", "ep"),
        check_fn=_dispatcher_fabric,
        explain_fn=_dispatcher_fabric_x,
        uses_env=True,
    ),
    _R(
        id="cp_attention_variant",
        description="context parallelism with attention sinks or sliding windows (GPT-OSS) needs --cp-comm-type a2a: "
        "Transformer Engine's attention/dot_product_attention/utils.py get_attention_backend and context_parallel.py",
        columns=("cp",),
        check_fn=_cp_attention,
        explain_fn=_cp_attention_x,
        uses_env=True,
    ),
)

#: Rule ids in check order.
RULE_IDS: tuple[str, ...] = tuple(r.id for r in RULES)
assert len(set(RULE_IDS)) == len(RULE_IDS)


def check_table(table: LayoutTable, model: ModelSpec, workload: Workload, env: RuleEnv = DEFAULT_RULE_ENV) -> tuple[BoolArray, dict[str, int]]:
    """Check every row of ``table`` against :data:`RULES`.

    Args:
        table: the layouts.
        model: the model they train.
        workload: sequence length and global batch.
        env: release and network of the environment-dependent rules.

    Returns:
        ``(ok, first_failures)``: a bool array (True = valid) and, for every rule
        id in check order, the number of rows whose first failing rule it is
        (``sum(first_failures.values()) + ok.sum() == len(table)``).
    """
    alive = np.ones(len(table), dtype=np.bool_)
    counts: dict[str, int] = {}
    for rule in RULES:
        ok = rule.check(table, model, workload, env)
        counts[rule.id] = int(np.count_nonzero(alive & ~ok))
        alive &= ok
    return alive, counts


def check_layout(layout: Layout, model: ModelSpec, workload: Workload, env: RuleEnv = DEFAULT_RULE_ENV) -> list[tuple[str, str]]:
    """Every rule ``layout`` breaks, with its reason.

    Args:
        layout: one layout.
        model: the model it trains.
        workload: sequence length and global batch.
        env: release and network of the environment-dependent rules.

    Returns:
        ``[(rule_id, reason), ...]`` in check order; empty when the layout is valid.
    """
    table = LayoutTable.from_layouts([layout])
    return [
        (rule.id, rule.explain(layout, model, workload, env))
        for rule in RULES
        if not bool(rule.check(table, model, workload, env)[0])
    ]
