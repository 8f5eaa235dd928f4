"""Activation, recompute and dynamic-memory terms, worked out by hand on the tiny MoE model.

BASE: 512 tokens per micro-batch (1 x 1,024 / cp 2), tp 2, etp 1, natural routing (x 1.2):
routed copies per GPU = 512 x top-2 x 1 / 2 x 1.2 = 614.4. h 64; q_dim 64 (4 heads x 16),
kv_dim 64 (2 groups x 16 x K and V), ctx_dim 64; one expert 32 wide, shared experts 64, SwiGLU (3).
"""

from __future__ import annotations

import numpy as np
import pytest
from term_fixtures import BASE, TEST_CAL, TINY_DENSE, TINY_MOE, make_ctx

from cost_model.terms import activations as act
from cost_model.terms import memory
from specs import RunOptions, Workload

GIB = 2**30
COPIES = 512 * 2 * 1 / 2 * 1.2
SELECTIVE = dict(
    recompute_granularity="selective", recompute_modules=("core_attn", "layernorm", "moe_act", "shared_experts")
)


def test_routed_token_copies():
    assert act.routed_token_copies(make_ctx(**BASE))[0, 0] == pytest.approx(614.4)
    # EP 1: one rank holds every expert and gets every copy, natural routing or not (measured on H200)
    assert act.routed_token_copies(make_ctx(**{**BASE, "ep": 1}))[0, 0] == pytest.approx(512 * 2 / 2)
    forced = make_ctx(options=RunOptions(moe_router_force_load_balancing=True), **{**BASE, "etp": 2, "cp": 1})
    assert act.routed_token_copies(forced)[0, 0] == pytest.approx(1024 * 2 * 2 / 2)  # cp 1: 1,024 tokens, etp 2


def test_layer_input_bytes():
    assert act.layer_input_bytes(make_ctx(**BASE))[0, 0] == 2 * 512 * 64 / 2


def test_qk_norm_bytes():
    # the queries (64) and keys (half of kv_dim 64) per token, bf16, split by tp
    assert act.qk_norm_bytes(make_ctx(**BASE))[0, 0] == 2 * 512 / 2 * (64 + 32)
    assert act.qk_norm_bytes(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True))[0, 0] == 0


NO_TE = RunOptions(te_attention=False, bias_activation_fusion=False)
UNFUSED = RunOptions(bias_activation_fusion=False)
FP8 = Workload(seq_length=1024, global_batch_size=16, precision="fp8")


def test_attention_bytes_with_and_without_te():
    te = act.attention_bytes(make_ctx(**BASE))[0, 0]
    # TE (measured on H200): the fused norm's input and the QKV input (2 x 64) + Q + K,V + the output (bf16), 256 tokens
    # per GPU; the fp32 softmax statistics per head; the QK-norm inputs (Q 64 + K 32, bf16)
    assert te == 256 * 2 * (2 * 64 + 64 + 64 + 64) + 4 * 512 * 4 / 2 + 2 * 256 * (64 + 32)
    no_te = act.attention_bytes(make_ctx(options=NO_TE, **BASE))[0, 0]
    assert no_te == te + 256 * 2 * 64 + 256 * 2 * 64  # the third hidden-size tensor and the permuted output copy
    fp8 = act.attention_bytes(make_ctx(workload=FP8, **BASE))[0, 0]
    # fp8: the QKV input at 1 B (64 B less per token) and the projection's own 1-B copy of the output (64 B more)
    assert fp8 == te


def test_attention_bytes_of_mla_and_up_projection_recompute():
    mla = TINY_MOE.replace(
        q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, qk_layernorm=False
    )
    c = make_ctx(model=mla, **BASE)
    m = c.dims
    assert (m.q_dim, m.saved_kv_dim, m.ctx_dim, m.latent_dim, m.expanded_qkv_dim) == (48, 80, 32, 40, 128)
    # hidden 2 x 64 x 2 B, Q 48 + K,V 80 + output 32 (bf16), the latents 40 at 2 + 2 B (input + norm output)
    assert act.attention_bytes(c)[0, 0] == 256 * (256 + 2 * 128 + 2 * 32 + 4 * 40) + 4096
    up = make_ctx(model=mla, **BASE, recompute_granularity="selective", recompute_modules=("mla_up_proj",))
    assert act.saved_attention_bytes(up)[0, 0] == 256 * 2 * 128  # the expanded Q, K, V
    ln = make_ctx(model=mla, **BASE, recompute_granularity="selective", recompute_modules=("layernorm",))
    assert act.saved_attention_bytes(ln)[0, 0] == 32768  # MLA's input norm is a TENorm of its own


