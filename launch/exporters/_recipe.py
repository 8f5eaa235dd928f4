"""``recipe.yaml``: the layout in the seed recipe's format (``tests/fixtures/seed_minimax_m2_recipe.yaml``: same
fields and order, plus ``prediction`` and ``status``), checked against ``launch/schema/recipe.schema.json``."""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
import statistics
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cost_model import flops
from cost_model.uncertainty import error_bars
from launch.exporters._base import ExportContext, Exporter
from launch.exporters._bridge import bridge_scripts_note
from launch.exporters._describe import _layout_note, _summary
from launch.exporters._flags import GPT_YARN_SINCE, _max_tokens_per_gpu, _pipeline_layout_string, _recompute
from launch.exporters._shell import with_note
from launch.exporters._slime import slime_env, slime_script
from specs import Cluster, ModelSpec, RunOptions, Workload
from specs.errors import TunerError
from specs.layout import Dispatcher, Layout
from specs.units import GIB

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cost_model.types import Estimate
    from launch.base import Measurement

__all__ = ["recipe_dict", "dump_recipe", "validate_recipe", "recipe_schema", "RecipeExporter"]

_STACK_FRAMEWORK = "slime or Megatron-LM (a version with --pipeline-model-parallel-layout and the megatron_core below)"
_PREDICTION_SOURCE = "analytical cost model (cost_model/)"
_CORRECTNESS_NOTE = (
    "not run: check convergence against a reference layout (same weights and data, 20 steps, "
    "Megatron-Bridge's validate_convergence thresholds) before training on this layout: "
    "`tune verify --study STUDY --trial N --reference tp=1,pp=1,ep=1`"
)
_RECIPE_HEADER = "# A megatron-layout-tuner recipe; the fields are documented in launch/schema/recipe.schema.json.\n"


def _num(x: float, digits: int) -> float:
    return round(float(x), digits)


def _sig(x: float, n: int = 3) -> float:
    return float(f"{float(x):.{n}g}")


def _min_megatron_core(layout: Layout, model: ModelSpec) -> tuple[str, list[str]]:
    """Oldest megatron-core release known to accept the exported flags, with the reasons."""
    need = [("0.14.0", "--pipeline-model-parallel-layout, --use-precision-aware-optimizer and the flags used")]
    if layout.tp > model.num_query_groups:
        need.append(("0.16.0",
                     f"TP {layout.tp} above the {model.num_query_groups} query groups (TP % groups == 0 since 0.16)"))
    if layout.ep > 1 and layout.tp > 1 and not layout.sequence_parallel:
        need.append(("0.15.0", "EP and TP without sequence parallelism (an error before 0.15)"))
    if layout.dispatcher.moe_flex_dispatcher_backend and model.is_moe:
        # core <= 0.15 had only --moe-enable-deepep; --moe-flex-dispatcher-backend {deepep,hybridep} arrived with
        # HybridEP in core_v0.16.0 (transformer/moe/token_dispatcher.py; search_spaces.rules.FLEX_BACKEND_SINCE)
        need.append(("0.16.0", f"--moe-flex-dispatcher-backend {layout.dispatcher.moe_flex_dispatcher_backend}"))
    if model.rope_scaling_type == "yarn" and not model.is_mla:
        # the --yarn-* flags and their mapping onto a GPT model's config (megatron/training/argument_utils.py
        # _apply_yarn_config_from_args) arrived in 0.19; before it GPTModel's yarn branch reads config fields nothing
        # sets
        need.append((f"{GPT_YARN_SINCE[0]}.{GPT_YARN_SINCE[1]}.0",
                     "--position-embedding-type yarn with the --yarn-* flags (a GPT model's YaRN)"))
    version = max((v for v, _ in need), key=lambda v: tuple(int(x) for x in v.split(".")))
    return version, [w for _, w in need]


def _date(value: Any) -> _dt.date:
    if isinstance(value, _dt.datetime):
        return value.date()
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, str):
        return _dt.date.fromisoformat(value)
    return _dt.date.today()


