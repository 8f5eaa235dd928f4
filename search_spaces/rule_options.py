"""The validity rules that tie the run options (EP all-to-all overlap, CUDA graphs, the optimizer, fp8 parameter
gather) to the layout's recompute, dispatcher and pipeline, or to the megatron-core release: checks and explanations in
pairs, as in :mod:`search_spaces.rule_checks`, and the rules of the options alone (:func:`options_rule`). Registered in
:data:`search_spaces.rules.RULES`."""

from __future__ import annotations

import numpy as np

from search_spaces.rule_base import BoolArray, RuleEnv, _b, options_rule, rule
from specs import ModelSpec, Workload
from specs.layout import Dispatcher, Layout, LayoutTable

#: The per-layer CUDA graph implementations: megatron-core refuses them with full recompute and with activation
#: offloading (``full_iteration`` passes both checks from core 0.18).
_LAYER_GRAPH_IMPLS = ("local", "transformer_engine")

#: The first megatron-core release with ``--cuda-graph-impl full_iteration`` (core_v0.16.0 transformer_config.py l.776
#: and core_v0.17.0 l.857: ``Literal['none', 'local', 'transformer_engine']``; core_v0.18.0 l.927 adds it); before it
#: the whole step is captured by ``--cuda-graph-impl local --cuda-graph-scope full_iteration``. It is also the first
#: release whose full-iteration graph runs with CPU offloading (core_v0.18.0 transformer_config.py l.2243:
#: ``self.cpu_offloading and self.cuda_graph_impl != "full_iteration"``; core_v0.16.0 l.1722, core_v0.17.0 l.1951
#: refuse any impl).
FULL_ITERATION_IMPL_SINCE = (0, 18)
#: The first megatron-core release whose CUDA graphs run with recompute beyond a selective recompute under an
#: ``attn``-scope ``transformer_engine`` graph (core_v0.15.0 transformer_config.py l.1397-1408: "CUDA graphs not
#: supported with activation recomputation."; core_v0.16.0 l.1780-1784 checks per scope).
GRAPH_RECOMPUTE_SCOPES_SINCE = (0, 16)
#: The modules core 0.15 refuses to recompute under its ``attn`` graph ('attn cuda graph is not supported with
#: {module} recompute.', core_v0.15.0 transformer_config.py l.1405-1408).
_ATTN_GRAPH_NO_RECOMPUTE = ("core_attn", "mla_up_proj")


def _moe_router_graphed(env: RuleEnv) -> bool:
    """The MoE router is in the scope of a per-layer graph (``local`` adds it to ``moe_preprocess``, 1dcf0da
    transformer_config.py l.1751-1760)."""
    scope = env.cuda_graph_scope
    return "moe_router" in scope or (env.cuda_graph_impl == "local" and "moe_preprocess" in scope)


def _graphs_refuse_cpu_offloading(env: RuleEnv) -> bool:
    """megatron-core refuses the run's CUDA graphs with ``--cpu-offloading-num-layers``: per-layer graphs always,
    the full-iteration graph before :data:`FULL_ITERATION_IMPL_SINCE`."""
    if not env.cpu_offloading_num_layers or env.cuda_graph_impl == "none":
        return False
    return env.cuda_graph_impl in _LAYER_GRAPH_IMPLS or env.megatron_core < FULL_ITERATION_IMPL_SINCE


def _attn_graph_recompute_ok(env: RuleEnv) -> bool:
    """Core 0.15 accepts a selective recompute under the run's graph: ``transformer_engine`` with scope ``attn``."""
    return env.cuda_graph_impl == "transformer_engine" and tuple(env.cuda_graph_scope) == ("attn",)


