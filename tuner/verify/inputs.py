"""What a check of :mod:`tuner.verify` starts from: the two layouts and the checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from launch.harness.gather import model_fingerprint
from search_spaces.rules import check_layout
from specs import Cluster, ModelSpec, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

_LAYOUT_KEYS_HELP = ("tp, pp, vpp, cp, ep, etp, micro_batch_size (or mbs), recompute (none|selective|full), "
                     "dispatcher, sequence_parallel, ...")


def parse_layout_spec(text: str, world_size: int) -> Layout:
    """A layout from ``key=value`` pairs, e.g. ``tp=1,pp=1,ep=1``: :class:`Layout`'s field names plus ``mbs`` and
    ``recompute`` (``full``: uniform, 1 layer; ``selective``: ``core_attn``); others take Megatron's defaults. Raises
    TunerError: an empty string, a pair without ``=``, an unknown key or a bad value."""
    if not text or not text.strip():
        raise TunerError(f"a layout is key=value pairs, e.g. 'tp=1,pp=1,ep=1'; got {text!r}")
    d: dict[str, Any] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if "=" not in part:
            raise TunerError(f"layout {text!r}: {part!r} is not key=value; keys: {_LAYOUT_KEYS_HELP}")
        k, v = (x.strip() for x in part.split("=", 1))
        k = {"mbs": "micro_batch_size", "recompute": "recompute_granularity"}.get(k, k)
        if k in d:
            raise TunerError(f"layout {text!r}: {k} given twice")
        d[k] = v
    d.setdefault("world_size", world_size)
    numbers = {**dict.fromkeys(("world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size",
                                "recompute_num_layers", "num_layers_in_first_pipeline_stage",
                                "num_layers_in_last_pipeline_stage"), int), "optimizer_offload_fraction": float}
    bools = {"sequence_parallel", "use_distributed_optimizer", "use_precision_aware_optimizer",
             "overlap_cpu_optimizer_d2h_h2d"}
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in numbers:
            try:
                out[k] = numbers[k](v)
            except ValueError:
                what = "an integer" if numbers[k] is int else "a number"
                raise TunerError(f"layout {text!r}: {k}={v!r} is not {what}") from None
        elif k in bools:
            if str(v).lower() not in ("true", "false", "1", "0", "on", "off"):
                raise TunerError(f"layout {text!r}: {k}={v!r} is not true/false")
            out[k] = str(v).lower() in ("true", "1", "on")
        elif k == "recompute_modules":
            out[k] = tuple(x for x in str(v).split("+") if x)
        else:
            out[k] = v
    out.setdefault("sequence_parallel", out.get("tp", 1) > 1)
    g = out.get("recompute_granularity", "none")
    if g == "full":
        out.setdefault("recompute_method", "uniform")
        out.setdefault("recompute_num_layers", 1)
    if g == "selective":
        out.setdefault("recompute_modules", ("core_attn",))
    try:
        return Layout.from_dict(out)
    except TunerError as e:
        raise TunerError(f"layout {text!r}: {e}") from None
    except (TypeError, ValueError) as e:
        raise TunerError(f"layout {text!r}: {e}; keys: {_LAYOUT_KEYS_HELP}") from None


def check_pair(candidate: Layout, reference: Layout, model: ModelSpec, cluster: Cluster, workload: Workload,
               fault: str | None, what: str) -> None:
    """Both layouts use all of ``cluster``'s GPUs, keep Megatron's rules, and differ (unless ``fault`` is set). Raises
    InfeasibleLayout: a layout breaks one of Megatron's rules (the rule and the reason are named); TunerError: a layout
    is for another GPU count, or the two are the same layout without a fault (``what`` names the flag to change)."""
    for name, lay in (("candidate", candidate), ("reference", reference)):
        if lay.world_size != cluster.num_gpus:
            raise TunerError(f"the {name} layout {lay.label} is for {lay.world_size} GPUs, the check for "
                             f"{cluster.num_gpus} ({cluster.label})")
        broken = check_layout(lay, model, workload)
        if broken:
            rule, why = broken[0]
            raise InfeasibleLayout(rule, f"the {name} layout {lay.label} breaks a rule: {why}")
    if candidate == reference and fault is None:
        raise TunerError(f"the candidate and the reference are the same layout ({candidate.label}): nothing to "
                         f"compare; give another {what}")


def check_inputs(candidate: Layout, reference: Layout, model: ModelSpec, cluster: Cluster, workload: Workload, *,
                 fault: str | None, what: str, init_checkpoint: str | Path | None, corpus: str | Path | None) -> Any:
    """The corpus (:func:`launch.harness.data.load_corpus`) of a check with a known ``fault``, a pair :func:`check_pair`
    accepts and an ``init_checkpoint`` of ``model``. Raises InfeasibleLayout: as :func:`check_pair`; TunerError: as
    :func:`check_pair`; an unknown fault, a checkpoint of another model or a bad corpus."""
    from launch.harness.data import load_corpus
    from launch.harness.spec import FAULTS

    if fault is not None and fault not in FAULTS:
        raise TunerError(f"--fault {fault!r}: accepted {', '.join(FAULTS)}")
    check_pair(candidate, reference, model, cluster, workload, fault, what)
    why = checkpoint_model_reasons(init_checkpoint, model) if init_checkpoint is not None else []
    if why:
        raise TunerError("--init-checkpoint: " + "; ".join(why))
    return load_corpus(corpus)


def refuse_unrunnable(factory: Any, plan: Any, hint: str = "") -> None:
    """Refuse a check one of whose arms (``plan.arms``) cannot run here, before any runs: no GPU time on a check that
    cannot finish. Raises InfeasibleLayout: naming the arm and why."""
    for arm in plan.arms:
        why = factory(plan, arm).refusal(arm.layout, plan.model, plan.workload)
        if why:
            raise InfeasibleLayout("harness_env", f"the {arm.name} arm ({arm.layout.label}) cannot run here: {why}"
                                   + hint)


def json_default(x: Any) -> Any:
    """``json.dumps``'s fallback for what JSON lacks (non-finite floats, paths): the value as text."""
    return str(x)


