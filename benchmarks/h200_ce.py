"""The cross-entropy implementations of megatron-core timed on one GPU (issue 14: what the output layer's loss costs).

    PYTHONPATH=/tmp/site:. OUT=... python3 benchmarks/h200_ce.py

For each vocabulary (MiniMax-M2 200,064; GPT-OSS 201,088; Qwen3 151,936; DeepSeek-V3 129,280; Llama-3 128,256) and
8,192 tokens, times the loss forward + backward with respect to bf16 logits ``[s, 1, V]`` (leaf tensors: the output
GEMM is not in the time) for the three paths megatron-core 0.19 takes in ``LanguageModule.compute_language_model_loss``:
``unfused`` (``tensor_parallel.vocab_parallel_cross_entropy``, no ``--cross-entropy-loss-fusion``), ``native``
(``fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy``) and ``te`` (Transformer Engine's
``parallel_cross_entropy`` through ``extensions.transformer_engine.te_parallel_cross_entropy``). The loss is reduced as
the harness reduces it (masked sum over the tokens) so the backward gets a per-token gradient, as in training.

Also times a bf16 copy of the logits (``torch.Tensor.copy_``, read + write) as the achieved HBM bandwidth of this GPU,
and records each path's peak allocated bytes above the logits and their gradient. Writes ``$OUT/ce.jsonl``: one row per
(vocab, path): ``fwd_bwd_s`` (median of 10 after 3 warm-up), ``bytes_equiv_per_element`` (that time at the copy's
bandwidth, over ``s x V``), ``extra_peak_bytes_per_element``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.cuda_timing import cuda_median_seconds

VOCABS = {
    "MiniMax-M2": 200064,
    "GPT-OSS-120B": 201088,
    "Qwen3-30B-A3B": 151936,
    "DeepSeek-V3": 129280,
    "Llama-3.1-8B": 128256,
}
TOKENS = 8192


def main() -> int:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    try:
        from megatron.core.extensions.transformer_engine import te_parallel_cross_entropy
    except ImportError:
        te_parallel_cross_entropy = None

    out = Path(os.environ.get("OUT") or "h200_ce_out")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    parallel_state.initialize_model_parallel(1, 1)
    tp = parallel_state.get_tensor_model_parallel_group()

    def timed(fn: Callable[[], object]) -> float:
        return cuda_median_seconds(fn, reps=10, warm=3)

    paths = {
        "unfused": lambda x, y: tensor_parallel.vocab_parallel_cross_entropy(x, y),
        "native": lambda x, y: fused_vocab_parallel_cross_entropy(x, y, tp),
    }
    if te_parallel_cross_entropy is not None:
        paths["te"] = lambda x, y: te_parallel_cross_entropy(x, y, tp)

    def one_vocab(model: str, v: int) -> list[dict[str, object]]:
        n = TOKENS * v
        logits = torch.randn(TOKENS, 1, v, device="cuda", dtype=torch.bfloat16).mul_(2.0).requires_grad_(True)
        labels = torch.randint(0, v, (TOKENS, 1), device="cuda")
        mask = torch.ones(TOKENS, 1, device="cuda", dtype=torch.float32)
        copy_s = timed(partial(torch.Tensor.copy_, torch.empty_like(logits, requires_grad=False), logits.detach()))
        copy_bw = 2 * 2 * n / copy_s  # bytes read + written per second
        rows: list[dict[str, object]] = []
        for name, f in paths.items():

            def step(f: object = f) -> None:
                logits.grad = None
                loss = f(logits, labels)  # type: ignore[operator]
                (loss.float() * mask).sum().backward()

            try:
                step()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t = timed(step)
                peak = torch.cuda.max_memory_allocated() - base
                row: dict[str, object] = {
                    "model": model,
                    "vocab": v,
                    "tokens": TOKENS,
                    "path": name,
                    "fwd_bwd_s": t,
                    "copy_s": copy_s,
                    "copy_bytes_per_s": copy_bw,
                    "bytes_equiv_per_element": t * copy_bw / n,
                    "extra_peak_bytes_per_element": peak / n,
                    "grad_dtype": str(logits.grad.dtype) if logits.grad is not None else None,
                }
            except Exception as e:  # noqa: BLE001 - a path that fails is a row, the others still run
                row = {"model": model, "vocab": v, "path": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out / "ce.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
        return rows

    rows: list[dict[str, object]] = []
    for model, v in VOCABS.items():
        rows += one_vocab(model, v)
        torch.cuda.empty_cache()
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import transformer_engine as te

        versions["transformer_engine"] = te.__version__
    except ImportError:
        pass
    try:
        import megatron.core as mc

        versions["megatron_core"] = getattr(mc, "__version__", "?")
    except ImportError:
        pass
    with open(out / "ce.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "versions", **versions, "gpu": torch.cuda.get_device_name(0)}) + "\n")
    dist.destroy_process_group()
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
