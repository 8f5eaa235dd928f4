"""One layout's step in detail (cost_model.step_detail, cost_model.estimate.estimate_details): per-chunk forward and
backward times, the simulated pipeline against the table's closed form, what the overlaps hide, the tail."""

from __future__ import annotations

import importlib

import pytest

from cost_model import step_detail
from cost_model.estimate import estimate, estimate_details, estimate_table
from cost_model.step_detail import CHUNK_PARTS, HIDDEN_PARTS, TAIL_PARTS, chunk_layers
from cost_model.terms import activations, compute, context
from specs import RunOptions, Workload, load_model
from specs.layout import Dispatcher, Layout, LayoutTable, RecomputeGranularity, RecomputeMethod

estimate_mod = importlib.import_module("cost_model.estimate")  # the package re-exports the function under the same name

BEST = Layout(
    world_size=64, tp=1, pp=4, vpp=8, ep=16, recompute_granularity=RecomputeGranularity.selective,
    recompute_modules=("moe",), dispatcher=Dispatcher.flex_deepep, num_layers_in_first_pipeline_stage=16,
    num_layers_in_last_pipeline_stage=14,
)


def _per_class(model, cluster, workload, layout, options=RunOptions()):
    """The table's seconds per micro-batch per rank class, by part ((1, K) arrays) and the context's representatives."""
    t = LayoutTable.from_layouts([layout])
    c = context.build_context(model, cluster, workload, t, estimate_mod.DEFAULT_CALIBRATION, options)
    return estimate_mod._time_per_microbatch(c, activations.routed_token_copies(c)), [int(x) for x in c.rank[0]]


@pytest.mark.parametrize("name", ["seed_tuned", "best", "block"])
def test_each_rank_s_chunks_add_up_to_its_time_in_the_table(name, minimax, h200x64, seed_workload, seed_tuned):
    lay = {
        "seed_tuned": seed_tuned,
        "best": BEST,
        "block": seed_tuned.replace(recompute_method=RecomputeMethod.block, recompute_num_layers=1),
    }[name]
    d = estimate_details(minimax, h200x64, seed_workload, lay)
    per, reps = _per_class(minimax, h200x64, seed_workload, lay)
    assert len(d.rank_class) == lay.pp and [d.rank_class[r] for r in reps] == list(range(len(reps)))
    for r in range(lay.pp):
        for p in CHUNK_PARTS:
            got = sum(d.times.forward[p][r][v] + d.times.backward[p][r][v] for v in range(lay.vpp))
            assert got == pytest.approx(float(per[p][0, d.rank_class[r]]), rel=1e-12, abs=1e-15), (r, p)
        assert all(d.times.forward["recompute"][r][v] == 0.0 for v in range(lay.vpp))  # recompute runs in backward


def test_chunks_hold_the_layers_megatron_gives_them(minimax, seed_tuned):
    layers, moe = chunk_layers(minimax, seed_tuned)
    # 62 layers, PP 8 VPP 4, first and last rank 7: rank 0 [1, 2, 2, 2] (the deficit next to the embedding), last [2, 2,
    # 2, 1]
    assert (
        layers[0] == (1.0, 2.0, 2.0, 2.0)
        and layers[-1] == (2.0, 2.0, 2.0, 1.0)
        and all(row == (2.0,) * 4 for row in layers[1:-1])
    )
    assert moe == layers  # every MiniMax-M2 layer is MoE
    ds = load_model("DeepSeek-V3")
    layers_ds, moe_ds = chunk_layers(
        ds,
        Layout(
            world_size=64, pp=4, vpp=2, ep=16, num_layers_in_first_pipeline_stage=15,
            num_layers_in_last_pipeline_stage=14,
        ),
    )
    assert (
        layers_ds[0] == (7.0, 8.0) and layers_ds[0][0] - moe_ds[0][0] == 3
    )  # DeepSeek-V3's three dense layers are the first stage's


def test_forward_is_a_third_of_compute_and_half_of_tp(minimax, h200x64, seed_workload, monkeypatch):
    # Defaults: GEMMs backward = 2 x forward (compute.GEMM_PASSES), memory-bound backward = elementwise_backward_ratio
    # (2) x forward, so every chunk's forward compute is a third of its compute; TP collectives are half forward
    # (recompute.FORWARD_TP_SHARE).
    lay = Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=4, vpp=2, ep=8, micro_batch_size=1,
        num_layers_in_first_pipeline_stage=16, num_layers_in_last_pipeline_stage=14,
    )
    measured = estimate_details(minimax, h200x64, seed_workload, lay)
    # with core attention's forward at a third too (its measured share is 0.238: compute.ATTENTION_FORWARD_SHARE)
    monkeypatch.setattr(compute, "ATTENTION_FORWARD_SHARE", 1 / 3)
    d = estimate_details(minimax, h200x64, seed_workload, lay)
    for r in range(4):
        for v in range(2):
            f, b = d.times.forward, d.times.backward
            assert f["compute"][r][v] == pytest.approx((f["compute"][r][v] + b["compute"][r][v]) / 3, rel=1e-9)
            assert measured.times.forward["compute"][r][v] < f["compute"][r][v]
            assert f["tp_comm"][r][v] == pytest.approx(b["tp_comm"][r][v], rel=1e-9) and f["tp_comm"][r][v] > 0
            assert 0 < f["ep_comm"][r][v] < f["ep_comm"][r][v] + b["ep_comm"][r][v]


