"""Host memory of a trial: what a process holds, and what CPU optimizer offload takes (from Linux's ``/proc``; no
torch)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["offload_host_bytes", "parse_kib_fields", "process_memory", "system_memory"]


def parse_kib_fields(text: str, names: tuple[str, ...]) -> dict[str, int]:
    """``{name: bytes}`` of ``Name:   123 kB`` lines (``/proc/*/status``, ``/proc/meminfo``); absent names are left out.
    """
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
    """``{"rss_bytes", "peak_rss_bytes"}`` of a process (``VmRSS``, ``VmHWM``); empty where ``/proc`` is not readable.
    """
    return _proc_fields(f"/proc/{pid}/status", {"VmRSS": "rss_bytes", "VmHWM": "peak_rss_bytes"})


def system_memory() -> dict[str, int]:
    """``{"total_bytes", "available_bytes"}`` of this machine (``MemTotal``, ``MemAvailable``); empty where unreadable.
    """
    return _proc_fields("/proc/meminfo", {"MemTotal": "total_bytes", "MemAvailable": "available_bytes"})


def _proc_fields(path: str, names: dict[str, str]) -> dict[str, int]:
    """The fields ``names`` of a ``/proc`` file, renamed; empty where it is not readable."""
    try:
        f = parse_kib_fields(Path(path).read_text(), tuple(names))
    except OSError:
        return {}
    return {new: f[old] for old, new in names.items() if old in f}


def offload_host_bytes(offloaded_params: int) -> int:
    """Host bytes of megatron-core's CPU optimizer offload for ``offloaded_params`` parameters (one rank): fp32
    parameter, pinned fp32 gradient, AdamW's two fp32 moments, 16 bytes with or without the precision-aware optimizer
    (megatron-core 0.19 ``optimizer/cpu_offloading/hybrid_optimizer.py``;
    ``benchmarks/results/h200_te_2026-12-01``). Process memory, pinned rounding and the first optimizer's clones
    come on top."""
    return int(offloaded_params) * 16
