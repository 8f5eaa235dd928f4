"""A continuous-batching discrete-event simulation of rollout engines, scheduling as vLLM v1
(``vllm/v1/core/sched/scheduler.py``): requests are admitted first come, first served while fewer than ``max_num_seqs``
run and the KV cache holds their tokens plus one block of headroom per running sequence; each decode iteration costs the
:class:`~rl.engine.LatencyTable` latency at the running count and mean context, admitted tokens one prefill; when the
next iteration would not fit, the last admitted request is preempted and queued first again, to be prefilled again
(preemption by recompute).

Between two events (completion, admission, preemption, the KV cache filling) the batch does not change, so the ``k``
iterations in between cost ``k`` times the latency at the segment's mean context. Event times do not depend on the
latency values, so a latency scale factor scales decode and prefill times exactly."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rl.engine import LatencyTable
from specs.errors import TunerError

__all__ = ["EngineRun", "RolloutRun", "simulate_engine", "simulate_rollout"]

_INT = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineRun:
    """What one engine did with its requests (seconds, tokens, counts)."""

    makespan_s: float
    """From the first admission to the last completion."""
    prefill_s: float
    iterations: int
    """Decode iterations run."""
    preemptions: int
    generated_tokens: int
    peak_running: int
    mean_tpot_s: float = 0.0
    """Time per output token after the first, averaged over requests of 2 tokens or more, as
    ``vllm bench serve`` reports TPOT: ``(finish - first token) / (tokens - 1)``. A request's first
    token comes with the first decode iteration after its admission's prefill; prefills of other
    requests admitted meanwhile count in its TPOT, as they stall it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutRun:
    """A rollout over several identical engines; it ends when the slowest engine ends."""

    engines: tuple[EngineRun, ...]

    @property
    def makespan_s(self) -> float:
        return max((e.makespan_s for e in self.engines), default=0.0)

    @property
    def preemptions(self) -> int:
        return sum(e.preemptions for e in self.engines)



def simulate_engine(prompt_lens: _INT, response_lens: _INT, latency: LatencyTable, *, kv_capacity_tokens: int,
                    max_num_seqs: int, block_size: int = 16) -> EngineRun:
    """Simulate one engine serving every request (``prompt_lens``, ``response_lens`` >= 1, shape ``(r,)``, queued at
    time 0) with ``kv_capacity_tokens`` of KV cache over its GPUs and at most ``max_num_seqs`` running; one
    ``block_size`` block per running sequence is kept as headroom. Returns the makespan and its parts.

    Raises TunerError: a single request longer than the whole KV cache."""
    prompt = np.asarray(prompt_lens, dtype=np.int64)
    resp = np.asarray(response_lens, dtype=np.int64)
    r = len(prompt)
    if r == 0:
        return EngineRun(makespan_s=0.0, prefill_s=0.0, iterations=0, preemptions=0, generated_tokens=0, peak_running=0)
    longest = int((prompt + resp).max())
    if longest + 2 * block_size > kv_capacity_tokens:
        raise TunerError(
            f"a request of {longest:,} tokens does not fit in the engine's KV cache of {kv_capacity_tokens:,} tokens; "
            "give the engine more GPUs (tp), a higher gpu_memory_utilization, or shorter sequences"
        )
    e = _Engine(prompt.tolist(), resp.tolist(), latency, int(kv_capacity_tokens), max_num_seqs, block_size)
    e.run()
    multi = resp > 1
    decode = (np.asarray(e.finish_t)[multi] - np.asarray(e.first_t)[multi]) / (resp[multi] - 1)
    tpot = float(np.mean(decode)) if np.any(multi) else 0.0
    return EngineRun(
        makespan_s=e.t, prefill_s=e.prefill_t, iterations=e.it, preemptions=e.preemptions,
        generated_tokens=int(resp.sum()), peak_running=e.peak, mean_tpot_s=tpot,
    )


