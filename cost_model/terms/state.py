"""Model-state bytes per GPU: weights, main gradients and optimizer states.

Source: Megatron's ``megatron/training/theoretical_memory_usage.py`` (18 bytes per parameter, or 6 + 12/DP with the
distributed optimizer; notes §6.1), with the precision-aware optimizer's dtypes, the quantised weight copy of fp8 / MX /
NVFP4, CPU optimizer offload and Megatron FSDP added. Arguments ``dense`` and ``experts`` are the elements of
:mod:`cost_model.terms.params`, ``(n, K)``; results are bytes, ``(n, K)``."""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES, FP32_BYTES

#: Master-weight bytes with the precision-aware optimizer and bf16 params: TE FusedAdam keeps
#: only the 16 remainder bits of the fp32 master (``store_param_remainders``, default True in
#: megatron/core/optimizer/optimizer_config.py); without it the fp32 master takes 4.
MASTER_REMAINDER_BYTES = 2.0

#: Main-gradient bytes with ``grad_reduce_in_fp32`` (``--accumulate-allreduce-grads-in-fp32``, the seed's run
#: block; megatron/training/arguments.py sets it for bf16 with fp32 main grads); without it the gradient buffer
#: has the parameter dtype, bf16 (distributed_data_parallel.py ``grad_dtype``, core_v0.16.0 l.147).
#: With CPU optimizer offload, bytes per owned parameter the GPU keeps for the share it steps (``1 - fraction``):
#: megatron-core 0.19's ``HybridDeviceOptimizer`` is built with ``param_update_in_fp32=True`` and no moment dtypes
#: (``optimizer/__init__.py`` l.532-542): an fp32 clone of each parameter (``_get_sub_optimizer_param_groups``) and
#: fp32 moments, 4 + 8, whatever ``--exp-avg-dtype`` and the precision-aware optimizer say. Measured on 1 x H200
#: (``mem-mm-offload-0.5``, ``docs/measurements.md``): no 2-B remainders, 12 B per GPU-stepped parameter.
OFFLOAD_GPU_STATE_BYTES = 3 * FP32_BYTES

#: Bytes per parameter of the first ``HybridDeviceOptimizer`` megatron-core 0.19 builds over the unsharded parameters
#: before ``DistributedOptimizer.__init__`` replaces it (``distrib_optimizer.py`` l.778-781): its fp32 clones stay alive
#: until Python's cyclic collector runs. **Measured** on 1 x H200 (``benchmarks/results/h200_te_2026-12-01``,
#: ``mem-mm-offload-*`` with and without ``gc.collect()``).
OFFLOAD_BUILD_LEAK_BYTES = FP32_BYTES

#: GPU bytes per offloaded parameter the build leaves reserved with CPU optimizer offload: each is first cloned on the
#: GPU (``_get_sub_optimizer_param_groups``) and the bf16 clone stays in PyTorch's caching allocator. **Measured** on 1
#: x H200 (``benchmarks/results/h200_te_2026-12-01``: 9.4 GiB reserved over allocated at fraction 1.0 on 4.9 G
#: parameters).
OFFLOAD_BUILD_CACHED_BYTES = BF16_BYTES

MAIN_GRAD_BYTES = FP32_BYTES
MAIN_GRAD_BYTES_PARAM_DTYPE = BF16_BYTES

#: Distributed Muon's state per owned parameter: the fp32 master weight and one fp32 momentum buffer
#: (Megatron's ``LayerWiseDistributedOptimizer`` over ``TensorParallelMuon``; Kimi-K2's Megatron-Bridge
#: recipe keeps fp32 states, precision-aware optimizer off). [inferred from the optimizer's definition:
#: Muon keeps one momentum buffer where Adam keeps two moments; not measured]
MUON_BYTES_PER_PARAM = FP32_BYTES + FP32_BYTES


def optimizer_shards(c: TableContext) -> tuple[Array, Array]:
    """How many GPUs share each optimizer state: the distributed optimizer shards the dense states
    over DP x CP (Megatron's ``dp_cp`` group) and the expert states over EDP; without it, 1.

    Returns: (dense shard, expert shard), each ``(n, 1)``."""
    dense = np.where(c.distributed_optimizer, col(c.dp * c.cp), 1.0)
    experts = np.where(c.distributed_optimizer, col(c.edp), 1.0)
    return dense, experts


def owned_params(c: TableContext, dense: Array, experts: Array) -> Array:
    """Parameters whose optimizer state this GPU owns: ``dense / (dp cp) + experts / edp`` with the
    distributed optimizer, all of them without.

    Returns: Elements, ``(n, K)``."""
    dense_shard, exp_shard = optimizer_shards(c)
    return dense / dense_shard + experts / exp_shard


