"""The ``tune`` command line (typer + rich).

``tune --model MiniMax-M2 --gpus 64xH200`` is the main job; subcommands:
``estimate``, ``check``, ``pareto``, ``export``, ``models``, ``gpus``.
User errors (:class:`TunerError`) print one red line to stderr and exit 2; the
traceback appears only with ``--debug``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specs.errors import InfeasibleLayout, TunerError

app = typer.Typer(
    name="tune",
    help="Parallel-layout tuner for Megatron-core training: predicts, searches and exports the fastest layout that fits.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)
# Wide enough for the Pareto table when output is piped (rich falls back to 80 columns).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
_DEBUG = {"on": False}

GIB = 2**30

# ---- shared option aliases ------------------------------------------------------------
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Preset name (see `tune models`) or a Hugging Face config.json path.", rich_help_panel="Job")]
GpusOpt = Annotated[str | None, typer.Option("--gpus", "-g", help="GPUs as COUNTxGPU (64xH200) or NODESxPER_NODExGPU (8x8xH200).", rich_help_panel="Job")]
PerNodeOpt = Annotated[int | None, typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU's usual server, 8 for HGX).", rich_help_panel="Cluster")]
NetOpt = Annotated[float | None, typer.Option("--network-gbps", help="Network bandwidth per node, Gb/s (default 3200: the seed's EFA).", rich_help_panel="Cluster")]
PriceOpt = Annotated[float | None, typer.Option("--usd-per-gpu-hour", help="Price per GPU-hour (default 7.91, the seed's).", rich_help_panel="Cluster")]
SeqOpt = Annotated[int, typer.Option("--seq-len", help="Tokens per row (--seq-length).", rich_help_panel="Workload")]
GbsOpt = Annotated[int, typer.Option("--global-batch", help="Rows per optimizer step (--global-batch-size).", rich_help_panel="Workload")]
PrecOpt = Annotated[str, typer.Option("--precision", help="bf16 or fp8.", rich_help_panel="Workload")]
HeadroomOpt = Annotated[float, typer.Option("--memory-headroom", help="Fraction of HBM kept free (default 0.10).", rich_help_panel="Search")]
CalOpt = Annotated[Path | None, typer.Option("--calibration", help="Calibration YAML overriding the cost model's constants.", rich_help_panel="Search")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="Study name (default: model-gpus-seq-gbs).", rich_help_panel="Study")]
StudyNameOpt = Annotated[str | None, typer.Option("--study", help="Study name (required; `tune` prints it, e.g. MiniMax-M2-8x8xH200-s8192-gbs128).", rich_help_panel="Study")]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (default sqlite:///results/<study>/study.db).", rich_help_panel="Study")]
ResultsOpt = Annotated[Path, typer.Option("--results-dir", help="Where study folders go.", rich_help_panel="Study")]


def _fail(e: BaseException) -> None:
    if _DEBUG["on"]:
        raise e
    msg = str(e).strip() or type(e).__name__
    if isinstance(e, InfeasibleLayout):
        msg = f"the layout breaks rule {e.rule_id}: {e.reason}"
    err.print(f"[bold red]error:[/] {escape(msg)}", markup=True, soft_wrap=True)
    raise typer.Exit(code=2)


def _require(value: Any, flag: str, example: str) -> Any:
    if value is None or value == "":
        raise TunerError(f"{flag} is required, e.g. {flag} {example}")
    return value


def _fmt_int(x: float) -> str:
    return f"{x:,.0f}"


@app.callback(invoke_without_command=True)
def main_job(
    ctx: typer.Context,
    model: ModelOpt = None,
    gpus: GpusOpt = None,
    gpus_per_node: PerNodeOpt = None,
    network_gbps: NetOpt = None,
    usd_per_gpu_hour: PriceOpt = None,
    seq_len: SeqOpt = 8192,
    global_batch: GbsOpt = 128,
    precision: PrecOpt = "bf16",
    space: Annotated[Path | None, typer.Option("--space", help="Search-space YAML (copy search_spaces/default_space.yaml).", rich_help_panel="Search")] = None,
    calibration: CalOpt = None,
    memory_headroom: HeadroomOpt = 0.10,
    trials: Annotated[int | None, typer.Option("--trials", help="Trials to run (default 48): the predicted front and fastest candidates first, then NSGA-II.", rich_help_panel="Search")] = None,
    backend: Annotated[str, typer.Option("--backend", help="model (analytical, default), local (real trials: the megatron-core harness under torchrun on this machine's GPUs), ray (the harness on a Ray cluster's nodes) or command (your slime / Megatron-LM launch command, --command-template).", rich_help_panel="Search")] = "model",
    layers: Annotated[int | None, typer.Option("--layers", help="Slice the model to its first N layers at full width, for the estimate and the trials.", rich_help_panel="Job")] = None,
    trial_steps: Annotated[int, typer.Option("--trial-steps", help="Optimizer steps per real trial, warm-up steps included.", rich_help_panel="Trials")] = 20,
    trial_warmup_steps: Annotated[int | None, typer.Option("--trial-warmup-steps", help="Leading steps of a real trial left out of its median step time (default: half of --trial-steps; MoE step times on H200 settled only after about 10 steps).", rich_help_panel="Trials")] = None,
    trial_timeout: Annotated[float, typer.Option("--trial-timeout", help="Seconds one real trial may run, model build included; then its process group is killed.", rich_help_panel="Trials")] = 900.0,
    command_template: Annotated[Path | None, typer.Option("--command-template", help="Launch template (YAML/JSON argv with placeholders) of --backend command; launch/templates/slime_command.yaml ships.", rich_help_panel="Trials")] = None,
    recalibrate_after: Annotated[int, typer.Option("--recalibrate-after", help="Real trials: refit the cost model to the measurements after every N measured trials and re-rank the candidates not yet run (0 = never).", rich_help_panel="Trials")] = 4,
    confirm_runs: Annotated[int, typer.Option("--confirm-runs", help="Real trials: after the search, bring the fastest measured layout and those within its noise (at most 4) to N more runs each, interleaved, and rank them by all their runs (0 = no).", rich_help_panel="Trials")] = 0,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster of --backend ray: auto, HOST:PORT or ray://HOST:PORT (default: start a local Ray instance).", rich_help_panel="Trials")] = None,
    parallel_trials: Annotated[int, typer.Option("--parallel-trials", help="Real trials this worker runs at once (--backend ray; each its own placement group).", rich_help_panel="Trials")] = 1,
    trial_env: Annotated[list[str] | None, typer.Option("--trial-env", help="NAME=VALUE for every rank of a real trial (--backend ray), repeatable, e.g. --trial-env NCCL_IB_HCA=mlx5.", rich_help_panel="Trials")] = None,
    prune_margin: Annotated[float, typer.Option("--prune-margin", help="Stop a real trial more than this fraction slower than the best so far (after its warm-up and 2 measured steps); negative = never.", rich_help_panel="Trials")] = 0.25,
    stack: Annotated[str, typer.Option("--stack", help="slime (default; leaves out allgather, which slime rewrites) or megatron.", rich_help_panel="Search")] = "slime",
    study: StudyOpt = None,
    storage: StorageOpt = None,
    results_dir: ResultsOpt = Path("results"),
    seed: Annotated[int, typer.Option("--seed", help="Sampler seed.", rich_help_panel="Study")] = 0,
    top: Annotated[int, typer.Option("--top", min=0, help="Rows of the Pareto table to print (0 = all).", rich_help_panel="Output")] = 15,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Find the fastest layout that fits: `tune --model MiniMax-M2 --gpus 64xH200`."""
    _DEBUG["on"] = _DEBUG["on"] or debug
    if ctx.invoked_subcommand is not None:
        return
    if model is None and gpus is None:
        out.print(ctx.get_help())
        raise typer.Exit(code=0)
    try:
        from tuner.study import TuneConfig

        if trials is not None and trials < 1:
            raise TunerError(f"--trials must be at least 1, got {trials}")
        if precision not in ("bf16", "fp8"):
            raise TunerError(f"--precision {precision!r}: accepted bf16 or fp8")
        cfg = TuneConfig(
            model=_require(model, "--model", "MiniMax-M2"),
            gpus=_require(gpus, "--gpus", "64xH200"),
            gpus_per_node=gpus_per_node,
            network_gbps=network_gbps,
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
            trial_timeout_s=trial_timeout,
            command_template=str(command_template) if command_template else None,
            ray_address=ray_address,
            recalibrate_after=recalibrate_after,
            confirm_runs=confirm_runs,
            parallel_trials=parallel_trials,
            trial_env=tuple(trial_env or ()),
            prune_margin=None if (prune_margin == prune_margin and prune_margin < 0) else prune_margin,  # NaN is rejected later
        )
        _run_main(cfg, top)
    except TunerError as e:
        _fail(e)


