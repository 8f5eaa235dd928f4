"""Write the settings of ``published_runs_fixes.csv`` into ``published_runs.csv`` as explicit columns (issue 14).

    python benchmarks/tools/apply_published_fixes.py            # rewrites benchmarks/data/published_runs.csv
                                                                # and the row-by-row section of published_runs_fixes.md

Every published row keeps its cells; the columns of :data:`COLUMNS` are added (blank where the fixes file has no value
for the row, i.e. the recipe that ran could not be read: the reader then falls back to the row's ``other_notes`` and
its defaults, ``cost_model/validate.py``). The fixes file's annotated values are normalised (``True (unless FSDP)``,
``20 (inferred: ...)``, ``['mla_up_proj']``, ``selective (empty list)``); the normalisation of each row and what it
changes against the old reading (``other_notes`` key=value and the ``recompute`` cell) is written, row by row, into
``published_runs_fixes.md`` between the markers ``<!-- applied:begin -->`` and ``<!-- applied:end -->``.

Re-running it is idempotent: the added columns are recomputed from the fixes file.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = DATA / "published_runs.csv"
FIXES = DATA / "published_runs_fixes.csv"
NOTE = DATA / "published_runs_fixes.md"

#: The columns added to published_runs.csv, with Megatron's names.
COLUMNS = (
    "use_megatron_fsdp", "cpu_offloading_num_layers", "use_precision_aware_optimizer", "exp_avg_dtype",
    "exp_avg_sq_dtype", "grad_reduce_in_fp32", "fp8_recipe", "fp8_param_gather", "fp4_param_gather",
    "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "te_version", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "recompute_modules", "overlap_moe_expert_parallel_comm", "cuda_graph_impl",
    "cuda_graph_scope", "optimizer", "optimizer_fp8_recipe", "recipe_source",
)

#: Transformer Engine (major.minor) class of each container, for the fused cross-entropy's bytes: up to TE 2.17 the
#: gradient is written in place into the bf16 logits, from TE 2.18 a separate fp32 gradient is kept
#: (docs/production_sources.md correction 7). The containers' TE versions were NOT read in a release note here:
#: [inferred from TE's roughly monthly releases, 2.9 in the Oct-2025 Megatron-Core dev row of the table, 2.20.2 on
#: 2026-12-01]: containers up to 26.06.01 -> "2.17" (in place), 26.08 and the Jul/Aug-2026 verification cards -> "2.18".
TE_OF_RELEASE = {"26.08": "2.18", "card": "2.18"}


def _bool(v: str) -> str:
    t = v.strip().lower()
    if t.startswith("true"):
        return "True"
    if t.startswith("false"):
        return "False"
    return ""


def _int(v: str) -> str:
    m = re.match(r"\s*(\d+)", v)
    return m.group(1) if m else ""


def _list(v: str) -> str:
    items = re.findall(r"[A-Za-z_]+", v.split("(")[0] if not v.startswith("[") else v.split("]")[0])
    return ",".join(items)


def _release(fv: str) -> str:
    if "verification card" in fv:
        return "card"
    m = re.search(r"(\d\d\.\d\d(?:\.\d\d)?)", fv)
    return m.group(1) if m else ""


def normalise(fix: dict[str, str], run: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The added columns of one row, and the notes on how annotated values were read."""
    notes: list[str] = []
    out = {k: "" for k in COLUMNS}
    fsdp = _bool(fix["use_megatron_fsdp"])
    out["use_megatron_fsdp"] = fsdp
    if "table FSDP column" in fix["use_megatron_fsdp"]:
        notes.append("FSDP from the published table's column (not in the preset)")
    out["cpu_offloading_num_layers"] = _int(fix["cpu_offloading_num_layers"])
    if "inferred" in fix["cpu_offloading_num_layers"]:
        notes.append(
            f"activation offload {out['cpu_offloading_num_layers']} layers inferred from the v0.2.0 preset of this GPU "
            "(GBS differs)"
        )
    pa = fix["use_precision_aware_optimizer"]
    out["use_precision_aware_optimizer"] = "False" if ("unless FSDP" in pa and fsdp == "True") else _bool(pa)
    if "unless FSDP" in pa:
        notes.append("precision-aware optimizer: the DeepSeek-V3 recipe's (FSDP not set for this row)")
    for k in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        out[k] = fix[k] if fix[k] in ("fp32", "bf16") else ""
    out["grad_reduce_in_fp32"] = _bool(fix["grad_reduce_in_fp32"])
    prec = run.get("precision", "").lower()
    if "fp8" in prec and "mx" not in prec and "block" not in prec and fix["bridge_tag"].strip():
        out["fp8_recipe"] = (
            "tensorwise"  # Bridge FP8-CS = current scaling (mixed_precision.py bf16_with_fp8_current_scaling_mixed)
        )
    out["fp8_param_gather"] = _bool(fix["fp8_param_gather"])
    out["fp4_param_gather"] = _bool(fix["fp4_param_gather"])
    out["cross_entropy_loss_fusion"] = _bool(fix["cross_entropy_loss_fusion"])
    out["cross_entropy_fusion_impl"] = fix["cross_entropy_fusion_impl"].strip()
    if out["cross_entropy_fusion_impl"] == "te":
        out["te_version"] = TE_OF_RELEASE.get(_release(run.get("framework_version", "")), "2.17")
    gran = fix["recompute_granularity"].strip()
    mods = _list(fix["recompute_modules"]) if fix["recompute_modules"].strip() else ""
    if gran.startswith("selective (empty list)"):
        out["recompute_granularity"] = "none"
        notes.append("selective recompute with an empty module list: recomputes nothing")
    elif gran.startswith("selective (family default"):
        out["recompute_granularity"], out["recompute_modules"] = "selective", mods or "core_attn"
        notes.append("selective recompute: the family default (Megatron's ['core_attn'])")
    elif gran == "selective":
        out["recompute_granularity"], out["recompute_modules"] = "selective", mods
    elif gran == "full":
        out["recompute_granularity"] = "full"
        out["recompute_method"] = fix["recompute_method"].strip()
        out["recompute_num_layers"] = _int(fix["recompute_num_layers"])
    elif gran == "none":
        out["recompute_granularity"] = "none"
    out["overlap_moe_expert_parallel_comm"] = _bool(fix["overlap_moe_expert_parallel_comm"])
    impl = fix["cuda_graph_impl"].strip()
    scope = fix["cuda_graph_scope"].strip()
    out["cuda_graph_impl"] = impl
    if impl and impl != "none":
        out["cuda_graph_scope"] = (
            "full_iteration" if (impl == "full_iteration" or "full_iteration" in scope) else (_list(scope) or "full")
        )
        if out["cuda_graph_scope"] == "full":
            notes.append("TE CUDA graphs with an empty scope: the whole layer")
    out["optimizer"] = fix["optimizer"].strip()
    if prec == "bf16" or prec.startswith("bf16"):
        # Bridge's MixedPrecisionConfig.fp8_recipe defaults to "tensorwise" even for bf16_mixed and is copied onto the
        # optimizer config (training/mixed_precision.py, v0.2.0-v0.6.0): megatron-core keeps fp32 masters itself
        out["optimizer_fp8_recipe"] = "tensorwise"
    preset = fix["preset"].strip()
    if fix["bridge_tag"].strip():
        out["recipe_source"] = f"Megatron-Bridge {fix['bridge_tag']}" + (
            f" :: {preset}" if preset else " (family-wide fields only)"
        )
    else:  # a run of another stack, read by hand in the write-up that published it
        out["recipe_source"] = preset
    return out, notes


