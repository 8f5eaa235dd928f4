"""Megatron validity rules (search_spaces/rules.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from search_spaces.rules import (
    RULE_IDS,
    RULES,
    RuleEnv,
    check_layout,
    check_table,
    layout_warnings,
    run_option_problems,
)
from specs import ModelSpec, RunOptions, Workload, load_model, load_network
from specs.layout import Layout, LayoutTable

WORKLOAD = Workload(seq_length=8192, global_batch_size=128)


@pytest.fixture(scope="module")
def minimax() -> ModelSpec:
    return load_model("MiniMax-M2")


@pytest.fixture(scope="module")
def llama8b() -> ModelSpec:
    return load_model("Llama-3.1-8B")


def seed_layout(**changes: Any) -> Layout:
    """The seed recipe: TP1 PP8 VPP4 EP8 ETP1 DP8, mbs 1, full uniform 1, first/last 7, alltoall, 64 GPUs."""
    base = Layout(
        world_size=64, tp=1, pp=8, vpp=4, cp=1, ep=8, etp=1, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, num_layers_in_first_pipeline_stage=7,
        num_layers_in_last_pipeline_stage=7, dispatcher="alltoall", use_distributed_optimizer=True,
        use_precision_aware_optimizer=True,
    )
    return base.replace(**changes)


def slime_reference_layout() -> Layout:
    """slime's MiniMax-M2 layout ported to 64 GPUs: TP2 SP PP2 EP8 ETP1, full uniform 1, CPU Adam (1.0)."""
    return Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=2, ep=8, etp=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, optimizer_offload_fraction=1.0,
        overlap_cpu_optimizer_d2h_h2d=True, use_precision_aware_optimizer=True, use_distributed_optimizer=True,
    )


def test_rules_have_ids_and_sources() -> None:
    assert len(RULE_IDS) == len(set(RULE_IDS)) == len(RULES)
    for rule in RULES:
        assert rule.description and (".py" in rule.description or "policy" in rule.description), rule.id
        assert rule.columns or "every layout fails alike" in rule.description, rule.id  # a run option's rule


def test_seed_layout_is_valid(minimax: ModelSpec) -> None:
    lay = seed_layout()
    assert lay.label == "TP1 PP8 VPP4 EP8 DP8"
    assert check_layout(lay, minimax, WORKLOAD) == []


def test_slime_reference_layout_is_valid(minimax: ModelSpec) -> None:
    assert check_layout(slime_reference_layout(), minimax, WORKLOAD) == []


