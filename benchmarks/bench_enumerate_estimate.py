"""Benchmark: enumerate, rule-check and estimate every layout of the default space.

Target (issue 2): MiniMax-M2 on 64 H200, seq 8,192, global batch 128, under 2 s.

    python benchmarks/bench_enumerate_estimate.py [--model MiniMax-M2] [--gpus 64xH200] [--repeat 5]

Prints one JSON line: layouts considered / valid / fitting and the median seconds
of each phase over the repeats (after one warm-up run).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from cost_model.estimate import estimate_table
from search_spaces.space import SearchSpace, enumerate_layouts
from specs import Workload, load_model, parse_gpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="MiniMax-M2")
    ap.add_argument("--gpus", default="64xH200")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    model, cluster = load_model(a.model), parse_gpus(a.gpus)
    w = Workload(seq_length=a.seq_len, global_batch_size=a.global_batch)
    space = SearchSpace.load(None)
    t_enum, t_est = [], []
    for i in range(a.repeat + 1):
        t0 = time.perf_counter()
        en = enumerate_layouts(space, model, cluster.num_gpus, w)
        t1 = time.perf_counter()
        est = estimate_table(model, cluster, w, en.valid)
        t2 = time.perf_counter()
        if i:
            t_enum.append(t1 - t0)
            t_est.append(t2 - t1)
    e, s = statistics.median(t_enum), statistics.median(t_est)
    print(
        json.dumps(
            {
                "benchmark": "enumerate_estimate",
                "model": a.model,
                "gpus": a.gpus,
                "considered": en.considered,
                "valid": len(en.valid),
                "fit": int(est.fits.sum()),
                "enumerate_s": round(e, 3),
                "estimate_s": round(s, 3),
                "total_s": round(e + s, 3),
                "target_s": 2.0,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": __import__("os").cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