def _run_main(cfg: Any, top: int) -> None:
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
    n_rule = en.considered - len(en.valid)
    n_nofit = prep.n_valid - prep.n_fit
    out.print(f"Layouts considered: [bold]{_fmt_int(en.considered)}[/]")
    out.print(f"  break a Megatron rule: {_fmt_int(n_rule)}")
    for rid, cnt in sorted(en.rule_counts.items(), key=lambda kv: -kv[1]):
        if cnt:
            out.print(f"    {rid:<34} {_fmt_int(cnt):>12}")
    out.print(
        f"  valid: {_fmt_int(prep.n_valid)}; predicted not to fit in {prep.estimates.usable_bytes / GIB:.1f} GiB "
        f"({cfg.memory_headroom:.0%} headroom): {_fmt_int(n_nofit)}; candidates: [bold]{_fmt_int(prep.n_fit)}[/]"
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

    def on_trial(done: int, total: int) -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(task, completed=done, total=total)

    try:
        res = run_study(prep, on_trial=on_trial)
    except KeyboardInterrupt:
        if progress.live.is_started:
            progress.stop()
        err.print("[yellow]interrupted:[/] finished trials are kept in the study; re-run the same command to resume.")
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
    _print_front(front, top, title=f"Pareto front: tokens/s/GPU vs peak memory per GPU ({src_word})")
    if not front:
        raise TunerError("the study has no finished trial; nothing to export")
    best = front[0]
    lay = best["layout"]
    pls = pipeline_layout_of(lay, prep.model)
    files = {
        "pareto": res.out_dir / "pareto.csv",
        "plot": res.out_dir / "pareto.png",
    }
    try:
        write_pareto_csv(files["pareto"], front)
        plot_front(
            files["plot"], rows, front,
            title=f"{prep.model.name} on {c.label}, seq {w.seq_length}, gbs {w.global_batch_size} ({src_word})",
            usable_gib=prep.estimates.usable_bytes / GIB,
        )
        from launch.export import measurement_from_row
        from tuner.report import runs_note, ties_note

        best_row = next((r for r in rows if r["trial"] == best["trial"]), {})
        files.update(export_files(res.out_dir, prep.model, c, w, lay, study=res.study_name, calibration=prep.calibration,
                                  memory_headroom=cfg.memory_headroom, measurement=measurement_from_row(best_row, lay),
                                  notes=runs_note(best_row) + ties_note(rows, best["trial"])))
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
    _print_ties(rows, best)
    out.print("Files:")
    for kind, p in files.items():
        out.print(f"  {p}", markup=False)
    out.print(
        ("The recipe's status is 'predicted': confirm with real trials before training, and check "
         "convergence against a reference layout: " if best["source"] == "predicted" else
         "Before training on it, check convergence against a reference layout: ")
        + (f"tune verify --study {res.study_name} --trial {best['trial']} --reference tp=1,pp=1,ep=1"
           if c.num_gpus <= c.gpus_per_node else
           "tune verify on a slice that fits one machine (a study with --layers N --gpus KxGPU; see README)"),
        markup=False,
    )


def _print_ties(rows: list[dict[str, Any]], best: dict[str, Any]) -> None:
    """Say which measured trials the best one cannot be told apart from (tuner.report.measured_ties), after the
    runs of the layouts measured more than once (--confirm-runs)."""
    from tuner.report import TIE_Z, fastest_measured, long_label, measured_ties, runs_summary

    for r in sorted(rows, key=lambda r: -float(r.get("tokens_per_s_per_gpu") or 0)):
        text = runs_summary(r)
        if text is not None:
            warn = "[bold red]" if r.get("runs_failed") else ""
            out.print(f"  {warn}confirmed{'[/]' if warn else ''}: trial {r['trial']} ({escape(long_label(r))}): "
                      f"{r['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU over {escape(text)}")
    if best.get("source") != "measured":  # a study that mixes sources: against its fastest measured trial
        best = fastest_measured(rows)
        if best is None:
            return
    ties = measured_ties(rows, best["trial"])
    if not ties:
        return
    listed = "; ".join(f"trial {t['trial']} ({t['label']}): {t['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, {0.0 - t['gap']:+.1%}" for t in ties[:5])
    more = f"; and {len(ties) - 5} more" if len(ties) > 5 else ""
    out.print(
        f"  [yellow]within measurement noise of trial {best['trial']}[/] ({TIE_Z:g} standard errors of the difference of the median step times): "
        f"{escape(listed)}{more}. Their step times cannot rank these layouts; runs of one layout can differ by more than their "
        "own noise (docs/measurements.md), so treat them as equally fast and choose on memory, or re-measure them."
    )


def _print_front(front: list[dict[str, Any]], top: int, title: str) -> None:
    t = Table(title=title, title_justify="left", show_lines=False)
    for col, just in [
        ("trial", "right"), ("layout", "left"), ("recompute", "left"), ("offload", "left"), ("dispatcher", "left"),
        ("mbs", "right"), ("first/last", "left"), ("tokens/s/GPU", "right"), ("MFU (6N)", "right"), ("$/1M tok", "right"),
        ("peak GiB", "right"), ("headroom GiB", "right"), ("source", "left"),
    ]:
        t.add_column(col, justify=just, no_wrap=True)
    rows = front if top <= 0 else front[:top]
    for r in rows:
        lay = r["layout"]
        split = "even" if r["layer_split"] == "even" else f"{lay.num_layers_in_first_pipeline_stage}/{lay.num_layers_in_last_pipeline_stage}"
        t.add_row(
            str(r["trial"]), r["label"], r["recompute"].replace("selective ", "sel. ").replace("+", ","), "none" if r["offload"] == "none" else r["offload"].replace("optimizer ", "optim "),
            r["dispatcher"], str(r["micro_batch_size"]), split,
            f"{r['tokens_per_s_per_gpu']:,.1f}", f"{r['mfu']:.1%}", f"{r['usd_per_million_tokens']:.2f}",
            f"{r['peak_gib']:.1f}", f"{r['headroom_gib']:.1f}", r["source"],
        )
    out.print(t)
    if top > 0 and len(front) > top:
        out.print(f"  ({len(front) - top} more on the front: see pareto.csv or `tune pareto --top 0`)")


# ---- layout from flags (estimate, check) ------------------------------------------------


def _layout_from_flags(world: int, **kw: Any) -> Any:
    from specs.layout import Layout

    mods = tuple(m for m in (kw.pop("recompute_modules") or "").replace(" ", ",").split(",") if m)
    gran = kw.pop("recompute")
    if mods and gran != "selective":
        raise TunerError(f"--recompute-modules needs --recompute selective (got --recompute {gran})")
    if gran == "selective" and not mods:
        mods = ("core_attn",)  # Megatron's default --recompute-modules
    method = kw.pop("recompute_method")
    num = kw.pop("recompute_num_layers")
    if gran == "full":
        method = method or "uniform"
        num = 1 if num is None else num
    disp = kw.pop("dispatcher")
    tp = kw["tp"]
    sp = kw.pop("sequence_parallel")
    return Layout(
        world_size=world,
        sequence_parallel=(tp > 1) if sp is None else sp,
        recompute_granularity=gran,
        recompute_method=method or "none",
        recompute_num_layers=num or 0,
        recompute_modules=mods if gran == "selective" else (),
        dispatcher=disp,
        **kw,
    )


def _common_layout(
    tp: int, pp: int, vpp: int, cp: int, ep: int, etp: int, micro_batch_size: int, sequence_parallel: bool | None,
    recompute: str, recompute_method: str | None, recompute_num_layers: int | None, recompute_modules: str | None,
    offload: float, dispatcher: str, first: int, last: int, exp_avg_dtype: str, no_precision_aware: bool, no_distributed_optimizer: bool,
) -> dict[str, Any]:
    return dict(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel,
        recompute=recompute, recompute_method=recompute_method, recompute_num_layers=recompute_num_layers,
        recompute_modules=recompute_modules, optimizer_offload_fraction=offload, dispatcher=dispatcher,
        num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
        exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_dtype,
        use_precision_aware_optimizer=not no_precision_aware, use_distributed_optimizer=not no_distributed_optimizer,
    )


TpOpt = Annotated[int, typer.Option("--tp", help="--tensor-model-parallel-size", rich_help_panel="Layout")]
PpOpt = Annotated[int, typer.Option("--pp", help="--pipeline-model-parallel-size", rich_help_panel="Layout")]
VppOpt = Annotated[int, typer.Option("--vpp", help="virtual stages per pipeline rank (1 = none)", rich_help_panel="Layout")]
CpOpt = Annotated[int, typer.Option("--cp", help="--context-parallel-size", rich_help_panel="Layout")]
EpOpt = Annotated[int, typer.Option("--ep", help="--expert-model-parallel-size", rich_help_panel="Layout")]
EtpOpt = Annotated[int, typer.Option("--etp", help="--expert-tensor-parallel-size", rich_help_panel="Layout")]
MbsOpt = Annotated[int, typer.Option("--micro-batch-size", "--mbs", help="rows per micro-batch", rich_help_panel="Layout")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="default: on when tp > 1", rich_help_panel="Layout")]
RecOpt = Annotated[str, typer.Option("--recompute", help="none, selective or full", rich_help_panel="Layout")]
RecMethOpt = Annotated[str | None, typer.Option("--recompute-method", help="uniform or block (full only; default uniform)", rich_help_panel="Layout")]
RecNumOpt = Annotated[int | None, typer.Option("--recompute-num-layers", help="full only; default 1", rich_help_panel="Layout")]
RecModOpt = Annotated[str | None, typer.Option("--recompute-modules", help="selective only, comma-separated, e.g. core_attn,moe_act", rich_help_panel="Layout")]
OffOpt = Annotated[float, typer.Option("--optimizer-offload-fraction", help="0 (none) .. 1", rich_help_panel="Layout")]
DispOpt = Annotated[str, typer.Option("--dispatcher", help="alltoall, allgather, flex+deepep, flex+hybridep", rich_help_panel="Layout")]
FirstOpt = Annotated[int, typer.Option("--first-stage-layers", help="decoder layers on pipeline rank 0 (0 = even split)", rich_help_panel="Layout")]
LastOpt = Annotated[int, typer.Option("--last-stage-layers", help="decoder layers on the last pipeline rank (0 = even)", rich_help_panel="Layout")]
AvgOpt = Annotated[str, typer.Option("--exp-avg-dtype", help="Adam moments dtype: fp32 or bf16", rich_help_panel="Layout")]
NoPaOpt = Annotated[bool, typer.Option("--no-precision-aware-optimizer", help="turn off --use-precision-aware-optimizer", rich_help_panel="Layout")]
NoDoOpt = Annotated[bool, typer.Option("--no-distributed-optimizer", help="turn off --use-distributed-optimizer", rich_help_panel="Layout")]


