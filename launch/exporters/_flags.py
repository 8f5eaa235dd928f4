"""Megatron-LM and slime flags for a layout: the argv every exporter is built from.

Flag names are those of megatron-core 0.16.0rc0 (slime's pin ``1dcf0da``), the same at Megatron-LM HEAD; the seed
recipe (``tests/fixtures/seed_minimax_m2_recipe.yaml``) gives the environment, optimizer and numerics flags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from launch.exporters._shell import group_flags
from specs import NEWEST_MEGATRON_CORE, Cluster, ModelSpec, Precision, RunOptions, Workload, megatron_core_version
from specs.errors import TunerError
from specs.layout import Dispatcher, Layout, RecomputeGranularity

__all__ = ["SEED_ENV", "launch_env", "NO_NAN_CHECK", "OPTIMIZER_HPARAMS", "HPARAM_FLAGS", "EXCLUSIVE_FLAGS",
           "merge_user_args", "MISC_ARGS", "misc_args", "misc_lines", "optimizer_lines", "Framework", "model_args",
           "layout_args", "megatron_args"]

Framework = Literal["megatron", "slime"]

#: The four environment variables of the seed's ``run:`` block (values are shell text).
SEED_ENV: dict[str, str] = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "NCCL_NVLS_ENABLE": '$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)',
}


def launch_env(argv: Sequence[str], options: RunOptions | None, base: Mapping[str, str] = SEED_ENV) -> dict[str, str]:
    """``base`` as Megatron-LM's ``validate_args`` accepts it beside the arguments ``argv`` on megatron-core
    ``options.megatron_core`` (None: the newest):

    - no ``CUDA_DEVICE_MAX_CONNECTIONS`` with ``--use-megatron-fsdp`` or ``--use-torch-fsdp2`` (asserted not 1:
      ``megatron/training/arguments.py`` l.1048-1049 and l.1166-1167 at d98e8a64, l.622-623 and l.687-688 at 1dcf0da);
    - CUDA graphs before 0.16: expandable segments off (asserted for every impl: l.1198-1201 at core_v0.15.0);
    - ``--cuda-graph-impl transformer_engine`` (or ``--external-cuda-graph``) from 0.16: ``NCCL_GRAPH_REGISTER=0``,
      which keeps expandable segments (asserted: l.1961-1968 at d98e8a64, l.1270-1277 at 1dcf0da).

    Values are shell text, as in :data:`SEED_ENV`."""
    env = dict(base)
    if {"--use-megatron-fsdp", "--use-torch-fsdp2"} & set(argv):
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    impl = "none"
    for i, a in enumerate(argv):
        if a == "--cuda-graph-impl" and i + 1 < len(argv):
            impl = argv[i + 1]
        elif a in ("--enable-cuda-graph", "--external-cuda-graph"):  # 0.16 maps them to local / transformer_engine
            impl = "local" if a == "--enable-cuda-graph" else "transformer_engine"
    release = megatron_core_version(options.megatron_core if options is not None else NEWEST_MEGATRON_CORE)
    if impl != "none" and release < (0, 16):
        if "PYTORCH_CUDA_ALLOC_CONF" in env:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    elif impl == "transformer_engine":
        env["NCCL_GRAPH_REGISTER"] = "0"
    return env


#: The seed's optimizer hyperparameters, two lines as its ``run:`` block writes them.
_OPTIMIZER_LINES: tuple[tuple[str, ...], ...] = (
    ("--optimizer", "adam", "--lr", "1e-5", "--lr-decay-style", "cosine", "--min-lr", "1e-6"),
    ("--lr-warmup-fraction", "0.1", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98"),
)
OPTIMIZER_HPARAMS: tuple[str, ...] = tuple(a for line in _OPTIMIZER_LINES for a in line)


def optimizer_lines(options: RunOptions | None) -> tuple[tuple[str, ...], ...]:
    """:data:`_OPTIMIZER_LINES` with the run's ``--optimizer`` (``options.optimizer``; None: the seed's adam), so that a
    command that writes them writes ``--optimizer`` once (:func:`options_args` with ``hparams``)."""
    if options is None:
        return _OPTIMIZER_LINES
    return tuple(tuple(options.optimizer if i and line[i - 1] == "--optimizer" else a for i, a in enumerate(line))
                 for line in _OPTIMIZER_LINES)

#: The seed's numerics flags (dropout off, fp32 gradient accumulation and softmax, flash attention).
_MISC_LINES: tuple[tuple[str, ...], ...] = (
    ("--attention-dropout", "0.0", "--hidden-dropout", "0.0"),
    ("--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"),
    ("--attention-backend", "flash"),
)
MISC_ARGS: tuple[str, ...] = tuple(a for line in _MISC_LINES for a in line)


def misc_lines(model: ModelSpec, options: RunOptions | None = None) -> tuple[tuple[str, ...], ...]:
    """:data:`_MISC_LINES` for ``model``; ``--attention-backend fused`` when its softmax is not vanilla (GPT-OSS's
    sinks): TE disables FlashAttention for any other ``softmax_type`` (transformer_engine/pytorch/attention/
    dot_product_attention/utils.py, ``get_attention_backend``); cuDNN's fused attention runs sinks."""
    lines = _MISC_LINES
    if options is not None and not options.grad_reduce_in_fp32:  # bf16 main gradients (--grad-reduce-in-bf16)
        bf16 = ("--grad-reduce-in-bf16", "--attention-softmax-in-fp32")
        lines = tuple(bf16 if line == _MISC_LINES[1] else line for line in lines)
    if model.softmax_type == "vanilla":
        return lines
    flash = ("--attention-backend", "flash")
    return tuple(("--attention-backend", "fused") if line == flash else line for line in lines)


