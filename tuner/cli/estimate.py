"""``tune estimate`` and ``tune check``: one layout, given by its flags (:class:`~tuner.cli._layout.LayoutFlags`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from cost_model.fidelity import gaps
from cost_model.uncertainty import error_bars
from specs.errors import InfeasibleLayout, TunerError
from tuner.cli import _common as C
from tuner.cli._common import GIB, Col, RunChoice, err, fitted_table, out, require, run_options, say
from tuner.cli._from import FromOpt
from tuner.cli._layout import LayoutFlags, apply_layout_string, layout_options, split_hint

app = typer.Typer()


def estimable_layout(layout: LayoutFlags, m: Any, w: Any, c: Any, opts: Any) -> Any:
    """The layout the flags give, with ``--pipeline-layout`` applied, as ``estimate`` and ``timeline`` estimate it.
    Raises TunerError: a layout string the cost model cannot represent, or a network / release rule broken."""
    lay = layout.to_layout(c.num_gpus)
    if layout.pipeline_layout is not None:
        lay, odd, _ = apply_layout_string(lay, m, layout.pipeline_layout, vpp_given=layout.vpp_given,
                                          split_given=layout.split_given)
        if odd:
            raise TunerError(f"--pipeline-layout {layout.pipeline_layout!r} is valid for Megatron, but the cost model "
                             "handles only even splits and first/last-rank splits; `tune check` accepts it")
    refuse_env_rules(lay, m, w, c, opts)
    return lay


def run_options_dict(opts: Any) -> dict[str, Any]:
    """The run options as plain values (tuples as lists), for JSON and the recipe."""
    import dataclasses

    return {f.name: list(v) if isinstance(v := getattr(opts, f.name), tuple) else v for f in dataclasses.fields(opts)}


def rule_error(ex: InfeasibleLayout, m: Any, lay: Any) -> TunerError:
    """The message for a rule the estimate refused, with a first/last split that works when the split is the problem."""
    hint = split_hint(m, lay) if ex.rule_id == "pipeline_split" else ""
    return TunerError(f"the layout breaks rule {ex.rule_id}: {ex.reason}{hint}")


def refuse_env_rules(lay: Any, m: Any, w: Any, c: Any, opts: Any) -> None:
    """Raise a TunerError for the first rule of the cluster's network or the megatron-core release the layout breaks
    (``dispatcher_fabric``, ``query_groups_tp``): the estimate does not check them (the search's enumeration does)."""
    from search_spaces.rules import RuleEnv, check_layout

    broken = [(r, why) for r, why in check_layout(lay, m, w, RuleEnv.of(c, opts))
              if r in ("dispatcher_fabric", "query_groups_tp")]
    if broken:
        raise TunerError(f"the layout breaks rule {broken[0][0]}: {broken[0][1]}")


def _inputs(model: str | None, gpus: str | None, gpus_per_node: int | None, network_gbps: float | None,
            usd: float | None, seq_len: int, global_batch: int, precision: str, layers: int | None,
            network: str | None = None, host_memory_gib: float | None = None,
            task: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """(model, cluster, workload) of the command line; ``layers`` slices the model as ``tune --layers`` does.

    Raises:
        TunerError: a missing, unknown or malformed model, GPU, network or workload value."""
    from specs import Precision, Workload, load_model, parse_gpus
    from specs.hardware import network_bytes_per_s
    from specs.model import slice_model

    if precision not in ("bf16", "fp8"):
        raise TunerError(f"--precision {precision!r}: accepted bf16 or fp8")
    if layers is not None and layers < 1:
        raise TunerError(f"--layers must be a positive integer (decoder layers of the slice), got {layers!r}")
    # launches nothing
    m = slice_model(load_model(require(model, "--model", "MiniMax-M2"), allow_config_args=True), layers)
    c = parse_gpus(require(gpus, "--gpus", "64xH200"), gpus_per_node=gpus_per_node,
                   inter_node_bytes_per_s=network_bytes_per_s(network_gbps) if network_gbps is not None else None,
                   usd_per_gpu_hour=usd, network=network, host_memory_gib=host_memory_gib, require_network=True)
    w = Workload(seq_length=seq_len, global_batch_size=global_batch, precision=Precision(precision),
                 **(task or {})).on_model(m.is_mla)
    if precision == "fp8" and not c.gpu.peak_flops_fp8:
        raise TunerError(f"--precision fp8: {c.gpu.name} has no fp8 tensor cores; use --precision bf16")
    return m, c, w


@app.command()
@layout_options
@run_options
def estimate(
    ctx: typer.Context,
    layout: LayoutFlags,
    run: RunChoice,
    from_file: FromOpt = None,
    model: C.ModelOpt = None, gpus: C.GpusOpt = None, layers: C.LayersOpt = None, gpus_per_node: C.PerNodeOpt = None,
    network_gbps: C.NetOpt = None, usd_per_gpu_hour: C.PriceOpt = None, seq_len: C.SeqOpt = 8192,
    global_batch: C.GbsOpt = 128, precision: C.PrecOpt = "bf16", calibration: C.CalOpt = None,
    memory_headroom: C.HeadroomOpt = None, network: C.NetworkOpt = None, megatron_core: C.MegatronCoreOpt = None,
    host_memory_gib: C.HostMemOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help=(
        "Also draw the memory and time parts as stacked bars (PNG)."))] = None,
) -> None:
    """Predict one layout: memory per GPU (worst pipeline rank) and step time, with their parts."""
    from cost_model.calibration import load_calibration
    from cost_model.estimate import estimate as _estimate
    from search_spaces.rules import layout_warnings
    from tuner.report import pipeline_layout_of

    if plot is not None:
        from tuner.plots import check_image_path

        check_image_path("--plot", plot)
    from tuner.cli._from import command_inputs

    launch, model, gpus, seq_len, global_batch, precision, layers, run, layout = command_inputs(
        from_file, ctx, model=model, gpus=gpus, seq_len=seq_len, global_batch=global_batch, precision=precision,
        layers=layers, run=run, layout=layout)
    m, c, w = _inputs(model, gpus, gpus_per_node, network_gbps, usd_per_gpu_hour, seq_len, global_batch, precision,
                      layers, network, host_memory_gib, run.workload_kw())
    stack = run.resolve(precision, megatron_core)
    opts = stack.options
    lay = estimable_layout(layout, m, w, c, opts)
    if stack.preset.drops_allgather and m.is_moe and lay.dispatcher.value == "allgather":
        raise TunerError(f"--dispatcher allgather: --stack {stack.preset.name} rewrites it to alltoall, so the run "
                         "would use alltoall; ask for --dispatcher alltoall, or use --stack megatron-lm to estimate "
                         "allgather")
    cal = load_calibration(calibration)
    bars = error_bars(m, c.gpu, w.precision)
    headroom = bars.headroom if memory_headroom is None else memory_headroom
    try:
        e = _estimate(m, c, w, lay, calibration=cal, memory_headroom=headroom, options=opts)
    except InfeasibleLayout as ex:
        raise rule_error(ex, m, lay) from None
    d = e.to_dict()
    lo, hi = bars.throughput_interval(e.tokens_per_s_per_gpu)
    mlo, mhi = bars.memory_interval(e.peak_bytes)
    d.update(predicted_low=lo, predicted_high=hi, peak_gib_low=mlo / GIB, peak_gib_high=mhi / GIB,
             error_bars=bars.to_dict(), fit=(("fits" if e.fits else "does not fit") if memory_headroom is not None else
                                             bars.fit_verdict(e.peak_bytes, e.hbm_bytes)))
    found = gaps(lay, m, c.gpu, cal)
    d.update(pipeline_model_parallel_layout=pipeline_layout_of(lay, m), network=c.network.key if c.network else None,
             megatron_core=opts.megatron_core, warnings=layout_warnings(lay, m, opts),
             known_gaps=[g.long for g in found], stack=stack.preset.name, task=w.task, run_flags=list(stack.overrides),
             run_options=run_options_dict(opts))
    if launch is not None:
        from tuner.cli._from import launch_summary

        d["launch"] = launch_summary(launch)
    if plot is not None:
        from tuner.plots import plot_breakdown

        try:
            plot_breakdown(plot, e,
                           title=f"{lay.label}, {lay.recompute_label}, {lay.dispatcher.value}, mbs "
                           f"{lay.micro_batch_size} ({m.name}, {c.label})")
        except OSError as ex:
            raise TunerError(f"--plot {str(plot)!r}: cannot write it ({ex.strerror or ex})") from None
        err.print(f"wrote {plot}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    _print_estimate(e, d, lay, m, c, w, stack, launch, found, memory_headroom, (lo, hi, mlo, mhi))

@app.command()
@layout_options
@run_options
def check(layout: LayoutFlags, run: RunChoice, model: C.ModelOpt = None, gpus: C.GpusOpt = None,
          layers: C.LayersOpt = None, gpus_per_node: C.PerNodeOpt = None, seq_len: C.SeqOpt = 8192,
          global_batch: C.GbsOpt = 128, precision: C.PrecOpt = "bf16", network: C.NetworkOpt = None,
          megatron_core: C.MegatronCoreOpt = None) -> None:
    """Is a layout valid under Megatron's rules? Lists every rule it breaks (exit 2 if any).

    With --pipeline-layout the string is checked with Megatron's layout grammar and rules, and the
    split (VPP, layers on the first and last rank) is taken from it instead of --vpp/--first/--last.
    """
    from search_spaces.rules import POLICY_RULES, RuleEnv, check_layout, layout_warnings

    notes: list[str] = []
    m, c, w = _inputs(model, gpus, gpus_per_node, None, None, seq_len, global_batch, precision, layers, network, None,
                      run.workload_kw())
    opts = run.resolve(precision, megatron_core).options
    lay = layout.to_layout(c.num_gpus)
    string_broken: list[tuple[str, str]] = []
    skip_split = False
    if layout.pipeline_layout is not None:
        try:
            lay, skip_split, note = apply_layout_string(lay, m, layout.pipeline_layout, vpp_given=layout.vpp_given,
                                                        split_given=layout.split_given)
            if note:
                notes.append(note)
        except InfeasibleLayout as ex:
            string_broken.append((ex.rule_id, ex.reason))
            skip_split = True
    broken = string_broken + [(r, why) for r,
                              why in check_layout(lay, m, w, RuleEnv.of(c, opts))
                              if not (skip_split and r.startswith("pipeline_split"))]
    notes += [f"warning: {x}" for x in layout_warnings(lay, m, opts)]
    policy = [(r, why) for r, why in broken if r in POLICY_RULES]
    broken = [(r, why) for r, why in broken if r not in POLICY_RULES]
    if broken:
        out.print(f"[red]invalid[/]: {lay.label} breaks {len(broken)} rule(s):")
        for rid, reason in broken:
            hint = split_hint(m, lay) if rid == "pipeline_split" and layout.pipeline_layout is None else ""
            say(f"{reason}{hint}", label=f"[{rid}]", markup=False)
    else:
        from tuner.report import pipeline_layout_of

        out.print(f"[green]valid[/]: {lay.label} ({escape(m.name)}, {c.num_gpus} GPUs, seq {w.seq_length}, gbs "
                  f"{w.global_batch_size})")
        pls = layout.pipeline_layout or pipeline_layout_of(lay, m)
        if pls:
            out.print(f"  --pipeline-model-parallel-layout '{pls}'", markup=False)
    for rid, reason in policy:
        say(f"(the tuner's own convention; Megatron accepts it): {reason}", label=f"note [{rid}]", markup=False)
    if broken:
        raise typer.Exit(code=2)
    for note in notes:
        say(note, label="note:", markup=False)


def _print_estimate(e: Any, d: dict[str, Any], lay: Any, m: Any, c: Any, w: Any, stack: Any, launch: Any,
                    found: list[Any], memory_headroom: float | None, bounds: tuple[float, float, float, float]) -> None:
    """Print ``tune estimate``'s text: the estimate ``e`` (``d``, its JSON form) of layout ``lay``; ``bounds`` the 90%
    intervals of throughput (tokens/s/GPU) and peak memory (bytes)."""
    lo, hi, mlo, mhi = bounds
    say(f"[bold]{lay.label}[/] ({escape(m.name)} on {c.label}, seq {w.seq_length:,}, gbs {w.global_batch_size}) - "
        "[bold]predicted[/] by the analytical model", indent=0, hang=4)
    say(f"recompute {lay.recompute_label}, offload {lay.offload_label}, {lay.dispatcher.value} dispatcher, "
        f"micro-batch {lay.micro_batch_size}", hang=2)
    say(stack.line + (f"; task {w.task}" + (f", LoRA rank {w.lora_rank} on {','.join(w.lora_target_modules)}"
                                             if w.task == "lora" else "") if w.task != "pretrain" else ""),
        hang=2, markup=False)
    if launch is not None:
        from tuner.cli._from import arguments_read

        say(f"your launch ({launch.launch.path.name}): {arguments_read(launch.launch, verbose=False, hint='--json')}",
            hang=2, markup=False)
        for n in launch.launch.model_notes:
            say(n, label="note:", markup=False)
    if d["pipeline_model_parallel_layout"]:
        out.print(f"  --pipeline-model-parallel-layout '{d['pipeline_model_parallel_layout']}'")
    out.print(f"  tokens/s/GPU {e.tokens_per_s_per_gpu:,.1f} (90%: {lo:,.0f}-{hi:,.0f}); step {e.step_time_s:.2f} s")
    flops = "4N" if w.task == "lora" else "6N"
    out.print(f"  MFU {e.mfu:.1%} ({flops}); model TFLOP/s/GPU {e.model_tflops_per_gpu:.0f}; "
              f"${e.usd_per_million_tokens:.2f} per 1M tokens")
    fit = {"fits": "fits", "does not fit": "[red]does NOT fit[/]", "may not fit": "[yellow]may not fit[/]"}[d["fit"]]
    if memory_headroom is not None:
        fit += f" with {memory_headroom:.0%} headroom"
    out.print(f"  peak {e.peak_gib:.1f} GiB (90%: {mlo / GIB:.1f}-{mhi / GIB:.1f}) of {e.hbm_bytes / GIB:.1f} GiB: "
              f"{fit}")
    host = "fits" if e.host_fits else "[red]does NOT fit[/]"
    say(f"predicted host memory {e.host_bytes_per_node / GIB:,.1f} GiB per node of "
        f"{c.host_memory_bytes_per_node / GIB:,.0f} GiB ({host})", hang=2)
    say(f"network {escape(c.network_label)}; megatron-core {stack.options.megatron_core} rules", hang=2)
    for wline in d["warnings"]:
        say(escape(wline), label="[yellow]warning:[/]")
    for g in found:
        say(escape(g.line), label="note:")
    # memory and step time side by side, by part (both predicted)
    mem = [(k, f"{v / GIB:.2f}") for k, v in e.memory.items()]
    tim = [(k, f"{v:.3f}") for k, v in e.time.items()]
    rows = [[*(mem[i] if i < len(mem) else ("", "")),
             *(tim[i] if i < len(tim) else ("", ""))] for i in range(max(len(mem), len(tim)))]
    out.print("Predicted by part: memory per GPU (worst pipeline rank) and step time")
    out.print(fitted_table([Col("memory"), Col("GiB", "right"), Col("step time"), Col("s", "right")], rows))