# rule id -> (layout, model name or changes to MiniMax-M2, workload, substrings of the reason)
BAD: dict[str, tuple[Layout, str | dict[str, Any], Workload, tuple[str, ...]]] = {
    "world_div_tp_pp_cp": (seed_layout(cp=16), {}, WORKLOAD, ("world_size (64)", "1*8*16 = 128")),
    "world_div_etp_ep_pp": (seed_layout(ep=16), {}, WORKLOAD, ("world_size (64)", "1*16*8 = 128")),
    "heads_div_tp": (
        seed_layout(tp=32, pp=1, vpp=1, sequence_parallel=True),
        {},
        WORKLOAD,
        ("num_attention_heads (48)", "tp (32)"),
    ),
    "query_groups_tp": (
        seed_layout(tp=4, sequence_parallel=True),
        {"num_query_groups": 6},
        WORKLOAD,
        ("num_query_groups (6)", "tp (4)", ">= 0.16"),
    ),
    "ffn_div_tp": (
        seed_layout(
            tp=32, pp=2, vpp=1, ep=1, sequence_parallel=True, num_layers_in_first_pipeline_stage=0,
            num_layers_in_last_pipeline_stage=0,
        ),
        "Llama-3.1-8B:ffn_hidden_size=14000",
        WORKLOAD,
        ("ffn_hidden_size (14000)", "tp (32)"),
    ),
    "experts_div_ep": (
        seed_layout(ep=64, pp=1, vpp=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0),
        {"num_experts": 96},
        WORKLOAD,
        ("num_experts (96)", "ep (64)"),
    ),
    "moe_ffn_div_etp": (
        seed_layout(etp=16, ep=1),
        {"moe_ffn_hidden_size": 1000},
        WORKLOAD,
        ("moe_ffn_hidden_size (1000)", "etp (16)"),
    ),
    "dense_no_expert_parallel": (
        seed_layout(pp=2, vpp=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0),
        "Llama-3.1-8B",
        WORKLOAD,
        ("ep (8)", "etp (1)", "dense", "needs a MoE model"),
    ),
    "seq_div_2cp": (
        seed_layout(cp=2, ep=4),
        {},
        Workload(seq_length=8190, global_batch_size=128),
        ("seq_length (8190)", "2*cp = 4"),
    ),
    "sequence_parallel": (
        seed_layout(tp=2, sequence_parallel=False, ep=4),
        {},
        WORKLOAD,
        ("tp is 2", "sequence_parallel is off"),
    ),
    "sp_seq_div_tp": (
        seed_layout(
            tp=8, cp=2, sequence_parallel=True, pp=1, vpp=1, num_layers_in_first_pipeline_stage=0,
            num_layers_in_last_pipeline_stage=0,
        ),
        {},
        Workload(seq_length=8200, global_batch_size=128),
        ("8200/2", "4100", "tp (8)"),
    ),
    "batch_div_mbs_dp": (seed_layout(micro_batch_size=3), {}, WORKLOAD, ("global_batch_size (128)", "3*8 = 24")),
    "pipeline_split": (
        seed_layout(num_layers_in_first_pipeline_stage=5),
        {},
        WORKLOAD,
        ("first (5)", "last (7)", "50 layers"),
    ),
    "pipeline_split_canonical": (
        seed_layout(pp=2, vpp=1, num_layers_in_first_pipeline_stage=31, num_layers_in_last_pipeline_stage=31),
        {},
        WORKLOAD,
        ("first (31)", "last (31)", "[[31], [31]]"),
    ),
    "interleaved_schedule": (
        seed_layout(),
        {},
        Workload(seq_length=8192, global_batch_size=120),
        ("M = global_batch_size/(micro_batch_size*dp) = 120/(1*8) = 15", "pp (8)"),
    ),
    "recompute_full": (
        seed_layout(recompute_method="block", recompute_num_layers=3),
        {},
        WORKLOAD,
        ("block recompute of 3 layers", "largest chunk (2 layers)"),
    ),
    "recompute_selective": (
        seed_layout(
            recompute_granularity="selective", recompute_method="none", recompute_num_layers=1,
            recompute_modules=("core_attn",),
        ),
        {},
        WORKLOAD,
        ("recompute_num_layers unset (0), got 1",),
    ),
    "recompute_none": (
        seed_layout(recompute_granularity="none"),
        {},
        WORKLOAD,
        ("recompute_method (uniform)", "recompute_num_layers (1)"),
    ),
    "recompute_modules_model": (
        seed_layout(
            pp=2, vpp=1, ep=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0,
            recompute_granularity="selective", recompute_method="none", recompute_num_layers=0,
            recompute_modules=("core_attn", "moe"),
        ),
        "Llama-3.1-8B",
        WORKLOAD,
        ("['moe']", "Llama-3.1-8B", "core_attn, layernorm, mlp"),
    ),
    "offload_needs_precision_aware": (
        seed_layout(optimizer_offload_fraction=0.5, use_precision_aware_optimizer=False),
        {},
        WORKLOAD,
        ("optimizer_offload_fraction 0.5", "use_precision_aware_optimizer"),
    ),
    "precision_aware_needs_distopt": (
        seed_layout(use_distributed_optimizer=False),
        {},
        WORKLOAD,
        ("use_distributed_optimizer (it is off)",),
    ),
    "optimizer_dtypes": (
        seed_layout(exp_avg_dtype="bf16", use_precision_aware_optimizer=False),
        {},
        WORKLOAD,
        ("exp_avg_dtype (bf16)", "exp_avg_sq_dtype (fp32)"),
    ),
    "dispatcher": (seed_layout(ep=1, dispatcher="flex+deepep"), {}, WORKLOAD, ("flex+deepep", "etp 1 * ep 1 = 1")),
    "dispatcher_fabric": (
        seed_layout(ep=16, dispatcher="flex+deepep"),
        {},
        WORKLOAD,
        ("flex+deepep", "AWS EFA v3", "etp 1 x ep 16 = 16", "issue 369"),
    ),
    "dispatcher_release": (
        seed_layout(dispatcher="flex+hybridep"),
        {},
        WORKLOAD,
        ("flex+hybridep", "megatron-core 0.15", "arrived in 0.16"),
        RuleEnv(megatron_core=(0, 15)),
    ),
    "cp_attention_variant": (
        seed_layout(cp=2, pp=1, vpp=1),
        {"softmax_type": "learnable"},
        WORKLOAD,
        ("cp 2 with softmax_type learnable", "--cp-comm-type a2a", "use cp 1"),
    ),
    "cpu_offloading": (
        seed_layout(),
        {},
        WORKLOAD,
        ("--cpu-offloading-num-layers 2", "pp 8", "recompute full uniform 1"),
        RuleEnv(cpu_offloading_num_layers=2),
    ),
    "cuda_graphs": (
        seed_layout(),
        {},
        WORKLOAD,
        ("--cuda-graph-impl local", "recompute full uniform 1", "full_iteration"),
        RuleEnv(cuda_graph_impl="local"),
    ),
    "cuda_graph_scope": (
        seed_layout(),
        {},
        WORKLOAD,
        ("must not contain both moe and moe_router",),
        RuleEnv.of(None, RunOptions(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe", "moe_router"))),
    ),
    "cuda_graph_release": (
        seed_layout(),
        {},
        WORKLOAD,
        ("megatron-core 0.16", "arrived in 0.18", "--cuda-graph-impl local --cuda-graph-scope full_iteration"),
        RuleEnv.of(None, RunOptions(cuda_graph_impl="full_iteration", megatron_core="0.16")),
    ),
    "ep_overlap": (
        seed_layout(),
        {},
        WORKLOAD,
        ("--overlap-moe-expert-parallel-comm", "recompute full uniform 1 (no full recompute)"),
        RuleEnv.of(None, RunOptions(overlap_moe_expert_parallel_comm=True)),
    ),
    "ep_overlap_options": (
        seed_layout(ep=1),
        "Llama-3.1-8B",
        WORKLOAD,
        ("Llama-3.1-8B is dense",),
        RuleEnv.of(None, RunOptions(overlap_moe_expert_parallel_comm=True)),
    ),
    "dist_muon_options": (
        seed_layout(),
        {},
        WORKLOAD,
        ("megatron-core 0.15 has no --optimizer dist_muon",),
        RuleEnv.of(None, RunOptions(optimizer="dist_muon", megatron_core="0.15")),
    ),
    "dist_muon": (
        seed_layout(),
        {},
        WORKLOAD,
        ("--optimizer dist_muon", "precision-aware optimizer"),
        RuleEnv.of(None, RunOptions(optimizer="dist_muon")),
    ),
    "fp8_param_gather_offload": (
        seed_layout(optimizer_offload_fraction=1.0),
        {},
        Workload(seq_length=8192, global_batch_size=128, precision="fp8"),
        ("--fp8-param-gather needs --fp8-recipe delayed", "tensorwise"),
        RuleEnv.of(None, RunOptions(fp8_param_gather=True, fp8_recipe="tensorwise")),
    ),
}

#: The seed layout with no recompute: what the run-option rules below accept unless they say otherwise.
_NO_RECOMPUTE = dict(recompute_granularity="none", recompute_method="none", recompute_num_layers=0)
#: The seed layout on one pipeline stage, no recompute.
_ONE_STAGE = dict(_NO_RECOMPUTE, pp=1, vpp=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0)
#: A dense layout for Llama-3.1-8B (key ``model``: see RUN_OPTION_CASES).
_DENSE = dict(_NO_RECOMPUTE, model="Llama-3.1-8B", pp=2, vpp=1, ep=1, num_layers_in_first_pipeline_stage=0,
              num_layers_in_last_pipeline_stage=0)
_MTP1 = dict(_ONE_STAGE, model={"mtp_num_layers": 1})
_SELECTIVE = dict(_NO_RECOMPUTE, recompute_granularity="selective", recompute_modules=("moe_act",))
_TE_ATTN = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",)}
_FULL_ITER_LOCAL = {"cuda_graph_impl": "local", "cuda_graph_scope": ("full_iteration",)}
_OVERLAP = {"overlap_moe_expert_parallel_comm": True}
#: (layout changes, run options, workload precision, the run-option rules it breaks), megatron-core as given, on
#: MiniMax-M2 unless the layout changes hold ``model``: a model name or changes to MiniMax-M2.
RUN_OPTION_CASES: list[tuple[dict[str, Any], dict[str, Any], str, set[str]]] = [
    # --overlap-moe-expert-parallel-comm (transformer_config.py l.1878-1932 at 1dcf0da, l.3002-3071 at d98e8a64)
    (_NO_RECOMPUTE, {"overlap_moe_expert_parallel_comm": True}, "bf16", set()),
    ({}, {"overlap_moe_expert_parallel_comm": True}, "bf16", {"ep_overlap"}),
    ({**_NO_RECOMPUTE, "vpp": 1}, {"overlap_moe_expert_parallel_comm": True}, "bf16", {"ep_overlap"}),
    ({**_NO_RECOMPUTE, "ep": 1}, {"overlap_moe_expert_parallel_comm": True}, "bf16", {"ep_overlap"}),
    ({**_NO_RECOMPUTE, "dispatcher": "allgather"}, {"overlap_moe_expert_parallel_comm": True}, "bf16",
     {"ep_overlap"}),
    ({**_NO_RECOMPUTE, "dispatcher": "flex+deepep"}, {"overlap_moe_expert_parallel_comm": True}, "bf16", set()),
    ({**_NO_RECOMPUTE, "recompute_granularity": "selective", "recompute_modules": ("moe",)},
     {"overlap_moe_expert_parallel_comm": True}, "bf16", {"ep_overlap"}),
    ({**_NO_RECOMPUTE, "recompute_granularity": "selective", "recompute_modules": ("moe",)},
     {"overlap_moe_expert_parallel_comm": True, "megatron_core": "0.16"}, "bf16", set()),
    (_NO_RECOMPUTE, {"overlap_moe_expert_parallel_comm": True, "cuda_graph_impl": "local",
                     "megatron_core": "0.16"}, "bf16", {"ep_overlap_options"}),
    (_NO_RECOMPUTE, {"overlap_moe_expert_parallel_comm": True, "cuda_graph_impl": "local"}, "bf16", set()),
    (_NO_RECOMPUTE, {**_OVERLAP, "cuda_graph_impl": "local", "megatron_core": "0.17"}, "bf16", {"ep_overlap_options"}),
    # core 0.15 checks no CUDA graph in the overlap block (core_v0.15.0 l.1441-1480)
    (_NO_RECOMPUTE, {**_OVERLAP, "cuda_graph_impl": "local", "megatron_core": "0.15"}, "bf16", set()),
    # the flag arrived in core 0.14 (core_v0.14.0 arguments.py l.2889)
    (_NO_RECOMPUTE, {**_OVERLAP, "megatron_core": "0.13"}, "bf16", {"ep_overlap_options"}),
    (_NO_RECOMPUTE, {**_OVERLAP, "megatron_core": "0.14"}, "bf16", set()),
    # an MTP layer needs pp > 1 in core 0.16 and 0.17 only (core_v0.16.0 l.1892-1896, core_v0.17.0 l.2124-2128)
    (_MTP1, {**_OVERLAP, "megatron_core": "0.14"}, "bf16", set()),
    (_MTP1, {**_OVERLAP, "megatron_core": "0.15"}, "bf16", set()),
    (_MTP1, {**_OVERLAP, "megatron_core": "0.16"}, "bf16", {"ep_overlap"}),
    (_MTP1, {**_OVERLAP, "megatron_core": "0.17"}, "bf16", {"ep_overlap"}),
    (_MTP1, {**_OVERLAP, "megatron_core": "0.18"}, "bf16", set()),
    (_NO_RECOMPUTE, {"overlap_moe_expert_parallel_comm": True, "cuda_graph_impl": "transformer_engine",
                     "cuda_graph_scope": ("attn", "moe")}, "bf16", {"ep_overlap_options", "cuda_graph_scope"}),
    # CUDA graphs (transformer_config.py l.1742-1821 at 1dcf0da, l.2798-2869 at d98e8a64)
    ({**_NO_RECOMPUTE, "recompute_granularity": "selective", "recompute_modules": ("moe",)},
     {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn", "moe_router", "moe_preprocess")}, "bf16",
     {"cuda_graphs"}),
    ({**_NO_RECOMPUTE, "recompute_granularity": "selective", "recompute_modules": ("core_attn", "moe_act")},
     {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn", "moe_router", "moe_preprocess")}, "bf16",
     set()),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe",)}, "bf16",
     {"cuda_graph_scope"}),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe_preprocess",)}, "bf16",
     {"cuda_graph_scope"}),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("full_iteration",)}, "bf16",
     {"cuda_graph_scope"}),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "local", "cuda_graph_scope": ("full_iteration",), "megatron_core": "0.16"},
     "bf16", set()),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "full_iteration", "megatron_core": "0.17"}, "bf16", {"cuda_graph_release"}),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "full_iteration", "megatron_core": "0.18"}, "bf16", set()),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",), "megatron_core": "0.15"},
     "bf16", set()),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn", "moe_router"),
                     "megatron_core": "0.15"}, "bf16", {"cuda_graph_release"}),
    (_NO_RECOMPUTE, {"cuda_graph_impl": "local", "megatron_core": "0.14"}, "bf16", {"cuda_graph_release"}),
    # local adds moe_router to moe_preprocess, for MoE only (1dcf0da l.1751-1781)
    (_DENSE, {"cuda_graph_impl": "local", "cuda_graph_scope": ("moe_preprocess",)}, "bf16", {"cuda_graph_scope"}),
    (_DENSE, {"cuda_graph_impl": "local", "cuda_graph_scope": ("attn",)}, "bf16", set()),
    # core 0.15: recompute only selective under a transformer_engine attn graph (core_v0.15.0 l.1397-1408)
    ({}, {**_TE_ATTN, "megatron_core": "0.15"}, "bf16", {"cuda_graphs"}),
    (_SELECTIVE, {**_TE_ATTN, "megatron_core": "0.15"}, "bf16", set()),
    ({**_SELECTIVE, "recompute_modules": ("core_attn",)}, {**_TE_ATTN, "megatron_core": "0.15"}, "bf16",
     {"cuda_graphs"}),
    (_SELECTIVE, {"cuda_graph_impl": "transformer_engine", "megatron_core": "0.15"}, "bf16", {"cuda_graphs"}),
    (_SELECTIVE, {"cuda_graph_impl": "local", "cuda_graph_scope": ("attn",), "megatron_core": "0.15"}, "bf16",
     {"cuda_graphs"}),
    ({}, {**_FULL_ITER_LOCAL, "megatron_core": "0.15"}, "bf16", {"cuda_graphs"}),
    ({}, {**_FULL_ITER_LOCAL, "megatron_core": "0.16"}, "bf16", set()),
    # CPU offloading: no CUDA graph before core 0.18, then full_iteration (core_v0.17.0 l.1951, core_v0.18.0 l.2243)
    (_ONE_STAGE, {**_FULL_ITER_LOCAL, "megatron_core": "0.15", "cpu_offloading_num_layers": 2}, "bf16",
     {"cuda_graphs"}),
    (_ONE_STAGE, {**_FULL_ITER_LOCAL, "megatron_core": "0.17", "cpu_offloading_num_layers": 2}, "bf16",
     {"cuda_graphs"}),
    (_ONE_STAGE, {"cuda_graph_impl": "full_iteration", "megatron_core": "0.18", "cpu_offloading_num_layers": 2},
     "bf16", set()),
    # --optimizer dist_muon (optimizer_config.py l.380-383, arguments.py l.1177-1183 at 1dcf0da)
    ({"use_precision_aware_optimizer": False}, {"optimizer": "dist_muon"}, "bf16", set()),
    ({"use_precision_aware_optimizer": False}, {"optimizer": "dist_muon", "megatron_core": "0.17"}, "bf16",
     {"dist_muon"}),
    ({"use_precision_aware_optimizer": False, "use_distributed_optimizer": False},
     {"optimizer": "dist_muon", "megatron_core": "0.17"}, "bf16", set()),
    ({"use_precision_aware_optimizer": False, "use_distributed_optimizer": False},
     {"optimizer": "dist_muon", "megatron_core": "0.16", "overlap_grad_reduce": True}, "bf16", {"dist_muon_options"}),
    ({"use_precision_aware_optimizer": False}, {"optimizer": "dist_muon", "use_megatron_fsdp": True}, "bf16",
     {"dist_muon_options"}),
    # fp8 parameters with optimizer CPU offload (arguments.py l.1194-1197 at 1dcf0da, l.1889-1892 at d98e8a64)
    ({"optimizer_offload_fraction": 0.5}, {"fp8_param_gather": True}, "fp8", set()),
    ({"optimizer_offload_fraction": 0.5}, {"fp8_param_gather": True, "fp8_recipe": "tensorwise"}, "fp8",
     {"fp8_param_gather_offload"}),
    ({"optimizer_offload_fraction": 0.5}, {"fp8_param_gather": True}, "mxfp8", {"fp8_param_gather_offload"}),
    ({}, {"fp8_param_gather": True, "fp8_recipe": "tensorwise"}, "fp8", set()),
]
_RUN_OPTION_RULES = {"cuda_graphs", "cuda_graph_scope", "cuda_graph_release", "ep_overlap", "ep_overlap_options",
                     "dist_muon_options", "dist_muon", "fp8_param_gather_offload"}