def misc_args(model: ModelSpec, options: RunOptions | None = None) -> tuple[str, ...]:
    """:func:`misc_lines` as one argv tuple."""
    return tuple(a for line in misc_lines(model, options) for a in line)


#: Megatron-LM's NaN check turned off: asserted with a whole-iteration CUDA graph (``--cuda-graph-impl full_iteration``,
#: or ``local`` with ``--cuda-graph-scope full_iteration``; ``megatron/training/arguments.py`` l.1235-1237 at d98e8a64,
#: l.724-727 at 1dcf0da).
NO_NAN_CHECK = "--no-check-for-nan-in-loss-and-grad"


def options_args(model: ModelSpec, workload: Workload, options: RunOptions | None, layout: Layout, *,
                 hparams: bool = False) -> list[str]:
    """The run options' arguments other than Megatron-LM's defaults, less those the model's own arguments write and
    ``--tp-comm-overlap`` at TP 1 (Megatron-LM's ``validate_args`` refuses it without sequence parallelism), with
    :data:`NO_NAN_CHECK` beside a whole-iteration CUDA graph; with ``hparams`` (the command writes
    :func:`optimizer_lines`, which carry it) less ``--optimizer``."""
    if options is None:
        return []
    from specs.stacks import run_option_args

    skip = (*model.extra_megatron_args, *(("--tp-comm-overlap",) if layout.tp == 1 else ()))
    a = run_option_args(options, precision=workload.precision.value, skip=skip)
    if options.cuda_graph_effective_impl == "full_iteration":
        a.append(NO_NAN_CHECK)
    if hparams and "--optimizer" in a:
        i = a.index("--optimizer")
        del a[i:i + 2]
    return a


#: slime's own arguments (its RL loop, rollout engine and Ray placement; THUDM/slime ``slime/utils/arguments.py``):
#: Megatron-LM's ``pretrain_gpt.py`` refuses them, so ``megatron_args.sh`` leaves them out of a slime launch's
#: arguments.
SLIME_ONLY_ARGS = frozenset("""
--async --actor-num-nodes --actor-num-gpus-per-node --colocate --hf-checkpoint --ref-load --rollout-function-path
--prompt-data --input-key --label-key --metadata-key --tool-key --apply-chat-template --num-rollout --rollout-batch-size
--rollout-shuffle --rollout-max-response-len --rollout-max-prompt-len --rollout-temperature --rollout-top-p
--rollout-num-gpus-per-engine --rollout-num-gpus --n-samples-per-prompt --over-sampling-batch-size --balance-data
--num-steps-per-rollout --loss-type --disable-compute-advantages-and-returns --debug-train-only --advantage-estimator
--use-kl-loss --kl-loss-coef --kl-loss-type --kl-coef --entropy-coef --eps-clip --eps-clip-high
--sglang-mem-fraction-static --sglang-ep-size --use-dynamic-batch-size --max-tokens-per-gpu --use-wandb --wandb-group
--model-name """.split())

