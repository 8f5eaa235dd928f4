from __future__ import annotations

import numpy as np
import pytest

from cost_model.calibration import DEFAULT_CALIBRATION, load_calibration
from cost_model.estimate import estimate, estimate_table
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout, LayoutTable

GIB = 2**30


def test_dense_weights_and_optimizer_match_megatron_formula():
    """Megatron's theoretical_memory_usage.py: (P_tp + P_rep) * (6 + 12/DP) with the distributed optimizer."""
    m = load_model("Llama-3.1-8B")
    c = parse_gpus("8xH100")
    w = Workload(seq_length=4096, global_batch_size=64)
    lay = Layout(world_size=8, tp=2, sequence_parallel=True, pp=1, use_precision_aware_optimizer=False)
    e = estimate(m, c, w, lay)
    h, L = m.hidden_size, m.num_layers
    attn = m.attention_params()
    mlp = m.dense_mlp_params()
    emb = m.embedding_params()
    p_tp = ((attn + mlp) * L + emb) / 2 + emb / 2  # untied and PP == 1: output layer on the same rank
    p_rep = 2 * h * L + h
    dp = 4
    megatron = (p_tp + p_rep) * (6 + 12 / dp)
    ours = e.memory["weights"] + e.memory["main_grads"] + e.memory["optimizer"]
    assert ours == pytest.approx(megatron, rel=1e-9)


def test_single_estimate_is_the_table_row_with_the_simulated_pipeline(
    minimax, h200x64, seed_workload, seed_tuned, seed_reference
):
    # estimate() keeps the table's memory and every time part but the bubble; the pipeline is simulated
    # (cost_model.step_detail), so the step differs from the table's by the bubbles' difference only.
    lays = [seed_tuned, seed_reference, seed_tuned.replace(micro_batch_size=1, vpp=2), seed_reference.replace(ep=16)]
    tab = estimate_table(minimax, h200x64, seed_workload, LayoutTable.from_layouts(lays))
    for i, lay in enumerate(lays):
        one = estimate(minimax, h200x64, seed_workload, lay)
        assert tab.peak_bytes[i] == pytest.approx(one.peak_bytes)
        assert {k: float(v[i]) for k, v in tab.memory.items()} == pytest.approx(one.memory)
        for part, v in one.time.items():
            if part != "pp_bubble":
                assert float(tab.time[part][i]) == pytest.approx(v, rel=1e-12), part
        shift = one.time["pp_bubble"] - float(tab.time["pp_bubble"][i])
        assert one.step_time_s == pytest.approx(float(tab.step_time_s[i]) + shift, rel=1e-12)
        assert one.tokens_per_s_per_gpu * one.step_time_s == pytest.approx(
            float(tab.tokens_per_s_per_gpu[i] * tab.step_time_s[i]), rel=1e-12
        )
        assert abs(shift) < 0.05 * one.step_time_s  # the closed form is an approximation of the simulation


def test_single_estimate_equals_the_table_without_a_pipeline(minimax, h200x64, seed_workload):
    lay = Layout(
        world_size=64, tp=1, pp=1, ep=64, recompute_granularity="full", recompute_method="uniform",
        recompute_num_layers=1, optimizer_offload_fraction=1.0,
    )
    tab = estimate_table(minimax, h200x64, seed_workload, LayoutTable.from_layouts([lay])).row(0, lay)
    one = estimate(minimax, h200x64, seed_workload, lay)
    assert one.time == tab.time and one.step_time_s == tab.step_time_s


def test_parts_add_up(minimax, h200x64, seed_workload, seed_tuned):
    e = estimate(minimax, h200x64, seed_workload, seed_tuned)
    assert sum(e.memory.values()) == pytest.approx(e.peak_bytes)
    assert sum(e.time.values()) == pytest.approx(e.step_time_s)
    assert e.tokens_per_s_per_gpu == pytest.approx(8192 * 128 / e.step_time_s / 64)
    assert all(v >= 0 for v in e.time.values())


