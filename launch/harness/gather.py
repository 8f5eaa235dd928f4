"""How a parameter's full gradient is put together from its shards (the plan, no torch; :mod:`launch.harness.grads` runs
it after the DP buckets are all-gathered).

One :class:`GatherPlan` per parameter: the layout-independent name (:func:`canonical_name`: global layer and expert
numbers); TP pieces concatenated along ``partition_dim`` (a gated fc1's ``[gate_r; up_r]`` interleave undone, as
``apply_swiglu_sharded_factory`` in ``megatron/core/transformer/mlp.py``); a replicated parameter taken from TP rank 0;
one owner rank writes it (the last stage's tied embedding copy skipped).

Sources: megatron-core 0.19 ``tensor_parallel/layers.py`` (``partition_dim``), ``extensions/transformer_engine.py``
(``_set_expert_parameter_attributes``, ``TEGroupedLinear``'s ``weight0..``), ``transformer/moe/experts.py`` (global
expert index ``ep_rank x num_local_experts + j``)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specs.errors import TunerError

__all__ = ["GRAD_DUMP_FORMAT", "model_fingerprint", "GatherPlan", "ParamShard", "assemble", "canonical_name",
           "gather_plan"]

#: Format tag of a gradient dump's ``index.json`` (written by :mod:`launch.harness.grads`, read by
#: :mod:`tuner.verify.parity`).
GRAD_DUMP_FORMAT = "tune-grad-dump/1"


def model_fingerprint(model: Mapping[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of a model dict (a :class:`specs.ModelSpec` as a dict), its ``source`` text left
    out."""
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.items() if k != "source"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


_LAYER_RE = re.compile(r"(^|\.)(decoder\.layers)\.(\d+)\.")
_GROUPED_RE = re.compile(r"(\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$")
_SEQ_RE = re.compile(r"(\.experts\.local_experts)\.(\d+)\.")
_STRIP = ("module.", "_orig_mod.")


def strip_wrappers(name: str) -> str:
    """A parameter name without the wrappers' prefixes (``DistributedDataParallel`` / ``Float16Module``:
    ``module.module.``)."""
    while name.startswith(_STRIP):
        for p in _STRIP:
            if name.startswith(p):
                name = name[len(p):]
    return name


def canonical_name(local_name: str, *, layer_offset: int = 0, ep_rank: int = 0, num_local_experts: int = 0) -> str:
    """The layout-independent name of a parameter; ``layer_offset``: this chunk's first global layer.

    Raises:
        TunerError: an expert parameter without ``num_local_experts``.
    """
    n = strip_wrappers(local_name)
    if layer_offset:
        n = _LAYER_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}.{int(m.group(3)) + layer_offset}.", n, count=1)
    if _GROUPED_RE.search(n) or _SEQ_RE.search(n):
        if num_local_experts < 1:
            raise TunerError(f"parameter {local_name!r} is an expert's: num_local_experts is needed to number it "
                             "globally")
        base = ep_rank * num_local_experts
        n = _GROUPED_RE.sub(lambda m: f"{m.group(1)}{base + int(m.group(2))}", n)
        n = _SEQ_RE.sub(lambda m: f"{m.group(1)}.{base + int(m.group(2))}.", n)
    return n


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamShard:
    """What a rank knows about one of its parameters (megatron-core's attributes on it)."""

    name: str  # local name (as ``named_parameters`` gives it, wrapper prefixes allowed)
    shape: tuple[int, ...]
    tensor_model_parallel: bool = False
    partition_dim: int = -1
    partition_stride: int = 1
    is_expert: bool = False
    """``allreduce`` is False: reduced over the expert-data-parallel group, split over the expert-TP group."""
    shared_embedding: bool = False  # the last pipeline stage's copy of a tied word embedding
    pre_process: bool = True  # this model chunk holds the embedding (first pipeline stage)


@dataclass(frozen=True, kw_only=True, slots=True)
class GatherPlan:
    """How one parameter's full gradient is assembled, and who writes it."""

    local_name: str
    name: str  # global name (:func:`canonical_name`)
    full_shape: tuple[int, ...]
    group: str | None = None
    """``tp`` / ``etp``: concatenate over that group; None: replicated (TP rank 0's copy is the tensor)."""
    group_size: int = 1
    dim: int = -1  # concatenation dimension (``partition_dim``); -1 when not split
    glu: bool = False  # undo the SwiGLU ``[gate_r; up_r]`` interleave along dim 0
    skip: bool = False  # not written (the last stage's copy of a tied embedding)
    reason: str = ""


def _is_glu_fc1(name: str) -> bool:
    return bool(re.search(r"(^|\.)linear_fc1\.weight\d*$", strip_wrappers(name)))


def gather_plan(p: ParamShard, *, tp: int, etp: int, layer_offset: int = 0, ep_rank: int = 0,
                num_local_experts: int = 0, gated_linear_unit: bool = True) -> GatherPlan:
    """The plan for one parameter of this rank.

    Raises:
        TunerError: a split parameter with ``partition_stride`` other than 1 or a dimension it does not have.
    """
    name = canonical_name(p.name, layer_offset=layer_offset, ep_rank=ep_rank, num_local_experts=num_local_experts)
    if p.shared_embedding and not p.pre_process:
        return GatherPlan(local_name=p.name, name=name, full_shape=tuple(p.shape), skip=True,
                          reason="the last stage's copy of the tied word embedding (its gradient is the first stage's)")
    size = etp if p.is_expert else tp
    if not p.tensor_model_parallel or size == 1:
        return GatherPlan(local_name=p.name, name=name, full_shape=tuple(p.shape))
    if p.partition_stride != 1:
        raise TunerError(f"parameter {p.name!r} is split with partition_stride {p.partition_stride}: not supported by "
                         "the gradient gather")
    if not 0 <= p.partition_dim < len(p.shape):
        raise TunerError(f"parameter {p.name!r} (shape {list(p.shape)}) is tagged tensor_model_parallel with "
                         f"partition_dim {p.partition_dim}")
    full = list(p.shape)
    full[p.partition_dim] *= size
    glu = gated_linear_unit and p.partition_dim == 0 and _is_glu_fc1(p.name)
    return GatherPlan(local_name=p.name, name=name, group="etp" if p.is_expert else "tp", group_size=size,
                      dim=p.partition_dim, glu=glu, full_shape=tuple(full))


def assemble(pieces: Sequence[Any], plan: GatherPlan, cat: Callable[[list[Any], int], Any],
             chunk: Callable[[Any, int, int], list[Any]]) -> Any:
    """The full tensor from a TP group's pieces in rank order (``cat`` / ``chunk`` of NumPy or torch).

    Raises:
        TunerError: not one piece per rank of the group.
    """
    if plan.group is None:
        return pieces[0]
    if len(pieces) != plan.group_size:
        raise TunerError(f"{plan.name}: {len(pieces)} pieces for a group of {plan.group_size}")
    if plan.glu:
        halves = [chunk(x, 2, 0) for x in pieces]
        return cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return cat(list(pieces), plan.dim)
