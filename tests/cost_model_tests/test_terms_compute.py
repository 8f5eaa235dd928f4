"""FLOPs and compute-time terms, worked out by hand on the tiny models and the round-numbered GPU.

TEST_GPU: 1e15 FLOP/s bf16, 2e15 fp8, HBM 2e12 B/s x hbm_efficiency 0.75 = 1.5e12 B/s achieved.
Unfitted calibration: gemm_efficiency 0.7 halving at 2e10 FLOPs, grouped GEMM 0.55 halving at 256
rows per expert, attention 0.45, 48 / 40 elementwise bytes per token / copy per hidden unit.
BASE: 512 tokens per micro-batch, tp 2.
"""

from __future__ import annotations

import numpy as np
import pytest
from term_fixtures import BASE, TEST_CAL, TEST_CLUSTER, TINY_DENSE, TINY_MOE, make_ctx

from cost_model.terms import activations, compute
from cost_model.terms.context import build_context
from specs import Precision, RunOptions, Workload, load_model
from specs.layout import Layout, LayoutTable

HBM = 2e12 * 0.75


def eff(f: float) -> float:
    """gemm_efficiency 0.7 x F / (F + 2e10)."""
    return 0.7 * f / (f + 2e10)


def test_gemm_efficiency():
    assert compute.gemm_efficiency(np.array([2e10, 6e10]), TEST_CAL).tolist() == pytest.approx([0.35, 0.525])
    assert compute.gemm_efficiency(np.array([0.0]), TEST_CAL)[0] == pytest.approx(0.7 / (1 + 2e10))  # floored at 1 FLOP


def test_flops_per_part():
    c = make_ctx(**BASE)
    assert compute.attention_linear_flops(c)[0, 0] == 2 * 512 * 12288 / 2
    assert compute.core_attention_flops(c)[0, 0] == 512 * 1024 * (64 + 64) / 2 / 2
    assert compute.expert_flops(c)[0, 0] == 2 * 512 * 2 * 3 * 64 * 32 / 2
    assert compute.router_flops(c)[0, 0] == 2 * 512 * 64 * 8 / 2
    assert compute.shared_expert_flops(c)[0, 0] == 2 * 512 * 3 * 64 * 64 / 2
    assert compute.dense_mlp_flops(c)[0, 0] == 2 * 512 * 3 * 64 * 256 / 2
    assert compute.logits_flops(c)[0, 0] == 2 * 512 * 64 * 1024 / 2 * (1 + 1)  # main head + 1 MTP head
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert compute.router_flops(d)[0, 0] == 0 and compute.shared_expert_flops(d)[0, 0] == 0


def test_core_attention_flops_on_sliding_window_layers():
    # half the layers attend to a window of 127 keys back: 128 x 129 / 2 + (1024 - 128) x 128 keys over 1,024 queries
    m = TINY_DENSE.replace(window_size=127, window_attn_skip_freq=(1, 0) * 4)
    keys_full, keys_win = (1024 + 1) / 2, (128 * 129 / 2 + 896 * 128) / 1024
    ratio = (0.5 * keys_full + 0.5 * keys_win) / keys_full
    c = make_ctx(model=m, tp=2, sequence_parallel=True)
    assert compute.core_attention_flops(c)[0, 0] == pytest.approx(1024 * 1024 * 128 / 2 / 2 * ratio)


def test_attention_times():
    c = make_ctx(**BASE)
    f = 2 * 512 * 12288 / 2
    assert compute.attention_linear_time(c)[0, 0] == pytest.approx(f / (1e15 * eff(f / 2)))
    # head dim 16 is not measured: the nearest measured pair in qk + v is (64, 64), 0.827 of head dim 128's speed
    assert compute.core_attention_time(c)[0, 0] == pytest.approx(512 * 1024 * 128 / 4 / (1e15 * 0.45 * 0.827))
    fp8 = make_ctx(workload=Workload(seq_length=1024, global_batch_size=16, precision=Precision.fp8), **BASE)
    assert compute.attention_linear_time(fp8)[0, 0] == pytest.approx(f / (2e15 * eff(f / 2)))  # GEMMs at the fp8 peak
    assert compute.core_attention_time(fp8)[0, 0] == pytest.approx(
        compute.core_attention_time(c)[0, 0]
    )  # attention stays bf16


