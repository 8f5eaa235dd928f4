"""The layouts of the one-GPU slice study: Qwen3-30B-A3B cut to 4 layers on one GPU, every layout measured.

The study's space is what varies on one GPU in the default space (``search_spaces/default_space.yaml``):
micro-batch size (1 and 2, and 4, where the model's memory is at the edge of an 80 GB card), activation
recompute (none, three selective module sets, full uniform and full block), CPU optimizer offload (0.5 and
1.0, with the precision-aware optimizer that offload needs) and the MoE dispatcher (alltoall, allgather).
``benchmarks/slice_study.py`` runs every layout once, then every layout again in the reverse order.

``est_s``: the planned wall time of one run (torchrun start, model build and the steps), what the driver
checks against its budget before a run starts.

    python benchmarks/slice_study_layouts.py     # print the cases as JSON lines
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["CASES", "GLOBAL_BATCH", "LAYERS", "MODEL", "SEQ_LEN", "STEPS", "WARMUP"]

MODEL = "Qwen3-30B-A3B"
LAYERS = 4
SEQ_LEN = 4096
GLOBAL_BATCH = 8
STEPS = 8
WARMUP = 4

_SEL = {
    "none": {},
    "sel-core_attn": {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
    "sel-ca-moe_act-ln": {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "moe_act", "layernorm"],
    },
    "sel-moe": {"recompute_granularity": "selective", "recompute_modules": ["moe"]},
}
_FULL = {
    f"full-{m}{n}": {"recompute_granularity": "full", "recompute_method": m, "recompute_num_layers": n}
    for m, n in (("uniform", 1), ("block", 1), ("block", 2))
}
_REC = {**_SEL, **_FULL}
_OFF = {"optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True}


def _case(id: str, est_s: float, **layout: Any) -> dict[str, Any]:
    return {"id": id, "est_s": est_s, "layout": {"world_size": 1, **layout}}


#: In the order of the first pass (the second runs them reversed). The first run of a fresh machine can be slow
#: (``../shared/notes/production_fidelity.md`` section 3), so the list starts with a layout predicted to be slow.
CASES: list[dict[str, Any]] = [
    _case("mbs1-full-uniform1", 40, micro_batch_size=1, **_REC["full-uniform1"]),
    *[
        _case(f"mbs2-{k}", 35, micro_batch_size=2, **_REC[k])
        for k in (
            "none", "sel-core_attn", "sel-ca-moe_act-ln", "sel-moe", "full-uniform1", "full-block1", "full-block2",
        )
    ],
    *[
        _case(f"mbs4-{k}", 35, micro_batch_size=4, **_REC[k])
        for k in ("none", "sel-ca-moe_act-ln", "full-uniform1", "full-block2")
    ],
    *[
        _case(f"mbs1-{k}", 40, micro_batch_size=1, **_REC[k])
        for k in ("none", "sel-core_attn", "sel-ca-moe_act-ln", "sel-moe", "full-block2")
    ],
    _case("mbs2-allgather", 35, micro_batch_size=2, dispatcher="allgather"),
    _case("mbs2-offload0.5", 70, micro_batch_size=2, **_OFF),
    _case("mbs2-offload1.0", 90, micro_batch_size=2, **{**_OFF, "optimizer_offload_fraction": 1.0}),
]


def main() -> int:
    for c in CASES:
        sys.stdout.write(json.dumps(c) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
