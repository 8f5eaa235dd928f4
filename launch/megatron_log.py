"""Reading Megatron-LM / slime training logs (no torch here): the lines of Megatron's ``training_log`` and
``report_memory``::

     [2025-08-01 07:19:37] iteration        2/      20 | consumed samples: 256 | elapsed time per iteration (ms): 5432.1
     |
       ... | lm loss: 1.043863E+01 | loss scale: 1.0 | grad norm: 26.203 | number of skipped iterations:   0 | ...
    [Rank 0] (after 1 iterations) memory (MB) | allocated: 10770.3 | max allocated: 15754.8 | reserved: 16334.0 | ...

The time is the average over ``--log-interval`` iterations (use 1). A line cut off without its newline is left out,
undecodable bytes are replaced, a garbled line counts in ``bad_lines``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from launch.harness.results import HarnessResult, StepRecord, cv, median_after_warmup
from specs.units import MIB

__all__ = ["Iteration", "MemoryReport", "MegatronLog", "MegatronLogReader", "parse_megatron_log"]

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
# Megatron closes every field with " |": a value without it was cut off.
_TIME_RE = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM + r"\s*\|", re.I)
_LOSS_RE = re.compile(r"\blm loss:\s*" + _NUM + r"\s*\|", re.I)
_GRAD_RE = re.compile(r"\bgrad norm:\s*" + _NUM + r"\s*\|", re.I)
# The last value of a memory report is a Python float (always a "." or an exponent): "163" was cut off.
_FLOAT_END = r"([-+]?\d+(?:\.\d+|(?:\.\d*)?[eE][-+]?\d+))"
_MEM_RE = re.compile(
    r"\[Rank\s+(\d+)\]\s*\(after\s+(\d+)\s+iterations\)\s*memory \(MB\)\s*"
    r"\|\s*allocated:\s*" + _NUM + r"\s*\|\s*max allocated:\s*" + _NUM
    + r"\s*\|\s*reserved:\s*" + _NUM + r"\s*\|\s*max reserved:\s*" + _FLOAT_END + r"\s*$",
    re.I,
)


@dataclass(frozen=True, slots=True)
class Iteration:
    """One ``iteration N/M`` line."""

    iteration: int
    step_time_s: float
    loss: float = math.nan
    grad_norm: float = math.nan


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """One ``[Rank N] (after K iterations) memory (MB)`` line, in bytes."""

    rank: int
    iteration: int
    allocated_bytes: float
    max_allocated_bytes: float
    reserved_bytes: float
    max_reserved_bytes: float


@dataclass(slots=True)
class MegatronLog:
    """What a log holds so far."""

    iterations: list[Iteration] = field(default_factory=list)
    memory: list[MemoryReport] = field(default_factory=list)
    bad_lines: int = 0  # iteration or memory lines whose fields did not parse (garbled)
    truncated: bool = False  # the log ended in the middle of a line (that line was left out)

    @property
    def peak_reserved_bytes(self) -> float:
        """Max over ranks and reports of ``max reserved`` (bytes); NaN if no report."""
        return max((m.max_reserved_bytes for m in self.memory), default=math.nan)

    @property
    def peak_allocated_bytes(self) -> float:
        return max((m.max_allocated_bytes for m in self.memory), default=math.nan)

    def summary(self, *, global_batch_size: int, seq_length: int, world_size: int,
                warmup_steps: int) -> dict[str, float]:
        """Median step time after ``warmup_steps`` logged iterations, its CV and the throughput (NaN without
        iterations)."""
        times = [it.step_time_s for it in self.iterations]
        kept = times[warmup_steps:] if len(times) > warmup_steps else times
        med = median_after_warmup(times, warmup_steps)
        tps = global_batch_size * seq_length / med / world_size if med > 0 else math.nan
        return {"median_step_time_s": med, "step_time_cv": cv(kept), "tokens_per_s_per_gpu": tps}

    def as_harness_result(self, *, global_batch_size: int, seq_length: int, world_size: int) -> HarnessResult:
        """The steps as the harness's records, for :func:`launch.harness.results.classify_failure`."""
        steps = [StepRecord(step=it.iteration, step_time_s=it.step_time_s, loss=it.loss, grad_norm=it.grad_norm,
                            tokens_per_s_per_gpu=global_batch_size * seq_length / it.step_time_s / world_size)
                 for it in self.iterations]
        return HarnessResult(steps=steps, bad_lines=self.bad_lines)


class MegatronLogReader:
    """Reads a log as it grows: :meth:`feed` bytes, complete lines are parsed, the rest is kept."""

    def __init__(self) -> None:
        self.log = MegatronLog()
        self._pending = b""
        self._by_iter: dict[int, int] = {}

    def feed(self, data: bytes) -> None:
        buf = self._pending + data
        *lines, self._pending = buf.split(b"\n")
        for raw in lines:
            self._line(raw.decode("utf-8", errors="replace").rstrip("\r"))

    def finish(self) -> MegatronLog:
        """The log at its end: a last line without a newline is a cut-off line and is left out."""
        if self._pending.strip():
            self.log.truncated = True
        self._pending = b""
        return self.log

    def _line(self, line: str) -> None:
        if "elapsed time per iteration" in line or _ITER_RE.search(line):
            self._iteration(line)
        elif "memory (MB)" in line:
            self._memory(line)

    def _iteration(self, line: str) -> None:
        m_it, m_t = _ITER_RE.search(line), _TIME_RE.search(line)
        if not (m_it and m_t):
            self.log.bad_lines += 1
            return
        t_ms = float(m_t.group(1))
        if not (math.isfinite(t_ms) and t_ms > 0):
            self.log.bad_lines += 1
            return
        loss = _LOSS_RE.search(line)
        grad = _GRAD_RE.search(line)
        it = Iteration(int(m_it.group(1)), t_ms / 1000.0, float(loss.group(1)) if loss else math.nan,
                       float(grad.group(1)) if grad else math.nan)
        if it.iteration in self._by_iter:  # printed twice (a restart): keep the later line
            self.log.iterations[self._by_iter[it.iteration]] = it
        else:
            self._by_iter[it.iteration] = len(self.log.iterations)
            self.log.iterations.append(it)

    def _memory(self, line: str) -> None:
        m = _MEM_RE.search(line.strip())
        if not m:
            self.log.bad_lines += 1
            return
        vals = [float(m.group(i)) for i in range(3, 7)]
        if not all(math.isfinite(v) and v >= 0 for v in vals):
            self.log.bad_lines += 1
            return
        self.log.memory.append(MemoryReport(int(m.group(1)), int(m.group(2)), *(v * MIB for v in vals)))


def parse_megatron_log(data: bytes | str) -> MegatronLog:
    """Parse a whole log (see the module's docstring)."""
    r = MegatronLogReader()
    r.feed(data.encode() if isinstance(data, str) else data)
    return r.finish()
