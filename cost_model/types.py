"""Result types of the cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specs.layout import Layout
from specs.units import GIB


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The analytical model's prediction for one layout (always ``source == "predicted"``).

    Memory is per GPU on the worst pipeline rank, in bytes; time is per optimizer
    step, in seconds, split into parts that add up to ``step_time_s``."""

    layout: Layout
    memory: dict[str, float]
    """Bytes per part on the worst rank: weights, main_grads, optimizer, activations, logits,
    dispatcher_buffers, framework_overhead."""
    peak_bytes: float
    """Sum of ``memory``: predicted peak allocated+reserved bytes per GPU."""
    hbm_bytes: float
    """The GPU's usable memory (bytes)."""
    usable_bytes: float
    """``hbm_bytes`` less the requested headroom (bytes): the fit limit."""
    time: dict[str, float]
    """Seconds per step: compute, recompute, tp_comm, cp_comm, ep_comm, pp_bubble, pp_p2p,
    dp_comm, offload (exposed parts only)."""
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    """6 * N_active * tokens/s/GPU / dense bf16 peak (the seed's convention)."""
    model_tflops_per_gpu: float
    """Megatron's ``num_floating_point_operations`` per step / step time / GPUs, in TFLOP/s."""
    usd_per_million_tokens: float
    host_bytes_per_node: float = 0.0
    """Predicted host memory per node (bytes): the training processes and CPU optimizer offload."""
    host_memory_bytes: float = 0.0
    """The cluster's host memory per node (bytes); 0 = not checked."""
    source: str = "predicted"

    @property
    def host_fits(self) -> bool:
        """The predicted host memory per node is at most the cluster's (True when that is not set)."""
        return not self.host_memory_bytes or self.host_bytes_per_node <= self.host_memory_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def headroom_gib(self) -> float:
        """HBM left free at the predicted peak, GiB (negative: does not fit the GPU at all)."""
        return (self.hbm_bytes - self.peak_bytes) / GIB

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "layout": self.layout.to_dict(), "label": self.layout.label,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "step_time_s": self.step_time_s, "mfu": self.mfu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu, "usd_per_million_tokens": self.usd_per_million_tokens,
            "peak_gib": self.peak_gib, "headroom_gib": self.headroom_gib, "fits": self.fits,
            "host_gib_per_node": self.host_bytes_per_node / GIB, "host_fits": self.host_fits,
            "memory_gib": {k: v / GIB for k, v in self.memory.items()}, "time_s": dict(self.time)}
