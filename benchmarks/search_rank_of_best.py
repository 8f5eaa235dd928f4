"""Where the true best sits in the model's order, over simulated worlds: how many noise-free trials a search that
follows the model's first-trial order would need.

    PYTHONPATH=. python benchmarks/search_rank_of_best.py [--worlds 200] [--cases minimax,deepseek,llama70b]

For each case (``bench_search.CASES``) and world (``benchmarks.simulated.World``, the error bars' structure), the gain
policy's candidates (``Prepared.contenders``) are put in the order of its first pick (expected throughput x chance to
fit / GPU-hours of a trial, :class:`tuner.study.policy.GainPolicy` before any measurement). For k = 1, 2, 3, ... the
best true throughput among the first k that truly fit is compared with the world's true best. Measurements are taken
as exact (no run-to-run noise) and the order is not updated by what they show, so this is neither a bound on an
adaptive policy nor a policy: it says how far down the model's list the answer sits. Prints one JSON object: per case,
the share of worlds within 5% and 2% for each k, the k needed for 50/80/95% of worlds, and the GPU-hours of the
first k trials (the policy's own estimate of each trial's cost); and the median over worlds of the standard deviation
of log(true / predicted step time) over the 300 layouts predicted fastest (the worlds' spread between layouts, to
compare with ``benchmarks/trial_spread.py``'s ``model_error_sd_within_model_net_of_run_noise``).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

KS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100)


def main() -> int:
    from benchmarks.bench_search import CASES
    from benchmarks.search_bench import prepare_case
    from benchmarks.simulated import World
    from tuner.study import TuneConfig
    from tuner.study.config import policy_params
    from tuner.study.policy import GainPolicy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=200)
    ap.add_argument("--cases", default="minimax,deepseek,llama70b")
    a = ap.parse_args()
    out = {}
    for name in a.cases.split(","):
        case = prepare_case(TuneConfig.from_dict(CASES[name]))
        prep, base = case.new, case.base
        rows = np.flatnonzero(prep.contenders)
        est = prep.estimates
        pol = GainPolicy(
            predicted=est.tokens_per_s_per_gpu[rows],
            step_time_s=est.step_time_s[rows],
            peak_bytes=est.peak_bytes[rows],
            codes=np.zeros((len(rows), 1), dtype=np.int64),
            hbm_bytes=prep.cluster.gpu.hbm_bytes,
            gpus=prep.cluster.num_gpus,
            params=policy_params(prep, 48),
        )
        cost = pol.trial_gpu_hours(slice(None))
        value = pol.predicted * pol.p_fit / cost
        order = rows[np.argsort(-value, kind="stable")]
        cum_cost = np.cumsum(cost[np.argsort(-value, kind="stable")])
        within5 = {k: 0 for k in KS}
        within2 = {k: 0 for k in KS}
        ranks = []
        spread = []
        pred_step = np.asarray(est.step_time_s)
        top300 = np.argsort(pred_step)[:300]
        n = 0
        for seed in range(a.worlds):
            w = World(base, seed=seed)
            best = w.best_row()
            if best is None:
                continue
            n += 1
            spread.append(float(np.std(np.log(w.true_step_time_s[top300] / pred_step[top300]))))
            tps = np.where(w.fits, w.true_tokens_per_s_per_gpu, 0.0)
            top = tps[best]
            got = np.maximum.accumulate(tps[order]) / top
            hit = np.flatnonzero(order == best)
            ranks.append(int(hit[0]) + 1 if len(hit) else len(order) + 1)
            for k in KS:
                g = got[min(k, len(got)) - 1]
                within5[k] += g >= 0.95
                within2[k] += g >= 0.98
        ks_needed = {}
        for share in (0.5, 0.8, 0.95):
            for lim, tab in ((5, within5), (2, within2)):
                ks_needed[f"k_for_{int(share * 100)}pct_within_{lim}pct"] = next(
                    (k for k in KS if tab[k] / n >= share), None
                )
        out[name] = {
            "worlds": n,
            "candidates": int(len(rows)),
            "within_5pct": {k: within5[k] / n for k in KS},
            "within_2pct": {k: within2[k] / n for k in KS},
            "gpu_hours_of_first_k": {k: float(cum_cost[min(k, len(cum_cost)) - 1]) for k in KS},
            "within_world_sd_of_log_error_top300_median": float(np.median(spread)),
            "rank_of_true_best_median": float(np.median(ranks)),
            "rank_of_true_best_p90": float(np.quantile(ranks, 0.9)),
            **ks_needed,
        }
        print(f"{name}: done", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