def test_core_attention_bytes():
    assert (
        act.core_attention_bytes(make_ctx(**BASE))[0, 0] == 4 * 512 * 4 / 2
    )  # TE bf16: the projection keeps the output
    assert act.core_attention_bytes(make_ctx(options=NO_TE, **BASE))[0, 0] == 2 * 512 * 64 / 2 + 4 * 512 * 4 / 2
    assert act.core_attention_bytes(make_ctx(workload=FP8, **BASE))[0, 0] == 2 * 512 * 64 / 2 + 4 * 512 * 4 / 2


def test_norm_bytes_and_which_norms_are_modules():
    assert act.norm_bytes(make_ctx(**BASE))[0, 0] == 2 * 512 * 64 / 2
    te, no_te = make_ctx(**BASE), make_ctx(options=NO_TE, **BASE)
    assert not act.input_norm_separate(te) and act.input_norm_separate(no_te)
    assert (
        act.pre_mlp_norm_separate(te, True)
        and not act.pre_mlp_norm_separate(te, False)
        and act.pre_mlp_norm_separate(no_te, False)
    )


def test_expert_bytes():
    c = make_ctx(**BASE)
    copies = act.routed_token_copies(c)
    # per copy (measured structure): fc1 input 64 + fc1 output 2 x 32 + fc2 input 32, bf16
    assert act.expert_bytes(c, copies)[0, 0] == pytest.approx(COPIES * 2 * (64 + 64 + 32))
    unfused = make_ctx(options=UNFUSED, **BASE)
    assert act.expert_bytes(unfused, copies)[0, 0] == pytest.approx(
        COPIES * 2 * (64 + 64 + 32 + 3 * 32)
    )  # + SiLU, gate, weighted
    fp8 = make_ctx(workload=FP8, **BASE)
    assert act.expert_bytes(fp8, copies)[0, 0] == pytest.approx(COPIES * (64 + 2 * 64 + 32))  # GEMM inputs at 1 B
    assert act.expert_activation_fn_bytes(c, copies)[0, 0] == pytest.approx(COPIES * 2 * 32)
    assert act.expert_activation_fn_bytes(unfused, copies)[0, 0] == pytest.approx(COPIES * 2 * 32 * 4)
    c2 = make_ctx(**{**BASE, "cp": 1, "etp": 2})
    copies2 = act.routed_token_copies(c2)
    assert act.expert_bytes(c2, copies2)[0, 0] == pytest.approx(2 * copies2[0, 0] * (64 + 32 + 16))
    assert act.expert_activation_fn_bytes(c2, copies2)[0, 0] == pytest.approx(2 * copies2[0, 0] * 16)
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert act.expert_bytes(d, act.routed_token_copies(d))[0, 0] == 0


def test_router_shared_and_dense_mlp_bytes():
    c = make_ctx(**BASE)
    assert act.router_bytes(c)[0, 0] == 12 * 512 * 8 / 2  # fp32 logits + int64 routing map (measured)
    assert act.shared_expert_bytes(c)[0, 0] == 256 * (2 * 2 * 64 + 2 * 64)
    assert act.shared_expert_bytes(make_ctx(workload=FP8, **BASE))[0, 0] == 256 * (
        2 * 2 * 64 + 64 + 64
    )  # fc2 in + own 1-B input
    assert act.dense_mlp_bytes(c)[0, 0] == 256 * (2 * 2 * 256 + 2 * 256)
    assert act.dense_mlp_bytes(make_ctx(options=UNFUSED, **BASE))[0, 0] == 256 * (
        3 * 2 * 256 + 2 * 256
    )  # + the SiLU output
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert act.router_bytes(d)[0, 0] == 0 and act.shared_expert_bytes(d)[0, 0] == 0
    assert act.dense_mlp_bytes(d)[0, 0] == 512 * (2 * 256 + 2 * 256)  # 1,024 tokens / tp 2, GeLU: fc1 out + fc2 in


