"""LoRA fine-tuning (``--task lora``): the trainable adapters instead of the frozen base weights.

The base weights stay in memory (bf16) but have no main gradients and no optimizer state (``requires_grad`` False, so
megatron-core's DDP gives them no grad buffer and the optimizer no shard); each adapted linear layer gets two low-rank
matrices, ``A`` (in x r) and ``B`` (r x out), with their own main gradients and optimizer state (Megatron-Bridge
``peft/lora.py`` at 067f987d: ``ParallelLinearAdapter(in_features, out_features, dim)``; grouped MoE experts share one
adapter per EP rank, ``share_expert_adapters=True``). The adapters follow the base layer's tensor split, so an
adapter's elements per GPU are ``r (in + out) / tp`` (``/ etp`` for the experts'). The frozen GEMMs skip their weight
gradient (:func:`gemm_passes`). Returns are elements, ``(n, K)``, as in :mod:`cost_model.terms.params`.
"""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.errors import TunerError
from specs.units import BF16_BYTES

__all__ = ["adapter_params", "adapter_weight_bytes", "check_targets", "gemm_passes", "trainable_params"]


def _lora(c: TableContext) -> bool:
    return c.workload.task == "lora"


def check_targets(c: TableContext) -> None:
    """Refuse a target the model does not have.

    Raises:
        TunerError: ``linear_qkv`` on a multi-latent-attention model (its attention has ``linear_q_proj`` /
            ``linear_kv_down_proj`` ... instead).
    """
    if _lora(c) and c.dims.is_mla and "linear_qkv" in c.workload.lora_target_modules:
        raise TunerError("--lora-target-modules linear_qkv: this model has multi-latent attention, which has no linear_qkv "
                         "(its projections are linear_q_proj, linear_kv_down_proj, linear_kv_up_proj); leave linear_qkv out")


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
    shared = (r * (m.h + g * m.shared_ffn) if "linear_fc1" in t else 0.0) + (r * (m.shared_ffn + m.h) if "linear_fc2" in t else 0.0)
    return qkv, proj, fc1, fc2, efc1, efc2, shared if m.shared_ffn else 0.0


def adapter_params(c: TableContext) -> tuple[Array, Array]:
    """(dense, expert) adapter elements per GPU of the rank's layers: attention and dense-MLP / shared-expert adapters
    split by TP, the MoE layers' one shared expert adapter per EP rank split by ETP.

    Returns:
        Two arrays of elements, ``(n, K)``.
    """
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
