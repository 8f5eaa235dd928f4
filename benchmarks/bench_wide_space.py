"""Benchmark: enumerate and estimate a wide ``--space`` once, cold, with the peak memory of each phase.

    python benchmarks/bench_wide_space.py [--space benchmarks/data/wide_space_2m.yaml] [--model MiniMax-M2]
        [--gpus 64xH200]

``benchmarks/data/wide_space_16m.yaml`` is the 16.0M-valid space of the target (15.6M within 8 GiB and 60 s).

Builds the space as the main job does for ``--stack slime`` and the ``model`` backend (see
``benchmarks/bench_main_job.py --floor``) and prints one JSON line: layouts considered / valid / fitting, the
bytes per row of the valid layout table, seconds (wall and this process's CPU) and the process's peak resident
memory (GiB) after enumerating and after estimating, and the load average over the last minute. Run it under
``/usr/bin/time -v`` for the whole process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specs.layout import LayoutTable

ROOT = Path(__file__).resolve().parents[1]


def _peak_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def _table_bytes(table: LayoutTable) -> int:
    """Bytes the table's columns hold: each array once (columns may share one), a broadcast value as nothing."""
    arrays = {id(v): v for v in table.cols.values()}
    return sum(v.nbytes for v in arrays.values() if 0 not in v.strides)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", type=Path, default=ROOT / "benchmarks" / "data" / "wide_space_2m.yaml")
    ap.add_argument("--model", default="MiniMax-M2")
    ap.add_argument("--gpus", default="64xH200")
    a = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    from cost_model.estimate import estimate_table
    from search_spaces.rules import RuleEnv
    from search_spaces.space import SearchSpace, enumerate_layouts
    from specs import DEFAULT_RUN_OPTIONS, Workload, load_model, parse_gpus
    from specs.layout import Dispatcher

    model, cluster, w = load_model(a.model), parse_gpus(a.gpus, require_network=True), Workload()
    space = SearchSpace.load(str(a.space))
    space = space.replace(dispatcher=tuple(d for d in space.dispatcher if d != Dispatcher.allgather))
    en = enumerate_layouts(space, model, cluster.num_gpus, w, RuleEnv.of(cluster, DEFAULT_RUN_OPTIONS))
    t1, c1, m1 = time.perf_counter(), time.process_time(), _peak_gib()
    est = estimate_table(model, cluster, w, en.valid, options=DEFAULT_RUN_OPTIONS)
    t2, c2, m2 = time.perf_counter(), time.process_time(), _peak_gib()
    print(
        json.dumps(
            {
                "benchmark": "wide_space",
                "space": str(a.space),
                "model": a.model,
                "gpus": a.gpus,
                "considered": en.considered,
                "valid": len(en.valid),
                "fit": int(est.fits.sum()),
                "table_bytes_per_row": round(_table_bytes(en.valid) / max(len(en.valid), 1), 1),
                "enumerate_s": round(t1 - t0, 2),
                "enumerate_cpu_s": round(c1 - c0, 2),
                "peak_gib_after_enumerate": m1,
                "estimate_s": round(t2 - t1, 2),
                "estimate_cpu_s": round(c2 - c1, 2),
                "peak_gib": m2,
                "total_s": round(t2 - t0, 2),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
