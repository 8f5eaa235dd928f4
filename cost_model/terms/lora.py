"""LoRA fine-tuning (``--task lora``): the trainable adapters instead of the frozen base weights.

The base weights stay in memory (bf16) but have no main gradients and no optimizer state (``requires_grad`` False, so
megatron-core's DDP gives them no grad buffer and the optimizer no shard); each adapted linear layer gets two low-rank
matrices, ``A`` (in x r) and ``B`` (r x out), with their own main gradients and optimizer state (Megatron-Bridge
``peft/lora.py`` at 067f987d: ``ParallelLinearAdapter(in_features, out_features, dim)``; grouped MoE experts share one
adapter per EP rank, ``share_expert_adapters=True``). The adapters follow the base layer's tensor split, so an
adapter's elements per GPU are ``r (in + out) / tp`` (``/ etp`` for the experts'). The frozen GEMMs skip their weight
gradient (:func:`gemm_passes`); the adapters' own work is memory-bound (:func:`adapter_time`). Returns of the
parameter functions are elements, ``(n, K)``, as in :mod:`cost_model.terms.params`."""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.errors import TunerError
from specs.units import BF16_BYTES

#: bf16 passes over HBM of an adapted layer's input, per token, forward + backward, of Megatron-Bridge's unfused
#: ``LoRALinear`` (``peft/lora_layers.py`` and ``ParallelLinearAdapter.forward`` in ``peft/utils.py`` at 067f987d,
#: ``dropout`` 0): ``linear_in`` reads the input (forward), its weight gradient reads it again and its input gradient
#: writes one, and autograd sums that into the base layer's input gradient (two reads, one write). [inferred from the
#: code, not measured]
ADAPTER_INPUT_PASSES = 6.0

#: bf16 passes over HBM of an adapted layer's output, per token, forward + backward (same source): ``linear_out``
#: writes the output, ``x * (alpha / dim)`` reads and writes it, ``linear_output + adapter_output`` reads two and
#: writes one; backward, the scale reads and writes the gradient and ``linear_out``'s input and weight gradients each
#: read it. The rank-wide tensors between the two GEMMs (r = 16..32 elements a token) are left out. [inferred from the
#: code, not measured]
ADAPTER_OUTPUT_PASSES = 10.0


def _lora(c: TableContext) -> bool:
    return c.workload.task == "lora"


def check_targets(c: TableContext) -> None:
    """Raises TunerError: ``linear_qkv`` on a multi-latent-attention model, which does not have it
    (:meth:`specs.Workload.on_model` drops it from the default targets)."""
    if _lora(c) and c.dims.is_mla and "linear_qkv" in c.workload.lora_target_modules:
        rest = ",".join(m for m in c.workload.lora_target_modules if m != "linear_qkv") or "linear_proj"
        raise TunerError("--lora-target-modules linear_qkv: this model has multi-latent attention, which has no "
                         f"linear_qkv; give linear_proj, linear_fc1 or linear_fc2 (e.g. --lora-target-modules {rest})")


def _per_module(c: TableContext) -> tuple[float, float, float, float, float, float, float]:
    """``r (in + out)`` of each target in one layer: qkv, proj, dense fc1, dense fc2, expert fc1, expert fc2, and the
    shared experts' fc1 + fc2 (0 for a target not adapted)."""
    m, w = c.dims, c.workload
    r = float(w.lora_rank)
    t = set(w.lora_target_modules)
    g = 2.0 if m.gated else 1.0
    qkv = r * (m.h + m.q_dim + m.kv_dim) if "linear_qkv" in t else 0.0
    proj = r * (m.ctx_dim + m.h) if "linear_proj" in t else 0.0
    fc1 = r * (m.h + g * m.ffn) if "linear_fc1" in t else 0.0
    fc2 = r * (m.ffn + m.h) if "linear_fc2" in t else 0.0
    efc1 = r * (m.h + g * m.moe_ffn) if "linear_fc1" in t else 0.0
    efc2 = r * (m.moe_ffn + m.h) if "linear_fc2" in t else 0.0
    shared = ((r * (m.h + g * m.shared_ffn) if "linear_fc1" in t else 0.0)
              + (r * (m.shared_ffn + m.h) if "linear_fc2" in t else 0.0))
    return qkv, proj, fc1, fc2, efc1, efc2, shared if m.shared_ffn else 0.0


