"""Test helper: a stand-in for slime's entry module (``python -m fake_slime_train --async ...``).

``run_slime.sh`` runs it when ``SLIME_ENTRY_MODULE=fake_slime_train`` and this folder is on the path
(``SLIME_DIR``). It checks the slime-specific arguments, then the Megatron ones
(:func:`megatron_argv.check_and_dump`), and dumps what arrived.
"""

from __future__ import annotations

import sys

from megatron_argv import check_and_dump


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "--async":
        print(f"fake_slime_train: expected --async first, got {argv[:1]}", file=sys.stderr)
        sys.exit(3)
    rest = argv[1:]
    slime: dict[str, str] = {}
    keep: list[str] = []
    it = iter(rest)
    for tok in it:  # slime's own flags with one value; the rest is Megatron's
        if tok in ("--actor-num-nodes", "--actor-num-gpus-per-node", "--hf-checkpoint", "--ref-load", "--prompt-data",
                   "--tensorboard-dir", "--num-rollout", "--rollout-batch-size", "--loss-type", "--rollout-function-path"):
            slime[tok] = next(it)
        else:
            keep.append(tok)
    check_and_dump("fake_slime_train", keep, extra={"slime": slime})


if __name__ == "__main__":
    main(sys.argv[1:])
