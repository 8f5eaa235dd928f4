"""The main job, ``tune --model M --gpus G``: enumerate, check, estimate, search, show the front, export (the root
callback of the ``tune`` app: with a sub-command it returns)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cost_model.fidelity import gaps
from specs.errors import TunerError
from tuner.cli._common import (
    GIB,
    CalOpt,
    CliState,
    GbsOpt,
    GpusOpt,
    HeadroomOpt,
    HostMemOpt,
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
    StudyOpt,
    err,
    fmt_int,
    out,
    print_command,
    require,
    run_options,
    say,
    shell_command,
    study_flags,
)
from tuner.cli._front import print_front, print_ties, table_rows

if TYPE_CHECKING:
    from tuner.study.records import TrialRow

__all__ = ["main_job"]


# the options of real trials (rich_help_panel Trials)
TrialStepsOpt = Annotated[int, typer.Option("--trial-steps", rich_help_panel="Trials", help=(
    "Optimizer steps per real trial, warm-up steps included."))]
TrialWarmupStepsOpt = Annotated[int | None, typer.Option("--trial-warmup-steps", rich_help_panel="Trials", help=(
    "Leading steps of a real trial left out of its median step time (default: half of --trial-steps; MoE step "
    "times on H200 settled only after about 10 steps)."))]
TrialTimeoutOpt = Annotated[float, typer.Option("--trial-timeout", rich_help_panel="Trials", help=(
    "Seconds one real trial may run, model build included; then its process group is killed."))]
TrialProfileStepOpt = Annotated[int | None, typer.Option("--trial-profile-step", rich_help_panel="Trials", help=(
    "--backend local: profile this step of every trial with torch.profiler (a Chrome trace per pipeline stage in "
    "the trial's folder, shown by `tune timeline --study S --trial N` beside the predicted step); a warm-up step "
    "keeps the profiler's overhead out of the measurement."))]
CommandTemplateOpt = Annotated[Path | None, typer.Option("--command-template", rich_help_panel="Trials", help=(
    "Launch template (YAML/JSON argv with placeholders) of --backend command; launch/templates/slime_command.yaml "
    "ships."))]
RecalibrateAfterOpt = Annotated[int, typer.Option("--recalibrate-after", rich_help_panel="Trials", help=(
    "Real trials: refit the cost model to the measurements after every N measured trials and re-rank the "
    "candidates not yet run (0 = never)."))]
ConfirmRunsOpt = Annotated[int, typer.Option("--confirm-runs", rich_help_panel="Trials", help=(
    "Real trials: after the search, bring the fastest measured layout and those within its noise (at most 4) to N "
    "more runs each, interleaved, and rank them by all their runs (0 = no)."))]
RayAddressOpt = Annotated[str | None, typer.Option("--ray-address", rich_help_panel="Trials", help=(
    "Ray cluster of --backend ray: auto, HOST:PORT or ray://HOST:PORT (default: start a local Ray "
    "instance)."))]
ParallelTrialsOpt = Annotated[int, typer.Option("--parallel-trials", rich_help_panel="Trials", help=(
    "Real trials this worker runs at once (--backend ray; each its own placement group)."))]
TrialEnvOpt = Annotated[list[str] | None, typer.Option("--trial-env", rich_help_panel="Trials", help=(
    "NAME=VALUE for every rank of a real trial (--backend ray), repeatable, e.g. --trial-env "
    "NCCL_IB_HCA=mlx5."))]
PruneMarginOpt = Annotated[float, typer.Option("--prune-margin", rich_help_panel="Trials", help=(
    "Stop a real trial more than this fraction slower than the best so far (after its warm-up and 2 measured "
    "steps); negative = never."))]
TrialPolicyOpt = Annotated[str, typer.Option("--trial-policy", rich_help_panel="Trials", help=(
    "Real trials: gain (the expected gain per GPU-hour, until the stopping rule or the budget says stop) or queue "
    "(the predicted front and fastest first, then NSGA-II, for --trials layouts)."))]
GpuHoursOpt = Annotated[float | None, typer.Option("--gpu-hours", rich_help_panel="Trials", help=(
    "Real trials: the GPU-hours this run may spend (a trial costs its wall time, start-up included, "
    "times --gpus)."))]
StopConfidenceOpt = Annotated[float, typer.Option("--stop-confidence", rich_help_panel="Trials", help=(
    "Real trials: stop when no untried layout may beat the best by more than --stop-gain with this "
    "confidence."))]
StopGainOpt = Annotated[float, typer.Option("--stop-gain", rich_help_panel="Trials", help=(
    "Real trials: the gain over the best (a fraction) the stopping rule looks for."))]


@run_options
def main_job(
    ctx: typer.Context, run: RunChoice, model: ModelOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None,
    network_gbps: NetOpt = None, network: NetworkOpt = None, megatron_core: MegatronCoreOpt = None,
    host_memory_gib: HostMemOpt = None, usd_per_gpu_hour: PriceOpt = None, seq_len: SeqOpt = 8192,
    global_batch: GbsOpt = 128, precision: PrecOpt = "bf16",
    space: Annotated[Path | None, typer.Option("--space", rich_help_panel="Search", help=(
        "Search-space YAML (copy search_spaces/default_space.yaml)."))] = None,
    calibration: CalOpt = None, memory_headroom: HeadroomOpt = None,
    trials: Annotated[int | None, typer.Option("--trials", rich_help_panel="Search", help=(
        "Layouts to evaluate in this run (default 48; sampled layouts that are invalid, do not fit or were evaluated "
        "before do not count): the predicted front and fastest candidates first, then NSGA-II."))] = None,
    backend: Annotated[str, typer.Option("--backend", rich_help_panel="Search", help=(
        "model (analytical, default), local (real trials: the megatron-core harness under torchrun on this machine's "
        "GPUs), ray (the harness on a Ray cluster's nodes) or command (your slime / Megatron-LM launch command, "
        "--command-template)."))] = "model",
    layers: LayersOpt = None, trial_steps: TrialStepsOpt = 20, trial_warmup_steps: TrialWarmupStepsOpt = None,
    trial_timeout: TrialTimeoutOpt = 900.0, trial_profile_step: TrialProfileStepOpt = None,
    command_template: CommandTemplateOpt = None, recalibrate_after: RecalibrateAfterOpt = 4,
    confirm_runs: ConfirmRunsOpt = 0, ray_address: RayAddressOpt = None, parallel_trials: ParallelTrialsOpt = 1,
    trial_env: TrialEnvOpt = None, prune_margin: PruneMarginOpt = 0.25,
    from_file: Annotated[Path | None, typer.Option("--from", rich_help_panel="Job", help=(
        "Your launch: a Megatron-LM / slime argument list or shell script (MODEL_ARGS=(...) arrays expanded), a "
        "recipe.yaml, a Megatron-Bridge YAML (override, perf_matrix config or saved ConfigContainer; give --model) or "
        "a NeMo-RL config. Its model, GPUs, workload, layout and run options are the inputs (flags given here win), "
        "its layout the baseline and the first trial; its other arguments are kept in the exported commands."))] = None,
    allow_config_args: Annotated[bool, typer.Option("--allow-config-args", rich_help_panel="Job", help=(
        "Use the launch arguments a --model config.json adds (its tuner.extra_megatron_args): printed, and recorded in "
        "the recipe."))] = False,
    study: StudyOpt = None, storage: StorageOpt = None,
    resume: Annotated[bool, typer.Option("--resume", rich_help_panel="Study", help=(
        "Evaluate more layouts in an existing study (48, after any an interrupted run left queued). Without it or "
        "--trials, re-running a command shows its study as it is."))] = False,
    results_dir: ResultsOpt = Path("results"),
    seed: Annotated[int, typer.Option("--seed", help="Sampler seed.", rich_help_panel="Study")] = 0,
    trial_policy: TrialPolicyOpt = "gain", gpu_hours: GpuHoursOpt = None, stop_confidence: StopConfidenceOpt = 0.9,
    stop_gain: StopGainOpt = 0.02,
    top: Annotated[int, typer.Option("--top", min=0, rich_help_panel="Output", help=(
        "Rows of the Pareto table to print (0 = all)."))] = 7,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", rich_help_panel="Output", help=(
        "Also print the space's counts by rule and the notes behind the numbers."))] = False,
    png: Annotated[bool, typer.Option("--png", rich_help_panel="Output", help=(
        "Also draw pareto.png (report.html always shows the front)."))] = False,
    debug: Annotated[bool, typer.Option("--debug", help=(
        "Show the traceback of an error (accepted anywhere on the command line; or TUNE_DEBUG=1); the exit code is "
        "unchanged."))] = False,
) -> None:
    """Find the fastest layout that fits: `tune --model MiniMax-M2 --gpus 64xH200`."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None and gpus is None and from_file is None:
        out.print(ctx.get_help())
        raise typer.Exit(code=0)
    if precision not in ("bf16", "fp8"):
        raise TunerError(f"--precision {precision!r}: accepted bf16 or fp8")
    from tuner.cli._from import command_inputs

    launch, model, gpus, seq_len, global_batch, precision, layers, run, _ = command_inputs(
        from_file, ctx, model=model, gpus=gpus, seq_len=seq_len, global_batch=global_batch, precision=precision,
        layers=layers, run=run)
    cfg = _tune_config(locals())
    state = ctx.obj if isinstance(ctx.obj, CliState) else CliState(argv=(), debug=False)
    _run_main(cfg, top, results_dir, state, launch, verbose=verbose, png=png)