#: The tool's own training hyperparameters: the seed's optimizer and schedule (:data:`OPTIMIZER_HPARAMS`) and its
#: dropout. A command that carries the user's launch arguments (``tune --from``) writes none of them: that launch is
#: the user's training, and Megatron-LM's defaults stand where it sets nothing.
HPARAM_FLAGS = frozenset([a for a in OPTIMIZER_HPARAMS if a.startswith("--")]
                         + ["--attention-dropout", "--hidden-dropout"])

#: Megatron-LM flags a launch sets at most one of (``megatron/training/arguments.py``, ``validate_args``: "can only
#: specify one of lr-warmup-fraction and lr-warmup-iters", iteration- or sample-based training, one data source).
EXCLUSIVE_FLAGS: tuple[frozenset[str], ...] = (
    frozenset({"--lr-warmup-fraction", "--lr-warmup-iters", "--lr-warmup-samples"}),
    frozenset({"--train-iters", "--train-samples"}),
    frozenset({"--lr-decay-iters", "--lr-decay-samples"}),
    frozenset({"--data-path", "--mock-data", "--train-data-path", "--data-args-path", "--per-split-data-args-path"}),
    frozenset({"--fp16", "--bf16"}),
)


#: The flags a layout decides (:func:`layout_args` writes them, or leaves Megatron's default by writing none), with
#: their older spellings (``--recompute-activations`` is selective recompute, ``--moe-enable-deepep`` the flex
#: dispatcher, the ``--decoder-*-pipeline-num-layers`` and virtual-stage flags a pipeline split that Megatron refuses
#: beside ``--pipeline-model-parallel-layout``): a user's argument among them never reaches an exported command, or it
#: would undo the tuned layout.
LAYOUT_FLAGS = frozenset("""
--micro-batch-size --tensor-model-parallel-size --sequence-parallel --pipeline-model-parallel-size
--context-parallel-size --expert-model-parallel-size --expert-tensor-parallel-size --recompute-granularity
--recompute-method --recompute-num-layers --recompute-modules --recompute-activations --use-distributed-optimizer
--optimizer-cpu-offload --optimizer-offload-fraction --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
--exp-avg-dtype --exp-avg-sq-dtype --moe-token-dispatcher-type --moe-flex-dispatcher-backend --moe-enable-deepep
--pipeline-model-parallel-layout --decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers
--num-layers-per-virtual-pipeline-stage --num-virtual-stages-per-pipeline-rank
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
""".split())


def flags_taken(flags: Sequence[str] | set[str]) -> set[str]:
    """``flags`` and every flag that cannot stand beside one of them (:data:`EXCLUSIVE_FLAGS`)."""
    out = set(flags)
    for s in EXCLUSIVE_FLAGS:
        if out & s:
            out |= s
    return out


def merge_user_args(tuned: Sequence[Sequence[str]], free: Sequence[Sequence[str]],
                    user_args: Sequence[str]) -> tuple[list[list[str]], list[list[str]]]:
    """Join the tool's flag groups with the user's kept launch arguments (``tune --from``).

    ``tuned`` groups stand; a user's group of the same flag, one that excludes it or one in :data:`LAYOUT_FLAGS` is
    left out. A ``free`` group is left out when the user sets its flag or one that excludes it. Returns (the ``free``
    groups kept, the user's groups kept)."""
    tuned_flags = flags_taken({str(g[0]) for g in tuned if g}) | LAYOUT_FLAGS
    written = [str(a) for g in (*tuned, *free) for a in g]
    user = [g for g in group_flags(kept_user_args(user_args, written)) if g[0] not in tuned_flags]
    taken = flags_taken({g[0] for g in user})
    return [list(g) for g in free if g and str(g[0]) not in taken], user


