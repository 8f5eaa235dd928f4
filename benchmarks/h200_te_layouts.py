"""The layouts of the Transformer Engine sweep on 1 x H200 (issue 14), in the order they run.

Each case is one harness trial: a model slice, a :class:`specs.layout.Layout` (Megatron's field
names) and the harness options (:data:`launch.harness.spec.HARNESS_OPTIONS`); every row the sweep
writes records the layout and options exactly as megatron-core ran them (``run_options``), so that
the cost model can predict it later. The cases cover: bf16 and fp8 (delayed and current scaling),
micro-batch 1 / 2 / 4, every recompute module the models have (``core_attn``, ``moe_act``,
``layernorm``, ``moe``; ``mlp`` and ``mla_up_proj`` on the MLA slice), full recompute uniform and
block, the precision-aware optimizer on and off and with bf16 moments, bf16 and fp32 main grads,
TE's fused cross-entropy, CPU optimizer offload 0.5 and 1.0 (host memory measured), on a MiniMax-M2
slice, a Qwen3-30B-A3B slice and a DeepSeek-V3 (MLA) slice, in priority order (the cases a call's budget leaves out are
the last). ``census`` asks for the saved-tensor
census (:class:`launch.harness.grads.SavedTensorCensus`). ``est_s`` is the planned wall time
(torchrun start, model build and the steps; ``docs/measurements.md``: 30-45 s per 1-layer MiniMax-M2
layout with TE, 2.4-3.7 s steps on the 8-layer Qwen3-30B-A3B slice).

    python benchmarks/h200_te_layouts.py            # print the cases
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["BASE_LAYOUT", "CASES", "PROBE", "case"]

#: The one-GPU layout every device driver starts from (benchmarks/h200_*.py).
BASE_LAYOUT = {
    "world_size": 1,
    "tp": 1,
    "pp": 1,
    "ep": 1,
    "micro_batch_size": 1,
    "dispatcher": "alltoall",
    "use_distributed_optimizer": True,
    "use_precision_aware_optimizer": True,
}


def case(
    id: str,
    model: str,
    layers: int,
    *,
    est_s: float,
    steps: int = 8,
    warmup: int = 4,
    precision: str = "bf16",
    seq_len: int = 8192,
    global_batch: int = 8,
    census: bool = False,
    options: dict[str, Any] | None = None,
    model_overrides: dict[str, Any] | None = None,
    **layout: Any,
) -> dict[str, Any]:
    """One sweep case (a plain dict: the driver and the tests read it). ``model_overrides``: ModelSpec fields replaced
    in the slice (e.g. the expert count of one EP rank, or a GPT-OSS feature turned off)."""
    lay = {**BASE_LAYOUT, **layout}
    opts = dict(options or {})
    if census:
        opts["saved_tensor_census"] = True
    return {
        "id": id,
        "model": model,
        "layers": layers,
        "gpus": "1xH200",
        "seq_len": seq_len,
        "global_batch": global_batch,
        "precision": precision,
        "layout": lay,
        "options": opts,
        "steps": steps,
        "warmup": warmup,
        "est_s": est_s,
        "model_overrides": dict(model_overrides or {}),
    }


MM, QW, DS, OSS = "MiniMax-M2", "Qwen3-30B-A3B", "DeepSeek-V3", "GPT-OSS-120B"
#: One EP 8 rank of GPT-OSS-120B's experts (128 / 8), and GPT-OSS with its own features off (a plain SwiGLU MoE of its
#: shape).
OSS_RANK = {"num_experts": 16}
OSS_VANILLA = {
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "softmax_type": "vanilla",
    "activation_func": "silu",
    "activation_func_clamp_value": 0.0,
    "glu_linear_offset": 0.0,
    "window_size": 0,
    "window_attn_skip_freq": (),
}
SEL = {"recompute_granularity": "selective"}
FULL = {"recompute_granularity": "full", "recompute_num_layers": 1}

#: The first-trial probe: a Qwen3-30B-A3B slice (on such a slice a fresh machine's first trial ran up to 20% slow,
#: ``../shared/notes/production_fidelity.md`` §3), run as the fresh machine's first GPU work and again at the end of the
#: batch; it is also the Qwen3-30B-A3B base row of the sweep (with the saved-tensor census, after its timed steps).
PROBE = case("probe-qwen3-l4", QW, 4, est_s=50, census=True)

#: In priority order: the driver runs them until the call's budget is spent, so the first ones cover the issue's list.
CASES: list[dict[str, Any]] = [
    case("mm-base", MM, 1, est_s=40, census=True),
    case("mm-fp8-delayed", MM, 1, est_s=45, precision="fp8", census=True, options={"fp8_recipe": "delayed"}),
    case("mm-fp8-tensorwise", MM, 1, est_s=45, precision="fp8", options={"fp8_recipe": "tensorwise"}),
    case("mm-mbs2", MM, 1, est_s=40, micro_batch_size=2),
    case("mm-sel-moe_act", MM, 1, est_s=40, census=True, **SEL, recompute_modules=("moe_act",)),
    case("mm-full-uniform1", MM, 1, est_s=40, **FULL, recompute_method="uniform"),
    case("mm-pa-off", MM, 1, est_s=40, use_precision_aware_optimizer=False),
    case("mm-pa-bf16-moments", MM, 1, est_s=40, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"),
    case("mm-bf16-main-grads", MM, 1, est_s=40, options={"grad_reduce_in_fp32": False}),
    case("mm-ce-fusion", MM, 1, est_s=40, options={"cross_entropy_fusion": True}),
    case("mm-offload-0.5", MM, 1, est_s=60, optimizer_offload_fraction=0.5, overlap_cpu_optimizer_d2h_h2d=True),
    case("mm-offload-1.0", MM, 1, est_s=75, optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True),
    case("qw-full-block2", QW, 4, est_s=50, **{**FULL, "recompute_num_layers": 2}, recompute_method="block"),
    case("mm-mbs4", MM, 1, est_s=45, micro_batch_size=4),
    case("mm-sel-core_attn", MM, 1, est_s=40, **SEL, recompute_modules=("core_attn",)),
    case("mm-sel-layernorm", MM, 1, est_s=40, **SEL, recompute_modules=("layernorm",)),
    case("mm-sel-moe", MM, 1, est_s=40, **SEL, recompute_modules=("moe",)),
    case("qw-mbs2", QW, 4, est_s=50, micro_batch_size=2),
    case("ds-mla-base", DS, 1, est_s=45, census=True),
    case(
        "ds-mla-sel-mla_up_proj",
        DS,
        1,
        est_s=45,
        **SEL,
        recompute_modules=("mla_up_proj", "core_attn", "mlp", "layernorm"),
    ),
    case("qw-fp8-delayed", QW, 4, est_s=55, precision="fp8", options={"fp8_recipe": "delayed"}),
    case(
        "qw-bridge-like",
        QW,
        4,
        est_s=55,
        exp_avg_dtype="bf16",
        exp_avg_sq_dtype="bf16",
        options={"grad_reduce_in_fp32": False, "cross_entropy_fusion": True},
    ),
    case("qw-sel-moe_act-layernorm", QW, 4, est_s=50, **SEL, recompute_modules=("moe_act", "layernorm")),
    case("qw-full-uniform1", QW, 4, est_s=50, **FULL, recompute_method="uniform"),
    # GPT-OSS-120B (2026-12-01, third batch): what makes its expert layers slower per FLOP than the other MoE models'
    # (the published k-fold predicts it 46% too fast). Two layers (one sliding-window, one full) of one EP 8 rank of the
    # published B200 recipe: 16 of the 128 experts, micro-batch 4 at 4,096 tokens, so each expert GEMM has the rows
    # of that rank (4 x 4,096 x 4 / 16 = 4,096). Each case turns GPT-OSS's features off or on, one at a time.
    *[
        case(
            f"oss-{k}",
            OSS,
            2,
            est_s=45,
            seq_len=4096,
            global_batch=8,
            micro_batch_size=4,
            model_overrides={**OSS_RANK, **v},
        )
        for k, v in (
            ("vanilla", OSS_VANILLA),
            ("full", {}),
            ("no-sinks", {"softmax_type": "vanilla"}),
            ("no-bias", {"add_bias_linear": False, "add_qkv_bias": False}),
            ("swiglu", {"activation_func": "silu", "activation_func_clamp_value": 0.0, "glu_linear_offset": 0.0}),
            ("no-window", {"window_size": 0, "window_attn_skip_freq": ()}),
        )
    ],
    case(
        "oss-full-sel",
        OSS,
        2,
        est_s=45,
        seq_len=4096,
        global_batch=8,
        micro_batch_size=4,
        model_overrides=OSS_RANK,
        **SEL,
        recompute_modules=("layernorm", "moe_act"),
    ),
    case("qw-oss-shape", QW, 4, est_s=50, seq_len=4096, global_batch=8, micro_batch_size=4),
    # the bias cost judged where it was not measured (fourth batch): half the copies per micro-batch, and fp8 GEMMs; and
    # the two measured cases again (run-to-run spread of the difference)
    *[
        case(
            f"oss-{k}-{tag}",
            OSS,
            2,
            est_s=45,
            seq_len=4096,
            global_batch=8,
            micro_batch_size=mbs,
            precision=prec,
            options=opts,
            model_overrides={**OSS_RANK, **v},
        )
        for tag, mbs, prec, opts in (
            ("mbs2", 2, "bf16", {}),
            ("fp8", 4, "fp8", {"fp8_recipe": "tensorwise"}),
            ("again", 4, "bf16", {}),
        )
        for k, v in (("full", {}), ("no-bias", {"add_bias_linear": False, "add_qkv_bias": False}))
    ],
    # fifth batch (2026-12-01, evening): recompute against its base on one machine, with each base's forward-only time
    # (what recompute re-runs), on the three architectures; TE's fused cross-entropy on a second vocabulary; and the
    # CPU-offload memory at each phase of step 1 with the live tensors, with and without a gc.collect() after the build
    *[
        case(
            f"fo-{k}",
            m,
            n,
            est_s=45 if m != QW else 50,
            options={"forward_only_steps": 4} if k.endswith("base") else {},
            **lay,
        )
        for k, m, n, lay in (
            ("mm-base", MM, 1, {}),
            ("mm-full-uniform1", MM, 1, {**FULL, "recompute_method": "uniform"}),
            ("mm-sel-moe", MM, 1, {**SEL, "recompute_modules": ("moe",)}),
            ("qw-base", QW, 4, {}),
            ("qw-full-uniform1", QW, 4, {**FULL, "recompute_method": "uniform"}),
            ("qw-sel-moe", QW, 4, {**SEL, "recompute_modules": ("moe",)}),
        )
    ],
    case("fo-qw-ce-fusion", QW, 4, est_s=50, options={"cross_entropy_fusion": True}),
    case("fo-ds-base", DS, 1, est_s=45, options={"forward_only_steps": 4}),
    case("fo-ds-full-uniform1", DS, 1, est_s=45, **FULL, recompute_method="uniform"),
    *[
        case(
            f"mem-mm-offload-{f}{tag}",
            MM,
            1,
            est_s=90 if f == "0.5" else 120,
            optimizer_offload_fraction=float(f),
            overlap_cpu_optimizer_d2h_h2d=True,
            options={"memory_phases": True, **({"gc_after_build": True} if tag else {})},
        )
        for f in ("0.5", "1.0")
        for tag in ("", "-gc")
    ],
    case("mem-mm-base", MM, 1, est_s=45, options={"memory_phases": True}),
    # seventh batch (2026-12-01, night): Megatron-LM's default fusions (fused RoPE, gradient-accumulation fusion), which
    # production recipes run and the sweeps above did not; against fo-ds-base / ds-mla-base and fo-mm-base
    case("fu-ds-base", DS, 1, est_s=45, options={"megatron_fusions": True}),
    case("fu-mm-base", MM, 1, est_s=45, options={"megatron_fusions": True}),
    # thirteenth batch (2026-12-03, evening): full block recompute of 1-4 of the Qwen3-30B-A3B slice's 4 layers against
    # no recompute and uniform 1 on one machine: the backward's working set under block recompute (one layer, each
    # block layer its own checkpoint, or the block's N layers) and block recompute's cost per layer recomputed
    *[
        case(f"bk-qw-{k}", QW, 4, est_s=50, **lay)
        for k, lay in (
            ("base", {}),
            ("full-uniform1", {**FULL, "recompute_method": "uniform"}),
            *(
                (f"full-block{n}", {**FULL, "recompute_num_layers": n, "recompute_method": "block"})
                for n in (1, 2, 3, 4)
            ),
        )
    ],
    # fifteenth batch (2026-12-07): the launch-bound regime on whole steps (benchmarks/h200_moe_host.py measures the
    # layers): one EP rank's experts of the published Qwen3-30B-A3B rows (16 of 128 = EP 8) at their 4,096-token
    # sequence and micro-batch 1 / 2 / 4, all 128 experts at micro-batch 1, and one EP 8 rank of MiniMax-M2 (32 of 256)
    *[
        case(
            f"lb-qw-e16-mbs{m}",
            QW,
            4,
            est_s=45,
            seq_len=4096,
            global_batch=8,
            micro_batch_size=m,
            model_overrides={"num_experts": 16},
        )
        for m in (1, 2, 4)
    ],
    case("lb-qw-e128-mbs1", QW, 4, est_s=50, seq_len=4096, global_batch=8),
    *[
        case(
            f"lb-mm-e32-mbs{m}",
            MM,
            2,
            est_s=45,
            seq_len=4096,
            global_batch=8,
            micro_batch_size=m,
            model_overrides={"num_experts": 32},
        )
        for m in (1, 4)
    ],
]


def main() -> int:
    for c in [PROBE, *CASES]:
        sys.stdout.write(json.dumps(c) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