def _tune_config(a: dict[str, Any]) -> Any:
    """The :class:`tuner.study.TuneConfig` of :func:`main_job`'s arguments ``a``."""
    from tuner.study import config as c

    def group(kind: Any, **kw: Any) -> Any:
        return kind(**{f.name: a[f.name] for f in dataclasses.fields(kind) if f.name in a and f.name not in kw}, **kw)

    run, launch, prune_margin = a["run"], a["launch"], a["prune_margin"]
    as_str = {k: str(a[k]) if a[k] else None for k in ("space", "calibration", "command_template")}
    given = {"baseline": launch.baseline, "user_args": launch.launch.user_args,
             "bridge_yaml": launch.launch.path.read_text() if launch.launch.kind == "megatron-bridge" else ""
             } if launch else {}
    return c.TuneConfig(
        job=group(c.JobOptions, model=require(a["model"], "--model", "MiniMax-M2"),
                  gpus=require(a["gpus"], "--gpus", "64xH200"), **given),
        cluster=group(c.ClusterOptions),
        workload=group(c.WorkloadOptions, seq_length=a["seq_len"], global_batch_size=a["global_batch"],
                       **run.workload_kw()),
        search=group(c.SearchOptions, space=as_str["space"], calibration=as_str["calibration"]),
        trial=group(c.TrialOptions, trial_timeout_s=a["trial_timeout"], command_template=as_str["command_template"],
                    trial_env=tuple(a["trial_env"] or ()), policy=a["trial_policy"],
                    # NaN is rejected later
                    prune_margin=None if (not math.isnan(prune_margin) and prune_margin < 0) else prune_margin),
        store=group(c.StudyOptions, results_dir=str(a["results_dir"])),
        run=group(c.StackOptions, stack=run.stack or "slime",
                  run_flags={k: list(v) if isinstance(v, tuple) else v for k, v in run.flags.given().items()}),
    )


