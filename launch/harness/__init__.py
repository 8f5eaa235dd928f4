"""The megatron-core trial harness: one short training run of one layout, started by ``torchrun``.

Modules:

- :mod:`launch.harness.spec` (no torch): the harness's input (:class:`HarnessSpec`),
  building it and the ``torchrun`` command from a :class:`ModelSpec` and a
  :class:`Layout`, and what this environment cannot run (:func:`unsupported_reasons`);
- :mod:`launch.harness.results` (no torch): reading the harness's JSON lines and
  classifying a failed run (out of memory, timeout, NCCL error, crash);
- :mod:`launch.harness.pruner` (no torch): the step-time pruner;
- :mod:`launch.harness.train` (torch, megatron-core): the program itself,
  ``torchrun --nproc-per-node N -m launch.harness.train --spec spec.json --out steps.jsonl``.
  Its pieces (torch and megatron-core at call time): :mod:`launch.harness.build` (the model, optimizer and
  checkpoints), :mod:`launch.harness.step` (micro-batches and loss), :mod:`launch.harness.measure` (memory,
  profiles, census, gradient dumps).
"""

from launch.harness.pruner import StepTimePruner
from launch.harness.results import HarnessResult, StepRecord, classify_failure, read_results
from launch.harness.spec import HarnessEnv, HarnessSpec, build_spec, slice_model, torchrun_command, unsupported_reasons

__all__ = [
    "HarnessEnv",
    "HarnessResult",
    "HarnessSpec",
    "StepRecord",
    "StepTimePruner",
    "build_spec",
    "classify_failure",
    "read_results",
    "slice_model",
    "torchrun_command",
    "unsupported_reasons",
]