def weight_bytes(c: TableContext, dense: Array, experts: Array) -> Array:
    """bf16 weights plus the quantised copy of fp8 / MX / NVFP4 training: ``(2 + q) x params``,
    q = :attr:`specs.Precision.low_precision_weight_bytes`; with ``fp8_param_gather`` / ``fp4_param_gather``
    the quantised weights only, ``q x params`` (Megatron-core keeps them in an ``uint8`` param buffer with no
    bf16 copy, distributed_data_parallel.py l.139-146; :meth:`specs.RunOptions.low_precision_params`); with
    Megatron FSDP (ZeRO-3) only this GPU's shard (:func:`owned_params`)."""
    low_only = c.options.low_precision_params(c.workload.precision)
    per_param = c.low_precision_weight_bytes if low_only else BF16_BYTES + c.low_precision_weight_bytes
    if c.options.use_megatron_fsdp:
        return per_param * owned_params(c, dense, experts)
    return per_param * (dense + experts)


def main_grad_bytes_per_param(c: TableContext) -> float:
    """Bytes per parameter of the main gradients: :data:`MAIN_GRAD_BYTES` (fp32) with ``grad_reduce_in_fp32``,
    else :data:`MAIN_GRAD_BYTES_PARAM_DTYPE` (bf16; megatron/core/distributed/distributed_data_parallel.py
    ``grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype``; a Float8Tensor's dtype is bf16).

    Returns: Bytes per parameter (a scalar)."""
    return MAIN_GRAD_BYTES if c.options.grad_reduce_in_fp32 else MAIN_GRAD_BYTES_PARAM_DTYPE


def main_grad_bytes(c: TableContext, dense: Array, experts: Array) -> Array:
    """Main gradients, :func:`main_grad_bytes_per_param` per parameter; with FSDP only this GPU's shard."""
    per_param = main_grad_bytes_per_param(c)
    if c.options.use_megatron_fsdp:
        return per_param * owned_params(c, dense, experts)
    return per_param * (dense + experts)


def optimizer_bytes_per_param(c: TableContext) -> Array:
    """The optimizer's bytes per owned parameter.

    Adam: master weights (:data:`MASTER_REMAINDER_BYTES` with the precision-aware optimizer where TE's FusedAdam
    owns them, :meth:`specs.RunOptions.precision_aware_owns_masters`: bf16 and fp8 delayed scaling; else 4) +
    first and second moments (``--exp-avg-dtype`` / ``--exp-avg-sq-dtype``: 4 for fp32, 2 for bf16). 12 with every
    state in fp32 (theoretical_memory_usage.py's 12/DP). Distributed Muon: :data:`MUON_BYTES_PER_PARAM`.

    Returns: Bytes per parameter, ``(n, 1)``."""
    if c.options.optimizer == "dist_muon":
        return np.full_like(c.exp_avg_bytes, MUON_BYTES_PER_PARAM)
    owns = c.options.precision_aware_owns_masters(c.workload.precision)
    master = np.where(c.precision_aware & owns, MASTER_REMAINDER_BYTES, FP32_BYTES)
    return master + c.exp_avg_bytes + c.exp_avg_sq_bytes


def optimizer_state_bytes(c: TableContext, owned: Array) -> Array:
    """Optimizer states kept on the GPU: ``bytes per param x owned params``; with CPU optimizer offload
    (``--optimizer-offload-fraction`` f > 0) the GPU keeps :data:`OFFLOAD_GPU_STATE_BYTES` x ``owned x (1 - f)``
    (HybridDeviceOptimizer moves the share f to the host and steps the rest with fp32 clones and fp32 moments).

    Args: owned: :func:`owned_params`, ``(n, K)``."""
    f = c.offload_fraction
    return np.where(f > 0, OFFLOAD_GPU_STATE_BYTES, optimizer_bytes_per_param(c)) * owned * (1.0 - f)


def offload_build_bytes(c: TableContext, dense: Array, experts: Array) -> Array:
    """GPU bytes the optimizer build leaves behind with CPU optimizer offload (fraction f > 0), on the rank's
    unsharded parameters: the first HybridDeviceOptimizer's fp32 clones of the GPU-stepped share,
    :data:`OFFLOAD_BUILD_LEAK_BYTES` x ``(1 - f)`` (freed only by Python's cyclic collector), and the bf16 clones of the
    offloaded share kept reserved by the caching allocator, :data:`OFFLOAD_BUILD_CACHED_BYTES` x f. 0 without offload.
    """
    f = c.offload_fraction
    per_param = OFFLOAD_BUILD_LEAK_BYTES * (1.0 - f) + OFFLOAD_BUILD_CACHED_BYTES * f
    return np.where(f > 0, per_param * (dense + experts), 0.0)
