"""One training step's pieces for :mod:`launch.harness.train`: micro-batches, loss function, global loss."""

from __future__ import annotations

from functools import partial
from typing import Any

from launch.harness.spec import HarnessSpec


def _batches(spec: HarnessSpec, corpus: Any = None, first_step: int = 0) -> Any:
    """An endless iterator of this rank's micro-batches: ``synthetic`` repeats one random micro-batch (the same on
    every rank); ``corpus`` reads text in Megatron's sample order (:mod:`launch.harness.data`)."""
    import torch
    from megatron.core import parallel_state

    b, s, v = spec.layout["micro_batch_size"], spec.seq_length, spec.model["vocab_size"]
    pos = torch.arange(s, device="cuda").unsqueeze(0).expand(b, s).contiguous()
    mask = torch.ones(b, s, device="cuda", dtype=torch.float32)

    def finish(tokens: Any) -> dict[str, Any]:
        batch = {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(), "loss_mask": mask,
                 "position_ids": pos}
        if parallel_state.get_context_parallel_world_size() > 1:
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch = get_batch_on_this_cp_rank(batch)
        return batch

    if spec.data == "synthetic":
        g = torch.Generator(device="cuda").manual_seed(spec.seed)
        batch = finish(torch.randint(0, v, (b, s + 1), device="cuda", generator=g))
        while True:
            yield batch
    from launch.harness.data import sample_index, sample_tokens

    dp = parallel_state.get_data_parallel_world_size()
    r = parallel_state.get_data_parallel_rank()
    m = spec.global_batch_size // (b * dp)
    step = first_step
    while True:
        for i in range(m):
            rows = [sample_tokens(corpus,
                                  sample_index(step, i, r, j, micro_batch_size=b, dp=dp,
                                               global_batch_size=spec.global_batch_size), s) for j in range(b)]
            yield finish(torch.tensor(rows, dtype=torch.long, device="cuda"))
        step += 1


def _global_loss(losses: Any, last: bool) -> float:
    """The step's loss: mean over every micro-batch of every data-parallel rank (the global batch),
    from one tensor-parallel rank of each last-stage group (TP ranks agree). A collective: every rank calls it."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    t = torch.zeros(2, device="cuda", dtype=torch.float64)
    if last and losses and parallel_state.get_tensor_model_parallel_rank() == 0:
        t[0] = torch.stack([x["lm loss"].double() for x in losses]).sum()
        t[1] = len(losses)
    dist.all_reduce(t)
    return float((t[0] / t[1].clamp(min=1)).item())


def _loss_func(loss_mask: Any, output: Any) -> Any:
    loss = (output.float() * loss_mask).sum() / loss_mask.sum()
    # a copy: megatron-core divides the returned loss by the number of micro-batches in place
    return loss, {"lm loss": loss.detach().clone()}


def _forward_step(data_iterator: Any, model: Any) -> Any:
    batch = next(data_iterator)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(_loss_func, batch["loss_mask"])


def _forward_backward(fb: Any, spec: HarnessSpec, chunks: list[Any], iters: list[Any], *, forward_only: bool = False,
                      num_microbatches: int | None = None) -> Any:
    """One step's forward (and backward) over its micro-batches (``fb``: megatron-core's schedule; default: all of the
    step's); the micro-batches' losses."""
    return fb(forward_step_func=_forward_step, data_iterator=iters if len(iters) > 1 else iters[0],
              model=chunks if len(chunks) > 1 else chunks[0],
              num_microbatches=spec.num_microbatches if num_microbatches is None else num_microbatches,
              seq_length=spec.seq_length, micro_batch_size=spec.layout["micro_batch_size"],
              decoder_seq_length=spec.seq_length, forward_only=forward_only)


def _corpus_for(spec: HarnessSpec) -> Any:
    from launch.harness.data import load_corpus

    return load_corpus(spec.corpus_path)
