"""Launch files whose YAML keys are numbers: read as the text of the number, never a crash."""

from __future__ import annotations

from pathlib import Path

from tuner.launch_file import read_launch

BRIDGE_PERF = Path(__file__).resolve().parents[1] / "fixtures" / "launch" / "qwen3_30b_a3b_llm_pretrain.yaml"


def test_a_numeric_perf_matrix_key_is_named_as_not_understood(tmp_path):
    f = tmp_path / "perf.yaml"
    f.write_text(
        BRIDGE_PERF.read_text().replace("        cuda_graphs: false\n", "        cuda_graphs: false\n        1: 2\n", 1)
    )
    lf = read_launch(f, model="Qwen3-30B-A3B", gpus="H100")
    assert "perf_matrix.h100.num_gpus_16.common.1" in lf.not_understood
