"""The megatron-core trial harness: one short training run of one layout, started by ``torchrun``.

No torch: :mod:`~launch.harness.spec` (input, command, refusals), :mod:`~launch.harness.results` (JSON lines, failure
kinds), :mod:`~launch.harness.pruner`. torch and megatron-core: :mod:`~launch.harness.train` (the program) with
:mod:`~launch.harness.build`, :mod:`~launch.harness.step` and :mod:`~launch.harness.measure`."""
