"""``tune rl`` (rank RL plans for a job: split, engines, trainer layout; export the best), ``tune rl validate --data
CSV`` (predict measured runs), ``tune rl calibrate --log FILE`` (fit this cluster's factors from a run's timing output).
Every number printed is a prediction unless it is labelled measured."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from launch.exporters import get_exporter
from rl.calibrate import fit_from_measured, mean_measured, read_log
from rl.calibration import DEFAULT_RL_CALIBRATION, RLCalibration, load_rl_calibration, save_rl_calibration
from rl.engine import Engine, GenerationPrecision
from rl.exporters import plan_context
from rl.layouts import TrainerLayout, parse_engine_layout, parse_trainer_layout
from rl.lengths import LengthDistribution
from rl.plan import (
    Framework,
    PlanSet,
    RLJob,
    RLPlan,
    check_async_steps,
    enumerate_plans,
    evaluate,
    evaluate_layouts,
    layout_trainer,
    splits,
)
from rl.trainer import TrainerBackend
from rl.validate import predict_rows, read_runs, summarise
from specs import Precision, load_model, parse_gpus
from specs.console import Col, fitted_table, say
from specs.console import err as _err
from specs.console import out as _out
from specs.errors import TunerError
from specs.files import write_output
from specs.study_files import check_output_path

__all__ = ["rl_app"]

rl_app = typer.Typer(help="RL post-training: split GPUs between trainer and generation, shape both, export a recipe.",
                     no_args_is_help=False, add_completion=False)

Model = Annotated[str, typer.Option("--model", help="Model preset (tune models) or config.json path.")]
Gpus = Annotated[str, typer.Option("--gpus", help="Nodes x GPUs per node x GPU type, e.g. 32x8xH200.")]
FrameworkOpt = Annotated[Framework, typer.Option("--framework", help="nemo-rl or slime.")]
EngineOpt = Annotated[Engine | None, typer.Option("--engine",
                                                  help="vllm or sglang (default: vllm for nemo-rl, sglang for slime).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
CalOpt = Annotated[Path | None, typer.Option("--calibration", help="RL calibration YAML from `tune rl calibrate`.")]
ForceOpt = Annotated[bool, typer.Option("--force", help=(
    "Replace an output that is a link (the link, not its target) or another kind of file."))]



def _fail(e: TunerError) -> typer.Exit:
    say(escape(str(e)), label="[bold red]error:[/]", indent=0, console=_err)  # as `tune` prints its errors
    return typer.Exit(code=2)


def _job(model: str, gpus: str, framework: Framework, engine: Engine | None, *, mean_prompt_len: float | None,
         mean_response_len: float | None, response_lengths: Path | None = None, training_precision: str = "bf16",
         **fields: Any) -> RLJob:
    """The job the options describe; ``fields`` (``prompt_len``, ``response_len``, ...) go to :class:`RLJob` as they
    are.

    Raises TunerError: an unknown model or GPU, slime with vLLM, bad lengths, an unknown training precision."""
    m = load_model(model, allow_config_args=True)
    cl = parse_gpus(gpus)
    eng = engine or (Engine.sglang if framework == Framework.slime else Engine.vllm)
    if framework == Framework.slime and eng != Engine.sglang:
        raise TunerError("--framework slime generates with SGLang; use --engine sglang")
    longest = fields["response_len"]
    dist = (LengthDistribution.from_file(response_lengths, max_len=longest) if response_lengths is not None else
            LengthDistribution.from_mean_max(longest / 2 if mean_response_len is None else mean_response_len, longest))
    try:
        precision = Precision(training_precision)
    except ValueError:
        raise TunerError(f"--training-precision {training_precision!r}: accepted "
                         f"{', '.join(p.value for p in Precision)}") from None
    return RLJob(model=m, cluster=cl, framework=framework, engine=eng, responses=dist, training_precision=precision,
                 mean_prompt_len=fields["prompt_len"] / 4 if mean_prompt_len is None else mean_prompt_len, **fields)


def _plan_dict(p: RLPlan) -> dict[str, Any]:
    c = p.choice
    return {
        "colocated": c.colocated,
        "rollout_gpus": c.rollout_gpus,
        "trainer_gpus": c.trainer_gpus,
        "engines": c.num_engines,
        "rollout_layout": p.rollout_label,
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "max_num_seqs": c.max_num_seqs,
        "enforce_eager": c.enforce_eager,
        "async_steps": c.async_steps,
        "trainer_layout": p.trainer.label,
        "predicted": {**{k: v for k, v in dataclasses.asdict(p.parts).items() if k.endswith("_s")},
                      "step_time_s": p.step_time_s},
        "kv_capacity_tokens": p.kv_capacity_tokens,
        "preemptions": p.preemptions,
        "notes": list(p.notes),
    }


def _distinct(plans: list[RLPlan], top: int) -> list[RLPlan]:
    """The fastest plans that differ in split, engine shape, eagerness, trainer or K (util / max_num_seqs ties
    dropped)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for p in plans:
        c = p.choice
        key = (c.colocated, c.rollout_gpus, c.shape, c.enforce_eager, p.trainer.label, c.async_steps)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
        if len(out) >= top:
            break
    return out