def adapter_params(c: TableContext) -> tuple[Array, Array]:
    """(dense, expert) adapter elements per GPU of the rank's layers: attention and dense-MLP / shared-expert adapters
    split by TP, the MoE layers' one shared expert adapter per EP rank split by ETP.

    Returns: Two arrays of elements, ``(n, K)``."""
    qkv, proj, fc1, fc2, efc1, efc2, shared = _per_module(c)
    tp, etp = col(c.tp), col(c.etp)
    dense = (c.layers * (qkv + proj) + c.dense_layers * (fc1 + fc2) + c.moe_layers * shared) / tp
    experts = c.moe_layers * (efc1 + efc2) / etp if c.dims.is_moe else np.zeros_like(dense)
    return dense, experts


def trainable_params(c: TableContext, dense: Array, experts: Array) -> tuple[Array, Array]:
    """The parameters with gradients and optimizer state: the adapters with ``--task lora``, else ``dense``,
    ``experts``."""
    return adapter_params(c) if _lora(c) else (dense, experts)


def adapter_weight_bytes(c: TableContext) -> Array | float:
    """The adapters' weights (bf16, the base's parameter dtype: ``lora_dtype`` None), bytes ``(n, K)``; 0 without
    LoRA."""
    if not _lora(c):
        return 0.0
    dense, experts = adapter_params(c)
    return BF16_BYTES * (dense + experts)


def gemm_passes(c: TableContext, full: float) -> float:
    """A weight GEMM's forward + backward over its forward: ``full`` (forward, input gradient, weight gradient), or one
    less with LoRA, whose frozen weights get no weight gradient (the adapters' own GEMMs, ``2 r (in + out)`` per token,
    are left out: at r = 32 they are about 2% of a 4,096-wide layer's)."""
    return full - 1.0 if _lora(c) else full


def _passes(inputs: Array | float, outputs: Array | float) -> Array | float:
    """bf16 bytes per token of one adapted layer whose input and output per GPU are ``inputs`` / ``outputs`` wide."""
    return BF16_BYTES * (ADAPTER_INPUT_PASSES * inputs + ADAPTER_OUTPUT_PASSES * outputs)


def adapter_time(c: TableContext, copies: Array) -> tuple[Array, Array, Array]:
    """The adapters' memory-bound work per layer per micro-batch, forward + backward: attention side (qkv, proj), a
    dense layer's MLP (fc1, fc2) and a MoE layer's (shared experts and routed experts, the latter per routed copy).

    Bytes per token of an adapted layer are :data:`ADAPTER_INPUT_PASSES` x its input width plus
    :data:`ADAPTER_OUTPUT_PASSES` x its output width per GPU (bf16): a column-parallel layer (qkv, fc1) sees the
    whole input (sequence-parallel input gathered) and ``1 / tp`` of the output, a row-parallel one (proj, fc2)
    ``1 / tp`` of the input and the whole output; experts split by ETP over ``copies``
    (:func:`cost_model.terms.activations.routed_token_copies`). Priced at the achieved HBM bandwidth. The adapters'
    GEMM FLOPs (``2 r (in + out)`` a token) are left out: at r = 32 about 1% of the frozen layer's.

    Args: copies: routed token copies per GPU, ``(n, 1)`` (ignored for a dense model).

    Returns: Three arrays of seconds, ``(n, 1)``; zeros without ``--task lora``."""
    zero = np.zeros_like(c.tokens)
    if not _lora(c):
        return zero, zero, zero
    m, t = c.dims, set(c.workload.lora_target_modules)
    tp, etp = col(c.tp), col(c.etp)
    g = 2.0 if m.gated else 1.0

    def mlp(ffn: float, width: Array) -> Array | float:
        return ((_passes(m.h, g * ffn / width) if "linear_fc1" in t else 0.0)
                + (_passes(ffn / width, m.h) if "linear_fc2" in t else 0.0))

    attn = ((_passes(m.h, (m.q_dim + m.kv_dim) / tp) if "linear_qkv" in t else 0.0)
            + (_passes(m.ctx_dim / tp, m.h) if "linear_proj" in t else 0.0))
    dense = mlp(float(m.ffn), tp)
    moe = (c.tokens * mlp(float(m.shared_ffn), tp) if m.shared_ffn else zero)
    if m.is_moe:
        moe = moe + copies * mlp(float(m.moe_ffn), etp)
    bw = c.hbm_bytes_per_s
    return zero + c.tokens * attn / bw, zero + c.tokens * dense / bw, zero + moe / bw