def _drop_args(argv: Sequence[str], with_value: set[str], flags: tuple[str, ...] = ()) -> list[str]:
    """``argv`` without the options ``with_value`` (and their values, also as ``--opt=value``) and ``flags``."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a in with_value:
            next(it, None)
        elif a not in flags and not any(a.startswith(f"{d}=") for d in with_value):
            out.append(a)
    return out


def _with_trials(argv: Sequence[str], left: int) -> list[str]:
    """``argv`` with ``--trials left`` in place of its ``--trials N`` (the resumed run evaluates what this one left)."""
    return [*_drop_args(argv, {"--trials"}), "--trials", str(left)]


def _run_main(cfg: Any, top: int, results_dir: Path, state: CliState, launch: Any = None, *, verbose: bool = False,
              png: bool = False) -> None:
    """Run the main job of ``cfg`` and print it; ``state.argv`` is the command a resume repeats."""
    from tuner.study import trial_rows

    prep = _prepare_main(cfg)
    _print_header(prep, cfg, launch, verbose=verbose)
    res = _run_with_progress(prep, cfg, state)
    rows = trial_rows(res.study)
    front, best, tied = _choose_best(res, rows, prep, cfg)
    files, report_note = _write_results(res, prep, cfg, rows, front, best, top=top, png=png)
    _print_outcome(res, prep, cfg, state, rows, front, best, tied, files, report_note, results_dir=results_dir, top=top,
                   launch=launch)


def _prepare_main(cfg: Any) -> Any:
    """The study's :class:`tuner.study.Prepared`, after the flags, the backend and this machine are checked."""
    from launch import BackendSettings, backend_class, get_backend
    from tuner.study import _validate_config, prepare

    _validate_config(cfg)  # flag combinations first: one message about the flags, before any backend is probed
    # unknown / unavailable backends before any work; one the study opens (Ray) is probed there
    backend = backend_class(cfg.search.backend)
    if not backend.opened_by_study:
        get_backend(cfg.search.backend, BackendSettings(command_template=cfg.trial.command_template))
    prep = prepare(cfg)
    backend.check_machine(prep.cluster)  # before any output or trial
    return prep


