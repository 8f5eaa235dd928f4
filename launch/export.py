"""Export a layout as something a person can run: flags, scripts and a recipe YAML.

Three outputs, all built from the same four inputs (:class:`ModelSpec`,
:class:`Cluster`, :class:`Workload`, :class:`Layout`):

* :func:`slime_script`: a bash script in the style of the ``run:`` block of the
  measured MiniMax-M2 recipe (shared/seeds/001), which is the model for every
  export here: the same four environment variables, the same SFT workload and
  optimizer arguments, and the layout's parallelism flags.
* :func:`megatron_args_script`: a bash file defining ``MEGATRON_ARGS=( ... )``
  for Megatron-LM's ``pretrain_gpt.py``.
* :func:`recipe_dict` / :func:`dump_recipe` / :func:`write_recipe`: the recipe
  YAML, with the seed's fields, checked against
  ``launch/schema/recipe.schema.json`` by :func:`validate_recipe`.

Flag names are those of megatron-core 0.16.0rc0 (slime's pin ``1dcf0da``;
shared/notes/megatron_rules.md), which are the same at Megatron-LM HEAD.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import shlex
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from specs import Cluster, ModelSpec, Precision, Workload
from specs.errors import TunerError
from specs.layout import Dispatcher, Layout, RecomputeGranularity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cost_model.types import Estimate
    from launch.base import Measurement

__all__ = [
    "SEED_ENV",
    "OPTIMIZER_HPARAMS",
    "MISC_ARGS",
    "model_args",
    "layout_args",
    "megatron_args",
    "megatron_args_script",
    "slime_script",
    "recipe_dict",
    "dump_recipe",
    "write_recipe",
    "validate_recipe",
    "recipe_schema",
]

GIB = 2**30

Framework = Literal["megatron", "slime"]

#: The four environment variables of the seed's ``run:`` block (values are shell text).
SEED_ENV: dict[str, str] = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "NCCL_NVLS_ENABLE": '$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)',
}

#: The seed's optimizer hyperparameters, two lines as its ``run:`` block writes them.
_OPTIMIZER_LINES: tuple[tuple[str, ...], ...] = (
    ("--optimizer", "adam", "--lr", "1e-5", "--lr-decay-style", "cosine", "--min-lr", "1e-6"),
    ("--lr-warmup-fraction", "0.1", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98"),
)
OPTIMIZER_HPARAMS: tuple[str, ...] = tuple(a for line in _OPTIMIZER_LINES for a in line)

#: The seed's numerics flags (dropout off, fp32 gradient accumulation and softmax, flash attention).
_MISC_LINES: tuple[tuple[str, ...], ...] = (
    ("--attention-dropout", "0.0", "--hidden-dropout", "0.0"),
    ("--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"),
    ("--attention-backend", "flash"),
)
MISC_ARGS: tuple[str, ...] = tuple(a for line in _MISC_LINES for a in line)

#: slime's MiniMax-M2 layer spec (scripts/models/minimax-m2.sh): full-width QK RMSNorm.
_MINIMAX_M2_SPEC = ("--spec", "slime_plugins.models.minimax_m2", "get_minimax_m2_layer_spec")

_STACK_FRAMEWORK = "slime or Megatron-LM (any version with --pipeline-model-parallel-layout)"
_PREDICTION_SOURCE = "analytical cost model (cost_model/)"
_CORRECTNESS_NOTE = (
    "not run: check convergence against a reference layout (same weights and data, 20 steps, "
    "Megatron-Bridge's validate_convergence thresholds) before training on this layout: "
    "`tune verify --study STUDY --trial N --reference tp=1,pp=1,ep=1`"
)
_RECIPE_HEADER = "# A megatron-layout-tuner recipe; the fields are documented in launch/schema/recipe.schema.json.\n"

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


# --------------------------------------------------------------------------- checks


def _check(layout: Layout, model: ModelSpec, workload: Workload, cluster: Cluster | None = None) -> None:
    """Reject a layout that cannot be written as a consistent command line.

    These are the few rules an export depends on (the full rule set lives in
    ``search_spaces``); each names the Megatron check it mirrors.

    Raises:
        TunerError: if the layout's world size is not the cluster's GPU count, a
            degree does not divide the world size, EP > 1 on a dense model, the
            sequence is not divisible by CP, or the optimizer flags contradict
            Megatron's optimizer rules (shared/notes/megatron_rules.md §4).
    """
    w = layout.world_size
    if cluster is not None and w != cluster.num_gpus:
        raise TunerError(f"layout world_size {w} differs from the cluster's {cluster.num_gpus} GPUs ({cluster.label})")
    if w % (layout.tp * layout.pp * layout.cp):
        raise TunerError(f"world size {w} is not divisible by TP*PP*CP = {layout.tp * layout.pp * layout.cp}")
    if w % (layout.etp * layout.ep * layout.pp):
        raise TunerError(f"world size {w} is not divisible by ETP*EP*PP = {layout.etp * layout.ep * layout.pp}")
    if not model.is_moe and layout.ep > 1:
        raise TunerError(f"model {model.name!r} has no experts, so EP must be 1 (got EP {layout.ep})")
    if workload.seq_length % layout.cp:
        raise TunerError(f"seq_length {workload.seq_length} is not divisible by CP {layout.cp}")
    if layout.pp == 1 and layout.vpp > 1:
        raise TunerError(f"VPP {layout.vpp} needs PP > 1 (Megatron's interleaved schedule)")
    if layout.optimizer_offload_fraction > 0 and not layout.use_precision_aware_optimizer:
        raise TunerError("--optimizer-cpu-offload requires --use-precision-aware-optimizer (Megatron arguments.py)")
    if layout.use_precision_aware_optimizer and not layout.use_distributed_optimizer:
        raise TunerError("--use-precision-aware-optimizer is only supported with --use-distributed-optimizer")
    if not layout.use_precision_aware_optimizer and (layout.exp_avg_dtype, layout.exp_avg_sq_dtype) != ("fp32", "fp32"):
        raise TunerError(
            f"exp_avg_dtype {layout.exp_avg_dtype} / exp_avg_sq_dtype {layout.exp_avg_sq_dtype}: dtypes other than "
            "fp32 need the precision-aware optimizer (Megatron optimizer_config.py)"
        )


# --------------------------------------------------------------------------- model flags


def _layer_freq_expr(freq: Sequence[int]) -> str:
    """``moe_layer_freq`` as the Python-list expression Megatron evaluates, run-length coded.

    ``(1,)*62`` gives ``[1]*62``; three dense layers then 58 MoE give ``[0]*3+[1]*58``.
    """
    runs: list[list[int]] = []
    for v in freq:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return "+".join(f"[{v}]*{n}" for v, n in runs)


def _flag_num(x: float) -> str:
    """A number as a flag value: ``1e-6`` (not ``1e-06``), ``0.5``, ``5000000``."""
    if float(x).is_integer() and abs(x) >= 1:
        return str(int(x))
    return f"{x:g}".replace("e-0", "e-").replace("e+0", "e+")


def model_args(model: ModelSpec) -> list[str]:
    """Megatron-LM model-architecture flags for ``model``, as argv elements.

    Emits what slime's ``scripts/models/*.sh`` pass in ``MODEL_ARGS``: sizes,
    attention (GQA or MLA), RMSNorm with its epsilon, SwiGLU, untied embeddings,
    vocabulary, QK norm, RoPE (base, partial rotary, Llama-3 scaling
    ``--use-rope-scaling --rope-scaling-factor`` or YaRN ``--rotary-scaling-factor
    --mscale --mscale-all-dim``), no linear biases, the MoE block (experts, expert
    FFN, top-k, ``--moe-layer-freq`` as a list expression, shared experts, router
    score function, expert bias, top-k scaling, group-limited routing, fp32 router,
    grouped GEMM) and MTP, then the preset's ``extra_megatron_args``.
    ``--ffn-hidden-size`` is ``moe_ffn_hidden_size`` when the model has no dense
    FFN, as slime's MiniMax-M2 script does. The token dispatcher is a layout
    choice (:func:`layout_args`); ``--attention-softmax-in-fp32`` is in
    :data:`MISC_ARGS`.

    MiniMax-M2 (``qk_layernorm_full_dim``) normalises q and k over all heads at
    once, which no megatron-core layer spec does: slime adds its own
    ``--spec slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec``
    (slime_plugins must be importable, also under plain Megatron-LM, whose
    ``pretrain_gpt.py`` honours ``--spec``). For MiniMax-M2 the result equals
    slime's ``scripts/models/minimax-m2.sh`` flag for flag (shared/notes/slime_minimax_bridge.md §2).
    Multi-latent attention omits ``--kv-channels`` (MLA sizes its heads with the
    ``--qk-*``/``--v-head-dim`` flags).

    Args:
        model: The model.

    Returns:
        Flags and values in slime's order, e.g. ``["--num-layers", "62", ...]``.

    Raises:
        TunerError: if a MoE model has no MoE layer in ``moe_layer_freq``.
    """
    a: list[str] = []
    if model.qk_layernorm_full_dim:
        a += _MINIMAX_M2_SPEC
    a += ["--disable-bias-linear", "--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size)]
    ffn = model.ffn_hidden_size or model.moe_ffn_hidden_size
    a += ["--ffn-hidden-size", str(ffn), "--num-attention-heads", str(model.num_attention_heads)]
    if not model.is_mla:
        a += ["--kv-channels", str(model.kv_channels)]
        if model.num_query_groups < model.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    a += ["--normalization", "RMSNorm", "--position-embedding-type", "rope", "--norm-epsilon", _flag_num(model.norm_epsilon)]
    if model.gated_linear_unit:
        a += ["--swiglu"]
    if model.untie_embeddings_and_output_weights:
        a += ["--untie-embeddings-and-output-weights"]
    a += ["--vocab-size", str(model.vocab_size)]
    if model.rotary_percent != 1.0:
        a += ["--rotary-percent", _flag_num(model.rotary_percent)]
    a += ["--rotary-base", _flag_num(model.rotary_base)]
    if model.rope_scaling_type == "llama3":
        a += ["--use-rope-scaling", "--rope-scaling-factor", _flag_num(model.rope_scaling_factor)]
    elif model.rope_scaling_type == "yarn":
        a += ["--rotary-scaling-factor", _flag_num(model.rope_scaling_factor), "--mscale", _flag_num(model.rope_scaling_mscale),
              "--mscale-all-dim", _flag_num(model.rope_scaling_mscale_all_dim)]  # fmt: skip
    if model.qk_layernorm:
        a += ["--qk-layernorm"]
    if model.is_mla:
        a += ["--multi-latent-attention"]
        if model.q_lora_rank:
            a += ["--q-lora-rank", str(model.q_lora_rank)]
        a += [
            "--kv-lora-rank", str(model.kv_lora_rank),
            "--qk-head-dim", str(model.qk_head_dim),
            "--qk-pos-emb-head-dim", str(model.qk_pos_emb_head_dim),
            "--v-head-dim", str(model.v_head_dim),
        ]  # fmt: skip
    if model.is_moe:
        if not model.num_moe_layers:
            raise TunerError(f"model {model.name!r} has {model.num_experts} experts but no MoE layer in moe_layer_freq")
        a += [
            "--num-experts", str(model.num_experts),
            "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size),
            "--moe-router-topk", str(model.moe_router_topk),
            "--moe-layer-freq", _layer_freq_expr(model.moe_layer_freq),
        ]  # fmt: skip
        if model.moe_shared_expert_intermediate_size > 0:
            a += ["--moe-shared-expert-intermediate-size", str(model.moe_shared_expert_intermediate_size)]
        if model.moe_router_score_function != "softmax":
            a += ["--moe-router-score-function", model.moe_router_score_function]
        if model.moe_router_enable_expert_bias:
            a += ["--moe-router-enable-expert-bias"]
        if model.moe_router_topk_scaling_factor:
            a += ["--moe-router-topk-scaling-factor", _flag_num(model.moe_router_topk_scaling_factor)]
        if model.moe_router_num_groups:
            a += ["--moe-router-num-groups", str(model.moe_router_num_groups), "--moe-router-group-topk", str(model.moe_router_group_topk)]
        a += ["--moe-router-dtype", "fp32", "--moe-grouped-gemm"]
    if model.mtp_num_layers > 0:
        a += ["--mtp-num-layers", str(model.mtp_num_layers)]
    a += list(model.extra_megatron_args)
    return a



# --------------------------------------------------------------------------- layout flags


def _pipeline_layout_string(layout: Layout, model: ModelSpec) -> str | None:
    """``--pipeline-model-parallel-layout`` for ``layout``; None when PP is 1.

    Raises:
        TunerError: from :func:`search_spaces.pipeline.emit_layout_string` when
            the layers cannot be split as asked.
    """
    if layout.pp == 1:
        return None
    from search_spaces.pipeline import emit_layout_string  # lazy: another module's work

    try:
        return emit_layout_string(
            model.num_layers,
            layout.pp,
            layout.vpp,
            first=layout.num_layers_in_first_pipeline_stage,
            last=layout.num_layers_in_last_pipeline_stage,
            mtp_num_layers=model.mtp_num_layers,
        )
    except TunerError:
        raise
    except ValueError as e:
        raise TunerError(f"pipeline layout for {layout.label}: {e}") from None


def _parallel_args(layout: Layout, model: ModelSpec) -> list[str]:
    a = ["--tensor-model-parallel-size", str(layout.tp)]
    if layout.sequence_parallel and layout.tp > 1:
        a += ["--sequence-parallel"]
    a += ["--pipeline-model-parallel-size", str(layout.pp), "--context-parallel-size", str(layout.cp)]
    if model.is_moe:
        a += ["--expert-model-parallel-size", str(layout.ep), "--expert-tensor-parallel-size", str(layout.etp)]
    return a


def _recompute_args(layout: Layout) -> list[str]:
    g = layout.recompute_granularity
    if g == RecomputeGranularity.full:
        return [
            "--recompute-granularity", "full",
            "--recompute-method", layout.recompute_method.value,
            "--recompute-num-layers", str(layout.recompute_num_layers),
        ]  # fmt: skip
    if g == RecomputeGranularity.selective:
        return ["--recompute-granularity", "selective", "--recompute-modules", *(layout.recompute_modules or ("core_attn",))]
    return []


def _max_tokens_per_gpu(layout: Layout, workload: Workload) -> int:
    return layout.micro_batch_size * workload.seq_length // layout.cp


def _optimizer_layout_args(layout: Layout) -> list[str]:
    a: list[str] = []
    if layout.use_distributed_optimizer:
        a += ["--use-distributed-optimizer"]
    if layout.optimizer_offload_fraction > 0:
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", str(float(layout.optimizer_offload_fraction))]
        if layout.overlap_cpu_optimizer_d2h_h2d:
            a += ["--overlap-cpu-optimizer-d2h-h2d"]
    if layout.use_precision_aware_optimizer:
        a += ["--use-precision-aware-optimizer"]
    if layout.exp_avg_dtype != "fp32":
        a += ["--exp-avg-dtype", layout.exp_avg_dtype]
    if layout.exp_avg_sq_dtype != "fp32":
        a += ["--exp-avg-sq-dtype", layout.exp_avg_sq_dtype]
    return a


def _dispatcher(layout: Layout, framework: Framework) -> Dispatcher:
    """The dispatcher the command asks for: slime turns allgather into alltoall."""
    if framework == "slime" and layout.dispatcher == Dispatcher.allgather:
        return Dispatcher.alltoall
    return layout.dispatcher


def _dispatcher_args(layout: Layout, model: ModelSpec, framework: Framework) -> list[str]:
    if not model.is_moe:
        return []
    d = _dispatcher(layout, framework)
    a = ["--moe-token-dispatcher-type", d.moe_token_dispatcher_type]
    if d.moe_flex_dispatcher_backend:
        a += ["--moe-flex-dispatcher-backend", d.moe_flex_dispatcher_backend]
    return a


def _precision_args(workload: Workload, framework: Framework) -> list[str]:
    # slime sets bf16 itself (args.bf16 = not args.fp16); Megatron-LM needs the flag.
    a = ["--bf16"] if framework == "megatron" else []
    if workload.precision == Precision.fp8:
        a += ["--fp8-format", "hybrid"]
    return a


def layout_args(layout: Layout, model: ModelSpec, workload: Workload, *, framework: Framework = "megatron") -> list[str]:
    """Parallelism, batch, recompute, optimizer and dispatcher flags for ``layout``.

    Order and spelling follow the seed's ``run:`` block: batch and sequence,
    TP (with ``--sequence-parallel`` when on), PP, CP, EP, ETP (the expert flags
    for MoE models only), recompute (``full`` with method and layers, or
    ``selective`` with ``--recompute-modules``), the batch size per GPU,
    ``--use-distributed-optimizer``, CPU optimizer offload
    (``--optimizer-cpu-offload --optimizer-offload-fraction F`` and
    ``--overlap-cpu-optimizer-d2h-h2d``), ``--use-precision-aware-optimizer``,
    ``--exp-avg-dtype``/``--exp-avg-sq-dtype`` when not fp32, the token
    dispatcher (``--moe-flex-dispatcher-backend`` for flex) and, when PP > 1,
    ``--pipeline-model-parallel-layout`` with the string of
    :func:`search_spaces.pipeline.emit_layout_string`. That string sets VPP (its
    stage count over PP), so no separate VPP flag is written, and it replaces
    ``--decoder-first/last-pipeline-num-layers``.

    Megatron-LM takes ``--micro-batch-size``. slime packs rows by token count
    instead: ``--use-dynamic-batch-size --max-tokens-per-gpu mbs*seq/cp``, and it
    rewrites the allgather dispatcher to alltoall (it forces variable sequence
    lengths, which allgather does not support), so alltoall is written for it.

    Args:
        layout: The layout.
        model: The model (layer count for the pipeline layout, MoE or dense).
        workload: Sequence length and global batch.
        framework: ``"megatron"`` (Megatron-LM ``pretrain_gpt.py``) or ``"slime"``.

    Returns:
        Flags and values as argv elements.

    Raises:
        TunerError: if the layout contradicts the model, workload or Megatron's
            optimizer rules, or its layers cannot be split over the pipeline.
    """
    if framework not in ("megatron", "slime"):
        raise TunerError(f"framework must be 'megatron' or 'slime', got {framework!r}")
    _check(layout, model, workload)
    a: list[str] = []
    if framework == "megatron":
        a += ["--micro-batch-size", str(layout.micro_batch_size)]
    a += ["--global-batch-size", str(workload.global_batch_size), "--seq-length", str(workload.seq_length)]
    a += _parallel_args(layout, model)
    a += _recompute_args(layout)
    if framework == "slime":
        a += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(_max_tokens_per_gpu(layout, workload))]
    a += _optimizer_layout_args(layout)
    a += _dispatcher_args(layout, model, framework)
    pls = _pipeline_layout_string(layout, model)
    if pls is not None:
        a += ["--pipeline-model-parallel-layout", pls]
    return a


def megatron_args(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout) -> list[str]:
    """The full Megatron-LM argument list for ``pretrain_gpt.py`` (data arguments aside).

    :func:`model_args`, then :func:`layout_args` (with ``--micro-batch-size``),
    ``--max-position-embeddings`` (the sequence length, as slime sets it),
    ``--bf16`` (plus ``--fp8-format hybrid`` for an fp8 workload), the seed's
    optimizer hyperparameters (:data:`OPTIMIZER_HPARAMS`) and numerics flags
    (:data:`MISC_ARGS`). Data, tokenizer, checkpoint and ``--train-iters``
    arguments are the user's to add.

    Args:
        model: The model.
        cluster: The GPUs (its count must be the layout's world size).
        workload: Sequence length, global batch and precision.
        layout: The layout.

    Returns:
        argv elements.

    Raises:
        TunerError: as :func:`layout_args`, or if the layout's world size is not
            the cluster's GPU count.
    """
    _check(layout, model, workload, cluster)
    return [
        *model_args(model),
        *layout_args(layout, model, workload, framework="megatron"),
        "--max-position-embeddings", str(workload.seq_length),
        *_precision_args(workload, "megatron"),
        *OPTIMIZER_HPARAMS,
        *MISC_ARGS,
    ]  # fmt: skip


# --------------------------------------------------------------------------- scripts


def _group_flags(argv: Sequence[str]) -> list[list[str]]:
    """Split argv into one group per flag: ``--flag`` followed by its values."""
    groups: list[list[str]] = []
    for x in argv:
        if x.startswith("--") or not groups:
            groups.append([x])
        else:
            groups[-1].append(x)
    return groups


def _comment(text: str) -> list[str]:
    """``text`` as bash comment lines of at most 112 characters."""
    return ["# " + line for line in textwrap.wrap(text, 110, break_on_hyphens=False)]


def _quote_line(group: Sequence[str]) -> str:
    return " ".join(shlex.quote(x) for x in group)


def _bash_array(name: str, argv: Sequence[str]) -> str:
    body = "".join(f"  {_quote_line(g)}\n" for g in _group_flags(argv))
    return f"{name}=(\n{body})\n"


def megatron_args_script(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout) -> str:
    """A bash file that defines ``MEGATRON_ARGS=( ... )``, one flag and its values per line.

    Every element is ``shlex.quote``-d, so the pipeline layout string's ``|``,
    ``(`` and ``*`` reach Megatron unchanged. Use it as::

        source megatron_args.sh
        torchrun --nnodes N --nproc-per-node G ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data and tokenizer args>

    (``$(cat file)`` would not do: word splitting does not undo quotes.)

    Args:
        model: The model.
        cluster: The GPUs.
        workload: The workload.
        layout: The layout.

    Returns:
        The file's text.

    Raises:
        TunerError: as :func:`megatron_args`.
    """
    argv = megatron_args(model, cluster, workload, layout)
    head = [
        f"# Megatron-LM arguments for {model.name} on {cluster.num_gpus} {cluster.gpu.name} "
        f"({cluster.num_nodes} x {cluster.gpus_per_node}): {layout.label}",
        *_comment(_summary(layout, model, workload)),
        "# Exported by megatron-layout-tuner. Use:",
        "#   source megatron_args.sh",
        f"#   torchrun --nnodes {cluster.num_nodes} --nproc-per-node {cluster.gpus_per_node} ... pretrain_gpt.py "
        '"${MEGATRON_ARGS[@]}" <data, tokenizer and checkpoint arguments>',
    ]
    if model.qk_layernorm_full_dim:
        head.append("# --spec needs slime's slime_plugins package on PYTHONPATH (full-width QK norm).")
    return "\n".join(head) + "\n" + _bash_array("MEGATRON_ARGS", argv)


def _command_lines(groups: Sequence[Sequence[str]]) -> list[str]:
    return [" ".join(g) for g in groups]


def slime_script(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    extra_env: Mapping[str, str] | None = None,
    num_rollout: int = 20,
    entry_module: str | None = None,
) -> str:
    """A bash script that trains ``layout`` with slime, in the seed's ``run:`` style.

    The seed's four environment exports (after working out ``NVLINK_COUNT`` as
    slime's scripts do, unless it is set), ``MODEL_ARGS=( ... )`` from
    :func:`model_args`, then ``python3 -m <entry> --async`` with the seed's SFT
    arguments (``--rollout-batch-size`` and ``--global-batch-size`` both the
    workload's global batch), the layout's flags in the seed's order, the seed's
    optimizer hyperparameters and misc flags, the token dispatcher and the
    pipeline layout string. With the seed's layout on 8 x 8 H200 every flag of
    the seed's command line comes back with its value.

    The caller sets ``HF_CKPT``, ``TORCH_DIST``, ``SFT_DATA`` and ``PROFILE_DIR``
    as for the seed. The seed writes its entry point as ``<slime entry
    module>``; unless ``entry_module`` is given the script reads it from
    ``SLIME_ENTRY_MODULE`` and stops with a message when that is unset.

    Args:
        model: The model.
        cluster: The GPUs: ``--actor-num-nodes`` and ``--actor-num-gpus-per-node``.
        workload: Sequence length and global batch.
        layout: The layout.
        extra_env: More environment variables, exported after the seed's four;
            values are literal (they are quoted for the shell).
        num_rollout: ``--num-rollout``: optimizer steps (20 in the seed).
        entry_module: The slime module to run with ``python3 -m``.

    Returns:
        The script's text (bash).

    Raises:
        TunerError: as :func:`layout_args`, if the world size is not the
            cluster's GPU count, an extra variable name is not a shell name, or
            ``num_rollout`` is below 1.
    """
    _check(layout, model, workload, cluster)
    if num_rollout < 1:
        raise TunerError(f"num_rollout must be at least 1, got {num_rollout}")
    env = _env(extra_env)
    entry = shlex.quote(entry_module) if entry_module else '"${SLIME_ENTRY_MODULE:?set SLIME_ENTRY_MODULE to the slime entry module}"'
    gbs = str(workload.global_batch_size)
    out: list[str] = [
        f"# slime: {model.name} on {cluster.num_gpus} {cluster.gpu.name} ({cluster.num_nodes} x {cluster.gpus_per_node}), "
        f"{layout.label}",
        *_comment(_summary(layout, model, workload)),
        "# Set HF_CKPT, TORCH_DIST, SFT_DATA and PROFILE_DIR (and SLIME_ENTRY_MODULE) first.",
        "NVLINK_COUNT=${NVLINK_COUNT:-$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)}",
        "",
    ]
    for k, v in env.items():
        out.append(f"export {k}={v if k in SEED_ENV and SEED_ENV[k] == v else shlex.quote(v)}")
    out += ["", _bash_array("MODEL_ARGS", model_args(model)).rstrip("\n"), ""]
    if model.is_moe and layout.dispatcher == Dispatcher.allgather:
        out.append("# The layout's dispatcher is allgather; slime rewrites allgather to alltoall, so alltoall is asked for.")
    groups: list[Sequence[str]] = [
        ("--actor-num-nodes", str(cluster.num_nodes)),
        ("--actor-num-gpus-per-node", str(cluster.gpus_per_node)),
        ('"${MODEL_ARGS[@]}"',),
        ("--hf-checkpoint", '"$HF_CKPT"'),
        ("--ref-load", '"$TORCH_DIST"'),
        ("--rollout-function-path", "pretokenized_sft_rollout.generate_rollout"),
        ("--prompt-data", '"$SFT_DATA"'),
        ("--input-key", "messages"),
        ("--metadata-key", "metadata"),
        ("--num-rollout", str(num_rollout)),
        ("--rollout-batch-size", gbs),
        ("--global-batch-size", gbs),
        ("--loss-type", "sft_loss"),
        ("--calculate-per-token-loss",),
        ("--disable-compute-advantages-and-returns",),
        ("--debug-train-only",),
        ("--seq-length", str(workload.seq_length)),
    ]
    q = [[shlex.quote(x) for x in g] for g in _group_flags(_parallel_args(layout, model) + _recompute_args(layout))]
    groups += q
    groups += [("--use-dynamic-batch-size",), ("--max-tokens-per-gpu", str(_max_tokens_per_gpu(layout, workload)))]
    groups += list(_OPTIMIZER_LINES)
    groups += _group_flags(_optimizer_layout_args(layout))
    groups += list(_MISC_LINES)
    prec = _precision_args(workload, "slime")
    if prec:
        groups.append(prec)
    groups += [("--distributed-timeout-minutes", "30"), ("--tensorboard-dir", '"$PROFILE_DIR"')]
    disp = _dispatcher_args(layout, model, "slime")
    if disp:
        groups.append(disp)
    pls = _pipeline_layout_string(layout, model)
    if pls is not None:
        groups.append(("--pipeline-model-parallel-layout", shlex.quote(pls)))
    lines = _command_lines(groups)
    out.append(f"python3 -m {entry} --async \\")
    out += [f"  {line} \\" for line in lines[:-1]] + [f"  {lines[-1]}"]
    return "\n".join(out) + "\n"


def _env(extra_env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(SEED_ENV)
    for k, v in (extra_env or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise TunerError(f"extra_env: {k!r} is not a shell variable name")
        env[k] = str(v)
    return env


# --------------------------------------------------------------------------- descriptions


def _expand_layout(s: str) -> list[str]:
    """Stages of a ``--pipeline-model-parallel-layout`` string, in execution order.

    Megatron's grammar (``PipelineParallelLayerLayout.parse_str_to_list``):
    commas are cosmetic, ``(...)*n`` repeats a group, ``x*n`` one character.
    """
    s = s.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return s.split("|")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _and(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _stage_content(stage: str) -> str:
    parts: list[str] = []
    for ch in dict.fromkeys(stage):  # order of first appearance
        n = stage.count(ch)
        parts.append(
            {"E": "the embedding", "L": "the loss"}.get(ch)
            or (_plural(n, "layer") if ch == "t" else _plural(n, "MTP layer"))
        )
    return _and(parts) or "nothing"


def _ranks_phrase(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + _and([str(r) for r in ranks])


def _rank_layers(stages: Sequence[str], pp: int) -> list[int]:
    counts = [0] * pp
    for i, st in enumerate(stages):
        counts[i % pp] += st.count("t")
    return counts


def _layout_note(pls: str, layout: Layout, model: ModelSpec) -> str:
    """The seed's explanation of a layout string, e.g. "cuts the 62 layers into 32 virtual stages, ..."."""
    stages = _expand_layout(pls)
    n, pp = len(stages), layout.pp
    vpp = n // pp
    what = f"the {model.num_layers} layers"
    if model.mtp_num_layers:
        what += f" and {_plural(model.mtp_num_layers, 'MTP layer')}"
    head = f"`--pipeline-model-parallel-layout '{pls}'` cuts {what} into "
    head += f"{n} virtual stages, {vpp} per pipeline rank: " if vpp > 1 else f"{n} pipeline stages, one per rank: "
    runs: list[list[Any]] = []  # [content, first index, count]
    for i, st in enumerate(stages):
        if runs and runs[-1][0] == st:
            runs[-1][2] += 1
        else:
            runs.append([st, i, 1])
    if len(runs) == 3 and runs[0][2] == 1 and runs[2][2] == 1:
        k = runs[1][2]
        k_words = "one" if k == 1 else str(k)
        body = (
            f"the first holds {_stage_content(runs[0][0])}, the last {_stage_content(runs[2][0])}, "
            f"and the {k_words} in between {_stage_content(runs[1][0])}{'' if k == 1 else ' each'}"
        )
    else:
        parts = []
        for content, i, c in runs:
            if c == 1:
                parts.append(f"stage {i} holds {_stage_content(content)}")
            else:
                parts.append(f"stages {i}-{i + c - 1} hold {_stage_content(content)} each")
        body = "; ".join(parts)
    counts = _rank_layers(stages, pp)
    groups: dict[int, list[int]] = {}
    for r, c in enumerate(counts):
        groups.setdefault(c, []).append(r)
    if len(groups) == 1:
        tail = f"so every rank holds {_plural(counts[0], 'layer')}"
    else:
        major = max(groups, key=lambda c: (len(groups[c]), c))
        if len(groups[major]) == 1:
            tail = "so " + _and([f"{_ranks_phrase([r])} holds {_plural(c, 'layer')}" for r, c in enumerate(counts)])
        else:
            minor = [(c, rs) for c, rs in groups.items() if c != major]
            bits = []
            for j, (c, rs) in enumerate(minor):
                verb = "holds" if len(rs) == 1 else "hold"
                bits.append(f"{_ranks_phrase(rs)} {verb} {c} layers" if j == 0 else f"{_ranks_phrase(rs)} {c}")
            tail = "so " + _and([*bits, f"the others {major}"])
    return f"{head}{body}, {tail}."


def _pp_phrase(layout: Layout, model: ModelSpec, pls: str | None) -> str:
    if pls is None:
        return f"PP {layout.pp}"
    counts = _rank_layers(_expand_layout(pls), layout.pp)
    if len(set(counts)) == 1:
        return f"PP {layout.pp}"
    first, last, mid = counts[0], counts[-1], counts[1:-1]
    if mid and len(set(mid)) > 1:
        return f"PP {layout.pp} (layers per stage {', '.join(map(str, counts))})"
    others = f", the others {mid[0]}" if mid else ""
    if first == last:
        return f"PP {layout.pp} (first and last stage {first} layers{others})"
    if mid and first == mid[0]:
        return f"PP {layout.pp} (last stage {last} layers{others})"
    if mid and last == mid[0]:
        return f"PP {layout.pp} (first stage {first} layers{others})"
    return f"PP {layout.pp} (first stage {first} layers, last stage {last}{others})"


def _summary(layout: Layout, model: ModelSpec, workload: Workload, pls: str | None = None) -> str:
    """One sentence in the seed's style (``layout.summary``)."""
    if pls is None:
        pls = _pipeline_layout_string(layout, model)
    tp = f"TP {layout.tp}" + (" with sequence parallelism" if layout.sequence_parallel and layout.tp > 1 else "")
    degrees = [tp, _pp_phrase(layout, model, pls)]
    if layout.vpp > 1:
        degrees.append(f"VPP {layout.vpp}")
    degrees.append(f"CP {layout.cp}")
    if model.is_moe:
        degrees += [f"EP {layout.ep}", f"ETP {layout.etp}"]
    degrees.append(f"DP {layout.dp}")
    mbs = layout.micro_batch_size
    rows = f"{_WORDS.get(mbs, str(mbs))} {workload.seq_length:,}-token row{'' if mbs == 1 else 's'} per microbatch"
    if layout.cp > 1:
        rows += f" ({_max_tokens_per_gpu(layout, workload):,} tokens per GPU)"
    g = layout.recompute_granularity
    if g == RecomputeGranularity.full:
        rec = f"full recompute ({layout.recompute_method.value}, {_plural(layout.recompute_num_layers, 'layer')})"
    elif g == RecomputeGranularity.selective:
        rec = f"selective recompute ({', '.join(layout.recompute_modules or ('core_attn',))})"
    else:
        rec = "no recompute"
    opt = "distributed optimizer" if layout.use_distributed_optimizer else "non-distributed optimizer"
    if layout.use_precision_aware_optimizer:
        opt = "precision-aware " + opt
    low = [n for n, d in (("exp_avg", layout.exp_avg_dtype), ("exp_avg_sq", layout.exp_avg_sq_dtype)) if d != "fp32"]
    if low:
        opt += f" with bf16 {' and '.join(low)}"
    if layout.optimizer_offload_fraction > 0:
        overlap = ", overlapped copies" if layout.overlap_cpu_optimizer_d2h_h2d else ""
        off = f"CPU optimizer offload (fraction {float(layout.optimizer_offload_fraction)}{overlap})"
    else:
        off = "no offload"
    parts = [", ".join(degrees), rows, rec, opt, off]
    if model.is_moe:
        d = layout.dispatcher
        backend = {"deepep": "DeepEP", "hybridep": "HybridEP"}.get(d.moe_flex_dispatcher_backend or "")
        parts.append(f"flex dispatcher with {backend}" if backend else f"{d.value} dispatcher")
    return "; ".join(parts)


# --------------------------------------------------------------------------- recipe


def _num(x: float, digits: int) -> float:
    return round(float(x), digits)


def _sig(x: float, n: int = 3) -> float:
    return float(f"{float(x):.{n}g}")


def _min_megatron_core(layout: Layout, model: ModelSpec) -> tuple[str, list[str]]:
    """Oldest megatron-core release known to accept the exported flags, with the reasons."""
    need = [("0.14.0", "--pipeline-model-parallel-layout, --use-precision-aware-optimizer and the flags used")]
    if layout.tp > model.num_query_groups:
        need.append(("0.16.0", f"TP {layout.tp} above the {model.num_query_groups} query groups (TP % groups == 0 since 0.16)"))
    if layout.ep > 1 and layout.tp > 1 and not layout.sequence_parallel:
        need.append(("0.15.0", "EP and TP without sequence parallelism (an error before 0.15)"))
    if layout.dispatcher.moe_flex_dispatcher_backend and model.is_moe:
        # core 0.14 had only --moe-enable-deepep; --moe-flex-dispatcher-backend {deepep,hybridep}
        # arrived with HybridEP (megatron/core/transformer/moe/README.md, core 0.15).
        need.append(("0.15.0", f"--moe-flex-dispatcher-backend {layout.dispatcher.moe_flex_dispatcher_backend}"))
    version = max((v for v, _ in need), key=lambda v: tuple(int(x) for x in v.split(".")))
    return version, [w for _, w in need]


def _date(value: Any) -> _dt.date:
    if isinstance(value, _dt.datetime):
        return value.date()
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value)
        except ValueError:
            raise TunerError(f"measurement date {value!r} is not YYYY-MM-DD") from None
    return _dt.date.today()


def measurement_from_row(row: Mapping[str, Any], layout: Layout) -> Measurement | None:
    """The :class:`Measurement` of a study's trial row (from :func:`tuner.study.trial_rows`), or None if it was predicted."""
    from launch.base import Measurement

    if row.get("source") != "measured":
        return None
    return Measurement(
        layout=layout,
        source="measured",
        tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        peak_bytes=float(row["peak_gib"]) * GIB,
        step_times_s=tuple(float(x) for x in row.get("step_times_s", ())),
        losses=tuple(float(x) for x in row.get("losses", ())),
        log_path=str(row.get("log_path", "")),
        extra={"measured": row.get("measured")},
    )


def _result(measurement: Measurement, model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    tps = float(measurement.tokens_per_s_per_gpu)
    if not tps > 0:
        raise TunerError(f"a measured recipe needs tokens_per_s_per_gpu > 0, got {tps}")
    times = [float(t) for t in measurement.step_times_s]
    cv = None
    if len(times) >= 2 and statistics.fmean(times) > 0:
        cv = _num(100.0 * statistics.stdev(times) / statistics.fmean(times), 2)
    mfu = 6.0 * model.active_params() * tps / cluster.gpu.peak_flops_bf16
    return {
        "tokens_per_s_per_gpu": _num(tps, 2),
        "usd_per_million_tokens": _sig(cluster.usd_per_gpu_hour * 1e6 / (tps * 3600.0)),
        "step_time_cv_percent": cv,
        "mfu": _num(mfu, 4),
        "measured": _date(measurement.extra.get("measured")),
        "peak_memory_gib": _num(measurement.peak_bytes / GIB, 2),
        "steps": len(times),
    }


def _prediction(estimate: Estimate) -> dict[str, Any]:
    return {
        "tokens_per_s_per_gpu": _num(estimate.tokens_per_s_per_gpu, 2),
        "step_time_s": _sig(estimate.step_time_s, 4),
        "mfu": _num(estimate.mfu, 4),
        "model_tflops_per_gpu": _num(estimate.model_tflops_per_gpu, 1),
        "usd_per_million_tokens": _sig(estimate.usd_per_million_tokens),
        "peak_memory_gib": _num(estimate.peak_bytes / GIB, 2),
        "headroom_gib": _num((estimate.hbm_bytes - estimate.peak_bytes) / GIB, 2),
        "memory_gib": {k: _num(v / GIB, 2) for k, v in estimate.memory.items()},
        "time_s": {k: _sig(v, 4) for k, v in estimate.time.items()},
        "source": _PREDICTION_SOURCE,
        "note": "predicted, not measured",
    }


def _model_name(model: ModelSpec) -> str:
    """A preset's name, or for a ``config.json`` path the folder (checkpoint) name."""
    p = Path(model.name)
    if p.suffix != ".json":
        return model.name
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem


def _layout_section(layout: Layout, model: ModelSpec, workload: Workload, pls: str | None) -> dict[str, Any]:
    f, l = layout.num_layers_in_first_pipeline_stage, layout.num_layers_in_last_pipeline_stage
    g = layout.recompute_granularity
    recompute: dict[str, Any] | None
    if g == RecomputeGranularity.full:
        recompute = {
            "granularity": "full",
            "method": layout.recompute_method.value,
            "num_layers": int(layout.recompute_num_layers),
        }
    elif g == RecomputeGranularity.selective:
        recompute = {"granularity": "selective", "modules": list(layout.recompute_modules or ("core_attn",))}
    else:
        recompute = None
    offload = None
    if layout.optimizer_offload_fraction > 0:
        offload = {
            "optimizer_fraction": float(layout.optimizer_offload_fraction),
            "overlap_cpu_optimizer_d2h_h2d": bool(layout.overlap_cpu_optimizer_d2h_h2d),
        }
    return {
        "label": layout.label,
        "summary": _summary(layout, model, workload, pls),
        "tp": int(layout.tp),
        "pp": int(layout.pp),
        "vpp": int(layout.vpp),
        "cp": int(layout.cp),
        "ep": int(layout.ep),
        "etp": int(layout.etp),
        "dp": int(layout.dp),
        "sequence_parallel": bool(layout.sequence_parallel and layout.tp > 1),
        "layer_split": {"first": f or None, "last": l or None} if (f or l) and layout.pp > 1 else None,
        "pipeline_model_parallel_layout": pls,
        "max_tokens_per_gpu": _max_tokens_per_gpu(layout, workload),
        "rows_per_microbatch": int(layout.micro_batch_size),
        "recompute": recompute,
        "offload": offload,
        "dispatcher": layout.dispatcher.value if model.is_moe else None,
        "optimizer": {
            "distributed": bool(layout.use_distributed_optimizer),
            "precision_aware": bool(layout.use_precision_aware_optimizer),
            "exp_avg_dtype": layout.exp_avg_dtype,
            "exp_avg_sq_dtype": layout.exp_avg_sq_dtype,
        },
    }


def recipe_dict(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    estimate: Estimate | None = None,
    measurement: Measurement | None = None,
    study: str = "",
    author: str = "megatron-layout-tuner",
    author_url: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    correctness: Mapping[str, Any] | None = None,
    extra_notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The recipe for ``layout``, with the seed's fields and key order.

    ``status`` is ``predicted`` unless ``measurement`` has ``source ==
    "measured"``: then ``measured`` with a ``result`` section, or ``failed`` when
    the trial failed (its kind and log go to ``notes``). It is ``verified`` only
    when it is measured and ``correctness`` (the block of ``tune verify``,
    :func:`tuner.verify.correctness_block`) says ``pass``.
    ``prediction`` holds the cost model's ``estimate`` (or null), ``run`` the
    :func:`slime_script`, ``notes`` the pipeline layout explained in the seed's
    words and what the user must provide.

    Result fields: tokens/s/GPU; $/1M tokens at ``cluster.usd_per_gpu_hour``;
    the step-time coefficient of variation (sample standard deviation over all
    ``step_times_s`` / mean, %); MFU = 6 N tokens/s / dense bf16 peak with N =
    ``model.active_params()`` (the seed's convention); the date
    (``measurement.extra["measured"]``, else today).

    Args:
        model: The model.
        cluster: The GPUs.
        workload: The workload.
        layout: The layout.
        estimate: The cost model's estimate for ``layout``.
        measurement: A trial's measurement of ``layout``.
        study: Name of the study that chose the layout (written when given).
        author: ``author.name``.
        author_url: ``author.url``.
        extra_env: More environment variables for the run script.
        correctness: The ``correctness`` block (default: "not run" with how to run it).
        extra_notes: More ``notes``, after the status notes (e.g. the measured trials within noise of this one).

    Returns:
        A plain dict (str, int, float, bool, None, list, dict, date) in the
        seed's key order; :func:`dump_recipe` writes it.

    Raises:
        TunerError: as :func:`slime_script`, or if ``estimate`` or
            ``measurement`` belongs to another layout.
    """
    if estimate is not None and estimate.layout != layout:
        raise TunerError(f"the estimate is for {estimate.layout.label}, not for {layout.label}")
    if measurement is not None and measurement.layout != layout:
        raise TunerError(f"the measurement is for {measurement.layout.label}, not for {layout.label}")
    run = slime_script(model, cluster, workload, layout, extra_env=extra_env)
    pls = _pipeline_layout_string(layout, model)

    status, result, failure_note = "predicted", None, None
    if measurement is not None and measurement.source == "measured":
        if measurement.failure.value != "none":
            status = "failed"
            failure_note = f"The measured trial failed ({measurement.failure.value})" + (
                f"; log: {measurement.log_path}" if measurement.log_path else ""
            )
        else:
            status, result = "measured", _result(measurement, model, cluster)
    if status == "measured" and correctness is not None and correctness.get("result") == "pass":
        status = "verified"

    core, core_why = _min_megatron_core(layout, model)
    stack_note = f"megatron-core >= {core}: {'; '.join(core_why)}."
    if model.qk_layernorm_full_dim:
        stack_note += " Needs slime's slime_plugins (MiniMax-M2 layer spec) importable, also under Megatron-LM."

    author_d: dict[str, Any] = {"name": author}
    if author_url:
        author_d["url"] = author_url

    notes: list[str] = []
    if status == "predicted":
        notes.append("Predicted by the analytical cost model, not measured: run it (`tune` trials) before relying on the numbers.")
    if failure_note:
        notes.append(failure_note + ".")
    notes.extend(str(n) for n in extra_notes)
    if pls is not None:
        notes.append(_layout_note(pls, layout, model))
    if model.is_moe and layout.dispatcher == Dispatcher.allgather:
        notes.append("slime rewrites the allgather dispatcher to alltoall (it needs variable sequence lengths), so `run` asks for alltoall.")
    if model.qk_layernorm_full_dim:
        notes.append(
            "MODEL_ARGS follow slime's scripts/models/minimax-m2.sh: its own layer spec "
            "(`--spec slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec`, full-width q and k norm) and router flags."
        )
    if not layout.use_distributed_optimizer:
        notes.append("slime always turns the distributed optimizer on; the layout's non-distributed optimizer holds for Megatron-LM only.")
    if model.is_moe and layout.dispatcher == Dispatcher.flex_deepep and layout.etp * layout.ep > cluster.gpus_per_node:
        notes.append(
            f"The EP group ({layout.ep} ranks) spans nodes, so DeepEP's inter-node kernels carry the tokens: they need RDMA NICs "
            "that DeepEP's NVSHMEM transport supports (InfiniBand / RoCE); check your network before relying on this layout."
        )
    notes.append(
        "`run` expects HF_CKPT, TORCH_DIST, SFT_DATA, PROFILE_DIR and SLIME_ENTRY_MODULE. For Megatron-LM, "
        "`source megatron_args.sh` and pass \"${MEGATRON_ARGS[@]}\" to pretrain_gpt.py with your data arguments."
    )

    recipe: dict[str, Any] = {
        "schema_version": 1,
        "model": _model_name(model),
        "gpu": {
            "type": cluster.gpu.name,
            "memory_gb": math.ceil(cluster.gpu.hbm_bytes / GIB),
            "count": int(cluster.num_gpus),
            "per_node": int(cluster.gpus_per_node),
        },
        "author": author_d,
        "status": status,
    }
    if study:
        recipe["study"] = study
    recipe |= {
        "stack": {"framework": _STACK_FRAMEWORK, "megatron_core": f">={core}", "note": stack_note},
        "workload": {
            "row_tokens": int(workload.seq_length),
            "rows": workload.dataset,
            "global_batch": int(workload.global_batch_size),
            "precision": str(workload.precision),
        },
        "layout": _layout_section(layout, model, workload, pls),
        "result": result,
        "prediction": _prediction(estimate) if estimate is not None else None,
        "correctness": dict(correctness) if correctness is not None else {"result": "not run", "note": _CORRECTNESS_NOTE},
        "env": _env(extra_env),
        "patches": [],
        "run": run,
        "notes": notes,
    }
    return recipe


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings as ``|`` blocks and no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    if "\n" in s:
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", s)


_Dumper.add_representer(str, _represent_str)


def dump_recipe(recipe: Mapping[str, Any]) -> str:
    """The recipe as YAML text, keys in the dict's order, behind a comment header.

    Args:
        recipe: A recipe from :func:`recipe_dict` (or a loaded one).

    Returns:
        YAML text that ``yaml.safe_load`` turns back into ``recipe``.

    Raises:
        TunerError: if the recipe holds a value YAML cannot represent safely.
    """
    try:
        body = yaml.dump(dict(recipe), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    except yaml.YAMLError as e:
        raise TunerError(f"recipe cannot be written as YAML: {e}") from None
    return _RECIPE_HEADER + body


def write_recipe(path: str | Path, recipe: Mapping[str, Any]) -> Path:
    """Validate ``recipe`` and write it as YAML to ``path`` (parents created).

    Args:
        path: Where to write, e.g. ``results/<study>/recipe.yaml``.
        recipe: The recipe.

    Returns:
        The path written.

    Raises:
        TunerError: if the recipe does not validate (:func:`validate_recipe`)
            or the file cannot be written.
    """
    validate_recipe(recipe)
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {p.name}\n" + dump_recipe(recipe))
    except OSError as e:
        raise TunerError(f"cannot write recipe {p}: {e}") from None
    return p


# --------------------------------------------------------------------------- schema


@lru_cache(maxsize=1)
def recipe_schema() -> dict[str, Any]:
    """The recipe JSON Schema (draft 2020-12), ``launch/schema/recipe.schema.json``.

    Returns:
        The schema as a dict (cached).

    Raises:
        FileNotFoundError: if the package was installed without its schema file.
    """
    text = resources.files("launch").joinpath("schema/recipe.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _jsonable(x: Any) -> Any:
    """YAML values as JSON sees them: dates become ISO strings, tuples lists."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (_dt.date, _dt.datetime)):
        return x.isoformat()
    return x


def validate_recipe(recipe: Mapping[str, Any]) -> None:
    """Check ``recipe`` against the recipe schema and the layout's arithmetic.

    Besides the schema, TP*PP*CP*DP and a multiple of ETP*EP*PP must equal the
    GPU count.

    Args:
        recipe: A recipe dict (from :func:`recipe_dict` or ``yaml.safe_load``).

    Raises:
        TunerError: listing every problem as ``path: message`` on its own line
            (paths as JSON paths, e.g. ``$.layout.tp``).
    """
    from jsonschema import Draft202012Validator

    doc = _jsonable(recipe)
    validator = Draft202012Validator(recipe_schema())
    lines = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: (e.json_path, e.message)):
        msg = err.message if len(err.message) <= 200 else err.message[:197] + "..."
        lines.append(f"{err.json_path}: {msg}")
    if not lines:
        lay, gpu = doc["layout"], doc["gpu"]
        n = gpu["count"]
        dense = lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"]
        if dense != n:
            lines.append(f"$.layout: tp*pp*cp*dp = {dense} but gpu.count is {n}")
        if n % (lay["etp"] * lay["ep"] * lay["pp"]):
            lines.append(f"$.layout: etp*ep*pp = {lay['etp'] * lay['ep'] * lay['pp']} does not divide gpu.count {n}")
    if lines:
        raise TunerError("recipe does not match launch/schema/recipe.schema.json:\n" + "\n".join(lines))