@pytest.mark.parametrize(("changes", "options", "precision", "broken"), RUN_OPTION_CASES)
def test_run_option_rules(changes: dict[str, Any], options: dict[str, Any], precision: str, broken: set[str],
                          minimax: ModelSpec) -> None:
    changes = dict(changes)
    model = _model(changes.pop("model", {}), minimax)
    layout = seed_layout(**changes)
    workload = Workload(seq_length=8192, global_batch_size=128, precision=precision)
    env = RuleEnv.of(None, RunOptions(**options))
    got = {r for r, _ in check_layout(layout, model, workload, env)}
    assert got & _RUN_OPTION_RULES == broken
    assert got - _RUN_OPTION_RULES == set()  # the seed layout passes every other rule


def test_run_option_problems_name_only_the_options_rules(minimax: ModelSpec) -> None:
    env = RuleEnv.of(None, RunOptions(overlap_moe_expert_parallel_comm=True, optimizer="dist_muon",
                                      megatron_core="0.15"))
    assert [r for r, _ in run_option_problems(minimax, WORKLOAD, env)] == ["dist_muon_options"]
    assert run_option_problems(minimax, WORKLOAD, RuleEnv.of(None, RunOptions())) == []

#: The environment of the rules that read one (the others ignore it): the seed's cluster, AWS p5en with EFA v3.
EFA_ENV = RuleEnv(network=load_network("efa-v3"), nvlink_size=8)