def test_moe_and_dense_block_bytes():
    c = make_ctx(**BASE)
    # the norm's input + its output (the router's input) + router + experts + shared experts
    assert act.moe_block_bytes(c, act.routed_token_copies(c))[0, 0] == pytest.approx(
        32768 + 32768 + 24576 + 2 * COPIES * 160 + 98304
    )
    assert act.dense_block_bytes(c)[0, 0] == 32768 + 32768 + 393216
    assert act.dense_block_bytes(make_ctx(workload=FP8, **BASE))[0, 0] == 32768 + 16384 + 256 * (2 * 2 * 256 + 256)


def test_saved_bytes_of_selective_recompute():
    c = make_ctx(**BASE, **SELECTIVE)
    copies = act.routed_token_copies(c)
    assert act.saved_attention_bytes(c)[0, 0] == 4096  # core_attn (statistics); the TE input norm is fused: nothing
    no_te = make_ctx(options=NO_TE, **BASE, **SELECTIVE)
    assert act.saved_attention_bytes(no_te)[0, 0] == 36864 + 32768
    block = np.array([[100000.0]])
    # moe_act + shared_experts + the pre-MLP norm (a TENorm in MoE layers)
    assert act.saved_moe_bytes(c, block, copies)[0, 0] == pytest.approx(2 * COPIES * 32 + 98304 + 32768)
    moe = make_ctx(**BASE, recompute_granularity="selective", recompute_modules=("moe", "shared_experts"))
    assert act.saved_moe_bytes(moe, block, copies)[0, 0] == 100000 - 2 * 32768  # inside the MoE layer only
    mlp = make_ctx(**BASE, recompute_granularity="selective", recompute_modules=("mlp",))
    assert act.saved_dense_bytes(mlp, block)[0, 0] == 100000 - 32768  # TE: the fused norm is inside the MLP
    mlp_no_te = make_ctx(options=NO_TE, **BASE, recompute_granularity="selective", recompute_modules=("mlp",))
    assert act.saved_dense_bytes(mlp_no_te, block)[0, 0] == 100000 - 2 * 32768
    assert act.saved_dense_bytes(c, block)[0, 0] == 0  # layernorm: the dense pre-MLP norm is fused under TE
    assert act.saved_dense_bytes(no_te, block)[0, 0] == 32768
    none = make_ctx(**BASE)
    assert act.saved_attention_bytes(none)[0, 0] == 0 and act.saved_moe_bytes(none, block, copies)[0, 0] == 0


def test_kept_bytes():
    assert act.kept_bytes(np.array([[10.0]]), np.array([[3.0]]), np.array([[2.0]]))[0, 0] == 5


def test_recomputed_fraction_counts_every_chunk():
    block = dict(
        tp=2, sequence_parallel=True, pp=2, recompute_granularity="full", recompute_method="block",
        recompute_num_layers=1,
    )
    # 8 layers on pp 2: 4 per rank; one chunk -> the first layer of it; two chunks of 2 -> the first of each
    assert act.recomputed_fraction(make_ctx(model=TINY_DENSE, **block)).tolist() == [[0.25, 0.25]]
    assert act.recomputed_fraction(make_ctx(model=TINY_DENSE, vpp=2, **block)).tolist() == [[0.5, 0.5]]