def test_family_and_generation_factors_scale_every_compute_peak():
    """Blackwell's factor applies to B200 / GB200; Blackwell Ultra's multiplies it on B300 / GB300 (GEMMs at every
    precision and attention, through ``gemm_peak_flops`` and ``bf16_peak_flops``); Hopper has neither."""
    import dataclasses

    cal = TEST_CAL.replace(
        gemm_family_factor_blackwell=0.8, gemm_generation_factor_blackwell_ultra=1.25, fp8_gemm_efficiency_ratio=0.9
    )
    wl = Workload(seq_length=1024, global_batch_size=16, precision=Precision.fp8)
    table = LayoutTable.from_layouts([Layout(world_size=16, **BASE)])
    peaks = {}
    for fam, gen in (("hopper", ""), ("blackwell", ""), ("blackwell", "blackwell_ultra")):
        cl = dataclasses.replace(TEST_CLUSTER, gpu=dataclasses.replace(TEST_CLUSTER.gpu, family=fam, generation=gen))
        c = build_context(TINY_MOE, cl, wl, table, cal, RunOptions())
        peaks[(fam, gen)] = (c.gemm_peak_flops, c.bf16_peak_flops)
    assert peaks[("hopper", "")] == pytest.approx((2e15 * 0.9, 1e15))
    assert peaks[("blackwell", "")] == pytest.approx((2e15 * 0.9 * 0.8, 1e15 * 0.8))
    assert peaks[("blackwell", "blackwell_ultra")] == pytest.approx((2e15 * 0.9 * 0.8 * 1.25, 1e15 * 0.8 * 1.25))


def test_nvfp4_gemms_on_blackwell_ultra_take_the_family_factor_alone():
    """Blackwell Ultra's datasheet nvfp4 peak already differs from Blackwell's (GB300 15 PF, GB200 10 PF), so its
    nvfp4 GEMMs are not multiplied by the generation factor again; its attention (bf16) still is."""
    import dataclasses

    cal = TEST_CAL.replace(
        gemm_family_factor_blackwell=0.8, gemm_generation_factor_blackwell_ultra=1.25, nvfp4_gemm_efficiency_ratio=0.5
    )
    wl = Workload(seq_length=1024, global_batch_size=16, precision=Precision.nvfp4)
    table = LayoutTable.from_layouts([Layout(world_size=16, **BASE)])
    gpu = dataclasses.replace(TEST_CLUSTER.gpu, family="blackwell", generation="blackwell_ultra", peak_flops_fp4=4e15)
    c = build_context(TINY_MOE, dataclasses.replace(TEST_CLUSTER, gpu=gpu), wl, table, cal, RunOptions())
    assert (c.gemm_peak_flops, c.bf16_peak_flops) == pytest.approx((4e15 * 0.5 * 0.8, 1e15 * 0.8 * 1.25))


def test_attention_head_dim_factor():
    assert compute.attention_head_dim_factor(make_ctx(model=TINY_DENSE.replace(kv_channels=128), tp=2)) == 1.0
    assert compute.attention_head_dim_factor(make_ctx(model=TINY_DENSE.replace(kv_channels=192), tp=2)) == 0.680
    assert compute.attention_head_dim_factor(make_ctx(model=TINY_DENSE.replace(kv_channels=64), tp=2)) == 0.827
    # 80 + 80 lies halfway between (64, 64) and (96, 96): interpolated in qk + v; held at the ends outside them
    assert compute.attention_head_dim_factor(make_ctx(model=TINY_DENSE.replace(kv_channels=80), tp=2)) == pytest.approx(
        0.802
    )
    assert compute.attention_head_dim_factor(make_ctx(model=TINY_DENSE.replace(kv_channels=512), tp=2)) == 0.773
    mla = load_model("DeepSeek-V3")
    assert compute.attention_head_dim_factor(make_ctx(model=mla, tp=8)) == 0.861  # q / k 128 + 64, v 128
    # an unmeasured MLA pair goes by qk + v: (176, 64) sums to 240, 3/4 of the way from (96, 96) to (128, 128)
    odd = mla.replace(qk_pos_emb_head_dim=48, v_head_dim=64)
    assert compute.attention_head_dim_factor(make_ctx(model=odd, tp=8)) == pytest.approx(0.777 + 0.75 * 0.223)


