"""RL exporters: the NeMo-RL recipe against our schema and the seed's recipe; the slime launch script."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from launch.exporters import ExportContext, get_exporter
from rl.engine import Engine, EngineShape, LatencyTable
from rl.exporters import nemo_rl_config, nemo_rl_schema, plan_context, render_nemo_rl_yaml, render_slime_script
from rl.lengths import LengthDistribution
from rl.plan import Framework, PlanChoice, RLJob, evaluate
from rl.trainer import TrainerBackend, rl_workload, trainer_for_layout
from specs import load_model, parse_gpus
from specs.errors import TunerError

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "rl" / "nemo_rl_minimax_m3_seed.yaml"


def _latency(job, shape):
    return LatencyTable.from_functions(lambda n, c: 0.02 + 1e-5 * n, lambda t: 1e-5 * t, max_ctx=job.max_total_len)


def seed_plan(engine=Engine.vllm, framework=Framework.nemo_rl, backend=TrainerBackend.automodel, model="MiniMax-M3"):
    job = RLJob(
        model=load_model(model), cluster=parse_gpus("32x8xH200"), framework=framework, engine=engine, prompt_len=2048,
        response_len=6144, mean_prompt_len=512, responses=LengthDistribution.from_mean_max(3072, 6144),
        prompts_per_step=32, generations_per_prompt=16,
    )
    wl = rl_workload(sequences=512, mean_total_len=512 + 3072, max_total_len=8192)
    sub = parse_gpus("16x8xH200")
    if backend == TrainerBackend.automodel:
        tr = trainer_for_layout(job.model, sub, wl, backend, cp=8, ep=128)
    else:
        tr = trainer_for_layout(job.model, sub, wl, backend, tp=2, ep=16, pp=4)
    choice = PlanChoice(
        colocated=False,
        rollout_gpus=128,
        trainer_gpus=128,
        shape=EngineShape(tp=16, ep=16),
        gpu_memory_utilization=0.8,
        max_num_seqs=256,
        enforce_eager=True,
        trainer_backend=backend,
        engine=engine,
    )
    return evaluate(job, choice, trainer=tr, latency=_latency), job


def _get(d, path):
    for k in path.split("."):
        d = d[k]
    return d


SEED_KEYS = [
    "cluster.num_nodes", "cluster.gpus_per_node", "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt",
    "policy.train_global_batch_size", "policy.train_micro_batch_size", "policy.logprob_batch_size",
    "policy.max_total_sequence_length", "policy.dtensor_cfg.context_parallel_size",
    "policy.dtensor_cfg.expert_parallel_size", "policy.dtensor_cfg.activation_checkpointing",
    "policy.generation.max_new_tokens", "policy.generation.colocated.enabled",
    "policy.generation.colocated.resources.num_nodes", "policy.generation.colocated.resources.gpus_per_node",
    "policy.generation.vllm_cfg.tensor_parallel_size", "policy.generation.vllm_cfg.pipeline_parallel_size",
    "policy.generation.vllm_cfg.expert_parallel_size", "policy.generation.vllm_cfg.gpu_memory_utilization",
    "policy.generation.vllm_cfg.enforce_eager", "policy.generation.vllm_cfg.max_model_len", "data.max_input_seq_length",
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
    assert cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"] == 2 and cfg["policy"]["dtensor_cfg"] == {
        "enabled": False
    }
    bad = nemo_rl_config(plan, job)
    bad["policy"]["generation"]["vllm_cfg"]["gpu_memory_utilization"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_recipe_names_the_trained_model_not_the_engine_data_model(tmp_path):
    """MiniMax-M2's engine costs come from aiconfigurator's MiniMax-M2.5 config; the recipe must still load M2."""
    plan, job = seed_plan(model="MiniMax-M2")
    assert nemo_rl_config(plan, job)["policy"]["model_name"] == "MiniMaxAI/MiniMax-M2"
    cfg = json.loads(
        (Path(__file__).resolve().parents[2] / "specs" / "data" / "models" / "MiniMax-M2.json").read_text()
    )
    cfg = {k: v for k, v in cfg.items() if k not in ("_source", "tuner")}
    folder = tmp_path / "my-m2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    plan, job = seed_plan(model=str(folder / "config.json"))
    assert nemo_rl_config(plan, job)["policy"]["model_name"] == str(folder.resolve())


def test_recipe_says_it_is_a_prediction_and_where_it_must_sit():
    plan, job = seed_plan()
    head = [line for line in render_nemo_rl_yaml(plan, job).splitlines() if line.startswith("#")]
    assert any("PREDICTED" in line for line in head) and any("measured: none" in line for line in head)
    assert any(f"{plan.step_time_s:.1f} s" in line for line in head)
    assert any("two folders below NeMo-RL's examples/configs/grpo_math_1B.yaml" in line for line in head)


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
    assert (
        flags["--actor-num-nodes"] == "16"
        and flags["--rollout-num-gpus"] == "128"
        and flags["--rollout-num-gpus-per-engine"] == "16"
    )
    assert flags["--sglang-ep-size"] == "16" and flags["--tensor-model-parallel-size"] == "2"
    assert "--sglang-disable-cuda-graph" in text and "--colocate" not in text
    assert 'exec "$PYTHON" "$SLIME_DIR/train.py" "${PLAN_ARGS[@]}" "$@"' in text


def test_exporters_refuse_what_their_framework_cannot_run():
    plan, job = seed_plan()
    with pytest.raises(TunerError, match="SGLang"):
        render_slime_script(plan, job)
    splan, sjob = seed_plan(engine=Engine.sglang)
    with pytest.raises(TunerError, match="vLLM"):
        render_nemo_rl_yaml(splan, sjob)


# --------------------------------------------------------------------------- the registry and the executed slime RL
# launch


FAKE_SLIME = Path(__file__).resolve().parent / "fake_entry" / "slime_rl"


def _sglang_plan(colocated: bool, async_steps: int, shape: EngineShape, eager: bool):
    job = RLJob(
        model=load_model("Qwen3-30B-A3B"), cluster=parse_gpus("4x8xH100"), framework=Framework.slime,
        engine=Engine.sglang, prompt_len=512, response_len=4096, mean_prompt_len=200,
        responses=LengthDistribution.from_mean_max(2000, 4096), prompts_per_step=32, generations_per_prompt=8,
    )
    n_train = 32 if colocated else 16
    tr = trainer_for_layout(
        job.model, parse_gpus(f"{n_train // 8}x8xH100"), job.workload, TrainerBackend.megatron, tp=2, ep=8, pp=1
    )
    choice = PlanChoice(
        colocated=colocated,
        rollout_gpus=32 if colocated else 16,
        trainer_gpus=n_train,
        shape=shape,
        gpu_memory_utilization=0.75,
        max_num_seqs=384,
        enforce_eager=eager,
        async_steps=async_steps,
        trainer_backend=TrainerBackend.megatron,
        engine=Engine.sglang,
    )
    return evaluate(job, choice, trainer=tr, latency=_latency), job


@pytest.mark.parametrize(
    ("colocated", "async_steps", "shape", "eager"),
    [(False, 1, EngineShape(tp=2, ep=8, attention_dp=4), True), (True, 0, EngineShape(tp=4, ep=1), False)],
)
def test_run_slime_rl_sh_executes_and_its_values_arrive(tmp_path, colocated, async_steps, shape, eager):
    import json
    import os
    import shutil
    import stat
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    plan, job = _sglang_plan(colocated, async_steps, shape, eager)
    exporter = get_exporter("slime-rl")
    (tmp_path / "out dir").mkdir()  # a path with a space; an exporter makes no folder
    script = exporter.write(plan_context(plan, job), tmp_path / "out dir" / exporter.file_name)
    assert script.name == "run_slime_rl.sh" and stat.S_IMODE(script.stat().st_mode) == 0o755
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text and "PREDICTED" in text
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env.update(PYTHON=sys.executable, SLIME_DIR=str(FAKE_SLIME), FAKE_ENTRY_DUMP=str(tmp_path / "dump.json"))
    user = ["--hf-checkpoint", "/ckpt/Qwen3 30B", "--prompt-data", "/data/dapo;17k.jsonl", "--rm-type", "deepscaler"]
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "1-62").write_text("")  # an unquoted glob would expand here
    p = subprocess.run([str(script), *user], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    a = d["args"]
    c = plan.choice
    assert d["entry"] == ("train_async.py" if async_steps else "train.py")
    assert (a["actor_num_nodes"], a["actor_num_gpus_per_node"]) == (c.trainer_gpus // 8, 8)
    assert a["colocate"] is colocated and a["rollout_num_gpus"] == (None if colocated else c.rollout_gpus)
    assert a["rollout_num_gpus_per_engine"] == shape.gpus
    assert (a["tensor_model_parallel_size"], a["expert_model_parallel_size"], a["sequence_parallel"]) == (2, 8, True)
    assert (a["rollout_batch_size"], a["n_samples_per_prompt"], a["global_batch_size"]) == (32, 8, 256)
    assert (a["rollout_max_prompt_len"], a["rollout_max_response_len"]) == (512, 4096)
    assert a["sglang_mem_fraction_static"] == 0.75 and a["sglang_max_running_requests"] == 384
    assert a["sglang_ep_size"] == (shape.ep if shape.ep > 1 else None)
    assert a["sglang_enable_dp_attention"] is (shape.attention_dp > 1) and a["sglang_dp_size"] == (
        shape.attention_dp if shape.attention_dp > 1 else None
    )
    assert a["sglang_disable_cuda_graph"] is eager
    assert d["rest"] == user  # the caller's flags arrive after the plan's, each one word, untouched


def test_rl_formats_are_registered_and_refuse_a_training_layout():
    from launch.exporters import exporter_names, main_job_exporters
    from specs import Workload
    from specs.layout import Layout

    assert exporter_names()[-2:] == ["nemo-rl", "slime-rl"]
    assert {"nemo-rl", "slime-rl"}.isdisjoint(
        e.name for e in main_job_exporters()
    )  # `tune` does not write them for a training study
    ctx = ExportContext(
        model=load_model("Qwen3-30B-A3B"),
        cluster=parse_gpus("8xH100"),
        workload=Workload(seq_length=4096, global_batch_size=64),
        layout=Layout(world_size=8, ep=8),
    )
    for name in ("nemo-rl", "slime-rl"):
        with pytest.raises(
            TunerError, match=rf"--format {name} renders an RL post-training plan: .*tune rl .*--out DIR"
        ):
            get_exporter(name).render(ctx)
    plan, job = seed_plan()
    text = get_exporter("nemo-rl").render(plan_context(plan, job))
    assert text == render_nemo_rl_yaml(plan, job) and not get_exporter("nemo-rl").executable
