"""``tune validate`` and ``tune calibrate``: the cost model against measured runs."""

from __future__ import annotations

import datetime
import math
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from specs import parse_gpus
from specs.errors import TunerError
from tuner.cli._common import (
    CliState,
    Col,
    ForceOpt,
    ResultsOpt,
    err,
    fitted_table,
    load_study,
    out,
    say,
    shell_command,
    study_context,
)

if TYPE_CHECKING:
    from cost_model.run_table import RowProblem
    from tuner.study.records import TrialRow

__all__ = ["app", "validate", "calibrate"]

app = typer.Typer()

DataOpt = Annotated[list[Path] | None, typer.Option("--data", help=(
    "Run table CSV with the columns of benchmarks/data/published_runs.csv (repeatable)."))]
CalOpt = Annotated[Path | None, typer.Option("--calibration", help=(
    "Calibration YAML overriding the shipped constants."))]


def _bad_rows(problems: Sequence[RowProblem]) -> int:
    """Rows with at least one unreadable cell (``problems`` has one entry per cell)."""
    return len({(p.row, p.run_id) for p in problems})


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def _read(data: list[Path]) -> tuple[list[Any], list[Any]]:
    from cost_model.validate import read_runs

    return read_runs([str(p) for p in data])


def _published_json(preds: list[Any], runs: list[Any], problems: list[Any], calibration: Path | None) -> dict[str, Any]:
    """Every row, the rows not represented, the unreadable cells and the summary, as plain JSON values."""
    from cost_model.uncertainty import error_bars
    from cost_model.validate import release_factor, summarize

    def num(x: float) -> float | None:
        return float(x) if x is not None and math.isfinite(x) else None

    def bands(p: Any) -> dict[str, Any]:
        b = error_bars(p.run.model, p.run.cluster.gpu, p.run.precision)
        return {"predicted_low": num(p.predicted * b.throughput.low),
                "predicted_high": num(p.predicted * b.throughput.high), "peak_gib_low": num(p.peak_gib * b.memory.low),
                "peak_gib_high": num(p.peak_gib * b.memory.high), "error_bars": b.family}

    rows = [{
        "id": p.run.run_id, "row": p.run.row, "model": p.run.model.name, "gpu": p.run.gpu_type,
        "num_gpus": p.run.num_gpus,
        "precision": p.run.precision, "layout": p.run.layout.label, "dispatcher": p.run.layout.dispatcher.value,
        "metric": "tokens_per_s_per_gpu" if p.run.metric == "tokens" else "model_tflops_per_gpu",
        "published": num(p.published), "predicted": num(p.predicted), "error": num(p.error), "fits": bool(p.fits),
        "peak_gib": num(p.peak_gib), "release_factor": release_factor(p.run.framework_version), **bands(p),
    } for p in preds]
    groups = [{**g, "group": list(g["group"])} for g in summarize(preds)]
    allp = summarize(preds, key=lambda p: ("all", "all"))[0]
    return {
        "calibration": str(calibration) if calibration else "shipped (cost_model/data/calibration.yaml)", "rows": rows,
        "not_representable": [{"id": r.run_id, "row": r.row, "model": r.model_name,
                               "reason": r.unrepresentable} for r in runs if r.unrepresentable],
        "unreadable": [{"row": pr.row, "id": pr.run_id, "column": pr.column, "message": pr.message} for pr in problems],
        "summary": {"groups": groups, "all": {**allp, "group": ["all", "all"]},
                    "predicted_not_to_fit": sum(1 for p in preds if not p.fits)},
    }


def _trial_bands(p: Any) -> dict[str, Any]:
    """A trial row's 90% intervals: tokens/s/GPU (the inverse of the predicted step) and peak GiB."""
    from cost_model.uncertainty import error_bars

    b = error_bars(p.row.model, parse_gpus(p.row.gpus).gpu, p.row.workload.precision)
    tps = p.row.workload.seq_length * p.row.workload.global_batch_size / p.step_time_s / parse_gpus(p.row.gpus).num_gpus
    return {"predicted": tps, "predicted_low": tps * b.throughput.low, "predicted_high": tps * b.throughput.high,
            "peak_gib_low": p.peak_gib * b.memory.low, "peak_gib_high": p.peak_gib * b.memory.high,
            "error_bars": b.family}