def test_attention_call_part_per_sequence_on_full_layers():
    dense = TINY_DENSE.replace(kv_channels=128)
    base = make_ctx(model=dense, tp=2)
    for mbs in (1, 2):
        c = make_ctx(model=dense, tp=2, cal=TEST_CAL.replace(attention_call_macs=1e9), micro_batch_size=mbs)
        causal = compute.core_attention_flops(c)[0, 0]
        assert compute.core_attention_work(c)[0, 0] == pytest.approx(causal + 1e9 * mbs)
    assert compute.core_attention_work(base)[0, 0] == pytest.approx(compute.core_attention_flops(base)[0, 0])
    # a windowed layer has no fixed part: half the layers slide, so half the call part
    win = dense.replace(window_size=127, window_attn_skip_freq=(1, 0) * 4)
    w = make_ctx(model=win, tp=2, cal=TEST_CAL.replace(attention_call_macs=1e9, attention_window_extra_keys=0.0))
    assert compute.core_attention_work(w)[0, 0] == pytest.approx(compute.core_attention_flops(w)[0, 0] + 0.5 * 1e9)


def test_attention_window_and_sink_extra_keys():
    win = TINY_DENSE.replace(kv_channels=128, window_size=127, window_attn_skip_freq=(1, 0) * 4)
    keys = 0.5 * (1024 + 1) / 2 + 0.5 * (128 * 129 / 2 + 896 * 128) / 1024
    c = make_ctx(
        model=win, tp=2, cal=TEST_CAL.replace(attention_window_extra_keys=100.0, attention_sink_extra_keys=40.0)
    )
    causal = compute.core_attention_flops(c)[0, 0]
    assert compute.core_attention_work(c)[0, 0] == pytest.approx(causal * (keys + 0.5 * 100.0) / keys)
    sinks = make_ctx(
        model=win.replace(softmax_type="learnable"),
        tp=2,
        cal=TEST_CAL.replace(attention_window_extra_keys=100.0, attention_sink_extra_keys=40.0),
    )
    assert compute.core_attention_work(sinks)[0, 0] == pytest.approx(causal * (keys + 50.0 + 40.0) / keys)
    # a window that limits little is priced as a full layer, never more (the window's extra keys would exceed it)
    long = make_ctx(
        model=win.replace(window_size=1000, window_attn_skip_freq=()),
        tp=2,
        cal=TEST_CAL.replace(attention_window_extra_keys=100.0, attention_call_macs=1e3),
    )
    full_equiv = (
        compute.core_attention_flops(long)[0, 0] * ((1024 + 1) / 2) / long.model.attended_keys_per_query(1024, True)
        + 1e3
    )
    assert compute.core_attention_work(long)[0, 0] == pytest.approx(full_equiv)
    # a window at least as long as the sequence is full attention: no extra keys
    full = make_ctx(model=win.replace(window_size=4096), tp=2, cal=TEST_CAL.replace(attention_window_extra_keys=100.0))
    assert compute.core_attention_work(full)[0, 0] == pytest.approx(compute.core_attention_flops(full)[0, 0])


def test_grouped_gemm_efficiency_and_its_floor():
    # rows per local expert: 512 tokens x top-2 x etp 1 x ep 4 / (tp 2 x 8 experts) = 256 -> half of 0.55
    flat = TEST_CAL.replace(grouped_gemm_efficiency=0.55, grouped_gemm_half_rows=256.0, grouped_gemm_half_rows_work=0.0)
    assert compute.grouped_gemm_efficiency(make_ctx(cal=flat, **BASE))[0, 0] == pytest.approx(0.275)
    tiny = make_ctx(cal=flat.replace(grouped_gemm_half_rows=1e9), **BASE)
    assert compute.grouped_gemm_efficiency(tiny)[0, 0] == 1e-3