#: The flag groups the exported scripts write from their own variables (run_slime.sh's RUN_ARGS): a launch read back
#: from an exported ``recipe.yaml`` carries them, and keeping them would repeat them at every round trip.
SCRIPT_OWN_GROUPS = frozenset({
    ("--load", "$SAVE_DIR"), ("--save", "$SAVE_DIR"), ("--save-interval", "$SAVE_INTERVAL"),
    ("--num-epoch", "$NUM_EPOCH"), ("--num-rollout", "$NUM_ROLLOUT"), ("--tensorboard-dir", "$TENSORBOARD_DIR"),
    ("--rollout-shuffle",),
    ("--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout"),
})


def kept_user_args(argv: Sequence[str], written: Sequence[str]) -> list[str]:
    """The user's arguments less each flag group ``written`` already has with the same values and
    :data:`SCRIPT_OWN_GROUPS` (argparse: a later flag wins, so the user's differing values stand)."""
    have = {tuple(a.strip('"') for a in g) for g in group_flags(written)} | SCRIPT_OWN_GROUPS  # "$X" written is $X
    return [a for g in group_flags(argv) if tuple(a.strip('"') for a in g) not in have for a in g]


#: slime's MiniMax-M2 layer spec (scripts/models/minimax-m2.sh): full-width QK RMSNorm.
_MINIMAX_M2_SPEC = ("--spec", "slime_plugins.models.minimax_m2", "get_minimax_m2_layer_spec")


# --------------------------------------------------------------------------- checks


def _check(layout: Layout, model: ModelSpec, workload: Workload, cluster: Cluster | None = None) -> None:
    """Reject a layout that cannot be written as a consistent command line (the Megatron rules an export depends on;
    ``search_spaces`` holds the full set).

    Raises:
        TunerError: world size differs from the cluster's, a degree does not divide it, EP > 1 on a dense model, the
            sequence is not divisible by CP, VPP without PP, or optimizer flags break Megatron's arguments.py rules.
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
    """``moe_layer_freq`` as Megatron's run-length list expression, e.g. ``[0]*3+[1]*58``."""
    runs: list[list[int]] = []
    for v in freq:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return "+".join(f"[{v}]*{n}" for v, n in runs)


def _window_skip_expr(full: Sequence[int]) -> str:
    """``--window-attn-skip-freq`` for ``full`` (1 = full attention): Megatron's integer ``N`` when every N-th layer
    is full, else its list expression with 1 = sliding window
    (``megatron/core/transformer/utils.py::is_layer_window_attention``)."""
    n_layers = len(full)
    for n in range(1, n_layers + 1):
        if all(full[i] == (1 if (i + 1) % n == 0 else 0) for i in range(n_layers)):
            return str(n)
    return _layer_freq_expr([1 - int(x) for x in full])


def _flag_num(x: float) -> str:
    """A number as a flag value: ``1e-6`` (not ``1e-06``), ``0.5``, ``5000000``."""
    if float(x).is_integer() and abs(x) >= 1:
        return str(int(x))
    return f"{x:g}".replace("e-0", "e-").replace("e+0", "e+")


#: The first megatron-core release whose Megatron-LM has the ``--yarn-*`` flags and maps them onto a GPT model's config
#: (``megatron/training/argument_utils.py::_apply_yarn_config_from_args``; absent from core_v0.15.0 .. core_v0.18.2).
GPT_YARN_SINCE = (0, 19)


def model_for_release(model: ModelSpec, megatron_core: str | None = None) -> tuple[ModelSpec, str | None]:
    """The model as the commands for ``megatron_core`` (None: the newest) can build it, and why it differs (None when it
    does not): a GPT model's YaRN falls back to plain RoPE before 0.19 or with MTP layers, as Megatron-LM's
    examples/gptoss run it.

    Raises:
        TunerError: ``megatron_core`` is not a release.
    """
    if model.rope_scaling_type != "yarn" or model.is_mla:
        return model, None
    release = megatron_core_version(megatron_core or NEWEST_MEGATRON_CORE)
    if model.mtp_num_layers:
        why = (f"its {model.mtp_num_layers} MTP layer(s): megatron-core allows MTP only with rope or no position "
               "embedding")
    elif release < GPT_YARN_SINCE:
        why = (f"megatron-core {release[0]}.{release[1]} (--megatron-core) has no --yarn-* flags for a GPT model (they "
               "arrived in 0.19)")
    else:
        return model, None
    note = (f"Position embedding: plain RoPE (--position-embedding-type rope), not the model's YaRN (factor "
            f"{model.rope_scaling_factor:g}), because of {why}; this trains and runs, as Megatron-LM's GPT-OSS "
            "examples do, but does not reproduce the Hugging Face checkpoint's positional encoding.")
    return model.replace(rope_scaling_type=""), note


