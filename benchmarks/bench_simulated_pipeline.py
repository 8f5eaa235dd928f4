"""Benchmark: the single-layout estimate's simulated pipeline against the search table's closed form (issue 18).

``estimate_table`` (every layout of the space, vectorised) times the pipeline as ``M x slowest + (pp - 1) / vpp x mean``
(Narayanan et al. 2021); ``estimate`` (one layout: the model backend's trials, ``tune estimate``, the recipe, the
reports, the timeline) simulates Megatron's 1F1B / interleaved order over each rank's and chunk's forward and backward
(``cost_model/step_detail.py``). This measures how far the two step times differ, and what the simulation costs:

* over the layouts the main job evaluates (``tune --model MiniMax-M2 --gpus 64xH200``, 48 layouts; the study is run in a
  temporary folder);
* over a random sample of the candidates (valid layouts predicted to fit), ``--sample N`` (default 2,000, seed 0).

    python benchmarks/bench_simulated_pipeline.py [--sample 2000]

Prints one JSON line per set: the relative step-time difference (simulated / closed form - 1) as its median, largest
absolute value, share of layouts where the simulation is faster, the layouts where it differs most, and the time per
layout of ``estimate`` against ``estimate_table`` of one row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from cost_model.estimate import estimate, estimate_table
from specs.layout import LayoutTable

ROOT = Path(__file__).resolve().parents[1]


def _compare(prep, layouts) -> dict:
    diffs, worst = [], []
    t_one = t_tab = 0.0
    for lay in layouts:
        t0 = time.perf_counter()
        one = estimate(
            prep.model, prep.cluster, prep.workload, lay, calibration=prep.calibration,
            memory_headroom=prep.headroom,
        )
        t1 = time.perf_counter()
        tab = estimate_table(
            prep.model, prep.cluster, prep.workload, LayoutTable.from_layouts([lay]), calibration=prep.calibration,
            memory_headroom=prep.headroom,
        ).row(0, lay)
        t2 = time.perf_counter()
        t_one, t_tab = t_one + t1 - t0, t_tab + t2 - t1
        d = one.step_time_s / tab.step_time_s - 1
        diffs.append(d)
        worst.append(
            (
                abs(d), d, lay.label, lay.recompute_label, lay.vpp, lay.num_layers_in_first_pipeline_stage,
                lay.num_layers_in_last_pipeline_stage, tab.time["pp_bubble"] / tab.step_time_s,
                one.time["pp_bubble"] / one.step_time_s,
            )
        )
    worst.sort(reverse=True)
    a = np.abs(diffs)
    return {
        "layouts": len(diffs),
        "median_rel_diff": statistics.median(diffs),
        "median_abs_rel_diff": float(np.median(a)),
        "max_abs_rel_diff": float(a.max()),
        "p95_abs_rel_diff": float(np.percentile(a, 95)),
        "share_simulation_faster": float(np.mean(np.array(diffs) < 0)),
        "share_within_1e-9": float(np.mean(a < 1e-9)),
        "most_different": [
            {
                "rel_diff": w[1],
                "layout": w[2],
                "recompute": w[3],
                "vpp": w[4],
                "first_last": f"{w[5]}/{w[6]}",
                "bubble_closed_form": w[7],
                "bubble_simulated": w[8],
            }
            for w in worst[:5]
        ],
        "estimate_ms_per_layout": 1e3 * t_one / len(diffs),
        "table_row_ms_per_layout": 1e3 * t_tab / len(diffs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=2000, help="random fitting candidates to compare (0: none)")
    a = ap.parse_args()
    from tuner.study import TuneConfig, prepare, run_study, trial_rows

    with tempfile.TemporaryDirectory() as d:
        prep = prepare(TuneConfig.from_dict(dict(model="MiniMax-M2", gpus="64xH200", results_dir=d)))
        res = run_study(prep)
        evaluated = [r.layout for r in trial_rows(res.study)]
    print(json.dumps({"set": "main job's evaluated layouts", **_compare(prep, evaluated)}))
    if a.sample:
        rng = np.random.default_rng(0)
        fit = np.flatnonzero(prep.fits)
        rows = rng.choice(fit, size=min(a.sample, len(fit)), replace=False)
        print(
            json.dumps(
                {
                    "set": f"random candidates (seed 0) of {len(fit):,}",
                    **_compare(prep, [prep.enumeration.valid.row(int(i)) for i in rows]),
                }
            )
        )


if __name__ == "__main__":
    main()
