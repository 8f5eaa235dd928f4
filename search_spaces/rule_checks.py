"""The validity rules' checks, in pairs: a vectorised check over a :class:`LayoutTable` (True = the layout passes)
and a one-layout explanation naming the values involved and what would be accepted. Registered, with their
descriptions and sources, in :data:`search_spaces.rules.RULES`."""

from __future__ import annotations

import numpy as np

from search_spaces.rule_base import (
    BoolArray,
    RuleEnv,
    _b,
    _divisors,
    _dp,
    _layout_counts,
    _split_reason,
    _split_stats,
    applicable_recompute_modules,
    rule,
)
from specs import ModelSpec, RunOptions, Workload
from specs.layout import Dispatcher, Layout, LayoutTable, enum_mask


def _world_tp_pp_cp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    prod = lay.tp * lay.pp * lay.cp
    return (f"world_size ({lay.world_size}) must be a multiple of tp*pp*cp = {lay.tp}*{lay.pp}*{lay.cp} = {prod}; "
            f"accepted: tp*pp*cp in {_divisors(lay.world_size)}")


@rule("world_div_tp_pp_cp", ("world_size", "tp", "pp", "cp"), explain=_world_tp_pp_cp_x)
def _world_tp_pp_cp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """world_size % (tp*pp*cp) == 0; dp = world/(tp*pp*cp) (megatron/core/parallel_state.py
    initialize_model_parallel; megatron/training/arguments.py validate_args)."""
    return _b(t["world_size"] % (t["tp"] * t["pp"] * t["cp"]) == 0)


def _world_etp_ep_pp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    prod = lay.etp * lay.ep * lay.pp
    return (f"world_size ({lay.world_size}) must be a multiple of etp*ep*pp = {lay.etp}*{lay.ep}*{lay.pp} = {prod} "
            f"(the expert grid); accepted: etp*ep*pp in {_divisors(lay.world_size)}")


@rule("world_div_etp_ep_pp", ("world_size", "etp", "ep", "pp"), explain=_world_etp_ep_pp_x)
def _world_etp_ep_pp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """world_size % (etp*ep*pp) == 0 for the expert grid; edp = world/(etp*ep*pp) (megatron/core/parallel_state.py
    initialize_model_parallel, expert RankGenerator)."""
    return _b(t["world_size"] % (t["etp"] * t["ep"] * t["pp"]) == 0)


def _heads_tp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"num_attention_heads ({m.num_attention_heads}) must be a multiple of tp ({lay.tp}); "
            f"accepted tp: {_divisors(m.num_attention_heads)}")


@rule("heads_div_tp", ("tp",), explain=_heads_tp_x)
def _heads_tp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """num_attention_heads % tp == 0 (megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__)."""
    return _b(m.num_attention_heads % t["tp"] == 0)


#: The first megatron-core release that accepts TP above the query-group count (a multiple of it: KV heads
#: replicated over TP): transformer_config.py ``TransformerConfig.__post_init__``, core_v0.16.0 l.939-946;
#: core_v0.15.0 l.758 still raised "must be a multiple of tensor_model_parallel_size" (docs/megatron_versions.md).
TP_ABOVE_QUERY_GROUPS_SINCE = (0, 16)


def _groups_tp_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    g = m.num_query_groups
    if env.megatron_core < TP_ABOVE_QUERY_GROUPS_SINCE:
        return (f"num_query_groups ({g}) must be a multiple of tp ({lay.tp}) in megatron-core {env.version_label} (TP "
                f"above the query-group count needs 0.16 or later, --megatron-core); accepted tp: {_divisors(g)}")
    return (
        f"num_query_groups ({g}) must be a multiple or a divisor of tp ({lay.tp}) (megatron-core >= 0.16; "
        f"core <= 0.15 needs a multiple); accepted tp: divisors or multiples of {g}, e.g. {_divisors(g)} or {2 * g}"
    )