def _cuda_graphs_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    impl = env.cuda_graph_impl if env.cuda_graph_impl_arg == "none" else env.cuda_graph_impl_arg
    rel = env.version_label
    if _graphs_refuse_cpu_offloading(env):
        fix = ("use --cuda-graph-impl full_iteration, or drop one of them" if env.cuda_graph_impl in _LAYER_GRAPH_IMPLS
               else "drop one of them (accepted with full_iteration from 0.18)")
        return (f"--cuda-graph-impl {impl} with --cpu-offloading-num-layers {env.cpu_offloading_num_layers}: "
                f"megatron-core {rel} refuses CUDA graphs with CPU offloading; {fix}")
    if env.megatron_core < GRAPH_RECOMPUTE_SCOPES_SINCE:
        if lay.recompute_granularity.value == "selective" and _attn_graph_recompute_ok(env):
            return (f"recompute {lay.recompute_label} under the attn CUDA graph: megatron-core {rel} refuses "
                    f"{' and '.join(_ATTN_GRAPH_NO_RECOMPUTE)} recompute there; recompute other modules")
        return (f"recompute {lay.recompute_label} with CUDA graphs: megatron-core {rel} runs recompute only as "
                "selective under --cuda-graph-impl transformer_engine --cuda-graph-scope attn; change one of them")
    if lay.recompute_granularity.value == "full":
        return (f"--cuda-graph-impl {impl} with recompute {lay.recompute_label}: Megatron runs full recompute only "
                "with --cuda-graph-impl full_iteration; use selective or no recompute, or that impl")
    return (f"recompute of moe ({lay.recompute_label}) with the moe_router CUDA graph of --cuda-graph-impl "
            "transformer_engine: Megatron refuses it; recompute other modules, or leave moe_router out of the scope")


