"""``megatron_bridge.yaml``: the layout as Megatron-Bridge ``ConfigContainer`` settings.

With the user's Bridge override YAML or saved ``ConfigContainer`` (``tune --from``) the file is that YAML with the
layout and the priced run options written into its own keys, every other key unchanged and in order (PyYAML drops
comments); without one, an override of just those keys. A key the layout makes irrelevant is set to null only where the
file has it. A performance config (``perf_matrix``) is refused: Bridge's scripts apply that entry over the container.
With ``--task lora`` a ``peft`` section holds LoRA's rank and targets (the file's own adapter class, else LoRA).

Key names: NVIDIA-NeMo/Megatron-Bridge 067f987d ``src/megatron/bridge/training/config.py`` and
``docs/megatron-lm-to-megatron-bridge.md``; ``model.*`` are megatron-core's ``TransformerConfig`` /
``ModelParallelConfig`` fields (NVIDIA/Megatron-LM d98e8a64); a dtype string is what Bridge's override turns into a
``torch.dtype`` (``utils/activation_map.py`` ``str_to_dtype``).

The gradient-reduction dtype is written where it wins at run time: ``mixed_precision.setup`` copies its
``grad_reduce_in_fp32`` over ``ddp``'s (``training/mixed_precision.py`` ``update_config_with_precision_overrides``,
``training/config.py`` l.2012-2016), and the recipes' ``mixed_precision: bf16_mixed`` sets it true
(``recipes/common.py`` l.130). So bf16 reduction is written in ``ddp`` and in ``mixed_precision``: into the file's
mapping, or for ``bf16_mixed`` (or no ``mixed_precision``) as that preset's ``MixedPrecisionConfig`` with
``grad_reduce_in_fp32: false``; another preset's name is kept and the header says what to set."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import yaml

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._flags import _check, _pipeline_layout_string, _recompute
from specs import RunOptions
from specs.errors import TunerError
from specs.precision import TORCH_DTYPES
from specs.units import GIB

__all__ = ["LORA_CLASS", "BridgeExporter", "bridge_left_out", "bridge_scripts_note", "bridge_settings", "bridge_yaml",
           "grad_reduce_note"]

#: The ``peft`` section's class for ``--task lora`` (``_target_`` as a saved ``run_config.yaml`` writes it:
#: Megatron-Bridge 067f987d ``tests/unit_tests/models/test_adapter_export.py``; ``src/megatron/bridge/peft/lora.py``).
LORA_CLASS = "megatron.bridge.peft.lora.LoRA"


def _perf_config(doc: Any) -> bool:
    return isinstance(doc, Mapping) and ("perf_matrix" in doc or "ConfigContainer" in doc)


def bridge_left_out(bridge_yaml: str) -> str:
    """Why the ``bridge`` format cannot write into the ``tune --from`` YAML ``bridge_yaml`` ("" when it can): the
    main job says it where it leaves ``megatron_bridge.yaml`` out, ``tune export --format bridge`` where it refuses."""
    if bridge_yaml and _perf_config(yaml.safe_load(bridge_yaml)):
        return "the --from file is a performance config (perf_matrix): its entry sets the layout"
    return ""


#: Megatron-Bridge 067f987d ``training/mixed_precision.py`` ``bf16_mixed()``, as a saved config writes it, with bf16
#: gradient reduction: the ``mixed_precision`` written where the file names that preset or none (the recipes' default).
_BF16_MIXED = {"_target_": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig", "bf16": True,
               "params_dtype": {"_call_": False, "_target_": "torch.bfloat16"},
               "pipeline_dtype": {"_call_": False, "_target_": "torch.bfloat16"}, "autocast_enabled": False}


def _preset(context: ExportContext) -> str | None:
    """The ``mixed_precision`` preset name the ``--from`` file gives (``"bf16_mixed"`` where it has none, the recipes'
    default); None where it is a mapping."""
    doc = yaml.safe_load(context.bridge_yaml) if context.bridge_yaml else None
    mp = doc.get("mixed_precision") if isinstance(doc, Mapping) else None
    if isinstance(mp, Mapping):
        return None
    return str(mp or "bf16_mixed").replace("-", "_")


def _bf16_preset(context: ExportContext) -> bool:
    """Whether ``mixed_precision`` is written as :data:`_BF16_MIXED`: a bf16 study, the file naming ``bf16_mixed`` or
    no preset."""
    return _preset(context) == "bf16_mixed" and context.workload.precision.value == "bf16"


def grad_reduce_note(context: ExportContext) -> str:
    """Where the written file does not set the priced bf16 gradient reduction ("" where it does): a ``mixed_precision``
    preset other than ``bf16_mixed`` sets ``grad_reduce_in_fp32`` true over ``ddp``'s."""
    o = context.options or RunOptions()
    name = _preset(context)
    if o.grad_reduce_in_fp32 or name is None or _bf16_preset(context):
        return ""
    return (f"priced with bf16 gradient reduction, but mixed_precision: {name} reduces in fp32 (it wins over ddp): "
            "set mixed_precision.grad_reduce_in_fp32 false in your recipe")