def _model(spec: str | dict[str, Any], minimax: ModelSpec) -> ModelSpec:
    if isinstance(spec, dict):
        return minimax.replace(**spec)
    name, _, change = spec.partition(":")
    model = load_model(name)
    if change:
        key, val = change.split("=")
        model = model.replace(**{key: int(val)})
    return model


def test_every_rule_has_a_bad_example() -> None:
    assert set(BAD) == set(RULE_IDS)


@pytest.mark.parametrize("rule_id", list(BAD))
def test_rule_rejects_bad_layout(rule_id: str, minimax: ModelSpec) -> None:
    layout, model_spec, workload, needles, *given = BAD[rule_id]
    env = given[0] if given else EFA_ENV  # the release rules name their own (older) megatron-core
    model = _model(model_spec, minimax)
    problems = dict(check_layout(layout, model, workload, env))
    assert rule_id in problems, problems
    for needle in needles:
        assert needle in problems[rule_id], (needle, problems[rule_id])
    # The table check agrees on this row.
    rule = next(r for r in RULES if r.id == rule_id)
    assert not rule.check(LayoutTable.from_layouts([layout]), model, workload, env)[0]


def test_dispatcher_fabric_per_network(minimax: ModelSpec) -> None:
    cross = seed_layout(
        pp=4, vpp=1, ep=16, dispatcher="flex+deepep", num_layers_in_first_pipeline_stage=16,
        num_layers_in_last_pipeline_stage=14,
    )
    assert check_layout(cross, minimax, WORKLOAD) == []  # no network named: not checked
    assert [r for r, _ in check_layout(cross, minimax, WORKLOAD, EFA_ENV)] == ["dispatcher_fabric"]
    assert "dispatcher_fabric" in dict(
        check_layout(cross.replace(dispatcher="flex+hybridep"), minimax, WORKLOAD, EFA_ENV)
    )
    assert check_layout(cross.replace(dispatcher="alltoall"), minimax, WORKLOAD, EFA_ENV) == []
    assert check_layout(cross.replace(ep=8), minimax, WORKLOAD, EFA_ENV) == []  # EP 8 inside one 8-GPU node
    ib = RuleEnv(network=load_network("ib-ndr"), nvlink_size=8)
    assert check_layout(cross, minimax, WORKLOAD, ib) == []  # DeepEP's RDMA kernels run on InfiniBand
    nvl72 = RuleEnv(network=load_network("efa-v3"), nvlink_size=64)  # an NVLink domain as large as the job
    assert check_layout(cross, minimax, WORKLOAD, nvl72) == []


