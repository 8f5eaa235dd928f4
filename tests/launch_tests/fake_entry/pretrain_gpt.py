"""Test helper: a stand-in for Megatron-LM's ``pretrain_gpt.py`` (``python pretrain_gpt.py "${MEGATRON_ARGS[@]}"``)."""

from __future__ import annotations

import sys

from megatron_argv import check_and_dump

if __name__ == "__main__":
    check_and_dump("pretrain_gpt.py", sys.argv[1:])