def bridge_scripts_note(bridge_yaml: str, *, slime: bool = False) -> str:
    """What ``recipe.yaml``, ``run_slime.sh`` and ``megatron_args.sh`` are beside a ``tune --from`` Bridge YAML
    ``bridge_yaml`` ("" without one): their training settings are the tool's own, as without ``--from`` (the file's
    are Bridge ``ConfigContainer`` keys, most of them in the Python recipe it overrides, not Megatron-LM arguments to
    carry); ``slime`` adds that slime's path is SFT (``run_slime.sh``), whatever the file trains."""
    if not bridge_yaml:
        return ""
    use = ("set the tuned layout in your Bridge performance config" if bridge_left_out(bridge_yaml)
           else "megatron_bridge.yaml is your run with the tuned layout: use it")
    sft = "; slime trains through its SFT path (--loss-type sft_loss), whatever your file trains" if slime else ""
    return ("not derived from your Megatron-Bridge file's training settings (optimizer, learning rate and schedule, "
            f"weight decay, iterations, seed): they are this tool's own{sft}; {use}")


def bridge_settings(context: ExportContext) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The Bridge settings of ``context``'s layout and run options as (always written, written where non-default or
    present in the file), each ``{section: {key: value}}`` in writing order.

    Raises:
        TunerError: as :func:`_check` and :func:`_pipeline_layout_string`.
    """
    lay, model, work = context.layout, context.model, context.workload
    _check(lay, model, work)
    pls = _pipeline_layout_string(lay, model)
    m: dict[str, Any] = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "context_parallel_size": lay.cp,
        "sequence_parallel": bool(lay.sequence_parallel and lay.tp > 1),
    }
    if model.is_moe:
        m["expert_model_parallel_size"] = lay.ep
        m["expert_tensor_parallel_size"] = lay.etp
    if pls is not None:
        m["pipeline_model_parallel_layout"] = pls
    m |= {f"recompute_{k}": v for k, v in (_recompute(lay) or {"granularity": None}).items()}
    if model.is_moe:
        m["moe_token_dispatcher_type"] = lay.dispatcher.moe_token_dispatcher_type
        if lay.dispatcher.moe_flex_dispatcher_backend:
            m["moe_flex_dispatcher_backend"] = lay.dispatcher.moe_flex_dispatcher_backend
    offload = lay.optimizer_offload_fraction > 0
    opt: dict[str, Any] = {"use_distributed_optimizer": lay.use_distributed_optimizer,
                           "use_precision_aware_optimizer": lay.use_precision_aware_optimizer}
    if offload:
        opt |= {"optimizer_cpu_offload": True, "optimizer_offload_fraction": float(lay.optimizer_offload_fraction),
                "overlap_cpu_optimizer_d2h_h2d": lay.overlap_cpu_optimizer_d2h_h2d}
    for k in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(lay, k) != "fp32":
            opt[k] = getattr(lay, k)
    always = {"model": m,
              "train": {"micro_batch_size": lay.micro_batch_size, "global_batch_size": work.global_batch_size},
              "optimizer": opt, "ddp": {"use_distributed_optimizer": lay.use_distributed_optimizer}}
    if work.task == "lora":  # the fields of peft/lora.py's LoRA dataclass (l.143-147)
        always["peft"] = {"dim": work.lora_rank, "target_modules": list(work.lora_target_modules)}

    o, d = context.options or RunOptions(), RunOptions()
    if_present: dict[str, dict[str, Any]] = {
        "model": {"virtual_pipeline_model_parallel_size": None, "pipeline_model_parallel_layout": None,
                  "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
                  "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
                  "recompute_method": None, "recompute_num_layers": None, "recompute_modules": None,
                  "seq_length": work.seq_length},
        "dataset": {"seq_length": work.seq_length, "sequence_length": work.seq_length},
        "optimizer": {"optimizer_cpu_offload": False, "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"},
    }
    runs, defaults = _run_settings(o), _run_settings(d)["model"] | _run_settings(d)["ddp"]
    if not o.cross_entropy_loss_fusion:
        del runs["model"]["cross_entropy_fusion_impl"]
    if not o.cpu_offloading_num_layers:
        del runs["model"]["cpu_offloading_num_layers"]
    if not model.is_moe:
        del runs["model"]["moe_permute_fusion"], runs["model"]["moe_router_force_load_balancing"]
    for sec, kv in runs.items():
        for k, v in kv.items():
            if v != defaults[k]:
                always.setdefault(sec, {})[k] = v
            else:
                if_present.setdefault(sec, {})[k] = v
    # mixed_precision's grad_reduce_in_fp32 wins over ddp's (module docstring)
    preset = _preset(context)
    if preset is None:
        (if_present if o.grad_reduce_in_fp32 else always)["mixed_precision"] = {
            "grad_reduce_in_fp32": o.grad_reduce_in_fp32}
    elif not o.grad_reduce_in_fp32 and _bf16_preset(context):
        always["mixed_precision"] = {**_BF16_MIXED, "grad_reduce_in_fp32": False}
    return always, if_present


def _run_settings(o: RunOptions) -> dict[str, dict[str, Any]]:
    """The Bridge keys of the run options ``o`` by section, in writing order."""
    return {
        "ddp": {"overlap_grad_reduce": o.overlap_grad_reduce, "overlap_param_gather": o.overlap_grad_reduce,
                "grad_reduce_in_fp32": o.grad_reduce_in_fp32},
        "model": {"cross_entropy_loss_fusion": o.cross_entropy_loss_fusion, "apply_rope_fusion": o.apply_rope_fusion,
                  "bias_activation_fusion": o.bias_activation_fusion, "cp_comm_type": o.cp_comm_type,
                  "cpu_offloading": o.cpu_offloading_num_layers > 0,
                  "cross_entropy_fusion_impl": o.cross_entropy_fusion_impl,
                  "cpu_offloading_num_layers": o.cpu_offloading_num_layers, "moe_permute_fusion": o.moe_permute_fusion,
                  "moe_router_force_load_balancing": o.moe_router_force_load_balancing},
    }


def _dtype_value(old: Any, new: Any) -> Any:
    """A dtype as the file writes it: a saved config's ``{_target_: torch.X, _call_: false}`` or a string."""
    if isinstance(old, Mapping) and "_target_" in old and isinstance(new, str):
        return {**old, "_target_": f"torch.{TORCH_DTYPES.get(new, new)}"}
    return new


