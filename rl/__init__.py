"""RL post-training plans: how to split GPUs between a trainer and generation engines, and what a step costs.

Layers: :mod:`~rl.lengths` (response-length distributions), :mod:`~rl.engine` (per-iteration engine latency;
aiconfigurator adapter), :mod:`~rl.simulator` (continuous batching), :mod:`~rl.trainer` (trainer layouts via the
project's estimate), :mod:`~rl.refit`, :mod:`~rl.step`, :mod:`~rl.plan` (enumerate and rank), :mod:`~rl.validate`
(published runs) and :mod:`~rl.calibrate` (a user's logs); above them :mod:`~rl.exporters` (a plan as a NeMo-RL recipe
or a slime launch, registered with :mod:`launch.exporters`) and :mod:`~rl.cli` (``tune rl``, which :mod:`tuner.cli`
mounts). The package sits between ``launch`` and ``tuner`` (``tests/test_package_order.py``).
"""

from __future__ import annotations