def model_args(model: ModelSpec) -> list[str]:
    """Megatron-LM architecture flags for ``model`` in the order of slime's ``scripts/models/*.sh`` ``MODEL_ARGS`` (for
    MiniMax-M2 flag for flag, with slime's ``--spec`` for its full-width QK norm); the preset's
    ``extra_megatron_args`` last. A GPT model's YaRN needs megatron-core 0.19 (:func:`model_for_release`).

    Raises:
        TunerError: a MoE model has no MoE layer in ``moe_layer_freq``.
    """
    gpt_yarn = model.rope_scaling_type == "yarn" and not model.is_mla  # MLA models take YaRN through their rope type
    a = [*_when(model.qk_layernorm_full_dim, *_MINIMAX_M2_SPEC),
         *_when(not model.add_bias_linear, "--disable-bias-linear"),
         *_when(not model.add_bias_linear and model.add_qkv_bias, "--add-qkv-bias"),
         # megatron-core's TEGroupedMLP asserts "bias_dropout_fusion is not supported in TEGroupedMLP when
         # add_bias_linear=True" (transformer/moe/experts.py); Megatron-LM's GPT-OSS example passes this flag
         *_when(model.add_bias_linear and model.is_moe, "--no-bias-dropout-fusion"),
         "--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
         "--ffn-hidden-size", str(model.ffn_hidden_size or model.moe_ffn_hidden_size),
         "--num-attention-heads", str(model.num_attention_heads),
         *_when(not model.is_mla, "--kv-channels", str(model.kv_channels)),
         *_when(not model.is_mla and model.num_query_groups < model.num_attention_heads, "--group-query-attention",
                "--num-query-groups", str(model.num_query_groups)),
         "--normalization", "RMSNorm", "--position-embedding-type", "yarn" if gpt_yarn else "rope",
         "--norm-epsilon", _flag_num(model.norm_epsilon),
         *_when(model.gated_linear_unit, "--quick-geglu" if model.activation_func == "quick_gelu" else "--swiglu"),
         *_when(model.glu_linear_offset, "--glu-linear-offset", _flag_num(model.glu_linear_offset)),
         *_when(model.activation_func_clamp_value, "--activation-func-clamp-value",
                _flag_num(model.activation_func_clamp_value)),
         *_when(model.softmax_type != "vanilla", "--softmax-type", model.softmax_type),
         *_when(model.window_size, "--window-size", f"{model.window_size - 1},0")]
    if model.window_size and any(model.window_attn_skip_freq[: model.num_layers]):
        a += ["--window-attn-skip-freq", _window_skip_expr(model.window_attn_skip_freq)]
    a += [*_when(model.untie_embeddings_and_output_weights, "--untie-embeddings-and-output-weights"),
          "--vocab-size", str(model.vocab_size), *_rope_args(model, gpt_yarn),
          *_when(model.qk_layernorm, "--qk-layernorm"),
          *_when(model.is_mla, "--multi-latent-attention"),
          *_when(model.is_mla and model.q_lora_rank, "--q-lora-rank", str(model.q_lora_rank)),
          *_when(model.is_mla, "--kv-lora-rank", str(model.kv_lora_rank), "--qk-head-dim", str(model.qk_head_dim),
                 "--qk-pos-emb-head-dim", str(model.qk_pos_emb_head_dim), "--v-head-dim", str(model.v_head_dim)),
          *(_moe_args(model) if model.is_moe else []),
          *_when(model.mtp_num_layers > 0, "--mtp-num-layers", str(model.mtp_num_layers)),
          *model.extra_megatron_args]
    return a


