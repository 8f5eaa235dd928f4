"""GPT-OSS's layer features: read from its config.json, refused when malformed, and priced where measured."""

from __future__ import annotations

import pytest

from cost_model.estimate import estimate
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Layout


def test_gpt_oss_config_reads_its_features():
    m = load_model("GPT-OSS-120B")
    assert (m.add_bias_linear, m.add_qkv_bias, m.softmax_type, m.activation_func) == (True, True, "learnable", "quick_gelu")
    assert (m.activation_func_clamp_value, m.glu_linear_offset) == (7.0, 1.0)
    q = load_model("Qwen3-30B-A3B")  # every other model keeps Megatron-core's defaults of the others
    assert (q.add_bias_linear, q.softmax_type, q.activation_func, q.activation_func_clamp_value) == (False, "vanilla", "silu", 0.0)


@pytest.mark.parametrize("field,value", [("softmax_type", "sink"), ("activation_func", "gelu")])
def test_unknown_feature_values_are_refused(field, value):
    with pytest.raises(TunerError, match=field):
        load_model("GPT-OSS-120B").replace(**{field: value})


def test_expert_biases_cost_step_time_only():
    """The measured bias cost (``expert_bias_bytes_per_copy_moe``) lengthens the step of GPT-OSS and nothing else."""
    m = load_model("GPT-OSS-120B")
    cl, wl = parse_gpus("8xH100"), Workload(seq_length=4096, global_batch_size=64)
    lay = Layout(world_size=8, ep=8)
    with_b, without = estimate(m, cl, wl, lay), estimate(m.replace(add_bias_linear=False, add_qkv_bias=False), cl, wl, lay)
    assert with_b.step_time_s > without.step_time_s * 1.01
    assert with_b.peak_bytes == without.peak_bytes
