"""Reading the harness's JSON lines, and classifying a run that failed (no torch here).

Events, one JSON object a line (rank 0 unless said): ``start``, ``data``, ``pretrain``, ``step`` (``step`` from 1,
``step_time_s``, ``tokens_per_s_per_gpu``, ``loss``, ``grad_norm``), ``summary`` (medians, per-rank peaks, host
memory, ``run_options``), ``grads``, ``census``, ``profile``, ``memory_phase``, ``forward_only``, ``oom`` (any rank),
``error`` and ``refused``."""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.base import FailureKind
from specs.units import GIB

__all__ = ["StepRecord", "HarnessResult", "read_results", "parse_results", "read_lines", "parse_lines",
           "classify_failure", "median_after_warmup", "cv"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """One optimizer step as the harness measured it."""

    step: int  # 1-based step number
    step_time_s: float  # wall time of the step on rank 0 after a device synchronise (seconds)
    tokens_per_s_per_gpu: float
    loss: float = math.nan
    grad_norm: float = math.nan


def median_after_warmup(times: list[float], warmup: int) -> float:
    """Median of ``times`` without the first ``warmup`` entries (all of them if that leaves none); NaN if empty."""
    kept = times[warmup:] if len(times) > warmup else times
    return float(statistics.median(kept)) if kept else math.nan


def cv(values: list[float]) -> float:
    """Coefficient of variation (population standard deviation / mean); 0 for fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    m = statistics.fmean(values)
    return float(statistics.pstdev(values) / m) if m else math.nan


@dataclass(slots=True)
class HarnessResult:
    """Everything read back from one ``--out`` file."""

    steps: list[StepRecord] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    """The text data the run trained on (corpus, bytes, SHA-256), when not synthetic."""
    pretrain: list[dict[str, Any]] = field(default_factory=list)
    """Warm-start steps (``{"event": "pretrain", "step", "loss"}``) before the checkpoint was written."""
    summary: dict[str, Any] = field(default_factory=dict)
    grads: dict[str, Any] = field(default_factory=dict)
    """The gradient dump of a parity run (``{"event": "grads", ...}``), when there is one."""
    census: list[dict[str, Any]] = field(default_factory=list)  # saved-tensor census lines, one per watched module
    profile: dict[str, Any] = field(default_factory=dict)
    """The profiled step's traces (``{"event": "profile", "step", "files"}``, with ``profile_step``), when there are
    any."""
    memory_phases: list[dict[str, Any]] = field(default_factory=list)
    forward_only: dict[str, Any] = field(default_factory=dict)
    ooms: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    bad_lines: int = 0  # lines that were not JSON objects (a rank killed mid-write leaves half a line)

    @property
    def complete(self) -> bool:
        return bool(self.summary)

    @property
    def peak_reserved_bytes(self) -> float:
        """Max over ranks of peak reserved memory (bytes); NaN if unknown."""
        return float(max(self.summary.get("peak_reserved_bytes") or [math.nan]))

    @property
    def peak_allocated_bytes(self) -> float:
        return float(max(self.summary.get("peak_allocated_bytes") or [math.nan]))


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; missing file gives [], non-object lines are skipped."""
    p = Path(path)
    if not p.exists():
        return []
    return parse_lines(p.read_text(errors="replace"))


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of JSON-lines text; lines that are not JSON objects become ``{"event": "_bad"}``."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.append({"event": "_bad"})
            continue
        out.append(obj if isinstance(obj, dict) else {"event": "_bad"})
    return out


def read_results(path: str | Path) -> HarnessResult:
    """Parse a harness ``--out`` file (complete or cut off)."""
    return parse_results(Path(path).read_text(errors="replace") if Path(path).exists() else "")


#: Events kept as :class:`HarnessResult`'s field of that name (the last line wins) or appended to a list field.
_ONE_LINE = {"start": "start", "data": "data", "summary": "summary", "grads": "grads", "profile": "profile",
             "forward_only": "forward_only"}
_MANY_LINES = {"pretrain": "pretrain", "census": "census", "memory_phase": "memory_phases", "oom": "ooms",
               "error": "errors"}


def parse_results(text: str) -> HarnessResult:
    """Parse the harness's JSON lines given as text (e.g. read on another node)."""
    r = HarnessResult()
    for obj in parse_lines(text):
        ev = obj.get("event")
        if ev == "step":
            try:
                loss, gn = obj.get("loss"), obj.get("grad_norm")
                r.steps.append(StepRecord(step=int(obj["step"]), step_time_s=float(obj["step_time_s"]),
                                          tokens_per_s_per_gpu=float(obj.get("tokens_per_s_per_gpu", math.nan)),
                                          loss=math.nan if loss is None else float(loss),
                                          grad_norm=math.nan if gn is None else float(gn)))
            except (KeyError, TypeError, ValueError):
                r.bad_lines += 1
        elif ev in _ONE_LINE:
            setattr(r, _ONE_LINE[ev], obj)
        elif ev in _MANY_LINES:
            getattr(r, _MANY_LINES[ev]).append(obj)
        elif ev == "refused":
            r.refused.extend(str(x) for x in obj.get("reasons", []))
        else:
            r.bad_lines += 1
    return r


_OOM_RE = re.compile(r"(CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation)",
                     re.I)
_IN_USE_RE = re.compile(r"this process has ([0-9.]+) (GiB|MiB) memory in use", re.I)
_NCCL_RE = re.compile(r"(NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|Watchdog "
                      r"caught collective operation timeout|ProcessGroupNCCL)", re.I)


def _oom_bytes(result: HarnessResult, log_text: str) -> float:
    """Memory reached when the run ran out of memory (bytes): the harness's report, else the allocator's message."""
    keys = ("reserved_bytes", "max_allocated_bytes")
    vals = [v for o in result.ooms for k in keys if (v := float(o.get(k) or 0)) > 0]
    if vals:
        return max(vals)
    found = [float(x) * (GIB if unit.lower() == "gib" else 2**20) for x, unit in _IN_USE_RE.findall(log_text)]
    return max(found) if found else math.nan


def classify_failure(returncode: int | None, result: HarnessResult, log_text: str, *,
                     timed_out: bool = False) -> tuple[FailureKind, str, float]:
    """What went wrong in a harness run that did not finish; ``returncode`` None if we killed it.

    Returns (kind, one-line message, memory reached in bytes or NaN); out of memory wins over timeout (the other
    ranks hang in a collective), timeout over crash."""
    if result.ooms or _OOM_RE.search(log_text):
        reached = _oom_bytes(result, log_text)
        where = f" at {reached / GIB:.1f} GiB" if math.isfinite(reached) else ""
        ranks = sorted({int(o.get("rank", -1)) for o in result.ooms})
        rk = f" on rank(s) {', '.join(map(str, ranks))}" if ranks else ""
        return FailureKind.oom, f"out of memory{rk}{where}", reached
    if timed_out:
        return (FailureKind.timeout, f"timed out after {len(result.steps)} finished step(s); the whole process group "
                "was killed", math.nan)
    if result.refused:
        return FailureKind.crash, "refused by the harness: " + "; ".join(result.refused), math.nan
    m = _NCCL_RE.search(log_text)
    if m:
        line = next((ln.strip() for ln in log_text.splitlines() if m.group(1).lower() in ln.lower()), m.group(1))
        return FailureKind.crash, f"NCCL error: {line[:300]}", math.nan
    if result.errors:
        e = result.errors[0]
        msg = f"crash on rank {e.get('rank')}: {e.get('type')}: {str(e.get('message', ''))[:300]}"
        return FailureKind.crash, msg, math.nan
    last = next((ln.strip() for ln in reversed(log_text.splitlines()) if ln.strip()), "")
    return FailureKind.crash, f"crash (exit status {returncode}): {last[:300]}", math.nan