def test_query_groups_rule_follows_the_release(minimax: ModelSpec) -> None:
    tp16 = seed_layout(tp=16, sequence_parallel=True)  # 8 query groups
    assert "query_groups_tp" not in dict(check_layout(tp16, minimax, WORKLOAD, RuleEnv(megatron_core=(0, 16))))
    old = dict(check_layout(tp16, minimax, WORKLOAD, RuleEnv(megatron_core=(0, 15))))
    assert "megatron-core 0.15" in old["query_groups_tp"] and "0.16 or later" in old["query_groups_tp"]
    assert "query_groups_tp" not in dict(
        check_layout(seed_layout(tp=8, sequence_parallel=True), minimax, WORKLOAD, RuleEnv(megatron_core=(0, 13)))
    )


def test_odd_moe_layers_per_stage_with_a2a_overlap_warn(minimax: ModelSpec) -> None:
    lay = seed_layout()  # PP 8 VPP 4, first/last 7: chunks [1, 2, 2, 2] on rank 0
    assert layout_warnings(lay, minimax, RunOptions()) == []
    warn = layout_warnings(lay, minimax, RunOptions(overlap_moe_expert_parallel_comm=True))
    assert len(warn) == 1 and "issue 1810" in warn[0] and "rank 0 stage 0: 1" in warn[0]
    even = seed_layout(
        pp=2, vpp=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0
    )  # 31 + 31
    assert "rank 0 stage 0: 31" in layout_warnings(even, minimax, RunOptions(overlap_moe_expert_parallel_comm=True))[0]


