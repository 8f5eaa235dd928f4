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

import numpy as np

from search_spaces import rule_checks as _c
from search_spaces.rule_base import (
    DEFAULT_RULE_ENV,
    MOE_RECOMPUTE_MODULES,
    POLICY_RULES,
    BoolArray,
    Rule,
    RuleEnv,
    applicable_recompute_modules,
)
from search_spaces.rule_checks import FLEX_BACKEND_SINCE as FLEX_BACKEND_SINCE
from search_spaces.rule_checks import TP_ABOVE_QUERY_GROUPS_SINCE as TP_ABOVE_QUERY_GROUPS_SINCE
from search_spaces.rule_checks import layout_warnings
from specs import ModelSpec, Workload
from specs.layout import Layout, LayoutTable

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
        check_fn=_c._world_tp_pp_cp,
        explain_fn=_c._world_tp_pp_cp_x,
    ),
    _R(
        id="world_div_etp_ep_pp",
        description="world_size % (etp*ep*pp) == 0 for the expert grid; edp = world/(etp*ep*pp) "
        "(megatron/core/parallel_state.py initialize_model_parallel, expert RankGenerator)",
        columns=("world_size", "etp", "ep", "pp"),
        check_fn=_c._world_etp_ep_pp,
        explain_fn=_c._world_etp_ep_pp_x,
    ),
    _R(
        id="heads_div_tp",
        description="num_attention_heads % tp == 0 (megatron/core/transformer/transformer_config.py "
        "TransformerConfig.__post_init__)",
        columns=("tp",),
        check_fn=_c._heads_tp,
        explain_fn=_c._heads_tp_x,
    ),
    _R(
        id="query_groups_tp",
        description="num_query_groups % tp == 0, or from megatron-core 0.16 tp % num_query_groups == 0 "
        "(core <= 0.15: multiple only; --megatron-core) (transformer_config.py TransformerConfig.__post_init__)",
        columns=("tp",),
        check_fn=_c._groups_tp,
        explain_fn=_c._groups_tp_x,
        uses_env=True,
    ),
    _R(
        id="ffn_div_tp",
        description="ffn_hidden_size (dense layers) and the shared-expert width % tp == 0 "
        "(megatron/core/tensor_parallel/layers.py ColumnParallelLinear/RowParallelLinear, divide())",
        columns=("tp",),
        check_fn=_c._ffn_tp,
        explain_fn=_c._ffn_tp_x,
    ),
    _R(
        id="experts_div_ep",
        description="num_experts % ep == 0 (megatron/training/arguments.py validate_args; "
        "megatron/core/transformer/moe/moe_layer.py MoELayer.__init__)",
        columns=("ep",),
        check_fn=_c._experts_ep,
        explain_fn=_c._experts_ep_x,
    ),
    _R(
        id="moe_ffn_div_etp",
        description="moe_ffn_hidden_size % etp == 0 (megatron/core/transformer/moe/experts.py TEGroupedMLP, "
        "tensor_parallel/layers.py divide())",
        columns=("etp",),
        check_fn=_c._moe_ffn_etp,
        explain_fn=_c._moe_ffn_etp_x,
    ),
    _R(
        id="dense_no_expert_parallel",
        description="a dense model needs ep == 1 and etp == 1 (arguments.py validate_args: EP > 1 needs "
        "--num-experts; etp is meaningless without experts, tuner policy)",
        columns=("ep", "etp"),
        check_fn=_c._dense_ep,
        explain_fn=_c._dense_ep_x,
    ),
    _R(
        id="seq_div_2cp",
        description="cp > 1: seq_length % (2*cp) == 0 (megatron/training/arguments.py validate_args)",
        columns=("cp",),
        check_fn=_c._seq_cp,
        explain_fn=_c._seq_cp_x,
    ),
    _R(
        id="sequence_parallel",
        description="sequence_parallel needs tp > 1 (megatron/core/model_parallel_config.py "
        "ModelParallelConfig.__post_init__ raises); tuner policy: sequence_parallel whenever tp > 1 "
        "(core >= 0.15 only warns for ep > 1 and tp > 1 without it, core <= 0.14 raises)",
        columns=("tp", "sequence_parallel"),
        check_fn=_c._sp_policy,
        explain_fn=_c._sp_policy_x,
    ),
    _R(
        id="sp_seq_div_tp",
        description="sequence parallel: (seq_length/cp) % tp == 0 (megatron/core/tensor_parallel/mappings.py "
        "_split_along_first_dim)",
        columns=("tp", "cp", "sequence_parallel"),
        check_fn=_c._sp_seq,
        explain_fn=_c._sp_seq_x,
    ),
    _R(
        id="batch_div_mbs_dp",
        description="global_batch_size % (micro_batch_size*dp) == 0 (megatron/core/num_microbatches_calculator.py "
        "ConstantNumMicroBatchesCalculator.__init__)",
        columns=("world_size", "tp", "pp", "cp", "micro_batch_size"),
        check_fn=_c._batch,
        explain_fn=_c._batch_x,
    ),
    _R(
        id="pipeline_split",
        description="the decoder layers split over pp ranks and vpp chunks as first/last ask (search_spaces.pipeline."
        "stage_layer_counts; megatron/core/transformer/pipeline_parallel_layer_layout.py validate_layer_layout)",
        columns=("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
        check_fn=_c._split,
        explain_fn=_c._split_x,
    ),
    _R(
        id="pipeline_split_canonical",
        description="tuner policy: an uneven first/last that gives the even split's chunks is a duplicate "
        "(Megatron accepts it)",
        columns=("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
        check_fn=_c._split_canonical,
        explain_fn=_c._split_canonical_x,
    ),
    _R(
        id="interleaved_schedule",
        description="vpp > 1 needs pp > 1 (arguments.py validate_args; parallel_state.initialize_model_parallel) and "
        "num_microbatches M >= pp with M % pp == 0 for the default microbatch group of pp "
        "(megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving)",
        columns=("vpp", "pp", "world_size", "tp", "cp", "micro_batch_size"),
        check_fn=_c._interleaved,
        explain_fn=_c._interleaved_x,
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
        check_fn=_c._recompute_full,
        explain_fn=_c._recompute_full_x,
    ),
    _R(
        id="recompute_selective",
        description="selective recompute: no recompute_method (arguments.py validate_args), recompute_num_layers "
        "None (transformer_config.py TransformerConfig.__post_init__), at least one module",
        columns=("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
        check_fn=_c._recompute_selective,
        explain_fn=_c._recompute_selective_x,
    ),
    _R(
        id="recompute_none",
        description="no recompute: method, num_layers and modules unset (tuner policy: one form per setting)",
        columns=("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
        check_fn=_c._recompute_none,
        explain_fn=_c._recompute_none_x,
    ),
    _R(
        id="recompute_modules_model",
        description="moe_act/moe need MoE layers, mlp dense layers, shared_experts a shared expert, mla_up_proj MLA "
        "(transformer_config.py TransformerConfig.__post_init__ raises for mla_up_proj without MLA and "
        "moe_act without grouped GEMM, which the tuner always uses for MoE)",
        columns=("recompute_modules",),
        check_fn=_c._recompute_modules,
        explain_fn=_c._recompute_modules_x,
    ),
    _R(
        id="offload_needs_precision_aware",
        description="--optimizer-cpu-offload needs --use-precision-aware-optimizer "
        "(megatron/training/arguments.py validate_args)",
        columns=("optimizer_offload_fraction", "use_precision_aware_optimizer"),
        check_fn=_c._offload,
        explain_fn=_c._offload_x,
    ),
    _R(
        id="precision_aware_needs_distopt",
        description="--use-precision-aware-optimizer needs the distributed optimizer "
        "(megatron/core/optimizer/optimizer_config.py OptimizerConfig.__post_init__)",
        columns=("use_precision_aware_optimizer", "use_distributed_optimizer"),
        check_fn=_c._pa_distopt,
        explain_fn=_c._pa_distopt_x,
    ),
    _R(
        id="optimizer_dtypes",
        description="exp_avg/exp_avg_sq dtypes other than fp32 need the precision-aware optimizer "
        "(optimizer_config.py OptimizerConfig.__post_init__)",
        columns=("exp_avg_dtype", "exp_avg_sq_dtype", "use_precision_aware_optimizer"),
        check_fn=_c._dtypes,
        explain_fn=_c._dtypes_x,
    ),
    _R(
        id="dispatcher",
        description="flex dispatcher needs etp*ep > 1 (megatron/core/transformer/moe/token_dispatcher.py "
        "MoEFlexTokenDispatcher.__init__, 'Flex token dispatcher requires TPxEP > 1', where TP is the expert TP); "
        "a dense model has no dispatcher: alltoall only (tuner policy)",
        columns=("dispatcher", "etp", "ep"),
        check_fn=_c._dispatcher,
        explain_fn=_c._dispatcher_x,
    ),
    _R(
        id="dispatcher_release",
        description="a flex dispatcher needs megatron-core >= 0.16 (--moe-flex-dispatcher-backend; core <= 0.15 has only "
        "--moe-enable-deepep) (--megatron-core; megatron/core/transformer/moe/token_dispatcher.py)",
        columns=("dispatcher",),
        check_fn=_c._dispatcher_release,
        explain_fn=_c._dispatcher_release_x,
        uses_env=True,
    ),
    _R(
        id="dispatcher_fabric",
        description="a flex backend (megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher) whose "
        "inter-node kernels do not run on the cluster's fabric (specs/data/networks.yaml) stays inside one NVLink domain: "
        "etp*ep <= NVLink domain (AWS EFA: deepseek-ai/DeepEP issue 369, NVIDIA-NeMo/Megatron-Bridge issue 3343)",
        columns=("dispatcher", "etp", "ep"),
        check_fn=_c._dispatcher_fabric,
        explain_fn=_c._dispatcher_fabric_x,
        uses_env=True,
    ),
    _R(
        id="cp_attention_variant",
        description="context parallelism with attention sinks or sliding windows (GPT-OSS) needs --cp-comm-type a2a: "
        "Transformer Engine's attention/dot_product_attention/utils.py get_attention_backend and context_parallel.py",
        columns=("cp",),
        check_fn=_c._cp_attention,
        explain_fn=_c._cp_attention_x,
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