@rule("query_groups_tp", ("tp",), explain=_groups_tp_x)
def _groups_tp(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """num_query_groups % tp == 0, or from megatron-core 0.16 also tp % num_query_groups == 0
    (:data:`TP_ABOVE_QUERY_GROUPS_SINCE`; core <= 0.15: a multiple only; transformer_config.py
    TransformerConfig.__post_init__)."""
    tp = t["tp"]
    g = m.num_query_groups
    if env.megatron_core < TP_ABOVE_QUERY_GROUPS_SINCE:
        return _b(g % tp == 0)
    return _b((g % tp == 0) | (tp % g == 0))


def _ffn_tp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    parts = []
    if m.num_dense_layers > 0 and m.ffn_hidden_size > 0 and m.ffn_hidden_size % lay.tp:
        parts.append(f"ffn_hidden_size ({m.ffn_hidden_size}) of the dense layers")
    if m.is_moe and m.moe_shared_expert_intermediate_size > 0 and m.moe_shared_expert_intermediate_size % lay.tp:
        parts.append(f"moe_shared_expert_intermediate_size ({m.moe_shared_expert_intermediate_size})")
    what = " and ".join(parts) or "the FFN width"
    return f"{what} must be a multiple of tp ({lay.tp}): the MLP weights are split over tp"


@rule("ffn_div_tp", ("tp",), explain=_ffn_tp_x)
def _ffn_tp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """ffn_hidden_size (dense layers) and the shared-expert width % tp == 0 (megatron/core/tensor_parallel/layers.py
    ColumnParallelLinear/RowParallelLinear, divide())."""
    tp = t["tp"]
    ok = np.ones(len(t), dtype=np.bool_)
    if m.num_dense_layers > 0 and m.ffn_hidden_size > 0:
        ok &= m.ffn_hidden_size % tp == 0
    if m.is_moe and m.moe_shared_expert_intermediate_size > 0:
        ok &= m.moe_shared_expert_intermediate_size % tp == 0
    return ok


def _experts_ep_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return f"num_experts ({m.num_experts}) must be a multiple of ep ({lay.ep}); accepted ep: {_divisors(m.num_experts)}"


@rule("experts_div_ep", ("ep",), explain=_experts_ep_x)
def _experts_ep(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """num_experts % ep == 0 (megatron/training/arguments.py validate_args;
    megatron/core/transformer/moe/moe_layer.py MoELayer.__init__)."""
    if not m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b(m.num_experts % t["ep"] == 0)


def _moe_ffn_etp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"moe_ffn_hidden_size ({m.moe_ffn_hidden_size}) must be a multiple of etp ({lay.etp}): "
            "each expert's weights are split over etp")


@rule("moe_ffn_div_etp", ("etp",), explain=_moe_ffn_etp_x)
def _moe_ffn_etp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """moe_ffn_hidden_size % etp == 0 (megatron/core/transformer/moe/experts.py TEGroupedMLP,
    tensor_parallel/layers.py divide())."""
    if not m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b(m.moe_ffn_hidden_size % t["etp"] == 0)


def _dense_ep_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"model {m.name!r} is dense (num_experts 0): ep ({lay.ep}) and etp ({lay.etp}) must both be 1; "
            "expert parallelism needs a MoE model (Megatron's --num-experts)")


@rule("dense_no_expert_parallel", ("ep", "etp"), explain=_dense_ep_x)
def _dense_ep(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """a dense model needs ep == 1 and etp == 1 (arguments.py validate_args: EP > 1 needs --num-experts; etp is
    meaningless without experts, tuner policy)."""
    if m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    return _b((t["ep"] == 1) & (t["etp"] == 1))


def _seq_cp_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"with cp {lay.cp} > 1, seq_length ({w.seq_length}) must be a multiple of 2*cp = {2 * lay.cp} "
            "(each sequence is cut into 2*cp load-balanced chunks)")