def _print_header(prep: Any, cfg: Any, launch: Any, *, verbose: bool) -> None:
    """The job's first lines: model, GPUs, workload, stack (and the launch file's, the space, the plan when asked)."""
    c = prep.cluster
    w = prep.workload
    say(f"[bold]{escape(prep.model.name)}[/] on {c.label}, {c.network.key if c.network else 'custom network'}, "
        f"seq {w.seq_length:,}, gbs {w.global_batch_size}, {w.precision.value}, {cfg.search.backend} backend",
        indent=0, hang=2)
    task = "" if w.task == "pretrain" else f"; task {w.task}" + (f", LoRA rank {w.lora_rank}" if w.task == "lora"
                                                                 else "")
    say(prep.stack.line + task, indent=0, hang=2, markup=False)
    if launch is not None:
        from tuner.cli._from import launch_lines

        for line in launch_lines(prep, launch, verbose=verbose):
            say(line.lstrip(), indent=len(line) - len(line.lstrip()), hang=2, markup=False)
    if verbose:
        _print_space(prep, cfg)
    if cfg.measured and cfg.trial.policy == "gain":
        _print_plan(prep, cfg)


def _run_with_progress(prep: Any, cfg: Any, state: CliState) -> Any:
    """:func:`tuner.study.run_study` under a progress bar; Ctrl-C prints how to resume and exits 130."""
    from tuner.study import run_study

    # The bar starts when the study is open and its first trial begins (run_study calls on_trial(0, n)):
    # a refused study (other inputs, a busy lock, a bad storage) prints its error without a bar before it.
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=out, transient=not cfg.measured)
    task = progress.add_task(f"Optuna search ({cfg.search.backend} backend)", total=None)

    count = [0, 0]  # done, total: a resume runs what was left

    def on_trial(done: int, total: int) -> None:
        count[:] = [done, total]
        if not progress.live.is_started:
            progress.start()
        progress.update(task, completed=done, total=total)

    try:
        res = run_study(prep, on_trial=on_trial)
    except KeyboardInterrupt:
        if progress.live.is_started:
            progress.stop()
        left = count[1] - count[0] if count[0] and count[1] > count[0] else 0
        again = (_with_trials(state.argv, left) if left
                 else [*state.argv, *([] if "--resume" in state.argv or "--trials" in state.argv else ["--resume"])])
        resume = f": {shell_command('tune', *again)}" if state.argv else ": re-run the command with --resume"
        err.print(f"[yellow]interrupted:[/] finished trials are kept in the study; to resume{escape(resume)}",
                  soft_wrap=True)
        raise typer.Exit(code=130) from None
    finally:
        if progress.live.is_started:
            progress.stop()

    return res


