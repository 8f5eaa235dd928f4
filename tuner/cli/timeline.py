"""Seeing where a step goes: ``tune timeline`` (one predicted step as a Chrome trace, for a layout given by its flags or
a study's trial) and ``tune report`` (a study's ``report.html``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from cost_model.uncertainty import memory_headroom as headroom_for
from specs.errors import InfeasibleLayout, TunerError
from tuner.cli._common import (
    CalOpt,
    ForceOpt,
    GbsOpt,
    GpusOpt,
    HeadroomOpt,
    LayersOpt,
    MegatronCoreOpt,
    ModelOpt,
    NetOpt,
    NetworkOpt,
    PerNodeOpt,
    PrecOpt,
    PriceOpt,
    ResultsOpt,
    RunChoice,
    SeqOpt,
    StorageOpt,
    err,
    load_study,
    run_options,
    say,
    study_context,
)
from tuner.cli._from import FromOpt
from tuner.cli._layout import LayoutFlags, layout_options

__all__ = ["MEASURED_TRACE_GLOB", "app", "measured_traces", "report", "timeline"]

app = typer.Typer()

#: The torch.profiler traces the trial harness writes into a trial's folder (``HarnessSpec.profile_step``).
MEASURED_TRACE_GLOB = "profile_step*_pp*.json"


def measured_traces(trial_dir: str | Path | None) -> list[Path]:
    """The trial harness's torch.profiler traces of one step in ``trial_dir`` (one per pipeline rank), sorted."""
    if not trial_dir:
        return []
    d = Path(trial_dir)
    return sorted(d.glob(MEASURED_TRACE_GLOB)) if d.is_dir() else []


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")


def _write_json(path: Path, obj: Any, what: str, force: bool = False) -> None:
    from specs.files import write_output
    from tuner.study.config import check_output_path

    check_output_path(what, path, force=force)
    write_output(path, json.dumps(obj, separators=(",", ":")), label=what, force=force)


StudyOpt = Annotated[str | None, typer.Option("--study", rich_help_panel="Study", help=(
    "A study made by `tune`: its trial (--trial) is drawn with the study's inputs."))]
TrialOpt = Annotated[int | None, typer.Option("--trial", rich_help_panel="Study", help=(
    "Trial number of --study (default: the study's best, the layout tune recommended: of those that ran or are "
    "predicted to fit, the least memory within 1% of the fastest)."))]
OutOpt = Annotated[Path | None, typer.Option("--out", help=(
    "Trace file to write (default: results/<study>/timeline_trial<N>.json, beside a measured trial's own trace when it "
    "has one; without --study timeline_<layout>.json here)."))]
PngOpt = Annotated[Path | None, typer.Option("--png", help="Also draw the trace as a Gantt chart (PNG).")]
CompareOpt = Annotated[list[Path] | None, typer.Option("--compare", help=(
    "With --png: draw these traces (written by tune timeline) under this one, on the same time axis (repeatable)."))]


