"""The training precision of the GEMMs."""

from __future__ import annotations

from enum import Enum

#: Megatron-LM's dtype names (``--exp-avg-dtype``, ``--main-grads-dtype``, ...) as ``torch`` names them: the
#: ``torch.<name>`` targets of a saved Megatron-Bridge config, and Bridge's ``str_to_dtype`` keys.
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "uint8": "uint8", "fp8": "float8_e4m3fn"}


class Precision(str, Enum):
    """Training precision of the GEMMs (weights are kept in bf16 too unless ``RunOptions.fp8_param_gather``).

    ``fp8`` is Transformer Engine's per-tensor scaling (delayed or current scaling, Megatron ``--fp8-recipe
    delayed|tensorwise``); ``fp8_blockwise`` is DeepSeek-style 128x128 weight / 1x128 activation blocks (``--fp8-recipe
    blockwise``, Hopper); ``mxfp8`` is the OCP MX format with one E8M0 scale per 32 elements (``--fp8-recipe mxfp8``,
    Blackwell); ``nvfp4`` is NVIDIA's FP4 with one FP8 scale per 16 elements (``--fp4-format e2m1``, Blackwell)."""

    bf16 = "bf16"
    fp8 = "fp8"
    fp8_blockwise = "fp8_blockwise"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"

    def __str__(self) -> str:
        return self.value

    @property
    def low_precision_weight_bytes(self) -> float:
        """Bytes per parameter of the quantised weight copy kept beside the bf16 weight.

        Sources (Transformer Engine ``Float8Tensor`` / ``MXFP8Tensor`` / ``NVFP4Tensor``): per-tensor and blockwise fp8
        keep one fp8 copy (1 B; the transpose is made on the fly on Hopper, block scales add 4 B per 128x128 block,
        negligible); MX formats need both a row-wise and a column-wise quantised copy (their scales run along one axis),
        so mxfp8 keeps 2 x (1 + 1/32) B and nvfp4 2 x (0.5 + 1/16) B. bf16: 0."""
        return {
            Precision.bf16: 0.0, Precision.fp8: 1.0, Precision.fp8_blockwise: 1.0,
            Precision.mxfp8: 2.0 * (1.0 + 1.0 / 32), Precision.nvfp4: 2.0 * (0.5 + 1.0 / 16)}[self]

    @property
    def saved_gemm_input_bytes(self) -> float:
        """Bytes per element of the input a quantised GEMM saves for its weight gradient, with Transformer Engine: fp8 1
        (``uint8`` column-wise copies of the QKV, output-projection and expert fc1 / fc2 inputs, TE ``Float8Tensor``; Q,
        K, V and attention's output stay bf16), mxfp8 1 + 1/32, nvfp4 0.5 + 1/16 (their E8M0 / fp8 scales, TE
        ``MXFP8Tensor`` / ``NVFP4Tensor``; not measured), bf16 2. fp8 measured on 1 x H200
        (``benchmarks/results/h200_te_2026-12-01/call12/census.jsonl``, ``mm-fp8-delayed``)."""
        return {
            Precision.bf16: 2.0, Precision.fp8: 1.0, Precision.fp8_blockwise: 1.0, Precision.mxfp8: 1.0 + 1.0 / 32,
            Precision.nvfp4: 0.5 + 1.0 / 16}[self]
