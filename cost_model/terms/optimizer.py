"""Optimizer time per step: the GPU Adam step and CPU optimizer offload.

Offload is Megatron's ``HybridDeviceOptimizer`` (``--optimizer-cpu-offload``, ``--optimizer-offload-fraction``,
megatron/core/optimizer/cpu_offloading): the offloaded share of the states is stepped by the host's CPUs, gradients
copied down and parameters back over PCIe. Arguments ``owned`` are :func:`cost_model.terms.state.owned_params`, ``(n,
K)``; results are seconds per step on the slowest rank, ``(n,)``."""

from __future__ import annotations

import numpy as np

from cost_model.terms import state
from cost_model.terms.context import Array, TableContext
from specs.units import BF16_BYTES, FP32_BYTES

#: PCIe bytes per offloaded parameter per step: the fp32 gradient down, the bf16 parameter back.
OFFLOAD_BYTES_PER_PARAM = FP32_BYTES + BF16_BYTES

#: Host bytes per offloaded parameter that megatron-core 0.19's ``HybridDeviceOptimizer`` keeps
#: (``optimizer/cpu_offloading/hybrid_optimizer.py``; ``launch.harness.hostmem.offload_host_bytes``): the CPU fp32
#: parameter (the pinned copy of the bf16 shard is replaced by its fp32 clone, ``param_update_in_fp32``; without the
#: precision-aware optimizer the shard is already fp32), the pinned fp32 gradient and AdamW's two fp32 moments, 4 + 4
#: + 8 with or without the precision-aware optimizer. Measured on 1 x H200 (``benchmarks/results/h200_te_2026-12-01``,
#: ``mem-mm-offload-*``, live tensors after step 1): 16 B per offloaded parameter, no bf16 copy.
HOST_BYTES_PER_OFFLOADED_PARAM = 4 * FP32_BYTES

#: Host RSS beyond the live tensors per offloaded parameter, **measured** on 1 x H200
#: (``benchmarks/results/h200_te_2026-12-01``, ``mem-mm-offload-*``: 4.7 B at fraction 0.5, 3.9 B at 1.0, with and
#: without ``gc.collect()``): the CUDA caching host allocator rounds pinned blocks up and keeps the freed pinned bf16
#: copies of the build; not separated further.
HOST_PINNED_OVERHEAD_BYTES_PER_OFFLOADED_PARAM = 4.0


def optimizer_step_time(c: TableContext, owned: Array) -> Array:
    """The fused Adam step on the GPU, HBM bound: ``optimizer_bytes_per_param x owned x (1 - offload)
    / achieved HBM bandwidth`` on the slowest rank."""
    t = c.cal.optimizer_bytes_per_param * owned * (1 - c.offload_fraction) / c.hbm_bytes_per_s * c.live
    out: Array = t.max(axis=1)
    return out


def offloaded_params(c: TableContext, owned: Array) -> Array:
    """Parameters the CPUs step for the slowest rank: ``owned x offload fraction``.

    Returns: Elements, ``(n,)``."""
    out: Array = (owned * c.offload_fraction * c.live).max(axis=1)
    return out


def cpu_adam_time(c: TableContext, offloaded: Array) -> Array:
    """The host's CPU Adam for all its GPUs' offloaded states: ``offloaded x GPUs per node /
    cpu_adam_params_per_s_per_node`` (the node's CPUs are shared).

    Args: offloaded: :func:`offloaded_params`, ``(n,)``."""
    per_node = float(min(c.gpus_per_node, c.world))
    return offloaded * per_node / c.cal.cpu_adam_params_per_s_per_node


def offload_copy_time(c: TableContext, offloaded: Array) -> Array:
    """PCIe copies of the offloaded parameters: :data:`OFFLOAD_BYTES_PER_PARAM` each, at
    ``pcie_efficiency`` of the GPU's PCIe bandwidth."""
    return offloaded * OFFLOAD_BYTES_PER_PARAM / (c.cluster.gpu.pcie_bytes_per_s * c.cal.pcie_efficiency)


def offload_time(c: TableContext, owned: Array) -> Array:
    """CPU optimizer offload per step: CPU Adam plus the copies, ``offload_overlap`` of the copies
    hidden with ``--overlap-cpu-optimizer-d2h-h2d``.

    Returns: Seconds per step, ``(n,)``; 0 without offload."""
    offloaded = offloaded_params(c, owned)
    hidden: Array = np.where(c.overlap_offload, c.cal.offload_overlap, 0.0)
    return cpu_adam_time(c, offloaded) + offload_copy_time(c, offloaded) * (1 - hidden)


def host_offload_bytes_per_param(c: TableContext) -> Array:
    """Host bytes per offloaded parameter: the kept states (:data:`HOST_BYTES_PER_OFFLOADED_PARAM`, 16 with or without
    the precision-aware optimizer) plus :data:`HOST_PINNED_OVERHEAD_BYTES_PER_OFFLOADED_PARAM`.

    Returns: Bytes per parameter, ``(n, 1)``."""
    return np.full_like(c.offload_fraction, HOST_BYTES_PER_OFFLOADED_PARAM
                        + HOST_PINNED_OVERHEAD_BYTES_PER_OFFLOADED_PARAM)


def host_bytes_per_node(c: TableContext, owned: Array, params: Array | None = None) -> Array:
    """Host memory of one node, bytes ``(n,)``: ``GPUs per node x (host_process_bytes + offloaded x bytes per param +
    leak)``, with CPU optimizer offload the offloaded states (:func:`host_offload_bytes_per_param` x the slowest rank's
    offloaded ``owned`` parameters) and the first HybridDeviceOptimizer's host fp32 clones
    (:data:`cost_model.terms.state.OFFLOAD_BUILD_LEAK_BYTES` x f x the rank's unsharded ``params``; None: ``owned``)."""
    per_node = float(min(c.gpus_per_node, c.world))
    offloaded = offloaded_params(c, owned)
    first = offloaded_params(c, owned if params is None else params)
    return per_node * (c.cal.host_process_bytes + offloaded * host_offload_bytes_per_param(c)[:, 0]
                       + state.OFFLOAD_BUILD_LEAK_BYTES * first)