def _result(measurement: Measurement, model: ModelSpec, cluster: Cluster, task: str) -> dict[str, Any]:
    tps = float(measurement.tokens_per_s_per_gpu)
    times = [float(t) for t in measurement.step_times_s]
    cv = None
    if len(times) >= 2 and statistics.fmean(times) > 0:
        cv = _num(100.0 * statistics.stdev(times) / statistics.fmean(times), 2)
    mfu = flops.mfu(model, tps, cluster.gpu.peak_flops_bf16, task)
    return {
        "tokens_per_s_per_gpu": _num(tps, 2),
        "usd_per_million_tokens": _sig(cluster.usd_per_gpu_hour * 1e6 / (tps * 3600.0)),
        "step_time_cv_percent": cv,
        "mfu": _num(mfu, 4),
        "measured": _date(measurement.extra.get("measured")),
        "peak_memory_gib": _num(measurement.peak_bytes / GIB, 2),
        "steps": len(times),
    }


def _prediction(estimate: Estimate, model: ModelSpec, cluster: Cluster, workload: Workload) -> dict[str, Any]:
    bars = error_bars(model, cluster.gpu, workload.precision)
    lo, hi = bars.throughput_interval(estimate.tokens_per_s_per_gpu)
    mlo, mhi = bars.memory_interval(estimate.peak_bytes)
    return {
        "tokens_per_s_per_gpu": _num(estimate.tokens_per_s_per_gpu, 2),
        "tokens_per_s_per_gpu_interval": [_num(lo, 1), _num(hi, 1)],
        "peak_memory_gib_interval": [_num(mlo / GIB, 2), _num(mhi / GIB, 2)],
        "interval": f"90%, error bars of the {bars.family} family (docs/error_bars.md)",
        "step_time_s": _sig(estimate.step_time_s, 4),
        "mfu": _num(estimate.mfu, 4),
        "model_tflops_per_gpu": _num(estimate.model_tflops_per_gpu, 1),
        "usd_per_million_tokens": _sig(estimate.usd_per_million_tokens),
        "peak_memory_gib": _num(estimate.peak_bytes / GIB, 2),
        "headroom_gib": _num((estimate.hbm_bytes - estimate.peak_bytes) / GIB, 2),
        "memory_gib": {k: _num(v / GIB, 2) for k, v in estimate.memory.items()},
        "time_s": {k: _sig(v, 4) for k, v in estimate.time.items()},
        "source": _PREDICTION_SOURCE,
        "note": "predicted, not measured",
    }


def _model_name(model: ModelSpec) -> str:
    """A preset's name, or for a ``config.json`` path the folder (checkpoint) name."""
    p = Path(model.name)
    if p.suffix != ".json":
        return model.name
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem


def _layout_section(layout: Layout, model: ModelSpec, workload: Workload, pls: str | None) -> dict[str, Any]:
    f, last = layout.num_layers_in_first_pipeline_stage, layout.num_layers_in_last_pipeline_stage
    offload = None
    if layout.optimizer_offload_fraction > 0:
        offload = {"optimizer_fraction": float(layout.optimizer_offload_fraction),
                   "overlap_cpu_optimizer_d2h_h2d": bool(layout.overlap_cpu_optimizer_d2h_h2d)}
    return {
        "label": layout.label,
        "summary": _summary(layout, model, workload, pls),
        **{k: int(getattr(layout, k)) for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")},
        "sequence_parallel": bool(layout.sequence_parallel and layout.tp > 1),
        "layer_split": {"first": f or None, "last": last or None} if (f or last) and layout.pp > 1 else None,
        "pipeline_model_parallel_layout": pls,
        "max_tokens_per_gpu": _max_tokens_per_gpu(layout, workload),
        "rows_per_microbatch": int(layout.micro_batch_size),
        "recompute": _recompute(layout) or None,
        "offload": offload,
        "dispatcher": layout.dispatcher.value if model.is_moe else None,
        "optimizer": {"distributed": bool(layout.use_distributed_optimizer),
                      "precision_aware": bool(layout.use_precision_aware_optimizer),
                      "exp_avg_dtype": layout.exp_avg_dtype, "exp_avg_sq_dtype": layout.exp_avg_sq_dtype},
    }


def recipe_dict(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *,
                estimate: Estimate | None = None, measurement: Measurement | None = None, study: str = "",
                correctness: Mapping[str, Any] | None = None, extra_notes: Sequence[str] = (),
                options: RunOptions | None = None, stack: str = "", user_args: Sequence[str] = ()) -> dict[str, Any]:
    """The recipe for ``layout``, in the seed's key order; :func:`dump_recipe` writes it.

    ``status``: ``predicted``; ``measured`` (with ``result``) or ``failed`` for a measured ``measurement``; ``verified``
    when measured and ``correctness`` says ``pass``. MFU = 6 N tokens/s / dense bf16 peak, N = active parameters (the
    seed's convention); the date is ``measurement.extra["measured"]``, else today.

    Raises:
        TunerError: as :func:`slime_script`, or ``estimate`` / ``measurement`` belongs to another layout.
    """
    if estimate is not None and estimate.layout != layout:
        raise TunerError(f"the estimate is for {estimate.layout.label}, not for {layout.label}")
    if measurement is not None and measurement.layout != layout:
        raise TunerError(f"the measurement is for {measurement.layout.label}, not for {layout.label}")
    run = slime_script(model, cluster, workload, layout, options=options, user_args=user_args)
    pls = _pipeline_layout_string(layout, model)

    status, result, failure_note = _status(measurement, correctness, model, cluster, workload.task)

    core, core_why = _min_megatron_core(layout, model)
    stack_note = f"megatron-core >= {core}: {'; '.join(core_why)}."
    if model.qk_layernorm_full_dim:
        stack_note += " Needs slime's slime_plugins (MiniMax-M2 layer spec) importable, also under Megatron-LM."

    notes = _notes(model, cluster, layout, status, failure_note, extra_notes, pls)

    recipe: dict[str, Any] = {
        "schema_version": 1,
        "model": _model_name(model),
        "gpu": _gpu_section(cluster),
        "author": {"name": "megatron-layout-tuner"},
        "status": status,
    }
    if study:
        recipe["study"] = study
    recipe |= {
        "stack": {"framework": _STACK_FRAMEWORK, "megatron_core": f">={core}", "note": stack_note,
                  **_run_block(options, stack, user_args)},
        "workload": _workload_section(workload),
        "layout": _layout_section(layout, model, workload, pls),
        "result": result,
        "prediction": _prediction(estimate, model, cluster, workload) if estimate is not None else None,
        "correctness": {"result": "not run", "note": _CORRECTNESS_NOTE} if correctness is None else dict(correctness),
        "env": slime_env(model, cluster, workload, layout, options=options, user_args=user_args),
        "patches": [],
        "run": run,
        "notes": notes,
    }
    return recipe


def _status(measurement: Measurement | None, correctness: Mapping[str, Any] | None, model: ModelSpec,
            cluster: Cluster, task: str) -> tuple[str, dict[str, Any] | None, str | None]:
    """The recipe's ``status`` (predicted, measured, failed or verified), its ``result`` section and the failure's note.
    """
    status, result, failure_note = "predicted", None, None
    if measurement is not None and measurement.source == "measured":
        if measurement.failure.value != "none":
            status = "failed"
            failure_note = f"The measured trial failed ({measurement.failure.value})" + (
                f"; log: {measurement.log_path}" if measurement.log_path else ""
            )
        else:
            status, result = "measured", _result(measurement, model, cluster, task)
    if status == "measured" and correctness is not None and correctness.get("result") == "pass":
        status = "verified"
    return status, result, failure_note


def _gpu_section(cluster: Cluster) -> dict[str, Any]:
    """The recipe's ``gpu`` section: type, memory, count, per node and the network."""
    return {
        "type": cluster.gpu.name,
        "memory_gb": math.ceil(cluster.gpu.hbm_bytes / GIB),
        "count": int(cluster.num_gpus),
        "per_node": int(cluster.gpus_per_node),
        "network": {
            "fabric": cluster.network.key if cluster.network else "unnamed",
            **({"name": cluster.network.name} if cluster.network else {}),
            "per_node_gbps": _sig(cluster.inter_node_bytes_per_s * 8 / 1e9),
            "nvlink_domain": int(cluster.nvlink_size),
            "dispatchers_not_across": list(cluster.network.not_across) if cluster.network else [],
        },
    }


def _workload_section(workload: Workload) -> dict[str, Any]:
    """The recipe's ``workload`` section: row length, rows, global batch, precision (and the task, LoRA's rank)."""
    return {
        "row_tokens": int(workload.seq_length),
        "rows": workload.dataset,
        "global_batch": int(workload.global_batch_size),
        "precision": str(workload.precision),
        **({"task": workload.task} if workload.task != "pretrain" else {}),
        **({"lora": {"rank": workload.lora_rank, "target_modules": list(workload.lora_target_modules),
                     "note": "Megatron-Bridge's LoRA (peft.lora.LoRA dim and target_modules); Megatron-LM and slime "
                             "have no LoRA arguments, so `run` trains every "
                             "weight"}} if workload.task == "lora" else {}),
    }


def _notes(model: ModelSpec, cluster: Cluster, layout: Layout, status: str, failure_note: str | None,
           extra_notes: Sequence[str], pls: Any) -> list[str]:
    """The recipe's ``notes``: status, the pipeline layout in words, what slime and Megatron-LM change or need."""
    notes: list[str] = []
    if status == "predicted":
        notes.append("Predicted by the analytical cost model, not measured: run it (`tune` trials) before relying on "
                     "the numbers.")
    if failure_note:
        notes.append(failure_note + ".")
    notes.extend(str(n) for n in extra_notes)
    if pls is not None:
        notes.append(_layout_note(pls, layout, model))
    if model.extra_megatron_args:
        notes.append(f"The model's config ({model.source or model.name}) adds these launch arguments: "
                     f"{shlex.join(model.extra_megatron_args)}.")
    if model.is_moe and layout.dispatcher == Dispatcher.allgather:
        notes.append("slime rewrites the allgather dispatcher to alltoall (it needs variable sequence lengths), so "
                     "`run` asks for alltoall.")
    if model.qk_layernorm_full_dim:
        notes.append(
            "MODEL_ARGS follow slime's scripts/models/minimax-m2.sh: its own layer spec (`--spec "
            "slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec`, full-width q and k norm) and router flags."
        )
    if model.rope_scaling_type == "yarn" and not model.is_mla:
        notes.append(
            f"Position embedding: YaRN as the model's config.json gives it (factor {model.rope_scaling_factor:g}, "
            f"original {model.rope_scaling_original_max_position_embeddings or 4096:,} positions, beta_fast "
            f"{model.rope_scaling_beta_fast:g}, beta_slow {model.rope_scaling_beta_slow:g}, correction range "
            f"{'rounded' if model.rope_scaling_truncate else 'not rounded'}), as Megatron-Bridge builds it, so a run "
            "from the Hugging Face checkpoint sees its positions; the --yarn-* flags need megatron-core 0.19 or newer "
            "(stack.megatron_core; a study with an older --megatron-core exports plain RoPE and says so). "
            "Megatron-LM's own GPT-OSS examples pass --position-embedding-type rope instead (examples/gptoss), which "
            "runs on older releases but does not reproduce the checkpoint's positional encoding. The tuner's own trial "
            "harness builds plain RoPE (the same cost)."
        )
    if not layout.use_distributed_optimizer:
        notes.append("slime always turns the distributed optimizer on; the layout's non-distributed optimizer holds "
                     "for Megatron-LM only.")
    if model.is_moe and layout.dispatcher == Dispatcher.flex_deepep and layout.etp * layout.ep > cluster.nvlink_size:
        net = cluster.network
        notes.append(
            f"The EP group ({layout.ep} ranks) spans NVLink domains, so DeepEP's inter-node kernels carry the tokens: "
            "they need RDMA NICs that DeepEP's NVSHMEM transport supports (InfiniBand; RoCE untested by DeepEP)"
            + (f"; the network assumed is {net.name} ({net.key}), on which they "
               f"{'run' if net.dispatcher(layout.dispatcher).runs == 'true' else 'are untested'}"
               "." if net is not None else
               "; no network was named: check yours before relying on this layout.")
        )
    notes.append(
        "`run` (the body of run_slime.sh) trains on your rows with slime's SFT path on a running Ray cluster: it needs "
        "HF_CKPT, TORCH_DIST, SFT_DATA and SAVE_DIR, and reads SLIME_DIR (a slime checkout), NUM_EPOCH (1) or "
        "NUM_ROLLOUT; BENCHMARK=1 runs the seed's 20-step benchmark. For Megatron-LM, megatron_args.sh launches "
        "pretrain_gpt.py with torchrun (DATA_PATH, TOKENIZER_MODEL, TRAIN_ITERS, CHECKPOINT_PATH), or `source` it for "
        "MEGATRON_ARGS."
    )
    return notes


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings as ``|`` blocks and no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    if "\n" in s:
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", s)


_Dumper.add_representer(str, _represent_str)


def dump_recipe(recipe: Mapping[str, Any]) -> str:
    """The recipe as YAML behind a comment header, keys in the dict's order."""
    return _RECIPE_HEADER + yaml.dump(dict(recipe), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


# --------------------------------------------------------------------------- schema


@lru_cache(maxsize=1)
def recipe_schema() -> dict[str, Any]:
    """``launch/schema/recipe.schema.json`` (draft 2020-12, cached) with the dispatcher enum from
    :class:`specs.layout.Dispatcher`."""
    text = resources.files("launch").joinpath("schema/recipe.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    schema["properties"]["layout"]["properties"]["dispatcher"]["enum"] = [*(d.value for d in Dispatcher), None]
    return schema


def _jsonable(x: Any) -> Any:
    """YAML values as JSON sees them: dates become ISO strings, tuples lists."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (_dt.date, _dt.datetime)):
        return x.isoformat()
    return x


def validate_recipe(recipe: Mapping[str, Any]) -> None:
    """Check ``recipe`` against the schema, TP*PP*CP*DP == GPUs and ETP*EP*PP dividing them.

    Raises:
        TunerError: every problem as ``$.json.path: message``, one a line.
    """
    from jsonschema import Draft202012Validator

    doc = _jsonable(recipe)
    validator = Draft202012Validator(recipe_schema())
    lines = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: (e.json_path, e.message)):
        msg = err.message if len(err.message) <= 200 else err.message[:197] + "..."
        lines.append(f"{err.json_path}: {msg}")
    if not lines:
        lay, gpu = doc["layout"], doc["gpu"]
        n = gpu["count"]
        dense = lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"]
        if dense != n:
            lines.append(f"$.layout: tp*pp*cp*dp = {dense} but gpu.count is {n}")
        if n % (lay["etp"] * lay["ep"] * lay["pp"]):
            lines.append(f"$.layout: etp*ep*pp = {lay['etp'] * lay['ep'] * lay['pp']} does not divide gpu.count {n}")
    if lines:
        raise TunerError("recipe does not match launch/schema/recipe.schema.json:\n" + "\n".join(lines))


def _run_block(options: RunOptions | None, stack: str, user_args: Sequence[str]) -> dict[str, Any]:
    """``stack.preset``, ``stack.run_options`` (fields off :class:`RunOptions`' defaults), ``stack.user_args``."""
    import dataclasses

    d: dict[str, Any] = {}
    if stack:
        d["preset"] = stack
    if options is not None:
        default = RunOptions()
        changed = [f.name for f in dataclasses.fields(options) if getattr(options, f.name) != getattr(default, f.name)]
        d["run_options"] = {k: list(v) if isinstance(v := getattr(options, k), tuple) else v for k in changed}
    if user_args:
        d["user_args"] = [str(a) for a in user_args]
    return d


class RecipeExporter(Exporter):
    """``recipe.yaml``: :func:`recipe_dict` of the context, validated (:func:`validate_recipe`), as YAML
    (:func:`dump_recipe`)."""

    name = "recipe"
    file_name = "recipe.yaml"
    description = ("recipe.yaml: the seed recipe's fields with a prediction block and a status (validated against "
                   "launch/schema/recipe.schema.json)")

    def render(self, context: ExportContext) -> str:
        rec = recipe_dict(context.model, context.cluster, context.workload, context.layout, estimate=context.estimate,
                          measurement=context.measurement, study=context.study, correctness=context.correctness,
                          extra_notes=context.notes, options=context.options, stack=context.stack,
                          user_args=context.user_args)
        validate_recipe(rec)
        return with_note(dump_recipe(rec), bridge_scripts_note(context.bridge_yaml, slime=True))
