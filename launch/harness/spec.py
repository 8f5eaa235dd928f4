"""The trial harness's input (:class:`HarnessSpec`, one JSON file read by :mod:`launch.harness.train`), its command
line, and what this environment cannot run; plain Python (no torch), so CI tests it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specs import ModelSpec, Workload
from specs.errors import TunerError
from specs.layout import Layout, RecomputeGranularity

__all__ = ["FAULTS", "FP8_RECIPES", "HARNESS_OPTIONS", "HarnessEnv", "HarnessSpec", "build_spec", "fault_reasons",
           "harness_layout", "override_model", "torchrun_command", "unsupported_reasons",
           "HARNESS_MODULE"]

#: The module ``torchrun -m`` starts.
HARNESS_MODULE = "launch.harness.train"

#: Deliberate bugs the harness can inject (negative controls of ``tune verify``): name -> what it breaks.
#: Each one is a class of bug seen in real stacks; a check that passes them all cannot tell a broken layout.
FAULTS: dict[str, str] = {
    "sp_norm_grad_unreduced": (
        "the norm weights are not tagged sequence_parallel, so under TP with sequence parallelism their gradient "
        "is not summed over the TP group (each TP rank updates its copy from its own slice of the sequence): "
        "the seed's bug class (QK-norm gradients wrong under TP 2 with SP)"
    ),
    "non_causal_attention": (
        "attention without the causal mask (each token sees the tokens after it): the class of a wrong "
        "attention-mask type on some layouts"
    ),
    "embedding_shard_misplaced": (
        "after the checkpoint is loaded, each TP rank holds the next TP rank's shard of the word embedding: "
        "the class of a resharding bug when a checkpoint is loaded into another TP size"
    ),
    "norm_grad_scaled": (
        "after the gradients are reduced, one norm weight's gradient (the first layer's q_layernorm, else its first "
        "norm) is multiplied by 2: the seed's bug class (a replicated norm weight whose gradient is summed twice) "
        "on any layout, one GPU included"
    ),
}

#: Transformer Engine fp8 recipes the harness runs (Megatron ``--fp8-recipe``): ``delayed`` (per-tensor scale from an
#: amax history) and ``tensorwise`` (per-tensor current scaling); ``blockwise`` (DeepSeek-style 128x128 / 1x128 blocks).
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")



def override_model(model: ModelSpec, overrides: Any, where: str = "model_overrides") -> ModelSpec:
    """``model`` with the fields ``overrides`` names replaced (a sweep case's ``model_overrides``).

    Raises:
        TunerError: not a mapping, an unknown field, or a value ModelSpec refuses.
    """
    if not overrides:
        return model
    if not isinstance(overrides, dict):
        raise TunerError(f"{where}: model_overrides must be an object of model fields, got {overrides!r}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ModelSpec)})
    if unknown:
        raise TunerError(f"{where}: model_overrides names {unknown}, which are not model fields")
    try:
        return model.replace(**{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
    except (TypeError, ValueError) as e:
        raise TunerError(f"{where}: model_overrides {overrides!r:.120}: {e}") from None


def importable(name: str) -> bool:
    """Whether ``name`` can be imported here (``importlib.util.find_spec``; imports at most its parent package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessEnv:
    """What the machine that runs the harness has installed (read without importing torch)."""

    transformer_engine: bool = False  # TE layer spec, CP, grouped GEMM, precision-aware Adam
    deep_ep: bool = False  # flex dispatcher, DeepEP backend
    hybrid_ep: bool = False  # flex dispatcher, HybridEP backend

    @classmethod
    def detect(cls) -> HarnessEnv:
        """Probe with ``importlib.util.find_spec`` (imports no torch)."""
        return cls(transformer_engine=importable("transformer_engine"), deep_ep=importable("deep_ep"),
                   hybrid_ep=importable("deep_ep") and importable("deep_ep.hybrid_ep"))


def unsupported_reasons(layout: Layout, model: ModelSpec, workload: Workload, env: HarnessEnv) -> list[str]:
    """Why the harness cannot run ``layout`` with what is installed here; empty when it can.

    Sources (megatron-core 0.19): ``DotProductAttention`` asserts CP needs ``TEDotProductAttention``;
    ``optimizer_config.py`` (precision-aware Adam is TE's ``FusedAdam`` unless offloaded); ``token_dispatcher.py``
    (flex needs DeepEP or HybridEP); ``transformer_config.py`` (moe_act recompute needs grouped GEMM, which the
    harness has only with TE: ``benchmarks/results/h200_x2_2026-11-29``)."""
    out: list[str] = []
    te = env.transformer_engine
    if layout.cp > 1 and not te:
        out.append(
            f"context parallelism (cp={layout.cp}) needs Transformer Engine: megatron-core's local "
            "DotProductAttention asserts 'Context parallelism is only supported by TEDotProductAttention'"
        )
    d = layout.dispatcher.traits
    if d.harness_probe is not None and not getattr(env, d.harness_probe):
        out.append(f"the {layout.dispatcher} dispatcher needs {d.library} ({d.harness_probe}), which is not installed "
                   "here")
    if "moe_act" in layout.recompute_modules and not te:
        out.append(
            "recompute module moe_act needs grouped GEMM (megatron-core: 'moe_act in recompute_modules is only "
            "supported with moe_grouped_gemm'); without Transformer Engine the harness runs experts as SequentialMLP"
        )
    if workload.precision.value not in ("bf16", "fp8"):
        out.append(f"precision {workload.precision.value} is not run by the harness (bf16, and fp8 with Transformer "
                   "Engine)")
    if workload.precision.value == "fp8" and not te:
        out.append("fp8 training needs Transformer Engine, which is not installed here")
    bf16_states = layout.exp_avg_dtype != "fp32" or layout.exp_avg_sq_dtype != "fp32"
    if bf16_states and not te and layout.optimizer_offload_fraction <= 0:
        out.append(
            "bf16 optimizer states (exp_avg_dtype / exp_avg_sq_dtype) need the precision-aware optimizer, "
            "i.e. Transformer Engine's FusedAdam (or optimizer CPU offload), which is not installed here"
        )
    if layout.world_size % (layout.tp * layout.pp * layout.cp):
        out.append(f"world size {layout.world_size} is not a multiple of tp*pp*cp = "
                   f"{layout.tp * layout.pp * layout.cp}")
    if model.q_lora_rank or model.kv_lora_rank:
        if layout.cp > 1:
            out.append("MLA with context parallelism is not supported by the harness")
        if not te:
            out.append("multi-latent attention is built with Transformer Engine's layer spec only (the harness's local "
                       "modules have no MLA)")
    return out


def option_reasons(options: dict[str, Any], workload: Workload, env: HarnessEnv) -> list[str]:
    """Why the harness options cannot run here: fp8 recipes and TE's fused cross-entropy need TE; an fp8 recipe needs
    fp8 precision."""
    out: list[str] = []
    te = env.transformer_engine
    rec = options.get("fp8_recipe")
    if rec is not None and rec not in FP8_RECIPES:
        out.append(f"fp8_recipe {rec!r}: accepted {', '.join(FP8_RECIPES)}")
    if rec is not None and workload.precision.value != "fp8":
        out.append(f"fp8_recipe {rec!r} needs --precision fp8 (the workload is {workload.precision.value})")
    if options.get("fp8_param_gather") and workload.precision.value != "fp8":
        out.append("fp8_param_gather needs --precision fp8")
    mods = set(options.get("_recompute_modules") or ())
    if rec == "delayed" and mods & {"moe_act", "layernorm"}:
        out.append("fp8 delayed scaling with moe_act or layernorm recompute: megatron-core 0.19 raises 'Delayed "
                   "scaling does not support moe_act and layernorm recompute for fp8' (transformer_config.py); use "
                   "fp8_recipe tensorwise")
    if options.get("cross_entropy_fusion") and not te:
        out.append("fused cross-entropy (cross_entropy_fusion_impl 'te') needs Transformer Engine, which is not "
                   "installed here")
    if options.get("megatron_fusions") and not te:
        out.append("megatron_fusions (fused RoPE, gradient-accumulation fusion into main_grad) needs Transformer "
                   "Engine, which is not installed here")
    return out


def harness_layout(layout: Layout, env: HarnessEnv) -> Layout:
    """``layout`` as the harness runs it: without TE precision-aware Adam is off unless offloaded."""
    if layout.use_precision_aware_optimizer and not env.transformer_engine and layout.optimizer_offload_fraction <= 0:
        return layout.replace(use_precision_aware_optimizer=False)
    return layout


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessSpec:
    """Everything one harness run needs; written as JSON and read by :mod:`launch.harness.train`."""

    model: dict[str, Any]  # a ModelSpec, already sliced
    layout: dict[str, Any]  # a Layout (Megatron's field names)
    seq_length: int
    global_batch_size: int
    precision: str = "bf16"
    steps: int = 8  # warm-up included
    warmup_steps: int = 2  # left out of the median step time
    seed: int = 1234
    use_transformer_engine: bool = False
    """Build with TE's layer spec (else megatron-core's local spec plus the harness's SDPA and RMSNorm)."""
    notes: tuple[str, ...] = ()
    """What the harness changes from the layout in this environment (e.g. precision-aware Adam off)."""
    data: str = "synthetic"
    """``synthetic`` (one random micro-batch repeated: speed trials) or ``corpus`` (byte-tokenised text in
    Megatron's sample order, :mod:`launch.harness.data`: convergence checks)."""
    corpus_path: str | None = None  # text file of the ``corpus`` data; None = CPython's bundled documentation
    corpus_sha256: str | None = None  # expected SHA-256 of the corpus; the harness refuses to run on other bytes
    lr: float = 1e-5  # adam learning rate (constant; no warm-up, so short runs move)
    save_checkpoint: str | None = None
    """Directory to write the freshly initialised weights to (megatron-core distributed checkpoint) before step 1."""
    load_checkpoint: str | None = None
    """Directory of a distributed checkpoint to load the weights from before step 1 (any TP/PP/EP it was written with).
    """
    fault: str | None = None  # A deliberate bug to inject (a key of :data:`FAULTS`): negative controls only
    pretrain_steps: int = 0
    """Warm start: train this many steps from the seed before writing ``save_checkpoint`` (then load it
    back and start the measured steps with a fresh optimizer)."""
    data_step_offset: int = 0
    """The first measured step reads the rows of this optimizer step (after a warm start's rows)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps (of the warm start and of the measured steps)."""
    fp8_recipe: str | None = None
    """With ``precision: fp8``: TE's recipe (:data:`FP8_RECIPES`; ``TransformerConfig(fp8="hybrid", fp8_recipe=...)``).
    """
    fp8_param_gather: bool = False
    """fp8 weights without a bf16 copy (``fp8_param`` / ``fp8_param_gather``, as Megatron-Bridge's fp8 recipes)."""
    grad_reduce_in_fp32: bool = True
    """``DistributedDataParallelConfig.grad_reduce_in_fp32``; False: the gradient buffer is bf16 (Bridge's perf
    recipes)."""
    cross_entropy_fusion: bool = False
    """``cross_entropy_loss_fusion`` with ``cross_entropy_fusion_impl="te"`` (TE's fused cross-entropy)."""
    moe_permute_fusion: bool = False  # ``moe_permute_fusion`` (TE's fused token permutation)
    megatron_fusions: bool = False
    """Megatron-LM's default fusions (``megatron/training/arguments.py`` at ``core_v0.19.0``): ``apply_rope_fusion``,
    ``gradient_accumulation_fusion`` and ``bias_dropout_fusion``; off, as the calibration sweeps ran. Needs TE."""
    saved_tensor_census: bool = False
    """One more forward with saved-tensor hooks on the first layer: an ``event: census`` line per saved tensor."""
    dump_grads: str | None = None
    """Write step 1's full fp32 gradients (gathered over TP / EP / PP / DP) here (:mod:`launch.harness.grads`)."""
    label: str | None = None  # A name for this run (recorded in the result lines and in a gradient dump)
    profile_step: int | None = None
    """Profile this step (1 .. ``steps``) with ``torch.profiler``: a Chrome trace ``profile_step<N>_pp<r>.json`` per
    pipeline stage next to ``--out``; the step's line says ``"profiled": true`` (profile a warm-up step)."""
    forward_only_steps: int = 0
    """Then time this many forward-only steps (the forward share recompute re-runs): an ``event: forward_only`` line."""
    memory_phases: bool = False
    """``event: memory_phase`` lines: GPU allocator and host after the build, step 1's backward and its optimizer step,
    and the live tensors after the build."""
    gc_after_build: bool = False
    """``gc.collect()`` and ``torch.cuda.empty_cache()`` once after the build (a control for reference cycles)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.pretrain_steps and not self.save_checkpoint:
            raise TunerError("harness pretrain_steps (a warm start) needs save_checkpoint: the warmed weights are the "
                             "check's start")
        if (self.precision == "fp8") != (self.fp8_recipe is not None):
            raise TunerError(f"harness precision {self.precision!r} with fp8_recipe {self.fp8_recipe!r}: fp8 needs a "
                             "recipe, and a recipe needs fp8")

    @property
    def num_microbatches(self) -> int:
        lay = self.layout
        dp = lay["world_size"] // (lay["tp"] * lay["pp"] * lay["cp"])
        return int(self.global_batch_size // (lay["micro_batch_size"] * dp))

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["notes"] = list(self.notes)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HarnessSpec:
        d = json.loads(text)
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)

    def model_spec(self) -> ModelSpec:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in self.model.items()}
        return ModelSpec(**fields)

    def layout_obj(self) -> Layout:
        return Layout.from_dict(self.layout)


#: The HarnessSpec fields ``build_spec(options=...)`` and ``LocalBackend(harness_options=...)`` accept: all but those
#: :func:`build_spec` sets itself.
HARNESS_OPTIONS = frozenset(f.name for f in dataclasses.fields(HarnessSpec)) - {
    "model", "layout", "seq_length", "global_batch_size", "precision", "steps", "warmup_steps", "seed",
    "use_transformer_engine", "notes", "extra"}


def fault_reasons(fault: str | None, layout: Layout, env: HarnessEnv) -> list[str]:
    """Why ``fault`` cannot be injected into ``layout`` (a no-op fault is refused: a negative control must break
    something)."""
    if fault is None:
        return []
    out: list[str] = []
    if fault not in FAULTS:
        return [f"unknown fault {fault!r}; accepted: {', '.join(FAULTS)}"]
    if fault == "embedding_shard_misplaced" and layout.tp < 2:
        out.append(f"fault {fault!r} needs TP > 1 (the layout has TP {layout.tp}): with one shard nothing is misplaced")
    if fault == "sp_norm_grad_unreduced" and not (layout.tp > 1 and layout.sequence_parallel):
        out.append(f"fault {fault!r} needs TP > 1 with sequence parallelism (the layout has TP {layout.tp}, "
                   f"sequence_parallel {layout.sequence_parallel}); otherwise it changes nothing")
    return out


def build_spec(model: ModelSpec, layout: Layout, workload: Workload, *, env: HarnessEnv, steps: int = 8,
               warmup_steps: int = 2, seed: int = 1234, options: dict[str, Any] | None = None) -> HarnessSpec:
    """The harness input for ``layout`` (``model`` as given: slice it first); ``options``: further fields
    (:data:`HARNESS_OPTIONS`); fp8 without ``fp8_recipe`` gets ``delayed``.

    Raises:
        InfeasibleLayout: (rule ``harness_env``) the harness cannot run this layout here, before any GPU work.
        TunerError: the global batch is not a multiple of micro-batch x DP, or an unknown option.
    """
    from specs.errors import InfeasibleLayout

    opts = dict(options or {})
    if set(opts) - HARNESS_OPTIONS:
        raise TunerError(f"unknown harness options {sorted(set(opts) - HARNESS_OPTIONS)}; accepted: "
                         f"{sorted(HARNESS_OPTIONS)}")
    if workload.precision.value == "fp8" and opts.get("fp8_recipe") is None:
        opts["fp8_recipe"] = "delayed"
    chk = {**opts,
           "_recompute_modules": layout.recompute_modules if layout.recompute_granularity.value == "selective" else ()}
    reasons = [*unsupported_reasons(layout, model, workload, env), *fault_reasons(opts.get("fault"), layout, env),
               *option_reasons(chk, workload, env)]
    if opts.get("fault") == "embedding_shard_misplaced" and not opts.get("load_checkpoint"):
        reasons.append("fault 'embedding_shard_misplaced' acts when a checkpoint is loaded; this run loads none")
    if reasons:
        raise InfeasibleLayout("harness_env", "; ".join(reasons))
    if workload.global_batch_size % (layout.micro_batch_size * layout.dp):
        raise TunerError(f"global batch {workload.global_batch_size} is not a multiple of micro-batch "
                         f"{layout.micro_batch_size} x DP {layout.dp}")
    notes: list[str] = []
    if not env.transformer_engine:
        notes.append(
            "no Transformer Engine: megatron-core local spec, SDPA core attention, the harness's RMSNorm "
            "(sequence-parallel aware), experts as SequentialMLP (no grouped GEMM), per-head QK norm"
        )
        if layout.use_precision_aware_optimizer and layout.optimizer_offload_fraction <= 0:
            notes.append("precision-aware optimizer off (needs TE FusedAdam): fp32 master weights, 4 bytes per "
                         "parameter instead of TE's 2-byte remainders")
    mdict = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model).items()}
    return HarnessSpec(model=mdict, layout=layout.to_dict(), seq_length=workload.seq_length,
                       global_batch_size=workload.global_batch_size, precision=workload.precision.value, steps=steps,
                       warmup_steps=warmup_steps, seed=seed, use_transformer_engine=env.transformer_engine,
                       notes=tuple(notes), **opts)


def torchrun_command(nproc_per_node: int, spec_path: str | Path, out_path: str | Path, *, master_port: int = 29500,
                     python: str | None = None) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N ... -m launch.harness.train --spec S --out O``."""
    return [python or sys.executable, "-m", "torch.distributed.run", f"--master-port={master_port}", "--nnodes=1",
            f"--nproc-per-node={nproc_per_node}", "-m", HARNESS_MODULE, *harness_args(spec_path, out_path)]


def harness_args(spec_path: str | Path, out_path: str | Path) -> list[str]:
    """The harness program's own arguments."""
    return ["--spec", str(spec_path), "--out", str(out_path)]


def parallel_kwargs(lay: dict[str, Any]) -> dict[str, Any]:
    """The parallel sizes of a layout dict as ``initialize_model_parallel`` and ``TransformerConfig`` name them."""
    return dict(tensor_model_parallel_size=lay["tp"], pipeline_model_parallel_size=lay["pp"],
                virtual_pipeline_model_parallel_size=lay["vpp"] if lay["vpp"] > 1 else None,
                context_parallel_size=lay["cp"], expert_model_parallel_size=lay["ep"],
                expert_tensor_parallel_size=lay["etp"])


def recompute_kwargs(layout: dict[str, Any]) -> dict[str, Any]:
    """``TransformerConfig`` recompute fields for a layout dict (None where Megatron expects unset)."""
    g = layout.get("recompute_granularity", "none")
    if g == RecomputeGranularity.none.value:
        return {"recompute_granularity": None}
    if g == RecomputeGranularity.selective.value:
        mods = list(layout.get("recompute_modules") or ["core_attn"])
        return {"recompute_granularity": "selective", "recompute_modules": mods}
    return {
        "recompute_granularity": "full",
        "recompute_method": layout.get("recompute_method") or "uniform",
        "recompute_num_layers": int(layout.get("recompute_num_layers") or 1),
    }


def parse_argv(argv: Sequence[str]) -> tuple[str, str]:
    """``--spec FILE --out FILE`` as (spec path, out path).

    Raises:
        TunerError: a missing or unknown argument.
    """
    spec = out = None
    it = iter(argv)
    for a in it:
        if a == "--spec":
            spec = next(it, None)
        elif a == "--out":
            out = next(it, None)
        else:
            raise TunerError(f"harness: unknown argument {a!r}; usage: --spec SPEC.json --out STEPS.jsonl")
    if not spec or not out:
        raise TunerError("harness: usage: --spec SPEC.json --out STEPS.jsonl")
    return spec, out
