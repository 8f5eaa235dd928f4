"""Test helper: a stand-in for slime's ``train.py`` (and, as ``train_async.py``, its asynchronous twin).

``run_slime_rl.sh`` runs ``"$PYTHON" "$SLIME_DIR/train.py" ...`` with ``SLIME_DIR`` pointing here. It
parses the RL plan's flags as ``slime/utils/arguments.py`` (624b824a) declares them (types and
``store_true`` flags), keeps the rest (the user's model and data flags) as they came, and dumps what
arrived to ``$FAKE_ENTRY_DUMP``. Self-contained on purpose: the values must reach it through the
shell intact, not be re-derived.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="train.py", allow_abbrev=False)
    for flag in (
        "--actor-num-nodes", "--actor-num-gpus-per-node", "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--recompute-num-layers",
        "--rollout-batch-size", "--n-samples-per-prompt", "--global-batch-size", "--rollout-max-prompt-len",
        "--rollout-max-response-len", "--sglang-max-running-requests", "--sglang-ep-size", "--sglang-dp-size",
    ):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--sglang-mem-fraction-static", type=float, default=None)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    for flag in ("--colocate", "--sequence-parallel", "--sglang-enable-dp-attention", "--sglang-disable-cuda-graph"):
        p.add_argument(flag, action="store_true")
    args, rest = p.parse_known_args(argv)
    if args.colocate == (args.rollout_num_gpus is not None):
        print("train.py: give --colocate or --rollout-num-gpus, not both and not neither", file=sys.stderr)
        sys.exit(3)
    dump = {"entry": Path(sys.argv[0]).name, "args": vars(args), "rest": rest, "argv": argv}
    Path(os.environ["FAKE_ENTRY_DUMP"]).write_text(json.dumps(dump))


if __name__ == "__main__":
    main(sys.argv[1:])
