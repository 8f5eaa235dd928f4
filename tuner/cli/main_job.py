"""The main job, ``tune --model M --gpus G``: enumerate, check, estimate, search, show the front, export.

It is the root callback of the ``tune`` app (:mod:`tuner.cli`): with no sub-command it runs; with
one, it returns and the sub-command runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cost_model.fidelity import known_gaps
from specs import Layout
from specs.errors import TunerError
from specs.units import DEFAULT_MEMORY_HEADROOM
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
    SeqOpt,
    StorageOpt,
    StudyOpt,
    err,
    fmt_int,
    out,
    require,
    shell_command,
    study_flags,
)
from tuner.cli._front import print_front, print_ties, table_rows

__all__ = ["main_job"]


def main_job(
    ctx: typer.Context,
    model: ModelOpt = None,
    gpus: GpusOpt = None,
    gpus_per_node: PerNodeOpt = None,
    network_gbps: NetOpt = None,
    network: NetworkOpt = None,
    megatron_core: MegatronCoreOpt = None,
    host_memory_gib: HostMemOpt = None,
    usd_per_gpu_hour: PriceOpt = None,
    seq_len: SeqOpt = 8192,
    global_batch: GbsOpt = 128,
    precision: PrecOpt = "bf16",
    space: Annotated[Path | None, typer.Option("--space", help="Search-space YAML (copy search_spaces/default_space.yaml).", rich_help_panel="Search")] = None,
    calibration: CalOpt = None,
    memory_headroom: HeadroomOpt = DEFAULT_MEMORY_HEADROOM,
    trials: Annotated[int | None, typer.Option("--trials", help="Layouts to evaluate in this run (default 48; sampled layouts that are invalid, do not fit or were evaluated before do not count): the predicted front and fastest candidates first, then NSGA-II.", rich_help_panel="Search")] = None,
    backend: Annotated[str, typer.Option("--backend", help="model (analytical, default), local (real trials: the megatron-core harness under torchrun on this machine's GPUs), ray (the harness on a Ray cluster's nodes) or command (your slime / Megatron-LM launch command, --command-template).", rich_help_panel="Search")] = "model",
    layers: LayersOpt = None,
    trial_steps: Annotated[int, typer.Option("--trial-steps", help="Optimizer steps per real trial, warm-up steps included.", rich_help_panel="Trials")] = 20,
    trial_warmup_steps: Annotated[int | None, typer.Option("--trial-warmup-steps", help="Leading steps of a real trial left out of its median step time (default: half of --trial-steps; MoE step times on H200 settled only after about 10 steps).", rich_help_panel="Trials")] = None,
    trial_timeout: Annotated[float, typer.Option("--trial-timeout", help="Seconds one real trial may run, model build included; then its process group is killed.", rich_help_panel="Trials")] = 900.0,
    trial_profile_step: Annotated[int | None, typer.Option("--trial-profile-step", help="--backend local: profile this step of every trial with torch.profiler (a Chrome trace per pipeline stage in the trial's folder, shown by `tune timeline --study S --trial N` beside the predicted step); a warm-up step keeps the profiler's overhead out of the measurement.", rich_help_panel="Trials")] = None,
    command_template: Annotated[Path | None, typer.Option("--command-template", help="Launch template (YAML/JSON argv with placeholders) of --backend command; launch/templates/slime_command.yaml ships.", rich_help_panel="Trials")] = None,
    recalibrate_after: Annotated[int, typer.Option("--recalibrate-after", help="Real trials: refit the cost model to the measurements after every N measured trials and re-rank the candidates not yet run (0 = never).", rich_help_panel="Trials")] = 4,
    confirm_runs: Annotated[int, typer.Option("--confirm-runs", help="Real trials: after the search, bring the fastest measured layout and those within its noise (at most 4) to N more runs each, interleaved, and rank them by all their runs (0 = no).", rich_help_panel="Trials")] = 0,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster of --backend ray: auto, HOST:PORT or ray://HOST:PORT (default: start a local Ray instance).", rich_help_panel="Trials")] = None,
    parallel_trials: Annotated[int, typer.Option("--parallel-trials", help="Real trials this worker runs at once (--backend ray; each its own placement group).", rich_help_panel="Trials")] = 1,
    trial_env: Annotated[list[str] | None, typer.Option("--trial-env", help="NAME=VALUE for every rank of a real trial (--backend ray), repeatable, e.g. --trial-env NCCL_IB_HCA=mlx5.", rich_help_panel="Trials")] = None,
    prune_margin: Annotated[float, typer.Option("--prune-margin", help="Stop a real trial more than this fraction slower than the best so far (after its warm-up and 2 measured steps); negative = never.", rich_help_panel="Trials")] = 0.25,
    allow_config_args: Annotated[bool, typer.Option("--allow-config-args", help="Use the launch arguments a --model config.json adds (its tuner.extra_megatron_args): printed, and recorded in the recipe.", rich_help_panel="Job")] = False,
    stack: Annotated[str, typer.Option("--stack", help="slime (default; leaves out allgather, which slime rewrites) or megatron.", rich_help_panel="Search")] = "slime",
    study: StudyOpt = None,
    storage: StorageOpt = None,
    results_dir: ResultsOpt = Path("results"),
    seed: Annotated[int, typer.Option("--seed", help="Sampler seed.", rich_help_panel="Study")] = 0,
    top: Annotated[int, typer.Option("--top", min=0, help="Rows of the Pareto table to print (0 = all).", rich_help_panel="Output")] = 15,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error (accepted anywhere on the command line; or TUNE_DEBUG=1); the exit code is unchanged.")] = False,
) -> None:
    """Find the fastest layout that fits: `tune --model MiniMax-M2 --gpus 64xH200`."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None and gpus is None:
        out.print(ctx.get_help())
        raise typer.Exit(code=0)
    from tuner.study import TuneConfig

    if trials is not None and trials < 1:
        raise TunerError(f"--trials must be at least 1, got {trials}")
    if precision not in ("bf16", "fp8"):
        raise TunerError(f"--precision {precision!r}: accepted bf16 or fp8")
    cfg = TuneConfig(
        model=require(model, "--model", "MiniMax-M2"),
        gpus=require(gpus, "--gpus", "64xH200"),
        gpus_per_node=gpus_per_node,
        network_gbps=network_gbps,
        network=network,
        megatron_core=megatron_core,
        host_memory_gib=host_memory_gib,
        usd_per_gpu_hour=usd_per_gpu_hour,
        seq_length=seq_len,
        global_batch_size=global_batch,
        precision=precision,
        space=str(space) if space else None,
        calibration=str(calibration) if calibration else None,
        memory_headroom=memory_headroom,
        study=study,
        storage=storage,
        trials=trials,
        backend=backend,
        stack=stack,
        seed=seed,
        results_dir=str(results_dir),
        layers=layers,
        trial_steps=trial_steps,
        trial_warmup_steps=trial_warmup_steps,
        allow_config_args=allow_config_args,
        trial_timeout_s=trial_timeout,
        trial_profile_step=trial_profile_step,
        command_template=str(command_template) if command_template else None,
        ray_address=ray_address,
        recalibrate_after=recalibrate_after,
        confirm_runs=confirm_runs,
        parallel_trials=parallel_trials,
        trial_env=tuple(trial_env or ()),
        prune_margin=None if (not math.isnan(prune_margin) and prune_margin < 0) else prune_margin,  # NaN is rejected later
    )
    state = ctx.obj if isinstance(ctx.obj, CliState) else CliState(argv=(), debug=False)
    _run_main(cfg, top, results_dir, state)


