"""The catalogue: ``tune models`` and ``tune gpus`` (the bundled presets and their datasheet numbers)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from tuner.cli._common import GIB, Col, fitted_table, out, say

app = typer.Typer()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the list as JSON (every field, at any width).")]


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """List the bundled model presets."""
    from specs import list_models, load_model

    rows: list[dict[str, Any]] = []
    for n in list_models():
        m = load_model(n)
        rows.append({"name": n, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads,
                     "query_groups": m.num_query_groups, "experts": m.num_experts if m.is_moe else 0,
                     "topk": m.moe_router_topk if m.is_moe else 0, "active_params": m.active_params(),
                     "total_params": m.total_params(), "source": m.source.split(" ")[0]})
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    out.print("Bundled models (or give --model path/to/config.json); parameters in billions")
    cols = [Col("name"), Col("layers", "right"), Col("hidden", "right", 2), Col("heads/groups", "left", 3),
            Col("experts (top-k)"), Col("active", "right"), Col("total", "right"), Col("source", "left", 4)]
    out.print(fitted_table(cols, [[r["name"], str(r["layers"]), str(r["hidden"]), f"{r['heads']}/{r['query_groups']}",
                                   f"{r['experts']} ({r['topk']})" if r["experts"] else "dense",
                                   f"{r['active_params'] / 1e9:.2f}",
                                   f"{r['total_params'] / 1e9:.1f}", r["source"]] for r in rows]))


@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """List the bundled GPU types and their datasheet numbers."""
    from specs import list_gpus, load_gpu

    rows: list[dict[str, Any]] = []
    for n in list_gpus():
        g = load_gpu(n)
        rows.append({"name": g.name, "memory_gib": g.hbm_bytes / GIB, "bf16_tflops": g.peak_flops_bf16 / 1e12,
                     "fp8_tflops": g.peak_flops_fp8 / 1e12 if g.peak_flops_fp8 else None,
                     "hbm_tb_per_s": g.hbm_bytes_per_s / 1e12,
                     "nvlink_gb_per_s_per_direction": g.nvlink_bytes_per_s / 1e9, "gpus_per_node": g.gpus_per_node,
                     "nvlink_domain": g.nvlink_domain})
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    say("Bundled GPUs: dense (non-sparse) peaks from NVIDIA datasheets; memory as nvidia-smi reports it "
        "(specs/data/gpus/*.yaml). NVLink: GB/s per direction; domain: GPUs one NVLink domain joins.", indent=0, hang=2)
    cols = [Col("name"), Col("GiB", "right"), Col("bf16 TFLOP/s", "right"), Col("fp8 TFLOP/s", "right"),
            Col("HBM TB/s", "right"), Col("NVLink", "right"), Col("per node", "right", 1), Col("domain", "right")]
    out.print(fitted_table(cols, [[r["name"], f"{r['memory_gib']:.1f}", f"{r['bf16_tflops']:.0f}",
                                   "-" if r["fp8_tflops"] is None else f"{r['fp8_tflops']:.0f}",
                                   f"{r['hbm_tb_per_s']:.2f}", f"{r['nvlink_gb_per_s_per_direction']:.0f}",
                                   str(r["gpus_per_node"]), str(r["nvlink_domain"])]
                                  for r in rows]))
