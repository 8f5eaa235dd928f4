"""The trial harness's input, its command line, and what this environment cannot run (no torch here).

The harness (:mod:`launch.harness.train`) reads one JSON file, a :class:`HarnessSpec`:
the model (a :class:`ModelSpec` as a dict, possibly sliced to fewer layers at full
width), the layout (a :class:`Layout` as a dict, Megatron's field names), the
workload and the number of steps. Everything here is plain Python so that CI,
which has no GPU and no torch, tests it for real.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from cost_model.errors import TunerError
from cost_model.specs import ModelSpec, Workload
from search_spaces.layout import Dispatcher, Layout, RecomputeGranularity

__all__ = ["HarnessEnv", "HarnessSpec", "build_spec", "slice_model", "torchrun_command", "unsupported_reasons", "HARNESS_MODULE"]

#: The module ``torchrun -m`` starts.
HARNESS_MODULE = "launch.harness.train"


def slice_model(model: ModelSpec, num_layers: int | None) -> ModelSpec:
    """``model`` cut to its first ``num_layers`` decoder layers at full width.

    The layer kinds (``moe_layer_freq``) are the first ``num_layers`` entries, so a
    slice of a model whose first layers are dense stays dense there. MTP layers are
    dropped from a slice (a slice stands in for a block of decoder layers).

    Raises:
        TunerError: ``num_layers`` is not from 1 to the model's layer count.
    """
    if num_layers is None or num_layers == model.num_layers:
        return model
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= model.num_layers:
        raise TunerError(f"--layers must be from 1 to {model.num_layers} (the layers of {model.name}), got {num_layers!r}")
    freq = model.moe_layer_freq[:num_layers]
    ffn = model.ffn_hidden_size
    return model.replace(
        name=f"{model.name}[{num_layers} layers]",
        num_layers=num_layers,
        moe_layer_freq=freq,
        ffn_hidden_size=ffn,
        mtp_num_layers=0,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessEnv:
    """What the machine that runs the harness has installed (read without importing torch)."""

    transformer_engine: bool = False
    """``transformer_engine`` is importable: TE layer spec, CP, grouped GEMM, precision-aware Adam."""
    deep_ep: bool = False
    """``deep_ep`` is importable (flex dispatcher with the DeepEP backend)."""
    hybrid_ep: bool = False
    """HybridEP is importable (flex dispatcher with the HybridEP backend)."""

    @classmethod
    def detect(cls) -> HarnessEnv:
        """Probe the current Python environment with ``importlib.util.find_spec`` (imports no torch; at most ``deep_ep``'s package to look for HybridEP)."""

        def has(name: str) -> bool:
            try:
                return importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                return False

        return cls(
            transformer_engine=has("transformer_engine"),
            deep_ep=has("deep_ep"),
            hybrid_ep=has("deep_ep") and has("deep_ep.hybrid_ep"),
        )


def unsupported_reasons(layout: Layout, model: ModelSpec, workload: Workload, env: HarnessEnv) -> list[str]:
    """Why the harness cannot run ``layout`` here; empty when it can.

    These are limits of the environment (what is installed), not Megatron's validity
    rules (:mod:`search_spaces.rules` checks those). Sources: megatron-core 0.19
    ``DotProductAttention`` (asserts CP needs ``TEDotProductAttention``),
    ``optimizer_config.py`` (precision-aware Adam needs TE's ``FusedAdam`` unless the
    optimizer is offloaded), ``token_dispatcher.py`` (flex needs DeepEP or HybridEP).
    """
    out: list[str] = []
    te = env.transformer_engine
    if layout.cp > 1 and not te:
        out.append(
            f"context parallelism (cp={layout.cp}) needs Transformer Engine: megatron-core's local "
            "DotProductAttention asserts 'Context parallelism is only supported by TEDotProductAttention'"
        )
    if layout.dispatcher == Dispatcher.flex_deepep and not env.deep_ep:
        out.append("the flex+deepep dispatcher needs DeepEP (the deep_ep package), which is not installed here")
    if layout.dispatcher == Dispatcher.flex_hybridep and not env.hybrid_ep:
        out.append("the flex+hybridep dispatcher needs HybridEP (deep_ep.hybrid_ep), which is not installed here")
    if workload.precision.value == "fp8" and not te:
        out.append("fp8 training needs Transformer Engine, which is not installed here")
    bf16_states = layout.exp_avg_dtype != "fp32" or layout.exp_avg_sq_dtype != "fp32"
    if bf16_states and not te and layout.optimizer_offload_fraction <= 0:
        out.append(
            "bf16 optimizer states (exp_avg_dtype / exp_avg_sq_dtype) need the precision-aware optimizer, "
            "i.e. Transformer Engine's FusedAdam (or optimizer CPU offload), which is not installed here"
        )
    if layout.world_size % (layout.tp * layout.pp * layout.cp):
        out.append(f"world size {layout.world_size} is not a multiple of tp*pp*cp = {layout.tp * layout.pp * layout.cp}")
    if model.q_lora_rank or model.kv_lora_rank:
        if layout.cp > 1:
            out.append("MLA with context parallelism is not supported by the harness")
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessSpec:
    """Everything one harness run needs; written as JSON and read by :mod:`launch.harness.train`."""

    model: dict[str, Any]
    """The :class:`ModelSpec` as a dict (already sliced)."""
    layout: dict[str, Any]
    """The :class:`Layout` as a dict (Megatron's field names)."""
    seq_length: int
    """Tokens per row."""
    global_batch_size: int
    """Rows per optimizer step."""
    precision: str = "bf16"
    steps: int = 8
    """Optimizer steps to run (warm-up included)."""
    warmup_steps: int = 2
    """Leading steps left out of the median step time (allocator, NCCL and kernel warm-up)."""
    seed: int = 1234
    use_transformer_engine: bool = False
    """Build with TE's layer spec (else megatron-core's local spec plus the harness's SDPA and RMSNorm)."""
    notes: tuple[str, ...] = ()
    """What the harness changes from the layout in this environment (e.g. precision-aware Adam off)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup_steps < 0 or self.warmup_steps >= self.steps:
            raise TunerError(f"harness steps must be >= 1 and warm-up steps in [0, steps), got steps={self.steps}, warmup={self.warmup_steps}")

    @property
    def num_microbatches(self) -> int:
        lay = self.layout
        dp = lay["world_size"] // (lay["tp"] * lay["pp"] * lay["cp"])
        return self.global_batch_size // (lay["micro_batch_size"] * dp)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["notes"] = list(self.notes)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HarnessSpec:
        """Inverse of :meth:`to_json`.

        Raises:
            TunerError: not JSON, or keys that are not fields of :class:`HarnessSpec`.
        """
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TunerError(f"harness spec is not JSON ({e})") from None
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise TunerError(f"harness spec has unknown keys {sorted(unknown)}")
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)

    def model_spec(self) -> ModelSpec:
        return ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.model.items()})

    def layout_obj(self) -> Layout:
        return Layout.from_dict(self.layout)


def build_spec(
    model: ModelSpec,
    layout: Layout,
    workload: Workload,
    *,
    env: HarnessEnv,
    steps: int = 8,
    warmup_steps: int = 2,
    seed: int = 1234,
) -> HarnessSpec:
    """The harness input for ``layout``; ``model`` is taken as given (slice it first with :func:`slice_model`).

    Raises:
        InfeasibleLayout: (rule ``harness_env``) the harness cannot run this layout here;
            the reason names what is missing. Raised before any GPU work.
        TunerError: the global batch is not a multiple of micro-batch x DP.
    """
    from cost_model.errors import InfeasibleLayout

    reasons = unsupported_reasons(layout, model, workload, env)
    if reasons:
        raise InfeasibleLayout("harness_env", "; ".join(reasons))
    dp = layout.dp
    if workload.global_batch_size % (layout.micro_batch_size * dp):
        raise TunerError(
            f"global batch {workload.global_batch_size} is not a multiple of micro-batch {layout.micro_batch_size} x DP {dp}"
        )
    notes: list[str] = []
    if not env.transformer_engine:
        notes.append(
            "no Transformer Engine: megatron-core local spec, SDPA core attention, the harness's RMSNorm "
            "(sequence-parallel aware), experts as SequentialMLP (no grouped GEMM), per-head QK norm"
        )
        if layout.use_precision_aware_optimizer and layout.optimizer_offload_fraction <= 0:
            notes.append("precision-aware optimizer off (needs TE FusedAdam); with fp32 optimizer states the memory is the same")
    mdict = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model).items()}
    return HarnessSpec(
        model=mdict,
        layout=layout.to_dict(),
        seq_length=workload.seq_length,
        global_batch_size=workload.global_batch_size,
        precision=workload.precision.value,
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        use_transformer_engine=env.transformer_engine,
        notes=tuple(notes),
    )


def torchrun_command(
    nproc_per_node: int,
    spec_path: str | Path,
    out_path: str | Path,
    *,
    master_port: int = 29500,
    python: str | None = None,
) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N ... -m launch.harness.train --spec S --out O``.

    Raises:
        TunerError: ``nproc_per_node`` < 1.
    """
    if nproc_per_node < 1:
        raise TunerError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        f"--master-port={master_port}",
        "--nnodes=1",
        f"--nproc-per-node={nproc_per_node}",
        "-m",
        HARNESS_MODULE,
        *harness_args(spec_path, out_path),
    ]


def harness_args(spec_path: str | Path, out_path: str | Path) -> list[str]:
    """The harness program's own arguments."""
    return ["--spec", str(spec_path), "--out", str(out_path)]


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
    """``--spec FILE --out FILE`` (the harness's command line) as (spec path, out path).

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