def _with_trials(argv: Sequence[str], left: int) -> list[str]:
    """``argv`` with ``--trials left`` in place of its ``--trials N`` (the resumed run evaluates what this one left)."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--trials":
            next(it, None)
        elif not a.startswith("--trials="):
            out.append(a)
    return [*out, "--trials", str(left)]


def _run_main(cfg: Any, top: int, results_dir: Path, state: CliState) -> None:
    """Run the main job of ``cfg`` and print it; ``state.argv`` is the command a resume repeats.

    Raises:
        TunerError: bad inputs or flag combinations, a refused study, a backend that cannot run here,
            no finished trial, or results that cannot be written.
    """
    from launch import BackendSettings, get_backend
    from tuner.report import export_files, front_rows, pipeline_layout_of, plot_front, write_pareto_csv
    from tuner.study import _mask, _validate_config, prepare, run_study, trial_rows

    _validate_config(cfg)  # flag combinations first: one message about the flags, before any backend is probed
    # Reject unknown / unavailable backends before any work (ray connects once, in run_study).
    if cfg.backend != "ray":
        get_backend(cfg.backend, BackendSettings(command_template=cfg.command_template))
    prep = prepare(cfg)
    if cfg.backend == "local":
        from launch.local_backend import check_local_gpus, machine_gpu_count

        have, c = machine_gpu_count(), prep.cluster
        check_local_gpus(c, "--backend local",
                         nodes_fix=f"use --gpus {c.num_gpus}x{c.gpu.name} for one node of that size, or --backend ray for several",
                         gpus_fix=f"use at most --gpus {have}x{c.gpu.name} (this machine's {have} GPU{'s' if have != 1 else ''}; "
                                  "slice a model with --layers to make it fit)")
        from launch.local_backend import check_harness_dependencies

        check_harness_dependencies()  # before any output or trial: one clear message if torch is missing
    en = prep.enumeration
    c = prep.cluster
    w = prep.workload
    src_word = "predicted" if cfg.backend == "model" else "measured"
    out.print(
        f"[bold]{escape(prep.model.name)}[/] on [bold]{c.label}[/] ({c.num_gpus} GPUs, {c.gpu.hbm_bytes / GIB:.1f} GiB each), "
        f"seq {w.seq_length:,}, global batch {w.global_batch_size}, {w.precision.value}; "
        f"backend [bold]{cfg.backend}[/] ({'every number below is a prediction of the analytical model; nothing was measured' if cfg.backend == 'model' else 'trials are measured'})"
    )
    out.print(f"Network assumed: {escape(c.network_label)}; megatron-core {prep.options.megatron_core} rules", soft_wrap=True)
    n_rule = en.considered - len(en.valid)
    n_nofit = prep.n_valid - prep.n_fit
    out.print(f"Layouts considered: [bold]{fmt_int(en.considered)}[/]")
    out.print(f"  break a Megatron rule: {fmt_int(n_rule)}")
    for rid, cnt in sorted(en.rule_counts.items(), key=lambda kv: -kv[1]):
        if cnt:
            out.print(f"    {rid:<34} {fmt_int(cnt):>12}")
    host = (f"; over {c.host_memory_bytes_per_node / GIB:,.0f} GiB of host memory per node: {fmt_int(prep.n_over_host)}"
            if prep.n_over_host else "")
    out.print(
        f"  valid: {fmt_int(prep.n_valid)}; predicted not to fit in {prep.estimates.usable_bytes / GIB:.1f} GiB "
        f"({cfg.memory_headroom:.0%} headroom): {fmt_int(n_nofit - prep.n_over_host)}{host}; candidates: [bold]{fmt_int(prep.n_fit)}[/]"
    )
    for note in getattr(en, "notes", []) or []:
        out.print(f"  note: {note}", markup=False)
    out.print(f"  (enumerated and checked in {prep.enumerate_seconds:.2f} s, estimated in {prep.estimate_seconds:.2f} s)")

    # The bar starts when the study is open and its first trial begins (run_study calls on_trial(0, n)):
    # a refused study (other inputs, a busy lock, a bad storage) prints its error without a bar before it.
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
        transient=False,
    )
    task = progress.add_task(f"Optuna search ({cfg.backend} backend)", total=None)

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
        argv = _with_trials(state.argv, count[1] - count[0]) if count[0] and count[1] > count[0] else state.argv
        resume = f": {shell_command('tune', *argv)}" if argv else ""
        err.print(f"[yellow]interrupted:[/] finished trials are kept in the study; re-run the same command to resume{escape(resume)}", soft_wrap=True)
        raise typer.Exit(code=130) from None
    finally:
        if progress.live.is_started:
            progress.stop()

    rows = trial_rows(res.study)
    front = front_rows(rows, prep.model)
    out.print(
        f"Study [bold]{escape(res.study_name)}[/] ({escape(_mask(res.storage))}): {len(rows)} layouts evaluated in total "
        f"({res.evaluated_now} now; {res.skipped_now} sampled layouts skipped as invalid, not fitting or already evaluated"
        + (f"; {res.pruned_now} real trials pruned, {res.failed_now} failed" if cfg.backend != "model" else "")
        + (f"; {res.confirmed_now} confirmation runs" if res.confirmed_now else "")
        + ")"
    )
    if res.confirm_note:
        err.print(f"[yellow]note:[/] {escape(res.confirm_note)}")
    if res.budget_note:
        err.print(f"[yellow]note:[/] {escape(res.budget_note)}")
    flags = study_flags(res.study_name, results_dir)
    print_front(front, top, title=f"Pareto front: tokens/s/GPU vs peak memory per GPU ({src_word})",
                more_hint=f"`{shell_command('tune', 'pareto', *flags, '--top', '0')}`")
    if not front:
        raise TunerError("the study has no finished trial; nothing to export")
    best = front[0]
    lay = best["layout"]
    pls = pipeline_layout_of(lay, prep.model)
    report_note = ""
    files = {
        "pareto": res.out_dir / "pareto.csv",
        "plot": res.out_dir / "pareto.png",
    }
    try:
        write_pareto_csv(files["pareto"], front)
        plot_front(
            files["plot"], rows, front,
            title=f"{prep.model.name} on {c.label}, seq {w.seq_length}, gbs {w.global_batch_size} ({src_word})",
            usable_gib=prep.estimates.usable_bytes / GIB, labelled=table_rows(front, top),
        )
        from launch.exporters import measurement_from_row
        from tuner.report import runs_note, ties_note

        best_row = next((r for r in rows if r["trial"] == best["trial"]), {})
        files.update(export_files(res.out_dir, prep.model, c, w, lay, study=res.study_name, calibration=prep.calibration,
                                  memory_headroom=cfg.memory_headroom, measurement=measurement_from_row(best_row, lay),
                                  notes=runs_note(best_row) + ties_note(rows, best["trial"]), megatron_core=prep.options.megatron_core))
        from tuner.report_html import ReportUnavailable, study_report

        try:
            files["report"] = study_report(res.out_dir / "report.html", study=res.study_name, model=prep.model, cluster=c, workload=w, rows=rows,
                                           front=front, backend=cfg.backend, calibration=prep.calibration, memory_headroom=cfg.memory_headroom,
                                           files={**{p.name: p for p in files.values()}, "config.yaml": res.out_dir / "config.yaml"})
        except ReportUnavailable as e:  # the study, the front and the recipe files are written: only the page is left out
            report_note = f"note: report.html was not written: {e}; `tune report --study {res.study_name}` writes it later"
    except OSError as e:
        raise TunerError(f"cannot write the results to {res.out_dir} ({e.strerror or e}: {e.filename}); the study and its trials are kept in {_mask(res.storage)}") from None
    out.print(
        f"\n[bold green]Best layout[/] ({best['source']}): [bold]{best['label']}[/], recompute {best['recompute']}, "
        f"offload {best['offload']}, {best['dispatcher']} dispatcher, micro-batch {best['micro_batch_size']}, layer split {best['layer_split']}"
    )
    out.print(
        f"  {best['source']}: {best['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, MFU {best['mfu']:.1%} (6 x N_active x tokens/s over dense bf16 peak), "
        f"${best['usd_per_million_tokens']:.2f} per 1M tokens, peak {best['peak_gib']:.1f} GiB "
        f"(headroom {best['headroom_gib']:.1f} GiB), step {best['step_time_s']:.2f} s"
    )
    if pls:
        out.print(f"  --pipeline-model-parallel-layout '{pls}'")
    if best["source"] == "predicted":
        lay = best["layout"]
        for gap in known_gaps(lay if isinstance(lay, Layout) else Layout.from_dict(lay), prep.model, prep.cluster.gpu, prep.calibration):
            out.print(f"  note: {gap}", markup=False)
        from tuner.report import predicted_ties_text

        tie = predicted_ties_text(rows, best["trial"])
        if tie is not None:
            out.print(f"  note: {tie}", markup=False)
    print_ties(rows, best)
    out.print("Files:")
    for p in files.values():
        out.print(f"  {p}", markup=False)
    if report_note:
        out.print(report_note, markup=False, soft_wrap=True)
    out.print(
        ("The recipe's status is 'predicted': confirm with real trials before training, and check "
         "convergence against a reference layout: " if best["source"] == "predicted" else
         "Before training on it, check convergence against a reference layout: ")
        + (shell_command("tune", "verify", *flags, "--trial", best["trial"], "--reference", "tp=1,pp=1,ep=1")
           if c.num_gpus <= c.gpus_per_node else
           "tune verify on a slice that fits one machine (a study with --layers N --gpus KxGPU; see README)"),
        markup=False, soft_wrap=True,  # a suggested command stays on one line, to paste
    )
