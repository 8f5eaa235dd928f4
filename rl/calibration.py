"""Per-cluster factors of the RL step model (:class:`RLCalibration`), with their sources, and their YAML file.

The defaults are anchored on published numbers (each field names its source); ``tune rl calibrate --log FILE`` refits
them from a user's own run and writes a YAML file that ``tune rl --calibration FILE`` reads back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specs._data import dump_user_yaml, load_user_yaml
from specs.errors import TunerError

__all__ = ["DEFAULT_RL_CALIBRATION", "RLCalibration", "load_rl_calibration", "save_rl_calibration"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RLCalibration:
    """Factors of the RL step model. Scales are dimensionless; rates bytes/s; fixed costs seconds."""

    generation_scale: float = 1.0
    """Measured / predicted generation time (multiplies every engine iteration). 1 = aiconfigurator as is."""
    eager_slowdown: float = 1.96
    """Engine iteration time with ``enforce_eager: true`` over CUDA graphs. 1 / (1 - 0.49): NeMo-RL's
    MiniMax-M3 recipe (``grpo-minimax-m3-32n8g-automodel-cp8ep128-noncolocated.yaml``, file index commit
    03334c2c) notes that ``cudagraph_mode: PIECEWISE`` cut generation time by 49 % against eager."""
    training_scale: float = 1.0
    """Measured / predicted training time (multiplies the project estimate's step time)."""
    logprob_scale: float = 1.0
    """Measured / predicted log-prob time."""
    refit_ipc_bytes_per_s: float = 38e9
    """Model bytes refitted per second when colocated (CUDA IPC over ZMQ, same GPUs). NeMo-RL PR #638: DeepSeek-V3
    (1.34e12 bf16 bytes) colocated refit 55 s, of which ~20 s offload: 1.34e12 / 35 s = 38e9."""
    refit_nccl_bytes_per_s: float = 94e9
    """Model bytes refitted per second when not colocated (NCCL broadcast trainer -> engines). NeMo-RL
    ``docs/guides/checkpoint-engine-refit.md`` (HEAD 7ea279ab): DeepSeek-V3, 32 policy nodes -> 4 vLLM
    TP32 nodes, NCCL 14.21 s: 1.34e12 / 14.21 = 94e9."""
    refit_fixed_s: float = 1.0
    """Fixed cost of a refit (metadata, buffer set-up, vLLM ``reset_prefix_cache``)."""
    switch_fixed_s: float = 10.0
    """Fixed cost per colocated step of switching the GPUs between training and generation (vLLM
    sleep / wake, trainer offload / onload, ``empty_cache``). NeMo-RL PR #638: "~20 s overhead due to
    offload" for DeepSeek-V3 colocated; half of it is taken as fixed, the rest as bytes over PCIe."""
    host_link_efficiency: float = 0.5
    """Achieved fraction of PCIe bandwidth for offload / onload copies (pageable host memory)."""
    step_overhead_s: float = 5.0
    """Per-step work outside generation, log-probs, training and refit (data processing, rewards,
    advantages, Ray round trips)."""
    source: str = "defaults (published anchors)"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name == "source":
                continue
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TunerError(f"RL calibration {f.name} must be a non-negative number, got {v!r}")
        for name in ("generation_scale", "training_scale", "logprob_scale", "refit_ipc_bytes_per_s",
                     "refit_nccl_bytes_per_s", "eager_slowdown", "host_link_efficiency"):
            if getattr(self, name) <= 0:
                raise TunerError(f"RL calibration {name} must be positive, got {getattr(self, name)!r}")

    def replace(self, **changes: Any) -> RLCalibration:
        return dataclasses.replace(self, **changes)


DEFAULT_RL_CALIBRATION = RLCalibration()


def load_rl_calibration(path: str | Path) -> RLCalibration:
    """Read a YAML file written by :func:`save_rl_calibration` (unknown keys rejected).

    Raises TunerError: unreadable file, not a mapping, unknown keys (listed with the accepted ones), bad values."""
    p = Path(path)
    data = load_user_yaml(p, f"--calibration {str(p)!r}", "an RL calibration YAML")
    if not isinstance(data, dict):
        raise TunerError(f"--calibration {str(p)!r}: expected a mapping of RL calibration factors")
    data = data.get("rl_calibration", data)
    names = {f.name for f in dataclasses.fields(RLCalibration)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TunerError(f"--calibration {str(p)!r}: unknown keys {unknown}; accepted: {', '.join(sorted(names))}")
    try:
        values: dict[str, Any] = {k: (str(v) if k == "source" else float(v)) for k, v in data.items()}
        return RLCalibration(**values)
    except (TypeError, ValueError) as e:
        raise TunerError(f"--calibration {str(p)!r}: {e}") from None


def save_rl_calibration(cal: RLCalibration) -> str:
    """YAML text of ``cal`` (pure: the caller writes it)."""
    return dump_user_yaml({"rl_calibration": dataclasses.asdict(cal)})
