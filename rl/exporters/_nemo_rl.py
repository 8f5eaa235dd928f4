"""``nemo_rl_grpo.yaml``: an RL plan as a NeMo-RL GRPO recipe, checked against our schema of NeMo-RL's config keys.

The keys are those NeMo-RL's config TypedDicts read at v0.6.0 (5fb58893):
``nemo_rl/distributed/virtual_cluster.py::ClusterConfig``, ``nemo_rl/algorithms/grpo.py::GRPOConfig`` and
``AsyncGRPOConfig``, ``nemo_rl/models/policy/__init__.py::PolicyConfig`` / ``MegatronConfig`` / ``DTensorConfig``,
``nemo_rl/models/generation/interfaces.py::GenerationConfig`` / ``ColocationConfig``,
``nemo_rl/models/generation/vllm/config.py::VllmSpecificArgs``; the AutoModel backend's
``dtensor_cfg.expert_parallel_size`` as the ``minimax-m3`` branch (e1cefaa3) reads it.
``rl/schema/nemo_rl_grpo.schema.json`` is our JSON Schema of those keys; every rendered recipe is validated against it.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._shell import comment
from rl.exporters._describe import prediction_lines, rl_plan_of
from specs.errors import TunerError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rl.plan import RLJob, RLPlan
    from specs.model import ModelSpec

__all__ = ["NemoRLRecipeExporter", "nemo_rl_config", "nemo_rl_schema", "render_nemo_rl_yaml"]


def hf_model_id(model: ModelSpec) -> str:
    """What NeMo-RL's ``policy.model_name`` loads for ``model``: the Hugging Face id of a preset read from
    ``https://huggingface.co/<org>/<name>`` (its ``_source``), the folder of a ``config.json`` the user gave,
    else the model's name. Never aiconfigurator's id (``rl.engine.AIC_MODELS``), which may name another model.
    """
    src = model.source.split()[0] if model.source.strip() else ""
    m = re.match(r"https://huggingface\.co/([^/\s]+/[^/\s]+)", src)
    if m:
        return m.group(1)
    if Path(src).name == "config.json":
        return str(Path(src).resolve().parent)
    return model.name


def nemo_rl_config(plan: RLPlan, job: RLJob) -> dict[str, Any]:
    """The NeMo-RL recipe as a mapping (the keys NeMo-RL reads; the rest come from ``defaults``).

    Raises TunerError: a plan NeMo-RL cannot run (an SGLang engine)."""
    from rl.engine import Engine, GenerationPrecision
    from rl.trainer import TrainerBackend

    c = plan.choice
    if c.engine != Engine.vllm:
        raise TunerError("the NeMo-RL export needs a vLLM engine (NeMo-RL's generation backend); use --engine vllm or "
                         "--framework slime")
    per = job.cluster.gpus_per_node
    lay = plan.trainer.layout
    policy: dict[str, Any] = {
        "model_name": hf_model_id(job.model),
        "train_global_batch_size": job.train_sequences,
        "train_micro_batch_size": 1,
        "logprob_batch_size": 1,
        "max_total_sequence_length": job.max_total_len,
    }
    if plan.trainer.backend == TrainerBackend.automodel:
        policy["dtensor_cfg"] = {
            "enabled": True,
            "tensor_parallel_size": 1,
            "context_parallel_size": lay.cp,
            "expert_parallel_size": lay.ep,
            "sequence_parallel": False,
            "activation_checkpointing": True,
        }
        policy["megatron_cfg"] = {"enabled": False}
    else:
        mc: dict[str, Any] = {
            "enabled": True,
            "tensor_model_parallel_size": lay.tp,
            "pipeline_model_parallel_size": lay.pp,
            "context_parallel_size": lay.cp,
            "expert_model_parallel_size": lay.ep,
            "expert_tensor_parallel_size": lay.etp,
            "sequence_parallel": lay.tp > 1,
            "activation_checkpointing": lay.recompute_granularity.value == "full",
        }
        if lay.num_layers_in_first_pipeline_stage:
            mc["num_layers_in_first_pipeline_stage"] = lay.num_layers_in_first_pipeline_stage
            mc["num_layers_in_last_pipeline_stage"] = lay.num_layers_in_last_pipeline_stage
        if lay.vpp > 1:
            mc["virtual_pipeline_model_parallel_size"] = lay.vpp
        if job.training_precision.value != "bf16":
            # NeMo-RL's FP8 recipes (grpo-deepseek-v3-64n8g-fp8-async-1off.yaml): fp8_cfg with the recipe's scaling
            mc["fp8_cfg"] = {"enabled": True, "fp8": "e4m3",
                             "fp8_recipe": "blockwise" if job.training_precision.value == "fp8_blockwise"
                             else "tensorwise", "fp8_param": False}
        policy["dtensor_cfg"] = {"enabled": False}
        policy["megatron_cfg"] = mc
    s = c.shape
    vllm_cfg: dict[str, Any] = {
        "tensor_parallel_size": s.tp,
        "pipeline_parallel_size": s.pp,
        "expert_parallel_size": s.ep,
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "enforce_eager": c.enforce_eager,
        "max_model_len": job.max_total_len,
        # NeMo-RL requires the synchronous engine when vLLM EP exceeds TP (docs/guides/checkpoint-engine-refit.md)
        "async_engine": bool(c.async_steps) and s.ep <= s.tp,
    }
    if job.generation_precision == GenerationPrecision.fp8:
        vllm_cfg["precision"] = "fp8"
    policy["generation"] = {
        "backend": "vllm",
        "max_new_tokens": job.response_len,
        "colocated": {
            "enabled": c.colocated,
            "resources": {"gpus_per_node": None if c.colocated else per,
                          "num_nodes": None if c.colocated else c.rollout_gpus // per},
        },
        "vllm_cfg": vllm_cfg,
        "vllm_kwargs": {"max_num_seqs": c.max_num_seqs},
    }
    grpo: dict[str, Any] = {"num_prompts_per_step": job.prompts_per_step,
                            "num_generations_per_prompt": job.generations_per_prompt}
    if c.async_steps:
        grpo["async_grpo"] = {"enabled": True, "max_trajectory_age_steps": c.async_steps,
                              "in_flight_weight_updates": True}
    return {
        "defaults": "../../grpo_math_1B.yaml",
        "grpo": grpo,
        "policy": policy,
        "data": {"max_input_seq_length": job.prompt_len},
        "cluster": {"gpus_per_node": per, "num_nodes": job.cluster.num_nodes},
    }


def nemo_rl_schema() -> dict[str, Any]:
    """Our JSON schema of the NeMo-RL GRPO recipe keys (``rl/schema/nemo_rl_grpo.schema.json``)."""
    text = resources.files("rl").joinpath("schema/nemo_rl_grpo.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def render_nemo_rl_yaml(plan: RLPlan, job: RLJob) -> str:
    """The NeMo-RL recipe YAML text, headed by the prediction as comments, validated against :func:`nemo_rl_schema`.

    Raises TunerError: a plan NeMo-RL cannot run, or a recipe that fails the schema (the key named)."""
    cfg = nemo_rl_config(plan, job)
    try:
        jsonschema.validate(cfg, nemo_rl_schema())
    except jsonschema.ValidationError as e:
        where = ".".join(str(k) for k in e.absolute_path) or "(top)"
        raise TunerError(f"the NeMo-RL recipe fails rl/schema/nemo_rl_grpo.schema.json at {where}: {e.message}") \
            from None
    place = ("place this file two folders below NeMo-RL's examples/configs/grpo_math_1B.yaml, e.g. in "
             "examples/configs/recipes/llm/: `defaults` names that file relative to this one")
    head = "".join(c + "\n" for line in [*prediction_lines(plan, job), place] for c in comment(line, None))
    return head + yaml.safe_dump(cfg, sort_keys=False)


class NemoRLRecipeExporter(Exporter):
    """``nemo_rl_grpo.yaml``: :func:`render_nemo_rl_yaml` of the context's RL plan (``tune rl --out``)."""

    name = "nemo-rl"
    file_name = "nemo_rl_grpo.yaml"
    description = ("nemo_rl_grpo.yaml: an RL plan as a NeMo-RL GRPO recipe (tune rl --out; checked against "
                   "rl/schema/nemo_rl_grpo.schema.json)")
    main_job = False

    def render(self, context: ExportContext) -> str:
        """The recipe of ``context.rl_plan``.

        Raises TunerError: no RL plan in the context, a plan NeMo-RL cannot run, or a schema failure."""
        plan, job = rl_plan_of(context, self.name)
        return render_nemo_rl_yaml(plan, job)
