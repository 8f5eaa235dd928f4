"""What-if, not the shipped model: the SFT / LoRA rows' core attention scaled by F (packed short sub-sequences).

Runs ``benchmarks/bench_validation.py --processes 1 --hold-out Llama-3.1-70B`` with
``cost_model.terms.compute.core_attention_time`` multiplied by ``F`` on rows whose task is ``sft`` or ``lora``; the
fit's rows (other models, pre-training) are untouched. From the repository root:

    F=0.1 PYTHONPATH=. python benchmarks/results/2026-12-07_fine_tuning_terms/packed_attention_whatif.py
"""

import os
import runpy
import sys

from cost_model.terms import compute

F = float(os.environ["F"])
_orig = compute.core_attention_time


def _scaled(c):  # type: ignore[no-untyped-def]
    t = _orig(c)
    return t * F if c.workload.task in ("sft", "lora") else t


compute.core_attention_time = _scaled
sys.argv = ["bench_validation.py", "--processes", "1", "--hold-out", "Llama-3.1-70B"]
runpy.run_path("benchmarks/bench_validation.py", run_name="__main__")