def test_stored_layer_bytes_per_recompute_choice():
    inp, kept, frac = np.array([[8.0]]), np.array([[20.0]]), np.array([[0.25, 0.5]])
    full = dict(**BASE, recompute_granularity="full", recompute_num_layers=2)
    uniform = make_ctx(**full, recompute_method="uniform")
    assert act.stored_layer_bytes(uniform, inp, kept, frac).tolist() == [[4.0, 4.0]]  # one input per group of 2
    block = make_ctx(**full, recompute_method="block")
    assert act.stored_layer_bytes(block, inp, kept, frac).tolist() == [[0.25 * 8 + 0.75 * 20, 0.5 * 8 + 0.5 * 20]]
    assert act.stored_layer_bytes(make_ctx(**BASE, **SELECTIVE), inp, kept, frac).tolist() == [[20.0, 20.0]]


def test_rank_activation_bytes():
    # rank 0: one MoE + one dense layer; rank 1: two MoE layers
    assert act.rank_activation_bytes(make_ctx(**BASE), np.array([[10.0]]), np.array([[1.0]])).tolist() == [[11.0, 20.0]]


# --------------------------------------------------------------------------- memory


def test_embedding_activation_bytes():
    out = memory.embedding_activation_bytes(make_ctx(**BASE), np.array([[2.0, 1.0]]))
    assert out.tolist() == [[2 * 512 * 64 / 2 * 2, 0.0]]


def test_working_set_bytes():
    moe, dense = np.array([[100.0]]), np.array([[300.0]])
    # rank 0 has a dense layer (the larger one here), rank 1 MoE layers only; half of one layer
    assert memory.working_set_bytes(make_ctx(**BASE), moe, dense).tolist() == [[150.0, 50.0]]
    full = make_ctx(**BASE, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2)
    assert memory.working_set_bytes(full, moe, dense).tolist() == [[600.0, 200.0]]  # the group of 2 layers, whole
    # block recompute checkpoints each of its layers alone: one layer whole, whatever recompute_num_layers is
    block = make_ctx(**BASE, recompute_granularity="full", recompute_method="block", recompute_num_layers=2)
    assert memory.working_set_bytes(block, moe, dense).tolist() == [[300.0, 100.0]]


def test_activation_bytes():
    c = make_ctx(**BASE)
    out = memory.activation_bytes(
        c, np.array([[10.0, 10.0]]), np.array([[2.0, 1.0]]), np.array([[5.0, 0.0]]), np.array([[1.0, 1.0]])
    )
    assert out.tolist() == [[26.0, 11.0]]


def test_logits_bytes_count_the_mtp_head():
    assert memory.logits_bytes(make_ctx(**BASE)).tolist() == [[0.0, 6 * 512 * 1024 / 2 * (1 + 1)]]
    assert memory.logits_bytes(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True))[0, 0] == 6 * 1024 * 1024 / 2


