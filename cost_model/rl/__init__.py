"""RL post-training plans: how to split GPUs between a trainer and generation engines, and what a step costs.

Layers: :mod:`~cost_model.rl.lengths` (response-length distributions), :mod:`~cost_model.rl.engine`
(per-iteration engine latency; aiconfigurator adapter), :mod:`~cost_model.rl.simulator` (continuous
batching), :mod:`~cost_model.rl.trainer` (trainer layouts via the project's estimate),
:mod:`~cost_model.rl.refit`, :mod:`~cost_model.rl.step`, :mod:`~cost_model.rl.plan` (enumerate and
rank), :mod:`~cost_model.rl.validate` (published runs) and :mod:`~cost_model.rl.calibrate` (a user's logs).
"""

from __future__ import annotations
