import json, sys, numpy as np
rows=[json.loads(l) for l in open(sys.argv[1])]
for learn in (False, True):
    rs=[r for r in rows if r["learn"]==learn]
    reg=np.array([r["regret"] for r in rs]); gh=np.array([r["gpu_hours"] for r in rs])
    oom=np.array([r["outcomes"].get("oom",0) for r in rs]); tr=np.array([r["trials"] for r in rs])
    print(f"learn={learn}: worlds {len(rs)} within5 {np.mean(reg<=.05):.0%} within2 {np.mean(reg<=.02):.0%} med regret {np.median(reg):.4f} p90 {np.quantile(reg,.9):.4f} "
          f"GPU-h median {np.median(gh):.0f} mean {gh.mean():.0f}; trials median {np.median(tr):.0f}; OOM trials total {oom.sum()} mean {oom.mean():.2f} share {oom.sum()/tr.sum():.1%}")