def test_equal_ranks_give_the_closed_form_exactly(minimax, h200x64, seed_workload, monkeypatch):
    # With the output layer's time at 0 every rank of an even split of an all-MoE model is the same: the simulated
    # pipeline is Narayanan's M x t + (pp - 1) / vpp x t and estimate() equals the table to float precision.
    import numpy as np

    monkeypatch.setattr(compute, "logits_time", lambda c: np.zeros_like(c.layers))
    monkeypatch.setattr(step_detail, "_logits_forward_time", lambda c: np.zeros_like(c.layers))
    m8 = minimax.replace(num_layers=8, moe_layer_freq=(1,) * 8, mtp_num_layers=0)
    for lay in (
        Layout(world_size=64, pp=4, vpp=2, ep=16),
        Layout(world_size=64, pp=8, vpp=1, ep=8, micro_batch_size=2),
        Layout(
            world_size=64, pp=2, vpp=4, ep=32, recompute_granularity="full", recompute_method="uniform",
            recompute_num_layers=1,
        ),
    ):
        d = estimate_details(m8, h200x64, seed_workload, lay)
        assert len(set(d.times.forward_s)) == 1 and len(set(d.times.backward_s)) == 1  # equal ranks
        assert d.pipeline_s == pytest.approx(d.closed_form_pipeline_s, rel=1e-12)
        tab = estimate_table(m8, h200x64, seed_workload, LayoutTable.from_layouts([lay])).row(0, lay)
        assert d.estimate.time["pp_bubble"] == pytest.approx(tab.time["pp_bubble"], rel=1e-9)
        assert d.estimate.step_time_s == pytest.approx(tab.step_time_s, rel=1e-12)


def test_unequal_ranks_differ_from_the_closed_form_a_little(minimax, h200x64, seed_workload, seed_tuned):
    d = estimate_details(minimax, h200x64, seed_workload, seed_tuned)
    assert d.pipeline_s != pytest.approx(d.closed_form_pipeline_s, rel=1e-6)
    assert abs(d.pipeline_s / d.closed_form_pipeline_s - 1) < 0.05
    # the simulation never beats the slowest rank's busy time
    busiest = (
        max(sum(d.times.forward_s[r]) + sum(d.times.backward_s[r]) for r in range(seed_tuned.pp)) * d.num_microbatches
    )
    assert d.pipeline_s >= busiest * (1 - 1e-12)


def test_estimate_details_agrees_with_estimate(minimax, h200x64, seed_workload, seed_tuned):
    e = estimate(minimax, h200x64, seed_workload, seed_tuned)
    d = estimate_details(minimax, h200x64, seed_workload, seed_tuned)
    assert d.estimate == e
    assert e.time["pp_bubble"] == pytest.approx(d.pipeline_s - sum(e.time[p] for p in CHUNK_PARTS), rel=1e-12)
    for p in TAIL_PARTS:  # the step adds the slowest rank's tail
        assert max(d.tail[p]) == pytest.approx(e.time[p], rel=1e-12, abs=1e-15), p
    for k, v in e.memory.items():  # the estimate's memory is the worst rank's
        assert max(
            d.memory[k][r]
            for r in range(seed_tuned.pp)
            if sum(d.memory[x][r] for x in d.memory)
            == max(sum(d.memory[x][q] for x in d.memory) for q in range(seed_tuned.pp))
        ) == pytest.approx(v)


def test_what_the_overlaps_hide(minimax, h200x64, seed_workload):
    lay = Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=4, vpp=2, cp=2, ep=8, num_layers_in_first_pipeline_stage=16,
        num_layers_in_last_pipeline_stage=14,
    )
    plain = estimate_details(minimax, h200x64, seed_workload, lay)
    assert all(
        plain.times.hidden_forward[p][r][v] == 0 for p in ("tp_comm", "ep_comm") for r in range(4) for v in range(2)
    )
    assert plain.times.hidden_forward["cp_comm"][0][0] > 0  # the CP ring always overlaps part (cp_p2p_overlap)
    opts = RunOptions(tp_comm_overlap=True, overlap_moe_expert_parallel_comm=True, overlap_grad_reduce=True)
    ov = estimate_details(minimax, h200x64, seed_workload, lay, options=opts)
    cal = estimate_mod.DEFAULT_CALIBRATION
    f = cal.tp_comm_overlap_fraction
    for r in range(4):
        for v in range(2):
            whole = plain.times.forward["tp_comm"][r][v]
            assert ov.times.hidden_forward["tp_comm"][r][v] == pytest.approx(whole * f, rel=1e-9)
            assert ov.times.forward["tp_comm"][r][v] == pytest.approx(whole * (1 - f), rel=1e-9)
            assert ov.times.hidden_backward["ep_comm"][r][v] > 0
    assert all(h > 0 for h in ov.tail_hidden["dp_comm"]) and all(h == 0 for h in plain.tail_hidden["dp_comm"])
    for p in HIDDEN_PARTS:  # exposed + hidden is the whole communication, with or without the flags
        for r in range(4):
            a = sum(ov.times.forward[p][r]) + sum(ov.times.hidden_forward[p][r])
            b = sum(plain.times.forward[p][r]) + sum(plain.times.hidden_forward[p][r])
            if p != "ep_comm":  # EP's fixed costs are not communication: only its all-to-alls overlap
                assert a == pytest.approx(b, rel=1e-9), (p, r)


def test_a_pipeline_of_one(minimax, h200x64, seed_workload):
    lay = Layout(
        world_size=64, pp=1, ep=64, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        optimizer_offload_fraction=1.0,
    )
    w = Workload(seq_length=8192, global_batch_size=128)
    d = estimate_details(minimax, h200x64, w, lay)
    assert d.estimate.time["pp_bubble"] == 0.0
    assert len(d.schedule) == 2 * d.num_microbatches
    assert d.pipeline_s == pytest.approx(d.closed_form_pipeline_s, rel=1e-12)
