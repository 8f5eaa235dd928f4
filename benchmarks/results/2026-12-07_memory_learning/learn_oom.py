"""The gain policy with and without chance_to_fit updates, same simulated worlds."""
import json, sys, time
import numpy as np
from optuna.trial import TrialState
from benchmarks import bench_search
from cost_model.uncertainty import chance_to_fit, load_error_bars
from benchmarks.search_bench import prepare_case, run_world
from tuner.study import TuneConfig
from tuner.study import run as run_mod
from tuner.study.records import TrialRecord

GIB = 2.0**30
SHARED = load_error_bars()[1]["all"].shared
orig = run_mod.StudyRun._feed

def feed(self, policy, pos, observed, first_of):
    orig(self, policy, pos, observed, first_of)
    measured, oom = {}, set()
    for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)):
        r = TrialRecord.of(t)
        row = self.index.find_fitting({k: str(v) for k, v in t.params.items()})
        i = pos.get(row) if row is not None else None
        if i is None:
            continue
        if r.result and r.result.get("source") == "measured" and r.result.get("peak_gib"):
            measured[i] = float(r.result["peak_gib"]) * GIB
        elif r.failure and r.failure.get("kind") == "oom":
            oom.add(i)
    p = policy.params
    policy.p_fit = chance_to_fit(policy.peak_bytes, policy.hbm_bytes, sigma=p.memory_sigma, shared=SHARED, bias=p.memory_bias,
                                 measured=measured, out_of_memory=oom)

case_name, n = sys.argv[1], int(sys.argv[2])
case = prepare_case(TuneConfig.from_dict(bench_search.CASES[case_name]))
out = []
for seed in range(n):
    for learn in (False, True):
        run_mod.StudyRun._feed = feed if learn else orig
        t0 = time.time()
        rs = run_world(case, seed, ["gain"])
        for r in rs:
            d = r.to_dict(); d["learn"] = learn; d["wall_s"] = round(time.time() - t0, 1)
            out.append(d); print(json.dumps(d), flush=True)