def _choose_best(res: Any, rows: list[TrialRow], prep: Any, cfg: Any) -> tuple[list[dict[str, Any]],
                                                                                     dict[str, Any], list[Any]]:
    """The Pareto front, the best row (recorded in the study) and the rows tied with it."""
    from tuner.report import BEST_TRIAL_ATTR, front_rows, pick_best
    from tuner.study.run import POLICY_BEST_ATTR

    c = prep.cluster
    front = front_rows(rows, prep.model, prep.bars, c.gpu.hbm_bytes / GIB)
    if cfg.search.memory_headroom is not None:  # a fixed margin is the whole fit rule: every candidate fits by it
        for r in front:
            if r.get("fit") == "may not fit":
                r["fit"] = "fits"
    if not front:
        raise TunerError("the study has no finished trial; nothing to export")
    best, tied = pick_best(front)
    assert best is not None  # the front is not empty
    chosen = res.study.user_attrs.get(POLICY_BEST_ATTR)  # the gain policy's answer, when it stopped by its rule
    if chosen is not None and chosen != best["trial"]:
        row = [r for r in rows if r.trial == chosen]
        if row:
            best, tied = front_rows(row, prep.model, prep.bars, c.gpu.hbm_bytes / GIB)[0], []
    res.study.set_user_attr(BEST_TRIAL_ATTR, best["trial"])
    return front, best, tied


def _write_results(res: Any, prep: Any, cfg: Any, rows: list[TrialRow], front: list[dict[str, Any]],
                   best: dict[str, Any], *, top: int, png: bool) -> tuple[dict[str, Path], str]:
    """Write the study folder's outputs; the files written and a note when the report was left out."""
    from tuner.report import export_files, plot_front, write_pareto_csv
    from tuner.study import _mask

    c, w, lay = prep.cluster, prep.workload, best["layout"]
    src_word = "measured" if cfg.measured else "predicted"
    report_note = ""
    files = {"pareto": res.out_dir / "pareto.csv"}
    try:
        write_pareto_csv(files["pareto"], front, force=True)  # the study folder's own files: whatever wrote them before
        if png:
            files["plot"] = res.out_dir / "pareto.png"
            plot_front(
                files["plot"], rows, front,
                title=f"{prep.model.name} on {c.label}, seq {w.seq_length}, gbs {w.global_batch_size} ({src_word})",
                usable_gib=prep.estimates.usable_bytes / GIB, labelled=table_rows(front, top, best["trial"]),
                force=True,
            )
        from tuner.report import runs_note, ties_note

        best_row = next(r for r in rows if r.trial == best["trial"])
        files.update(export_files(res.out_dir, prep.model, c, w, lay, study=res.study_name,
                                  calibration=prep.calibration, memory_headroom=prep.headroom,
                                  measurement=best_row.measurement(),
                                  notes=runs_note(best_row) + ties_note(rows, best["trial"]),
                                  megatron_core=prep.options.megatron_core, options=prep.options,
                                  stack=prep.stack.preset.name, user_args=cfg.job.user_args,
                                  bridge_yaml=cfg.job.bridge_yaml))
        from tuner.report_html import ReportUnavailable, study_report

        try:
            files["report"] = study_report(res.out_dir / "report.html", study=res.study_name, model=prep.model,
                                           cluster=c, workload=w, rows=rows,
                                           front=front, backend=cfg.search.backend, calibration=prep.calibration,
                                           memory_headroom=prep.headroom, files={**{p.name: p for p in files.values()},
                                                  "config.yaml": res.out_dir / "config.yaml"}, force=True)
        # the study, the front and the recipe files are written: only the page is left out
        except ReportUnavailable as e:
            report_note = (f"note: report.html was not written: {e}; `tune report --study {res.study_name}` "
                           "writes it later")
    except OSError as e:
        raise TunerError(f"cannot write the results to {res.out_dir} ({e.strerror or e}: {e.filename}); the study and "
                         f"its trials are kept in {_mask(res.storage)}") from None
    return files, report_note


