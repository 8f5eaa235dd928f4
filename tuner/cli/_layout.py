"""The layout options of ``tune estimate`` and ``tune check``, declared once: :class:`LayoutFlags`'s fields carry
their ``typer.Option`` in their metadata; :func:`layout_options` gives a command all of them as one ``layout``."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import typer

from specs.errors import InfeasibleLayout, TunerError, enum_member
from specs.layout import Dispatcher, RecomputeGranularity, RecomputeMethod
from tuner.cli._common import fold_options

F = TypeVar("F", bound=Callable[..., Any])


def _opt(default: Any, *decls: str, help: str) -> Any:
    return field(default=default, metadata={"option": typer.Option(*decls, help=help, rich_help_panel="Layout")})


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutFlags:
    """One layout as Megatron's flags name it, as given on the command line (defaults: Megatron's)."""

    tp: int = _opt(1, "--tp", help="--tensor-model-parallel-size")
    pp: int = _opt(1, "--pp", help="--pipeline-model-parallel-size")
    vpp: int = _opt(1, "--vpp", help="virtual stages per pipeline rank (1 = none)")
    cp: int = _opt(1, "--cp", help="--context-parallel-size")
    ep: int = _opt(1, "--ep", help="--expert-model-parallel-size")
    etp: int = _opt(1, "--etp", help="--expert-tensor-parallel-size")
    micro_batch_size: int = _opt(1, "--micro-batch-size", "--mbs", help="rows per micro-batch")
    sequence_parallel: bool | None = _opt(None, "--sequence-parallel/--no-sequence-parallel",
                                          help="default: on when tp > 1")
    recompute: str = _opt("none", "--recompute", help="none, selective or full")
    recompute_method: str | None = _opt(None, "--recompute-method",
                                        help="uniform or block (full only; default uniform)")
    recompute_num_layers: int | None = _opt(None, "--recompute-num-layers", help="full only; default 1")
    recompute_modules: str | None = _opt(None, "--recompute-modules",
                                         help="selective only, comma-separated, e.g. core_attn,moe_act")
    optimizer_offload_fraction: float = _opt(0.0, "--optimizer-offload-fraction", help="0 (none) .. 1")
    dispatcher: str = _opt("alltoall", "--dispatcher", help=", ".join(d.value for d in Dispatcher))
    first_stage_layers: int = _opt(0, "--first-stage-layers", help="decoder layers on pipeline rank 0 (0 = even split)")
    last_stage_layers: int = _opt(0, "--last-stage-layers", help="decoder layers on the last pipeline rank (0 = even)")
    exp_avg_dtype: str = _opt("fp32", "--exp-avg-dtype", help="Adam moments dtype: fp32 or bf16")
    no_precision_aware_optimizer: bool = _opt(False, "--no-precision-aware-optimizer",
                                              help="turn off --use-precision-aware-optimizer")
    no_distributed_optimizer: bool = _opt(False, "--no-distributed-optimizer",
                                          help="turn off --use-distributed-optimizer")
    pipeline_layout: str | None = _opt(None, "--pipeline-layout",
                                       help="a --pipeline-model-parallel-layout string: it sets VPP and the first/last "
                                            "split (tune check checks it with Megatron's grammar and rules)")

    @property
    def vpp_given(self) -> bool:
        return self.vpp != 1

    @property
    def split_given(self) -> bool:
        return bool(self.first_stage_layers or self.last_stage_layers)

    def to_layout(self, world_size: int) -> Any:
        """The :class:`Layout` of these flags on ``world_size`` GPUs, Megatron's defaults filling in (selective
        recompute of ``core_attn``; full recompute ``uniform`` over 1 layer; sequence parallelism when TP > 1); the
        pipeline string is applied by :func:`apply_layout_string`. Raises TunerError: ``--recompute-modules`` without
        ``--recompute selective``, or a value :class:`Layout` refuses."""
        from specs.layout import Layout

        gran = self.recompute
        mods = tuple(m for m in (self.recompute_modules or "").replace(" ", ",").split(",") if m)
        if mods and gran != "selective":
            raise TunerError(f"--recompute-modules needs --recompute selective (got --recompute {gran})")
        if gran == "selective" and not mods:
            mods = ("core_attn",)  # Megatron's default --recompute-modules
        method, num = self.recompute_method, self.recompute_num_layers
        if gran == "full":
            method = method or "uniform"
            num = 1 if num is None else num
        return Layout(world_size=world_size, tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, ep=self.ep, etp=self.etp,
                      micro_batch_size=self.micro_batch_size,
                      sequence_parallel=(self.tp > 1) if self.sequence_parallel is None else self.sequence_parallel,
                      recompute_granularity=enum_member(RecomputeGranularity, gran, "--recompute"),
                      recompute_method=enum_member(RecomputeMethod, method or "none", "--recompute-method"),
                      recompute_num_layers=num or 0, recompute_modules=mods if gran == "selective" else (),
                      optimizer_offload_fraction=self.optimizer_offload_fraction,
                      dispatcher=enum_member(Dispatcher, self.dispatcher, "--dispatcher"),
                      num_layers_in_first_pipeline_stage=self.first_stage_layers,
                      num_layers_in_last_pipeline_stage=self.last_stage_layers, exp_avg_dtype=self.exp_avg_dtype,
                      exp_avg_sq_dtype=self.exp_avg_dtype,
                      use_precision_aware_optimizer=not self.no_precision_aware_optimizer,
                      use_distributed_optimizer=not self.no_distributed_optimizer)


_HINTS = typing.get_type_hints(LayoutFlags)
_PARAMETERS = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=Annotated[_HINTS[f.name], f.metadata["option"]])
               for f in dataclasses.fields(LayoutFlags)]


def layout_options(func: F) -> F:
    """Give a command every :class:`LayoutFlags` option, taken as one ``layout: LayoutFlags`` (:func:`fold_options`)."""
    return fold_options(func, "layout", "LayoutFlags", _PARAMETERS, lambda v: LayoutFlags(**v), "layout options")  # type: ignore[no-any-return]


def split_hint(model: Any, lay: Any) -> str:
    """'; try --first-stage-layers F --last-stage-layers L' with the nearest split that works, or ''."""
    from search_spaces.pipeline import stage_layer_counts

    # the even split, which first/last must not restate (Megatron accepts it; the tuner's one-form policy refuses it)
    try:
        even = stage_layer_counts(model.num_layers, lay.pp, lay.vpp, 0, 0)
    except InfeasibleLayout:
        even = None
    given = (lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage)
    if lay.pp * lay.vpp > 2 * model.num_layers:  # far more virtual stages than layers: no split worth naming, and the
        return ""  # search below grows with (pp x vpp)^2 (--vpp 10000 had run for minutes)
    best = None
    for d in range(0, 2 * lay.pp * lay.vpp + 1):
        for df in sorted(range(d + 1), key=lambda x: (abs(2 * x - d), x)):  # symmetric first
            dl = d - df
            if (model.num_layers + df + dl) % lay.pp:
                continue
            mid = (model.num_layers + df + dl) // lay.pp
            if (mid - df, mid - dl) == given:
                continue
            try:
                counts = stage_layer_counts(model.num_layers, lay.pp, lay.vpp, mid - df, mid - dl)
            except InfeasibleLayout:
                continue
            if even is not None and counts == even:
                continue
            best = (mid - df, mid - dl)
            break
        if best:
            break
    return f"; try --first-stage-layers {best[0]} --last-stage-layers {best[1]}" if best else ""


def apply_layout_string(lay: Any, model: Any, text: str, *, vpp_given: bool, split_given: bool) -> tuple[Any, bool,
                                                                                                         str]:
    """(layout with vpp / first / last from a ``--pipeline-model-parallel-layout`` string, whether the split rules must
    be skipped (a valid string not of the first/last form), a note). Raises InfeasibleLayout: the string breaks
    Megatron's rules or contradicts --vpp / --first-stage-layers / --last-stage-layers."""
    from search_spaces.pipeline import LAYOUT_RULE_ID, layer_counts_from_string, stage_layer_counts

    counts = layer_counts_from_string(text, lay.pp, model.num_layers, model.mtp_num_layers)
    vpp_s = len(counts[0])
    if vpp_given and lay.vpp != vpp_s:
        raise InfeasibleLayout(LAYOUT_RULE_ID,
                               f"the string has {len(counts) * vpp_s} stages = pp {lay.pp} x {vpp_s} virtual stages "
                               f"per rank, but --vpp is {lay.vpp}; leave --vpp out or make them agree")
    first, last = sum(counts[0]), sum(counts[-1])
    if split_given and (lay.num_layers_in_first_pipeline_stage,
                        lay.num_layers_in_last_pipeline_stage) not in ((first, last), (0, 0)):
        raise InfeasibleLayout(
            LAYOUT_RULE_ID,
            f"the string puts {first} layers on the first rank and {last} on the last, but "
            "--first-stage-layers/--last-stage-layers say "
            f"{lay.num_layers_in_first_pipeline_stage}/{lay.num_layers_in_last_pipeline_stage}; leave them out (the "
            "string decides)",
        )
    for f, lst in ((0, 0), (first, last)):
        try:
            if stage_layer_counts(model.num_layers, lay.pp, vpp_s, f, lst) == counts:
                return lay.replace(vpp=vpp_s, num_layers_in_first_pipeline_stage=f,
                                   num_layers_in_last_pipeline_stage=lst), False, ""
        except InfeasibleLayout:
            continue
    note = (f"the string is valid for Megatron but not of the first/last form the tuner generates and models "
            f"(per-rank layers {[sum(c) for c in counts]}); rules other than the split were checked")
    return lay.replace(vpp=vpp_s), True, note