def test_offload_moves_optimizer_to_cpu_and_costs_time(minimax, h200x64, seed_workload, seed_reference):
    on = estimate(minimax, h200x64, seed_workload, seed_reference)
    off = estimate(minimax, h200x64, seed_workload, seed_reference.replace(optimizer_offload_fraction=0.0))
    half = estimate(minimax, h200x64, seed_workload, seed_reference.replace(optimizer_offload_fraction=0.5))
    # offload 1.0: no optimizer state on the GPU, only the build's bf16 clones kept reserved (2 B per unsharded
    # parameter, the size of the bf16 weights); 0.5: half the owned parameters at 12 B (10 B without offload:
    # precision-aware) plus the first HybridDeviceOptimizer's fp32 clones (4 B x 0.5) and the cached bf16 clones (2 B x
    # 0.5) of the rank's unsharded parameters
    assert on.memory["optimizer"] == pytest.approx(on.memory["weights"])
    assert half.memory["optimizer"] == pytest.approx(0.6 * off.memory["optimizer"] + 1.5 * half.memory["weights"])
    assert on.time["offload"] > half.time["offload"] > off.time["offload"] == 0.0


def test_recompute_trades_memory_for_time():
    m = load_model("Mixtral-8x7B")
    c = parse_gpus("16xH100")
    w = Workload(seq_length=4096, global_batch_size=64)
    base = Layout(world_size=16, tp=2, sequence_parallel=True, pp=2, ep=4)
    none = estimate(m, c, w, base)
    sel = estimate(m, c, w, base.replace(recompute_granularity="selective", recompute_modules=("core_attn", "moe_act")))
    full = estimate(
        m, c, w, base.replace(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    )
    assert none.memory["activations"] > sel.memory["activations"] > full.memory["activations"]
    assert none.time["recompute"] == 0 < sel.time["recompute"] < full.time["recompute"]


def test_more_microbatches_shrink_the_bubble(minimax, h200x64, seed_tuned):
    a = estimate(minimax, h200x64, Workload(seq_length=8192, global_batch_size=128), seed_tuned)
    b = estimate(minimax, h200x64, Workload(seq_length=8192, global_batch_size=512), seed_tuned)
    assert b.time["pp_bubble"] / b.step_time_s < a.time["pp_bubble"] / a.step_time_s


def test_expert_memory_scales_with_ep(minimax, h200x64, seed_workload, seed_reference):
    e8 = estimate(minimax, h200x64, seed_workload, seed_reference)
    e16 = estimate(minimax, h200x64, seed_workload, seed_reference.replace(ep=16))
    assert e16.memory["weights"] < 0.6 * e8.memory["weights"]


def test_bf16_moments_shrink_optimizer(minimax, h200x64, seed_workload, seed_tuned):
    a = estimate(minimax, h200x64, seed_workload, seed_tuned)
    b = estimate(minimax, h200x64, seed_workload, seed_tuned.replace(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    # master remainder 2 + moments 4 + 4 = 10 bytes -> 2 + 2 + 2 = 6 bytes
    assert b.memory["optimizer"] == pytest.approx(a.memory["optimizer"] * 6 / 10)


def test_ep_across_nodes_is_slower(minimax, h200x64, seed_workload, seed_tuned):

    lay8 = Layout(
        world_size=64, tp=1, pp=4, ep=8, recompute_granularity="full", recompute_method="uniform",
        recompute_num_layers=1, num_layers_in_first_pipeline_stage=15, num_layers_in_last_pipeline_stage=15,
    )
    lay16 = lay8.replace(ep=16)
    e8 = estimate(minimax, h200x64, seed_workload, lay8)
    e16 = estimate(minimax, h200x64, seed_workload, lay16)
    # EP 16 spans two 8-GPU nodes: the all-to-all crosses EFA (its per-expert fixed costs halve, the data
    # volume barely changes, the bandwidth drops ~7x)
    assert e16.time["ep_comm"] > 1.5 * e8.time["ep_comm"]
    assert e16.tokens_per_s_per_gpu < e8.tokens_per_s_per_gpu


def test_invalid_layout_raises_with_rule(minimax, h200x64, seed_workload):
    with pytest.raises(InfeasibleLayout) as e:
        estimate(minimax, h200x64, seed_workload, Layout(world_size=64, tp=32, sequence_parallel=True, pp=2))
    assert e.value.rule_id


def test_calibration_file(tmp_path, minimax, h200x64, seed_workload, seed_tuned):
    p = tmp_path / "cal.yaml"
    p.write_text("gemm_efficiency: 0.35\n")
    cal = load_calibration(p)
    assert (
        cal.gemm_efficiency == 0.35 and cal.attention_efficiency == DEFAULT_CALIBRATION.attention_efficiency
    )  # unnamed constants keep the shipped (fitted) values
    slow = estimate(minimax, h200x64, seed_workload, seed_tuned, calibration=cal)
    fast = estimate(minimax, h200x64, seed_workload, seed_tuned)
    assert slow.tokens_per_s_per_gpu < fast.tokens_per_s_per_gpu
    p.write_text("gemm_eficiency: 0.35\n")
    with pytest.raises(TunerError, match="unknown constants"):
        load_calibration(p)


def test_headroom_bounds(minimax, h200x64, seed_workload, seed_tuned):
    with pytest.raises(TunerError):
        estimate(minimax, h200x64, seed_workload, seed_tuned, memory_headroom=1.5)


# ---- issue 3 model fixes: TE attention copies ----------------------------------------------------------


def test_te_attention_saves_the_attention_output_once(minimax, h200x64, seed_workload, seed_tuned):
    """With TE (default) one copy of the attention output per layer is saved; without TE (the
    trial harness) two: the difference is BF16 x tokens x heads x head_dim / TP per stored layer."""
    from specs import HARNESS_RUN_OPTIONS, RunOptions

    lay = Layout(
        world_size=64, pp=8, ep=8, num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7
    )  # no recompute
    te = estimate(minimax, h200x64, seed_workload, lay)
    no_te = estimate(minimax, h200x64, seed_workload, lay, options=HARNESS_RUN_OPTIONS)
    assert RunOptions().te_attention and not HARNESS_RUN_OPTIONS.te_attention
    assert no_te.memory["activations"] > te.memory["activations"]
    assert no_te.tokens_per_s_per_gpu == pytest.approx(te.tokens_per_s_per_gpu)
    one_copy = 2.0 * seed_workload.seq_length * (minimax.num_attention_heads * minimax.kv_channels)
    layers_stored = (no_te.memory["activations"] - te.memory["activations"]) / one_copy
    assert layers_stored >= 7  # at least every layer of the worst rank for one micro-batch


def test_observations_default_to_the_no_te_harness():
    from cost_model.calibrate import Observation, _runs_of
    from specs import HARNESS_RUN_OPTIONS

    m, c = load_model("MiniMax-M2"), parse_gpus("64xH200")
    o = Observation(model=m, cluster=c, workload=Workload(), layout=Layout(world_size=64, ep=8), step_time_s=1.0)
    assert _runs_of([o], need="step")[0].options == HARNESS_RUN_OPTIONS


# ---- issue 3: flex dispatcher dedup ----------------------------------------------------------------------


def test_distinct_groups_hit_uniform_routing():
    from math import comb

    from cost_model.terms.comm import distinct_groups_hit as _distinct_groups_hit

    # one group holds every expert: always hit once; as many groups as experts: top-k distinct groups
    assert _distinct_groups_hit(256, 8, np.array([1.0]))[0] == pytest.approx(1.0)
    assert _distinct_groups_hit(256, 8, np.array([256.0]))[0] == pytest.approx(8.0)
    # 8 GPUs of 32 experts each, top-8 of 256: 8 * (1 - C(224, 8) / C(256, 8))
    assert _distinct_groups_hit(256, 8, np.array([8.0]))[0] == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)))