def _study_counts(res: Any, evaluated: int, measured: bool) -> str:
    """``Study NAME: 102,561 layouts evaluated in total (2,000 now; ...)``."""
    ran = (f"; {res.pruned_now:,} pruned, {res.failed_now:,} failed; {res.gpu_hours_now:,.1f} GPU-hours"
           if measured else "")
    return f"Study {escape(res.study_name)}: {evaluated:,} layouts evaluated in total ({res.evaluated_now:,} now{ran})"


def _print_outcome(res: Any, prep: Any, cfg: Any, state: CliState, rows: list[TrialRow],
                   front: list[dict[str, Any]], best: dict[str, Any], tied: list[Any], files: dict[str, Path],
                   report_note: str, *, results_dir: Path, top: int, launch: Any) -> None:
    """The best layout, the space and study counts, the front, the files and the next command."""
    from tuner.report import pipeline_layout_of

    c, en, lay = prep.cluster, prep.enumeration, best["layout"]
    src_word = "measured" if cfg.measured else "predicted"
    flags = study_flags(res.study_name, results_dir)
    pls = pipeline_layout_of(lay, prep.model)
    _print_best(best, tied, pls, c.gpu.hbm_bytes / GIB, prep.model.num_experts > 0)
    if res.stop_note:
        out.print(f"  {escape(res.stop_note)}", soft_wrap=False)
    out.print(
        f"Space: {fmt_int(en.considered)} layouts, {fmt_int(prep.n_valid)} valid, {fmt_int(prep.n_fit)} candidates "
        f"({fmt_int(int((prep.fits & ~prep.surely_fits).sum()))} may not fit)"
    )
    say(_study_counts(res, len(rows), cfg.measured), indent=0, hang=2)
    for note in (res.budget_note, res.confirm_note):
        if note:
            say(escape(note), label="note:", indent=0)
    if launch is not None:
        from tuner.cli._from import compare_line, launch_failure

        say(compare_line(prep, best, rows, launch_failure(res.study, prep)), indent=0, hang=2, markup=False)
    if best["source"] == "predicted":
        for gap in gaps(lay, prep.model, prep.cluster.gpu, prep.calibration)[:2]:
            say(gap.line, label="note:", indent=0, markup=False)
    out.print()
    print_front(front, top, title=f"Pareto front ({src_word}; tok/s = tokens/s/GPU, 90% interval; * may not fit)",
                more_hint=shell_command("tune", "pareto", *flags, "--top", "0"), best_trial=best["trial"])
    print_ties(rows, best)
    say(f"Results in {res.out_dir}/: {', '.join(p.name for p in files.values())}", indent=0, hang=2, markup=False)
    if report_note:
        say(report_note, indent=0, hang=2, markup=False)
    from launch.exporters import bridge_left_out
    from launch.exporters._bridge import bridge_scripts_note

    if why := bridge_left_out(cfg.job.bridge_yaml):
        say(f"no megatron_bridge.yaml: {why}", hang=2, markup=False)
    if note := bridge_scripts_note(cfg.job.bridge_yaml):
        names = [p.name for p in files.values() if p.suffix in (".sh", ".yaml") and p.name != "megatron_bridge.yaml"]
        say(f"{', '.join(names)}: {note}", label="note:", indent=0, markup=False)
    if prep.workload.task == "lora":
        from launch.exporters import exporters

        full = [e.file_name for e in exporters().values() if e.trains_every_weight and e.file_name in
                {p.name for p in files.values()}]
        say(f"{' and '.join(full)} train every weight (no LoRA there): more memory than predicted; "
            "megatron_bridge.yaml trains the adapters (peft)", label="note:", indent=0, markup=False)
    elif best["source"] == "predicted":
        from tuner.study.config import cheapest_trial_gpu_hours, policy_params

        pp = policy_params(prep, 1)
        # five trials: of the best's predicted cost, and at least five of the cheapest contender's (what the plan
        # counts)
        trial_gh = max((pp.startup_s + pp.steps * float(best["step_time_s"])) * c.num_gpus / 3600,
                       cheapest_trial_gpu_hours(prep))
        budget = max(1, math.ceil(5 * trial_gh))
        args = _real_trial_args(state.argv, prep, cfg)
        if prep.stack is not None and prep.stack.flags and prep.stack.preset.name == "slime":
            # run flags need the user's own stack: the harness (local, ray) runs its own and refuses them
            say(f"Next: measure the contenders through your own launch, which has these run flags (about "
                f"{trial_gh:,.1f} GPU-hours a trial; docs/trials.md#through-your-own-launch):", indent=0, hang=2,
                markup=False)
            print_command("tune", *args, "--backend", "command", "--command-template",
                          "launch/templates/slime_command.yaml", "--gpu-hours", budget)
        elif prep.stack is not None and prep.stack.flags:
            # the shipped template runs slime's entry point: another stack's launch needs a template of its own
            say(f"Next: measure the contenders through your own {prep.stack.preset.name} launch, which has these run "
                f"flags (about {trial_gh:,.1f} GPU-hours a trial): write its launch template "
                "(docs/trials.md#a-template-for-a-torchrun-launch), then:", indent=0, hang=2, markup=False)
            print_command("tune", *args, "--backend", "command", "--command-template",
                          "YOUR_TEMPLATE.yaml", "--gpu-hours", budget)
        else:
            out.print(f"Next: measure the contenders (about {trial_gh:,.1f} GPU-hours a trial):", markup=False)
            print_command("tune", *args, "--backend", "ray", "--ray-address", "auto", "--gpu-hours", budget)
    else:
        out.print("Next: check convergence against a reference layout:", markup=False)
        print_command("tune", "verify", *flags, "--trial", best["trial"], "--reference", "tp=1,pp=1,ep=1")


