"""Benchmark: the bounded pipeline simulation of the single-layout estimate against the full one.

:func:`cost_model.pipeline_schedule.pipeline_makespan` simulates a bounded number of micro-batches and
extrapolates the steady state above ``FULL_SIMULATION_MICROBATCHES``; :func:`cost_model.estimate.estimate_details`
(the step timeline) still simulates every micro-batch. For each global batch this takes a seeded sample of the
space's valid layouts with pp > 1 (every (pp, vpp) pair of the space at least once when the sample is large
enough) and compares the two pipeline times of each, and the seconds each took.

    python benchmarks/bench_pipeline_makespan.py [--model MiniMax-M2] [--gpus 64xH200] [--global-batch 2048 8192]
        [--sample 40] [--seed 0]

Prints one JSON line per global batch (layouts compared, how many ran the bounded path, the largest relative
difference and its layout, seconds of each path) and a summary line.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

from cost_model import step_detail
from cost_model.estimate import estimate_details
from cost_model.pipeline_schedule import FULL_SIMULATION_MICROBATCHES
from search_spaces.space import SearchSpace, enumerate_layouts
from specs import Workload, load_model, parse_gpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="MiniMax-M2")
    ap.add_argument("--gpus", default="64xH200")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--sample", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    model, cluster = load_model(a.model), parse_gpus(a.gpus)
    worst_all = 0.0
    for gb in a.global_batch:
        w = Workload(seq_length=a.seq_len, global_batch_size=gb)
        valid = enumerate_layouts(SearchSpace.load(None), model, cluster.num_gpus, w).valid
        rows = [i for i in range(len(valid)) if int(valid["pp"][i]) > 1]
        rng = random.Random(a.seed)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i in rows:
            by_shape.setdefault((int(valid["pp"][i]), int(valid["vpp"][i])), []).append(i)
        picked = [rng.choice(v) for _, v in sorted(by_shape.items())][: a.sample]
        picked += rng.sample(rows, min(len(rows), max(a.sample - len(picked), 0)))
        worst, worst_at, bounded, t_full, t_bounded = 0.0, "", 0, 0.0, 0.0
        for i in picked:
            lay = valid.row(i)
            t0 = time.perf_counter()
            det = estimate_details(model, cluster, w, lay)
            t1 = time.perf_counter()
            got = step_detail.pipeline_time(det.times, lay, det.num_microbatches)
            t2 = time.perf_counter()
            t_full, t_bounded = t_full + t1 - t0, t_bounded + t2 - t1
            bounded += det.num_microbatches > FULL_SIMULATION_MICROBATCHES
            d = abs(got - det.pipeline_s) / det.pipeline_s
            if d >= worst:
                worst, worst_at = d, f"pp {lay.pp} vpp {lay.vpp} M {det.num_microbatches}"
        worst_all = max(worst_all, worst)
        print(
            json.dumps(
                {
                    "benchmark": "pipeline_makespan",
                    "model": a.model,
                    "gpus": a.gpus,
                    "global_batch": gb,
                    "layouts": len(picked),
                    "bounded": bounded,
                    "pp_vpp_pairs": len(by_shape),
                    "max_rel_diff": worst,
                    "at": worst_at,
                    "details_full_s": round(t_full, 3),
                    "makespan_bounded_s": round(t_bounded, 3),
                }
            )
        )
    print(
        json.dumps(
            {
                "benchmark": "pipeline_makespan",
                "max_rel_diff": worst_all,
                "target": 0.01,
                "python": platform.python_version(),
                "cpus": __import__("os").cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
