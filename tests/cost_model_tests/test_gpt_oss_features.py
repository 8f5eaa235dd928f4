"""GPT-OSS's layer features: read from its config.json, refused when malformed, and priced where measured."""

from __future__ import annotations

import pytest

from cost_model.calibration import DEFAULT_CALIBRATION
from cost_model.estimate import estimate
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Layout


def test_gpt_oss_config_reads_its_features():
    m = load_model("GPT-OSS-120B")
    assert (m.add_bias_linear, m.add_qkv_bias, m.softmax_type, m.activation_func) == (
        True, True, "learnable", "quick_gelu",
    )
    assert (m.activation_func_clamp_value, m.glu_linear_offset) == (7.0, 1.0)
    q = load_model("Qwen3-30B-A3B")  # every other model keeps Megatron-core's defaults of the others
    assert (q.add_bias_linear, q.softmax_type, q.activation_func, q.activation_func_clamp_value) == (
        False, "vanilla", "silu", 0.0,
    )


@pytest.mark.parametrize("field,value", [("softmax_type", "sink"), ("activation_func", "gelu")])
def test_unknown_feature_values_are_refused(field, value):
    with pytest.raises(TunerError, match=field):
        load_model("GPT-OSS-120B").replace(**{field: value})


def test_expert_biases_cost_step_time_only():
    """The measured bias cost (``expert_bias_bytes_per_copy_moe``) lengthens the step of GPT-OSS and nothing else."""
    m = load_model("GPT-OSS-120B")
    cl, wl = parse_gpus("8xH100"), Workload(seq_length=4096, global_batch_size=64)
    lay = Layout(world_size=8, ep=8)
    with_b, without = (
        estimate(m, cl, wl, lay),
        estimate(m.replace(add_bias_linear=False, add_qkv_bias=False), cl, wl, lay),
    )
    assert with_b.step_time_s > without.step_time_s * 1.01
    assert with_b.peak_bytes == without.peak_bytes


def _gpt_oss_config(tmp_path, **changes):
    import json
    from pathlib import Path

    import specs

    cfg = json.loads((Path(specs.__file__).parent / "data" / "models" / "GPT-OSS-120B.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize(
    "changes,needle",
    [
        (
            {"layer_types": ["sliding_atention", "full_attention"] * 18},
            "layer_types entries must be sliding_attention or full_attention",
        ),
        ({"swiglu_limit": -1}, "activation_func_clamp_value"),
        ({"hidden_act": "gelu"}, "needs a gated MLP"),
        ({"tuner": {"add_bias_linear": "no"}}, "add_bias_linear must be true or false"),
        ({"tuner": {"activation_func": "silu"}}, "apply to the quick_gelu GLU only"),
        ({"tuner": {"name": 5}}, "name must be a string"),
        ({"tuner": {"extra_megatron_args": "--foo"}}, "extra_megatron_args must be a list of strings"),
        ({"tuner": {"window_attn_skip_freq": 2}}, "window_attn_skip_freq"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": "fast"}},
            "rope_scaling.beta_fast must be a finite number",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_slow": 0}},
            "YaRN rope_scaling needs 0 < beta_slow <= beta_fast",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096.5}},
            "original_max_position_embeddings must be an integer",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "truncate": "no"}},
            "rope_scaling_truncate must be true or false",
        ),
        ({"rope_scaling": [1, 2]}, "rope_scaling must be an object"),
        ({"rope_scaling": {"rope_type": "bogus", "factor": 2.0}}, "rope_scaling.rope_type must be one of"),
        ({"rope_scaling": {"rope_type": 5}}, "rope_scaling.rope_type must be one of"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 0}}, "0 < factor"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": "32"}}, "rope_scaling.factor must be a finite number"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "mscale": "x"}},
            "rope_scaling.mscale must be a finite number",
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 0.5}}, "beta_slow <= beta_fast"),
    ],
)
def test_malformed_gpt_oss_configs_are_refused(tmp_path, changes, needle):
    with pytest.raises(TunerError, match=needle):
        load_model(_gpt_oss_config(tmp_path, **changes))


def test_gpt_oss_without_layer_types_alternates_as_transformers_does(tmp_path):
    """transformers' GptOssConfig default: layer 0 slides, layer 1 is full, and so on."""
    m = load_model(_gpt_oss_config(tmp_path, layer_types=None))
    assert m.window_attn_skip_freq == (0, 1) * 18 and m.num_window_layers == 18