def layout_text(lay: Layout) -> str:
    """A layout in one line, with what the short label leaves out (micro-batch, recompute, dispatcher, offload,
    sequence parallelism, optimizer), e.g. ``TP1 PP1 DP1, mbs 2, recompute none, alltoall, offload none``."""
    parts = [lay.label + (" SP" if lay.sequence_parallel and lay.tp > 1 else ""), f"mbs {lay.micro_batch_size}",
             f"recompute {lay.recompute_label}", str(lay.dispatcher.value), f"offload {lay.offload_label}"]
    if not lay.use_precision_aware_optimizer:
        parts.append("precision-aware off")
    elif lay.exp_avg_dtype != "fp32" or lay.exp_avg_sq_dtype != "fp32":
        parts.append(f"moments {lay.exp_avg_dtype}/{lay.exp_avg_sq_dtype}")
    return ", ".join(parts)


def checkpoint_model_reasons(path: str | Path, model: ModelSpec) -> list[str]:
    """Why the distributed checkpoint at ``path`` cannot start a check of ``model``: its ``model.json`` (written by
    the harness) has another fingerprint (:func:`launch.harness.gather.model_fingerprint`). Empty when it can, or has
    no ``model.json``."""
    p = Path(path)
    if not (p.is_dir() and (p / "metadata.json").exists()):
        return [f"{str(p)!r} is not a megatron-core distributed checkpoint (a folder with metadata.json)"]
    side = p / "model.json"
    if not side.exists():
        return []
    try:
        d = json.loads(side.read_text())
        fp, name = d.get("fingerprint"), (d.get("model") or {}).get("name")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        return [f"{side}: unreadable ({e})"]
    want = model_fingerprint(dataclasses.asdict(model))
    if fp != want:
        return [f"the checkpoint {str(p)!r} is of another model ({name!r}, fingerprint {fp}) than the check's "
                f"{model.name!r} (fingerprint {want}): layers, widths or experts differ"]
    return []