def _when(cond: object, *flag: str) -> list[str]:
    """``flag`` (a flag and its values) when ``cond`` holds, else nothing."""
    return list(flag) if cond else []


def _rope_args(model: ModelSpec, gpt_yarn: bool) -> list[str]:
    """Rotary flags: partial rotary, base, Llama-3 or YaRN scaling (``gpt_yarn``: 0.19's ``--yarn-*``)."""
    yarn = model.rope_scaling_type == "yarn"
    return [
        *_when(model.rotary_percent != 1.0, "--rotary-percent", _flag_num(model.rotary_percent)),
        "--rotary-base", _flag_num(model.rotary_base),
        *_when(model.rope_scaling_type == "llama3", "--use-rope-scaling", "--rope-scaling-factor",
               _flag_num(model.rope_scaling_factor)),
        *_when(yarn, "--rotary-scaling-factor", _flag_num(model.rope_scaling_factor), "--mscale",
               _flag_num(model.rope_scaling_mscale), "--mscale-all-dim", _flag_num(model.rope_scaling_mscale_all_dim)),
        # megatron/training/argument_utils.py::_apply_yarn_config_from_args (megatron-core 0.19) maps these onto the
        # config's yarn_* fields, as Megatron-Bridge's GPT-OSS bridge sets them from config.json
        *_when(yarn and gpt_yarn and model.rope_scaling_original_max_position_embeddings,
               "--yarn-original-max-position-embeddings", str(model.rope_scaling_original_max_position_embeddings)),
        *_when(yarn and gpt_yarn, "--yarn-beta-fast", _flag_num(model.rope_scaling_beta_fast), "--yarn-beta-slow",
               _flag_num(model.rope_scaling_beta_slow),
               f"--{'' if model.rope_scaling_truncate else 'no-'}yarn-correction-range-round-to-int"),
    ]  # fmt: skip


