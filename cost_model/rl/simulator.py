"""A continuous-batching discrete-event simulation of rollout engines (vLLM / SGLang style).

One engine holds a queue of requests (prompt length, response length). Its scheduler, as
vLLM v1's (``vllm/v1/core/sched/scheduler.py``) does:

- admits waiting requests first come, first served while fewer than ``max_num_seqs`` run
  and the KV cache has room for the request's tokens (prompt, plus what it had generated
  before a preemption) and one block of headroom per running sequence;
- runs one decode iteration for every running sequence (one token each); an iteration's
  latency comes from a :class:`~cost_model.rl.engine.LatencyTable` at the running count
  and mean context; admitted tokens cost one prefill;
- when the next iteration would not fit in the KV cache, preempts the most recently
  admitted running request (vLLM's ``preempt`` of the lowest-priority, last-scheduled
  request), frees its blocks and puts it back at the head of the queue; on readmission its
  prompt and generated tokens are prefilled again (preemption by recompute, vLLM's only
  mode in v1).

It is event driven: between two events (a completion, an admission, a preemption, the
iteration at which the KV cache fills) the batch does not change, so the ``k`` iterations
in between cost ``k`` times the latency at the segment's mean context (exact when the
latency is linear in context). Events are kept in a heap (``heapq``). Which iteration
each event happens in does not depend on the latency values, so a latency scale factor
(calibration, eager mode) scales the decode and prefill times exactly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cost_model.rl.engine import LatencyTable
from specs.errors import TunerError

__all__ = ["EngineRun", "RolloutRun", "simulate_engine", "simulate_rollout"]

_INT = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineRun:
    """What one engine did with its requests (seconds, tokens, counts)."""

    makespan_s: float
    """From the first admission to the last completion."""
    decode_s: float
    prefill_s: float
    iterations: int
    """Decode iterations run."""
    preemptions: int
    requests: int
    generated_tokens: int
    peak_running: int
    mean_running: float
    """Running sequences averaged over decode iterations."""
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

    @property
    def mean_running(self) -> float:
        return float(np.mean([e.mean_running for e in self.engines])) if self.engines else 0.0

    @property
    def peak_running(self) -> int:
        return max((e.peak_running for e in self.engines), default=0)


def simulate_engine(
    prompt_lens: _INT,
    response_lens: _INT,
    latency: LatencyTable,
    *,
    kv_capacity_tokens: int,
    max_num_seqs: int,
    block_size: int = 16,
) -> EngineRun:
    """Simulate one engine serving all ``prompt_lens[i], response_lens[i]`` requests (queued at time 0).

    Args:
        prompt_lens: shape ``(r,)`` prompt tokens per request.
        response_lens: shape ``(r,)`` tokens each request generates (>= 1).
        latency: the engine's per-iteration latency.
        kv_capacity_tokens: KV-cache tokens the engine holds (all its GPUs).
        max_num_seqs: most sequences running at once (vLLM ``max_num_seqs``).
        block_size: KV block size (tokens); one block per running sequence is kept as
            headroom, as the block allocator rounds up.

    Returns:
        The engine's makespan and its parts.

    Raises:
        TunerError: a single request longer than the whole KV cache (it could never run).
    """
    prompt = np.asarray(prompt_lens, dtype=np.int64)
    resp = np.asarray(response_lens, dtype=np.int64)
    r = len(prompt)
    if r == 0:
        return EngineRun(makespan_s=0.0, decode_s=0.0, prefill_s=0.0, iterations=0, preemptions=0, requests=0, generated_tokens=0, peak_running=0, mean_running=0.0)
    if np.any(resp < 1):
        raise TunerError("every request generates at least one token")
    longest = int((prompt + resp).max())
    if longest + 2 * block_size > kv_capacity_tokens:
        raise TunerError(
            f"a request of {longest:,} tokens does not fit in the engine's KV cache of {kv_capacity_tokens:,} tokens; "
            "give the engine more GPUs (tp), a higher gpu_memory_utilization, or shorter sequences"
        )
    cap = int(kv_capacity_tokens)
    # Python lists, not numpy arrays: the loop touches one element at a time (numpy scalars cost ~10x here)
    plen: list[int] = prompt.tolist()
    rlen: list[int] = resp.tolist()
    done = [0] * r  # tokens generated before the current admission
    start = [0] * r  # iteration of the current admission
    version = [0] * r
    running = [False] * r
    waiting: deque[int] = deque(range(r))
    finish: list[tuple[int, int, int]] = []  # (finish iteration, request, version)
    order: list[tuple[int, int, int]] = []  # (-admission counter, request, version): top = latest admitted
    first_t = [math.nan] * r  # time of each request's first token
    finish_t = [math.nan] * r
    awaiting_first: list[int] = []  # admitted since the last decode segment
    it = 0
    t = decode_t = prefill_t = 0.0
    used = n = 0
    counter = preemptions = peak = 0
    running_iters = 0
    just_preempted = False
    while True:
        admitted_tokens = 0
        if not just_preempted:
            while waiting and n < max_num_seqs:
                i = waiting[0]
                need = plen[i] + done[i]
                if used + need + (n + 1) * block_size > cap:
                    break
                waiting.popleft()
                running[i] = True
                start[i] = it
                version[i] += 1
                used += need
                n += 1
                heapq.heappush(finish, (it + rlen[i] - done[i], i, version[i]))
                heapq.heappush(order, (-counter, i, version[i]))
                counter += 1
                admitted_tokens += need
                awaiting_first.append(i)
        just_preempted = False
        if admitted_tokens:
            dt = latency.prefill_s(admitted_tokens)
            t += dt
            prefill_t += dt
        peak = max(peak, n)
        if n == 0:
            if waiting:  # unreachable given the check above; kept as an invariant
                raise AssertionError("simulator: nothing runs but requests wait")
            break
        if used + n * (1 + block_size) > cap:
            # preempt the latest-admitted running request (recompute later)
            while True:
                _, j, v = heapq.heappop(order)
                if running[j] and version[j] == v:
                    break
            running[j] = False
            done[j] += it - start[j]
            used -= plen[j] + done[j]
            n -= 1
            waiting.appendleft(j)
            preemptions += 1
            just_preempted = True
            continue
        while not (running[finish[0][1]] and version[finish[0][1]] == finish[0][2]):
            heapq.heappop(finish)
        k_fin = finish[0][0] - it
        k_mem = (cap - used - n * block_size) // n
        k = max(1, min(k_fin, k_mem))
        ctx_mid = used / n + (k - 1) / 2.0
        dt = k * latency.decode_s(n, ctx_mid)
        for i in awaiting_first:
            if running[i] and math.isnan(first_t[i]):
                first_t[i] = t + dt / k
        awaiting_first.clear()
        t += dt
        decode_t += dt
        it += k
        used += n * k
        running_iters += n * k
        while finish and finish[0][0] <= it:
            f_it, i, v = heapq.heappop(finish)
            if running[i] and version[i] == v:
                running[i] = False
                used -= plen[i] + rlen[i]
                n -= 1
                finish_t[i] = t
    multi = resp > 1
    tpot = float(np.mean((np.asarray(finish_t)[multi] - np.asarray(first_t)[multi]) / (resp[multi] - 1))) if np.any(multi) else 0.0
    return EngineRun(
        makespan_s=t,
        decode_s=decode_t,
        prefill_s=prefill_t,
        iterations=it,
        preemptions=preemptions,
        requests=r,
        generated_tokens=int(resp.sum()),
        peak_running=peak,
        mean_running=running_iters / it if it else 0.0,
        mean_tpot_s=tpot,
    )


def simulate_rollout(
    prompt_lens: _INT,
    response_lens: _INT,
    latency: LatencyTable,
    *,
    num_engines: int,
    kv_capacity_tokens: int,
    max_num_seqs: int,
    block_size: int = 16,
) -> RolloutRun:
    """Split the requests over ``num_engines`` engines in contiguous shards and simulate each.

    Contiguous shards are how NeMo-RL's synchronous generation splits a batch over its vLLM
    data-parallel workers (``nemo_rl/models/generation/vllm/vllm_generation.py``,
    ``generate``: ``shard_by_batch_size``); GRPO's generations of one prompt stay together.

    Raises:
        TunerError: ``num_engines < 1``, or a request that fits no engine's KV cache.
    """
    if num_engines < 1:
        raise TunerError(f"the rollout needs at least one engine, got {num_engines}")
    idx = np.array_split(np.arange(len(prompt_lens)), num_engines)
    runs = tuple(
        simulate_engine(
            np.asarray(prompt_lens)[s],
            np.asarray(response_lens)[s],
            latency,
            kv_capacity_tokens=kv_capacity_tokens,
            max_num_seqs=max_num_seqs,
            block_size=block_size,
        )
        for s in idx
    )
    return RolloutRun(engines=runs)
