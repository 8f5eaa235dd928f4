"""Test helper: parse a Megatron-LM / slime argv the way Megatron's argparse would, check it, dump what arrived.

Shared by the fake entry points of the script-execution tests (``fake_slime_train`` for
``run_slime.sh``, ``pretrain_gpt.py`` for ``megatron_args.sh``). Self-contained on purpose (no
import of the project): the values must arrive through the shell intact, not be re-derived.

The dump (JSON, to ``$FAKE_ENTRY_DUMP``) holds the parsed degrees, batch, recompute and dispatcher
flags, the ``--pipeline-model-parallel-layout`` string with what it expands to (stages, VPP,
layers per pipeline rank, per Megatron's grammar), the raw argv and the environment variables
listed in ``$FAKE_ENTRY_ENV`` (comma-separated).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    p.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--use-dynamic-batch-size", action="store_true")
    p.add_argument("--max-tokens-per-gpu", type=int, default=None)
    p.add_argument("--num-layers", type=int, required=True)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--recompute-modules", nargs="*", default=None)
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep"], default=None)
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    p.add_argument("--moe-layer-freq", type=str, default=None)
    p.add_argument("--optimizer-cpu-offload", action="store_true")
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--use-precision-aware-optimizer", action="store_true")
    p.add_argument("--spec", nargs="*", default=None)
    p.add_argument("--lr-warmup-fraction", type=float, default=None)
    p.add_argument("--lr-warmup-iters", type=int, default=0)
    p.add_argument("--lr-warmup-samples", type=int, default=0)
    p.add_argument("--train-iters", type=int, default=None)
    p.add_argument("--train-samples", type=int, default=None)
    return p


def expand_layout(text: str) -> list[str]:
    """Stages of a ``--pipeline-model-parallel-layout`` string (Megatron's ``PipelineParallelLayerLayout``:
    ``(...)*n`` repeats a group, ``x*n`` one character, ``|`` ends a stage, commas are cosmetic)."""
    s = text.replace(",", "")
    if not re.fullmatch(r"[EtmL|()*0-9]+", s):
        raise ValueError(f"characters outside Megatron's layout grammar in {text!r}")
    while "(" in s:
        new = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
        if new == s:
            raise ValueError(f"unbalanced group in {text!r}")
        s = new
    s = re.sub(r"([EtmL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    if "*" in s:
        raise ValueError(f"a '*' without a repeat count in {text!r}")
    return s.split("|")


def check_and_dump(prog: str, argv: list[str], *, extra: dict | None = None) -> dict:
    """Parse ``argv`` (unknown flags are kept, not refused), check Megatron's cross-flag rules, write the dump.

    Exits 3 with a message on stderr when a check fails (argparse itself exits 2).
    """
    args, unknown = _parser(prog).parse_known_args(argv)

    def fail(msg: str) -> None:
        print(f"{prog}: {msg}", file=sys.stderr)
        sys.exit(3)

    pp = args.pipeline_model_parallel_size
    d: dict = {
        "tp": args.tensor_model_parallel_size,
        "pp": pp,
        "cp": args.context_parallel_size,
        "ep": args.expert_model_parallel_size,
        "etp": args.expert_tensor_parallel_size,
        "sequence_parallel": args.sequence_parallel,
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
        "seq_length": args.seq_length,
        "dynamic_batch": args.use_dynamic_batch_size,
        "max_tokens_per_gpu": args.max_tokens_per_gpu,
        "recompute": {
            "granularity": args.recompute_granularity,
            "method": args.recompute_method,
            "num_layers": args.recompute_num_layers,
            "modules": args.recompute_modules,
        },
        "dispatcher": args.moe_token_dispatcher_type,
        "flex_backend": args.moe_flex_dispatcher_backend,
        "optimizer_offload_fraction": args.optimizer_offload_fraction if args.optimizer_cpu_offload else 0.0,
        "distributed_optimizer": args.use_distributed_optimizer,
        "precision_aware_optimizer": args.use_precision_aware_optimizer,
        "pipeline_layout": args.pipeline_model_parallel_layout,
        "moe_layer_freq": args.moe_layer_freq,
        "spec": args.spec,
        "num_layers": args.num_layers,
        "unknown": unknown,
        "argv": argv,
    }
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        fail("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if args.recompute_granularity != "full" and (args.recompute_method or args.recompute_num_layers):
        fail("--recompute-method / --recompute-num-layers need --recompute-granularity full")
    if args.recompute_granularity == "selective" and not args.recompute_modules:
        fail("--recompute-granularity selective without --recompute-modules")
    if args.moe_token_dispatcher_type == "flex" and not args.moe_flex_dispatcher_backend:
        fail("--moe-token-dispatcher-type flex needs --moe-flex-dispatcher-backend")
    if args.optimizer_cpu_offload and not args.use_precision_aware_optimizer:
        fail("--optimizer-cpu-offload requires --use-precision-aware-optimizer")
    # megatron/training/arguments.py, validate_args
    if args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.lr_warmup_samples):
        fail("can only specify one of lr-warmup-fraction and lr-warmup-iters")
    if args.train_iters is not None and args.train_samples is not None:
        fail("expected iteration-based training")
    if args.use_dynamic_batch_size == (args.micro_batch_size is not None):
        fail("give either --micro-batch-size (Megatron-LM) or --use-dynamic-batch-size (slime)")
    if args.pipeline_model_parallel_layout is not None:
        try:
            stages = expand_layout(args.pipeline_model_parallel_layout)
        except ValueError as e:
            fail(str(e))
        if len(stages) % pp:
            fail(f"{len(stages)} stages do not divide over --pipeline-model-parallel-size {pp}")
        if sum(st.count("t") for st in stages) != args.num_layers:
            fail(f"the layout holds {sum(st.count('t') for st in stages)} layers, --num-layers is {args.num_layers}")
        if not (stages[0].startswith("E") and stages[-1].endswith("L")):
            fail("the embedding must open the first stage and the loss close the last")
        d["stages"] = len(stages)
        d["vpp"] = len(stages) // pp
        d["layers_per_rank"] = [sum(st.count("t") for st in stages[r::pp]) for r in range(pp)]
    elif pp > 1:
        fail("PP > 1 without --pipeline-model-parallel-layout (the exporters always write one)")
    for tok in unknown:
        if tok.startswith("-") and not tok.startswith("--"):
            fail(f"a short option {tok!r}: a word was split or mangled")
    d["env"] = {k: os.environ.get(k) for k in filter(None, os.environ.get("FAKE_ENTRY_ENV", "").split(","))}
    d.update(extra or {})
    dump = os.environ.get("FAKE_ENTRY_DUMP")
    if dump:
        with open(dump, "w") as fh:
            json.dump(d, fh, indent=1)
    return d
