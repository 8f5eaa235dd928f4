"""The catalogue: ``tune models`` and ``tune gpus`` (the bundled presets and their datasheet numbers)."""

from __future__ import annotations

import typer
from rich.table import Table

from tuner.cli._common import GIB, out

__all__ = ["app", "models", "gpus"]

app = typer.Typer()


@app.command()
def models() -> None:
    """List the bundled model presets."""
    from specs import list_models, load_model

    t = Table(title="bundled models (or give --model path/to/config.json)", title_justify="left")
    for col in ("name", "layers", "hidden", "heads/groups", "experts (top-k)", "active params", "total params", "source"):
        t.add_column(col, overflow="fold")
    for n in list_models():
        m = load_model(n)
        t.add_row(n, str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.num_query_groups}",
                  f"{m.num_experts} ({m.moe_router_topk})" if m.is_moe else "dense",
                  f"{m.active_params() / 1e9:.2f} B", f"{m.total_params() / 1e9:.1f} B", m.source.split(" ")[0])
    out.print(t)


@app.command()
def gpus() -> None:
    """List the bundled GPU types and their datasheet numbers."""
    from specs import list_gpus, load_gpu

    t = Table(title="bundled GPUs", title_justify="left")
    for col in ("name", "memory GiB", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM TB/s", "NVLink GB/s/dir", "per node", "NVLink domain"):
        t.add_column(col)
    for n in list_gpus():
        g = load_gpu(n)
        t.add_row(g.name, f"{g.hbm_bytes / GIB:.1f}", f"{g.peak_flops_bf16 / 1e12:.0f}", f"{g.peak_flops_fp8 / 1e12:.0f}" if g.peak_flops_fp8 else "-",
                  f"{g.hbm_bytes_per_s / 1e12:.2f}", f"{g.nvlink_bytes_per_s / 1e9:.0f}", str(g.gpus_per_node), str(g.nvlink_domain))
    out.print(t)
    out.print("Dense (non-sparse) peaks from NVIDIA datasheets; memory as nvidia-smi reports it. Sources: specs/data/gpus/*.yaml")