def test_grouped_gemm_half_point_grows_as_the_expert_shrinks():
    # half = half_rows + work x etp / (hidden x moe_ffn): the shape part alone doubles the half-point here
    c = make_ctx(**BASE)
    hf = c.dims.h * c.dims.moe_ffn
    shaped = TEST_CAL.replace(
        grouped_gemm_efficiency=0.55, grouped_gemm_half_rows=128.0, grouped_gemm_half_rows_work=128.0 * hf
    )
    assert compute.grouped_gemm_efficiency(make_ctx(cal=shaped, **BASE))[0, 0] == pytest.approx(
        0.55 * 256 / (256 + 256)
    )
    # ETP 2 gathers twice the rows and halves each rank's expert FFN: rows 512, half 128 + 256
    c2 = make_ctx(cal=shaped, **{**BASE, "etp": 2})
    assert compute.grouped_gemm_efficiency(c2)[0, 0] == pytest.approx(0.55 * 512 / (512 + 384))


def test_moe_times():
    c = make_ctx(**BASE)
    assert compute.expert_time(c)[0, 0] == pytest.approx(
        6291456 * 1.2 / (1e15 * 0.275)
    )  # x the natural-routing imbalance
    assert compute.router_time(c)[0, 0] == pytest.approx(262144 / (1e15 * eff(262144)))
    assert compute.shared_expert_time(c)[0, 0] == pytest.approx(6291456 / (1e15 * eff(6291456 / 3)))
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert (
        compute.expert_time(d)[0, 0] == 0
        and compute.router_time(d)[0, 0] == 0
        and compute.shared_expert_time(d)[0, 0] == 0
    )


def test_dense_mlp_time():
    f = 25165824.0
    assert compute.dense_mlp_time(make_ctx(**BASE))[0, 0] == pytest.approx(f / (1e15 * eff(f / 3)))


def test_elementwise_times():
    c = make_ctx(**BASE)
    assert compute.attention_elementwise_time(c)[0, 0] == pytest.approx(48 * 64 * 512 / 2 / HBM)
    copies = activations.routed_token_copies(c)
    assert compute.moe_elementwise_time(c, copies)[0, 0] == pytest.approx(40 * 64 * 614.4 / HBM)
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert compute.moe_elementwise_time(d, activations.routed_token_copies(d))[0, 0] == 0
    # experts with biases (GPT-OSS): expert_bias_bytes_per_copy_moe more per copy (the test calibration's default 157)
    b = make_ctx(model=TINY_MOE.replace(add_bias_linear=True), **BASE)
    assert compute.moe_elementwise_time(b, copies)[0, 0] == pytest.approx((40 + 157) * 64 * 614.4 / HBM)


def test_layer_compute_times_are_three_passes_of_their_gemms():
    c = make_ctx(**BASE)
    one = np.array([[1.0]])
    assert compute.attention_compute_time(c, one, 2 * one, 3 * one)[0, 0] == 3 * (1 + 2) + 3
    assert compute.moe_compute_time(c, one, 2 * one, 3 * one, 4 * one)[0, 0] == 3 * (1 + 2 + 3) + 4
    assert (
        compute.dense_compute_time(c, 2 * one, 4 * one)[0, 0] == 3 * 2 + 4 * 0.5
    )  # half the attention side's elementwise


def test_logits_time_on_the_last_rank():
    f = 2 * 512 * 64 * 1024 / 2 * 2
    gemms = 3 * f / (1e15 * eff(f))
    # the unfused loss (no --cross-entropy-loss-fusion): 64 B per logit, main head + 1 MTP head
    loss = 64 * 512 * 1024 / 2 * 2 / HBM
    assert compute.logits_time(make_ctx(**BASE))[0].tolist() == pytest.approx([0.0, gemms + loss])


@pytest.mark.parametrize(("impl", "per_logit"), [("native", 49.0), ("te", 9.5)])
def test_logits_time_by_cross_entropy_path(impl: str, per_logit: float):
    from specs import RunOptions

    f = 2 * 512 * 64 * 1024 / 2 * 2
    gemms = 3 * f / (1e15 * eff(f))
    opts = RunOptions(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl=impl)
    got = compute.logits_time(make_ctx(options=opts, **BASE))[0, 1]
    assert got == pytest.approx(gemms + per_logit * 512 * 1024 / 2 * 2 / HBM)
    assert RunOptions(cross_entropy_fusion_impl=impl).cross_entropy_path == "unfused"  # the impl alone fuses nothing