def _short(label: str) -> str:
    """``megatron:tp=2,cp=1,ep=8,pp=4,vpp=1`` -> ``megatron tp2 ep8 pp4``; ``vllm:tp=8,ep=1,pp=1`` -> ``vllm tp8``
    (sizes of 1 left out, as the main job's layouts)."""
    head, _, body = label.partition(":")
    sizes = [f"{k}{v}" for k, v in (kv.split("=", 1) for kv in body.split(",") if "=" in kv) if v != "1"]
    return " ".join([head, *sizes])


#: The columns of the plan tables, each with its definition in the legend under them and when it goes at a narrow
#: width (``Col.drop``: the highest first; 0 stays). docs/rl.md, "Reading the output", defines them at length.
_COLUMNS: tuple[tuple[Col, str], ...] = (
    (Col("#", "right"), ""),
    (Col("GPUs"), "rollout+trainer GPUs, or colocated (both on all)"),
    (Col("engines"), "engines x parallel sizes (1s left out)"),
    (Col("mem", "right", 7), "gpu_memory_utilization"),
    (Col("seqs", "right", 8), "max_num_seqs"),
    (Col("graphs", "left", 9), "CUDA graphs or eager"),
    (Col("trainer"), ""),
    (Col("K", "right", 3), "async depth"),
    (Col("step s", "right"), "predicted seconds per step"),
    (Col("gen", "right", 1), "generation"),
    (Col("logprob", "right", 4), "log-prob passes"),
    (Col("train", "right", 2), "training"),
    (Col("refit", "right", 5), "weights to the engines"),
    (Col("switch", "right", 6), "colocated phase change"),
    (Col("note"), ""),
)


def _print_plans(title: str, plans: list[RLPlan], *, async_steps: int) -> list[str]:
    """One table of ``plans`` in the columns that fit the terminal (every field is in ``--json``), then its notes, each
    once, numbered as the ``note`` column names them. Returns the headers shown."""
    notes: dict[str, int] = {}
    rows = []
    for i, p in enumerate(plans, 1):
        c, pt = p.choice, p.parts
        ids = ",".join(str(notes.setdefault(n, len(notes) + 1)) for n in p.notes)
        rows.append([
            str(i), "colocated" if c.colocated else f"{c.rollout_gpus}+{c.trainer_gpus}",
            f"{c.num_engines}x {_short(p.rollout_label)}",
            f"{c.gpu_memory_utilization:g}", str(c.max_num_seqs), "eager" if c.enforce_eager else "graphs",
            _short(p.trainer.label),
            str(c.async_steps), f"{pt.step_time_s:.1f}", f"{pt.generation_s:.1f}", f"{pt.logprob_s:.1f}",
            f"{pt.training_s:.1f}",
            f"{pt.refit_s:.1f}", f"{pt.switch_s:.1f}", ids,
        ])
    # K only where the search tried more than one depth; note only where a plan has one
    shown = [i for i, (col, _) in enumerate(_COLUMNS) if not (col.header == "K" and not async_steps)
             and not (col.header == "note" and not notes)]
    _out.print(title, markup=False)
    t = fitted_table([_COLUMNS[i][0] for i in shown], [[r[i] for i in shown] for r in rows], console=_out)
    _out.print(t)
    for text, n in notes.items():
        say(text, label=f"note {n}:", markup=False, console=_out)
    return [str(c.header) for c in t.columns]


def _legend(headers: list[str]) -> str:
    """One line (wrapped at whole words) defining the columns ``headers`` of a table."""
    what = dict((c.header, w) for c, w in _COLUMNS)
    return "; ".join(f"{h}: {what[h]}" for h in headers if what.get(h)) + " (docs/rl.md#reading-the-output)"


