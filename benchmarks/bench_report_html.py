"""Benchmark: what report.html adds to the main job (issue 18: at most ~0.3 s).

Runs the main job's study (``tune --model MiniMax-M2 --gpus 64xH200``, 48 layouts, in a temporary folder), then times
``tuner.report_html.study_report`` on it ``--repeat`` times in this process (the first call included: it reads plotly's
bundle and estimates every front layout) and prints the median, the first call and the page's size.

    python benchmarks/bench_report_html.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from tuner.report import front_rows
    from tuner.report_html import study_report
    from tuner.study import TuneConfig, prepare, run_study, trial_rows

    with tempfile.TemporaryDirectory() as d:
        prep = prepare(TuneConfig.from_dict(dict(model="MiniMax-M2", gpus="64xH200", results_dir=d)))
        res = run_study(prep)
        rows = trial_rows(res.study)
        front = front_rows(rows, prep.model)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            page = study_report(
                res.out_dir / "report.html", study=res.study_name, model=prep.model, cluster=prep.cluster,
                workload=prep.workload, rows=rows, front=front, backend="model", calibration=prep.calibration,
                memory_headroom=prep.headroom,
            )
            times.append(time.perf_counter() - t0)
        size = page.stat().st_size
    print(
        json.dumps(
            {
                "benchmark": "report_html",
                "trials": len(rows),
                "front": len(front),
                "first_s": round(times[0], 3),
                "median_s": round(statistics.median(times), 3),
                "max_s": round(max(times), 3),
                "page_bytes": size,
                "target_s": 0.3,
            }
        )
    )


if __name__ == "__main__":
    main()
