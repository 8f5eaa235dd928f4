"""What a step trains on (:class:`Workload`) and the run flags shared by a whole table (:class:`RunOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from specs.errors import TunerError
from specs.precision import Precision

__all__ = ["CUDA_GRAPH_MOE_SCOPES", "DEFAULT_RUN_OPTIONS", "HARNESS_RUN_OPTIONS", "RunOptions", "Workload"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What one optimizer step trains on."""

    seq_length: int = 8192
    """Tokens per row (``--seq-length``)."""
    global_batch_size: int = 128
    """Rows per optimizer step (``--global-batch-size``)."""
    precision: Precision = Precision.bf16
    dataset: str = "synthetic fixed-length rows"

    def __post_init__(self) -> None:
        if self.seq_length <= 0:
            raise TunerError(f"--seq-len must be a positive integer, got {self.seq_length}")
        if self.global_batch_size <= 0:
            raise TunerError(f"--global-batch must be a positive integer, got {self.global_batch_size}")
        if self.seq_length > 2**24 or self.global_batch_size > 2**24:
            raise TunerError(f"--seq-len and --global-batch must be at most {2**24:,}")
        try:
            object.__setattr__(self, "precision", Precision(self.precision))
        except ValueError:
            raise TunerError(f"--precision {self.precision!r}: accepted {', '.join(p.value for p in Precision)}") from None

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size


#: ``--cuda-graph-scope`` values (Megatron-core ``transformer_config.py``) that capture the MoE
#: router and token preprocessing, whose small kernels make up the fixed per-layer MoE cost.
CUDA_GRAPH_MOE_SCOPES = ("moe_router", "moe_preprocess", "moe", "full_iteration")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Run flags that change the cost but are not searched over (one value for the whole table).

    Defaults are the seed's run (seeds/001: slime, natural routing, no overlap flags, no CUDA
    graphs), so a model built without options predicts what it did before these existed.
    NVIDIA's published Megatron-Bridge runs set most of them (``tune validate`` reads them
    from each CSV row).
    """

    moe_router_force_load_balancing: bool = False
    """``--moe-router-force-load-balancing``: tokens are routed uniformly (benchmarks); False =
    natural routing, whose slowest expert rank carries ``Calibration.moe_load_imbalance`` x the mean."""
    cp_comm_type: str = "p2p"
    """``--cp-comm-type``: ``p2p`` (ring of K/V blocks, overlapped with attention) or ``a2a``
    (all-to-all of heads, Ulysses style, not overlapped)."""
    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm``: EP all-to-all overlapped with another micro-batch's compute."""
    cuda_graph_scope: tuple[str, ...] = ()
    """``--cuda-graph-scope`` values when CUDA graphs are on (``--cuda-graph-impl`` not none); empty = off."""
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp`` (ZeRO-3 style: parameters, gradients and optimizer states sharded over DP)."""
    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce`` / ``--overlap-param-gather``: DP communication overlapped with compute."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (Transformer Engine userbuffers): TP collectives overlapped with GEMMs."""
    te_attention: bool = True
    """Attention runs Transformer Engine's fused attention (``--transformer-impl transformer_engine``,
    the default of Megatron-core, NVIDIA's recipes and the seed's slime run): its output is already
    ``[s, b, h]`` and is saved once, as the output projection's input. False for a stack without TE
    (this project's trial harness, ``launch/harness``): ``scaled_dot_product_attention``'s output is
    permuted and reshaped (a copy) before the projection, so two copies of the attention output are
    saved (:data:`HARNESS_RUN_OPTIONS`)."""

    def __post_init__(self) -> None:
        if self.cp_comm_type not in ("p2p", "a2a"):
            raise TunerError(f"cp_comm_type {self.cp_comm_type!r}: accepted p2p or a2a")
        object.__setattr__(self, "cuda_graph_scope", tuple(str(x) for x in self.cuda_graph_scope))

    @property
    def cuda_graph_full(self) -> bool:
        """The whole iteration (or whole layers) is captured: every launch latency shrinks."""
        return any(x in ("full_iteration", "full") for x in self.cuda_graph_scope)

    @property
    def cuda_graph_moe(self) -> bool:
        """The MoE router / preprocessing is captured (or the whole iteration)."""
        return any(x in CUDA_GRAPH_MOE_SCOPES or x == "full" for x in self.cuda_graph_scope)


DEFAULT_RUN_OPTIONS = RunOptions()

#: Run options of this project's trial harness without Transformer Engine (``launch/harness``,
#: megatron-core's local layer spec): the seed's flags, attention output saved twice.
HARNESS_RUN_OPTIONS = RunOptions(te_attention=False)
