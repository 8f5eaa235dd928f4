"""Host (CPU) memory of a trial: what a process holds, and what CPU optimizer offload should take (no torch here).

Read from Linux's ``/proc`` (``VmRSS`` / ``VmHWM`` of ``/proc/<pid>/status``, ``MemTotal`` /
``MemAvailable`` of ``/proc/meminfo``), so it works in the harness and in CI alike.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["offload_host_bytes", "parse_kib_fields", "process_memory", "system_memory"]


def parse_kib_fields(text: str, names: tuple[str, ...]) -> dict[str, int]:
    """``{name: bytes}`` of ``Name:   123 kB`` lines (``/proc/*/status``, ``/proc/meminfo``); absent names are left out."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            parts = rest.split()
            if parts and parts[0].isdigit():
                mult = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
                out[key] = int(parts[0]) * mult
    return out


def process_memory(pid: str | int = "self") -> dict[str, int]:
    """``{"rss_bytes", "peak_rss_bytes"}`` of a process (``VmRSS``, ``VmHWM``); empty where ``/proc`` is not readable."""
    try:
        f = parse_kib_fields(Path(f"/proc/{pid}/status").read_text(), ("VmRSS", "VmHWM"))
    except OSError:
        return {}
    out = {}
    if "VmRSS" in f:
        out["rss_bytes"] = f["VmRSS"]
    if "VmHWM" in f:
        out["peak_rss_bytes"] = f["VmHWM"]
    return out


def system_memory() -> dict[str, int]:
    """``{"total_bytes", "available_bytes"}`` of this machine (``MemTotal``, ``MemAvailable``); empty where unreadable."""
    try:
        f = parse_kib_fields(Path("/proc/meminfo").read_text(), ("MemTotal", "MemAvailable"))
    except OSError:
        return {}
    return {k2: f[k1] for k1, k2 in (("MemTotal", "total_bytes"), ("MemAvailable", "available_bytes")) if k1 in f}


def offload_host_bytes(offloaded_params: int, *, precision_aware: bool) -> int:
    """Host bytes that megatron-core's CPU optimizer offload holds for ``offloaded_params`` parameters (one rank).

    Per offloaded parameter, read in megatron-core 0.19 ``optimizer/cpu_offloading/hybrid_optimizer.py`` and measured
    on 1 x H200 (the live tensors after step 1, ``benchmarks/results/h200_te_2026-12-01``): the CPU fp32 parameter
    (with the
    precision-aware optimizer the pinned copy of the bf16 shard is replaced by its fp32 clone, ``param_update_in_fp32``;
    without it the fp32 main shard is copied), the pinned fp32 gradient buffer (``_set_sub_optimizer_grads``) and
    AdamW's ``exp_avg`` and ``exp_avg_sq`` (fp32): 4 + 4 + 8 = 16 bytes either way (``precision_aware`` is kept for
    the callers; an earlier reading counted the bf16 copy, 18). The process's own memory, the pinned allocator's
    rounding and the first optimizer's clones (:mod:`cost_model.terms.optimizer`) come on top. ``offloaded_params``:
    megatron offloads whole parameters in order until their count reaches ``fraction x`` the rank's optimizer
    parameters, so it is that product rounded up to a parameter boundary.
    """
    del precision_aware
    return int(offloaded_params) * 16