def test_context_parallel_with_sinks_or_windows_needs_a2a():
    """Transformer Engine runs sinks under CP only with cp_comm_type a2a (and sliding windows with a2a or
    all_gather)."""
    from search_spaces.rules import RuleEnv, check_layout
    from specs import RunOptions

    m, wl = load_model("GPT-OSS-120B"), Workload(seq_length=4096, global_batch_size=64)
    cp2 = Layout(world_size=16, cp=2, ep=8)
    assert [r for r, _ in check_layout(cp2, m, wl)] == ["cp_attention_variant"]
    assert check_layout(cp2, m, wl, RuleEnv.of(options=RunOptions(cp_comm_type="a2a"))) == []
    assert check_layout(Layout(world_size=16, ep=8), m, wl) == []
    plain = m.replace(softmax_type="vanilla", window_size=0, window_attn_skip_freq=())  # neither feature: p2p is fine
    assert check_layout(cp2, plain, wl) == []
    windows_only = m.replace(softmax_type="vanilla")
    assert [r for r, _ in check_layout(cp2, windows_only, wl)] == ["cp_attention_variant"]


def test_the_bounded_dp_overlap_is_the_same_in_the_estimate_and_its_details():
    """Many expert parameters per rank and a short micro-batch (GPT-OSS at EP 8, micro-batch 1): the DP overlap is
    bounded
    by one micro-batch, and the single-layout estimate's dp_comm equals the slowest rank class's in the step details."""
    from cost_model.estimate import estimate_details
    from specs import RunOptions

    m, cl = load_model("GPT-OSS-120B"), parse_gpus("64xB200")
    wl = Workload(seq_length=4096, global_batch_size=256)
    lay = Layout(world_size=64, ep=8, micro_batch_size=1)
    opts = RunOptions(overlap_grad_reduce=True, moe_router_force_load_balancing=True)
    e = estimate(m, cl, wl, lay, options=opts, memory_headroom=0.0)
    d = estimate_details(m, cl, wl, lay, options=opts, memory_headroom=0.0)
    assert e.time["dp_comm"] == pytest.approx(max(d.tail["dp_comm"]), rel=1e-9)
    exposed = estimate(
        m, cl, wl, lay, options=RunOptions(moe_router_force_load_balancing=True), memory_headroom=0.0
    ).time["dp_comm"]
    share = exposed * (1 - DEFAULT_CALIBRATION.dp_overlap)  # what dp_overlap alone would leave
    assert share < e.time["dp_comm"] < exposed  # the window binds: more is left than the share, less than all


def test_yarn_details_read_as_transformers_reads_them(tmp_path):
    """Absent or null: original positions from max_position_embeddings, betas 32 / 1, truncate true."""
    rs = {"rope_type": "yarn", "factor": 32.0, "beta_fast": None}
    m = load_model(_gpt_oss_config(tmp_path, rope_scaling=rs, max_position_embeddings=131072))
    assert (
        m.rope_scaling_original_max_position_embeddings, m.rope_scaling_beta_fast, m.rope_scaling_beta_slow,
        m.rope_scaling_truncate,
    ) == (131072, 32.0, 1.0, True)
    shipped = load_model("GPT-OSS-120B")
    assert (shipped.rope_scaling_original_max_position_embeddings, shipped.rope_scaling_truncate) == (4096, False)


def test_a_recorded_model_without_yarn_details_takes_them_from_its_preset_or_drops_yarn():
    """A study recorded before YaRN's details existed: GPT-OSS as its preset (no rounding), never the defaults."""
    import json

    from tuner.study.storage import _EXPORT_ONLY_MODEL_FIELDS, model_spec_from_dict, model_spec_to_dict

    full = json.loads(json.dumps(model_spec_to_dict(load_model("GPT-OSS-120B"))))
    old = {k: v for k, v in full.items() if k not in _EXPORT_ONLY_MODEL_FIELDS}
    m = model_spec_from_dict(old)
    assert m == load_model("GPT-OSS-120B") and m.rope_scaling_truncate is False
    edited = model_spec_from_dict(
        {**old, "activation_func_clamp_value": 3.0}
    )  # not the preset: its details are unknown
    assert edited.rope_scaling_type == "" and edited.activation_func_clamp_value == 3.0