def test_deepep_sends_once_per_remote_gpu_hit():
    """Inter-node EP: DeepEP's hierarchical dispatch moves fewer bytes over the network than NCCL
    all-to-all (one copy per routed expert): one copy per remote GPU hit, at NCCL's network efficiency (its kernel
    bandwidth did not show in NVIDIA's training pairs), so its EP time is lower than alltoall's by the copies alone."""
    from specs import RunOptions

    m = load_model("DeepSeek-V3")
    c = parse_gpus("256xB200")
    w = Workload(seq_length=4096, global_batch_size=4096)
    cal = DEFAULT_CALIBRATION
    base = Layout(
        world_size=256, pp=8, vpp=2, ep=32, num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=6
    )
    opts = RunOptions(moe_router_force_load_balancing=True)
    t = {
        d: estimate(m, c, w, base.replace(dispatcher=d), calibration=cal, options=opts).time["ep_comm"]
        for d in ("alltoall", "flex+deepep")
    }
    assert 0.6 * t["alltoall"] < t["flex+deepep"] < 0.95 * t["alltoall"]  # fewer bytes, but no 1.4x per byte any more


def test_calibration_files_refuse_stray_keys_and_say_why_1e30_is_text(tmp_path):
    from cost_model.calibration import load_calibration

    p = tmp_path / "c.yaml"
    p.write_text("constants:\n  gemm_efficiency: 0.8\ngemm_efficiency: 0.9\n")
    with pytest.raises(TunerError, match=r"\['gemm_efficiency'\] sit beside the 'constants' section"):
        load_calibration(p)
    p.write_text("provenance: {date: 2026-11-30}\nconstants:\n  gemm_efficiency: 0.8\n")
    assert load_calibration(p).gemm_efficiency == 0.8
    p.write_text("cuda_context_bytes: 1e30\n")
    with pytest.raises(TunerError, match="YAML reads a number such as 1e30 as text"):
        load_calibration(p)
    p.write_text("cuda_context_bytes: fast\n")
    with pytest.raises(TunerError, match=r"are not numbers$"):
        load_calibration(p)


