"""Response-length distributions of a rollout: from a mean and a maximum, or from a histogram file.

A rollout's generation time is set by its longest responses (the tail), not by the mean: every engine runs until its
last sequence ends. A distribution here is a sorted array of support points (tokens) with probabilities;
:meth:`LengthDistribution.draw` gives n lengths at the quantiles ``(i + 0.5) / n`` (stratified, deterministic), shuffled
with a fixed seed, so one prediction is repeatable and its tail is the distribution's.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import special

from specs.errors import TunerError
from specs.files import parse_errors, read_user_text

__all__ = ["DEFAULT_GAMMA_SHAPE", "LengthDistribution"]

#: Shape k of the gamma body of a response-length distribution given only its mean and maximum. k = 2 gives a
#: coefficient of variation of 1/sqrt(2) = 0.71 before truncation, the spread of GRPO math responses (DAPO, arXiv
#: 2503.14476, Fig. 7's response-length curves: mean ~0.5 of the cap with a long right tail reaching it). An assumption,
#: not a fit; give ``--response-lengths FILE`` with a histogram from a previous run to replace it.
DEFAULT_GAMMA_SHAPE = 2.0

#: Support points used to discretise a parametric distribution.
_GRID = 4096


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """A discrete distribution of response lengths (tokens).

    ``lengths`` (shape ``(m,)``, sorted, integers >= 1) and ``probs`` (shape ``(m,)``, summing to 1).
    """

    lengths: npt.NDArray[np.int64]
    probs: npt.NDArray[np.float64]
    source: str
    """Where it came from, for reports (``"gamma(k=2) with mean 3,072, max 6,144"`` or the file)."""

    @property
    def mean(self) -> float:
        """Expected length (tokens)."""
        return float(np.dot(self.lengths, self.probs))

    @property
    def max(self) -> int:
        """Longest length with non-zero probability (tokens)."""
        return int(self.lengths[self.probs > 0].max())

    def draw(self, n: int, *, seed: int = 0) -> npt.NDArray[np.int64]:
        """``n`` lengths at the quantiles ``(i + 0.5) / n``, shuffled with ``seed``.

        Returns: Shape ``(n,)`` int64 array of tokens."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        cdf = np.cumsum(self.probs)
        cdf[-1] = 1.0
        u = (np.arange(n) + 0.5) / n
        out = self.lengths[np.searchsorted(cdf, u, side="left").clip(0, len(self.lengths) - 1)]
        rng = np.random.default_rng(seed)
        return np.asarray(rng.permutation(out), dtype=np.int64)

    def capped(self, max_len: int) -> LengthDistribution:
        """The same distribution with every length above ``max_len`` cut to ``max_len``."""
        lengths = np.minimum(self.lengths, max_len)
        uniq, inv = np.unique(lengths, return_inverse=True)
        probs = np.bincount(inv, weights=self.probs, minlength=len(uniq))
        return LengthDistribution(uniq.astype(np.int64), probs / probs.sum(), f"{self.source}, capped at {max_len:,}")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_mean_max(
        cls, mean: float, max_len: int, *, shape: float = DEFAULT_GAMMA_SHAPE,
        names: tuple[str, str] = ("--mean-response-len", "--response-len")
    ) -> LengthDistribution:
        """A gamma(``shape``) body truncated at ``max_len`` (its mass above put on ``max_len``), scaled by bisection so
        that ``E[min(X, L)] = k theta P(k+1, L/theta) + L (1 - P(k, L/theta)) = mean`` (P the regularised lower
        incomplete gamma). ``names`` are the options the mean and maximum came from, for the errors.

        Raises TunerError: ``max_len < 1`` or ``mean`` not in ``(0, max_len)``."""
        mean_name, max_name = names
        if max_len < 1:
            raise TunerError(f"{max_name} {max_len}: must be at least 1")
        if not (0 < mean < max_len):
            raise TunerError(f"{mean_name} {mean:g}: must be above 0 and below {max_name} {max_len:,}")

        def truncated_mean(theta: float) -> float:
            x = max_len / theta
            return float(shape * theta * special.gammainc(shape + 1, x) + max_len * special.gammaincc(shape, x))

        lo, hi = 1e-6, 1e3 * max_len
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if truncated_mean(mid) < mean:
                lo = mid
            else:
                hi = mid
        theta = math.sqrt(lo * hi)
        u = (np.arange(_GRID) + 0.5) / _GRID
        x = np.minimum(np.ceil(special.gammaincinv(shape, u) * theta), max_len).clip(1, max_len).astype(np.int64)
        uniq, counts = np.unique(x, return_counts=True)
        return cls(uniq, counts / counts.sum(),
                   f"gamma(k={shape:g}) with mean {mean:,.0f}, max {max_len:,} (assumed shape)")

    @classmethod
    def from_file(cls, path: str | Path, *, max_len: int | None = None) -> LengthDistribution:
        """A histogram from a previous run: a CSV with a length column (``response_len``, ``length`` or ``tokens``) and
        an optional ``count``; a JSON list of lengths or ``{"lengths": [...], "counts": [...]}``; or one length per
        line. Lengths above ``max_len`` are cut to it.

        Raises TunerError: unreadable file, an unknown format, or a length that is not a positive integer."""
        p = Path(path)
        where = f"--response-lengths {str(p)!r}"
        text = read_user_text(p, where, "a table or list of response lengths")
        lengths: list[object] = []
        counts: list[object] = []
        stripped = text.lstrip()
        if stripped.startswith(("[", "{")):
            with parse_errors(where, "a JSON list of response lengths"):
                data = json.loads(text)
            if isinstance(data, dict):
                lengths = list(data.get("lengths", []))
                counts = list(data.get("counts", [1] * len(lengths)))
            elif isinstance(data, list):
                lengths, counts = list(data), [1] * len(data)
        elif stripped and "," in stripped.splitlines()[0]:
            with parse_errors(where, "a CSV table of response lengths"):
                rows = list(csv.DictReader(stripped.splitlines()))
            header = [h.strip().lower() for h in (rows[0].keys() if rows else [])]
            lcol = next((h for h in ("response_len", "length", "tokens", "response_length") if h in header), None)
            if lcol is None:
                raise TunerError(f"{where}: the CSV header needs a length column (response_len, length or tokens); "
                                 f"found {', '.join(header)}")
            for r in rows:
                rr = {k.strip().lower(): (v or "").strip() for k, v in r.items()}
                lengths.append(rr[lcol])
                counts.append(rr.get("count") or 1)
        else:
            lengths = [line.strip() for line in text.splitlines() if line.strip()]
            counts = [1] * len(lengths)
        if not lengths or len(lengths) != len(counts):
            raise TunerError(f"{where}: no lengths found (a CSV response_len,count, a JSON list, or one length per "
                             "line)")
        try:
            arr = np.asarray(lengths, dtype=float)
            cnt = np.asarray(counts, dtype=float)
        except (TypeError, ValueError):
            bad = next((f"entry {i + 1} ({n!r}, count {c!r}): " for i, (n, c) in enumerate(zip(lengths, counts))
                        if not (_number(n) and _number(c))), "")
            raise TunerError(f"{where}: {bad}lengths and counts must be numbers") from None
        if arr.ndim != 1 or cnt.ndim != 1 or not (np.all(np.isfinite(arr)) and np.all(np.isfinite(cnt))):
            raise TunerError(f"{where}: lengths and counts must be finite numbers (nan, inf or a nested list found)")
        if np.any(arr < 1) or np.any(arr != np.round(arr)) or np.any(cnt < 0) or cnt.sum() <= 0:
            raise TunerError(f"{where}: lengths must be positive integers and counts non-negative")
        uniq, inv = np.unique(arr.astype(np.int64), return_inverse=True)
        w = np.bincount(inv, weights=cnt, minlength=len(uniq))
        dist = cls(uniq.astype(np.int64), w / w.sum(), f"histogram {p.name} ({int(cnt.sum()):,} responses)")
        return dist.capped(max_len) if max_len is not None else dist


def _number(v: object) -> bool:
    try:
        float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True