#: Rows of the 25.09 container ran NeMo 2.0's performance scripts (no Megatron-Bridge tag before v0.2.0 has
#: ``scripts/performance``). Read in NVIDIA/NeMo (release tag not pinned in this session): ``scripts/performance/
#: helpers.py::set_primary_perf_configs`` sets ``recipe.trainer.plugins.grad_reduce_in_fp32 = False`` ("bf16 grad
#: dtype") for every run; ``nemo/collections/llm/recipes/precision/mixed_precision.py``: ``bf16_with_fp8_current_
#: scaling_mixed`` (tensorwise) and ``bf16_with_mxfp8_mixed`` set ``fp8_param_gather = True``. Megatron-FSDP from the
#: table's column (the row's note ``Megatron-FSDP=N``). Nothing else of those scripts was read: the other columns stay
#: blank.
NEMO2_RELEASES = ("25.09",)


def nemo2_columns(run: dict[str, str]) -> tuple[dict[str, str], list[str]] | None:
    """The columns of a 25.09 row (NeMo 2.0 perf scripts), or None for other rows."""
    if _release(run.get("framework_version", "")) not in NEMO2_RELEASES:
        return None
    out = {k: "" for k in COLUMNS}
    notes = []
    out["grad_reduce_in_fp32"] = "False"
    prec = run.get("precision", "").lower()
    if "fp8" in prec or "mx" in prec:
        out["fp8_param_gather"] = "True"
        if "mx" not in prec:
            out["fp8_recipe"] = "tensorwise"
    m = re.search(r"Megatron-FSDP=(\d+)", run.get("other_notes", ""))
    if m and int(m.group(1)) > 1:
        out["use_megatron_fsdp"] = "True"
        notes.append(f"FSDP from the table's column (note Megatron-FSDP={m.group(1)})")
    out["recipe_source"] = (
        "NeMo 2.0 perf scripts (25.09 container; NVIDIA/NeMo scripts/performance/helpers.py, "
        "precision/mixed_precision.py)"
    )
    return out, notes


def _old_reading(run: dict[str, str]) -> dict[str, str]:
    """What the reader took from a row before these columns (its other_notes and recompute cell)."""
    kv = dict(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\]]*\]|[^;|,\s]+)", run.get("other_notes", "")))
    return {
        "fsdp": kv.get("use_megatron_fsdp", kv.get("Megatron-FSDP", "")),
        "offload": kv.get("cpu_offloading_num_layers", ""),
        "a2a": kv.get("moe_a2a_overlap", ""),
        "recompute": run.get("recompute", ""),
    }


