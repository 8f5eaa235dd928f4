"""Peak memory of measured H200 trials with non-default run options, predicted from ``tune estimate``'s flags alone.

For every finished trial row of the given sweep files (``launch.harness.sweep``, Transformer Engine) that ran with a
setting other than the seed's (bf16 main gradients, TE's fused cross-entropy, TE's fused permutation, Megatron's
fusions, an fp8 recipe, fp8 parameter gathering), this builds the ``tune estimate`` command line a user would type
(the model slice, ``1xH200``, the layout flags, and the run flags: ``--grad-reduce-in-bf16``,
``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``, ``--moe-permute-fusion``, ``--fp8-recipe``,
``--fp8-param-gather``, with the harness's own ``--no-bias-swiglu-fusion`` and ``--no-rope-fusion``), runs it and
compares its predicted peak with the row's measured peak reserved memory. Rows with model overrides (changed expert
counts) cannot be typed as flags and are listed as skipped.

Usage::

    python benchmarks/bench_stack_flags.py benchmarks/results/h200_te_*/*/sweep.jsonl \
        benchmarks/results/h200_te_*/*/*/sweep.jsonl \
        --out benchmarks/results/stack_flags/rows.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def run_flags(harness: dict[str, Any], options: dict[str, Any], precision: str) -> list[str]:
    """The run flags of a row's harness settings (the harness runs its SwiGLU unfused, RoPE unfused unless
    ``megatron_fusions``)."""
    f = ["--no-bias-swiglu-fusion"]
    if not (harness.get("megatron_fusions") or options.get("megatron_fusions")):
        f.append("--no-rope-fusion")
    if harness.get("grad_reduce_in_fp32") is False:
        f.append("--grad-reduce-in-bf16")
    if harness.get("cross_entropy_fusion"):
        f += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    if harness.get("moe_permute_fusion"):
        f.append("--moe-permute-fusion")
    if precision == "fp8" and harness.get("fp8_recipe"):
        f += ["--fp8-recipe", harness["fp8_recipe"]]
    if harness.get("fp8_param_gather"):
        f.append("--fp8-param-gather")
    return f


def non_default(harness: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """The row's settings other than the seed's."""
    s = []
    if harness.get("grad_reduce_in_fp32") is False:
        s.append("bf16 main grads")
    if harness.get("cross_entropy_fusion"):
        s.append("TE fused CE")
    if harness.get("moe_permute_fusion"):
        s.append("permute fusion")
    if harness.get("megatron_fusions") or options.get("megatron_fusions"):
        s.append("Megatron fusions")
    if harness.get("fp8_recipe"):
        s.append(f"fp8 {harness['fp8_recipe']}")
    if harness.get("fp8_param_gather"):
        s.append("fp8 param gather")
    return s


def layout_flags(lay: dict[str, Any]) -> list[str]:
    """``tune estimate``'s layout flags for a row's layout."""
    f = [
        "--tp",
        str(lay["tp"]),
        "--pp",
        str(lay["pp"]),
        "--vpp",
        str(lay["vpp"]),
        "--cp",
        str(lay["cp"]),
        "--ep",
        str(lay["ep"]),
        "--etp",
        str(lay["etp"]),
        "--mbs",
        str(lay["micro_batch_size"]),
        "--dispatcher",
        lay["dispatcher"],
        "--recompute",
        lay["recompute_granularity"],
        "--optimizer-offload-fraction",
        str(lay["optimizer_offload_fraction"]),
        "--exp-avg-dtype",
        lay["exp_avg_dtype"],
        "--sequence-parallel" if lay["sequence_parallel"] else "--no-sequence-parallel",
    ]
    if lay["recompute_granularity"] == "full":
        f += ["--recompute-method", lay["recompute_method"], "--recompute-num-layers", str(lay["recompute_num_layers"])]
    if lay["recompute_granularity"] == "selective":
        f += ["--recompute-modules", ",".join(lay["recompute_modules"])]
    if not lay["use_precision_aware_optimizer"]:
        f.append("--no-precision-aware-optimizer")
    if lay["num_layers_in_first_pipeline_stage"] or lay["num_layers_in_last_pipeline_stage"]:
        f += [
            "--first-stage-layers", str(lay["num_layers_in_first_pipeline_stage"]), "--last-stage-layers",
            str(lay["num_layers_in_last_pipeline_stage"]),
        ]
    return f


def main(argv: list[str] | None = None) -> int:
    from typer.testing import CliRunner

    from tuner.cli import app

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    runner = CliRunner()
    rows, skipped, seen = [], [], set()
    for path in a.sweeps:
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            r = json.loads(line)
            h = (r.get("run_options") or {}).get("harness") or {}
            o = r.get("options") or {}
            if r.get("status") != "ok" or not h.get("use_transformer_engine") or not non_default(h, o):
                continue
            where = (
                f"{'/'.join(path.parts[-4:-1] if path.parent.name == 'sweep' else path.parts[-3:-1])}/{path.name}:{i}"
            )
            key = (
                r["model"],
                json.dumps(r["layout"], sort_keys=True),
                json.dumps(h, sort_keys=True),
                r["peak_reserved_gib"],
            )
            if key in seen:  # a row that repeats another's measurement to the last digit counts once
                continue
            seen.add(key)
            if r.get("model_overrides"):
                skipped.append({"row": where, "why": "model overrides (not a flag)"})
                continue
            name, _, rest = r["model"].partition("[")
            cmd = [
                "estimate", "--model", name, "--gpus", r["gpus"], "--seq-len", str(r["seq_length"]), "--global-batch",
                str(r["global_batch_size"]), "--precision", r["precision"], "--json",
            ]
            if rest:
                cmd += ["--layers", rest.split()[0]]
            cmd += layout_flags(r["layout"]) + run_flags(h, o, r["precision"])
            res = runner.invoke(app, cmd)
            if res.exit_code != 0:
                skipped.append({"row": where, "why": res.output.strip()[:200]})
                continue
            pred = json.loads(res.output)["peak_gib"]
            meas = r["peak_reserved_gib"]
            rows.append(
                {
                    "row": where,
                    "case": r.get("case"),
                    "model": r["model"],
                    "precision": r["precision"],
                    "settings": non_default(h, o),
                    "command": "tune " + " ".join(cmd),
                    "measured_reserved_gib": round(meas, 3),
                    "predicted_gib": round(pred, 3),
                    "error": round(pred / meas - 1, 4),
                }
            )
    errs = [abs(x["error"]) for x in rows]
    summary = {
        "rows": len(rows),
        "median_abs_error": round(statistics.median(errs), 4) if errs else None,
        "max_abs_error": round(max(errs), 4) if errs else None,
        "skipped": skipped,
    }
    for x in rows:
        print(
            f"{x['row']:<44} {x['case']:<20} {', '.join(x['settings']):<28} measured {x['measured_reserved_gib']:7.2f} "
            f"predicted {x['predicted_gib']:7.2f} GiB {x['error']:+.1%}"
        )
    print(
        f"{summary['rows']} rows: median |error| {summary['median_abs_error']:.1%}, max "
        f"{summary['max_abs_error']:.1%}; "
        f"skipped {len(skipped)}"
    )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
