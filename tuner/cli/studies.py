"""Looking into a study made by ``tune``: ``tune pareto`` (its front) and ``tune export`` (a trial in any registered
format)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from cost_model.uncertainty import memory_headroom as headroom_for
from specs.errors import TunerError
from tuner.cli._common import (
    Col,
    ForceOpt,
    ResultsOpt,
    StorageOpt,
    StudyNameOpt,
    err,
    fitted_table,
    load_study,
    out,
    say,
    shell_command,
    study_context,
    study_flags,
)
from tuner.cli._front import print_front, print_ties

if TYPE_CHECKING:
    from tuner.study.records import TrialRow

__all__ = ["app", "pareto", "export_cmd", "study_export_context"]

app = typer.Typer()


def study_export_context(st: Any, m: Any, c: Any, w: Any, cfg: dict[str, Any], lay: Any, row: TrialRow | None,
                         rows: list[TrialRow], correctness: Any = None) -> Any:
    """The :class:`launch.exporters.ExportContext` of ``lay`` in study ``st`` and trial ``row``."""
    from cost_model.calibration import Calibration
    from tuner.cli._common import stored_run
    from tuner.report import export_context, runs_note, ties_note

    cal = Calibration(**st.user_attrs["calibration"]) if "calibration" in st.user_attrs else Calibration()
    notes = runs_note(row) + ties_note(rows, row.trial) if row is not None else []
    return export_context(m, c, w, lay, study=st.study_name, calibration=cal,
                          memory_headroom=headroom_for(m, c.gpu, w.precision, cfg.get("memory_headroom")),
                          measurement=row.measurement() if row is not None else None,
                          correctness=correctness, notes=notes,
                          megatron_core=(st.user_attrs.get("resolved") or {}).get("megatron_core"),
                          bridge_yaml=str(cfg.get("bridge_yaml") or ""),
                          **dict(zip(("options", "stack", "user_args"), stored_run(st), strict=True)))


def study_front(study: str | None, storage: str | None, results_dir: Path, output: tuple[str, Path | None, str], *,
                force: bool) -> tuple[Any, Any, Any, Any, dict[str, Any], list[TrialRow], list[dict[str, Any]]]:
    """(study, model, cluster, workload, config, rows, front) of a study; ``output`` is checked first."""
    from cost_model.uncertainty import error_bars
    from tuner.report import front_rows
    from tuner.study import trial_rows

    option, path, writes = output
    if path is not None:
        from tuner.study.config import check_output_path

        check_output_path(option, path, writes=writes, study=study, force=force)
    st = load_study(study, storage, results_dir)
    m, c, w, cfg = study_context(st)
    rows = trial_rows(st)
    front = front_rows(rows, m, error_bars(m, c.gpu, w.precision), c.gpu.hbm_bytes / 2**30)
    if not front:
        raise TunerError(f"study {st.study_name!r} has no finished trial yet")
    return st, m, c, w, cfg, rows, front


@app.command()
def pareto(
    study: StudyNameOpt = None, storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    top: Annotated[int, typer.Option("--top", min=0, help="Rows to print (0 = all).")] = 0,
    csv_out: Annotated[Path | None, typer.Option("--csv", help="Also write the front as CSV here.")] = None,
    force: ForceOpt = False,
) -> None:
    """Show a study's Pareto front (throughput vs peak memory) with predicted vs measured values."""
    from tuner.report import write_pareto_csv

    st, m, c, w, cfg, rows, front = study_front(study, storage, results_dir, ("--csv", csv_out, "pareto.csv"),
                                                force=force)
    srcs = {r["source"] for r in front}
    say(f"Study [bold]{escape(st.study_name)}[/]: {escape(m.name)} on {c.label}, seq {w.seq_length:,}, "
        f"gbs {w.global_batch_size}; backend {escape(str(cfg.get('backend')))}; {len(rows):,} layouts evaluated",
        indent=0, hang=2)
    more = shell_command("tune", "pareto", *study_flags(st.study_name, results_dir), "--top", "0")
    from tuner.report import BEST_TRIAL_ATTR

    print_front(front, top,
                title=f"Pareto front ({' and '.join(sorted(srcs))}; tok/s = tokens/s/GPU, 90% interval; * may not fit)",
                more_hint=more, best_trial=st.user_attrs.get(BEST_TRIAL_ATTR))
    print_ties(rows, front[0])
    real = [t for t in st.trials if "pruned" in t.user_attrs
            or ("failure" in t.user_attrs and "pred_peak_gib" in t.user_attrs["failure"])]
    if any(r.pred_tokens_per_s_per_gpu == r.pred_tokens_per_s_per_gpu for r in rows) and ("measured" in srcs or real):
        out.print("Predicted vs measured, every real trial (tokens/s/GPU; peak GiB)")
        lines = [(r.trial, r.layout.label, "measured", r.pred_tokens_per_s_per_gpu, r.tokens_per_s_per_gpu,
                  r.pred_peak_gib, r.peak_gib) for r in rows if r.source == "measured"]
        for tr in real:
            a = tr.user_attrs.get("pruned") or tr.user_attrs["failure"]
            if "pruned" in tr.user_attrs:
                tps = sorted(a.get("tokens_per_s_per_gpu", [])[2:]) or [float("nan")]
                lines.append((tr.number, a["label"], "pruned", a["pred_tokens_per_s_per_gpu"], tps[len(tps) // 2],
                              a["pred_peak_gib"], float("nan")))
            else:
                lines.append((tr.number, a["label"], a["kind"], a["pred_tokens_per_s_per_gpu"], float("nan"),
                              a["pred_peak_gib"], a.get("memory_reached_gib", float("nan"))))
        cells = []
        for n, label, outcome, ptps, mtps, pgib, mgib in sorted(lines):
            rel = f"{(ptps / mtps - 1) * 100:+.1f}" if mtps == mtps and mtps else "-"
            cells.append([str(n), label, outcome, f"{ptps:,.1f}", f"{mtps:,.1f}" if mtps == mtps else "-", rel,
                          f"{pgib:.1f}", f"{mgib:.1f}" if mgib == mgib else "-"])
        out.print(fitted_table([Col("trial", "right"), Col("layout"), Col("outcome"), Col("predicted", "right"),
                                Col("measured", "right"), Col("err %", "right"), Col("pred. GiB", "right", 2),
                                Col("GiB", "right", 1)], cells))
    for rec in st.user_attrs.get("recalibrations", []):
        if "error" in rec:
            say(f"refit after {rec['after_measured_trials']} measured trials failed ({rec['error']}); the previous "
                "constants were kept", indent=0, hang=2, markup=False)
        else:
            se = rec.get("step_median_abs_error")
            out.print(f"refit after {rec['after_measured_trials']} measured trials: step-time median error {se:.1%} in "
                      "the fit" if se is not None else
                      f"refit after {rec['after_measured_trials']} measured trials", markup=False)
    if csv_out:
        write_pareto_csv(csv_out, front, label="--csv", force=force)
        out.print(f"wrote {csv_out}", markup=False)


def _format_help() -> str:
    import rl.exporters  # noqa: F401 - registers the RL formats (nemo-rl, slime-rl), which `tune export` names and refuses
    from launch.exporters import exporters

    return "One of: " + "; ".join(f"{n} ({e.description})" for n, e in exporters().items()) + "."


@app.command("export")
def export_cmd(
    study: StudyNameOpt = None, storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    trial: Annotated[int | None, typer.Option("--trial", help=(
        "Trial number (default: the study's best, the layout tune recommended: of those that ran or are predicted to "
        "fit, the least memory within 1% of the fastest)."))] = None,
    fmt: Annotated[str, typer.Option("--format", help=_format_help())] = "recipe",
    out_file: Annotated[Path | None, typer.Option("--out", help=(
        "File to write (default: stdout); a script is written executable."))] = None,
    force: ForceOpt = False,
) -> None:
    """Export a study's layout in one of the registered formats (a recipe YAML, a slime run script, a Megatron-LM
    argument file)."""
    from cost_model.uncertainty import error_bars
    from launch.exporters import get_exporter
    from tuner.report import pick_trial_row
    from tuner.study import trial_rows

    exporter = get_exporter(fmt)
    if out_file is not None:
        from tuner.study.config import check_output_path

        check_output_path("--out", out_file, writes=exporter.file_name, study=study, force=force)
    st = load_study(study, storage, results_dir)
    m, c, w, cfg = study_context(st)
    rows = trial_rows(st)
    row = pick_trial_row(st.study_name, rows, m, trial, "export", best=st.user_attrs.get("best_trial"))
    peak, hbm = row.peak_gib or 0.0, c.gpu.hbm_bytes / 2**30
    if row.source == "predicted" and peak > hbm / error_bars(m, c.gpu, w.precision).memory.high:
        err.print(f"[yellow]warning:[/] trial {row.trial} is predicted at {peak:.1f} GiB per GPU of {hbm:.1f}: it "
                  "may not fit; confirm it with a real trial before training on it")
    from tuner.verify.correctness import stored_correctness  # launch's process helpers: not imported by the main job

    text = exporter.render(study_export_context(st, m, c, w, cfg, row.layout, row, rows,
                                                correctness=stored_correctness(st, row.trial)))
    if out_file is None:
        sys.stdout.write(text)
        return
    exporter.save(text, out_file, force=force)
    err.print(f"wrote {out_file}", markup=False)
