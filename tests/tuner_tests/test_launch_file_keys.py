"""Megatron-Bridge YAML keys as ``tune --from`` reads them: numbers as keys named, never a crash; a wrong
``--model``, a YAML that is no Bridge config and a typo of a setting the tuner reads refused (exit 2, nothing
written); unknown settings that are no typo named as not understood."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app
from tuner.launch_file import read_launch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "launch"
BRIDGE_PERF = FIX / "qwen3_30b_a3b_llm_pretrain.yaml"
#: The model section of Megatron-Bridge's Qwen3-30B-A3B recipe (its architecture settings).
QWEN3_30B_A3B = """model:
  num_layers: 48
  hidden_size: 2048
  num_attention_heads: 32
  num_query_groups: 4
  kv_channels: 128
  num_moe_experts: 128
  moe_ffn_hidden_size: 768
  moe_router_topk: 8
  tensor_model_parallel_size: 1
train:
  global_batch_size: 512
"""


def test_a_numeric_perf_matrix_key_is_named_as_not_understood(tmp_path):
    f = tmp_path / "perf.yaml"
    f.write_text(
        BRIDGE_PERF.read_text().replace("        cuda_graphs: false\n", "        cuda_graphs: false\n        1: 2\n", 1)
    )
    lf = read_launch(f, model="Qwen3-30B-A3B", gpus="H100")
    assert "perf_matrix.h100.num_gpus_16.common.1" in lf.not_understood


@pytest.mark.parametrize(
    "text, model, message",
    [
        (  # the file's model is Qwen3-30B-A3B: each setting that differs named with both values, no equal one
            QWEN3_30B_A3B,
            "Llama-3.1-8B",
            "its model settings are not Llama-3.1-8B's: model.num_layers 48 (Llama-3.1-8B: 32), model.hidden_size 2048"
            " (Llama-3.1-8B: 4096), model.num_query_groups 4 (Llama-3.1-8B: 8), model.num_moe_experts 128 "
            "(Llama-3.1-8B: unset); give --model with the preset of the file's model",
        ),
        ("model:\n  ffn_hidden_size: 1000\n", "Llama-3.1-8B", "model.ffn_hidden_size 1000 (Llama-3.1-8B: 14336)"),
        (  # a model verification card: a model key, but no Bridge setting in it
            "title: qwen3_30b_a3b\nsummary: a card\nmodel:\n  hf_id: Qwen/Qwen3-30B-A3B\n  architecture: Qwen3Moe\n"
            "items:\n  inference:\n    status: verified\n",
            "Qwen3-30B-A3B",
            "none of its settings is one the tuner reads (0 arguments understood; 5 not understood: title summary",
        ),
        (
            "model:\n  tensor_model_paralel_size: 2\n",
            "Qwen3-30B-A3B",
            "model.tensor_model_paralel_size is not a Megatron-Bridge setting the tuner reads; did you mean "
            "tensor_model_parallel_size?",
        ),
        (
            "train:\n  micro_batch_sise: 2\n",
            "Qwen3-30B-A3B",
            "train.micro_batch_sise is not a Megatron-Bridge setting the tuner reads; did you mean micro_batch_size?",
        ),
        ("model:\n  sequence_paralel: true\n", "Qwen3-30B-A3B", "did you mean sequence_parallel?"),
        ("model:\n  num_layer: 4\n", "Qwen3-30B-A3B", "did you mean num_layers?"),
        (  # another adapter class: priced as LoRA or as full training, both wrong
            "model:\n  tensor_model_parallel_size: 1\npeft:\n  _target_: megatron.bridge.peft.lora.CanonicalLoRA\n",
            "Qwen3-30B-A3B",
            "peft._target_ megatron.bridge.peft.lora.CanonicalLoRA: the tuner prices Megatron-Bridge's LoRA",
        ),
        (  # every linear module but these: not the named targets the tuner prices
            "model:\n  tensor_model_parallel_size: 1\npeft:\n  dim: 16\n  exclude_modules: [linear_fc2]\n",
            "Qwen3-30B-A3B",
            "peft.exclude_modules: the tuner prices the adapters of named modules; give peft.target_modules",
        ),
    ],
)
def test_a_bridge_yaml_that_would_be_misread_is_refused(tmp_path, text, model, message):
    f = tmp_path / "override.yaml"
    f.write_text(text)
    out = tmp_path / "results"
    r = CliRunner().invoke(app, ["--from", str(f), "--model", model, "--gpus", "16xH100", "--results-dir", str(out)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "text, model, not_understood",
    [
        (QWEN3_30B_A3B, "Qwen3-30B-A3B", ()),  # the file's own model
        ("model:\n  num_layers: 4\n", "Qwen3-30B-A3B", ()),  # fewer layers: a slice
        (QWEN3_30B_A3B, None, ()),  # no --model: the file's settings name its model
        # settings of Megatron-Bridge beside ones the tuner reads, and unknown settings: named, not refused
        (
            "model:\n  seq_length: 4096\n  fp4_recipe: nvfp4\n  tp_comm_overlap_ag: true\n  my_experimental_knob: 3\n",
            "Qwen3-30B-A3B",
            ("model.fp4_recipe", "model.tp_comm_overlap_ag", "model.my_experimental_knob"),
        ),
        (
            "dataset:\n  sequence_parallel_size: 1\nmodel:\n  seq_length: 4096\n",
            "Qwen3-30B-A3B",
            ("dataset.sequence_parallel_size",),
        ),
    ],
)
def test_a_bridge_yaml_of_the_model_with_unknown_settings_is_read(tmp_path, text, model, not_understood):
    f = tmp_path / "override.yaml"
    f.write_text(text)
    lf = read_launch(f, model=model)
    assert lf.model == "Qwen3-30B-A3B" and lf.not_understood == not_understood


def test_a_perf_config_has_no_model_section_to_compare():
    lf = read_launch(BRIDGE_PERF, model="Llama-3.1-8B", gpus="16xH100")
    assert lf.model == "Llama-3.1-8B"