def _trials(trials: list[Path], calibration: Path | None, as_json: bool, rows: bool) -> dict[str, Any]:
    """``--trials``: predict each sweep row with its stack's calibration; print (or return) them."""
    from tuner.validate_trials import predict_trials, read_trials, summarize_trials

    trows, skipped = read_trials([str(t) for t in trials])
    if not trows:
        why = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        raise TunerError(f"--trials {', '.join(map(str, trials))}: no finished row (status ok with a step time and a "
                         f"reserved peak); {len(skipped)} rows left out" + (f": {why}" if why else ""))
    preds = predict_trials(trows, calibration)
    summ = summarize_trials(preds)
    data = {
        "rows": [{"source": p.row.source, "label": p.row.label, "model": p.row.model.name, "gpus": p.row.gpus,
                  "precision": str(p.row.workload.precision), "layout": p.row.layout.label,
                  "transformer_engine": p.row.transformer_engine, "calibration": p.calibration,
                  "step_time_s": {"measured": p.row.step_time_s, "predicted": p.step_time_s, "error": p.step_error},
                  "peak_gib": {"measured_reserved": p.row.peak_reserved_gib,
                               "measured_allocated": p.row.peak_allocated_gib,
                               "predicted": p.peak_gib, "error": p.memory_error}, **_trial_bands(p)} for p in preds],
        "skipped": skipped, "summary": summ,
    }
    if as_json:
        return data
    if rows:
        say("Real trials, measured and predicted: step time (s) and peak memory (GiB; measured: the reserved peak)",
            indent=0, hang=2)
        cols = [Col("row", "left", 6), Col("label"), Col("model", "left", 5), Col("GPUs", "left", 4),
                Col("prec.", "left", 3), Col("TE", "left", 2), Col("step s", "right"), Col("pred.", "right"),
                Col("error", "right"), Col("peak GiB", "right"), Col("pred.", "right"), Col("error", "right", 1)]
        out.print(fitted_table(cols, [[p.row.source, p.row.label, p.row.model.name, p.row.gpus,
                                       str(p.row.workload.precision), "yes" if p.row.transformer_engine else "no",
                                       f"{p.row.step_time_s:.3f}", f"{p.step_time_s:.3f}", _pct(p.step_error),
                                       f"{p.row.peak_reserved_gib:.2f}", f"{p.peak_gib:.2f}", _pct(p.memory_error)]
                                      for p in preds]))
    for line in skipped:
        say(escape(line), label="[yellow]left out:[/]", indent=0, console=err)
    say("Summary: |error| of step time and peak memory, median and max; Spearman of step time over the rows",
        indent=0, hang=2)
    srows = []
    for k in ("all", "te", "no_te"):
        v = summ[k]
        if not v["rows"]:
            continue
        srows.append([k.replace("_", "-"), str(v["rows"]), f"{v['step_median_abs_error'] * 100:.1f}%",
                      f"{v['step_max_abs_error'] * 100:.1f}%",
                      "-" if not math.isfinite(v["step_spearman"]) else f"{v['step_spearman']:+.2f}",
                      f"{v['memory_median_abs_error'] * 100:.1f}%", f"{v['memory_max_abs_error'] * 100:.1f}%"])
    out.print(fitted_table([Col("stack"), Col("rows", "right"), Col("step median", "right"), Col("step max", "right"),
                            Col("Spearman", "right"), Col("memory median", "right"), Col("memory max", "right")],
                           srows))
    sp = summ["run_spread"]

    def n(k: int, what: str) -> str:
        return f"{k} {what}{'' if k == 1 else 's'}"

    copies = (f"; {n(sp['identical_rows'], 'row')} repeating another's measurement to the last digit counted once"
              if sp["identical_rows"] else "")
    if sp["spread"] is not None:
        say(f"run-to-run spread: {n(sp['repeated'], 'configuration')} ran more than once ({sp['repeat_runs']} runs): "
            f"their step times spread {sp['spread'] * 100:.1f}% (pooled standard deviation / mean, "
            f"{n(sp['dof'], 'degree')} of freedom), so a model exact on each configuration's mean would show a step "
            f"median |error| of about {sp['noise_floor'] * 100:.1f}% on single runs; against each configuration's mean "
            f"({n(sp['configurations'], 'configuration')}) the model's is "
            f"{sp['step_median_abs_error_of_means'] * 100:.1f}%{copies}", indent=0, hang=2, markup=False)
    else:
        say("run-to-run spread: no configuration ran twice in these files "
            f"({n(sp['configurations'], 'configuration')}): the step errors above include the machine's run-to-run "
            f"spread, which these rows cannot measure{copies}", indent=0, hang=2, markup=False)
    return data