def _moe_args(model: ModelSpec) -> list[str]:
    """The MoE block: experts, expert FFN, top-k, layer frequency, shared experts and the router."""
    if not model.num_moe_layers:
        raise TunerError(f"model {model.name!r} has {model.num_experts} experts but no MoE layer in moe_layer_freq")
    return [
        "--num-experts", str(model.num_experts),
        "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size),
        "--moe-router-topk", str(model.moe_router_topk),
        "--moe-layer-freq", _layer_freq_expr(model.moe_layer_freq),
        *_when(model.moe_shared_expert_intermediate_size > 0, "--moe-shared-expert-intermediate-size",
               str(model.moe_shared_expert_intermediate_size)),
        *_when(model.moe_router_score_function != "softmax", "--moe-router-score-function",
               model.moe_router_score_function),
        *_when(model.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias"),
        *_when(model.moe_router_topk_scaling_factor, "--moe-router-topk-scaling-factor",
               _flag_num(model.moe_router_topk_scaling_factor)),
        *_when(model.moe_router_num_groups, "--moe-router-num-groups", str(model.moe_router_num_groups),
               "--moe-router-group-topk", str(model.moe_router_group_topk)),
        "--moe-router-dtype", "fp32", "--moe-grouped-gemm",
    ]  # fmt: skip


def _pipeline_layout_string(layout: Layout, model: ModelSpec) -> str | None:
    """``--pipeline-model-parallel-layout`` for ``layout``; None when PP is 1.

    Raises:
        TunerError: the layers cannot be split as asked.
    """
    if layout.pp == 1:
        return None
    from search_spaces.pipeline import emit_layout_string  # lazy: another module's work

    try:
        return emit_layout_string(model.num_layers, layout.pp, layout.vpp,
                                  first=layout.num_layers_in_first_pipeline_stage,
                                  last=layout.num_layers_in_last_pipeline_stage, mtp_num_layers=model.mtp_num_layers)
    except TunerError:
        raise
    except ValueError as e:
        raise TunerError(f"pipeline layout for {layout.label}: {e}") from None


def _parallel_args(layout: Layout, model: ModelSpec) -> list[str]:
    return ["--tensor-model-parallel-size", str(layout.tp),
            *_when(layout.sequence_parallel and layout.tp > 1, "--sequence-parallel"),
            "--pipeline-model-parallel-size", str(layout.pp), "--context-parallel-size", str(layout.cp),
            *_when(model.is_moe, "--expert-model-parallel-size", str(layout.ep), "--expert-tensor-parallel-size",
                   str(layout.etp))]


def _recompute(layout: Layout) -> dict[str, Any]:
    """The layout's recompute settings by Megatron's ``recompute_*`` suffix: granularity, method and num_layers (full),
    granularity and modules (selective), none (none)."""
    g = layout.recompute_granularity
    if g == RecomputeGranularity.full:
        return {"granularity": "full", "method": layout.recompute_method.value,
                "num_layers": int(layout.recompute_num_layers)}
    if g == RecomputeGranularity.selective:
        return {"granularity": "selective", "modules": list(layout.recompute_modules or ("core_attn",))}
    return {}


def _recompute_args(layout: Layout) -> list[str]:
    return [a for k, v in _recompute(layout).items()
            for a in (f"--recompute-{k.replace('_', '-')}", *(v if isinstance(v, list) else [str(v)]))]


def _max_tokens_per_gpu(layout: Layout, workload: Workload) -> int:
    return layout.micro_batch_size * workload.seq_length // layout.cp


def _optimizer_layout_args(layout: Layout) -> list[str]:
    offload = layout.optimizer_offload_fraction > 0
    return [*_when(layout.use_distributed_optimizer, "--use-distributed-optimizer"),
            *_when(offload, "--optimizer-cpu-offload", "--optimizer-offload-fraction",
                   str(float(layout.optimizer_offload_fraction))),
            *_when(offload and layout.overlap_cpu_optimizer_d2h_h2d, "--overlap-cpu-optimizer-d2h-h2d"),
            *_when(layout.use_precision_aware_optimizer, "--use-precision-aware-optimizer"),
            *_when(layout.exp_avg_dtype != "fp32", "--exp-avg-dtype", layout.exp_avg_dtype),
            *_when(layout.exp_avg_sq_dtype != "fp32", "--exp-avg-sq-dtype", layout.exp_avg_sq_dtype)]


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


def layout_args(layout: Layout, model: ModelSpec, workload: Workload, *,
                framework: Framework = "megatron") -> list[str]:
    """Parallelism, batch, recompute, optimizer, dispatcher and pipeline-layout flags, in the seed's order.

    The pipeline layout string sets VPP, so no VPP flag is written. slime packs rows by tokens
    (``--use-dynamic-batch-size --max-tokens-per-gpu mbs*seq/cp``) and gets alltoall for allgather (it forces variable
    sequence lengths).

    Raises:
        TunerError: as :func:`_check` and :func:`_pipeline_layout_string`.
    """
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


def megatron_args(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *,
                  options: RunOptions | None = None, user_args: Sequence[str] = ()) -> list[str]:
    """The full Megatron-LM argument list for ``pretrain_gpt.py``, data arguments aside.

    With ``user_args`` (``tune --from``: their training) the tool's hyperparameters (:data:`HPARAM_FLAGS`) are left out
    and the user's arguments follow (:func:`merge_user_args`), slime's own flags dropped.

    Raises:
        TunerError: as :func:`layout_args`, or the world size is not the cluster's GPU count.
    """
    _check(layout, model, workload, cluster)
    if user_args:
        tuned = group_flags([*model_args(model), *layout_args(layout, model, workload, framework="megatron"),
                         *_precision_args(workload, "megatron"), *options_args(model, workload, options, layout)])
        free = group_flags(["--max-position-embeddings", str(workload.seq_length), *misc_args(model, options)])
        free, user = merge_user_args(tuned, [g for g in free if g[0] not in HPARAM_FLAGS], user_args)
        return [a for g in (*tuned, *free, *(g for g in user if g[0] not in SLIME_ONLY_ARGS)) for a in g]
    return [
        *model_args(model),
        *layout_args(layout, model, workload, framework="megatron"),
        "--max-position-embeddings", str(workload.seq_length),
        *_precision_args(workload, "megatron"),
        *(a for line in optimizer_lines(options) for a in line),
        *misc_args(model, options),
        *options_args(model, workload, options, layout, hparams=True),
    ]  # fmt: skip