def _print_recommended(best: RLPlan, rank: int, framework: Framework, note: str, *, hint: bool, shown: int) -> None:
    """The plan ``tune rl`` exports (the fastest inside the trainer's validated scope), first and in full; ``rank`` is
    its place in the ranked plans, of which the table below shows ``shown``."""
    c, pt = best.choice, best.parts
    where = (f"colocated on all {c.rollout_gpus} GPUs" if c.colocated
             else f"{c.rollout_gpus} rollout GPUs + {c.trainer_gpus} trainer GPUs")
    place = f"#{rank} of the fastest plans below" if rank <= shown else f"#{rank} of the ranking; --top {rank} shows it"
    _out.print(f"[bold green]Recommended plan[/] (predicted, {place}): [bold]{pt.step_time_s:.1f} s[/] per step")
    _out.print(f"  {where}, async depth K {c.async_steps}", markup=False)
    _out.print(f"  engines: {c.num_engines} x {best.rollout_label}, {'eager' if c.enforce_eager else 'CUDA graphs'}",
               markup=False)
    _out.print(f"    gpu_memory_utilization {c.gpu_memory_utilization:g}, max_num_seqs {c.max_num_seqs}", markup=False)
    _out.print(f"  trainer: {best.trainer.label}", markup=False)
    parts = [("generation", pt.generation_s), ("log-probs", pt.logprob_s), ("training", pt.training_s),
             ("refit", pt.refit_s)]
    if c.colocated:
        parts.append(("switch", pt.switch_s))
    say(", ".join(f"{k} {v:.1f}" for k, v in parts), label="seconds:", markup=False, console=_out)
    if note:
        say(note, label="note:", markup=False, console=_out)
    if hint:
        what = ("slime launch (run_slime_rl.sh)" if framework == Framework.slime
                else "NeMo-RL recipe (nemo_rl_grpo.yaml)")
        _out.print(f"  --out DIR writes its {what}", markup=False)


def _check_plan_options(job: RLJob, *, async_steps: int, colocated: bool | None, rollout_gpus: int | None,
                        engine_tp: int | None, engine_ep: int | None, gpu_memory_utilization: float | None,
                        max_num_seqs: int | None, top: int, trainer_layout: TrainerLayout | None,
                        trainer_layout_text: str | None) -> None:
    """Every search option of ``tune rl`` checked before anything is simulated (the job's own fields are
    :class:`RLJob`'s); the first bad one raises, naming the option and what it accepts."""
    cl, per = job.cluster, job.cluster.gpus_per_node
    check_async_steps(async_steps)
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:  # NaN fails too
        raise TunerError(f"--gpu-memory-utilization {gpu_memory_utilization:g}: must be in (0, 1] (the fraction of "
                         "each GPU's memory an engine takes)")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise TunerError(f"--max-num-seqs {max_num_seqs}: must be at least 1 (sequences an engine runs at once)")
    if top < 1:
        raise TunerError(f"--top {top}: must be at least 1 (plans to print)")
    tried = splits(cl, colocated, None if rollout_gpus is None else [rollout_gpus])

    # an engine's GPUs divide a node, or are whole nodes (vLLM / SGLang place ranks node by node)
    def tiles(g: int) -> bool:
        return g >= 1 and ((g <= per and per % g == 0) or (g > per and g % per == 0))

    if engine_tp is not None and (not tiles(engine_tp) or engine_tp > cl.num_gpus):
        divisors = [d for d in range(1, per + 1) if per % d == 0]
        raise TunerError(
            f"--engine-tp {engine_tp}: an engine's GPUs must divide a node's {per} GPUs or be whole nodes of "
            f"{cl.label}; accepted: {', '.join(map(str, divisors))} or a multiple of {per} up to {cl.num_gpus}"
        )
    if engine_ep is not None:
        m = job.model

        def engine_fits(g: int) -> bool:  # an engine of g GPUs tiles nodes and some split's rollout GPUs
            return tiles(g) and any(r % g == 0 for _, r in tried)

        def ep_fits(e: int) -> bool:
            if e == 1:
                return True
            if not m.is_moe or e > m.num_experts:
                return False
            # the search pairs EP with a TP it divides, or spreads it over TP x attention-DP ranks
            if engine_tp is None:
                return engine_fits(e)
            return engine_tp % e == 0 if e <= engine_tp else e % engine_tp == 0 and engine_fits(e)

        if not ep_fits(engine_ep):
            ok = [e for e in range(1, max(r for _, r in tried) + 1) if ep_fits(e)]
            if engine_ep < 1:
                why = "must be at least 1 (1 = experts tensor-parallel)"
            elif not m.is_moe:
                why = f"{m.name} is dense (no experts to shard)"
            else:
                why = (
                    f"an engine's experts are sharded over its GPUs, which divide a node's {per} GPUs or are whole "
                    f"nodes tiling the rollout GPUs ({m.num_experts} experts)"
                    + ("" if engine_tp is None
                       else f"; with --engine-tp {engine_tp}, EP divides it or is a multiple of it")
                )
            raise TunerError(f"--engine-ep {engine_ep}: {why}; accepted: {', '.join(map(str, ok))}")
    if trainer_layout is not None:
        sizes = [cl.num_gpus if c else cl.num_gpus - r for c, r in tried]
        first = ""
        for n in sizes:
            try:
                layout_trainer(job, n, trainer_layout)
                return
            except TunerError as e:
                first = first or str(e)
        raise TunerError(
            f"--trainer-layout {trainer_layout_text!r}: fits no trainer size this search tries "
            f"({', '.join(map(str, sizes))} GPUs); {first}"
        )


