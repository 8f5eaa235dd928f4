"""Test helper: a stand-in for slime's ``train_async.py`` (``python train_async.py ...``).

``run_slime.sh`` runs it when ``SLIME_ENTRY`` names this file. It takes the slime-specific arguments
apart, checks the Megatron ones (:func:`megatron_argv.check_and_dump`), and dumps what arrived.
"""

from __future__ import annotations

import sys

from megatron_argv import check_and_dump


def main(argv: list[str]) -> None:
    rest = argv
    slime: dict[str, str] = {}
    keep: list[str] = []
    it = iter(rest)
    for tok in it:  # slime's own flags with one value or none; the rest is Megatron's
        if tok in (
            "--actor-num-nodes", "--actor-num-gpus-per-node", "--hf-checkpoint", "--ref-load", "--prompt-data",
            "--tensorboard-dir", "--num-rollout", "--num-epoch", "--rollout-batch-size", "--loss-type",
            "--rollout-function-path", "--load", "--save", "--save-interval",
        ):
            if tok in slime:
                print(f"fake_slime_train: {tok} given twice", file=sys.stderr)
                sys.exit(3)
            slime[tok] = next(it)
        elif tok in ("--debug-train-only", "--rollout-shuffle"):
            slime[tok] = ""
        else:
            keep.append(tok)
    check_and_dump("fake_slime_train", keep, extra={"slime": slime})


if __name__ == "__main__":
    main(sys.argv[1:])
