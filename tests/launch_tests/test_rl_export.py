"""RL exporters: the NeMo-RL recipe against our schema and the seed's recipe; the slime launch script."""

from __future__ import annotations

import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from cost_model.rl.engine import Engine, EngineShape, LatencyTable
from cost_model.rl.lengths import LengthDistribution
from cost_model.rl.plan import Framework, PlanChoice, RLJob, evaluate
from cost_model.rl.trainer import TrainerBackend, rl_workload, trainer_for_layout
from launch.rl_export import nemo_rl_config, nemo_rl_schema, render_nemo_rl_yaml, render_slime_script
from specs import load_model, parse_gpus
from specs.errors import TunerError

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "rl" / "nemo_rl_minimax_m3_seed.yaml"


def _latency(job, shape):
    return LatencyTable.from_functions(lambda n, c: 0.02 + 1e-5 * n, lambda t: 1e-5 * t, max_ctx=job.max_total_len)


def seed_plan(engine=Engine.vllm, framework=Framework.nemo_rl, backend=TrainerBackend.automodel):
    job = RLJob(
        model=load_model("MiniMax-M3"),
        cluster=parse_gpus("32x8xH200"),
        framework=framework,
        engine=engine,
        prompt_len=2048,
        response_len=6144,
        mean_prompt_len=512,
        responses=LengthDistribution.from_mean_max(3072, 6144),
        prompts_per_step=32,
        generations_per_prompt=16,
    )
    wl = rl_workload(sequences=512, mean_total_len=512 + 3072, max_total_len=8192)
    sub = parse_gpus("16x8xH200")
    if backend == TrainerBackend.automodel:
        tr = trainer_for_layout(job.model, sub, wl, backend, cp=8, ep=128)
    else:
        tr = trainer_for_layout(job.model, sub, wl, backend, tp=2, ep=16, pp=4)
    choice = PlanChoice(colocated=False, rollout_gpus=128, trainer_gpus=128, shape=EngineShape(tp=16, ep=16), gpu_memory_utilization=0.8,
                        max_num_seqs=256, enforce_eager=True, trainer_backend=backend, engine=engine)
    return evaluate(job, choice, trainer=tr, latency=_latency), job


def _get(d, path):
    for k in path.split("."):
        d = d[k]
    return d


SEED_KEYS = [
    "cluster.num_nodes", "cluster.gpus_per_node",
    "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt",
    "policy.train_global_batch_size", "policy.train_micro_batch_size", "policy.logprob_batch_size", "policy.max_total_sequence_length",
    "policy.dtensor_cfg.context_parallel_size", "policy.dtensor_cfg.expert_parallel_size", "policy.dtensor_cfg.activation_checkpointing",
    "policy.generation.max_new_tokens",
    "policy.generation.colocated.enabled", "policy.generation.colocated.resources.num_nodes", "policy.generation.colocated.resources.gpus_per_node",
    "policy.generation.vllm_cfg.tensor_parallel_size", "policy.generation.vllm_cfg.pipeline_parallel_size", "policy.generation.vllm_cfg.expert_parallel_size",
    "policy.generation.vllm_cfg.gpu_memory_utilization", "policy.generation.vllm_cfg.enforce_eager", "policy.generation.vllm_cfg.max_model_len",
    "data.max_input_seq_length",
]


def test_seed_plan_exports_the_seed_recipe_key_for_key():
    plan, job = seed_plan()
    ours = yaml.safe_load(render_nemo_rl_yaml(plan, job))
    seed = yaml.safe_load(SEED.read_text())
    diffs = {k: (_get(ours, k), _get(seed, k)) for k in SEED_KEYS if _get(ours, k) != _get(seed, k)}
    assert not diffs


def test_exported_recipe_and_the_seed_recipe_pass_our_schema():
    schema = nemo_rl_schema()
    plan, job = seed_plan()
    jsonschema.validate(nemo_rl_config(plan, job), schema)
    jsonschema.validate(yaml.safe_load(SEED.read_text()), schema)
    mplan, mjob = seed_plan(backend=TrainerBackend.megatron)
    cfg = nemo_rl_config(mplan, mjob)
    jsonschema.validate(cfg, schema)
    assert cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"] == 2 and cfg["policy"]["dtensor_cfg"] == {"enabled": False}
    bad = nemo_rl_config(plan, job)
    bad["policy"]["generation"]["vllm_cfg"]["gpu_memory_utilization"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_recipe_says_it_is_a_prediction():
    plan, job = seed_plan()
    head = [line for line in render_nemo_rl_yaml(plan, job).splitlines() if line.startswith("#")]
    assert any("PREDICTED" in line for line in head) and any("measured: none" in line for line in head)
    assert any(f"{plan.step_time_s:.1f} s" in line for line in head)


def test_slime_script():
    plan, job = seed_plan(engine=Engine.sglang, framework=Framework.slime, backend=TrainerBackend.megatron)
    text = render_slime_script(plan, job)
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in lines
    flags = {}
    for line in lines:
        if line.startswith("  --"):
            parts = shlex.split(line)
            flags[parts[0]] = parts[1] if len(parts) > 1 else None
    assert flags["--actor-num-nodes"] == "16" and flags["--rollout-num-gpus"] == "128" and flags["--rollout-num-gpus-per-engine"] == "16"
    assert flags["--sglang-ep-size"] == "16" and flags["--tensor-model-parallel-size"] == "2"
    assert "--sglang-disable-cuda-graph" in text and "--colocate" not in text
    assert 'exec python3 train.py "${PLAN_ARGS[@]}" "$@"' in text


def test_exporters_refuse_what_their_framework_cannot_run():
    plan, job = seed_plan()
    with pytest.raises(TunerError, match="SGLang"):
        render_slime_script(plan, job)
    splan, sjob = seed_plan(engine=Engine.sglang)
    with pytest.raises(TunerError, match="vLLM"):
        render_nemo_rl_yaml(splan, sjob)