def test_more_reasons(minimax: ModelSpec, llama8b: ModelSpec) -> None:
    def reasons(layout: Layout, model: ModelSpec, workload: Workload = WORKLOAD) -> dict[str, str]:
        return dict(check_layout(layout, model, workload))

    r = reasons(seed_layout(recompute_num_layers=2), minimax)  # chunks [1,2,2,2]: groups of 2 overrun chunk 0
    assert "chunks hold [1] layers" in r["recompute_full"]
    r = reasons(seed_layout(recompute_method="none"), minimax)
    assert "recompute_method uniform or block, got none" in r["recompute_full"]
    r = reasons(seed_layout(recompute_num_layers=2), minimax.replace(mtp_num_layers=1))
    assert "uniform recompute needs recompute_num_layers 1, got 2" in r["recompute_full"]
    r = reasons(seed_layout(tp=1, sequence_parallel=True), minimax)
    assert "sequence_parallel needs tp > 1, got tp 1" in r["sequence_parallel"]
    r = reasons(
        seed_layout(pp=1, vpp=2, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0), minimax
    )
    assert r["interleaved_schedule"] == "vpp (2) > 1 needs pp > 1, got pp 1"
    dense = seed_layout(
        pp=2, vpp=1, ep=1, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0,
        dispatcher="allgather",
    )
    assert "dispatcher must be alltoall (got allgather)" in reasons(dense, llama8b)["dispatcher"]
    assert reasons(dense.replace(dispatcher="alltoall"), llama8b) == {}
    # core 0.16 query-group rule: tp a multiple of the 8 groups is accepted.
    assert "query_groups_tp" not in reasons(seed_layout(tp=16, sequence_parallel=True), minimax)