@rl_app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    model: Model = "",
    gpus: Gpus = "",
    framework: FrameworkOpt = Framework.nemo_rl,
    engine: EngineOpt = None,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Longest prompt (tokens).")] = 2048,
    response_len: Annotated[int, typer.Option("--response-len", help="Longest response (tokens).")] = 6144,
    mean_prompt_len: Annotated[float | None, typer.Option(
        "--mean-prompt-len", help="Mean prompt tokens (default: a quarter of --prompt-len, an assumption).")] = None,
    mean_response_len: Annotated[float | None, typer.Option(
        "--mean-response-len", help="Mean response tokens (default: half of --response-len, an assumption).")] = None,
    response_lengths: Annotated[Path | None, typer.Option("--response-lengths", help=(
        "Histogram of response lengths from a previous run (CSV response_len,count; JSON; one per line)."))] = None,
    prompts_per_step: Annotated[int, typer.Option("--prompts-per-step", help="Prompts per step.")] = 32,
    generations_per_prompt: Annotated[int, typer.Option("--generations-per-prompt")] = 16,
    max_seq_len: Annotated[int, typer.Option(
        "--max-seq-len", help="max_total_sequence_length (default prompt + response).")] = 0,
    train_global_batch: Annotated[int, typer.Option(
        "--train-global-batch", help="Sequences per optimizer step (default: all of a step).")] = 0,
    logprob_passes: Annotated[int, typer.Option(
        "--logprob-passes", help="Forward passes for log-probs (2 = policy + reference for KL; 1 without KL).")] = 2,
    generation_precision: Annotated[GenerationPrecision, typer.Option("--generation-precision", help=(
        "Engine weights: bf16, fp8 (block-scaled FP8, NeMo-RL vllm_cfg.precision fp8) or checkpoint (the "
        "checkpoint's own)."))] = GenerationPrecision.bf16,
    training_precision: Annotated[str, typer.Option(
        "--training-precision", help="Trainer GEMMs: bf16, fp8, fp8_blockwise, mxfp8 or nvfp4.")] = "bf16",
    async_steps: Annotated[int, typer.Option(
        "--async-steps", help="Evaluate non-colocated plans at each async depth 0..K (K at most 8).")] = 0,
    colocated: Annotated[bool | None, typer.Option(
        "--colocated/--no-colocated", help="Only colocated / only split plans (default both).")] = None,
    rollout_gpus: Annotated[int | None, typer.Option(
        "--rollout-gpus", help="Only this many rollout GPUs (whole nodes).")] = None,
    engine_tp: Annotated[int | None, typer.Option("--engine-tp")] = None,
    engine_ep: Annotated[int | None, typer.Option("--engine-ep")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option("--gpu-memory-utilization", help=(
        "Only this KV memory fraction, in (0, 1] (default: 0.6 and 0.8 colocated, 0.8 and 0.9 split)."))] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        "--max-num-seqs", help="Only this max_num_seqs, at least 1 (default: 256 and 1024).")] = None,
    enforce_eager: Annotated[bool | None, typer.Option(
        "--enforce-eager/--cuda-graphs", help="Only eager / only CUDA-graph engines (default both).")] = None,
    trainer_backend: Annotated[str, typer.Option(
        "--trainer-backend", help="megatron, automodel or all (nemo-rl default all; slime megatron).")] = "",
    trainer_layout: Annotated[str | None, typer.Option("--trainer-layout", help=(
        "Fix the trainer: megatron:tp=..,cp=..,ep=..,pp=..,vpp=.. or automodel:cp=..,ep=.."))] = None,
    calibration: CalOpt = None,
    top: Annotated[int, typer.Option("--top", help="Plans to print.")] = 10,
    out: Annotated[Path | None, typer.Option("--out", help=(
        "Write the best plan's launch into this folder: nemo_rl_grpo.yaml (nemo-rl) or run_slime_rl.sh (slime, "
        "executable)."))] = None,
    export: Annotated[Path | None, typer.Option(
        "--export", help="Write the best plan's launch to this file instead (same formats as --out).")] = None,
    json_out: JsonOpt = False,
    force: ForceOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Say why each set-aside plan was set aside.")] = False,
) -> None:
    """Rank RL plans for a job: colocated or split, engine shapes, trainer layouts, async depth."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        if not model or not gpus:
            raise TunerError("tune rl needs --model and --gpus (e.g. --model MiniMax-M3 --gpus 32x8xH200)")
        job = _job(model, gpus, framework, engine, mean_prompt_len=mean_prompt_len,
                   mean_response_len=mean_response_len, response_lengths=response_lengths,
                   training_precision=training_precision, prompt_len=prompt_len, response_len=response_len,
                   prompts_per_step=prompts_per_step, generations_per_prompt=generations_per_prompt,
                   max_seq_len=max_seq_len, train_global_batch_size=train_global_batch, logprob_passes=logprob_passes,
                   generation_precision=generation_precision)
        cal = load_rl_calibration(calibration) if calibration else DEFAULT_RL_CALIBRATION
        tl = parse_trainer_layout(trainer_layout, "--trainer-layout") if trainer_layout else None
        backends = _backends(framework, trainer_backend)
        _check_plan_options(job, async_steps=async_steps, colocated=colocated, rollout_gpus=rollout_gpus,
                            engine_tp=engine_tp, engine_ep=engine_ep, gpu_memory_utilization=gpu_memory_utilization,
                            max_num_seqs=max_num_seqs, top=top, trainer_layout=tl, trainer_layout_text=trainer_layout)
        ps = enumerate_plans(
            job, calibration=cal, backends=backends, async_steps=async_steps, colocated=colocated,
            rollout_gpus=None if rollout_gpus is None else [rollout_gpus],
            engine_tp=None if engine_tp is None else [engine_tp], engine_ep=None if engine_ep is None else [engine_ep],
            gpu_memory_utilization=None if gpu_memory_utilization is None else [gpu_memory_utilization],
            max_num_seqs=(256, 1024) if max_num_seqs is None else (max_num_seqs,),
            enforce_eager=(False, True) if enforce_eager is None else (enforce_eager,), trainer_layout=tl,
        )
        best, rec_note, export_note = _plan_to_export(ps)
        written = _write_launch(best, job, framework, out=out, export=export, force=force)
    except TunerError as e:
        raise _fail(e) from None
    if json_out:
        _print_plan_json(job, framework, cal, ps, best, top=top, written=written, export_note=export_note)
        return
    _print_plan_text(job, framework, cal, ps, best, rec_note, top=top, written=written, verbose=verbose,
                     async_steps=async_steps)


def _backends(framework: Framework, trainer_backend: str) -> tuple[TrainerBackend, ...]:
    """The trainer backends ``--trainer-backend`` names ("" or ``all``: the framework's).

    Raises TunerError: a name that is not a backend."""
    if trainer_backend in ("", "all"):
        return (TrainerBackend.megatron,) if framework == Framework.slime else (TrainerBackend.megatron,
                                                                                TrainerBackend.automodel)
    try:
        return (TrainerBackend(trainer_backend),)
    except ValueError:
        raise TunerError(f"--trainer-backend {trainer_backend!r}: accepted megatron, automodel or all") from None


def _plan_to_export(ps: PlanSet) -> tuple[RLPlan, str, str]:
    """The plan to export: the fastest whose trainer layout is known to run (inside its backend's validated scope; a
    faster plan outside it is printed first but not exported); then why it is not plan 1 in the report's words and in
    ``--json``'s ("" when it is)."""
    first = ps.plans[0]
    best = next((p for p in ps.plans if p.trainer.in_validated_scope), first)
    if not best.trainer.in_validated_scope:
        return best, f"no plan's trainer is inside its validated scope; this one is {best.trainer.note}", (
            "no plan's trainer layout is inside the backend's validated scope; the export is plan 1, "
            f"{best.trainer.note}")
    if best is first:
        return best, "", ""
    gain = 1 - first.step_time_s / best.step_time_s
    faster = f"{gain:.1%} faster" if gain >= 0.0005 else "as fast"
    return best, f"plan 1 is predicted {faster} but {first.trainer.note}", (
        f"the export is the fastest plan inside the trainer's validated scope ({best.step_time_s:.1f} s per step); "
        f"plan 1 is predicted {faster}{'' if gain >= 0.0005 else ' (within 0.1%)'} ({first.step_time_s:.1f} s per "
        f"step) but {first.trainer.note}")


def _write_launch(best: RLPlan, job: RLJob, framework: Framework, *, out: Path | None, export: Path | None,
                  force: bool) -> list[Path]:
    """Write ``best``'s launch in the framework's format to ``--export FILE`` and into ``--out DIR``; the files written.

    Raises TunerError: a plan the format cannot run, an ``--out`` that is a file, or an output
    :func:`check_output_path` refuses."""
    written: list[Path] = []
    if export is not None or out is not None:
        exporter = get_exporter("slime-rl" if framework == Framework.slime else "nemo-rl")
        text = exporter.render(plan_context(best, job))
        for target, what in ((export, "--export"), (None if out is None else out / exporter.file_name, "--out")):
            if target is not None:
                if what == "--out" and out is not None and not out.is_dir() and out.parent.is_dir():
                    if out.exists() or out.is_symlink():
                        raise TunerError(f"--out {str(out)!r} is a file, not a folder; give a folder (it is made when "
                                         "missing), or --export FILE to write the launch to a file")
                    out.mkdir()  # the folder named, not the ones above it
                check_output_path(what, target, force=force)
                written.append(exporter.save(text, target, force=force))
    return written


def _print_plan_json(job: RLJob, framework: Framework, cal: RLCalibration, ps: PlanSet, best: RLPlan, *, top: int,
                     written: list[Path], export_note: str) -> None:
    """``tune rl --json``: the ranked plans, the recommended one and what was written, as one JSON document."""
    _out.print_json(json.dumps({
        "model": job.model.name, "cluster": job.cluster.label, "framework": str(framework), "engine": str(job.engine),
        "responses": job.responses.source, "calibration": cal.source, "considered": ps.considered,
        "rejected": ps.rejected,
        "plans": [_plan_dict(p) for p in _distinct(ps.plans, top)],
        "fastest_per_rollout_gpus": [_plan_dict(p) for p in ps.fastest_per_rollout_gpus()],
        "fastest_per_async_depth": [_plan_dict(p) for p in ps.fastest_per_async_depth()],
        "written": [str(w) for w in written],
        "recommended_plan": _plan_dict(best),
        "exported_plan": _plan_dict(best) if written else None,
        "export_note": export_note or None,
        "note": "every number is a prediction; nothing was measured",
    }))


def _print_plan_text(job: RLJob, framework: Framework, cal: RLCalibration, ps: PlanSet, best: RLPlan, rec_note: str, *,
                     top: int, written: list[Path], verbose: bool, async_steps: int) -> None:
    """``tune rl``'s report: the job, the recommended plan, the counts, the plan tables and the files written."""
    _out.print(f"[bold]{escape(job.model.name)}[/] on {job.cluster.label}, {framework} + {job.engine}: "
               f"{job.prompts_per_step} prompts x {job.generations_per_prompt} generations a step", highlight=False)
    say(f"prompt <= {job.prompt_len:,}, response <= {job.response_len:,} tokens ({job.responses.source}); calibration: "
        f"{cal.source}",
        markup=False, console=_out)
    _out.print("Every number is a prediction (simulated rollout, analytical trainer).")
    ranked = _distinct(ps.plans, len(ps.plans))
    rank = next(i for i, p in enumerate(ranked, 1) if p.choice == best.choice and p.trainer.label == best.trainer.label)
    _print_recommended(best, rank, framework, rec_note, hint=not written, shown=top)
    _out.print()
    # plans set aside add up with the evaluated ones to the considered; a split without a trainer layout is counted as a
    # split
    plan_rej = {k: v for k, v in ps.rejected.items() if not k.endswith("(splits)")}
    split_rej = {k.removesuffix(" (splits)"): v for k, v in ps.rejected.items() if k.endswith("(splits)")}
    counts = f"Plans considered: {ps.considered:,}; evaluated: {len(ps.plans):,}; set aside: "
    if verbose:
        say(counts + (", ".join(f"{k} ({v})" for k, v in plan_rej.items()) or "none")
            + ("; splits not tried: " + ", ".join(f"{k} ({v} split{'s' if v != 1 else ''})" for k,
                                                  v in split_rej.items()) if split_rej else ""),
            indent=0, hang=2, markup=False, console=_out)
    else:
        say(counts + f"{sum(plan_rej.values()):,}" + (f"; splits not tried: {sum(split_rej.values()):,}"
                                                      if split_rej else "")
            + " (--verbose says why)", indent=0, hang=2, markup=False, console=_out)
    headers = _print_plans("Fastest plans (predicted seconds per step)", ranked[:top], async_steps=async_steps)
    _print_plans("Fastest plan per rollout-GPU count (every count, not a Pareto front)", ps.fastest_per_rollout_gpus(),
                 async_steps=async_steps)
    if async_steps:
        _print_plans("Fastest plan per async depth K (staleness)", ps.fastest_per_async_depth(),
                     async_steps=async_steps)
    say(_legend(headers), indent=0, hang=2, markup=False, console=_out)
    for w in written:
        _out.print("wrote the recommended plan's "
                   f"{'slime launch' if framework == Framework.slime else 'NeMo-RL recipe'} to {w}", highlight=False,
                   markup=False)


_PARTS = ("generation_s", "logprob_s", "training_s", "refit_s", "switch_s")


@rl_app.command("validate")
def validate_cmd(
    data: Annotated[Path, typer.Option("--data", help="CSV of measured RL runs (benchmarks/data/rl_runs.csv).")],
    calibration: CalOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predict every measured run of a CSV; print the step-time error per row and in summary."""
    try:
        rows, errors = read_runs(data)
        cal = load_rl_calibration(calibration) if calibration else DEFAULT_RL_CALIBRATION
    except TunerError as e:
        raise _fail(e) from None
    results = predict_rows(rows, calibration=cal)
    summary = summarise(results)
    unreadable = errors + [r.error for r in results if r.plan is None]
    if json_out:
        _out.print_json(json.dumps({
            "calibration": cal.source,
            "rows": [{"line": r.row.line, "run": r.row.label, "measured_step_time_s": r.row.step_time_s,
                      "predicted": None if r.plan is None else _plan_dict(r.plan)["predicted"],
                      "step_error": r.rel_error("step"), "generation_error": r.rel_error("generation"),
                      "training_error": r.rel_error("training"),
                      "error": r.error} for r in results],
            "unreadable": errors, "summary": summary,
        }))
        return
    _out.print(f"Measured vs predicted step time ({data}; calibration: {cal.source})", markup=False)
    cols = [Col("line", "right"), Col("run"), Col("measured s", "right"), Col("predicted s", "right"),
            Col("error", "right"), Col("gen", "right", 1), Col("logprob", "right", 3), Col("train", "right", 2),
            Col("refit", "right", 4), Col("switch", "right", 5)]
    table_rows = [[str(r.row.line), r.row.label, f"{r.row.step_time_s:g}", f"{r.plan.parts.step_time_s:.1f}",
                   f"{r.rel_error('step'):+.0%}", *(f"{getattr(r.plan.parts, k):.1f}" for k in _PARTS)]
                  for r in results if r.plan is not None]
    _out.print(fitted_table(cols, table_rows, console=_out))
    st: Any = summary["step"]
    med = st["median_abs_error"]
    _out.print(f"step time: {st['n']} rows predicted of {len(table_rows) + len(errors)}; median |error| "
               f"{'n/a' if med is None else f'{med:.1%}'}", markup=False)
    for part in ("generation", "training"):
        s: Any = summary[part]
        _out.print(f"{part}: " + ("not published in these rows" if not s["n"]
                                  else f"{s['n']} rows, median |error| {s['median_abs_error']:.1%}"), markup=False)
    verdicts: Any = summary["colocated_vs_split"]
    for v in verdicts:
        _out.print(f"colocated vs split, {v['group']}: measured faster {v['measured']}, predicted faster "
                   f"{v['predicted']} ({'agree' if v['agree'] else 'MISS'})", markup=False)
    hints: dict[str, None] = {}  # a reason in brackets that many rows share is said once, after them
    for u in unreadable:
        m = re.fullmatch(r"(.*?)\s+\[(.+)\]", u, re.S)
        if m:
            u, hint = m.groups()
            hints[hint] = None
        _err.print(f"[yellow]not predicted:[/yellow] {escape(u)}", highlight=False)
    for h in hints:
        _err.print(f"  {escape(h)}", highlight=False)


@rl_app.command("calibrate")
def calibrate_cmd(
    log: Annotated[Path, typer.Option("--log", help="A NeMo-RL or slime training log with per-step timing.")],
    model: Model,
    gpus: Gpus,
    rollout_layout: Annotated[str, typer.Option("--rollout-layout",
                                                help="The engines that ran: "
                                                "vllm:tp=..,ep=..,pp=..[,gpu_memory_utilization=..,enforce_eager=0|1]")],
    trainer_layout: Annotated[str, typer.Option("--trainer-layout",
                                                help="The trainer that ran: megatron:tp=..,cp=..,ep=..,pp=..,vpp=.. or "
                                                "automodel:cp=..,ep=..")],
    rollout_gpus: Annotated[int, typer.Option("--rollout-gpus", help="Rollout GPUs (= all GPUs when colocated).")],
    colocated: Annotated[bool, typer.Option("--colocated/--no-colocated")] = False,
    framework: FrameworkOpt = Framework.nemo_rl,
    prompt_len: Annotated[int, typer.Option("--prompt-len")] = 2048,
    response_len: Annotated[int, typer.Option("--response-len")] = 6144,
    mean_prompt_len: Annotated[float | None, typer.Option("--mean-prompt-len")] = None,
    mean_response_len: Annotated[float | None, typer.Option("--mean-response-len",
                                                            help="Default: the log's mean generation length, else half "
                                                            "of --response-len.")] = None,
    prompts_per_step: Annotated[int, typer.Option("--prompts-per-step")] = 32,
    generations_per_prompt: Annotated[int, typer.Option("--generations-per-prompt")] = 16,
    async_steps: Annotated[int, typer.Option("--async-steps")] = 0,
    logprob_passes: Annotated[int, typer.Option("--logprob-passes")] = 2,
    calibration: CalOpt = None,
    out: Annotated[Path | None,
                   typer.Option("--out", help="Write the fitted factors here (YAML for --calibration).")] = None,
    json_out: JsonOpt = False,
    force: ForceOpt = False,
) -> None:
    """Fit this cluster's factors from a run's per-step timing, so the next plan is calibrated to it."""
    try:
        steps = read_log(log)
        measured = mean_measured(steps)
        mean_resp = mean_response_len if mean_response_len is not None else measured.get("mean_generation_len")
        eng = parse_engine_layout(rollout_layout, "--rollout-layout")
        job = _job(model, gpus, framework, eng.engine, mean_prompt_len=mean_prompt_len, mean_response_len=mean_resp,
                   prompt_len=prompt_len, response_len=response_len, prompts_per_step=prompts_per_step,
                   generations_per_prompt=generations_per_prompt, logprob_passes=logprob_passes)
        check_async_steps(async_steps)
        base = load_rl_calibration(calibration) if calibration else DEFAULT_RL_CALIBRATION
        tl = parse_trainer_layout(trainer_layout, "--trainer-layout")
        cl = job.cluster
        trainer_gpus = cl.num_gpus if colocated else cl.num_gpus - rollout_gpus
        if trainer_gpus < 1 or rollout_gpus > cl.num_gpus:
            raise TunerError(f"--rollout-gpus {rollout_gpus} leaves no trainer GPU of the {cl.num_gpus}")
        per = cl.gpus_per_node
        if rollout_gpus < 1 or (not colocated and rollout_gpus % per):
            raise TunerError(f"--rollout-gpus {rollout_gpus}: rollout GPUs are whole {per}-GPU nodes of --gpus "
                             f"{cl.label}" + ("" if colocated else " (the trainer has the rest); accepted: "
                                              f"{', '.join(str(r) for r in range(per, cl.num_gpus, per))}"))
        predicted = evaluate_layouts(job, eng, tl, colocated=colocated, rollout_gpus=rollout_gpus,
                                     trainer_gpus=trainer_gpus, async_steps=async_steps, calibration=base)
        fitted = fit_from_measured(predicted, measured, base,
                                   source=f"calibrated from {log.name} ({len(steps)} steps, {steps[0].framework})")
        after = evaluate(job, predicted.choice, trainer=predicted.trainer, calibration=fitted)
        text = save_rl_calibration(fitted)
        if out is not None:
            check_output_path("--out", out, force=force)
            write_output(out, text, label="--out", force=force)
    except TunerError as e:
        raise _fail(e) from None
    if json_out:
        _out.print_json(json.dumps({"measured": measured, "predicted_before": _plan_dict(predicted)["predicted"],
                                    "predicted_after": _plan_dict(after)["predicted"],
                                    "calibration": dataclasses.asdict(fitted)}))
        return
    _out.print(f"read {len(steps)} steps from {log} ({steps[0].framework}); measured means (s): "
               + ", ".join(f"{k} {v:.1f}" for k, v in measured.items() if v is not None), highlight=False, markup=False)
    _out.print(f"predicted before: step {predicted.step_time_s:.1f} s; after calibration: step {after.step_time_s:.1f} "
               f"s (measured {measured['step_time_s']:.1f} s)", highlight=False, markup=False)
    _out.print(text if out is None else f"wrote the factors to {out}; pass --calibration {out} to tune rl",
               highlight=False, markup=False)

