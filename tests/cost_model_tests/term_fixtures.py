"""Small models, a round-numbered GPU and a context factory for the term tests (``make_ctx``).

The numbers are chosen so that every expectation can be worked out by hand: hidden 64, 4 heads,
16-wide heads, 8 experts of width 32, 1,024 tokens per row, a GPU of 1 PFLOP/s bf16 and 2 TB/s HBM,
4 GPUs per node on NVLink at 400 GB/s, 200 GB/s of network per node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cost_model.calibration import BASE_CALIBRATION, Calibration
from cost_model.terms.context import TableContext, build_context
from specs import Cluster, GPUSpec, ModelSpec, RunOptions, Workload
from specs.layout import Layout, LayoutTable

#: A MoE model: layer 0 dense, layers 1-3 MoE, one MTP layer, per-head QK norm, SwiGLU.
TINY_MOE = ModelSpec(
    name="tiny-moe", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
    ffn_hidden_size=256, vocab_size=1024, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32,
    moe_shared_expert_intermediate_size=64, moe_layer_freq=(0, 1, 1, 1), qk_layernorm=True, mtp_num_layers=1,
)

#: A dense GPT in Korthikanti et al.'s setting: multi-head attention, ffn = 4h, a 2-matrix (GeLU) MLP.
TINY_DENSE = ModelSpec(
    name="tiny-dense", num_layers=8, hidden_size=64, num_attention_heads=4, num_query_groups=4, kv_channels=16,
    ffn_hidden_size=256, vocab_size=1024, moe_layer_freq=(0,) * 8, gated_linear_unit=False,
)

TEST_GPU = GPUSpec(
    name="T1", hbm_bytes=80 * 2**30, peak_flops_bf16=1e15, peak_flops_fp8=2e15, peak_flops_fp4=0.0,
    hbm_bytes_per_s=2e12, nvlink_bytes_per_s=4e11, pcie_bytes_per_s=5e10, gpus_per_node=4, nvlink_domain=4,
    family="hopper", source="round numbers for tests",
)

#: 16 GPUs: 4 nodes of 4, 200 GB/s of network per node (50 GB/s per GPU).
TEST_CLUSTER = Cluster(gpu=TEST_GPU, num_gpus=16, gpus_per_node=4, inter_node_bytes_per_s=2e11, usd_per_gpu_hour=1.0)

#: seq 1,024, global batch 16.
TEST_WORKLOAD = Workload(seq_length=1024, global_batch_size=16)

#: The unfitted constants, with a non-zero DP overlap (so that its term shows).
# the rows curve flat in the expert's shape (the tiny model's 64-wide experts would sit on the floor of the measured
# one); test_terms_compute tests the shape part by itself
TEST_CAL = BASE_CALIBRATION.replace(
    dp_overlap=0.25,
    attention_call_macs=0.0,
    grouped_gemm_efficiency=0.55,
    alltoall_nvlink_efficiency=0.55,
    grouped_gemm_half_rows=256.0,
    grouped_gemm_half_rows_work=0.0,
)  # the fixed call part is tested by itself (test_terms_compute)


MakeCtx = Callable[..., TableContext]


def make_ctx(
    model: ModelSpec = TINY_MOE,
    options: RunOptions = RunOptions(),
    cal: Calibration = TEST_CAL,
    workload: Workload = TEST_WORKLOAD,
    **layout: Any,
) -> TableContext:
    """The context of a one-row table on :data:`TEST_CLUSTER` (``layout``: :class:`Layout` fields)."""
    lay = Layout(world_size=TEST_CLUSTER.num_gpus, **layout)
    return build_context(model, TEST_CLUSTER, workload, LayoutTable.from_layouts([lay]), cal, options)


#: The base layout of the term tests on :data:`TINY_MOE`: tp 2, pp 2, cp 2, ep 4 -> dp 2, edp 2,
#: M = 16 / (1 x 2) = 8 micro-batches, 512 tokens per micro-batch; rank 0 holds layers 0 (dense)
#: and 1 (MoE), rank 1 layers 2 and 3 (MoE) and the MTP layer.
BASE = dict(tp=2, pp=2, cp=2, ep=4, sequence_parallel=True)
