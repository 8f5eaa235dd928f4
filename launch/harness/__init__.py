"""The megatron-core trial harness: one short training run of one layout, started by ``torchrun``.

No torch: :mod:`~launch.harness.spec` (input, command, refusals), :mod:`~launch.harness.results` (JSON lines, failure
kinds), :mod:`~launch.harness.pruner`. torch and megatron-core: :mod:`~launch.harness.train` (the program) with
:mod:`~launch.harness.build`, :mod:`~launch.harness.step` and :mod:`~launch.harness.measure`."""

from launch.harness.pruner import StepTimePruner
from launch.harness.results import HarnessResult, StepRecord, classify_failure, read_results
from launch.harness.spec import HarnessEnv, HarnessSpec, build_spec, slice_model, torchrun_command, unsupported_reasons

__all__ = ["HarnessEnv", "HarnessResult", "HarnessSpec", "StepRecord", "StepTimePruner", "build_spec",
           "classify_failure", "read_results", "slice_model", "torchrun_command", "unsupported_reasons"]
