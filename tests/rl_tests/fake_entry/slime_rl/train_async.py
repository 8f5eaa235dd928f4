"""Test helper: a stand-in for slime's ``train_async.py``: :func:`train.main` (the dump records which entry ran)."""

from __future__ import annotations

import sys

from train import main

if __name__ == "__main__":
    main(sys.argv[1:])