def test_mla_up_projection_time():
    from term_fixtures import BASE, TINY_MOE, make_ctx

    mla = TINY_MOE.replace(
        q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, qk_layernorm=False
    )
    c = make_ctx(model=mla, **BASE)
    params = 24 * 4 * (8 + 4) + 16 * 4 * (8 + 8)  # q_up + kv_up
    assert c.dims.up_projection_params == params
    f = 2 * 512 * params / 2
    assert compute.mla_up_projection_time(c)[0, 0] == pytest.approx(
        f / (c.gemm_peak_flops * compute.gemm_efficiency(np.array(f / 2), c.cal))
    )
    assert compute.mla_up_projection_time(make_ctx(**BASE))[0, 0] == 0


def test_mla_unfused_rope_time():
    """93.5 bytes (measured) per q element (token x head x q head dim / tp) at the achieved HBM bandwidth, only for MLA
    with RoPE unfused."""
    from specs import RunOptions

    mla = TINY_MOE.replace(
        q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, qk_layernorm=False
    )
    unfused = RunOptions(apply_rope_fusion=False)
    c = make_ctx(model=mla, options=unfused, **BASE)
    assert c.dims.q_dim == 4 * (8 + 4)
    assert compute.mla_unfused_rope_time(c)[0, 0] == pytest.approx(93.5 * 512 * 4 * 12 / 2 / HBM)
    assert compute.mla_unfused_rope_time(make_ctx(model=mla, **BASE))[0, 0] == 0  # fused (Megatron-LM's default)
    assert (
        compute.mla_unfused_rope_time(make_ctx(options=unfused, **BASE))[0, 0] == 0
    )  # GQA: priced in the elementwise work


def test_unfused_rope_lengthens_an_mla_step_by_its_layers_time():
    """The estimate adds the term once per layer and micro-batch (forward + backward), and its forward share again per
    layer that recomputes ``mla_up_proj``; a GQA model's step does not change."""
    from cost_model.estimate import estimate
    from specs import RunOptions, load_model, parse_gpus
    from specs.layout import Layout

    ds = load_model("DeepSeek-V3").replace(num_layers=4, moe_layer_freq=(0, 0, 0, 0), num_experts=0, mtp_num_layers=0)
    wl = Workload(seq_length=4096, global_batch_size=2, precision="bf16")
    gpus = parse_gpus("8xH200")
    lay = Layout(world_size=8, tp=8, pp=1, micro_batch_size=1, sequence_parallel=True)
    fused, unfused = RunOptions(), RunOptions(apply_rope_fusion=False)
    per = 93.5 * 4096 * 128 * 192 / 8 / (4.8e12 * 0.75)  # one layer, one micro-batch
    a, b = estimate(ds, gpus, wl, lay, options=fused), estimate(ds, gpus, wl, lay, options=unfused)
    assert b.time["compute"] - a.time["compute"] == pytest.approx(4 * 2 * per, rel=1e-6)
    sel = lay.replace(recompute_granularity="selective", recompute_modules=("mla_up_proj",))
    ra, rb = estimate(ds, gpus, wl, sel, options=fused), estimate(ds, gpus, wl, sel, options=unfused)
    assert rb.time["recompute"] - ra.time["recompute"] == pytest.approx(4 * 2 * 0.56 * per, rel=1e-6)
    qw = load_model("Qwen3-30B-A3B").replace(num_layers=4, moe_layer_freq=(1, 1, 1, 1))
    gl, gw = (
        Layout(world_size=8, tp=1, pp=1, ep=8, micro_batch_size=1),
        Workload(seq_length=4096, global_batch_size=8, precision="bf16"),
    )
    assert (
        estimate(qw, gpus, gw, gl, options=unfused).step_time_s == estimate(qw, gpus, gw, gl, options=fused).step_time_s
    )


def test_run_option_flags_must_be_booleans():
    """A string flag is refused, not read as true (``"no"`` would otherwise price the fused loss)."""
    from specs import RunOptions
    from specs.errors import TunerError

    for bad in ("no", 1, None):
        with pytest.raises(TunerError, match="cross_entropy_loss_fusion must be true or false"):
            RunOptions(cross_entropy_loss_fusion=bad)
    assert RunOptions(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te").cross_entropy_path == "te"
