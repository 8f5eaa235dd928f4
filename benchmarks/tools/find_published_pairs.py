"""List pairs of published runs that differ in exactly one setting (research aid for issue 14).

Reads benchmarks/data/published_runs.csv joined on `id` with benchmarks/data/published_runs_fixes.csv and writes
benchmarks/data/published_pairs.csv. Settings compared: tp, pp, vpp, cp, ep, etp, mbs, gbs, dispatcher, recompute,
a2a overlap, CUDA graph, FSDP, offload; a pair must agree on model, GPU, GPU count, precision and sequence length.
"""

import csv
import re
import sys
from itertools import combinations

with open("benchmarks/data/published_runs.csv", encoding="utf-8") as _f:
    runs = {r["id"]: r for r in csv.DictReader(_f)}
with open("benchmarks/data/published_runs_fixes.csv", encoding="utf-8") as _f:
    fix = {r["id"]: r for r in csv.DictReader(_f)}


def norm_model(m):
    return re.sub(r"[^a-z0-9]", "", m.lower().replace("llama3.1", "llama31"))


def prec(p):
    p = p.upper()
    return "nvfp4" if "NVFP4" in p else "mxfp8" if "MX" in p else "fp8" if "FP8" in p else "bf16" if "BF16" in p else p


def disp(r, f):
    d = (r["dispatcher"] + " " + r["other_notes"] + " " + f.get("source", "")).lower()
    if "hybridep" in d or "_enable_deepseek_full_iteration_mxfp8" in d:
        return "hybridep"
    if "deepep" in d:
        return "deepep"
    if r["dispatcher"].strip() or (f.get("preset") and "family-wide" not in f.get("preset_match", "")):
        return "alltoall"
    return "unknown"  # blank dispatcher cell and no preset read: not known


def num(x):
    x = re.sub(r"\s*\(derived\)", "", x or "").strip().rstrip("*")
    return x or "1"


def settings(i):
    r, f = runs[i], fix.get(i, {})
    rec = f.get("recompute_modules") or f.get("recompute_granularity") or r["recompute"] or "none"
    if f.get("recompute_granularity") == "full":
        rec = f"full/{f['recompute_method']}/{f['recompute_num_layers']}"
    if f.get("recompute_granularity") == "none":
        rec = "none"
    rec = rec.replace('"', "'")
    a2a = f.get("overlap_moe_expert_parallel_comm") or (
        "True" if "moe_a2a_overlap=True" in r["other_notes"] else "unknown"
    )
    cg = (f.get("cuda_graph_impl") or "unknown") + ((" " + f["cuda_graph_scope"]) if f.get("cuda_graph_scope") else "")
    return {
        "tp": num(r["tp"]),
        "pp": num(r["pp"]),
        "vpp": "unknown" if not r["vpp"].strip() and "verification card" in r["framework_version"] else num(r["vpp"]),
        "cp": num(r["cp"]),
        "ep": num(r["ep"]),
        "etp": num(r["etp"]),
        "mbs": num(r["mbs"]),
        "gbs": num(r["gbs"]),
        "dispatcher": disp(r, f),
        "recompute": rec,
        "a2a_overlap": a2a,
        "cuda_graph": cg,
        "fsdp": str(f.get("use_megatron_fsdp", "unknown")),
        "offload": str(f.get("cpu_offloading_num_layers", "unknown")),
    }


def key(i):
    r = runs[i]
    return (norm_model(r["model"]), r["gpu_type"], r["num_gpus"], prec(r["precision"]), r["seq_len"])


ids = [i for i, r in runs.items() if r["tokens_per_s_per_gpu"] and "AutoModel" not in r["framework_version"]]
out = []
for a, b in combinations(ids, 2):
    if key(a) != key(b):
        continue
    sa, sb = settings(a), settings(b)
    diff = [k for k in sa if sa[k] != sb[k] and "unknown" not in (sa[k], sb[k])]
    unknown = [k for k in sa if sa[k] != sb[k] and "unknown" in (sa[k], sb[k])]
    if len(diff) != 1 or unknown:
        continue
    k = diff[0]
    ta, tb = float(runs[a]["tokens_per_s_per_gpu"]), float(runs[b]["tokens_per_s_per_gpu"])
    same_rel = runs[a]["framework_version"] == runs[b]["framework_version"]
    out.append(
        {
            "id_a": a,
            "id_b": b,
            "model": runs[a]["model"],
            "gpu_type": runs[a]["gpu_type"],
            "num_gpus": runs[a]["num_gpus"],
            "precision": prec(runs[a]["precision"]),
            "changed": k,
            "value_a": sa[k],
            "value_b": sb[k],
            "release_a": runs[a]["framework_version"].replace("Megatron-Bridge / NeMo container ", ""),
            "release_b": runs[b]["framework_version"].replace("Megatron-Bridge / NeMo container ", ""),
            "same_release": same_rel,
            "tokens_a": ta,
            "tokens_b": tb,
            "ratio_b_over_a": round(tb / ta, 4),
            "layout": f"TP{sa['tp']} PP{sa['pp']} VPP{sa['vpp']} CP{sa['cp']} EP{sa['ep']} MBS{sa['mbs']} "
            f"GBS{sa['gbs']}",
        }
    )
w = csv.DictWriter(sys.stdout, fieldnames=list(out[0]), lineterminator="\n")
w.writeheader()
for o in sorted(out, key=lambda o: (o["changed"], not o["same_release"], o["model"], o["gpu_type"])):
    w.writerow(o)