@app.command()
@layout_options
@run_options
def timeline(
    ctx: typer.Context, layout: LayoutFlags, run: RunChoice, from_file: FromOpt = None,
    study: StudyOpt = None, trial: TrialOpt = None, storage: StorageOpt = None,
    results_dir: ResultsOpt = Path("results"),
    model: ModelOpt = None, gpus: GpusOpt = None, layers: LayersOpt = None, gpus_per_node: PerNodeOpt = None,
    network_gbps: NetOpt = None,
    usd_per_gpu_hour: PriceOpt = None, seq_len: SeqOpt = 8192, global_batch: GbsOpt = 128, precision: PrecOpt = "bf16",
    calibration: CalOpt = None, memory_headroom: HeadroomOpt = None,
    out_file: OutOpt = None, png: PngOpt = None, compare: CompareOpt = None,
    network: NetworkOpt = None, megatron_core: MegatronCoreOpt = None, force: ForceOpt = False,
) -> None:
    """Write one predicted step as a Chrome trace (open it in Perfetto or chrome://tracing): a lane per pipeline rank
    and virtual stage with each micro-batch's forward and backward in Megatron's order, the step by part (compute,
    recompute, exposed TP / CP / EP communication, the DP / optimizer / offload tail), what the overlaps hide; the
    bubble is the idle time."""
    from cost_model.timeline import check_trace, step_trace, trace_bubble_fraction, trace_step_seconds
    from tuner.plots import check_image_path

    if compare and png is None:
        raise TunerError("--compare draws into the --png chart: give --png FILE")
    if png is not None:
        check_image_path("--png", png, force=force)
    if out_file is not None:  # before the study is opened
        from tuner.study.config import check_output_path

        check_output_path("--out", out_file, force=force)
    others = [_read_trace(p) for p in compare or ()]  # read before anything is written: a bad --compare leaves no file
    if study is not None:
        if (layout != LayoutFlags() or from_file is not None or model is not None or gpus is not None
            or layers is not None or network is not None or megatron_core is not None
                or run.stack is not None or run.flags.given() or run.task is not None):
            raise TunerError("--study draws its trial's layout with the study's model, GPUs, network and run options: "
                             "leave out the layout flags, --from, --model, --gpus, --layers, --network, "
                             "--megatron-core, --stack and the run flags")
        det, title, extra, default, measured = _study_trial(study, trial, storage, results_dir)
        stack_line = ""
    else:
        if trial is not None:
            raise TunerError("--trial needs --study (a trial of which study?)")
        from tuner.cli._from import command_inputs

        _, model, gpus, seq_len, global_batch, precision, layers, run, layout = command_inputs(
            from_file, ctx, model=model, gpus=gpus, seq_len=seq_len, global_batch=global_batch, precision=precision,
            layers=layers, run=run, layout=layout)
        det, title, stack_line = _flags_layout(layout, model, gpus, layers, gpus_per_node, network_gbps,
                                               usd_per_gpu_hour, seq_len, global_batch, precision,
                                   calibration, memory_headroom, network, megatron_core, run)
        extra, default, measured = {}, Path(f"timeline_{_slug(det.estimate.layout.label)}.json"), []
    trace = step_trace(det, title=title, extra=extra)
    problems = check_trace(trace)
    # an internal invariant (tests/cost_model_tests/test_timeline.py)
    assert not problems, f"the trace is malformed: {problems[:3]}"
    path = out_file or default
    _write_json(path, trace, "--out", force)
    e = det.estimate
    say(f"[bold]{e.layout.label}[/] ({title}) - [bold]predicted[/] by the analytical model", indent=0, hang=4)
    say(f"step {trace_step_seconds(trace):.3f} s (the estimate's {e.step_time_s:.3f} s), "
        f"pipeline bubble {max(0.0, trace_bubble_fraction(trace)):.1%} of the step, "
        f"{e.tokens_per_s_per_gpu:,.1f} tokens/s/GPU; {det.pp} pipeline ranks x {det.vpp} virtual stages, "
        f"{det.num_microbatches} micro-batches")
    if stack_line:
        say(stack_line, markup=False)
    say(f"predicted trace: {path}", markup=False)
    for p in measured:
        say(f"measured trace (torch.profiler, one step of the trial): {p}", markup=False)
    if png is not None:
        from tuner.plots import plot_timelines

        plot_timelines(png, [trace, *others], force=force)
        say(f"Gantt chart: {png}", markup=False)
    say("open a trace in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)", markup=False)