def _real_trial_args(argv: tuple[str, ...], prep: Any, cfg: Any) -> list[str]:
    """The user's arguments for the same job with real trials (no output flags, --trials, --study)."""
    args = _drop_args(argv, {"--trials", "--study", "--top"}, ("-v", "--verbose", "--png"))
    return args or ["--model", prep.model.name, "--gpus", cfg.job.gpus]


def _print_plan(prep: Any, cfg: Any) -> None:
    """Real trials under the gain policy: what a trial costs and what the budget buys, before the first one starts."""
    from tuner.study.config import cheapest_trial_gpu_hours, n_trials, policy_params
    from tuner.study.policy import fmt_gpu_hours

    pp = policy_params(prep, n_trials(cfg))
    each = cheapest_trial_gpu_hours(prep)
    buys = (f"; --gpu-hours {cfg.trial.gpu_hours:g} buys at most {int(cfg.trial.gpu_hours // each)} of them"
            if cfg.trial.gpu_hours and each == each else "")
    say(f"Plan: {fmt_int(int(prep.contenders.sum()))} contenders (candidates not surely slower than the best); a trial "
        f"costs about {fmt_gpu_hours(each)} GPU-hours "
        f"({prep.cluster.num_gpus} GPUs, {pp.startup_s:.0f} s start-up until measured, {pp.steps} steps){buys}; "
        f"at most {pp.max_trials} trials; stop when no untried layout may beat the best by "
        f"{cfg.trial.stop_gain:.0%} at {cfg.trial.stop_confidence:.0%} confidence", indent=0, hang=2, markup=False)