def test_calibration_files_refuse_a_repeated_key_an_empty_file_and_say_where_yaml_breaks(tmp_path):
    """PyYAML keeps the last of two equal keys silently; an empty file read as "use the shipped constants" hid a lost
    edit; PyYAML's own message runs over several lines. Each is one message naming the file."""
    from cost_model.calibration import load_calibration
    from rl.calibration import load_rl_calibration

    p = tmp_path / "c.yaml"
    p.write_text("gemm_efficiency: 0.8\nhbm_efficiency: 0.7\ngemm_efficiency: 0.9\n")
    with pytest.raises(TunerError, match=r"key 'gemm_efficiency' appears twice \(lines 1 and 3\)"):
        load_calibration(p)
    p.write_text("constants:\n  gemm_efficiency: 0.8\n  gemm_efficiency: 0.8\n")
    with pytest.raises(TunerError, match="appears twice"):
        load_calibration(p)
    p.write_text("")
    with pytest.raises(TunerError, match="the file is empty"):
        load_calibration(p)
    p.write_text("gemm_efficiency: [0.8\n")
    with pytest.raises(TunerError, match=r"not valid YAML \(line 2, column 1: ") as e:
        load_calibration(p)
    assert "\n" not in str(e.value)
    p.write_text("rl_calibration:\n  source: a\n  source: b\n")
    with pytest.raises(TunerError, match="key 'source' appears twice"):
        load_rl_calibration(p)
    p.write_text("{gemm_efficiency: 0.6, gemm_efficiency: 0.7}\n")  # both on one line
    with pytest.raises(TunerError, match=r"key 'gemm_efficiency' appears twice \(both on line 1\)"):
        load_calibration(p)
    for empty in ("{}\n", "constants: {}\n"):
        p.write_text(empty)
        with pytest.raises(TunerError, match="names no constant"):
            load_calibration(p)
    p.write_text(
        "constants:\n  <<: {gemm_efficiency: 0.8}\n  hbm_efficiency: 0.7\n"
    )  # an inline merge key is plain YAML
    assert load_calibration(p).gemm_efficiency == 0.8
    # what the tool writes it reads back: PyYAML's safe_dump would write an object referenced twice as &id001 / *id001
    from specs._data import dump_user_yaml

    shared = ["benchmarks/data/published_runs.csv"]
    p.write_text(
        dump_user_yaml({"provenance": {"data": shared, "fitted_on": shared}, "constants": {"gemm_efficiency": 0.7}})
    )
    assert "*id" not in p.read_text() and load_calibration(p).gemm_efficiency == 0.7