class _Engine:
    """One engine's simulation state (:func:`simulate_engine`): per-request Python lists, not numpy arrays (the loop
    touches one element at a time, where numpy scalars cost ~10x), and the event heaps."""

    def __init__(self, plen: list[int], rlen: list[int], latency: LatencyTable, cap: int, max_num_seqs: int,
                 block_size: int) -> None:
        r = len(plen)
        self.plen, self.rlen, self.latency = plen, rlen, latency
        self.cap, self.max_num_seqs, self.block_size = cap, max_num_seqs, block_size
        self.done = [0] * r  # tokens generated before the current admission
        self.start = [0] * r  # iteration of the current admission
        self.version = [0] * r
        self.running = [False] * r
        self.waiting: deque[int] = deque(range(r))
        self.finish: list[tuple[int, int, int]] = []  # (finish iteration, request, version)
        self.order: list[tuple[int, int, int]] = []  # (-admission counter, request, version): top = latest admitted
        self.first_t = [math.nan] * r  # time of each request's first token
        self.finish_t = [math.nan] * r
        self.awaiting_first: list[int] = []  # admitted since the last decode segment
        self.it = self.used = self.n = self.counter = self.preemptions = self.peak = 0
        self.t = self.prefill_t = 0.0

    def run(self) -> None:
        """Admit, prefill and decode until every request has finished."""
        just_preempted = False
        while True:
            admitted_tokens = 0 if just_preempted else self._admit()
            just_preempted = False
            if admitted_tokens:
                dt = self.latency.prefill_s(admitted_tokens)
                self.t += dt
                self.prefill_t += dt
            self.peak = max(self.peak, self.n)
            if self.n == 0:  # nothing waits either: simulate_engine refuses a request the cache cannot hold
                return
            if self.used + self.n * (1 + self.block_size) > self.cap:
                self._preempt()
                just_preempted = True
                continue
            self._decode()

    def _admit(self) -> int:
        """Admit waiting requests, first come first served, while they fit; the tokens to prefill."""
        admitted = 0
        while self.waiting and self.n < self.max_num_seqs:
            i = self.waiting[0]
            need = self.plen[i] + self.done[i]
            if self.used + need + (self.n + 1) * self.block_size > self.cap:
                break
            self.waiting.popleft()
            self.running[i] = True
            self.start[i] = self.it
            self.version[i] += 1
            self.used += need
            self.n += 1
            heapq.heappush(self.finish, (self.it + self.rlen[i] - self.done[i], i, self.version[i]))
            heapq.heappush(self.order, (-self.counter, i, self.version[i]))
            self.counter += 1
            admitted += need
            self.awaiting_first.append(i)
        return admitted

    def _preempt(self) -> None:
        """Preempt the latest-admitted running request (recomputed when it is admitted again)."""
        while True:
            _, j, v = heapq.heappop(self.order)
            if self.running[j] and self.version[j] == v:
                break
        self.running[j] = False
        self.done[j] += self.it - self.start[j]
        self.used -= self.plen[j] + self.done[j]
        self.n -= 1
        self.waiting.appendleft(j)
        self.preemptions += 1

    def _decode(self) -> None:
        """Decode up to the next event (a completion, or a full KV cache), then retire the finished requests."""
        finish, running, version, n = self.finish, self.running, self.version, self.n
        while not (running[finish[0][1]] and version[finish[0][1]] == finish[0][2]):
            heapq.heappop(finish)
        k_fin = finish[0][0] - self.it
        k_mem = (self.cap - self.used - n * self.block_size) // n
        k = max(1, min(k_fin, k_mem))
        ctx_mid = self.used / n + (k - 1) / 2.0
        dt = k * self.latency.decode_s(n, ctx_mid)
        for i in self.awaiting_first:
            if running[i] and math.isnan(self.first_t[i]):
                self.first_t[i] = self.t + dt / k
        self.awaiting_first.clear()
        self.t += dt
        self.it += k
        self.used += n * k
        while finish and finish[0][0] <= self.it:
            _, i, v = heapq.heappop(finish)
            if running[i] and version[i] == v:
                running[i] = False
                self.used -= self.plen[i] + self.rlen[i]
                self.n -= 1
                self.finish_t[i] = self.t


def simulate_rollout(prompt_lens: _INT, response_lens: _INT, latency: LatencyTable, *, num_engines: int,
                     kv_capacity_tokens: int, max_num_seqs: int, block_size: int = 16) -> RolloutRun:
    """Split the requests over ``num_engines`` engines in contiguous shards, as NeMo-RL's synchronous generation does
    (``vllm_generation.py`` ``shard_by_batch_size``: a prompt's generations stay together), and simulate each.

    Raises TunerError: a request that fits no engine's KV cache."""
    idx = np.array_split(np.arange(len(prompt_lens)), num_engines)
    return RolloutRun(engines=tuple(
        simulate_engine(np.asarray(prompt_lens)[s], np.asarray(response_lens)[s], latency,
                        kv_capacity_tokens=kv_capacity_tokens, max_num_seqs=max_num_seqs, block_size=block_size)
        for s in idx
    ))
