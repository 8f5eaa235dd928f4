"""What the decoder benchmarks on one GPU share (``h200_recompute.py``, ``h200_moe_host.py``): megatron-core's process
groups for a world of one, the embedding-and-decoder ``GPTModel`` they time, and their JSON-lines writer. Imports torch
and megatron-core only when called, so the benchmarks' ``--compare`` side runs without them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def init_one_gpu(port: str, seed: int = 1234) -> None:
    """A world of one on GPU 0: the NCCL process group, megatron-core's model-parallel groups (all of size 1) and its
    CUDA RNG tracker seeded with ``seed``. ``port``: the rendezvous port (``MASTER_PORT`` when it is not set)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(seed)


def decoder_model(cfg: Any, model: dict[str, Any], max_sequence_length: int, seed: int = 1234) -> Any:
    """The embedding and the decoder layers of ``model`` (a harness spec's model fields) as a ``GPTModel`` with
    ``post_process=False`` (no output layer, no loss), TE layer spec with RMSNorm, RoPE, on GPU 0 in train mode; every
    build starts from ``seed``, so builds of one configuration have the same weights and route the same tokens."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=True, normalization="RMSNorm", vp_stage=None)
    m = GPTModel(
        config=cfg, transformer_layer_spec=block, vocab_size=model["vocab_size"],
        max_sequence_length=max_sequence_length, pre_process=True, post_process=False,
        share_embeddings_and_output_weights=False, position_embedding_type="rope",
        rotary_percent=model["rotary_percent"], rotary_base=int(model["rotary_base"]),
    )
    m.cuda(torch.cuda.current_device())
    m.train()
    return m


def jsonl_emitter(
    path: Path, printed: Callable[[dict[str, Any]], dict[str, Any]] = lambda r: r
) -> Callable[[dict[str, Any]], None]:
    """A writer that appends each row to ``path`` as one JSON line and prints ``printed(row)`` (e.g. the row without its
    long lists) to standard output."""

    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(printed(row)), flush=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    return emit
