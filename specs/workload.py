"""What a step trains on (:class:`Workload`) and the run flags shared by a whole table (:class:`RunOptions`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from specs.errors import TunerError
from specs.precision import Precision
from specs.versions import NEWEST_MEGATRON_CORE, megatron_core_version

#: ``--fp8-recipe`` values of the per-tensor ``fp8`` precision (Megatron-core ``TransformerConfig.fp8_recipe``;
#: ``blockwise`` and ``mxfp8`` are their own :class:`Precision` members).
FP8_RECIPES = ("delayed", "tensorwise")
#: ``--cross-entropy-fusion-impl`` values (megatron/core/models/common/language_module/language_module.py).
CROSS_ENTROPY_IMPLS = ("native", "te")
#: Optimizers the cost model sizes: Adam (``--optimizer adam``) and Megatron's layer-wise distributed Muon
#: (Megatron-Bridge ``optimizer_type="muon"``, ``distributed_muon_with_cosine_annealing``).
OPTIMIZERS = ("adam", "dist_muon")


#: What a step trains (``--task``).
TASKS = ("pretrain", "sft", "lora")
#: The linear layers LoRA can adapt (Megatron-core's module names; Megatron-Bridge's default targets, all four).
LORA_TARGET_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")



@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What one optimizer step trains on."""

    seq_length: int = 8192
    """Tokens per row (``--seq-length``)."""
    global_batch_size: int = 128
    """Rows per optimizer step (``--global-batch-size``)."""
    precision: Precision = Precision.bf16
    dataset: str = "synthetic fixed-length rows"
    task: str = "pretrain"
    """``pretrain``, ``sft`` (full-parameter fine-tuning on packed sequences with the loss masked to the responses: the
    same compute and memory as pretraining at the packed length; only the supervised share of the tokens differs) or
    ``lora`` (frozen base weights with low-rank adapters, :data:`LORA_TARGET_MODULES`)."""
    lora_rank: int = 32
    """LoRA's rank r (Megatron-Bridge ``LoRA.dim``, default 32, ``src/megatron/bridge/peft/lora.py`` l.146 at
    067f987d)."""
    lora_target_modules: tuple[str, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    """The linear layers LoRA adapts (Megatron-Bridge's default ``target_modules``, same file l.143-145)."""

    def __post_init__(self) -> None:
        if self.seq_length <= 0:
            raise TunerError(f"--seq-len must be a positive integer, got {self.seq_length}")
        if self.global_batch_size <= 0:
            raise TunerError(f"--global-batch must be a positive integer, got {self.global_batch_size}")
        if self.task not in TASKS:
            raise TunerError(f"--task {str(self.task)[:40]!r}: accepted {', '.join(TASKS)}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank <= 0:
            raise TunerError(f"--lora-rank must be a positive integer, got {self.lora_rank!r}")
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        bad = [m for m in self.lora_target_modules if m not in LORA_TARGET_MODULES]
        if bad or not self.lora_target_modules:
            raise TunerError(f"--lora-target-modules {(bad[0] if bad else '')[:40]!r}: accepted "
                             f"{', '.join(LORA_TARGET_MODULES)}")
        try:
            object.__setattr__(self, "precision", Precision(self.precision))
        except ValueError:
            accepted = ", ".join(p.value for p in Precision)
            raise TunerError(f"--precision {self.precision!r}: accepted {accepted}") from None

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size

    def on_model(self, mla: bool) -> Workload:
        """This workload on a model with (``mla``) or without multi-latent attention: with it, the default LoRA
        targets less ``linear_qkv``, which MLA does not have (Megatron-Bridge matches ``target_modules`` by module
        name, so its default adapts ``linear_proj``, ``linear_fc1`` and ``linear_fc2`` there); otherwise unchanged."""
        if not (mla and self.task == "lora" and self.lora_target_modules == LORA_TARGET_MODULES):
            return self
        return dataclasses.replace(self, lora_target_modules=tuple(m for m in LORA_TARGET_MODULES
                                                                   if m != "linear_qkv"))


#: ``--cuda-graph-scope`` values (Megatron-core ``transformer_config.py``) that capture the MoE
#: router and token preprocessing, whose small kernels make up the fixed per-layer MoE cost.
CUDA_GRAPH_MOE_SCOPES = ("moe_router", "moe_preprocess", "moe", "full_iteration")

#: ``--cuda-graph-scope`` values (megatron-core 0.19 ``CudaGraphModule`` / the deprecated ``CudaGraphScope``, incl.
#: ``full_iteration``) and ``full``: this project's name for whole layers captured (a published row's graphs with no
#: scope given).
CUDA_GRAPH_SCOPES = ("full", "full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")

#: ``--cuda-graph-impl`` values (megatron-core ``TransformerConfig.cuda_graph_impl``; ``none`` is its default).
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Run flags that change the cost but are not searched over (one value for the whole table). Defaults are the
    seed's run (seeds/001: slime, natural routing, no overlap flags, no CUDA graphs)."""

    moe_router_force_load_balancing: bool = False
    """``--moe-router-force-load-balancing``: tokens are routed uniformly (benchmarks); False =
    natural routing, whose slowest expert rank carries ``Calibration.moe_load_imbalance`` x the mean."""
    cp_comm_type: str = "p2p"
    """``--cp-comm-type``: ``p2p`` (ring of K/V blocks, overlapped with attention) or ``a2a``
    (all-to-all of heads, Ulysses style, not overlapped)."""
    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm``: EP all-to-all overlapped with another micro-batch's compute."""
    cuda_graph_scope: tuple[str, ...] = ()
    """``--cuda-graph-scope`` values when CUDA graphs are on (``--cuda-graph-impl`` not none); empty = off."""
    cuda_graph_impl: str = "none"
    """``--cuda-graph-impl`` (:data:`CUDA_GRAPH_IMPLS`): who captures the graphs; exported as given, read by the
    validity rules, not priced (the cost model reads :attr:`cuda_graph_scope`). Kept consistent with the scope: a
    scope without an impl gets ``transformer_engine`` (``local`` for ``full_iteration``), an impl without a scope
    gets ``full`` (``full_iteration`` for that impl)."""
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp`` (ZeRO-3 style: parameters, gradients and optimizer states sharded over DP)."""
    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce`` / ``--overlap-param-gather``: DP communication overlapped with compute."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (Transformer Engine userbuffers): TP collectives overlapped with GEMMs."""
    te_attention: bool = True
    """``--transformer-impl transformer_engine`` (Megatron-core's default): TE's fused attention saves its output once,
    as the projection's input, and the TE layer spec fuses the input norm into the QKV GEMM, with a separate pre-MLP
    norm only in MoE layers. False for a stack without TE (the trial harness, :data:`HARNESS_RUN_OPTIONS`):
    ``scaled_dot_product_attention``'s output is copied before the projection, so two copies are saved."""

    grad_reduce_in_fp32: bool = True
    """``grad_reduce_in_fp32`` (DistributedDataParallelConfig): main gradients and their reduction in fp32 (4 B per
    parameter); False: in the parameter dtype, bf16 (2 B) (distributed_data_parallel.py l.147 at core_v0.16.0). Every
    Megatron-Bridge perf recipe sets False (docs/production_sources.md F1)."""
    fp8_param_gather: bool = False
    """``fp8_param_gather``: with fp8 / mxfp8 training the compute weights are kept only in the low precision (an
    ``uint8`` param buffer, distributed_data_parallel.py l.139-146), no bf16 copy beside them, and the DP
    all-gather moves them in that precision (Megatron-Bridge ``mixed_precision.py``: True for FP8-CS and MXFP8)."""
    fp4_param_gather: bool = False
    """``fp4_param_gather``: the same for nvfp4 (Megatron-Bridge ``bf16_with_nvfp4_mixed`` from v0.5.0)."""
    fp8_recipe: str = "delayed"
    """``--fp8-recipe`` of the ``fp8`` precision: ``delayed`` (Megatron's default) or ``tensorwise`` (current
    scaling, Megatron-Bridge FP8-CS). With current scaling (and blockwise, mxfp8, nvfp4) the precision-aware
    optimizer does not own the master weights: they stay fp32 (4 B), not 2-B remainders (optimizer_config.py
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``, l.355-362; measured, docs/measurements.md)."""
    optimizer_fp8_recipe: str | None = None
    """``OptimizerConfig.fp8_recipe`` of a **bf16** run: None from the harness and slime (TE's FusedAdam keeps the
    masters as 2-B remainders); ``tensorwise`` from Megatron-Bridge, whose ``MixedPrecisionConfig`` copies it onto the
    optimizer even for ``bf16_mixed`` (``training/mixed_precision.py`` l.45-47), so the distributed optimizer keeps fp32
    master shards, 4 B (``optimizer_config.py`` l.404-411 at cd4afffa; ``benchmarks/data/published_runs_cards.md`` F1;
    not measured)."""
    apply_rope_fusion: bool = True
    """``apply_rope_fusion`` (on unless ``--no-rope-fusion``, arguments.py at ``core_v0.19.0``). Unfused, MLA assembles
    q and k with copies (multi_latent_attention.py ``qkv_up_proj_and_rope_apply``), priced by
    :func:`cost_model.terms.compute.mla_unfused_rope_time`."""
    cross_entropy_loss_fusion: bool = False
    """``--cross-entropy-loss-fusion``: a fused cross-entropy kernel (its implementation:
    ``cross_entropy_fusion_impl``)."""
    cross_entropy_fusion_impl: str = "native"
    """``--cross-entropy-fusion-impl``: ``native`` (Megatron's) or ``te`` (Transformer Engine's
    ``parallel_cross_entropy``, every Megatron-Bridge perf recipe, ``_set_common_perf_overrides``). With ``te``
    the logits bytes depend on ``te_version`` (:func:`cost_model.terms.memory.logits_bytes`)."""
    te_version: str = "2.20"
    """Transformer Engine version (major.minor) the run used: TE <= 2.17 writes the cross-entropy gradient in place
    into the bf16 logits; TE 2.18 (commit 01bbe3ee) keeps a separate fp32 gradient."""
    moe_permute_fusion: bool = False
    """``--moe-permute-fusion`` (Transformer Engine's fused token permutation; Megatron-core default False,
    ``transformer_config.py``). Recorded and exported; the cost model does not price it (its time and memory were not
    measured on this project's machines)."""
    bias_activation_fusion: bool = True
    """``bias_activation_fusion`` (``--bias-swiglu-fusion``, on by default): the SwiGLU saves only its input
    (fused_bias_swiglu.py ``WeightedSwiGLUFunction``); unfused, autograd keeps 3 f-wide tensors per routed copy more
    (measured, docs/measurements.md)."""
    cpu_offloading_num_layers: int = 0
    """``--cpu-offloading-num-layers`` with ``--cpu-offloading`` and weights not offloaded (Megatron-Bridge
    ``_set_recompute_overrides``: activations only): the saved activations of that many layers of a pipeline
    rank are held in host memory (0 = none)."""
    optimizer: str = "adam"
    """``adam`` or ``dist_muon`` (Megatron's layer-wise distributed Muon: one fp32 momentum buffer and the fp32
    master weights per parameter, whole parameters spread over the data-parallel ranks; Kimi-K2's
    Megatron-Bridge recipe, precision-aware optimizer off)."""
    megatron_core: str = NEWEST_MEGATRON_CORE
    """megatron-core release (``--megatron-core``, major.minor): the validity rules that changed between releases
    use it (:mod:`search_spaces.rules`); the default is the newest the project knows."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if isinstance(f.default, bool) and not isinstance(getattr(self, f.name), bool):
                raise TunerError(f"{f.name} must be true or false, got {getattr(self, f.name)!r}")
        if self.cp_comm_type not in ("p2p", "a2a"):
            raise TunerError(f"cp_comm_type {self.cp_comm_type!r}: accepted p2p or a2a")
        object.__setattr__(self, "cuda_graph_scope", tuple(str(x).strip().lower() for x in self.cuda_graph_scope))
        unknown = [x for x in self.cuda_graph_scope if x not in CUDA_GRAPH_SCOPES]
        if unknown:
            raise TunerError(f"cuda_graph_scope {unknown[0][:40]!r}: accepted {', '.join(CUDA_GRAPH_SCOPES)}")
        impl = str(self.cuda_graph_impl).strip().lower()
        if impl not in CUDA_GRAPH_IMPLS:
            raise TunerError(f"cuda_graph_impl {impl[:40]!r}: accepted {', '.join(CUDA_GRAPH_IMPLS)}")
        if self.cuda_graph_scope and impl == "none":
            impl = "local" if self.cuda_graph_scope == ("full_iteration",) else "transformer_engine"
        elif impl != "none" and not self.cuda_graph_scope:
            object.__setattr__(self, "cuda_graph_scope", ("full_iteration",) if impl == "full_iteration" else ("full",))
        object.__setattr__(self, "cuda_graph_impl", impl)
        if self.fp8_recipe not in FP8_RECIPES:
            raise TunerError(f"fp8_recipe {self.fp8_recipe!r}: accepted {', '.join(FP8_RECIPES)}")
        if self.optimizer_fp8_recipe is not None and self.optimizer_fp8_recipe not in FP8_RECIPES:
            raise TunerError(f"optimizer_fp8_recipe {self.optimizer_fp8_recipe!r}: accepted none, "
                             f"{', '.join(FP8_RECIPES)}")
        if self.cross_entropy_fusion_impl not in CROSS_ENTROPY_IMPLS:
            raise TunerError(f"cross_entropy_fusion_impl {self.cross_entropy_fusion_impl!r}: accepted "
                             f"{', '.join(CROSS_ENTROPY_IMPLS)}")
        if self.optimizer not in OPTIMIZERS:
            raise TunerError(f"optimizer {self.optimizer!r}: accepted {', '.join(OPTIMIZERS)}")
        n = self.cpu_offloading_num_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TunerError("cpu_offloading_num_layers must be a non-negative integer, got "
                             f"{self.cpu_offloading_num_layers!r}")
        major, minor = megatron_core_version(self.megatron_core)
        object.__setattr__(self, "megatron_core", f"{major}.{minor}")
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(self.te_version)) or self.te_version_tuple < (1, 0):
            raise TunerError(f"te_version {self.te_version!r}: expected major.minor (or major.minor.patch) "
                             "such as 2.20")

    @property
    def megatron_core_tuple(self) -> tuple[int, int]:
        """``megatron_core`` as ``(major, minor)``."""
        return megatron_core_version(self.megatron_core)

    @property
    def te_version_tuple(self) -> tuple[int, int]:
        """``te_version`` as ``(major, minor)``; (0, 0) when it is not of that form."""
        parts = str(self.te_version).split(".")
        try:
            return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            return 0, 0

    @property
    def cross_entropy_path(self) -> str:
        """Which of megatron-core 0.19's loss paths runs (``LanguageModule.compute_language_model_loss``): ``unfused``
        (``tensor_parallel.vocab_parallel_cross_entropy``, without ``--cross-entropy-loss-fusion``), ``native``
        (``fused_vocab_parallel_cross_entropy``) or ``te`` (Transformer Engine's ``parallel_cross_entropy``)."""
        return self.cross_entropy_fusion_impl if self.cross_entropy_loss_fusion else "unfused"

    @property
    def te_cross_entropy(self) -> bool:
        """Transformer Engine's fused cross-entropy (``cross_entropy_loss_fusion`` with impl ``te``)."""
        return self.cross_entropy_loss_fusion and self.cross_entropy_fusion_impl == "te"

    def low_precision_params(self, precision: Precision) -> bool:
        """The compute weights are kept only in ``precision`` (no bf16 copy): ``fp8_param_gather`` for the fp8
        formats, ``fp4_param_gather`` for nvfp4; never for bf16."""
        if precision == Precision.nvfp4:
            return self.fp4_param_gather
        return precision != Precision.bf16 and self.fp8_param_gather

    def precision_aware_owns_masters(self, precision: Precision) -> bool:
        """With ``--use-precision-aware-optimizer``, TE's FusedAdam keeps the master weights as 16-bit remainders
        (2 B): bf16 (unless :attr:`optimizer_fp8_recipe` is ``tensorwise``, Megatron-Bridge's) and fp8 delayed
        scaling; not fp8 current scaling, blockwise, mxfp8 or nvfp4, whose masters stay fp32 (optimizer_config.py
        ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: the optimizer's ``fp8_recipe`` None or ``delayed``)."""
        if precision == Precision.bf16:
            return self.optimizer_fp8_recipe in (None, "delayed")
        return precision == Precision.fp8 and self.fp8_recipe == "delayed"

    @property
    def cuda_graph_effective_impl(self) -> str:
        """The implementation megatron-core runs: ``full_iteration`` also for the deprecated scope ``full_iteration``
        (megatron/core/transformer/cuda_graph_config.py at d98e8a64 migrates it), ``none`` when graphs are off."""
        if not self.cuda_graph_scope:
            return "none"
        return "full_iteration" if "full_iteration" in self.cuda_graph_scope else self.cuda_graph_impl

    @property
    def cuda_graph_full(self) -> bool:
        """The whole iteration (or whole layers) is captured: every launch latency shrinks."""
        return any(x in ("full_iteration", "full") for x in self.cuda_graph_scope)

    @property
    def cuda_graph_moe(self) -> bool:
        """The MoE router / preprocessing is captured (or the whole iteration)."""
        return any(x in CUDA_GRAPH_MOE_SCOPES or x == "full" for x in self.cuda_graph_scope)


DEFAULT_RUN_OPTIONS = RunOptions()

#: Run options of this project's trial harness without Transformer Engine (``launch/harness``,
#: megatron-core's local layer spec): the seed's flags, attention output saved twice, the SwiGLU and RoPE unfused
#: (``launch/harness/train.py`` leaves ``bias_activation_fusion`` and ``apply_rope_fusion`` at False).
HARNESS_RUN_OPTIONS = RunOptions(te_attention=False, bias_activation_fusion=False, apply_rope_fusion=False)

#: The trial harness with Transformer Engine (its TE layer spec; the SwiGLU and RoPE unfused, fp32 main grads, native
#: cross-entropy unless a trial's options say otherwise).
HARNESS_TE_RUN_OPTIONS = RunOptions(bias_activation_fusion=False, apply_rope_fusion=False)