def main() -> int:
    text = RUNS.read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    base_cols = [c for c in (reader.fieldnames or []) if c not in COLUMNS]
    runs = list(reader)
    fixes = {r["id"]: r for r in csv.DictReader(FIXES.open(encoding="utf-8"))}
    lines = ["| id | model, GPUs | set from its recipe | read as | against the old reading |", "|---|---|---|---|---|"]
    for run in runs:
        fix = fixes.get(run["id"])
        nemo2 = nemo2_columns(run) if fix is None else None
        if fix is None and nemo2 is None:
            for k in COLUMNS:
                run[k] = ""
            continue
        cols, notes = normalise(fix, run) if fix is not None else nemo2  # type: ignore[misc]
        run.update(cols)
        old = _old_reading(run)
        changed = []
        if cols["grad_reduce_in_fp32"] == "False":
            changed.append("main grads bf16 (was fp32)")
        if cols["use_precision_aware_optimizer"] == "True":
            changed.append("precision-aware optimizer on (was off)")
        if cols["exp_avg_dtype"] == "bf16":
            changed.append("bf16 moments (was fp32)")
        if cols["optimizer_fp8_recipe"] == "tensorwise" and cols["use_precision_aware_optimizer"] == "True":
            changed.append(
                "fp32 master weights, not 2-B remainders (the optimizer gets Bridge's fp8_recipe tensorwise)"
            )
        if cols["fp8_param_gather"] == "True" or cols["fp4_param_gather"] == "True":
            changed.append("low-precision weights without a bf16 copy (was bf16 + copy)")
        if cols["cross_entropy_fusion_impl"] == "te":
            changed.append(f"TE fused cross-entropy, TE {cols['te_version']} class (was native)")
        if cols["use_megatron_fsdp"] == "True" and old["fsdp"] not in ("True", "true"):
            changed.append("Megatron-FSDP (the note's 'Megatron-FSDP=N' was not read)")
        if cols["cpu_offloading_num_layers"] not in ("", "0"):
            changed.append(f"activation offload {cols['cpu_offloading_num_layers']} layers (row was unrepresentable)")
        if cols["overlap_moe_expert_parallel_comm"] == "True" and old["a2a"]:
            changed.append("EP A2A overlap (the note's moe_a2a_overlap was unreadable: digits in the key)")
        if cols["recompute_granularity"] == "full":
            changed.append(f"full recompute, method {cols['recompute_method']} (was read as uniform)")
        if cols["optimizer"] == "dist_muon":
            changed.append("distributed Muon (was Adam)")
        if cols["recompute_granularity"] == "none" and old["recompute"].strip().lower() not in (
            "",
            "none",
            "not stated",
        ):
            changed.append(f"recompute none (cell {old['recompute']!r})")
        set_cols = ", ".join(f"{k}={v}" for k, v in cols.items() if v and k != "recipe_source")
        lines.append(
            f"| {run['id']} | {run['model']}, {run['num_gpus']}x{run['gpu_type']} | {cols['recipe_source']}: "
            f"{set_cols} | "
            f"{'; '.join(notes) or '-'} | {'; '.join(changed) or '-'} |"
        )
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=base_cols + list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for run in runs:
        w.writerow({k: run.get(k, "") for k in base_cols + list(COLUMNS)})
    RUNS.write_text(buf.getvalue(), encoding="utf-8")
    note = NOTE.read_text(encoding="utf-8")
    section = (
        "<!-- applied:begin -->\n## Applied to published_runs.csv, row by row\n\n"
        f"`python benchmarks/tools/apply_published_fixes.py` wrote the columns `{', '.join(COLUMNS)}` into "
        "`published_runs.csv` (the reader, `cost_model/validate.py::read_runs`, prefers them over `other_notes`). "
        f"{len(fixes)} rows have values from the recipe that ran them (a Megatron-Bridge one unless `recipe_source` "
        "names another), the other 25.09 rows the few settings read in NeMo 2.0's "
        "perf scripts (the script's `nemo2_columns`); the other rows keep blank cells (their recipe was not "
        "read: see 'Rows not resolved' above) and are read as before. `te_version` is the TE class of the row's "
        "container for the fused cross-entropy's bytes, **inferred** (see the script's `TE_OF_RELEASE`).\n\n"
        + "\n".join(lines)
        + "\n<!-- applied:end -->\n"
    )
    if "<!-- applied:begin -->" in note:
        note = re.sub(r"<!-- applied:begin -->.*<!-- applied:end -->\n", lambda _m: section, note, flags=re.S)
    else:
        note = note.rstrip("\n") + "\n\n" + section
    NOTE.write_text(note, encoding="utf-8")
    print(f"{len(runs)} rows, {len(fixes)} with recipe values; columns added: {len(COLUMNS)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