def _print_space(prep: Any, cfg: Any) -> None:
    """``--verbose``: the network, the space's counts by rule, what was left out and why."""
    en, c = prep.enumeration, prep.cluster
    say(f"Network: {escape(c.network_label)}; megatron-core {prep.options.megatron_core} rules", indent=0, hang=2)
    out.print(f"Layouts considered: {fmt_int(en.considered)}; "
              f"break a Megatron rule: {fmt_int(en.considered - len(en.valid))}")
    for rid, cnt in sorted(en.rule_counts.items(), key=lambda kv: -kv[1]):
        if cnt:
            out.print(f"  {rid:<34} {fmt_int(cnt):>12}")
    rule = (f"a fixed {cfg.search.memory_headroom:.0%} headroom" if cfg.search.memory_headroom is not None else
            f"memory interval of the {prep.bars.family} error bars" if prep.bars else "the prediction")
    say(f"Valid: {fmt_int(prep.n_valid)}; "
        f"not fitting ({rule}): {fmt_int(prep.n_valid - prep.n_fit - prep.n_over_host)}; "
        f"over host memory: {fmt_int(prep.n_over_host)}; candidates: {fmt_int(prep.n_fit)}, "
        f"of which surely slower than the best: {fmt_int(int((prep.fits & ~prep.contenders).sum()))}", indent=0, hang=2)
    for note in en.notes:
        say(note, label="note:", indent=0, markup=False)
    out.print(f"(enumerated and checked in {prep.enumerate_seconds:.2f} s, estimated in {prep.estimate_seconds:.2f} s)")


def _print_best(best: dict[str, Any], tied: list[dict[str, Any]], pls: str, hbm_gib: float, moe: bool) -> None:
    """The result block: the layout, its numbers with their 90% intervals, the layout string, ties."""
    src = best["source"]
    out.print(f"[bold green]Best layout[/] ({src}, trial {best['trial']}): [bold]{best['label']}[/]")
    dispatcher = f"{best['dispatcher']}, " if moe else ""
    say(f"recompute {best['recompute']}, offload {best['offload']}, {dispatcher}micro-batch "
        f"{best['micro_batch_size']}", hang=2, markup=False)
    say(f"tokens/s/GPU {best['tokens_per_s_per_gpu']:,.0f} (90%: {best['tokens_per_s_per_gpu_low']:,.0f}-"
        f"{best['tokens_per_s_per_gpu_high']:,.0f}); MFU {best['mfu']:.1%}; "
        f"${best['usd_per_million_tokens']:.2f}/1M tok", hang=2, markup=False)
    mem = (f"{best['peak_gib']:.1f} GiB" if src == "measured" else
           f"{best['peak_gib']:.1f} GiB (at most {best['peak_gib_high']:.1f})")
    say(f"peak {mem} of {hbm_gib:.1f}; step {best['step_time_s']:.2f} s", hang=2, markup=False)
    if pls:
        out.print(f"  --pipeline-model-parallel-layout '{pls}'", markup=False)
    if best.get("fit") == "may not fit":
        say("no candidate surely fits; this one may not: a real trial tells (docs/error_bars.md)",
            label="[yellow]warning:[/]")
    if tied:
        names = ", ".join(str(t["trial"]) for t in tied[:4]) + (f" and {len(tied) - 4} more" if len(tied) > 4 else "")
        say(f"tie: trial{'s' if len(tied) > 1 else ''} {names} within 1%; the least memory wins (docs/studies.md#ties)",
            hang=2, markup=False)

