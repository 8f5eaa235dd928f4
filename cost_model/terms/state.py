"""Model-state bytes per GPU: weights, main gradients and optimizer states.

Source: Megatron's ``megatron/training/theoretical_memory_usage.py`` (18 bytes per parameter, or
6 + 12/DP with the distributed optimizer; notes §6.1), with the precision-aware optimizer's
dtypes, the quantised weight copy of fp8 / MX / NVFP4, CPU optimizer offload and Megatron FSDP
added. Arguments ``dense`` and ``experts`` are the elements of :mod:`cost_model.terms.params`,
``(n, K)``; results are bytes, ``(n, K)``.
"""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES, FP32_BYTES

__all__ = [
    "main_grad_bytes",
    "optimizer_bytes_per_param",
    "optimizer_shards",
    "optimizer_state_bytes",
    "owned_params",
    "weight_bytes",
]

#: Master-weight bytes with the precision-aware optimizer and bf16 params: TE FusedAdam keeps
#: only the 16 remainder bits of the fp32 master (``store_param_remainders``, default True in
#: megatron/core/optimizer/optimizer_config.py); without it the fp32 master takes 4.
MASTER_REMAINDER_BYTES = 2.0

#: Main-gradient bytes: fp32 (``--accumulate-allreduce-grads-in-fp32``, the seed's run block;
#: megatron/training/arguments.py sets it for bf16 with fp32 main grads).
MAIN_GRAD_BYTES = FP32_BYTES


def optimizer_shards(c: TableContext) -> tuple[Array, Array]:
    """How many GPUs share each optimizer state: the distributed optimizer shards the dense states
    over DP x CP (Megatron's ``dp_cp`` group) and the expert states over EDP; without it, 1.

    Returns:
        (dense shard, expert shard), each ``(n, 1)``.
    """
    dense = np.where(c.distributed_optimizer, col(c.dp * c.cp), 1.0)
    experts = np.where(c.distributed_optimizer, col(c.edp), 1.0)
    return dense, experts


def owned_params(c: TableContext, dense: Array, experts: Array) -> Array:
    """Parameters whose optimizer state this GPU owns: ``dense / (dp cp) + experts / edp`` with the
    distributed optimizer, all of them without.

    Returns:
        Elements, ``(n, K)``.
    """
    dense_shard, exp_shard = optimizer_shards(c)
    return dense / dense_shard + experts / exp_shard


def weight_bytes(c: TableContext, dense: Array, experts: Array) -> Array:
    """bf16 weights plus the quantised copy of fp8 / MX / NVFP4 training: ``(2 + q) x params``,
    q = :attr:`specs.Precision.low_precision_weight_bytes`; with Megatron FSDP (ZeRO-3) only this
    GPU's shard (:func:`owned_params`).

    Returns:
        Bytes, ``(n, K)``.
    """
    per_param = BF16_BYTES + c.low_precision_weight_bytes
    if c.options.use_megatron_fsdp:
        return per_param * owned_params(c, dense, experts)
    return per_param * (dense + experts)


def main_grad_bytes(c: TableContext, dense: Array, experts: Array) -> Array:
    """fp32 main gradients (:data:`MAIN_GRAD_BYTES` per parameter); with FSDP only this GPU's shard.

    Returns:
        Bytes, ``(n, K)``.
    """
    if c.options.use_megatron_fsdp:
        return MAIN_GRAD_BYTES * owned_params(c, dense, experts)
    return MAIN_GRAD_BYTES * (dense + experts)


def optimizer_bytes_per_param(c: TableContext) -> Array:
    """Adam's bytes per owned parameter: master weights (:data:`MASTER_REMAINDER_BYTES` with the
    precision-aware optimizer, else 4) + first and second moments (``--exp-avg-dtype`` /
    ``--exp-avg-sq-dtype``: 4 for fp32, 2 for bf16). 12 with every state in fp32
    (theoretical_memory_usage.py's 12/DP).

    Returns:
        Bytes per parameter, ``(n, 1)``.
    """
    master = np.where(c.precision_aware, MASTER_REMAINDER_BYTES, FP32_BYTES)
    return master + c.exp_avg_bytes + c.exp_avg_sq_bytes


def optimizer_state_bytes(c: TableContext, owned: Array) -> Array:
    """Optimizer states kept on the GPU: ``bytes per param x owned params x (1 - offload fraction)``
    (``--optimizer-offload-fraction`` moves that share to the host, HybridDeviceOptimizer).

    Args:
        owned: :func:`owned_params`, ``(n, K)``.

    Returns:
        Bytes, ``(n, K)``.
    """
    return optimizer_bytes_per_param(c) * owned * (1.0 - c.offload_fraction)