def _merge(doc: dict[str, Any], always: Mapping[str, Mapping[str, Any]],
           if_present: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` with ``always``'s keys set (new ones at their section's end) and ``if_present``'s where present."""
    out = dict(doc)
    for sec in dict.fromkeys([*always, *if_present]):
        old = out.get(sec)
        body = dict(old) if isinstance(old, Mapping) else {}
        for k, v in if_present.get(sec, {}).items():
            if k in body and k not in always.get(sec, {}):
                body[k] = _dtype_value(body[k], v) if k.endswith("_dtype") else v
        for k, v in always.get(sec, {}).items():
            body[k] = _dtype_value(body.get(k), v) if k.endswith("_dtype") else v
        if body:
            out[sec] = body
    return out


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors; a list of scalars on one line (``[core_attn, moe_act]``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.SequenceNode:
    flat = all(not isinstance(x, (list, tuple, Mapping)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def _file_precision(doc: Mapping[str, Any]) -> str | None:
    """bf16 or fp8 as the file's ``mixed_precision`` selects it; None when it has none."""
    mp = doc.get("mixed_precision")
    if isinstance(mp, str):
        return "fp8" if "fp8" in mp else "bf16"
    if isinstance(mp, Mapping):
        return "fp8" if mp.get("fp8") else "bf16"
    return None


def _changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """``section.key`` of every setting ``after`` adds to ``before`` or gives another value (sections compared one
    level down; a whole new section is named once)."""
    out = []
    for sec, body in after.items():
        old = before.get(sec)
        if isinstance(body, Mapping) and isinstance(old, Mapping):
            out += [f"{sec}.{k}" for k, v in body.items() if k not in old or old[k] != v]
        elif old != body:
            out.append(str(sec))
    return out


def _header(context: ExportContext, doc: Mapping[str, Any], changed: list[str] | None = None) -> str:
    lay, est, from_file = context.layout, context.estimate, bool(context.bridge_yaml)
    lines = [f"# Megatron-Bridge settings for {context.model.name} on {context.cluster.label}: {lay.label}"]
    if est is not None:
        lines.append(f"# predicted (analytical cost model): {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                     f"{est.peak_bytes / GIB:.1f} GiB peak per GPU")
    if from_file:
        lines.append("# Your --from file with the layout in its keys (its comments are not kept).")
        if changed:  # the layout and the priced run options, where the file had other values or none
            lines += ["# " + line for line in
                      textwrap.wrap("Set here: " + ", ".join(changed) + ".", 100, break_on_hyphens=False)]
    else:
        lines.append("# An override: merge these keys into your ConfigContainer recipe.")
    have, priced = _file_precision(doc), str(context.workload.precision)
    if have is not None and have != priced:
        lines.append(f"# Priced at {priced}, but its mixed_precision is {have}: set it to match.")
    grads = "fp32" if (context.options or RunOptions()).grad_reduce_in_fp32 else "bf16"
    lines.append(f"# Gradients reduced in {grads}, as priced (ddp and mixed_precision grad_reduce_in_fp32)."
                 if not (note := grad_reduce_note(context)) else f"# Not as priced: {note}.")
    return "\n".join(lines) + "\n"


def bridge_yaml(context: ExportContext) -> str:
    """The user's Bridge YAML (or an empty document) with :func:`bridge_settings` written in, behind a header.

    Raises:
        TunerError: the YAML is a performance config, or as :func:`bridge_settings`.
    """
    doc: Any = {}
    if why := bridge_left_out(context.bridge_yaml):
        raise TunerError("--format bridge writes into a Megatron-Bridge override YAML or saved ConfigContainer; "
                         f"{why}: use --format recipe or megatron for this study")
    if context.bridge_yaml:
        doc = yaml.safe_load(context.bridge_yaml)
    always, if_present = bridge_settings(context)
    out = _merge(dict(doc), always, if_present)
    if "peft" in always and not isinstance(doc.get("peft"), Mapping):  # no adapter class of the file's own to keep
        out["peft"] = {"_target_": LORA_CLASS, **out["peft"]}
    body = yaml.dump(out, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    return _header(context, out, _changed(doc, out) if context.bridge_yaml else None) + body


class BridgeExporter(Exporter):
    """``megatron_bridge.yaml`` (:meth:`in_main_job` says when the main job writes it)."""

    name = "bridge"
    file_name = "megatron_bridge.yaml"
    description = ("megatron_bridge.yaml: the layout in Megatron-Bridge ConfigContainer keys (your --from Bridge YAML "
                   "with them written in, or an override of just them)")

    def in_main_job(self, context: ExportContext) -> bool:
        """With a ``--from`` Bridge YAML that is not a performance config, or for ``--task lora`` (the one exported
        format that trains LoRA adapters) without such a file."""
        if not context.bridge_yaml:
            return context.workload.task == "lora"
        return not bridge_left_out(context.bridge_yaml)

    def render(self, context: ExportContext) -> str:
        return bridge_yaml(context)