def _inputs(model: str | None, gpus: str | None, gpus_per_node: int | None, network_gbps: float | None, usd: float | None, seq_len: int, global_batch: int, precision: str) -> tuple[Any, Any, Any]:
    from specs import Workload, load_model, parse_gpus

    if precision not in ("bf16", "fp8"):
        raise TunerError(f"--precision {precision!r}: accepted bf16 or fp8")
    m = load_model(_require(model, "--model", "MiniMax-M2"))
    c = parse_gpus(_require(gpus, "--gpus", "64xH200"), gpus_per_node=gpus_per_node,
                   inter_node_bytes_per_s=network_gbps * 1e9 / 8 if network_gbps is not None else None, usd_per_gpu_hour=usd)
    w = Workload(seq_length=seq_len, global_batch_size=global_batch, precision=precision)
    if precision == "fp8" and not c.gpu.peak_flops_fp8:
        raise TunerError(f"--precision fp8: {c.gpu.name} has no fp8 tensor cores; use --precision bf16")
    return m, c, w


@app.command()
def estimate(
    model: ModelOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None, network_gbps: NetOpt = None, usd_per_gpu_hour: PriceOpt = None,
    seq_len: SeqOpt = 8192, global_batch: GbsOpt = 128, precision: PrecOpt = "bf16",
    tp: TpOpt = 1, pp: PpOpt = 1, vpp: VppOpt = 1, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = 1, micro_batch_size: MbsOpt = 1,
    sequence_parallel: SpOpt = None, recompute: RecOpt = "none", recompute_method: RecMethOpt = None, recompute_num_layers: RecNumOpt = None,
    recompute_modules: RecModOpt = None, optimizer_offload_fraction: OffOpt = 0.0, dispatcher: DispOpt = "alltoall",
    first_stage_layers: FirstOpt = 0, last_stage_layers: LastOpt = 0, exp_avg_dtype: AvgOpt = "fp32",
    no_precision_aware_optimizer: NoPaOpt = False, no_distributed_optimizer: NoDoOpt = False,
    calibration: CalOpt = None, memory_headroom: HeadroomOpt = 0.10,
    layout_string: Annotated[str | None, typer.Option("--pipeline-layout", help="A --pipeline-model-parallel-layout string (sets VPP and the first/last split).", rich_help_panel="Layout")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as JSON.")] = False,
) -> None:
    """Predict one layout: memory per GPU (worst pipeline rank) and step time, with their parts."""
    try:
        from cost_model.calibration import load_calibration
        from cost_model.estimate import estimate as _estimate

        m, c, w = _inputs(model, gpus, gpus_per_node, network_gbps, usd_per_gpu_hour, seq_len, global_batch, precision)
        lay = _layout_from_flags(c.num_gpus, **_common_layout(tp, pp, vpp, cp, ep, etp, micro_batch_size, sequence_parallel, recompute, recompute_method, recompute_num_layers, recompute_modules, optimizer_offload_fraction, dispatcher, first_stage_layers, last_stage_layers, exp_avg_dtype, no_precision_aware_optimizer, no_distributed_optimizer))
        if layout_string is not None:
            lay, odd, _ = _apply_layout_string(lay, m, layout_string, vpp_given=vpp != 1, split_given=bool(first_stage_layers or last_stage_layers))
            if odd:
                raise TunerError(f"--pipeline-layout {layout_string!r} is valid for Megatron, but the cost model handles only even splits and first/last-rank splits; `tune check` accepts it")
        try:
            e = _estimate(m, c, w, lay, calibration=load_calibration(calibration), memory_headroom=memory_headroom)
        except InfeasibleLayout as ex:
            hint = _split_hint(m, lay) if ex.rule_id.startswith("pipeline_split") else ""
            raise TunerError(f"the layout breaks rule {ex.rule_id}: {ex.reason}{hint}") from None
    except TunerError as ex:
        _fail(ex)
        return
    from tuner.report import pipeline_layout_of

    d = e.to_dict()
    d["pipeline_model_parallel_layout"] = pipeline_layout_of(lay, m)
    if as_json:
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    out.print(f"[bold]{lay.label}[/] ({m.name} on {c.label}, seq {w.seq_length:,}, gbs {w.global_batch_size}) - [bold]predicted[/] by the analytical model")
    out.print(f"  recompute {lay.recompute_label}, offload {lay.offload_label}, {lay.dispatcher.value} dispatcher, micro-batch {lay.micro_batch_size}")
    if d["pipeline_model_parallel_layout"]:
        out.print(f"  --pipeline-model-parallel-layout '{d['pipeline_model_parallel_layout']}'")
    out.print(f"  predicted tokens/s/GPU {e.tokens_per_s_per_gpu:,.1f}; step {e.step_time_s:.2f} s; ${e.usd_per_million_tokens:.2f} per 1M tokens")
    out.print(f"  predicted MFU {e.mfu:.1%} (6 x N_active x tokens/s over dense bf16 peak, the seed's convention; no attention term); "
              f"model TFLOP/s/GPU {e.model_tflops_per_gpu:.0f} (Megatron's FLOPs formula, with attention)")
    fit = "fits" if e.fits else "[red]does NOT fit[/]"
    out.print(f"  predicted peak {e.peak_gib:.1f} GiB of {e.hbm_bytes / GIB:.1f} GiB ({fit} with {memory_headroom:.0%} headroom; headroom {e.headroom_gib:.1f} GiB)")
    t = Table(title="predicted memory per GPU (worst pipeline rank)", title_justify="left")
    t.add_column("part"); t.add_column("GiB", justify="right")
    for k, v in e.memory.items():
        t.add_row(k, f"{v / GIB:.2f}")
    out.print(t)
    t = Table(title="predicted step time", title_justify="left")
    t.add_column("part"); t.add_column("s", justify="right")
    for k, v in e.time.items():
        t.add_row(k, f"{v:.3f}")
    out.print(t)


@app.command()
def check(
    model: ModelOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None,
    seq_len: SeqOpt = 8192, global_batch: GbsOpt = 128, precision: PrecOpt = "bf16",
    tp: TpOpt = 1, pp: PpOpt = 1, vpp: VppOpt = 1, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = 1, micro_batch_size: MbsOpt = 1,
    sequence_parallel: SpOpt = None, recompute: RecOpt = "none", recompute_method: RecMethOpt = None, recompute_num_layers: RecNumOpt = None,
    recompute_modules: RecModOpt = None, optimizer_offload_fraction: OffOpt = 0.0, dispatcher: DispOpt = "alltoall",
    first_stage_layers: FirstOpt = 0, last_stage_layers: LastOpt = 0, exp_avg_dtype: AvgOpt = "fp32",
    no_precision_aware_optimizer: NoPaOpt = False, no_distributed_optimizer: NoDoOpt = False,
    layout_string: Annotated[str | None, typer.Option("--pipeline-layout", help="Check this --pipeline-model-parallel-layout string (it sets VPP and the first/last split).", rich_help_panel="Layout")] = None,
) -> None:
    """Is a layout valid under Megatron's rules? Lists every rule it breaks (exit 2 if any).

    With --pipeline-layout the string is checked with Megatron's layout grammar and rules, and the
    split (VPP, layers on the first and last rank) is taken from it instead of --vpp/--first/--last.
    """
    notes: list[str] = []
    try:
        from search_spaces.rules import POLICY_RULES, check_layout

        m, c, w = _inputs(model, gpus, gpus_per_node, None, None, seq_len, global_batch, precision)
        lay = _layout_from_flags(c.num_gpus, **_common_layout(tp, pp, vpp, cp, ep, etp, micro_batch_size, sequence_parallel, recompute, recompute_method, recompute_num_layers, recompute_modules, optimizer_offload_fraction, dispatcher, first_stage_layers, last_stage_layers, exp_avg_dtype, no_precision_aware_optimizer, no_distributed_optimizer))
        string_broken: list[tuple[str, str]] = []
        skip_split = False
        if layout_string is not None:
            try:
                lay, skip_split, note = _apply_layout_string(lay, m, layout_string, vpp_given=vpp != 1, split_given=bool(first_stage_layers or last_stage_layers))
                if note:
                    notes.append(note)
            except InfeasibleLayout as ex:
                string_broken.append((ex.rule_id, ex.reason))
                skip_split = True
        broken = string_broken + [
            (r, why) for r, why in check_layout(lay, m, w) if not (skip_split and r.startswith("pipeline_split"))
        ]
    except TunerError as ex:
        _fail(ex)
        return
    policy = [(r, why) for r, why in broken if r in POLICY_RULES]
    broken = [(r, why) for r, why in broken if r not in POLICY_RULES]
    if not broken:
        from tuner.report import pipeline_layout_of

        out.print(f"[green]valid[/]: {lay.label} ({escape(m.name)}, {c.num_gpus} GPUs, seq {w.seq_length}, gbs {w.global_batch_size})")
        pls = layout_string or pipeline_layout_of(lay, m)
        if pls:
            out.print(f"  --pipeline-model-parallel-layout '{pls}'", markup=False)
        for rid, reason in policy:
            out.print(f"  note [{rid}] (the tuner's own convention; Megatron accepts it): {reason}", markup=False)
        for note in notes:
            out.print(f"  note: {note}", markup=False)
        return
    out.print(f"[red]invalid[/]: {lay.label} breaks {len(broken)} rule(s):")
    for rid, reason in broken:
        hint = _split_hint(m, lay) if rid == "pipeline_split" and layout_string is None else ""
        out.print(f"  [{rid}] {reason}{hint}", markup=False)
    for rid, reason in policy:
        out.print(f"  note [{rid}] (the tuner's own convention; Megatron accepts it): {reason}", markup=False)
    raise typer.Exit(code=2)


def _split_hint(model: Any, lay: Any) -> str:
    """'; try --first-stage-layers F --last-stage-layers L' with the nearest split that works, or ''."""
    from search_spaces.pipeline import stage_layer_counts

    best = None
    for d in range(0, 2 * lay.pp * lay.vpp + 1):
        for df in sorted(range(d + 1), key=lambda x: (abs(2 * x - d), x)):  # symmetric first
            dl = d - df
            if (model.num_layers + df + dl) % lay.pp:
                continue
            mid = (model.num_layers + df + dl) // lay.pp
            try:
                stage_layer_counts(model.num_layers, lay.pp, lay.vpp, mid - df, mid - dl)
            except InfeasibleLayout:
                continue
            best = (mid - df, mid - dl)
            break
        if best:
            break
    return f"; try --first-stage-layers {best[0]} --last-stage-layers {best[1]}" if best else ""


def _apply_layout_string(lay: Any, model: Any, text: str, *, vpp_given: bool, split_given: bool) -> tuple[Any, bool, str]:
    """Take VPP and the first/last split from a ``--pipeline-model-parallel-layout`` string.

    Returns:
        (layout with vpp / first / last from the string, whether the split rules must be
        skipped because the string is valid but not of the first/last form, a note).

    Raises:
        InfeasibleLayout: the string breaks Megatron's grammar or layout rules, or
            contradicts --vpp / --first-stage-layers / --last-stage-layers.
    """
    from search_spaces.pipeline import LAYOUT_RULE_ID, layer_counts_from_string, stage_layer_counts

    counts = layer_counts_from_string(text, lay.pp, model.num_layers, model.mtp_num_layers)
    vpp_s = len(counts[0])
    if vpp_given and lay.vpp != vpp_s:
        raise InfeasibleLayout(LAYOUT_RULE_ID, f"the string has {len(counts) * vpp_s} stages = pp {lay.pp} x {vpp_s} virtual stages per rank, but --vpp is {lay.vpp}; leave --vpp out or make them agree")
    first, last = sum(counts[0]), sum(counts[-1])
    if split_given and (lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage) not in ((first, last), (0, 0)):
        raise InfeasibleLayout(
            LAYOUT_RULE_ID,
            f"the string puts {first} layers on the first rank and {last} on the last, but --first-stage-layers/--last-stage-layers say "
            f"{lay.num_layers_in_first_pipeline_stage}/{lay.num_layers_in_last_pipeline_stage}; leave them out (the string decides)",
        )
    for f, l in ((0, 0), (first, last)):
        try:
            if stage_layer_counts(model.num_layers, lay.pp, vpp_s, f, l) == counts:
                return lay.replace(vpp=vpp_s, num_layers_in_first_pipeline_stage=f, num_layers_in_last_pipeline_stage=l), False, ""
        except InfeasibleLayout:
            continue
    note = (f"the string is valid for Megatron but not of the first/last form the tuner generates and models "
            f"(per-rank layers {[sum(c) for c in counts]}); rules other than the split were checked")
    return lay.replace(vpp=vpp_s), True, note


def _load_study(study: str | None, storage: str | None, results_dir: Path) -> Any:
    import optuna

    name = _require(study, "--study", "MiniMax-M2-8x8xH200-s8192-gbs128")
    if not storage and not (results_dir / name / "study.db").exists():
        storage = _recorded_storage(results_dir / name / "config.yaml")
    url = storage or f"sqlite:///{(results_dir / name / 'study.db').as_posix()}"
    if not storage and not (results_dir / name / "study.db").exists():
        raise TunerError(f"--study {name!r}: no study database at {results_dir / name / 'study.db'}; run `tune --model ... --gpus ... --study {name}` first, or give --storage")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from tuner.study import open_storage

    try:
        return optuna.load_study(study_name=name, storage=open_storage(url, create=False))
    except KeyError:
        raise TunerError(f"--study {name!r}: no such study in {url}") from None
    except Exception as e:  # noqa: BLE001 - storage errors
        from tuner.study import _mask

        raise TunerError(f"--study {name!r}: cannot open {_mask(url)} ({type(e).__name__}: {_mask(str(e).splitlines()[0]) if str(e) else ''})") from None


def _recorded_storage(config_yaml: Path) -> str | None:
    """The --storage a study was run with, as its results/<study>/config.yaml records it (None if none)."""
    import yaml

    try:
        cfg = (yaml.safe_load(config_yaml.read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    st = cfg.get("storage")
    return st if isinstance(st, str) and st else None


def _study_context(st: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    from specs import Workload, parse_gpus
    from tuner.study import model_spec_from_dict

    cfg = st.user_attrs.get("config") or {}
    res = st.user_attrs.get("resolved") or {}
    if not cfg or not res or "model_spec" not in st.user_attrs:
        raise TunerError(f"study {st.study_name!r} was not made by `tune` (its inputs are not stored in it)")
    # The study stores what it was evaluated with: a moved or edited config.json does not change it.
    m = model_spec_from_dict(st.user_attrs["model_spec"])
    c = parse_gpus(f"{res['num_gpus']}x{res['gpu']}", gpus_per_node=res["gpus_per_node"],
                   inter_node_bytes_per_s=res["inter_node_bytes_per_s"], usd_per_gpu_hour=res["usd_per_gpu_hour"])
    w = Workload(seq_length=res["seq_length"], global_batch_size=res["global_batch_size"], precision=res.get("precision", "bf16"))
    return m, c, w, cfg


@app.command()
def pareto(
    study: StudyNameOpt = None, storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    top: Annotated[int, typer.Option("--top", min=0, help="Rows to print (0 = all).")] = 0,
    csv_out: Annotated[Path | None, typer.Option("--csv", help="Also write the front as CSV here.")] = None,
) -> None:
    """Show a study's Pareto front (throughput vs peak memory) with predicted vs measured values."""
    try:
        from tuner.report import front_rows, write_pareto_csv
        from tuner.study import trial_rows

        st = _load_study(study, storage, results_dir)
        m, c, w, cfg = _study_context(st)
        rows = trial_rows(st)
        front = front_rows(rows, m)
        if not front:
            raise TunerError(f"study {st.study_name!r} has no finished trial yet")
    except TunerError as ex:
        _fail(ex)
        return
    srcs = {r["source"] for r in front}
    out.print(f"Study [bold]{escape(st.study_name)}[/]: {escape(m.name)} on {c.label}, seq {w.seq_length:,}, gbs {w.global_batch_size}; "
              f"backend {escape(str(cfg.get('backend')))}; {len(rows)} layouts evaluated")
    _print_front(front, top, title=f"Pareto front ({' and '.join(sorted(srcs))})")
    _print_ties(rows, front[0])
    real = [t for t in st.trials if "pruned" in t.user_attrs or ("failure" in t.user_attrs and "pred_peak_gib" in t.user_attrs["failure"])]
    if any("pred_tokens_per_s_per_gpu" in r for r in rows) and ("measured" in srcs or real):
        t = Table(title="predicted vs measured (every real trial)", title_justify="left")
        for col in ("trial", "layout", "outcome", "pred tokens/s/GPU", "meas tokens/s/GPU", "err %", "pred GiB", "meas GiB"):
            t.add_column(col)
        lines = [(r["trial"], r["label"], "measured", r["pred_tokens_per_s_per_gpu"], r["tokens_per_s_per_gpu"], r["pred_peak_gib"], r["peak_gib"])
                 for r in rows if r.get("source") == "measured"]
        for tr in real:
            a = tr.user_attrs.get("pruned") or tr.user_attrs["failure"]
            if "pruned" in tr.user_attrs:
                tps = sorted(a.get("tokens_per_s_per_gpu", [])[2:]) or [float("nan")]
                lines.append((tr.number, a["label"], "pruned", a["pred_tokens_per_s_per_gpu"], tps[len(tps) // 2], a["pred_peak_gib"], float("nan")))
            else:
                lines.append((tr.number, a["label"], a["kind"], a["pred_tokens_per_s_per_gpu"], float("nan"), a["pred_peak_gib"], a.get("memory_reached_gib", float("nan"))))
        for n, label, outcome, ptps, mtps, pgib, mgib in sorted(lines):
            err = f"{(ptps / mtps - 1) * 100:+.1f}" if mtps == mtps and mtps else "-"
            t.add_row(str(n), label, outcome, f"{ptps:,.1f}", f"{mtps:,.1f}" if mtps == mtps else "-", err, f"{pgib:.1f}", f"{mgib:.1f}" if mgib == mgib else "-")
        out.print(t)
    for rec in st.user_attrs.get("recalibrations", []):
        if "error" in rec:
            out.print(f"refit after {rec['after_measured_trials']} measured trials failed ({rec['error']}); the previous constants were kept", markup=False)
        else:
            se = rec.get("step_median_abs_error")
            out.print(f"refit after {rec['after_measured_trials']} measured trials: step-time median error {se:.1%} in the fit" if se is not None else
                      f"refit after {rec['after_measured_trials']} measured trials", markup=False)
    if csv_out:
        try:
            write_pareto_csv(csv_out, front)
        except OSError as e:
            _fail(TunerError(f"--csv {str(csv_out)!r}: cannot write it ({e.strerror or e})"))
        out.print(f"wrote {csv_out}", markup=False)


@app.command("export")
def export_cmd(
    study: StudyNameOpt = None, storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    trial: Annotated[int | None, typer.Option("--trial", help="Trial number (default: the fastest on the front).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="recipe, slime or megatron")] = "recipe",
    out_file: Annotated[Path | None, typer.Option("--out", help="File to write (default: stdout).")] = None,
) -> None:
    """Export a study's layout as a recipe YAML, a slime run script or a Megatron-LM argument file."""
    try:
        from cost_model.estimate import estimate as _estimate
        from launch import export
        from specs.layout import Layout
        from tuner.report import pick_trial_row, runs_note, ties_note
        from tuner.study import trial_rows

        if fmt not in ("recipe", "slime", "megatron"):
            raise TunerError(f"--format {fmt!r}: accepted recipe, slime or megatron")
        st = _load_study(study, storage, results_dir)
        m, c, w, cfg = _study_context(st)
        rows = trial_rows(st)
        row = pick_trial_row(st.study_name, rows, m, trial, "export")
        lay = Layout.from_dict(row["layout"])
        if fmt == "recipe":
            from cost_model.calibration import Calibration

            cal = Calibration(**st.user_attrs["calibration"]) if "calibration" in st.user_attrs else Calibration()
            e = _estimate(m, c, w, lay, calibration=cal, memory_headroom=cfg.get("memory_headroom", 0.10))
            meas = export.measurement_from_row(row, lay)
            rec = export.recipe_dict(m, c, w, lay, estimate=e, measurement=meas, study=st.study_name,
                                     correctness=st.user_attrs.get(f"verify:{row['trial']}"), extra_notes=runs_note(row) + ties_note(rows, row["trial"]))
            export.validate_recipe(rec)
            text = export.dump_recipe(rec)
        elif fmt == "slime":
            text = export.slime_script(m, c, w, lay)
        else:
            text = export.megatron_args_script(m, c, w, lay)
    except TunerError as ex:
        _fail(ex)
        return
    if out_file:
        try:
            out_file.write_text(text)
        except OSError as e:
            _fail(TunerError(f"--out {str(out_file)!r}: cannot write ({e.strerror})"))
        err.print(f"wrote {out_file}")
    else:
        sys.stdout.write(text)


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


def main() -> None:
    """Console entry point: run the app; user errors exit 2 without a traceback."""
    if "--debug" in sys.argv[1:]:  # accepted anywhere, also after a subcommand
        _DEBUG["on"] = True
        sys.argv = [sys.argv[0], "--debug"] + [a for a in sys.argv[1:] if a != "--debug"]
    try:
        app()
    except TunerError as e:  # raised outside a command's own handler (or re-raised by _fail under --debug)
        if _DEBUG["on"]:
            raise
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug, not a user error: one line unless --debug
        if _DEBUG["on"] or "--debug" in sys.argv:
            raise
        err.print(f"[bold red]internal error:[/] {escape(f'{type(e).__name__}: {e}')} (re-run with --debug for the traceback, and report it)")
        sys.exit(1)



# ---- issue 3: `tune validate` and `tune calibrate` (tuner/cli_validate.py) ----
from tuner.cli_validate import register as _register_validate  # noqa: E402

_register_validate(app)

# ---- issue 6: `tune verify` (tuner/cli_verify.py) ----
from tuner.cli_verify import register as _register_verify  # noqa: E402

_register_verify(app)


if __name__ == "__main__":
    main()
