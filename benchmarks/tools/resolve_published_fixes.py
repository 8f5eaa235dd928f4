"""Derive benchmarks/data/published_runs_fixes.csv from Megatron-Bridge perf recipes (research aid, not part of the
package).

Inputs: benchmarks/data/published_runs.csv and one JSON-lines dump per Bridge tag of every
WorkloadBaseConfig preset in scripts/performance/configs/*/*workload_base_configs.py (made by
importing those modules at the tag with scripts/performance on PYTHONPATH; see
benchmarks/data/published_runs_fixes.md). The rules applied on top of a preset are the ones read in
the tag's perf scripts and recipes, cited per field in published_runs_fixes.md.

Usage: python benchmarks/tools/resolve_published_fixes.py PRESET_DIR [KEEP_CSV] > new_fixes.csv

KEEP_CSV (e.g. the current benchmarks/data/published_runs_fixes.csv, read before the output replaces it): its rows
whose ``preset_match`` starts with "read by hand" are kept as they are (rows read in a recipe or write-up by hand,
cited in their ``source``; published_runs_fixes.md, "Read by hand for the memory target").
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

TAG_OF_RELEASE = {
    "25.11": "v0.2.0",
    "26.02": "v0.3.0",
    "26.02.01": "v0.3.1",
    "26.04": "v0.4.0",
    "26.04.01": "v0.4.2",
    "26.06": "v0.5.0",
    "26.06.01": "v0.5.0",
}
REPO = "NVIDIA-NeMo/Megatron-Bridge"
FIELDS = [
    "id", "model", "gpu_type", "num_gpus", "framework_version", "bridge_tag", "preset", "preset_match",
    "use_megatron_fsdp", "cpu_offloading_num_layers", "use_precision_aware_optimizer", "exp_avg_dtype",
    "exp_avg_sq_dtype", "master_param_storage", "main_grad_dtype", "grad_reduce_in_fp32", "fp8_param_gather",
    "fp4_param_gather", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "recompute_modules", "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute", "cuda_graph_impl", "cuda_graph_scope", "optimizer", "extra", "source",
]


def family(model: str, tag: str) -> tuple[str, str] | None:
    m = model.lower().replace(" ", "_")
    old = tag == "v0.2.0"
    if m.startswith("deepseekv3") or m.startswith("deepseek-v3"):
        return "deepseek", "DEEPSEEK_V3"
    if "gpt_oss_120b" in m or "gpt-oss-120b" in m:
        return "gpt_oss", "GPT_OSS_120B"
    if "qwen3_235b" in m or "qwen3-235b" in m:
        return ("qwen3" if old else "qwen"), "QWEN3_235B_A22B"
    if "qwen3_30b" in m or "qwen3-30b" in m:
        return ("qwen3" if old else "qwen"), "QWEN3_30B_A3B"
    if "kimi" in m:
        return "kimi", "KIMI_K2"
    if "llama3.1_405b" in m:
        return ("llama31" if old else "llama"), "LLAMA31_405B"
    if "llama3_70b" in m:
        return ("llama3" if old else "llama"), "LLAMA3_70B"
    if "llama3_8b" in m:
        return ("llama3" if old else "llama"), "LLAMA3_8B"
    return None


def prec_code(p: str) -> str | None:
    p = p.upper()
    if "NVFP4" in p:
        return "NVFP4"
    if "MX" in p:
        return "FP8_MX"
    if "FP8" in p:
        return "FP8_CS"
    if "BF16" in p:
        return "BF16"
    return None


def _int(x: str) -> int | None:
    x = re.sub(r"[^0-9]", "", x or "")
    return int(x) if x else None


def match(presets: list[dict], key: str, gpu: str, prec: str, r: dict) -> list[dict]:
    out = []
    for p in presets:
        n = p["name"]
        if not n.startswith(key + "_") or f"_{gpu}_" not in n + "_" or f"_{prec}_" not in n + "_":
            continue
        if "PRETRAIN" not in n and "BASE_CONFIG" not in n:
            continue
        vp = p["virtual_pipeline_model_parallel_size"] or 1
        if (
            p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"], p["context_parallel_size"],
            p["micro_batch_size"],
        ) != (_int(r["tp"]), _int(r["pp"]), _int(r["cp"]) or 1, _int(r["mbs"]) or 1):
            continue
        if (p["expert_model_parallel_size"] or 1) != (_int(r["ep"]) or 1):
            continue
        if vp != (_int(r["vpp"]) or 1):
            continue
        gbs = _int(r["gbs"])
        ng = _int(r["num_gpus"])
        scaled = int(p["global_batch_size"] / p["num_gpus"] * ng) if p["num_gpus"] else None
        if gbs not in (p["global_batch_size"], scaled):
            continue
        out.append(p)
    return out


def resolve(r: dict, presets_by_tag: dict[str, list[dict]]) -> dict | None:
    fv = r["framework_version"]
    m = re.search(r"NeMo container (\d\d\.\d\d(?:\.\d\d)?)", fv)
    if not m or m.group(1) not in TAG_OF_RELEASE:
        return None
    notes = r["other_notes"]
    cm = re.search(r"config: Megatron-Bridge tag (v[\d.]+) scripts/performance/configs :: ([A-Z0-9_]+)", notes)
    tag = cm.group(1) if cm else TAG_OF_RELEASE[m.group(1)]
    fam = family(r["model"], tag)
    prec = prec_code(r["precision"])
    if fam is None or prec is None:
        return None
    presets = presets_by_tag[tag]
    how = "named in published_runs.csv other_notes"
    if cm:
        cands = [p for p in presets if p["name"] == cm.group(2)]
    else:
        cands = match(presets, fam[1], r["gpu_type"].upper(), prec, r)
        how = "matched here (TP, PP, CP, VP, EP, MBS, GBS or GBS scaled by GPUs)"
        # identical presets under several names (aliases) count as one
        uniq = {json.dumps({k: v for k, v in c.items() if k != "name"}, sort_keys=True): c for c in cands}
        cands = list(uniq.values())
    family_only = len(cands) != 1
    if family_only:
        # no unique preset: only the fields that do not depend on the preset are filled
        p = {
            "name": "",
            "use_megatron_fsdp": None,
            "recompute_num_layers": None,
            "recompute_modules": None,
            "cuda_graph_impl": None,
            "cuda_graph_scope": None,
            "moe_a2a_overlap": None,
            "cpu_offloading_num_layers": None,
        }
        how = f"no unique preset ({len(cands)} candidates): family-wide fields only"
    else:
        p = cands[0]
    fam_dir = fam[0]
    bf16 = prec == "BF16"
    # optimizer: Kimi-K2 perf configs default to muon (argument_parser --optimizer_type default "muon", v0.4.0+;
    # kimi_llm_pretrain.py optimizer_type="muon" default at v0.3.1+) -> dist_muon
    optimizer = "dist_muon" if fam_dir == "kimi" else "adam"
    fsdp = bool(p.get("use_megatron_fsdp"))
    # precision-aware optimizer: set_post_overrides turns it on for bf16 (adam only from v0.3.1) after
    # set_workload_base_configs (whose FSDP override turned it off); DeepSeek-V3 recipe turns it on for every precision
    pao = False
    if fam_dir == "deepseek":
        pao = not fsdp  # recipe True; _set_megatron_fsdp_overrides turns it off with FSDP
    if bf16 and optimizer == "adam":
        pao = True
    exp = "bf16" if (fam_dir == "deepseek" and pao) else ("n/a (muon)" if optimizer == "dist_muon" else "fp32")
    fp8pg = prec in ("FP8_CS", "FP8_MX")
    if fam_dir == "kimi" and optimizer == "dist_muon" and prec == "FP8_MX":
        fp8pg = False  # kimi_llm_pretrain.py WAR: muon + mxfp8
    fp4pg = prec == "NVFP4" and tag in ("v0.5.0",) and fam_dir not in ("deepseek",)
    if pao and prec not in ("FP8_CS", "FP8_MX"):
        master = "int16 remainder (store_param_remainders=True)"
    elif optimizer == "dist_muon":
        master = "fp32 (muon; distributed optimizer off)"
    else:
        master = "fp32"
    # recompute
    gran, method, nlay, mods = "", "", "", ""
    if fam_dir == "deepseek":
        gran, mods = "selective", "['core_attn'] (megatron default)"
    if fam_dir == "kimi":
        gran, mods = "selective", "['core_attn'] (megatron default)"
    if p.get("recompute_num_layers") is not None:
        gran, method, nlay, mods = "full", "block", str(p["recompute_num_layers"]), ""
    if p.get("recompute_modules") is not None:
        gran, mods = "selective", str(p["recompute_modules"])
        if p["recompute_modules"] == []:
            gran, mods = "selective (empty list)", "[]"
    if not gran and not family_only:
        gran = "none"
    cg_impl = p.get("cuda_graph_impl") or "none"
    cg_scope = p.get("cuda_graph_scope")
    cg_scope = "" if cg_impl == "none" or cg_scope is None else str(cg_scope)
    a2a = bool(p.get("moe_a2a_overlap"))
    off = p.get("cpu_offloading_num_layers") or 0
    fam_file = {
        "deepseek": "deepseek",
        "gpt_oss": "gpt_oss",
        "qwen": "qwen3",
        "qwen3": "qwen3",
        "kimi": "kimi",
        "llama": "llama3",
        "llama3": "llama3",
        "llama31": "llama31",
    }[fam_dir]
    if fam[1] == "LLAMA31_405B":
        fam_file = "llama31"
    wb = "workload_base_configs.py" if tag == "v0.2.0" else f"{fam_file}_workload_base_configs.py"
    src = f"{REPO}@{tag}:scripts/performance/configs/{fam_dir}/{wb}::{p['name']}"
    if family_only:
        src = (
            f"{REPO}@{tag}:scripts/performance/configs/{fam_dir}/ (family common config), utils/overrides.py, "
            "utils/precision.py"
        )
    out = {
        "id": r["id"],
        "model": r["model"],
        "gpu_type": r["gpu_type"],
        "num_gpus": r["num_gpus"],
        "framework_version": fv,
        "bridge_tag": tag,
        "preset": p["name"],
        "preset_match": how,
        "use_megatron_fsdp": fsdp,
        "cpu_offloading_num_layers": off,
        "use_precision_aware_optimizer": pao,
        "exp_avg_dtype": exp,
        "exp_avg_sq_dtype": exp,
        "master_param_storage": master,
        "main_grad_dtype": "bf16",
        "grad_reduce_in_fp32": False,
        "fp8_param_gather": fp8pg,
        "fp4_param_gather": fp4pg,
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "te",
        "recompute_granularity": gran,
        "recompute_method": method,
        "recompute_num_layers": nlay,
        "recompute_modules": mods,
        "overlap_moe_expert_parallel_comm": a2a,
        "delay_wgrad_compute": a2a,
        "cuda_graph_impl": cg_impl,
        "cuda_graph_scope": cg_scope,
        "optimizer": optimizer,
        "extra": "",
        "source": src,
    }
    if family_only:
        for k in (
            "use_megatron_fsdp", "cpu_offloading_num_layers", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
            "cuda_graph_impl", "cuda_graph_scope", "recompute_method", "recompute_num_layers",
        ):
            out[k] = ""
        out["recompute_granularity"] = (
            out["recompute_granularity"] and out["recompute_granularity"] + " (family default; a preset may override)"
        )
        if fam_dir == "deepseek":
            out["use_precision_aware_optimizer"] = f"{pao} (unless FSDP)"
    return out


V060 = f"{REPO}@v0.6.0 (51885cf1):src/megatron/bridge/perf_recipes/deepseek/"
MANUAL = {
    # 26.08 table rows and the verification cards of the same recipes (card bridge_commit 79308d0d)
    "GB300": dict(
        preset="deepseek_v3_pretrain_256gpu_gb300_fp8mx_config",
        recompute_granularity="selective (empty list)",
        recompute_modules="[]",
        extra="fp8_dot_product_attention=True; fp8_output_proj=True; moe_paged_stash=True; "
        "moe_expert_rank_capacity_factor=1.5; use_transformer_engine_op_fuser=True",
        source=V060 + "gb300/deepseek_v3.py::deepseek_v3_pretrain_256gpu_gb300_fp8mx_config; "
        "common.py::_enable_deepseek_full_iteration_mxfp8",
    ),
    "GB200": dict(
        preset="deepseek_v3_pretrain_256gpu_gb200_fp8mx_config",
        recompute_granularity="selective",
        recompute_modules="['mla_up_proj']",
        extra="fp8_dot_product_attention=False; fp8_output_proj=True; moe_paged_stash=True; "
        "moe_expert_rank_capacity_factor=1.5; use_transformer_engine_op_fuser=True",
        source=V060 + "gb200/deepseek_v3.py::deepseek_v3_pretrain_256gpu_gb200_fp8mx_config; "
        "common.py::_enable_deepseek_full_iteration_mxfp8",
    ),
}


def manual(r: dict) -> dict | None:
    if not ("26.08" in r["framework_version"] or "verification card" in r["framework_version"]):
        return None
    if (
        not r["model"].lower().replace("-", "").startswith("deepseekv3")
        or r["gpu_type"] not in MANUAL
        or "MXFP8" not in r["precision"].upper()
    ):
        return None
    m = MANUAL[r["gpu_type"]]
    return {
        "id": r["id"],
        "model": r["model"],
        "gpu_type": r["gpu_type"],
        "num_gpus": r["num_gpus"],
        "framework_version": r["framework_version"],
        "bridge_tag": "v0.6.0",
        "preset": m["preset"],
        "preset_match": "recipe function read by hand (layout, GBS, MBS agree)",
        "use_megatron_fsdp": False,
        "cpu_offloading_num_layers": 0,
        "use_precision_aware_optimizer": True,
        "exp_avg_dtype": "bf16",
        "exp_avg_sq_dtype": "bf16",
        "master_param_storage": "fp32",
        "main_grad_dtype": "bf16",
        "grad_reduce_in_fp32": False,
        "fp8_param_gather": True,
        "fp4_param_gather": False,
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "te",
        "recompute_granularity": m["recompute_granularity"],
        "recompute_method": "",
        "recompute_num_layers": "",
        "recompute_modules": m["recompute_modules"],
        "overlap_moe_expert_parallel_comm": True,
        "delay_wgrad_compute": True,
        "cuda_graph_impl": "full_iteration",
        "cuda_graph_scope": "[]",
        "optimizer": "adam",
        "extra": m["extra"],
        "source": m["source"] + "; base recipe "
        "src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py::deepseek_v3_pretrain_1024gpu_h100_bf16_config "
        "(precision-aware, bf16 moments)",
    }


def main() -> None:
    pdir = Path(sys.argv[1])
    presets_by_tag = {
        t: [json.loads(line) for line in (pdir / f"presets_{t}.jsonl").open()]
        for t in sorted(set(TAG_OF_RELEASE.values()))
    }
    with open("benchmarks/data/published_runs.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept = {}
    if len(sys.argv) > 2:
        with open(sys.argv[2], encoding="utf-8") as f:
            kept = {k["id"]: k for k in csv.DictReader(f) if k["preset_match"].startswith("read by hand")}
    w = csv.DictWriter(sys.stdout, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        if r["id"] in kept:
            w.writerow(kept[r["id"]])
            continue
        out = manual(r) or resolve(r, presets_by_tag)
        if out and re.search(r"Megatron-FSDP=\d+", r["other_notes"]) and str(out["use_megatron_fsdp"]) != "True":
            # the published table's FSDP column says FSDP; the preset does not set it (or no preset matched)
            out["use_megatron_fsdp"] = "True (table FSDP column; not in the preset)"
            if out["use_precision_aware_optimizer"] is True and r["precision"].upper().startswith("BF16"):
                out["use_precision_aware_optimizer"] = "True (set_post_overrides runs after the FSDP override)"
            if not out["preset"] and "LLAMA3_70B" in r["model"].upper() and r["tp"] == "1" and r["pp"] == "1":
                # same layout as the v0.2.0 GB200/GB300 FP8-CS presets except GBS (table 256, preset 128)
                out["cpu_offloading_num_layers"] = (
                    "40 (inferred: v0.2.0 preset of this GPU, GBS differs)"
                    if r["gpu_type"] == "GB200"
                    else "20 (inferred: v0.2.0 preset of this GPU, GBS differs)"
                )
        if out:
            w.writerow(out)
        else:
            print(
                f"unresolved {r['id']} {r['framework_version']} {r['model']} {r['gpu_type']} {r['precision']}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
