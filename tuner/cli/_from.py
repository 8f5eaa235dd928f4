"""``tune --from FILE``: the user's launch as the main job's inputs and its baseline (:mod:`tuner.launch_file`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from cost_model.uncertainty import ratio_within_error
from specs.errors import InfeasibleLayout, TunerError
from specs.stacks import DEFAULT_STACK, load_stack
from tuner.cli._common import GIB, RunChoice

if TYPE_CHECKING:
    from specs import Layout
    from tuner.study.records import TrialRow

__all__ = ["FromOpt", "FromInputs", "CommandInputs", "arguments_read", "command_inputs", "launch_inputs",
           "launch_layout", "launch_lines", "compare_line", "launch_summary"]

FromOpt = Annotated[Path | None, typer.Option("--from", help=(
    "Your launch, read as `tune --from` reads it (a Megatron-LM / slime argument list or shell script, a "
    "Megatron-Bridge override YAML, a NeMo-RL config or a recipe.yaml): its model, GPUs, workload, layout and run "
    "options are this layout's; flags given here win."))]

#: Layout flags that go together: one of the first tuple given on the command line replaces the launch's values of the
#: second (a pipeline size or split given here drops the launch's split and layout string; a recompute granularity its
#: method, layer count and modules).
_LAYOUT_GROUPS = (
    (("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout"),
     ("vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout")),
    (("recompute", "recompute_method", "recompute_num_layers", "recompute_modules"),
     ("recompute_method", "recompute_num_layers", "recompute_modules")),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class FromInputs:
    """The main job's inputs with a launch file's filled in (the command line's flags win)."""

    model: str
    gpus: str
    seq_len: int
    global_batch: int
    precision: str
    layers: int | None
    run: RunChoice
    baseline: dict[str, Any]
    """The launch's layout (:meth:`specs.Layout.to_dict`)."""
    launch: Any
    """The :class:`tuner.launch_file.LaunchFile`."""


def _merge_flags(file_flags: Any, cli_flags: Any) -> Any:
    """The launch's run flags under the command line's (a flag replaces its group's)."""
    from specs.stacks import RunFlags

    f, c = file_flags.given(), cli_flags.given()
    for group in (("accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16"),
                  ("cuda_graph_impl", "cuda_graph_scope"), ("cross_entropy_loss_fusion", "cross_entropy_fusion_impl")):
        if any(k in c for k in group):
            for k in group:
                f.pop(k, None)
    return RunFlags(**{**f, **c})


def launch_inputs(path: Path, ctx: Any, *, model: str | None, gpus: str | None, seq_len: int, global_batch: int,
                  precision: str, layers: int | None, run: RunChoice) -> FromInputs:
    """The main job's inputs, ``path`` filling those the command line leaves at their defaults."""
    from specs import load_model, parse_gpus
    from specs.model import slice_model
    from specs.stacks import RunFlags
    from tuner.cli._layout import LayoutFlags, apply_layout_string
    from tuner.launch_file import read_launch
    from tuner.launch_file.args import run_flags_of_args

    def default(param: str) -> bool:
        src = ctx.get_parameter_source(param) if ctx is not None else None
        return src is None or src.name in ("DEFAULT", "DEFAULT_MAP")

    lf = read_launch(path, model=model, gpus=gpus, precision=None if default("precision") else precision,
                     fp8_recipe=run.flags.fp8_recipe)
    label = f"--from {str(path)!r}"
    name = model or lf.model
    if not name:
        raise TunerError(f"{label}: the file names no model (no --hidden-size / --num-attention-heads / "
                         "--num-experts); give --model")
    count = lf.nodes * lf.gpus_per_node if lf.nodes and lf.gpus_per_node else None
    where = f"{lf.nodes} x {lf.gpus_per_node}" if count else ""
    if gpus is None and lf.gpu and count:
        gpus = f"{lf.nodes}x{lf.gpus_per_node}x{lf.gpu}"
    elif gpus is not None and "x" not in gpus.lower():
        if not count:
            raise TunerError(f"{label}: the file does not say how many GPUs it runs on; give --gpus COUNTxGPU, e.g. "
                             f"--gpus 64x{gpus}")
        gpus = f"{lf.nodes}x{lf.gpus_per_node}x{gpus}"
    if gpus is None:
        hint = f" (the file runs {where} GPUs: e.g. --gpus H200)" if count else ", e.g. --gpus 64xH200"
        raise TunerError(f"{label}: give the GPUs with --gpus{hint}")
    cluster = parse_gpus(gpus)
    if count and cluster.num_gpus != count:
        raise TunerError(f"{label}: the file runs on {count} GPUs ({where}) but --gpus {gpus} has {cluster.num_gpus}; "
                         "give --gpus with the GPU alone (--gpus H200) or the file's count")

    seq_len = lf.seq_length if lf.seq_length and default("seq_len") else seq_len
    global_batch = lf.global_batch_size if lf.global_batch_size and default("global_batch") else global_batch
    precision = lf.precision if lf.precision and default("precision") else precision
    layers = layers if layers is not None else lf.num_layers
    task, rank, modules = run.task, run.lora_rank, run.lora_target_modules
    if run.task is None and lf.task:
        task, rank, modules = lf.task.get("task"), lf.task.get("lora_rank"), lf.task.get("lora_target_modules")
    m = slice_model(load_model(name), layers)
    # the model preset's own launch arguments (its extra_megatron_args, which every export carries) are not the
    # launch's choices: reading an exported script back gives the study that exported it
    own = run_flags_of_args(m.extra_megatron_args).given()
    file_flags = RunFlags(**{k: v for k, v in lf.run_flags.given().items() if k not in own or own[k] != v})
    merged = RunChoice(stack=run.stack or lf.stack, flags=_merge_flags(file_flags, run.flags), task=task,
                       lora_rank=rank, lora_target_modules=modules)
    stack = load_stack(merged.stack or DEFAULT_STACK)
    if m.is_moe and stack.drops_allgather and lf.layout.get("dispatcher") == "allgather":
        # the stack runs alltoall where the launch asks for allgather: the launch is what runs
        lf = dataclasses.replace(lf, layout={**lf.layout, "dispatcher": "alltoall"}, model_notes=(
            *lf.model_notes,
            f"--stack {stack.name} rewrites the launch's allgather dispatcher to alltoall: taken as alltoall"))
    flags = LayoutFlags(**{k: v for k, v in lf.layout.items() if k != "pipeline_layout"})
    try:
        lay = flags.to_layout(cluster.num_gpus)
        if lf.layout.get("pipeline_layout"):
            lay, odd, _ = apply_layout_string(lay, m, lf.layout["pipeline_layout"], vpp_given=flags.vpp_given,
                                              split_given=flags.split_given)
            if odd:
                raise TunerError(f"{label}: --pipeline-model-parallel-layout {lf.layout['pipeline_layout']!r} is valid "
                                 "for Megatron but not of the first/last-stage form the cost model estimates")
    except InfeasibleLayout as e:
        raise TunerError(f"{label}: its layout breaks rule {e.rule_id}: {e.reason}") from None
    return FromInputs(model=name, gpus=gpus, seq_len=seq_len, global_batch=global_batch, precision=precision,
                      layers=layers, run=merged, baseline=lay.to_dict(), launch=lf)


class CommandInputs(NamedTuple):
    """An estimating command's inputs with ``--from`` applied (unchanged without it), in the order they unpack."""

    launch: FromInputs | None
    model: str | None
    gpus: str | None
    seq_len: int
    global_batch: int
    precision: str
    layers: int | None
    run: RunChoice
    layout: Any
    """The layout flags (:class:`tuner.cli._layout.LayoutFlags`), or None for a command that takes none."""


def command_inputs(from_file: Path | None, ctx: Any, *, model: str | None, gpus: str | None, seq_len: int,
                   global_batch: int,
                   precision: str, layers: int | None, run: RunChoice, layout: Any = None) -> CommandInputs:
    """The inputs of the main job, ``estimate`` and ``timeline``, ``--from`` filling the defaults."""
    if from_file is None:
        return CommandInputs(None, model, gpus, seq_len, global_batch, precision, layers, run, layout)
    fi = launch_inputs(from_file, ctx, model=model, gpus=gpus, seq_len=seq_len, global_batch=global_batch,
                       precision=precision, layers=layers, run=run)
    return CommandInputs(fi, fi.model, fi.gpus, fi.seq_len, fi.global_batch, fi.precision, fi.layers, fi.run,
                         None if layout is None else launch_layout(fi, layout, ctx))


def launch_layout(fi: FromInputs, layout: Any, ctx: Any) -> Any:
    """The launch's layout flags under the command line's: a flag given here (``ctx`` says which) replaces the
    launch's of its group (:data:`_LAYOUT_GROUPS`)."""
    import dataclasses

    from tuner.cli._layout import LayoutFlags

    def given(name: str) -> bool:
        src = ctx.get_parameter_source(name) if ctx is not None else None
        return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")

    cli = {f.name for f in dataclasses.fields(LayoutFlags) if given(f.name)}
    f = dict(fi.launch.layout)
    for trigger, dropped in _LAYOUT_GROUPS:
        if cli & set(trigger):
            for k in dropped:
                f.pop(k, None)
    return LayoutFlags(**{**f, **{k: getattr(layout, k) for k in cli}})


def launch_summary(fi: FromInputs) -> dict[str, Any]:
    """How the launch's arguments were read, for ``--json``."""
    lf = fi.launch
    return {"file": str(lf.path), "kind": lf.kind, "understood": list(lf.understood), "no_effect": list(lf.no_effect),
            "not_understood": list(lf.not_understood), "notes": list(lf.model_notes)}


def baseline_estimate(prep: Any) -> tuple[Any, str]:
    """(the estimate of the study's baseline layout or None, why none)."""
    from cost_model.estimate import estimate
    from specs import Layout

    lay = Layout.from_dict(prep.config.job.baseline)
    try:
        return estimate(prep.model, prep.cluster, prep.workload, lay, calibration=prep.calibration,
                        memory_headroom=prep.headroom, options=prep.options), ""
    except InfeasibleLayout as e:
        return None, f"it breaks rule {e.rule_id}: {e.reason}"


def arguments_read(lf: Any, *, verbose: bool, hint: str = "--verbose or --json") -> str:
    """How a launch file's arguments were read: all with ``verbose``, else a few and ``hint``."""
    if verbose:
        return str(lf.summary)
    short = str(lf.short_summary())
    return short if short == lf.summary else f"{short} (all of them: {hint})"


def launch_lines(prep: Any, fi: FromInputs, *, verbose: bool = False) -> list[str]:
    """What the main job prints about the launch before the search: how its arguments were read, its layout and
    its predicted throughput and memory."""
    lf = fi.launch
    lay = prep.config.job.baseline
    e, why = baseline_estimate(prep)
    lines = [f"Your launch ({lf.path.name}): {arguments_read(lf, verbose=verbose)}"]
    lines += [f"  note: {n}" for n in lf.model_notes]
    from specs import Layout

    label = Layout.from_dict(lay).label
    if e is None:
        lines.append(f"  its layout {label}: not estimated, {why}")
        return lines
    fit = fit_verdict(prep, e.peak_bytes)
    trial = ("the study evaluates it" if prep.baseline_row is not None and prep.fits[prep.baseline_row]
             else "not a candidate of the search (outside the space, or predicted not to fit)")
    lines.append(f"  its layout {label}: {e.tokens_per_s_per_gpu:,.1f} tokens/s/GPU predicted, {e.peak_gib:.1f} GiB "
                 f"({fit}); {trial}")
    return lines


def layout_changes(launch: Layout, best: Layout) -> list[str]:
    """What differs between two layouts, as ``name old->new``, in Megatron's order."""
    a, b = launch, best

    def opt(x: Layout) -> str:
        return ("precision-aware " + "/".join((x.exp_avg_dtype,
                                               x.exp_avg_sq_dtype))) if x.use_precision_aware_optimizer else "fp32 Adam"

    def split(x: Layout) -> str:
        f, l_ = x.num_layers_in_first_pipeline_stage, x.num_layers_in_last_pipeline_stage
        return f"{f}/{l_}" if (f or l_) else "even"

    fields: list[tuple[str, Callable[[Layout], object]]] = [
              ("TP", lambda x: x.tp), ("PP", lambda x: x.pp), ("VPP", lambda x: x.vpp), ("CP", lambda x: x.cp),
              ("EP", lambda x: x.ep), ("ETP", lambda x: x.etp),
              ("sequence parallel", lambda x: "on" if x.sequence_parallel else "off"),
              ("micro-batch", lambda x: x.micro_batch_size), ("recompute", lambda x: x.recompute_label),
              ("offload", lambda x: x.offload_label), ("dispatcher", lambda x: x.dispatcher.value), ("optimizer", opt),
              ("first/last stage layers", split)]
    return [f"{name} {get(a)}->{get(b)}" for name, get in fields if get(a) != get(b)]


def fit_verdict(prep: Any, peak_bytes: float) -> str:
    """``fits``, ``may not fit`` or ``does NOT fit`` for a peak of ``peak_bytes`` by the job's fit rule (the 90%
    memory interval, or ``--memory-headroom``'s margin)."""
    hbm = prep.cluster.gpu.hbm_bytes
    if prep.config.search.memory_headroom is not None or prep.bars is None:
        return "fits" if peak_bytes <= hbm * (1 - prep.headroom) else "does NOT fit"
    verdict = str(prep.bars.fit_verdict(peak_bytes, hbm))
    return "does NOT fit" if verdict == "does not fit" else verdict


def launch_failure(study: Any, prep: Any) -> tuple[int, dict[str, Any]] | None:
    """The last failed trial of the launch's own layout in ``study`` (its number and
    :func:`tuner.study.records.failure_of` record), or None."""
    from optuna.trial import TrialState

    from specs import Layout
    from tuner.study.records import TrialRecord

    key = Layout.from_dict(prep.config.job.baseline).key()
    failed = [(t.number, f) for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
              if (f := TrialRecord.of(t).failure) and Layout.from_dict(f["layout"]).key() == key]
    return failed[-1] if failed else None


def compare_line(prep: Any, best: dict[str, Any], rows: list[TrialRow] | None = None,
                 failed: tuple[int, dict[str, Any]] | None = None) -> str:
    """``your launch (trial T): N tokens/s/GPU measured|predicted (90%: LO-HI), X GiB; best: LABEL, M tokens/s/GPU,
    Y GiB, +P%;`` then what to do: ``change: ...`` only for a measured gain or one beyond the model's error on a
    predicted ratio (:func:`cost_model.uncertainty.ratio_within_error`), else keep the launch or measure both."""
    from specs import Layout

    base = Layout.from_dict(prep.config.job.baseline)
    mine = [r for r in rows or () if r.layout.key() == base.key() and r.tokens_per_s_per_gpu]
    mine.sort(key=lambda r: r.source != "measured")  # a measurement first
    if not mine and failed is not None:  # its own trial failed: it does not run as it is
        trial, f = failed
        reached = f" at {f['memory_reached_gib']:.1f} GiB" if f.get("memory_reached_gib") is not None else ""
        what = f"ran out of memory{reached}" if f.get("kind") == "oom" else f"failed ({f.get('kind', 'crash')})"
        changes = layout_changes(base, best["layout"])
        return (f"your launch (trial {trial}): {what} in its trial; best: {best['label']}, "
                f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU {best['source']}, {float(best['peak_gib']):.1f} GiB"
                + (f"; change: {', '.join(changes)}" if changes else ""))
    if mine:
        r = mine[0]
        tps, gib, src = r.tokens_per_s_per_gpu, r.peak_gib, r.source
        verdict = "fits" if src == "measured" else fit_verdict(prep, gib * GIB)  # a measured run did fit
        who = f"your launch (trial {r.trial})"
    else:
        e, why = baseline_estimate(prep)
        if e is None:
            return (f"your launch: not estimated ({why}); best: {best['label']}, "
                    f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU")
        tps, gib, src, who = e.tokens_per_s_per_gpu, e.peak_bytes / GIB, "predicted", "your launch"
        verdict = fit_verdict(prep, e.peak_bytes)
    band = ""
    if src == "predicted" and prep.bars is not None:
        lo, hi = prep.bars.throughput_interval(tps)
        band = f" (90%: {lo:,.0f}-{hi:,.0f})"
    gain = best["tokens_per_s_per_gpu"] / tps - 1 if tps > 0 else float("nan")
    fit = "" if verdict == "fits" else f" ({verdict}, predicted)"
    changes = layout_changes(base, best["layout"])
    err = ratio_within_error()
    predicted = "predicted" in (best["source"], src)
    if not changes:
        then = "; it is your launch's layout"
    elif gain > 0 and not (predicted and gain < err):
        then = f"; change: {', '.join(changes)}"
    else:
        less = gib - float(best["peak_gib"])
        notes = [f"the best uses {less:.1f} GiB less"] if less >= 0.05 else []
        if not predicted:
            keep = "measured as fast as the best or faster: keep it"
        elif abs(gain) < err:
            keep, notes = "within the model's error of the best: keep it, or measure both", [
                f"a difference under {err:.0%} is within it", *notes]
        else:
            keep = f"predicted {-gain:.0%} faster than the best: keep it, or measure both"
        then = f"; your layout is {keep} ({'; '.join([*notes, 'the best differs in: ' + ', '.join(changes)])})"
    return (f"{who}: {tps:,.1f} tokens/s/GPU {src}{band}, {gib:.1f} GiB{fit}; best: {best['label']}, "
            f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU {best['source']}, {best['peak_gib']:.1f} GiB, "
            f"{gain:+.0%}{then}")
