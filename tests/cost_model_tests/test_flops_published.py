"""Our FLOPs per token against the ``implied_gflop_per_token`` of every published run (issue 3).

The rows excluded are chosen by :func:`cost_model.validate.flops_check_rows`'s stated rule
(accounting of the newest release per model), never by hand; the test also pins which
rows the rule removes, so a change in the rule or the data shows up here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_model.flops import megatron_flops_per_token
from cost_model.validate import flops_check_rows, read_runs
from specs import load_model

CSV = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "published_runs.csv"  # a copy of shared/data/published_runs.csv


@pytest.fixture(scope="module")
def checked():
    if not CSV.is_file():
        pytest.skip(f"{CSV} not present")
    runs, problems = read_runs(CSV)
    assert not problems
    return flops_check_rows(runs)


def test_every_model_within_2_percent(checked):
    kept = [d for d in checked if not d["excluded"]]
    bad = [(d["run"].run_id, d["run"].model_name, round(d["ours"], 1), d["implied"]) for d in kept if abs(d["error"]) > 0.02]
    assert not bad
    models = {d["run"].model.name for d in kept}
    assert {"Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "DeepSeek-V3", "Kimi-K2", "GPT-OSS-120B"} <= models


def test_excluded_rows_follow_the_rule(checked):
    excluded = {d["run"].run_id for d in checked if d["excluded"]}
    gpt_oss_old = {d["run"].run_id for d in checked if d["run"].model.name == "GPT-OSS-120B" and abs(d["implied"] - 32.6) > 1 and d["run"].seq_length == 4096}
    assert gpt_oss_old and gpt_oss_old <= excluded  # 27.2 (<= 26.04.01) vs 32.6 (26.06+)
    fw = {d["run"].run_id: d["run"].framework_version for d in checked if d["excluded"]}
    others = {i for i, f in fw.items() if "AutoModel" in f or "24.07" in f}
    # 194-195: GPT-OSS 25.11 at 8K (old accounting); 101, 350: tokens/s and TFLOP/s disagree by >1.5% in the source
    assert excluded - gpt_oss_old - others <= {"101", "194", "195", "350"}


def test_gpt_oss_sliding_window_accounting():
    m = load_model("GPT-OSS-120B")
    assert m.num_window_layers == 18 and m.window_size == 128
    assert abs(megatron_flops_per_token(m, 4096) / 1e9 / 32.6 - 1) < 0.01
    # the older release's 27.2: non-gated experts and no window
    old = m.replace(gated_linear_unit=False, window_size=0, activation_func="silu", activation_func_clamp_value=0.0, glu_linear_offset=0.0)
    assert abs(megatron_flops_per_token(old, 4096) / 1e9 / 27.2 - 1) < 0.01
