"""Parameters per GPU and model-state bytes, worked out by hand on the tiny MoE model.

TINY_MOE per layer: attention h*d*(n + 2g) + n*d*h = 64*16*8 + 4*16*64 = 12,288; norms 2h + QK norm
2d = 160; dense MLP 3*64*256 = 49,152; one expert 3*64*32 = 6,144; shared experts 3*64*64 = 12,288;
router 64*8 = 512; embedding 1,024*64 = 65,536. BASE: tp 2, pp 2 (rank 0: layers 0 dense + 1 MoE;
rank 1: layers 2, 3 MoE + the MTP layer), ep 4, etp 1, dp x cp = 4, edp 2.
"""

from __future__ import annotations

import numpy as np
import pytest
from term_fixtures import BASE, TINY_DENSE, make_ctx

from cost_model.terms import params, state
from specs import Precision, RunOptions, TunerError, Workload

R0, R1 = (0, 0), (0, 1)  # (row, rank class): pipeline rank 0 and rank 1 of BASE


def test_decoder_layer_params_split_tp_and_replicate_norms_and_router():
    p = params.decoder_layer_params(make_ctx(**BASE))
    # rank 0: 2 layers x (12288/2 + 160) + 1 dense MLP 49152/2 + 1 MoE layer (shared 12288/2 + router 512)
    assert p[R0] == 2 * (6144 + 160) + 24576 + (6144 + 512)
    # rank 1: 2 layers x (6144 + 160) + 2 MoE layers x (6144 + 512)
    assert p[R1] == 2 * (6144 + 160) + 2 * (6144 + 512)


def test_embedding_on_the_first_rank_only():
    p = params.embedding_params(make_ctx(**BASE))
    assert p[R0] == 65536 / 2 and p[R1] == 0


def test_output_layer_and_final_norm_on_the_last_rank():
    p = params.output_layer_params(make_ctx(**BASE))
    assert p[R1] == 65536 / 2 + 64 and p[R0] == 0
    # PP 1: a tied output layer is the embedding itself (only the final norm is added); untied it is one more copy
    tied_model = TINY_DENSE.replace(untie_embeddings_and_output_weights=False)
    assert params.output_layer_params(make_ctx(model=tied_model, tp=2, sequence_parallel=True))[0, 0] == 64
    assert params.output_layer_params(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True))[0, 0] == 65536 / 2 + 64
    # PP > 1: the last rank keeps its own copy even when tied
    assert (
        params.output_layer_params(make_ctx(model=tied_model, tp=2, pp=2, sequence_parallel=True))[0, 1]
        == 65536 / 2 + 64
    )


def test_mtp_layer_on_the_last_rank():
    p = params.mtp_params(make_ctx(**BASE))
    # attention 12288 + norms 160 + eh_proj 2*64*64 + (the last layer is MoE) shared 12288 + router 512, split by tp 2
    assert p[R1] == (12288 + 160 + 8192 + 12288 + 512) / 2 and p[R0] == 0
    assert params.mtp_params(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True))[0, 0] == 0


def test_dense_params_add_up():
    p = params.dense_params(make_ctx(**BASE))
    assert p[R0] == 43840 + 32768
    assert p[R1] == 25920 + (32768 + 64) + 16720


def test_expert_params_split_by_ep_and_etp():
    p = params.expert_params(make_ctx(**BASE))
    # rank 0: 1 MoE layer x 8/4 experts x 6144; rank 1: (2 + 1 MTP) x 2 x 6144
    assert p[R0] == 1 * 2 * 6144 and p[R1] == 3 * 2 * 6144
    p2 = params.expert_params(make_ctx(**{**BASE, "cp": 1, "ep": 4, "etp": 2}))
    assert p2[R1] == 3 * 2 * 6144 / 2
    assert not params.expert_params(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)).any()


def test_optimizer_shards_over_dp_cp_and_edp():
    dense, experts = state.optimizer_shards(make_ctx(**BASE))
    assert dense[0, 0] == 2 * 2 and experts[0, 0] == 2
    dense, experts = state.optimizer_shards(
        make_ctx(**BASE, use_distributed_optimizer=False, use_precision_aware_optimizer=False)
    )
    assert dense[0, 0] == 1 and experts[0, 0] == 1


def test_owned_params():
    c = make_ctx(**BASE)
    owned = state.owned_params(c, params.dense_params(c), params.expert_params(c))
    assert owned[R0] == 76608 / 4 + 12288 / 2
    assert owned[R1] == 75472 / 4 + 36864 / 2


def _pe(c):
    return params.dense_params(c), params.expert_params(c)


def test_weight_bytes_bf16_fp8_and_fsdp():
    c = make_ctx(**BASE)
    assert state.weight_bytes(c, *_pe(c))[R1] == 2 * (75472 + 36864)
    c8 = make_ctx(workload=Workload(seq_length=1024, global_batch_size=16, precision=Precision.fp8), **BASE)
    assert state.weight_bytes(c8, *_pe(c8))[R1] == (2 + 1) * (75472 + 36864)  # bf16 + the fp8 copy
    cf = make_ctx(options=RunOptions(use_megatron_fsdp=True), **BASE)
    assert state.weight_bytes(cf, *_pe(cf))[R1] == 2 * (75472 / 4 + 36864 / 2)