# ---- issue 13: the first cut's inline constants are range-checked Calibration fields ----------------------


@pytest.mark.parametrize(
    ("name", "value", "bad"),
    [
        ("grouped_gemm_efficiency_floor", 1e-3, 0.0), ("elementwise_backward_ratio", 2.0, 0.0),
        ("dense_mlp_elementwise_share", 0.5, -0.1), ("norm_elementwise_share", 0.5, 1.5),
        ("moe_act_elementwise_share", 0.5, 1.5), ("backward_working_set_fraction", 0.5, -1.0),
        ("base_process_groups", 2.0, -1.0),
    ],
)
def test_former_inline_constants_keep_their_values_and_ranges(name, value, bad):
    from cost_model.calibration import BASE_CALIBRATION

    assert getattr(BASE_CALIBRATION, name) == getattr(DEFAULT_CALIBRATION, name) == value
    with pytest.raises(TunerError, match=f"calibration constant {name} = {bad!r} is outside"):
        BASE_CALIBRATION.replace(**{name: bad})


_HUGE = [
    "attention_call_macs", "attention_window_extra_keys", "attention_sink_extra_keys", "moe_layer_overhead_s",
    "moe_host_sync_latency_s", "expert_gemm_overhead_s", "fp8_quantize_overhead_s",
]
_EFFICIENCIES = [
    "gemm_efficiency", "grouped_gemm_efficiency", "attention_efficiency", "hbm_efficiency", "nvlink_efficiency",
    "alltoall_nvlink_efficiency", "network_efficiency", "pcie_efficiency",
]


@pytest.mark.parametrize(
    ("field", "text", "bound"),
    [(f, "1.0e+300", r"1e\+300 is outside \[0, ") for f in _HUGE]
    + [(f, "1.0e-300", r"1e-300 is outside \[0.01, 1\]") for f in _EFFICIENCIES],
)
def test_the_calibration_constants_are_bounded(field, text, bound, tmp_path):
    # a huge fixed cost or attention extra (1.0e+300, read as a number) overflowed the window's keys to inf and the
    # study's tell to NaN; an efficiency of 1e-300 printed a step of 1e300 s (0.01 of a datasheet peak is the lowest
    # taken)
    from cost_model.calibration import load_calibration

    p = tmp_path / "c.yaml"
    p.write_text(f"{field}: {text}\n")
    with pytest.raises(TunerError, match=rf"calibration constant {field} = {bound}"):
        load_calibration(p)
    if field in _EFFICIENCIES:
        p.write_text(f"{field}: 0.01\n")
        assert getattr(load_calibration(p), field) == 0.01


