"""benchmarks/cuda_timing.py: the device benchmarks' CUDA-event median, on a stand-in for torch's events (no GPU)."""

import sys
import types

from benchmarks.cuda_timing import cuda_median_seconds


def _fake_torch(monkeypatch, millis):
    """A ``torch`` whose events report ``millis`` in order, one per timed call; counts the calls and
    synchronisations."""
    it = iter(millis)
    seen = {"sync": 0}

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            pass

        def elapsed_time(self, other):
            return next(it)

    cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: seen.__setitem__("sync", seen["sync"] + 1))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    return seen


def test_median_of_the_timed_calls_in_seconds_after_the_warm_up(monkeypatch):
    # only the 3 timed calls are read (a read of a warm-up call would run out of values); their median is 2 ms
    seen = _fake_torch(monkeypatch, [3.0, 1.0, 2.0])
    calls = []
    assert cuda_median_seconds(lambda: calls.append(1), reps=3, warm=2) == 0.002
    assert len(calls) == 5 and seen["sync"] == 5