def _read_trace(path: Path) -> dict[str, Any]:
    """A trace ``tune timeline`` wrote (for ``--compare``); TunerError for any other file."""
    from cost_model.timeline import check_trace

    try:
        trace = json.loads(path.read_text())
    except OSError as e:
        raise TunerError(f"--compare {str(path)!r}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError:
        raise TunerError(f"--compare {str(path)!r}: not JSON; give a trace written by tune timeline") from None
    if not isinstance(trace, dict) or check_trace(trace) or trace.get("otherData", {}).get("source") != "predicted":
        raise TunerError(f"--compare {str(path)!r}: not a trace written by tune timeline (Chrome trace JSON with "
                         "otherData.source 'predicted')")
    return trace


def _flags_layout(layout: LayoutFlags, model: str | None, gpus: str | None, layers: int | None,
                  gpus_per_node: int | None, network_gbps: float | None,
                  usd: float | None, seq_len: int, global_batch: int, precision: str, calibration: Path | None,
                  memory_headroom: float | None, network: str | None = None, megatron_core: str | None = None,
                  run: RunChoice | None = None) -> tuple[Any, str, str]:
    """(estimate details, title, the stack's line) of the layout the flags give, with the run options of ``run``;
    refused as ``tune estimate`` refuses it."""
    from cost_model.calibration import load_calibration
    from cost_model.estimate import estimate_details
    from specs.stacks import RunFlags
    from tuner.cli.estimate import _inputs, estimable_layout, rule_error

    run = run or RunChoice(stack=None, flags=RunFlags())
    m, c, w = _inputs(model, gpus, gpus_per_node, network_gbps, usd, seq_len, global_batch, precision, layers, network,
                      None, run.workload_kw())
    stack = run.resolve(precision, megatron_core)
    opts = stack.options
    lay = estimable_layout(layout, m, w, c, opts)
    try:
        det = estimate_details(m, c, w, lay, calibration=load_calibration(calibration),
                               memory_headroom=headroom_for(m, c.gpu, w.precision, memory_headroom), options=opts)
    except InfeasibleLayout as ex:
        raise rule_error(ex, m, lay) from None
    return det, f"{m.name} on {c.label}, seq {w.seq_length:,}, gbs {w.global_batch_size}", stack.line


def _study_trial(study: str, trial: int | None, storage: str | None, results_dir: Path) -> tuple[Any, str,
                                                                                                 dict[str, Any], Path,
                                                                                                 list[Path]]:
    """(estimate details, title, otherData extras, default output path, measured traces) of a study's trial."""
    from cost_model.calibration import Calibration
    from cost_model.estimate import estimate_details
    from tuner.cli._common import stored_run
    from tuner.report import pick_trial_row
    from tuner.study import run_options_for_backend, trial_rows

    st = load_study(study, storage, results_dir)
    m, c, w, cfg = study_context(st)
    row = pick_trial_row(st.study_name, trial_rows(st), m, trial, "draw", best=st.user_attrs.get("best_trial"))
    cal = Calibration(**st.user_attrs["calibration"]) if "calibration" in st.user_attrs else Calibration()
    backend = str(cfg.get("backend", "model"))
    opts = stored_run(st)[0] or run_options_for_backend(backend)
    try:
        det = estimate_details(m, c, w, row.layout, calibration=cal,
                               memory_headroom=headroom_for(m, c.gpu, w.precision, cfg.get("memory_headroom")),
                               options=opts)
    except InfeasibleLayout as ex:
        raise TunerError(f"trial {row.trial} of {st.study_name!r}: the estimate refuses its layout (rule "
                         f"{ex.rule_id}: {ex.reason})") from None
    measured = measured_traces(row.log_path) if row.source == "measured" else []
    extra: dict[str, Any] = {"study": st.study_name, "trial": row.trial, "trial_source": row.source}
    if row.source == "measured":
        extra.update(measured_step_time_s=row.step_time_s, measured_tokens_per_s_per_gpu=row.tokens_per_s_per_gpu,
                     measured_traces=[str(p) for p in measured])
    name = f"timeline_trial{row.trial}.json"
    default = measured[0].parent / name if measured else results_dir / st.study_name / name
    title = (f"{m.name} on {c.label}, seq {w.seq_length:,}, gbs {w.global_batch_size}; study {st.study_name}, "
             f"trial {row.trial}")
    return det, title, extra, default, measured


@app.command()
def report(
    study: Annotated[str | None, typer.Option("--study", rich_help_panel="Study", help=(
        "A study made by `tune`."))] = None,
    storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    out_file: Annotated[Path | None, typer.Option("--out", help=(
        "Page to write (default: results/<study>/report.html)."))] = None,
    force: ForceOpt = False,
) -> None:
    """Write a study's report.html (the main job writes it too): the Pareto front with hover details and filters, the
    layouts near the fastest with the most headroom, each front layout's memory and time by part, the measured ties, the
    study's files."""
    from cost_model.calibration import Calibration
    from tuner.cli.studies import study_front
    from tuner.report_html import study_report

    st, m, c, w, cfg, rows, front = study_front(study, storage, results_dir, ("--out", out_file, "report.html"),
                                                force=force)
    folder = results_dir / st.study_name
    path = out_file or folder / "report.html"
    known = ("pareto.csv", "pareto.png", "recipe.yaml", "run_slime.sh", "megatron_args.sh", "config.yaml")
    files = {p.name: p for p in [*(folder / n for n in known),
                                 *sorted(folder.glob("timeline_trial*.json"))] if p.is_file()}
    cal = Calibration(**st.user_attrs["calibration"]) if "calibration" in st.user_attrs else Calibration()
    study_report(path, study=st.study_name, model=m, cluster=c, workload=w, rows=rows, front=front,
                 backend=str(cfg.get("backend", "model")),
                 calibration=cal, memory_headroom=headroom_for(m, c.gpu, w.precision, cfg.get("memory_headroom")),
                 files=files, force=force)
    err.print(f"wrote {path}", markup=False)
