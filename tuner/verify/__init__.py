"""``tune verify``: does a layout compute the same numbers as a reference layout? Three checks, each a plan
(refused before any GPU time) and a run: :mod:`~tuner.verify.loss_check` (loss curves, judged by
:mod:`~tuner.verify.convergence`), :mod:`~tuner.verify.parity_check` (every gradient, judged by
:mod:`~tuner.verify.parity`) and :mod:`~tuner.verify.component` (precision-aware Adam against FP64).
"""
