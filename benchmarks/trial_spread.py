"""The spread of real trials that sizes the simulated worlds: run-to-run within one machine session, and the model's
error between layouts of one model.

    PYTHONPATH=. python benchmarks/trial_spread.py

Reads every trial row (``status`` ok, with a layout) of the lent-GPU results
(``benchmarks/results/h200_te_2026-12-0*/*/*.jsonl``, ``h200_x2_2026-11-*/*.jsonl``) and the H200 trial residuals of
the error bars (``benchmarks/results/2026-12-07_error_bars/residuals.jsonl``, source ``h200_trials``: log measured /
predicted throughput). Prints one JSON object:

* ``run_sigma_within_session``: the lognormal sigma of one run, from pairs of runs of the same configuration in the
  same sweep file, i.e. one device call (median |log ratio| / (0.6745 sqrt 2));
* ``pairs_across_sessions_median_abs``: the same median over pairs from different calls (machines, days);
* ``model_error_sd_within_model``: the pooled standard deviation of the trial residuals around each (model, precision)
  mean, and ``..._net_of_run_noise``: with the run-to-run variance taken out: the model's error between layouts of
  one model on one machine, what the worlds' within-world spread is compared with.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"


def main() -> None:
    by_key: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    files = sorted(
        glob.glob(str(ROOT / "h200_te_2026-12-0*/*/*.jsonl")) + glob.glob(str(ROOT / "h200_x2_2026-11-*/*.jsonl"))
    )
    for f in files:
        call = str(Path(f).relative_to(ROOT))  # one sweep file: one device call
        for line in Path(f).read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            t = r.get("tokens_per_s_per_gpu")
            if not t or r.get("status", "ok") != "ok" or "layout" not in r:
                continue
            key = json.dumps(
                [r.get("model"), r.get("gpus"), r.get("seq_length"), r.get("global_batch_size"), r["layout"]],
                sort_keys=True,
            )
            by_key[key].append((call, math.log(t)))
    within, across = [], []
    for runs in by_key.values():
        for i, (ca, a) in enumerate(runs):
            for cb, b in runs[i + 1 :]:
                (within if ca == cb else across).append(abs(a - b))
    run_sigma = statistics.median(within) / (0.6745 * math.sqrt(2))
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for line in (ROOT / "2026-12-07_error_bars" / "residuals.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["source"] == "h200_trials":
            groups[(r["model"], r["family"])].append(float(r["x"]))
    dev = [x - statistics.mean(v) for v in groups.values() if len(v) > 1 for x in v]
    k = sum(1 for v in groups.values() if len(v) > 1)
    sd = math.sqrt(sum(d * d for d in dev) / (len(dev) - k))
    print(
        json.dumps(
            {
                "files": len(files),
                "configurations_run_more_than_once": sum(len(v) > 1 for v in by_key.values()),
                "pairs_within_session": len(within),
                "pairs_across_sessions": len(across),
                "run_sigma_within_session": round(run_sigma, 4),
                "pairs_within_session_median_abs": round(statistics.median(within), 4),
                "pairs_across_sessions_median_abs": round(statistics.median(across), 4),
                "trial_residual_rows": len(dev),
                "model_groups": k,
                "model_error_sd_within_model": round(sd, 4),
                "model_error_sd_within_model_net_of_run_noise": round(math.sqrt(max(sd**2 - run_sigma**2, 0.0)), 4),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