def test_weight_bytes_with_fp8_param_gather():
    c8 = make_ctx(
        workload=Workload(seq_length=1024, global_batch_size=16, precision=Precision.fp8),
        options=RunOptions(fp8_param_gather=True),
        **BASE,
    )
    assert state.weight_bytes(c8, *_pe(c8))[R1] == 1 * (75472 + 36864)  # the fp8 weights only, no bf16 copy
    # fp8_param_gather does not touch nvfp4 (fp4_param_gather does) nor bf16 (the test GPU has no fp4: the rule only)
    assert not RunOptions(fp8_param_gather=True).low_precision_params(Precision.nvfp4)
    assert RunOptions(fp4_param_gather=True).low_precision_params(Precision.nvfp4)
    assert RunOptions(fp8_param_gather=True).low_precision_params(Precision.mxfp8)
    cb = make_ctx(options=RunOptions(fp8_param_gather=True), **BASE)
    assert state.weight_bytes(cb, *_pe(cb))[R1] == 2 * (75472 + 36864)


def test_main_grad_bytes_fp32_and_fsdp():
    c = make_ctx(**BASE)
    assert state.main_grad_bytes(c, *_pe(c))[R0] == 4 * (76608 + 12288)
    cf = make_ctx(options=RunOptions(use_megatron_fsdp=True), **BASE)
    assert state.main_grad_bytes(cf, *_pe(cf))[R0] == 4 * (76608 / 4 + 12288 / 2)


def test_main_grad_bytes_in_the_param_dtype_without_grad_reduce_in_fp32():
    c = make_ctx(options=RunOptions(grad_reduce_in_fp32=False), **BASE)
    assert state.main_grad_bytes_per_param(c) == 2
    assert state.main_grad_bytes(c, *_pe(c))[R0] == 2 * (76608 + 12288)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (dict(), 2 + 4 + 4),  # precision-aware: master remainder 2 B, fp32 moments
        (dict(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"), 2 + 2 + 2),
        (dict(exp_avg_dtype="bf16"), 2 + 2 + 4),
        (dict(use_precision_aware_optimizer=False), 4 + 4 + 4),  # Megatron's 12 bytes
    ],
)
def test_optimizer_bytes_per_param(layout, expected):
    assert state.optimizer_bytes_per_param(make_ctx(**BASE, **layout))[0, 0] == expected


@pytest.mark.parametrize(
    ("precision", "recipe", "expected"),
    [
        ("fp8", "delayed", 2 + 4 + 4),  # TE's FusedAdam owns the masters: 2-B remainders
        ("fp8", "tensorwise", 4 + 4 + 4),  # current scaling: fp32 masters (measured on H200: +2 B per parameter)
        ("bf16", "tensorwise", 2 + 4 + 4),
    ],
)
def test_precision_aware_master_weights_per_recipe(precision, recipe, expected):
    w = Workload(seq_length=1024, global_batch_size=16, precision=precision)
    assert (
        state.optimizer_bytes_per_param(make_ctx(workload=w, options=RunOptions(fp8_recipe=recipe), **BASE))[0, 0]
        == expected
    )
    # MX and fp4 keep fp32 masters too (the test GPU has no Blackwell tensor cores: the rule only)
    assert not RunOptions().precision_aware_owns_masters(
        Precision.mxfp8
    ) and not RunOptions().precision_aware_owns_masters(Precision.nvfp4)


def test_bridge_bf16_optimizer_fp8_recipe_keeps_fp32_masters():
    # Megatron-Bridge hands the optimizer fp8_recipe "tensorwise" even for bf16: megatron-core keeps fp32 masters
    w = Workload(seq_length=1024, global_batch_size=16, precision="bf16")
    bridge = RunOptions(optimizer_fp8_recipe="tensorwise")
    assert state.optimizer_bytes_per_param(make_ctx(workload=w, options=bridge, **BASE))[0, 0] == 4 + 4 + 4
    assert (
        state.optimizer_bytes_per_param(
            make_ctx(workload=w, options=RunOptions(optimizer_fp8_recipe="delayed"), **BASE)
        )[0, 0]
        == 2 + 4 + 4
    )
    assert not bridge.precision_aware_owns_masters(Precision.bf16) and RunOptions().precision_aware_owns_masters(
        Precision.bf16
    )
    # an fp8 run's masters follow its own recipe, not this field
    assert RunOptions(optimizer_fp8_recipe="tensorwise").precision_aware_owns_masters(Precision.fp8)
    with pytest.raises(TunerError, match="optimizer_fp8_recipe 'mxfp9': accepted none, delayed, tensorwise"):
        RunOptions(optimizer_fp8_recipe="mxfp9")


def test_distributed_muon_keeps_one_momentum():
    assert (
        state.optimizer_bytes_per_param(
            make_ctx(options=RunOptions(optimizer="dist_muon"), **BASE, use_precision_aware_optimizer=False)
        )[0, 0]
        == 8
    )


def test_optimizer_state_bytes_less_the_offloaded_share():
    c = make_ctx(**BASE, optimizer_offload_fraction=0.25)
    owned = np.array([[100.0, 300.0]])
    # with offload the GPU share is stepped with fp32 clones and fp32 moments: 12 B, not the precision-aware 10
    assert state.optimizer_state_bytes(c, owned).tolist() == [[12 * 100 * 0.75, 12 * 300 * 0.75]]
    assert state.optimizer_state_bytes(make_ctx(**BASE), owned).tolist() == [[10 * 100, 10 * 300]]
    params = np.array([[200.0, 600.0]])
    # the first HybridDeviceOptimizer's fp32 clones of the GPU share of the unsharded parameters (4 B each) and the
    # cached bf16 clones of the offloaded share (2 B each)
    assert state.offload_build_bytes(c, params, 0 * params).tolist() == [
        [(4 * 0.75 + 2 * 0.25) * 200, (4 * 0.75 + 2 * 0.25) * 600]
    ]
    assert state.offload_build_bytes(make_ctx(**BASE), params, params).tolist() == [[0.0, 0.0]]