def test_logits_bytes_with_te_fused_cross_entropy():
    te17 = RunOptions(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te", te_version="2.17")
    assert memory.logits_bytes_per_element(make_ctx(options=te17, **BASE)) == 2.0  # the gradient in place, bf16
    te18 = RunOptions(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te", te_version="2.18")
    assert (
        memory.logits_bytes_per_element(make_ctx(options=te18, **BASE)) == 4.0
    )  # measured on TE 2.20.2: bf16 logits + one bf16 buffer
    native = RunOptions(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native", te_version="2.17")
    assert (
        memory.logits_bytes_per_element(
            make_ctx(options=native, cal=TEST_CAL.replace(logits_bytes_per_element=5.0), **BASE)
        )
        == 5.0
    )
    assert memory.logits_bytes(make_ctx(options=te17, **BASE)).tolist() == [[0.0, 2 * 512 * 1024 / 2 * 2]]


def test_activation_offload_keeps_the_other_layers_and_one_in_transit():
    c = make_ctx(options=RunOptions(cpu_offloading_num_layers=1), **BASE)  # 2 layers per rank
    assert memory.offloaded_layers(c).tolist() == [[1.0, 1.0]]
    assert memory.offload_kept_bytes(c, np.array([[100.0, 60.0]])).tolist() == [[100.0, 60.0]]  # 1 kept + 1 in transit
    c3 = make_ctx(
        model=TINY_DENSE, options=RunOptions(cpu_offloading_num_layers=3), tp=2, sequence_parallel=True
    )  # 8 layers
    assert memory.offload_kept_bytes(c3, np.array([[80.0]])).tolist() == [[80.0 - 30.0 + 10.0]]
    assert memory.offload_kept_bytes(make_ctx(**BASE), np.array([[100.0, 60.0]])).tolist() == [[100.0, 60.0]]


def test_cuda_graph_buffer_bytes():
    inflight = np.array([[3.0, 1.0]])
    te = make_ctx(options=RunOptions(cuda_graph_scope=("attn", "moe_router"), te_version="2.6"), **BASE)
    layer_input = 2 * 512 * 64 / 2
    assert memory.cuda_graph_buffer_bytes(te, inflight).tolist() == [[2 * layer_input * 2 * 3, 2 * layer_input * 2 * 1]]
    # from TE 2.7 megatron-core reuses the graphs' input buffers: the in-flight inputs are the layers' saved inputs
    reuse = make_ctx(options=RunOptions(cuda_graph_scope=("attn", "moe_router"), te_version="2.7"), **BASE)
    assert memory.cuda_graph_buffer_bytes(reuse, inflight).tolist() == [
        [1 * layer_input * 2 * 3, 1 * layer_input * 2 * 1]
    ]
    whole = make_ctx(options=RunOptions(cuda_graph_scope=("full_iteration",)), **BASE)
    assert not memory.cuda_graph_buffer_bytes(whole, inflight).any()
    assert not memory.cuda_graph_buffer_bytes(make_ctx(**BASE), inflight).any()


def test_dispatcher_buffer_bytes():
    c = make_ctx(**BASE)
    copies = act.routed_token_copies(c)
    assert memory.dispatcher_buffer_bytes(c, copies)[0].tolist() == pytest.approx([2 * 2 * COPIES * 64] * 2)
    flex = make_ctx(**BASE, dispatcher="flex+hybridep")
    assert memory.dispatcher_buffer_bytes(flex, copies)[0].tolist() == [2 * GIB, 2 * GIB]
    # pp 4: rank 0 holds only the dense layer 0, so no buffers there
    pp4 = make_ctx(tp=2, sequence_parallel=True, pp=4, ep=2)
    assert memory.dispatcher_buffer_bytes(pp4, act.routed_token_copies(pp4))[0, 0] == 0
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert not memory.dispatcher_buffer_bytes(d, act.routed_token_copies(d)).any()


def test_process_groups():
    # BASE: tp, pp, cp, dp 2, ep, edp 2 are > 1, etp is 1; plus the 2 every rank has
    assert memory.process_groups(make_ctx(**BASE))[0, 0] == 6 + 2
    # tp 16 alone: tp and the (expert) data-parallel group edp = 16 / (etp ep pp) = 16 count; dp is 1
    assert memory.process_groups(make_ctx(model=TINY_DENSE, tp=16, sequence_parallel=True))[0, 0] == 2 + 2


def test_framework_overhead_bytes():
    out = memory.framework_overhead_bytes(make_ctx(**BASE), np.array([[1e9, 0.0]]))
    base = 0.75 * GIB + 8 * 0.2 * GIB
    assert out[0].tolist() == pytest.approx([base + 0.08 * 1e9, base])


def test_a2a_overlap_keeps_one_more_moe_layer():
    ovl = RunOptions(overlap_moe_expert_parallel_comm=True)
    layer = np.array([[1000.0]])
    pp4 = dict(tp=2, sequence_parallel=True, pp=4, ep=2)  # rank 0 holds only the dense layer 0
    assert memory.a2a_overlap_extra_bytes(make_ctx(options=ovl, **pp4), layer).tolist() == [
        [0.0, 1000.0, 1000.0]
    ]  # 3 rank classes
    assert memory.a2a_overlap_extra_bytes(make_ctx(options=ovl, **BASE), layer).tolist() == [[1000.0, 1000.0]]
    assert not memory.a2a_overlap_extra_bytes(make_ctx(**BASE), layer).any()
    assert not memory.a2a_overlap_extra_bytes(
        make_ctx(model=TINY_DENSE, options=ovl, tp=2, sequence_parallel=True), layer
    ).any()
