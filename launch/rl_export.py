"""Render an RL plan as a NeMo-RL recipe YAML or a slime launch script (pure functions: text in, text out).

NeMo-RL keys are those its config TypedDicts read at v0.6.0 (5fb58893):
``nemo_rl/distributed/virtual_cluster.py::ClusterConfig``, ``nemo_rl/algorithms/grpo.py::GRPOConfig``
and ``AsyncGRPOConfig``, ``nemo_rl/models/policy/__init__.py::PolicyConfig`` / ``MegatronConfig`` /
``DTensorConfig``, ``nemo_rl/models/generation/interfaces.py::GenerationConfig`` /
``ColocationConfig``, ``nemo_rl/models/generation/vllm/config.py::VllmSpecificArgs``; the AutoModel
backend's ``dtensor_cfg.expert_parallel_size`` as the ``minimax-m3`` branch (e1cefaa3) reads it.
``launch/schema/nemo_rl_grpo.schema.json`` is our schema of those keys. slime flags are those of
``slime/utils/arguments.py`` (624b824a), in the style of its ``scripts/run-minimax-m2.sh``.

Both outputs say what was predicted (every number of the plan) and that nothing was measured.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from typing import Any

import yaml

from cost_model.rl.engine import Engine, aic_model_name
from cost_model.rl.plan import RLJob, RLPlan
from cost_model.rl.trainer import TrainerBackend
from specs.errors import TunerError

__all__ = ["nemo_rl_config", "nemo_rl_schema", "prediction_lines", "render_nemo_rl_yaml", "render_slime_script"]


def prediction_lines(plan: RLPlan, job: RLJob) -> list[str]:
    """What the plan predicts, one fact a line (for the header comments)."""
    p = plan.parts
    c = plan.choice
    mode = "colocated" if c.colocated else f"non-colocated: {c.rollout_gpus} rollout GPUs + {c.trainer_gpus} trainer GPUs, async K={c.async_steps}"
    return [
        f"tune rl plan for {job.model.name} on {job.cluster.label} ({mode})",
        "PREDICTED by megatron-layout-tuner (analytical model + rollout simulation); nothing below was measured",
        f"predicted step time {p.step_time_s:.1f} s = generation {p.generation_s:.1f} + log-prob {p.logprob_s:.1f} + training {p.training_s:.1f} "
        f"+ refit {p.refit_s:.1f} + switch {p.switch_s:.1f} + overhead {p.overhead_s:.1f} (K={c.async_steps}: {p.bound})",
        f"engines: {c.num_engines} x {plan.rollout_label}, gpu_memory_utilization {c.gpu_memory_utilization:g}, max_num_seqs {c.max_num_seqs}, "
        f"{'eager' if c.enforce_eager else 'CUDA graphs'}, KV cache {plan.kv_capacity_tokens:,} tokens/engine, {plan.preemptions} preemptions predicted",
        f"trainer: {plan.trainer.label} on {c.trainer_gpus} GPUs, predicted peak {plan.trainer.peak_bytes / 2**30:.1f} GiB/GPU",
        f"responses: {job.responses.source}",
        "measured: none (run it, then `tune rl calibrate --log LOG` to fit this cluster's factors)",
    ]


def nemo_rl_config(plan: RLPlan, job: RLJob) -> dict[str, Any]:
    """The NeMo-RL recipe as a mapping (the keys NeMo-RL reads; the rest come from ``defaults``).

    Raises:
        TunerError: a plan NeMo-RL cannot run (an SGLang engine).
    """
    c = plan.choice
    if c.engine != Engine.vllm:
        raise TunerError("the NeMo-RL export needs a vLLM engine (NeMo-RL's generation backend); use --engine vllm or --framework slime")
    per = job.cluster.gpus_per_node
    lay = plan.trainer.layout
    try:
        model_name = aic_model_name(job.model.name)
    except TunerError:
        model_name = job.model.name
    policy: dict[str, Any] = {
        "model_name": model_name,
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
        policy["dtensor_cfg"] = {"enabled": False}
        policy["megatron_cfg"] = mc
    s = c.shape
    policy["generation"] = {
        "backend": "vllm",
        "max_new_tokens": job.response_len,
        "colocated": {
            "enabled": c.colocated,
            "resources": {"gpus_per_node": None if c.colocated else per, "num_nodes": None if c.colocated else c.rollout_gpus // per},
        },
        "vllm_cfg": {
            "tensor_parallel_size": s.tp,
            "pipeline_parallel_size": s.pp,
            "expert_parallel_size": s.ep,
            "gpu_memory_utilization": c.gpu_memory_utilization,
            "enforce_eager": c.enforce_eager,
            "max_model_len": job.max_total_len,
            # NeMo-RL requires the synchronous engine when vLLM EP exceeds TP (docs/guides/checkpoint-engine-refit.md)
            "async_engine": bool(c.async_steps) and s.ep <= s.tp,
        },
        "vllm_kwargs": {"max_num_seqs": c.max_num_seqs},
    }
    grpo: dict[str, Any] = {"num_prompts_per_step": job.prompts_per_step, "num_generations_per_prompt": job.generations_per_prompt}
    if c.async_steps:
        grpo["async_grpo"] = {"enabled": True, "max_trajectory_age_steps": c.async_steps, "in_flight_weight_updates": True}
    return {
        "defaults": "../../grpo_math_1B.yaml",
        "grpo": grpo,
        "policy": policy,
        "data": {"max_input_seq_length": job.prompt_len},
        "cluster": {"gpus_per_node": per, "num_nodes": job.cluster.num_nodes},
    }


def render_nemo_rl_yaml(plan: RLPlan, job: RLJob) -> str:
    """The NeMo-RL recipe YAML text, headed by the prediction as comments.

    Raises:
        TunerError: a plan NeMo-RL cannot run.
    """
    head = "".join(f"# {line}\n" for line in prediction_lines(plan, job))
    return head + yaml.safe_dump(nemo_rl_config(plan, job), sort_keys=False)


def nemo_rl_schema() -> dict[str, Any]:
    """Our JSON schema of the NeMo-RL GRPO recipe keys (``launch/schema/nemo_rl_grpo.schema.json``)."""
    text = resources.files("launch").joinpath("schema/nemo_rl_grpo.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def render_slime_script(plan: RLPlan, job: RLJob) -> str:
    """A slime launch script (``#!/usr/bin/env bash``, ``set -euo pipefail``, arguments quoted).

    Raises:
        TunerError: a plan slime cannot run (a vLLM engine or an AutoModel trainer).
    """
    c = plan.choice
    if c.engine != Engine.sglang:
        raise TunerError("the slime export needs an SGLang engine (slime's rollout backend); use --engine sglang")
    if plan.trainer.backend != TrainerBackend.megatron:
        raise TunerError("the slime export needs a Megatron trainer; slime trains with Megatron-core")
    lay = plan.trainer.layout
    per = job.cluster.gpus_per_node
    s = c.shape
    actor_nodes = max(1, c.trainer_gpus // per)
    args: list[tuple[str, Any]] = [
        ("--actor-num-nodes", actor_nodes),
        ("--actor-num-gpus-per-node", min(per, c.trainer_gpus)),
    ]
    if c.colocated:
        args.append(("--colocate", None))
    else:
        args.append(("--rollout-num-gpus", c.rollout_gpus))
    args += [
        ("--rollout-num-gpus-per-engine", s.gpus),
        ("--tensor-model-parallel-size", lay.tp),
        ("--pipeline-model-parallel-size", lay.pp),
        ("--context-parallel-size", lay.cp),
        ("--expert-model-parallel-size", lay.ep),
        ("--expert-tensor-parallel-size", lay.etp),
    ]
    if lay.tp > 1:
        args.append(("--sequence-parallel", None))
    if lay.recompute_granularity.value == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    args += [
        ("--rollout-batch-size", job.prompts_per_step),
        ("--n-samples-per-prompt", job.generations_per_prompt),
        ("--global-batch-size", job.train_sequences),
        ("--rollout-max-prompt-len", job.prompt_len),
        ("--rollout-max-response-len", job.response_len),
        ("--sglang-mem-fraction-static", c.gpu_memory_utilization),
        ("--sglang-max-running-requests", c.max_num_seqs),
    ]
    if s.ep > 1:
        args.append(("--sglang-ep-size", s.ep))
    if s.attention_dp > 1:
        args += [("--sglang-enable-dp-attention", None), ("--sglang-dp-size", s.attention_dp)]
    if c.enforce_eager:
        args.append(("--sglang-disable-cuda-graph", None))
    entry = "train_async.py" if c.async_steps else "train.py"
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {line}" for line in prediction_lines(plan, job)]
    lines += [
        "# Model and data flags (--hf-checkpoint, --load, --prompt-data, MODEL_ARGS, ...) are yours: pass them after this script's name.",
        "set -euo pipefail",
        "",
        "PLAN_ARGS=(",
    ]
    for flag, val in args:
        lines.append(f"  {flag}" if val is None else f"  {flag} {shlex.quote(str(val))}")
    lines += [")", "", f'exec python3 {shlex.quote(entry)} "${{PLAN_ARGS[@]}}" "$@"', ""]
    return "\n".join(lines)
