"""The harness's ``torch.profiler`` export on a GPU (issue 18): one real trial with ``profile_step``, its trace checked.

    PYTHONPATH=/tmp/site:. OUT=... python3 benchmarks/h200_profile.py

Runs MiniMax-M2 cut to 1 layer on 1 GPU (TE when importable, else megatron-core's local modules), 6 steps, profiling
step 3, through :class:`launch.local_backend.LocalBackend` as ``tune --backend local --trial-profile-step 3`` does;
writes ``$OUT/profile.json`` (the trial's numbers, the trace's event counts and the trace file's size) and copies the
trace (gzip) to ``$OUT``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    from launch.local_backend import LocalBackend
    from specs import Layout, Workload, load_model, parse_gpus
    from specs.model import slice_model

    out = Path(os.environ.get("OUT") or "h200_profile_out")
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/h200_profile")
    model = slice_model(load_model("MiniMax-M2"), 1)
    cluster = parse_gpus("1xH200")
    wl = Workload(seq_length=8192, global_batch_size=8)
    be = LocalBackend(
        trials_dir=work, num_gpus=1, steps=6, warmup_steps=3, timeout_s=400, harness_options={"profile_step": 3}
    )
    m = be.run(Layout(world_size=1), model=model, cluster=cluster, workload=wl, trial_number=0)
    traces = sorted(work.rglob("profile_step3_pp*.json"))
    info: dict[str, object] = {
        "step_times_s": list(m.step_times_s),
        "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
        "peak_reserved_gib": m.peak_bytes / 2**30,
        "transformer_engine": be.env.transformer_engine,
        "traces": [str(t.relative_to(work)) for t in traces],
    }
    for t in traces:
        d = json.loads(t.read_text())
        ev = d.get("traceEvents", [])
        info[t.name] = {
            "bytes": t.stat().st_size,
            "events": len(ev),
            "complete_events": sum(1 for e in ev if e.get("ph") == "X"),
            "gpu_kernel_events": sum(1 for e in ev if e.get("cat") == "kernel"),
            "names_sample": sorted({str(e.get("name"))[:60] for e in ev if e.get("cat") == "kernel"})[:8],
        }
        with t.open("rb") as src, gzip.open(out / (t.name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    (out / "profile.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    print(json.dumps(info, default=str)[:3000])
    return 0 if traces else 1


if __name__ == "__main__":
    sys.exit(main())