def test_check_layout_lists_every_broken_rule(minimax: ModelSpec) -> None:
    bad = seed_layout(micro_batch_size=3, use_distributed_optimizer=False, ep=1, dispatcher="flex+hybridep")
    ids = [rule_id for rule_id, _ in check_layout(bad, minimax, WORKLOAD)]
    assert ids == ["batch_div_mbs_dp", "precision_aware_needs_distopt", "dispatcher"]


def test_check_table_first_failures(minimax: ModelSpec) -> None:
    layouts = [seed_layout(), slime_reference_layout()] + [
        BAD[k][0] for k in ("world_div_etp_ep_pp", "batch_div_mbs_dp", "dispatcher")
    ]
    ok, counts = check_table(LayoutTable.from_layouts(layouts), minimax, WORKLOAD)
    assert ok.tolist() == [True, True, False, False, False]
    assert list(counts) == list(RULE_IDS)
    assert {k: v for k, v in counts.items() if v} == {"world_div_etp_ep_pp": 1, "batch_div_mbs_dp": 1, "dispatcher": 1}
    assert sum(counts.values()) + int(ok.sum()) == len(layouts)


def test_check_table_empty(minimax: ModelSpec) -> None:
    ok, counts = check_table(LayoutTable.from_layouts([]), minimax, WORKLOAD)
    assert ok.shape == (0,) and ok.dtype == np.bool_
    assert sum(counts.values()) == 0


def test_flex_dispatchers_need_megatron_core_016(minimax: ModelSpec) -> None:
    """--moe-flex-dispatcher-backend arrived in core_v0.16.0: refused for 0.13 .. 0.15, accepted from 0.16."""
    flex = seed_layout(dispatcher="flex+deepep")
    for release, refused in (((0, 13), True), ((0, 15), True), ((0, 16), False), ((0, 19), False)):
        got = [r for r, _ in check_layout(flex, minimax, WORKLOAD, RuleEnv(megatron_core=release))]
        assert ("dispatcher_release" in got) == refused, release
    assert check_layout(seed_layout(dispatcher="alltoall"), minimax, WORKLOAD, RuleEnv(megatron_core=(0, 13))) == []