@rule("cuda_graphs", ("recompute_granularity", "recompute_modules"), explain=_cuda_graphs_x)
def _cuda_graphs(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """CUDA graphs with activation offloading and recompute (megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__). CPU offloading: refused with every impl before core 0.18 ("CUDA graphs not
    supported with CPU offloading.", core_v0.15.0 l.1395-1396, core_v0.16.0 l.1722, core_v0.17.0 l.1951), then
    with the per-layer ones only (core_v0.18.0 l.2243). Recompute in core 0.15: only selective, only under a
    ``transformer_engine`` graph of scope ``attn``, and not of ``core_attn`` or ``mla_up_proj`` ("CUDA graphs not
    supported with activation recomputation.", core_v0.15.0 l.1397-1408; full recompute also by
    megatron/training/arguments.py l.1202-1204). From core 0.16 per-layer graphs (``local``,
    ``transformer_engine``) run without full recompute, ``full_iteration`` (also the deprecated
    ``--cuda-graph-scope full_iteration``) with it ("full recompute is only supported with full iteration CUDA
    graph.", core_v0.16.0 l.1780-1784, d98e8a64); with ``transformer_engine`` a selective recompute of ``moe`` cannot
    have ``moe_router`` in the scope ("moe recompute is not supported with moe_router CUDA graph", l.1815-1821 at
    1dcf0da, l.2862-2869 at d98e8a64)."""
    if env.cuda_graph_impl == "none":
        return np.ones(len(t), dtype=np.bool_)
    if _graphs_refuse_cpu_offloading(env):
        return np.zeros(len(t), dtype=np.bool_)
    if env.megatron_core < GRAPH_RECOMPUTE_SCOPES_SINCE:
        ok = t.isin("recompute_granularity", "none")
        if _attn_graph_recompute_ok(env):
            ok |= t.isin("recompute_granularity", "selective") & ~t.where(
                "recompute_modules", lambda s: bool(set(s.split(",")) & set(_ATTN_GRAPH_NO_RECOMPUTE)))
        return _b(ok)
    if env.cuda_graph_impl not in _LAYER_GRAPH_IMPLS:
        return np.ones(len(t), dtype=np.bool_)
    ok = ~t.isin("recompute_granularity", "full")
    if env.cuda_graph_impl == "transformer_engine" and "moe_router" in env.cuda_graph_scope:
        ok &= ~t.where("recompute_modules", lambda s: "moe" in s.split(","))
    return _b(ok)


@options_rule("cuda_graph_scope")
def _cuda_graph_scope_problem(m: ModelSpec, env: RuleEnv) -> str | None:
    """the per-layer CUDA graph scope megatron-core accepts for the model
    (megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ at 1dcf0da l.1764-1803, at
    d98e8a64 l.2798-2850 with cuda_graph_config.py l.107-111): ``full_iteration`` not with ``transformer_engine``; not
    both ``moe`` and ``moe_router`` ('cuda_graph_scope must not contain both moe and moe_router.'); ``moe_preprocess``
    only with ``moe_router`` (``local`` adds ``moe_router`` to it, 1dcf0da l.1751-1760); ``moe``/``moe_router``
    only for MoE ('moe cuda graph is only supported for MoE.', 1dcf0da l.1777-1781); ``mlp`` only with dense
    layers; ``moe`` only with drop-padding MoE ('moe cuda graph is only supported with drop-padding MoE.'), which
    this tool never sets. A run option: every layout fails alike."""
    impl, scope = env.cuda_graph_impl, env.cuda_graph_scope
    if env.cuda_graph_impl_arg == "transformer_engine" and "full_iteration" in scope:
        return ("--cuda-graph-scope full_iteration does not run with --cuda-graph-impl transformer_engine; use "
                "--cuda-graph-impl full_iteration (local before megatron-core 0.18)")
    if impl not in _LAYER_GRAPH_IMPLS:
        return None
    if "moe" in scope and _moe_router_graphed(env):
        return "--cuda-graph-scope must not contain both moe and moe_router; give one of them"
    if impl == "transformer_engine" and "moe_preprocess" in scope and "moe_router" not in scope:
        return "--cuda-graph-scope moe_preprocess needs moe_router in the scope too"
    if not m.is_moe and ("moe" in scope or _moe_router_graphed(env)):
        return (f"--cuda-graph-scope moe / moe_router need MoE layers (local adds moe_router to moe_preprocess), and "
                f"{m.name} is dense")
    if m.is_moe and "mlp" in scope and m.num_dense_layers == 0:
        return f"--cuda-graph-scope mlp captures dense MLPs, and every layer of {m.name} is MoE; use moe_router"
    if m.is_moe and "moe" in scope:
        return ("--cuda-graph-scope moe needs drop-padding MoE (--moe-expert-capacity-factor with "
                "--moe-pad-expert-input-to-capacity), which this tool does not model; use moe_router,moe_preprocess")
    return None


#: The first megatron-core release with ``--cuda-graph-impl`` (core_v0.15.0 arguments.py l.1405; core_v0.14.0 has
#: only ``--enable-cuda-graph`` / ``--external-cuda-graph``).
CUDA_GRAPH_IMPL_SINCE = (0, 15)
#: The first release whose ``--cuda-graph-scope`` takes several module names (core_v0.16.0 arguments.py l.1430,
#: ``nargs='+'``); before it one of ``full``, ``attn``, ``full_iteration`` (core_v0.15.0 l.1411-1412).
CUDA_GRAPH_MODULES_SINCE = (0, 16)


@options_rule("cuda_graph_release")
def _cuda_graph_release_problem(m: ModelSpec, env: RuleEnv) -> str | None:
    """the CUDA graph flags of the run exist in ``--megatron-core``: ``--cuda-graph-impl`` from 0.15
    (:data:`CUDA_GRAPH_IMPL_SINCE`), ``full_iteration`` as an impl from 0.18 (:data:`FULL_ITERATION_IMPL_SINCE`;
    ``TransformerConfig.cuda_graph_impl`` is ``Literal['none', 'local', 'transformer_engine']`` at 1dcf0da
    transformer_config.py l.788 and in core_v0.16.0 / core_v0.17.0), module scopes from 0.16
    (:data:`CUDA_GRAPH_MODULES_SINCE`; megatron/training/arguments.py). A run option: every layout fails alike."""
    core, rel = env.megatron_core, env.version_label
    if env.cuda_graph_impl == "none":
        return None
    if core < CUDA_GRAPH_IMPL_SINCE:
        return (f"--cuda-graph-impl does not exist in megatron-core {rel} (--megatron-core; it arrived in 0.15); "
                "leave CUDA graphs out or use a newer release")
    if env.cuda_graph_impl_arg == "full_iteration" and core < FULL_ITERATION_IMPL_SINCE:
        return (f"--cuda-graph-impl full_iteration does not exist in megatron-core {rel} (--megatron-core; it "
                "arrived in 0.18); use --cuda-graph-impl local --cuda-graph-scope full_iteration")
    scope = [x for x in env.cuda_graph_scope if x != "full"]
    if core < CUDA_GRAPH_MODULES_SINCE and (len(scope) > 1 or set(scope) - {"attn", "full_iteration"}):
        return (f"--cuda-graph-scope {','.join(scope)}: megatron-core {rel} takes one of full, attn, full_iteration "
                "(module scopes such as moe_router arrived in 0.16)")
    return None


#: The first megatron-core release with ``--overlap-moe-expert-parallel-comm`` (core_v0.14.0 arguments.py l.2889;
#: absent from core_v0.13.0 and core_v0.13.1).
EP_OVERLAP_SINCE = (0, 14)
#: The megatron-core releases ``[first, end)`` whose overlap block refuses an MTP layer with pp 1 and CUDA graphs
#: other than ``transformer_engine`` (transformer_config.py core_v0.16.0 l.1892-1906, core_v0.17.0 l.2124-2138,
#: 1dcf0da l.1918-1932; neither check in core_v0.14.0 l.1298-1337, core_v0.15.0 l.1441-1480; core_v0.18.0
#: l.2439-2451 keeps only the ``transformer_engine`` scope check).
OVERLAP_MTP_GRAPH_CHECKS = ((0, 16), (0, 18))


def _overlap_mtp_graph_checks(env: RuleEnv) -> bool:
    first, end = OVERLAP_MTP_GRAPH_CHECKS
    return first <= env.megatron_core < end

#: The first megatron-core release that refuses ``moe`` in ``--recompute-modules`` with the EP all-to-all overlap
#: (core_v0.17.0 transformer_config.py l.2111; absent from core_v0.16.0 and 1dcf0da).
OVERLAP_NO_MOE_RECOMPUTE_SINCE = (0, 17)


def _ep_overlap_problems(lay: Layout, m: ModelSpec, env: RuleEnv) -> list[str]:
    out = []
    if lay.ep <= 1:
        out.append(f"ep {lay.ep} (it needs expert parallelism, ep > 1)")
    if lay.dispatcher == Dispatcher.allgather:
        out.append("the allgather dispatcher (it needs alltoall or flex)")
    if lay.pp > 1 and lay.vpp == 1:
        out.append(f"pp {lay.pp} without vpp (pp > 1 needs the interleaved schedule, vpp > 1)")
    if lay.recompute_granularity.value == "full":
        out.append(f"recompute {lay.recompute_label} (no full recompute)")
    if env.megatron_core >= OVERLAP_NO_MOE_RECOMPUTE_SINCE and "moe" in lay.recompute_modules:
        out.append(f"moe in recompute_modules (refused from megatron-core 0.17; --megatron-core {env.version_label})")
    if m.mtp_num_layers == 1 and lay.pp == 1 and _overlap_mtp_graph_checks(env):
        out.append(f"an MTP layer with pp 1 (megatron-core {env.version_label} needs pp > 1)")
    return out


def _ep_overlap_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    return (f"--overlap-moe-expert-parallel-comm does not run with {'; '.join(_ep_overlap_problems(lay, m, env))}; "
            "change those, or leave the flag out")


@rule("ep_overlap", ("ep", "dispatcher", "pp", "vpp", "recompute_granularity", "recompute_modules"),
      explain=_ep_overlap_x)
def _ep_overlap(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """``--overlap-moe-expert-parallel-comm`` (megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__, l.1878-1921 at 1dcf0da, l.3002-3046 at d98e8a64): pp > 1 needs
    virtual_pipeline_model_parallel_size (vpp > 1; arguments.py l.525-527 at 1dcf0da sets it None for one stage per
    rank), ep > 1, dispatcher alltoall or flex, no full recompute ('disable full recomputation when enabling
    overlap_moe_expert_parallel_comm'), no recompute method and num_layers (set here only with full recompute), no
    ``moe`` in recompute_modules from core 0.17 (:data:`OVERLAP_NO_MOE_RECOMPUTE_SINCE`) and, in core 0.16 and 0.17,
    an MTP layer only with pp > 1 (:data:`OVERLAP_MTP_GRAPH_CHECKS`); bf16 or fp16 (every precision here trains in
    bf16). What the layout does not decide is rule ep_overlap_options."""
    if not env.overlap_moe_expert_parallel_comm or not m.is_moe:
        return np.ones(len(t), dtype=np.bool_)
    ok = (t["ep"] > 1) & ~t.isin("dispatcher", Dispatcher.allgather.value)
    ok &= (t["pp"] == 1) | (t["vpp"] > 1)
    ok &= ~t.isin("recompute_granularity", "full")
    if env.megatron_core >= OVERLAP_NO_MOE_RECOMPUTE_SINCE:
        ok &= ~t.where("recompute_modules", lambda s: "moe" in s.split(","))
    if m.mtp_num_layers == 1 and _overlap_mtp_graph_checks(env):
        ok &= t["pp"] > 1
    return _b(ok)


@options_rule("ep_overlap_options")
def _ep_overlap_options_problem(m: ModelSpec, env: RuleEnv) -> str | None:
    """``--overlap-moe-expert-parallel-comm`` whatever the layout: from core 0.14 (:data:`EP_OVERLAP_SINCE`);
    (transformer_config.py TransformerConfig.__post_init__ at 1dcf0da) ep > 1, so MoE only, l.1889-1891; at most one
    MTP layer, l.1915-1917; in core 0.16 and 0.17 (:data:`OVERLAP_MTP_GRAPH_CHECKS`) CUDA graphs only
    ``transformer_engine`` without ``moe`` or ``mlp`` in the scope, l.1924-1932, 'CUDA graph scope on moe and mlp is
    not supported with overlap_moe_expert_parallel_comm'; from core 0.18, l.3063-3071 at d98e8a64, only the scope
    check of ``transformer_engine``; core 0.14 and 0.15 check no CUDA graph there. A run option: every layout fails
    alike."""
    if not env.overlap_moe_expert_parallel_comm:
        return None
    if env.megatron_core < EP_OVERLAP_SINCE:
        return (f"--overlap-moe-expert-parallel-comm does not exist in megatron-core {env.version_label} "
                "(--megatron-core; it arrived in 0.14); leave it out or use a newer release")
    if not m.is_moe:
        return f"--overlap-moe-expert-parallel-comm overlaps the expert all-to-all, and {m.name} is dense"
    if m.mtp_num_layers > 1:
        return (f"--overlap-moe-expert-parallel-comm runs with at most one MTP layer, and {m.name} has "
                f"{m.mtp_num_layers}")
    if env.cuda_graph_impl == "none" or env.megatron_core < OVERLAP_MTP_GRAPH_CHECKS[0]:
        return None
    if _overlap_mtp_graph_checks(env) and env.cuda_graph_impl_arg != "transformer_engine":
        return (f"--cuda-graph-impl {env.cuda_graph_impl_arg} with --overlap-moe-expert-parallel-comm: megatron-core "
                f"{env.version_label} runs the overlap only with --cuda-graph-impl transformer_engine graphs")
    if env.cuda_graph_impl == "transformer_engine" and set(env.cuda_graph_scope) & {"moe", "mlp"}:
        return ("--cuda-graph-scope moe / mlp with --overlap-moe-expert-parallel-comm: Megatron refuses them; use "
                "attn,moe_router,moe_preprocess")
    return None


#: The first megatron-core release with ``--optimizer dist_muon`` (core_v0.15.0 arguments.py l.2198: choices adam,
#: sgd; core_v0.16.0 l.2057 adds muon, dist_muon).
MUON_SINCE = (0, 16)
#: The first release where ``dist_muon`` stands beside ``--use-distributed-optimizer``: core_v0.18.0 arguments.py
#: l.1553-1558 turns it into the layer-wise distributed optimizer; before it (1dcf0da arguments.py l.1181,
#: core_v0.17.0 l.1482) 'Muon optimizer does not support distributed optimizer for now'.
MUON_DISTOPT_SINCE = (0, 18)


@options_rule("dist_muon_options")
def _muon_options_problem(m: ModelSpec, env: RuleEnv) -> str | None:
    """``--optimizer dist_muon`` whatever the layout: not before core 0.16 (:data:`MUON_SINCE`); never with
    Megatron-FSDP (megatron/training/arguments.py l.1183 at 1dcf0da, l.1740 at d98e8a64); in core 0.16 no overlapped
    grad reduce or param gather (l.1179-1180 at 1dcf0da; core_v0.17.0 l.1478-1480 keeps them for ``muon`` only). A
    run option: every layout fails alike."""
    if env.optimizer != "dist_muon":
        return None
    if env.megatron_core < MUON_SINCE:
        return f"megatron-core {env.version_label} has no --optimizer dist_muon (it arrived in 0.16; --megatron-core)"
    if env.use_megatron_fsdp:
        return "--optimizer dist_muon does not run with --use-megatron-fsdp"
    if env.megatron_core < (0, 17) and env.overlap_grad_reduce:
        return (f"--optimizer dist_muon does not run with --overlap-grad-reduce / --overlap-param-gather in "
                f"megatron-core {env.version_label} (accepted from 0.17)")
    return None


def _muon_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    out = []
    if lay.use_precision_aware_optimizer:
        out.append("the precision-aware optimizer (Adam's only; so no optimizer CPU offload either)")
    if lay.use_distributed_optimizer and env.megatron_core < MUON_DISTOPT_SINCE:
        out.append(f"--use-distributed-optimizer (megatron-core {env.version_label}; accepted from 0.18)")
    return f"--optimizer dist_muon does not run with {' or '.join(out)}; turn it off"


@rule("dist_muon", ("use_precision_aware_optimizer", "use_distributed_optimizer"), explain=_muon_x)
def _muon(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """``--optimizer dist_muon``: no precision-aware optimizer ('--use-precision-aware-optimizer only supported with
    adam', megatron/core/optimizer/optimizer_config.py l.380-383 at 1dcf0da, l.433-436 at d98e8a64), hence no
    optimizer CPU offload (rule offload_needs_precision_aware, arguments.py l.1189-1193 at 1dcf0da); before core 0.18
    no distributed optimizer (:data:`MUON_DISTOPT_SINCE`; 'Muon optimizer does not support distributed optimizer for
    now', megatron/training/arguments.py l.1181 at 1dcf0da). What the layout does not decide is rule
    dist_muon_options."""
    if env.optimizer != "dist_muon":
        return np.ones(len(t), dtype=np.bool_)
    ok = ~t["use_precision_aware_optimizer"]
    if env.megatron_core < MUON_DISTOPT_SINCE:
        ok &= ~t["use_distributed_optimizer"]
    return _b(ok)


def _fp8_gather_offload_on(w: Workload, env: RuleEnv) -> bool:
    """fp8 parameters gathered with a recipe other than delayed scaling (fp8 current scaling, blockwise, mxfp8)."""
    fp8 = w.precision.value in ("fp8", "fp8_blockwise", "mxfp8")
    recipe = env.fp8_recipe if w.precision.value == "fp8" else w.precision.value
    return fp8 and env.fp8_param_gather and recipe != "delayed"


def _fp8_gather_offload_x(lay: Layout, m: ModelSpec, w: Workload, env: RuleEnv) -> str:
    recipe = env.fp8_recipe if w.precision.value == "fp8" else w.precision.value
    return (f"optimizer_offload_fraction {lay.optimizer_offload_fraction:g} (--optimizer-cpu-offload) with "
            f"--fp8-param-gather needs --fp8-recipe delayed, and the run uses {recipe}; use offload fraction 0, "
            "delayed scaling, or leave --fp8-param-gather out")


@rule("fp8_param_gather_offload", ("optimizer_offload_fraction",), explain=_fp8_gather_offload_x)
def _fp8_gather_offload(t: LayoutTable, m: ModelSpec, w: Workload, env: RuleEnv) -> BoolArray:
    """optimizer CPU offload with ``--fp8-param-gather`` needs ``--fp8-recipe delayed``
    (megatron/training/arguments.py validate_args, l.1194-1197 at 1dcf0da, l.1889-1892 at d98e8a64: "When
    `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in conjunction with `--fp8-recipe
    delayed`."); fp8_blockwise and mxfp8 are recipes other than delayed."""
    if not _fp8_gather_offload_on(w, env):
        return np.ones(len(t), dtype=np.bool_)
    return _b(t["optimizer_offload_fraction"] <= 0)
