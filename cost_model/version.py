"""Which cost model made a prediction: a digest of the formulas' source, recorded in a study.

A study's predictions are comparable only when the same formulas made them; the calibration constants are recorded
beside it (:mod:`tuner.study.storage`), and this digest covers what the constants do not: the terms and how the
estimate composes them."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent

#: The source files whose code turns a layout into a prediction (paths relative to the package).
FORMULA_FILES = ("estimate.py", "step_detail.py", "pipeline_schedule.py", "flops.py", "calibration.py", "terms")


#: Digests of earlier formula sources whose estimates are these ones to the bit (``PYTHONPATH=. python
#: benchmarks/estimate_digest.py --check tests/fixtures/estimate_digest.json`` passes on both): their edits changed
#: the code's text, not a number, so a study they made resumes (:func:`same_formulas`). Add the old digest here only
#: after that check.
SAME_ESTIMATES = frozenset({"b19376d0ddde2d4f"})


def same_formulas(digest: str) -> bool:
    """Whether a study recorded with formula digest ``digest`` was predicted by these formulas' estimates."""
    return digest == formula_digest() or digest in SAME_ESTIMATES


@functools.lru_cache(maxsize=1)
def formula_digest() -> str:
    """The first 16 hex digits of the SHA-256 of :data:`FORMULA_FILES` (each ``*.py`` in name order, its relative
    path and bytes). Comments count: any edit of these files changes it.

    Raises OSError: a formula file cannot be read (a broken install)."""
    h = hashlib.sha256()
    files: list[Path] = []
    for name in FORMULA_FILES:
        p = _HERE / name
        files += sorted(p.glob("*.py")) if p.is_dir() else [p]
    for f in files:
        h.update(f.relative_to(_HERE).as_posix().encode())
        h.update(b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]