@rule("seq_div_2cp", ("cp",), explain=_seq_cp_x)
def _seq_cp(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """cp > 1: seq_length % (2*cp) == 0 (megatron/training/arguments.py validate_args)."""
    cp = t["cp"]
    return _b((cp == 1) | (w.seq_length % (2 * cp) == 0))


def _sp_policy_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.sequence_parallel:
        return f"sequence_parallel needs tp > 1, got tp {lay.tp}; turn sequence_parallel off"
    return (f"tp is {lay.tp} but sequence_parallel is off; the tuner always uses sequence parallelism when tp > 1 "
            "(megatron-core <= 0.14 raises for ep > 1 and tp > 1 without it, >= 0.15 warns) and its cost model prices "
            "only that: add --sequence-parallel (in a launch given with --from, too)")


@rule("sequence_parallel", ("tp", "sequence_parallel"), explain=_sp_policy_x)
def _sp_policy(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """sequence_parallel needs tp > 1 (megatron/core/model_parallel_config.py ModelParallelConfig.__post_init__
    raises); tuner policy: sequence_parallel whenever tp > 1 (core >= 0.15 only warns for ep > 1 and tp > 1 without
    it, core <= 0.14 raises)."""
    return _b(t["sequence_parallel"] == (t["tp"] > 1))


def _sp_seq_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    per_cp = w.seq_length / lay.cp
    return (f"with sequence_parallel, the tokens per context-parallel rank seq_length/cp = {w.seq_length}/{lay.cp} "
            f"= {per_cp:g} must be a multiple of tp ({lay.tp})")


@rule("sp_seq_div_tp", ("tp", "cp", "sequence_parallel"), explain=_sp_seq_x)
def _sp_seq(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """sequence parallel: (seq_length/cp) % tp == 0 (megatron/core/tensor_parallel/mappings.py
    _split_along_first_dim)."""
    return _b(~t["sequence_parallel"] | (w.seq_length % (t["cp"] * t["tp"]) == 0))


def _batch_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.world_size % (lay.tp * lay.pp * lay.cp):
        return (f"dp = world_size/(tp*pp*cp) = {lay.world_size}/{lay.tp * lay.pp * lay.cp} is not a whole number, so "
                f"global_batch_size ({w.global_batch_size}) cannot be cut into micro-batches")
    step = lay.micro_batch_size * lay.dp
    ok_mbs = [b for b in range(1, w.global_batch_size + 1) if w.global_batch_size % (b * lay.dp) == 0]
    return (f"global_batch_size ({w.global_batch_size}) must be a multiple of micro_batch_size*dp = "
            f"{lay.micro_batch_size}*{lay.dp} = {step}; accepted micro_batch_size at dp {lay.dp}: {ok_mbs or 'none'}")


@rule("batch_div_mbs_dp", ("world_size", "tp", "pp", "cp", "micro_batch_size"), explain=_batch_x)
def _batch(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """global_batch_size % (micro_batch_size*dp) == 0 (megatron/core/num_microbatches_calculator.py
    ConstantNumMicroBatchesCalculator.__init__)."""
    step = t["micro_batch_size"] * _dp(t)
    return _b((step > 0) & (w.global_batch_size % np.maximum(step, 1) == 0))


def _split_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return _split_reason(lay, m) or "the pipeline split is feasible"


@rule("pipeline_split", ("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
      explain=_split_x)
def _split(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """the decoder layers split over pp ranks and vpp chunks as first/last ask
    (search_spaces.pipeline.stage_layer_counts; megatron/core/transformer/pipeline_parallel_layer_layout.py
    validate_layer_layout)."""
    return _split_stats(t, m).feasible


def _split_canonical_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    counts = _layout_counts(lay, m)
    return (f"first ({lay.num_layers_in_first_pipeline_stage}) and last ({lay.num_layers_in_last_pipeline_stage}) give "
            f"the same layers per chunk as the even split ({counts}); leave both 0 (tuner policy: one form per split)")


@rule("pipeline_split_canonical", ("pp", "vpp", "num_layers_in_first_pipeline_stage",
                                   "num_layers_in_last_pipeline_stage"), explain=_split_canonical_x)
def _split_canonical(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """tuner policy: an uneven first/last that gives the even split's chunks is a duplicate (Megatron accepts it)."""
    return _b(~_split_stats(t, m).same_as_even)


def _interleaved_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if lay.pp <= 1:
        return f"vpp ({lay.vpp}) > 1 needs pp > 1, got pp {lay.pp}"
    step = lay.micro_batch_size * lay.dp
    nmb = w.global_batch_size // step if step else 0
    return (
        f"the interleaved schedule (vpp {lay.vpp}) needs the number of microbatches "
        f"M = global_batch_size/(micro_batch_size*dp) = "
        f"{w.global_batch_size}/({lay.micro_batch_size}*{lay.dp}) = {nmb} to be >= pp ({lay.pp}) and a multiple of pp"
    )


@rule("interleaved_schedule", ("vpp", "pp", "world_size", "tp", "cp", "micro_batch_size"), explain=_interleaved_x)
def _interleaved(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """vpp > 1 needs pp > 1 (arguments.py validate_args; parallel_state.initialize_model_parallel) and
    num_microbatches M >= pp with M % pp == 0 for the default microbatch group of pp
    (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving)."""
    vpp, pp = t["vpp"], t["pp"]
    step = t["micro_batch_size"] * _dp(t)
    defined = (step > 0) & (w.global_batch_size % np.maximum(step, 1) == 0)
    nmb = w.global_batch_size // np.maximum(step, 1)
    sched_ok = ~defined | ((nmb >= pp) & (nmb % pp == 0))
    return _b((vpp == 1) | ((pp > 1) & sched_ok))


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
            parts.append(f"block recompute of {n} layers per chunk exceeds the largest chunk ({max(chunks)} layers); "
                         f"accepted: 1..{max(chunks)}")
        if method == "uniform":
            bad = sorted({x for x in chunks if x and x % n})
            if bad:
                parts.append(
                    f"uniform recompute in groups of {n} layers needs every chunk's layer count to be a multiple "
                    f"of {n}, but chunks hold {bad} layers (megatron-core 0.16 indexes past the chunk)")
    return "; ".join(parts) or "full recompute settings are valid"


@rule("recompute_full", ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules", "pp",
                         "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
      explain=_recompute_full_x)
def _recompute_full(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """full recompute: method uniform|block and recompute_num_layers >= 1 (transformer_config.py
    TransformerConfig.__post_init__); MTP needs uniform 1 (multi_token_prediction.py
    MultiTokenPredictionLayer._checkpointed_forward); uniform groups must tile every chunk (core 0.16
    transformer_block.py TransformerBlock._checkpointed_forward indexes past the chunk); block <= largest chunk
    (tuner policy: more is the same as all)."""
    full = t.isin("recompute_granularity", "full")
    if not full.any():
        return np.ones(len(t), dtype=np.bool_)
    uniform, block, n = t.isin("recompute_method", "uniform"), t.isin("recompute_method",
                                                                      "block"), t["recompute_num_layers"]
    ok = (uniform | block) & (n >= 1) & t.isin("recompute_modules", "")
    if m.mtp_num_layers > 0:
        ok &= ~uniform | (n == 1)
    sub = np.flatnonzero(full)
    stats = _split_stats(t, m, sub)
    n_sub = n[sub]
    safe_n = np.maximum(n_sub, 1)
    chunk_ok = ~stats.feasible | ((~block[sub] | (n_sub <= stats.max_chunk))
                                  & (~uniform[sub] | (stats.chunk_gcd % safe_n == 0)))
    ok_sub = ok[sub] & chunk_ok
    out = np.ones(len(t), dtype=np.bool_)
    out[sub] = ok_sub
    return out


def _recompute_selective_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    parts: list[str] = []
    if lay.recompute_method.value != "none":
        parts.append(f"selective recompute takes no recompute_method, got {lay.recompute_method.value}")
    if lay.recompute_num_layers:
        parts.append(f"selective recompute needs recompute_num_layers unset (0), got {lay.recompute_num_layers}")
    if not lay.recompute_modules:
        parts.append("selective recompute needs at least one of recompute_modules (e.g. core_attn)")
    return "; ".join(parts) or "selective recompute settings are valid"


@rule("recompute_selective", ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
      explain=_recompute_selective_x)
def _recompute_selective(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """selective recompute: no recompute_method (arguments.py validate_args), recompute_num_layers None
    (transformer_config.py TransformerConfig.__post_init__), at least one module."""
    sel = t.isin("recompute_granularity", "selective")
    ok = t.isin("recompute_method", "none") & (t["recompute_num_layers"] == 0) & ~t.isin("recompute_modules", "")
    return _b(~sel | ok)


def _recompute_none_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (
        f"recompute_granularity is none, so recompute_method ({lay.recompute_method.value}), recompute_num_layers "
        f"({lay.recompute_num_layers}) and recompute_modules ({','.join(lay.recompute_modules) or 'empty'}) must be "
        "unset (none, 0, empty)"
    )


@rule("recompute_none", ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
      explain=_recompute_none_x)
def _recompute_none(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """no recompute: method, num_layers and modules unset (tuner policy: one form per setting)."""
    none = t.isin("recompute_granularity", "none")
    ok = t.isin("recompute_method", "none") & (t["recompute_num_layers"] == 0) & t.isin("recompute_modules", "")
    return _b(~none | ok)


def _recompute_modules_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    allowed = applicable_recompute_modules(m)
    bad = [x for x in lay.recompute_modules if x not in allowed]
    return (f"recompute_modules {bad} have nothing to recompute in model {m.name!r} (moe_act/moe need MoE layers, "
            f"mlp dense layers, shared_experts a shared expert, mla_up_proj MLA); accepted for this model: "
            f"{', '.join(allowed)}")


@rule("recompute_modules_model", ("recompute_modules",), explain=_recompute_modules_x)
def _recompute_modules(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """moe_act/moe need MoE layers, mlp dense layers, shared_experts a shared expert, mla_up_proj MLA
    (transformer_config.py TransformerConfig.__post_init__ raises for mla_up_proj without MLA and moe_act without
    grouped GEMM, which the tuner always uses for MoE)."""
    allowed = set(applicable_recompute_modules(m))
    return t.where("recompute_modules", lambda s: all(x in allowed for x in s.split(",") if x))


def _offload_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"optimizer_offload_fraction {lay.optimizer_offload_fraction:g} > 0 (--optimizer-cpu-offload) needs "
            "use_precision_aware_optimizer; set it, or use offload fraction 0")


@rule("offload_needs_precision_aware", ("optimizer_offload_fraction", "use_precision_aware_optimizer"),
      explain=_offload_x)
def _offload(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """--optimizer-cpu-offload needs --use-precision-aware-optimizer (megatron/training/arguments.py validate_args)."""
    return _b((t["optimizer_offload_fraction"] <= 0) | t["use_precision_aware_optimizer"])


def _pa_distopt_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return "use_precision_aware_optimizer needs use_distributed_optimizer (it is off); turn it on"


@rule("precision_aware_needs_distopt", ("use_precision_aware_optimizer", "use_distributed_optimizer"),
      explain=_pa_distopt_x)
def _pa_distopt(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """--use-precision-aware-optimizer needs the distributed optimizer (megatron/core/optimizer/optimizer_config.py
    OptimizerConfig.__post_init__)."""
    return _b(~t["use_precision_aware_optimizer"] | t["use_distributed_optimizer"])


def _dtypes_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    return (f"exp_avg_dtype ({lay.exp_avg_dtype}) and exp_avg_sq_dtype ({lay.exp_avg_sq_dtype}) other than fp32 need "
            "use_precision_aware_optimizer; accepted without it: fp32")


@rule("optimizer_dtypes", ("exp_avg_dtype", "exp_avg_sq_dtype", "use_precision_aware_optimizer"), explain=_dtypes_x)
def _dtypes(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """exp_avg/exp_avg_sq dtypes other than fp32 need the precision-aware optimizer (optimizer_config.py
    OptimizerConfig.__post_init__)."""
    fp32 = t.isin("exp_avg_dtype", "fp32") & t.isin("exp_avg_sq_dtype", "fp32")
    return _b(fp32 | t["use_precision_aware_optimizer"])


def _dispatcher_x(lay: Layout, m: ModelSpec, w: Workload) -> str:
    if not m.is_moe:
        return (f"model {m.name!r} is dense: it has no token dispatcher, so dispatcher must be alltoall "
                f"(got {lay.dispatcher.value})")
    return (f"the flex dispatcher ({lay.dispatcher.value}) needs etp*ep > 1, got etp {lay.etp} * ep {lay.ep} = "
            f"{lay.etp * lay.ep}; use alltoall or allgather, or ep > 1")


@rule("dispatcher", ("dispatcher", "etp", "ep"), explain=_dispatcher_x)
def _dispatcher(t: LayoutTable, m: ModelSpec, w: Workload) -> BoolArray:
    """flex dispatcher needs etp*ep > 1 (megatron/core/transformer/moe/token_dispatcher.py
    MoEFlexTokenDispatcher.__init__, 'Flex token dispatcher requires TPxEP > 1', where TP is the expert TP); a dense
    model has no dispatcher: alltoall only (tuner policy)."""
    if not m.is_moe:
        return t.isin("dispatcher", Dispatcher.alltoall.value)
    flex = enum_mask(t, "dispatcher", Dispatcher, lambda x: x.is_flex)
    return _b(~flex | (t["etp"] * t["ep"] > 1))


#: The first megatron-core release with ``moe_flex_dispatcher_backend`` (``--moe-flex-dispatcher-backend
#: deepep|hybridep``, the flags this tool writes for a flex dispatcher): absent from core_v0.15.0 .. core_v0.15.3, which
#: have only ``--moe-enable-deepep``; in core_v0.16.0 transformer/moe/token_dispatcher.py and moe/README.md.
FLEX_BACKEND_SINCE = (0, 16)


def _dispatcher_release_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    return (f"the flex dispatcher ({lay.dispatcher.value}) is written as --moe-flex-dispatcher-backend, which "
            "megatron-core "
            f"{env.version_label} does not have (it arrived in 0.16; --megatron-core); use alltoall or allgather, or a "
            "newer release")


@rule("dispatcher_release", ("dispatcher",), explain=_dispatcher_release_x)
def _dispatcher_release(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """a flex dispatcher (its ``--moe-flex-dispatcher-backend``) needs megatron-core 0.16 or later
    (:data:`FLEX_BACKEND_SINCE`, ``--megatron-core``; core <= 0.15 has only ``--moe-enable-deepep``;
    megatron/core/transformer/moe/token_dispatcher.py)."""
    if env.megatron_core >= FLEX_BACKEND_SINCE or not m.is_moe:
        return _b(np.ones(len(t), dtype=bool))
    return _b(~enum_mask(t, "dispatcher", Dispatcher, lambda x: x.is_flex))


def _dispatcher_fabric_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    net = env.network
    assert net is not None, "only a check with a network fails"
    on = net.dispatcher(lay.dispatcher)
    return (
        f"the {lay.dispatcher.value} dispatcher does not run across {net.name} ({net.key}): its EP group of etp "
        f"{lay.etp} x "
        f"ep {lay.ep} = {lay.etp * lay.ep} GPUs leaves the NVLink domain of {env.nvlink_size} ({on.source}); use ep x "
        f"etp <= {env.nvlink_size}, or a dispatcher that runs there "
        f"({', '.join(d.value for d in Dispatcher if net.dispatcher(d).runs_across)})"
    )


@rule("dispatcher_fabric", ("dispatcher", "etp", "ep"), explain=_dispatcher_fabric_x)
def _dispatcher_fabric(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """a flex backend (megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher) whose inter-node
    kernels do not run on the cluster's fabric (``runs: false`` in ``specs/data/networks.yaml``) cannot have an EP
    group (``etp x ep`` consecutive ranks) that leaves the NVLink domain: on AWS EFA DeepEP's inter-node kernels
    need NVSHMEM IBGDA, which EFA lacks (deepseek-ai/DeepEP issue 369), and HybridEP traps without an mlx5 NIC
    (NVIDIA-NeMo/Megatron-Bridge issue 3343). Inside one NVLink domain their NVLink kernels need no NIC. No network
    named: not checked."""
    net = env.network
    if net is None or not m.is_moe or not net.not_across:
        return np.ones(len(t), dtype=np.bool_)
    bad = enum_mask(t, "dispatcher", Dispatcher, lambda d: not net.dispatcher(d).runs_across)
    crosses = t["etp"] * t["ep"] > max(env.nvlink_size, 1)
    return _b(~(bad & crosses))


def _cp_attention_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    what = " and ".join(x for x in ((f"softmax_type {m.softmax_type}" if m.softmax_type != "vanilla" else ""),
                                     ("sliding-window attention" if m.num_window_layers else "")) if x)
    return (f"cp {lay.cp} with {what} ({m.name}) needs Megatron's --cp-comm-type a2a in Transformer Engine, and the "
            f"run uses {env.cp_comm_type} (the commands this tool writes keep Megatron's default, p2p); use cp 1")


@rule("cp_attention_variant", ("cp",), explain=_cp_attention_x)
def _cp_attention(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """with context parallelism, Transformer Engine runs attention sinks (``softmax_type`` not vanilla) only with
    ``--cp-comm-type a2a`` (transformer_engine/pytorch/attention/dot_product_attention/utils.py,
    ``get_attention_backend``: FusedAttention is disabled for CP with another cp_comm_type and no other backend takes a
    non-vanilla softmax under CP) and sliding-window attention only with ``a2a`` or ``all_gather`` (context_parallel.py,
    "Context parallelism does not support sliding window attention"); this tool models ``p2p`` and ``a2a``."""
    if env.cp_comm_type == "a2a" or not (m.softmax_type != "vanilla" or m.num_window_layers):
        return np.ones(len(t), dtype=np.bool_)
    return _b(t["cp"] == 1)


def _cpu_offloading_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    n = env.cpu_offloading_num_layers
    if n >= m.num_layers:
        return (f"--cpu-offloading-num-layers {n}: activation offloading takes fewer layers than the model's "
                f"{m.num_layers}")
    why = [x for x in ((f"pp {lay.pp}" if lay.pp > 1 else ""),
                       (f"recompute {lay.recompute_label}" if lay.recompute_granularity.value != "none" else "")) if x]
    return (f"--cpu-offloading-num-layers {n} (activation offloading) runs only with pp 1 and no recompute, and this "
            f"layout has {' and '.join(why)}; use pp 1 without recompute, or leave the flag out")


@rule("cpu_offloading", ("pp", "recompute_granularity"), explain=_cpu_offloading_x)
def _cpu_offloading(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """activation offloading (``--cpu-offloading-num-layers N``) needs N below the layer count, no pipeline
    parallelism and no recompute (megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__:
    "CPU offloading can be done only for layers less than", "Currently there is no support for Pipeline parallelism
    with CPU offloading", "CPU offloading does not work when activation recomputation is enabled")."""
    n = env.cpu_offloading_num_layers
    if not n:
        return np.ones(len(t), dtype=np.bool_)
    if n >= m.num_layers:
        return np.zeros(len(t), dtype=np.bool_)
    return _b((t["pp"] == 1) & t.isin("recompute_granularity", "none"))


def layout_warnings(layout: Layout, model: ModelSpec, options: RunOptions) -> list[str]:
    """Things Megatron accepts that are reported to fail, for one layout: with EP all-to-all overlap
    (``overlap_moe_expert_parallel_comm``) an odd number of MoE layers on a pipeline stage (a virtual stage with
    VPP) was reported to hang (NVIDIA/Megatron-LM issue 1810, cited by issue 1852; affected releases unknown).

    Returns: One line per warning (empty when none)."""
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
                    f"EP all-to-all overlap with an odd number of MoE layers on a pipeline stage ({where}) was "
                    "reported to hang "
                    "(NVIDIA/Megatron-LM issue 1810, via issue 1852); prefer a split with an even number per stage")
    return out