@app.command()
def validate(
    data: DataOpt = None,
    trials: Annotated[list[Path] | None, typer.Option("--trials", help=(
        "JSON lines of real trials written by launch.harness.sweep (repeatable): each finished row predicted with the "
        "calibration of the stack it ran on (TE or not)."))] = None,
    calibration: CalOpt = None,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="Print the table of every run (default on).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help=(
        "Print every row, the rows left out and the summary as one JSON object."))] = False,
) -> None:
    """Predict every run of a CSV of measured runs and compare with the published numbers.

    Prints one row per run (predicted and published tokens/s/GPU, or model TFLOP/s/GPU where
    tokens/s is not published, and the error), the runs the model cannot represent with the
    reason, cells that could not be read (row and column), and a summary per GPU type and
    precision: median absolute error, MAPE and Spearman within each model's rows that differ
    in layout. With --trials, the same for real trials (step time and peak memory). Exit 2 only
    when no row is usable or an input is malformed."""
    import sys

    from cost_model.calibration import load_calibration
    from cost_model.validate import REFERENCE_RELEASE, RELEASE_GAIN_PER_MONTH, predict_runs, release_factor, summarize

    if not data and not trials:
        raise TunerError("--data or --trials is required, e.g. --data benchmarks/data/published_runs.csv")
    result: dict[str, Any] = {}
    if trials:
        result["trials"] = _trials(trials, calibration, as_json, rows)
    if not data:
        if as_json:
            sys.stdout.write(_strict_json(result) + "\n")
        return
    cal = load_calibration(calibration)
    runs, problems = _read(data)
    if not as_json:
        for p in problems:
            say(escape(str(p)), label="[yellow]skipped:[/]", indent=0, console=err)
    preds = predict_runs(runs, cal)
    if not preds:
        reasons = sorted({str(r.unrepresentable) for r in runs if r.unrepresentable})
        why = ("; reasons: " + "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else "")) if reasons else ""
        raise TunerError(f"no usable row in {', '.join(map(str, data))}: {_bad_rows(problems)} rows with unreadable "
                         f"cells, {sum(1 for r in runs if r.unrepresentable)} the model cannot represent{why}")
    if as_json:
        result["published"] = _published_json(preds, runs, problems, calibration)
        sys.stdout.write(_strict_json(result) + "\n")
        return
    if rows:
        out.print("Predicted (analytical model) vs published: tokens/s/GPU or TFLOP/s/GPU (unit)")
        cols = [Col("id", "left", 6), Col("model"), Col("GPUs", "right"), Col("prec.", "left", 3), Col("layout"),
                Col("unit", "left", 5), Col("published", "right"), Col("predicted", "right"), Col("error", "right"),
                Col("fits", "left", 2)]
        prows = []
        for p in preds:
            r, m = p.run, p.run.model
            assert m is not None, "predict_runs estimates only the runs it built a model for"
            prows.append([r.run_id, m.name, f"{r.num_gpus}x{r.gpu_type}", r.precision,
                          r.layout.label + (f" {r.layout.dispatcher.value}" if m.is_moe else ""),
                          "tok/s" if r.metric == "tokens" else "TFLOP/s", f"{p.published:,.1f}", f"{p.predicted:,.1f}",
                          _pct(p.error), "yes" if p.fits else "no"])
        out.print(fitted_table(cols, prows))
    unrep = [r for r in runs if r.unrepresentable]
    if unrep:
        out.print(f"Runs the model cannot represent ({len(unrep)}): listed, not estimated")
        out.print(fitted_table([Col("id", "left", 2), Col("model"), Col("GPUs", "left", 1), Col("reason")],
                               [[r.run_id, r.model_name, f"{r.num_gpus}x{r.gpu_type}", str(r.unrepresentable)]
                                for r in unrep]))
    out.print("Summary per GPU type and precision (Spearman: per model, over >= 3 layouts)")
    grows = []
    for s in summarize(preds):
        rho = ", ".join(f"{m} {v:+.2f}" for m, v in s["spearman"].items()) or "-"
        grows.append([s["group"][0], s["group"][1], str(s["rows"]), f"{s['median_abs_error'] * 100:.1f}%",
                      f"{s['mape'] * 100:.1f}%", rho])
    allp = summarize(preds, key=lambda p: ("all", "all"))[0]
    grows.append(["all", "all", str(allp["rows"]), f"{allp['median_abs_error'] * 100:.1f}%",
                  f"{allp['mape'] * 100:.1f}%", ""])
    out.print(fitted_table([Col("GPU"), Col("prec."), Col("runs", "right"), Col("median |error|", "right"),
                            Col("MAPE", "right"), Col("Spearman per model")], grows))
    say(f"{len(preds)} runs estimated, {len(unrep)} not representable (listed above), {_bad_rows(problems)} rows with "
        f"unreadable cells (on stderr); predicted not to fit at 0% headroom: {sum(1 for p in preds if not p.fits)}. "
        f"Calibration: {calibration or 'shipped (cost_model/data/calibration.yaml)'}", indent=0, hang=2, markup=False)
    older = sum(1 for p in preds if release_factor(p.run.framework_version) < 1.0)
    if older:
        say(f"{older} runs of NeMo container releases before {REFERENCE_RELEASE[0]}.{REFERENCE_RELEASE[1]:02d} are "
            f"predicted {RELEASE_GAIN_PER_MONTH * 100:.2f}% slower per month of releases (the gain the published "
            "repeats measure; cost_model.validate.release_factor)", indent=0, hang=2)


def _study_runs(study: str, storage: str | None, results_dir: Path) -> list[tuple[Any, TrialRow]]:
    """Measured trials of a study, each as a run (the study's model, cluster, workload) and its row."""
    from cost_model.validate import Run
    from tuner.study import trial_rows

    st = load_study(study, storage, results_dir)
    m, c, w, _ = study_context(st)
    runs = []
    for row in trial_rows(st):
        if row.source != "measured" or not row.tokens_per_s_per_gpu:
            continue
        runs.append((Run(row=row.trial, run_id=f"trial {row.trial}", model_name=m.name, gpu_type=c.gpu.name,
                         precision=w.precision.value, num_gpus=c.num_gpus, published_tokens=row.tokens_per_s_per_gpu,
                         published_tflops=None, implied_gflop_per_token=None, seq_length=w.seq_length,
                         framework_version=f"study {study} (measured trial)", model=m, cluster=c, workload=w,
                         layout=row.layout, is_moe=m.is_moe), row))
    if not runs:
        raise TunerError(f"study {study!r} has no finished trial measured on GPUs (result source 'measured'); run it "
                         "with a GPU backend first")
    return runs


def _study_observations(study: str, storage: str | None, results_dir: Path) -> tuple[list[Any], list[str]]:
    """Measured trials of a study as observations, and their notes on the stack they ran on."""
    from cost_model.calibrate import Observation

    obs, notes = [], []
    for r, row in _study_runs(study, storage, results_dir):
        peak = row.peak_gib
        obs.append(Observation(model=r.model, cluster=r.cluster, workload=r.workload, layout=r.layout,
                               step_time_s=r.workload.global_batch_size * r.workload.seq_length
                               / r.published_tokens / r.num_gpus,
                               peak_gib=peak if peak and math.isfinite(peak) else None, label=r.run_id))
        for n in row.notes:
            if n not in notes:
                notes.append(n)
    return obs, notes


def _check_writable(path: Path, force: bool) -> None:
    """Raise TunerError now (not after the fit) if ``--out`` cannot or must not be written."""
    import os

    from specs.files import refuse_another_kind
    from tuner.study.config import check_output_path

    check_output_path("--out", path, force=force)
    if not force:
        refuse_another_kind(path, "provenance:\n", label="--out")
    if not os.access(path.parent, os.W_OK):
        raise TunerError(f"--out {str(path)!r}: cannot write in {path.parent} (no permission)")


@app.command()
def calibrate(
    ctx: typer.Context, data: DataOpt = None,
    study: Annotated[str | None, typer.Option("--study", help=(
        "Fit to the measured trials of this study (made by `tune`)."))] = None,
    storage: Annotated[str | None, typer.Option("--storage", help="Optuna storage URL of --study.")] = None,
    results_dir: ResultsOpt = Path("results"),
    out_file: Annotated[Path | None, typer.Option("--out", help="Calibration YAML to write.")] = None,
    calibration: CalOpt = None,
    kfold: Annotated[bool, typer.Option("--kfold/--no-kfold", help=(
        "Also report k-fold error with folds by model (fit on the others, predict this one)."))] = False,
    max_nfev: Annotated[int, typer.Option("--max-nfev", min=5, max=10000, help=(
        "Most residual evaluations per fit."))] = 60,
    processes: Annotated[int, typer.Option("--processes", help="Processes for the k-fold fits.", min=1, max=256)] = 1,
    force: ForceOpt = False,
) -> None:
    """Fit the named efficiency constants to measured runs (least squares on log error) and write a calibration YAML.

    Starts from --calibration (default: the shipped one for --study, the unfitted class defaults
    for --data, so the fit does not depend on an earlier fit). With --kfold, also prints the
    error of each model's runs predicted by a fit on the other models' runs.
    """
    import numpy as np

    from cost_model.calibrate import fit_calibration, kfold_by_model
    from cost_model.calibration import BASE_CALIBRATION, DEFAULT_CALIBRATION, load_calibration
    from cost_model.validate import spearman
    from specs._data import dump_user_yaml
    from specs.files import write_output

    argv = ctx.obj.argv if isinstance(ctx.obj, CliState) else ()
    if not data and not study:
        raise TunerError("give --data CSV (measured runs) or --study NAME (a study with measured trials)")
    if out_file is None:
        raise TunerError("--out is required, e.g. --out calibration.yaml")
    _check_writable(out_file, force)  # before a fit that can take minutes
    problems: list[Any] = []
    runs: list[Any] = []
    if data:
        r, problems = _read(data)
        runs += r
        for p in problems:
            say(escape(str(p)), label="[yellow]skipped:[/]", indent=0, console=err)
    if study:
        runs += [r for r, _ in _study_runs(study, storage, results_dir)]
    start = load_calibration(calibration) if calibration else (DEFAULT_CALIBRATION if study and not data
                                                               else BASE_CALIBRATION)
    if study and not data:
        _calibrate_study(study, storage, results_dir, out_file, start, calibration, max_nfev, force)
        return
    usable = [r for r in runs if not r.unrepresentable and r.layout is not None]
    if len(usable) < 2:
        raise TunerError(f"no usable runs to fit: {len(usable)} representable, {_bad_rows(problems)} rows with "
                         "unreadable cells")
    fit = fit_calibration(runs, start=start, max_nfev=max_nfev, progress=lambda s: err.print(s))
    doc: dict[str, Any] = {
        "provenance": {
            "command": shell_command("tune", *argv) if argv else shell_command(
                "tune", "calibrate", *[w for d in (data or []) for w in ("--data", d)],
                *(["--study", study] if study else []), "--out", out_file),
            "data": [str(d) for d in (data or [])] + ([f"study {study}"] if study else []),
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, Python {platform.python_version()}", "runs_fitted": fit.rows,
            "runs_not_representable": sum(1 for r in runs if r.unrepresentable),
            "rows_with_unreadable_cells": _bad_rows(problems),
            "method": "scipy.optimize.least_squares (trf, soft_l1 loss, f_scale 0.25) on log(predicted / published); "
            "seed rows weight 3",
            "fitted": list(fit.fitted), "in_sample_median_abs_error": round(fit.median_abs_error, 4),
        },
        "constants": {k: float(v) for k, v in fit.calibration.to_dict().items() if k in fit.fitted},
    }
    out.print(f"fitted {len(fit.fitted)} constants to {fit.rows} runs: in-sample median |error| "
              f"{fit.median_abs_error * 100:.1f}% ({fit.nfev} evaluations)")
    if fit.rows <= len(fit.fitted):
        err.print(f"[yellow]warning:[/] {fit.rows} runs for {len(fit.fitted)} constants: the fit is underdetermined, "
                  "so its in-sample error says nothing about other layouts; add runs (e.g. --data "
                  "benchmarks/data/published_runs.csv) before using it")
    for k in fit.fitted:
        out.print(f"  {k}: {getattr(start, k):.4g} -> {getattr(fit.calibration, k):.4g}")
    if kfold:
        folds = kfold_by_model(runs, start=start, max_nfev=max_nfev, processes=processes,
                               progress=lambda s: err.print(s))
        t = Table(title="k-fold by model (each model predicted by a fit on the other models)", title_justify="left")
        for c in ("model", "runs", "median |error|", "MAPE", "Spearman (layouts)"):
            t.add_column(c)
        kf: dict[str, Any] = {}
        for m, f in folds.items():
            e = np.abs(f["predicted"] / f["published"] - 1)
            rho = spearman(list(f["predicted"]), list(f["published"]))
            kf[m] = {"runs": len(e), "median_abs_error": round(float(np.median(e)), 4),
                     "mape": round(float(np.mean(e)), 4)}
            t.add_row(m, str(len(e)), f"{np.median(e) * 100:.1f}%", f"{np.mean(e) * 100:.1f}%",
                      "-" if math.isnan(rho) else f"{rho:+.2f}")
        out.print(t)
        doc["provenance"]["kfold_by_model"] = kf
    write_output(out_file, dump_user_yaml(doc), label="--out", force=force)
    out.print(f"wrote {out_file} (use it with {shell_command('--calibration', out_file)})", markup=False)


def _calibrate_study(study: str, storage: str | None, results_dir: Path, out_file: Path, start: Any,
                     calibration: Path | None, max_nfev: int, force: bool) -> None:
    """``tune calibrate --study NAME`` alone: fit to the study's measured step times and peaks."""
    import numpy as np

    from cost_model.calibrate import TRIAL_STEP_NAMES, fit_observations, predict_observations
    from specs._data import dump_user_yaml
    from specs.files import write_output

    obs, notes = _study_observations(study, storage, results_dir)
    if len(obs) < 2:
        raise TunerError(f"study {study!r} has {len(obs)} measured trial(s); a fit needs at least 2")
    with_peak = [o for o in obs if o.peak_gib]
    fit = fit_observations(obs, start=start, step_names=TRIAL_STEP_NAMES,
                           memory_names=None if len(with_peak) < 2 else ("allocator_overhead_fraction",
                                                                         "cuda_context_bytes",
                                                                         "nccl_bytes_per_communicator"),
                           max_nfev=max(max_nfev, 5), progress=lambda s: err.print(s))
    step0, _ = predict_observations(obs, start)
    step1, _ = predict_observations(obs, fit.calibration)
    meas = np.array([o.step_time_s for o in obs])
    e0, e1 = np.median(np.abs(step0 / meas - 1)), np.median(np.abs(step1 / meas - 1))
    stack = "; ".join(notes) if notes else "not recorded in the trials"
    doc: dict[str, Any] = {
        "provenance": {
            "command": shell_command("tune", "calibrate", "--study", study,
                                     *(["--calibration", calibration] if calibration else []), "--out", out_file),
            "data": [f"study {study}"], "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, Python {platform.python_version()}",
            "stack": f"measured trials; trial notes: {stack}",
            "caution": "these constants describe the software stack and machine the trials ran on (see stack); "
                       "they are not the shipped calibration (cost_model/data/calibration.yaml), which this does not "
                       "change",
            "runs_fitted": len(obs),
            "method": "scipy.optimize.least_squares (trf, soft_l1 loss, f_scale 0.25) on log(predicted / measured) "
                      "step time, then on log(predicted / measured) peak reserved memory",
            "memory_target": "peak reserved memory per GPU (the trials' peak_gib: torch.cuda.max_memory_reserved, max "
            "over ranks)",
            "fitted": list(fit.fitted),
            "in_sample_step_median_abs_error": {"before": round(float(e0), 4), "after": round(float(e1), 4)},
            "in_sample_peak_median_abs_error": None if not fit.memory_fitted else round(fit.memory_median_abs_error, 4),
        },
        "constants": {k: float(getattr(fit.calibration, k)) for k in fit.fitted},
    }
    out.print(f"fitted {len(fit.fitted)} constants to {len(obs)} measured trials of study {study}: step time median "
              f"|error| {e0 * 100:.1f}% -> {e1 * 100:.1f}%"
              + (f"; peak memory median |error| {fit.memory_median_abs_error * 100:.1f}% ({fit.memory_rows} trials)"
                 if fit.memory_fitted else ""))
    n_step = len(fit.step.fitted) if fit.step else 0
    if len(obs) <= n_step:
        err.print(f"[yellow]warning:[/] {len(obs)} measured trials for {n_step} step-time constants: the fit is "
                  "underdetermined, so its in-sample error says nothing about other layouts; measure more layouts "
                  "before using it")
    for k in fit.fitted:
        out.print(f"  {k}: {getattr(start, k):.4g} -> {getattr(fit.calibration, k):.4g}")
    out.print(f"stack of these trials: {escape(stack)} (the constants describe that stack; the shipped calibration is "
              "unchanged)")
    write_output(out_file, dump_user_yaml(doc), label="--out", force=force)
    out.print(f"wrote {out_file} (use it with {shell_command('--calibration', out_file)})", markup=False)


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (JSON has no NaN: a strict parser refuses it)."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _strict_json(obj: Any) -> str:
    """Standard JSON (``allow_nan=False``): an undefined figure, such as a Spearman of one row, is null."""
    import json

    return json.dumps(_finite(obj), indent=2, allow_nan=False)
