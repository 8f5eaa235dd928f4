"""Refit (train -> generation weight resharding) and the colocated switch: bandwidth models. Refit streams the model
once per step (NeMo-RL: ``stream_weights_via_ipc_zmq`` colocated, ``broadcast_weights_for_collective`` over NCCL
otherwise; slime: ``update_weights``) at a rate anchored on NeMo-RL's published refit times
(:class:`~rl.calibration.RLCalibration`), bounded below by each rollout node's network link when the trainer is
elsewhere."""

from __future__ import annotations

from rl.calibration import RLCalibration

__all__ = ["refit_s", "switch_s"]


def refit_s(*, model_bytes: float, colocated: bool, engine_gpus: int, gpus_per_node: int,
            inter_node_bytes_per_s: float, calibration: RLCalibration) -> float:
    """Seconds to refit the engines with new weights (``model_bytes``; ``engine_gpus`` = tp x pp x attention-dp).

    Colocated: ``fixed + model_bytes / refit_ipc_bytes_per_s``. Not colocated: ``fixed + max(model_bytes /
    refit_nccl_bytes_per_s, per_node_bytes / inter_node_bytes_per_s)``, ``per_node_bytes = model_bytes x gpus_per_node /
    engine_gpus`` (a broadcast delivers a node's share of the copies to every node at once)."""
    if colocated:
        return calibration.refit_fixed_s + model_bytes / calibration.refit_ipc_bytes_per_s
    per_node = model_bytes * gpus_per_node / max(engine_gpus, 1)
    return calibration.refit_fixed_s + max(model_bytes / calibration.refit_nccl_bytes_per_s,
                                           per_node / inter_node_bytes_per_s)


def switch_s(*, trainer_bytes_per_gpu: float, engine_bytes_per_gpu: float, pcie_bytes_per_s: float,
             calibration: RLCalibration) -> float:
    """Seconds per colocated step to move the trainer's and the engine's state off and back onto the GPUs:
    ``switch_fixed_s + 2 (trainer_bytes + engine_bytes) / (pcie x host_link_efficiency)`` per GPU, each over its own
    PCIe link. The trainer's optimizer states and weights go to the host and back (NeMo-RL ``offload_before_refit`` /
    ``offload_after_refit``), the engine's weights by its sleep and wake (vLLM ``sleep(level=1)``; slime ``--offload``).
    """
    rate = pcie_bytes_per_s * calibration.host_link_efficiency
    return calibration.switch_fixed_s + 2.0 * (trainer_bytes_per_gpu + engine_bytes_per_gpu) / rate