def test_lora_mfu_counts_four_flops_per_frozen_parameter():
    """LoRA's frozen weights skip the weight gradient: MFU counts 4 x N_active per token, not the 6 x of training
    every weight."""
    from cost_model.flops import mfu

    model = load_model("Llama-3.1-8B")
    cl = parse_gpus("8xH100")
    lay = Layout(world_size=8, tp=1, pp=1)
    full = estimate(model, cl, Workload(seq_length=8192, global_batch_size=128), lay)
    lora = estimate(model, cl, Workload(seq_length=8192, global_batch_size=128, task="lora"), lay)
    assert full.mfu == pytest.approx(6.0 * model.active_params() * full.tokens_per_s_per_gpu / cl.gpu.peak_flops_bf16)
    assert lora.mfu == pytest.approx(4.0 * model.active_params() * lora.tokens_per_s_per_gpu / cl.gpu.peak_flops_bf16)
    assert mfu(model, 1000.0, 1e15, "lora") == pytest.approx(mfu(model, 1000.0, 1e15) * 4 / 6)


def test_mfu_is_over_the_datasheet_bf16_peak_on_every_gpu():
    """MFU (the seed's convention) divides by the datasheet's dense bf16 peak, not by the peak the fitted family and
    generation factors give the time terms: the same throughput on B200 and B300 (both 2,250 TFLOP/s) is the same
    MFU."""
    from cost_model.flops import mfu

    model = load_model("Llama-3.1-8B")
    wl = Workload(seq_length=8192, global_batch_size=128)
    cal = DEFAULT_CALIBRATION.replace(gemm_family_factor_blackwell=0.5, gemm_generation_factor_blackwell_ultra=1.5)
    for g in ("B200", "B300", "H100"):
        cl = parse_gpus(f"8x{g}")
        e = estimate(model, cl, wl, Layout(world_size=8, tp=1, pp=1), calibration=cal)
        assert e.mfu == pytest.approx(mfu(model, e.tokens_per_s_per_gpu, cl.gpu.peak_flops_bf16), rel=1e-9)
        assert e.mfu == pytest.approx(
            6
            * model.active_params()
            * e.tokens_per_s_per_gpu
            / {"B200": 2250e12, "B300": 2250e12, "H100": 989.4e12}[g],
            rel=1e-9,
        )


def test_a_table_estimated_in_row_blocks_is_the_table_estimated_whole(monkeypatch):
    import sys

    from search_spaces.space import SearchSpace, enumerate_layouts

    est_mod = sys.modules["cost_model.estimate"]  # the package exports a function of the same name

    model, cluster, w = load_model("Llama-3.1-8B"), parse_gpus("8xH100"), Workload()
    valid = enumerate_layouts(SearchSpace.load(None), model, cluster.num_gpus, w).valid
    whole = estimate_table(model, cluster, w, valid)
    monkeypatch.setattr(est_mod, "ROW_BLOCK", 97)
    assert len(valid) > 3 * 97
    blocks = estimate_table(model, cluster, w, valid)
    for name in (
        "peak_bytes", "step_time_s", "tokens_per_s_per_gpu", "mfu", "model_tflops_per_gpu", "usd_per_million_tokens",
        "host_bytes_per_node",
    ):
        np.testing.assert_allclose(getattr(blocks, name), getattr(whole, name), rtol=1e-15, err_msg=name)
    for parts_b, parts_w in ((blocks.memory, whole.memory), (blocks.time, whole.time)):
        assert list(parts_b) == list(parts_w)
        for k in parts_w:
            np.testing.assert_allclose(parts_b[k], parts_w[k], rtol=1e-15, err_msg=k)


def test_a_repeated_single_estimate_is_the_one_kept(minimax, h200x64, seed_workload, seed_tuned):
    import copy

    first = estimate(minimax, h200x64, seed_workload, seed_tuned)
    assert estimate(minimax, h200x64, seed_workload, seed_tuned) is first
    other = estimate(
        minimax, copy.deepcopy(h200x64), seed_workload, seed_tuned
    )  # another cluster object: computed again
    assert other is not first and other == first
    assert estimate(minimax, h200x64, seed_workload, seed_tuned, memory_headroom=0.2) != first
