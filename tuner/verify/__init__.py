"""``tune verify``: does a layout compute the same numbers as a reference layout?

Three checks, each a plan (no GPU work, refused before any GPU time) and a run:

- :mod:`tuner.verify.loss_check`: both layouts train a few steps from one checkpoint; their loss curves are
  compared by :mod:`tuner.verify.convergence` (Megatron-Bridge's metrics);
- :mod:`tuner.verify.parity_check`: one forward and backward in each layout; every parameter's gradient is
  compared by :mod:`tuner.verify.parity`;
- :mod:`tuner.verify.component`: precision-aware Adam against an FP64 reference (one GPU).

:mod:`tuner.verify.inputs` reads the layouts and checkpoints they start from; :mod:`tuner.verify.correctness`
builds the recipe's ``correctness`` block from their results. Pure Python and NumPy: the GPU programs
(:mod:`launch.harness`) only produce the numbers.
"""
