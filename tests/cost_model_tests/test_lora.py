"""``--task lora`` and ``--task sft``: the adapters' memory, the frozen weights' skipped weight gradients, bad input.

The expected adapter counts are written out from the model's shapes here (not from the code under test), so a term
off by 10% fails.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_model.calibration import Calibration
from cost_model.estimate import estimate
from cost_model.terms import compute, context
from specs import DEFAULT_RUN_OPTIONS, Layout, LayoutTable, TunerError, Workload, load_model, parse_gpus
from tuner.cli import app

GIB = 2**30
R = 32  # Megatron-Bridge's default rank


def _adapters_llama(m) -> float:
    """LoRA elements of Llama-3.1-8B at rank R on qkv, proj, fc1, fc2 (SwiGLU: fc1 is 2 x ffn wide)."""
    h, f, d = m.hidden_size, m.ffn_hidden_size, m.kv_channels
    q, kv = m.num_attention_heads * d, 2 * m.num_query_groups * d
    return m.num_layers * R * ((h + q + kv) + (q + h) + (h + 2 * f) + (f + h))


def _pair(model: str, gpus: str, lay: Layout):
    m, c = load_model(model), parse_gpus(gpus)
    base = estimate(m, c, Workload(), lay)
    lora = estimate(m, c, Workload(task="lora", lora_rank=R), lay)
    return m, base, lora


def test_lora_keeps_frozen_weights_and_gives_the_adapters_grads_and_state():
    m, base, lora = _pair("Llama-3.1-8B", "8xH100", Layout(world_size=8))
    a = _adapters_llama(m)
    assert lora.memory["weights"] == pytest.approx(base.memory["weights"] + 2 * a, rel=1e-6)
    assert lora.memory["main_grads"] == pytest.approx(4 * a, rel=1e-6)  # fp32 main grads, adapters only
    # precision-aware Adam: 2-B master remainders + two fp32 moments, sharded over DP 8
    assert lora.memory["optimizer"] == pytest.approx(10 * a / 8, rel=1e-6)


def test_moe_experts_share_one_adapter_per_ep_rank():
    """Qwen3-30B-A3B at EP 8: each MoE layer's local experts share one fc1 and one fc2 adapter
    (share_expert_adapters)."""
    m, base, lora = _pair("Qwen3-30B-A3B", "8xH100", Layout(world_size=8, ep=8))
    h, d, fm = m.hidden_size, m.kv_channels, m.moe_ffn_hidden_size
    q, kv = m.num_attention_heads * d, 2 * m.num_query_groups * d
    attn = m.num_layers * R * ((h + q + kv) + (q + h))
    experts = m.num_layers * R * ((h + 2 * fm) + (fm + h))
    assert lora.memory["main_grads"] == pytest.approx(4 * (attn + experts), rel=1e-6)
    assert lora.memory["optimizer"] == pytest.approx(10 * (attn / 8 + experts / 1), rel=1e-6)  # EDP = 8 / 8


def test_tensor_parallelism_splits_the_adapters():
    m, _, lora = _pair("Llama-3.1-8B", "8xH100", Layout(world_size=8, tp=2, sequence_parallel=True))
    assert lora.memory["main_grads"] == pytest.approx(4 * _adapters_llama(m) / 2, rel=1e-6)


def _ctx(task: str):
    m, c = load_model("Llama-3.1-8B"), parse_gpus("8xH100")
    return context.build_context(
        m, c, Workload(task=task), LayoutTable.from_layouts([Layout(world_size=8)]), Calibration(), DEFAULT_RUN_OPTIONS
    )


def test_frozen_gemms_skip_the_weight_gradient():
    """Forward, input gradient, weight gradient: 3 passes of a weight GEMM; LoRA's frozen weights skip the third. Core
    attention (no weights) keeps its 3."""
    pre, lora = _ctx("pretrain"), _ctx("lora")
    assert float(compute.attention_compute_time(pre, 1.0, 0.0, 0.0)) == 3.0
    assert float(compute.attention_compute_time(lora, 1.0, 0.0, 0.0)) == 2.0
    assert float(compute.attention_compute_time(lora, 0.0, 1.0, 0.0)) == 3.0
    assert float(compute.moe_compute_time(lora, 1.0, 0.0, 0.0, 0.0)) == 2.0
    assert float(compute.dense_compute_time(lora, 1.0, 0.0)) == 2.0
    assert float(compute.logits_time(lora).max()) < float(compute.logits_time(pre).max())


def test_lora_is_faster_and_sft_is_pretraining():
    m, c, lay = load_model("Llama-3.1-8B"), parse_gpus("8xH100"), Layout(world_size=8)
    pre, sft = estimate(m, c, Workload(), lay), estimate(m, c, Workload(task="sft"), lay)
    assert (sft.step_time_s, sft.peak_bytes) == (pre.step_time_s, pre.peak_bytes)
    lora = estimate(m, c, Workload(task="lora"), lay)
    assert lora.time["compute"] < pre.time["compute"] and lora.time["dp_comm"] < pre.time["dp_comm"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "lora", "--lora-rank", "0"], "--lora-rank must be a positive integer, got 0"),
        (
            ["--task", "lora", "--lora-target-modules", "linear_qkv,router"],
            "--lora-target-modules 'router': accepted linear_qkv",
        ),
        (["--lora-rank", "8"], "--lora-rank and --lora-target-modules need --task lora"),
        (["--task", "dpo"], "--task 'dpo': accepted pretrain, sft, lora"),
    ],
)
def test_bad_lora_input_exits_2(args, message):
    r = CliRunner().invoke(app, ["estimate", "--model", "Llama-3.1-8B", "--gpus", "8xH100", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_lora_on_a_module_the_model_does_not_have_is_refused():
    m, c = load_model("DeepSeek-V3"), parse_gpus("256xH100")
    lay = Layout(
        world_size=256, pp=16, ep=16, num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=2
    )
    with pytest.raises(TunerError, match="multi-latent attention, which has no linear_qkv") as e:
        estimate(m, c, Workload(task="lora", lora_target_modules=("linear_qkv", "linear_fc1")), lay)
    assert "--lora-target-modules linear_fc1)" in str(e.value) and "linear_q_proj" not in str(e.value)
    on_mla = Workload(task="lora").on_model(m.is_mla)  # the default targets: what Bridge's default adapts there
    assert on_mla.lora_target_modules == ("linear_proj", "linear_fc1", "linear_fc2")
    assert estimate(m, c, on_mla, lay).memory["main_grads"] > 0
    assert Workload(task="lora").on_model(False) == Workload(task="lora")
    assert (
        estimate(m, c, Workload(task="lora", lora_target_modules=("linear_fc1", "linear_fc2")), lay).memory[
            "main_grads"
        ]
        > 0
    )
    assert dataclasses.replace(Workload(task="lora"), lora_rank=8).lora_rank == 8


def test_adapters_cost_their_memory_passes(monkeypatch):
    """Each adapted layer reads and writes its input 6 times and its output 10 times a token (bf16), at the achieved
    HBM bandwidth: Llama-3.1-8B with adapters on linear_qkv only, TP 2 (qkv is column-parallel: whole input, half the
    output), written out from the shapes."""
    from cost_model.terms import lora

    m, c = load_model("Llama-3.1-8B"), parse_gpus("8xH100")
    lay = Layout(world_size=8, tp=2, sequence_parallel=True)
    w = Workload(task="lora", lora_rank=16, lora_target_modules=("linear_qkv",))
    ctx = context.build_context(m, c, w, LayoutTable.from_layouts([lay]), Calibration(), DEFAULT_RUN_OPTIONS)
    h, d = m.hidden_size, m.kv_channels
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * d
    per_token = 2 * (6 * h + 10 * qkv / 2)
    attn, dense, moe = lora.adapter_time(ctx, ctx.tokens)
    assert float(attn[0, 0]) == pytest.approx(per_token * w.seq_length / ctx.hbm_bytes_per_s, rel=1e-9)
    assert float(dense[0, 0]) == 0.0 and float(moe[0, 0]) == 0.0  # fc1 / fc2 not adapted
    with_adapters = estimate(m, c, w, lay).time["compute"]
    monkeypatch.setattr(lora, "ADAPTER_INPUT_PASSES", 0.0)
    monkeypatch.setattr(lora, "ADAPTER_OUTPUT_PASSES", 0.0)
    microbatches = w.global_batch_size // (8 // 2)
    w = dataclasses.replace(w)  # a new object: estimate() keeps recent results by the workload's identity
    assert with_adapters - estimate(m, c, w, lay).time["compute"] == pytest.approx(
        microbatches * m.num_layers * float(attn[0, 0]), rel=1e-6
    )


def test_published_lora_rows_read_their_task_and_recipe_adapters():
    """The Megatron-Bridge SFT / LoRA rows of the run table are predicted (with --task), not refused; its Llama-3-70B
    LoRA perf recipes adapt linear_qkv only at rank 16; a bad note names itself."""
    from cost_model.run_table import _lora_settings
    from cost_model.validate import read_runs

    runs = {
        r.run_id: r for r in read_runs(Path(__file__).resolve().parents[2] / "benchmarks/data/published_runs.csv")[0]
    }
    assert runs["102"].workload.task == "sft" and runs["103"].workload.task == "lora"
    assert not runs["103"].unrepresentable
    assert (runs["391"].workload.lora_rank, runs["391"].workload.lora_target_modules) == (16, ("linear_qkv",))
    assert runs["102"].workload.lora_rank == Workload().lora_rank  # SFT keeps the defaults (unused)
    with pytest.raises(TunerError, match="lora_rank='0': a positive integer"):
        _lora_settings({"lora_rank": "0"})
    with pytest.raises(TunerError, match="router"):
        _lora_settings({"lora_target_modules": "[linear_qkv, router]"})
