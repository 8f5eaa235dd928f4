"""Gradient parity's metrics (NumPy; :mod:`launch.harness.train` with ``dump_grads`` produces the numbers).

Every parameter's full fp32 gradient (:mod:`launch.harness.gather`) of the candidate and the reference, from one
checkpoint and one global batch, is compared by relative L2 error ``||c - r|| / ||r||`` (catches a scaled gradient,
the seed's bug class) and cosine ``<c, r> / (||c|| ||r||)`` (a wrong direction), in float64 over chunks. The
threshold (:meth:`ParityThresholds.from_noise`) is ``max(NOISE_FACTOR x the worst noise between two reference runs,
BF16_RELATIVE_FLOOR)`` (two runs of one layout may repeat bit for bit while two layouts round differently in bf16),
the cosine's ``1 - t**2 / 2`` (two vectors of equal length differing by ``t``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launch.harness.gather import GRAD_DUMP_FORMAT
from specs.errors import TunerError

#: torch.testing.assert_close's default relative tolerance for torch.bfloat16 (``rtol=1.6e-2``,
#: torch/testing/_comparison.py ``_DTYPE_PRECISIONS``): the floor of the parity threshold.
BF16_RELATIVE_FLOOR = 1.6e-2
#: The parity threshold is this many times the worst relative error between two runs of the reference
#: (an order of magnitude above the measured noise; a choice, stated with every result).
NOISE_FACTOR = 10.0
_CHUNK = 1 << 22


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorDiff:
    """One tensor of the candidate against the same tensor of the reference (norms in the tensor's units)."""

    name: str
    shape_candidate: tuple[int, ...]
    shape_reference: tuple[int, ...]
    numel: int
    norm_candidate: float
    norm_reference: float
    diff_norm: float
    """``||c - r||`` (float64 accumulation)."""
    rel_l2: float
    """``||c - r|| / ||r||``; 0 when both are zero, inf when only ``r`` is, NaN when a value is not finite."""
    cosine: float
    """``<c, r> / (||c|| ||r||)``; 1 when both are zero, 0 when one is, NaN when a value is not finite."""
    max_abs_diff: float
    nonfinite_candidate: int = 0
    nonfinite_reference: int = 0

    @property
    def shape_ok(self) -> bool:
        return self.shape_candidate == self.shape_reference

    @property
    def finite(self) -> bool:
        return self.nonfinite_candidate == 0 and self.nonfinite_reference == 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorDiff:
        return cls(**{**d, "shape_candidate": tuple(d["shape_candidate"]),
                      "shape_reference": tuple(d["shape_reference"])})


def tensor_diff(name: str, candidate: Any, reference: Any, *, chunk: int = _CHUNK) -> TensorDiff:
    """Compare one tensor (any float dtype, any shape; flattened; sums in float64 over ``chunk`` elements).

    A shape mismatch is reported (``shape_ok`` False, metrics NaN), not raised: after gathering it
    is a finding about the layout (a wrong shard count, a padded vocabulary).
    """
    c, r = np.asarray(candidate), np.asarray(reference)
    nan = float("nan")
    head: dict[str, Any] = {"name": name, "shape_candidate": tuple(c.shape), "shape_reference": tuple(r.shape),
                            "numel": int(r.size)}
    unknown: dict[str, Any] = dict.fromkeys(("norm_candidate", "norm_reference", "diff_norm", "rel_l2", "cosine",
                                             "max_abs_diff"), nan)
    if c.shape != r.shape:
        return TensorDiff(**head, **unknown)
    cf, rf = c.reshape(-1), r.reshape(-1)
    cc = rr = cr = dd = mx = 0.0
    bad_c = bad_r = 0
    for i in range(0, cf.size, chunk):
        a = np.asarray(cf[i:i + chunk], dtype=np.float64)
        b = np.asarray(rf[i:i + chunk], dtype=np.float64)
        bad_c += int(a.size - np.count_nonzero(np.isfinite(a)))
        bad_r += int(b.size - np.count_nonzero(np.isfinite(b)))
        if bad_c or bad_r:
            continue
        d = a - b
        cc, rr, cr, dd = cc + float(a @ a), rr + float(b @ b), cr + float(a @ b), dd + float(d @ d)
        mx = max(mx, float(np.max(np.abs(d), initial=0.0)))
    if bad_c or bad_r:
        return TensorDiff(**head, **unknown, nonfinite_candidate=bad_c, nonfinite_reference=bad_r)
    nc, nr, nd = math.sqrt(cc), math.sqrt(rr), math.sqrt(dd)
    rel = (0.0 if nd == 0 else math.inf) if nr == 0 else nd / nr
    if nc == 0 and nr == 0:
        cos = 1.0
    elif nc == 0 or nr == 0:
        cos = 0.0
    else:
        cos = max(-1.0, min(1.0, cr / (nc * nr)))
    return TensorDiff(**head, norm_candidate=nc, norm_reference=nr, diff_norm=nd, rel_l2=rel, cosine=cos,
                      max_abs_diff=mx)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParityThresholds:
    """What a tensor may differ by between two layouts (see the module docstring for the rule)."""

    rel_l2: float = BF16_RELATIVE_FLOOR
    cosine: float = 1.0 - BF16_RELATIVE_FLOOR**2 / 2
    """The largest relative L2 error and the smallest cosine a tensor may have."""
    noise_rel_l2: float | None = None
    noise_cosine: float | None = None
    """The same between two runs of the reference (None: not measured)."""
    factor: float = NOISE_FACTOR
    floor: float = BF16_RELATIVE_FLOOR
    source: str = "floor only (the noise between two runs of the reference was not measured)"

    @classmethod
    def from_noise(cls, noise: ParityResult | float, *, factor: float = NOISE_FACTOR,
                   floor: float = BF16_RELATIVE_FLOOR) -> ParityThresholds:
        """Thresholds ``max(factor x noise, floor)`` from ``noise``: the reference's second run against its first
        (:func:`compare_gradients`) or its worst relative L2 error. Raises TunerError: the noise comparison itself is
        broken (missing tensors, other shapes, NaN)."""
        worst, worst_cos = (noise.worst_rel_l2, noise.worst_cosine) if isinstance(noise, ParityResult) else (
            float(noise), None)
        if isinstance(noise, ParityResult):
            broken = [m for m in noise.failed_metrics
                      if m in ("missing_tensor", "shape_mismatch", "non_finite", "no_tensors")]
            if broken:
                raise TunerError(f"the noise measurement (two runs of the reference) failed {', '.join(broken)}: "
                                 f"{'; '.join(noise.messages[:2])}; a threshold cannot be set from it")
        if not (math.isfinite(worst) and worst >= 0):
            raise TunerError(f"the reference's noise must be a finite relative error >= 0, got {worst!r}")
        t = max(factor * worst, floor)
        src = (f"max({factor:g} x the worst relative L2 error between two runs of the reference ({worst:.3g}), "
               f"bf16 floor {floor:g}) = {t:.3g}")
        return cls(rel_l2=t, cosine=1.0 - t * t / 2, noise_rel_l2=worst, noise_cosine=worst_cos, factor=factor,
                   floor=floor, source=src)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParityResult:
    """The outcome of a gradient comparison; ``failed_metrics`` names every check that failed."""

    passed: bool
    failed_metrics: tuple[str, ...]
    tensors: tuple[TensorDiff, ...]
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    """Tensors of the candidate that the reference lacks (``missing``: the other way round)."""
    thresholds: ParityThresholds = field(default_factory=ParityThresholds)
    candidate: str = "candidate"
    reference: str = "reference"
    messages: tuple[str, ...] = ()

    @property
    def result(self) -> str:
        return "pass" if self.passed else "fail"

    @property
    def compared(self) -> tuple[TensorDiff, ...]:
        """Tensors with the same shape and finite values on both sides."""
        return tuple(t for t in self.tensors if t.shape_ok and t.finite)

    @property
    def worst_rel_l2(self) -> float:
        return max((t.rel_l2 for t in self.compared), default=float("nan"))

    @property
    def worst_cosine(self) -> float:
        return min((t.cosine for t in self.compared), default=float("nan"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParityResult:
        """Inverse of :meth:`to_dict` (with ``per_tensor``); the thresholds come back as recorded. Raises TunerError: a
        dict without the per-tensor rows."""
        if "per_tensor" not in d:
            raise TunerError("a parity result needs its per-tensor rows to be read back")
        th = d.get("thresholds")
        return cls(passed=bool(d["passed"]), failed_metrics=tuple(d["failed_metrics"]),
                   tensors=tuple(TensorDiff.from_dict(t) for t in d["per_tensor"]), missing=tuple(d["missing"]),
                   extra=tuple(d["extra"]), thresholds=ParityThresholds(**th) if th else ParityThresholds(),
                   candidate=d["candidate"], reference=d["reference"], messages=tuple(d["messages"]))

    def worst_tensors(self, k: int = 5) -> list[TensorDiff]:
        """The ``k`` tensors with the largest relative error (not-finite and mismatched ones first)."""
        return sorted(self.tensors, key=lambda t: (1, -t.rel_l2) if t.shape_ok and t.finite else (0, 0.0))[:k]

    def summary(self) -> str:
        n = len(self.compared)
        head = (f"{self.candidate} vs {self.reference}: {len(self.tensors)} tensors, worst relative L2 "
                f"{self.worst_rel_l2:.3g} (threshold {self.thresholds.rel_l2:.3g}), smallest cosine "
                f"{self.worst_cosine:.7f} (threshold {self.thresholds.cosine:.7f})")
        if self.passed:
            return f"passed: {head} over {n} compared tensors"
        return f"failed {', '.join(self.failed_metrics)}: {head}; " + "; ".join(self.messages)

    def to_dict(self, *, all_tensors: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "result": self.result, "passed": self.passed, "failed_metrics": list(self.failed_metrics),
            "summary": self.summary(),
            "candidate": self.candidate, "reference": self.reference, "tensors_compared": len(self.compared),
            "tensors": len(self.tensors),
            "worst_rel_l2": _sig(self.worst_rel_l2, 17), "worst_cosine": _sig(self.worst_cosine, 17),
            "worst": [asdict(t) for t in self.worst_tensors(5)], "missing": list(self.missing),
            "extra": list(self.extra), "thresholds": asdict(self.thresholds), "messages": list(self.messages),
        }
        if all_tensors:
            d["per_tensor"] = [asdict(t) for t in self.tensors]
        return d


def compare_gradients(candidate: Mapping[str, Any], reference: Mapping[str, Any],
                      thresholds: ParityThresholds | None = None, *, candidate_label: str = "candidate",
                      reference_label: str = "reference") -> ParityResult:
    """Compare every gradient of ``candidate`` with the same-named one of ``reference`` (``{name: array}``, arrays
    may be memory-mapped); ``thresholds`` default to the bf16 floor. ``failed_metrics`` among ``no_tensors``,
    ``missing_tensor``, ``shape_mismatch``, ``non_finite``, ``relative_l2``, ``cosine``."""
    th = thresholds or ParityThresholds()
    names_c, names_r = set(candidate), set(reference)
    missing = tuple(sorted(names_r - names_c))
    extra = tuple(sorted(names_c - names_r))
    diffs = tuple(tensor_diff(n, candidate[n], reference[n]) for n in sorted(names_c & names_r))
    failed: list[str] = []
    msgs: list[str] = []
    if not diffs:
        failed.append("no_tensors")
        msgs.append("no tensor in common")
    if missing or extra:
        failed.append("missing_tensor")
        if missing:
            msgs.append(f"{len(missing)} tensors of the reference missing in the candidate, e.g. "
                        f"{', '.join(missing[:3])}")
        if extra:
            msgs.append(f"{len(extra)} tensors of the candidate missing in the reference, e.g. {', '.join(extra[:3])}")
    bad_shape = [t for t in diffs if not t.shape_ok]
    if bad_shape:
        failed.append("shape_mismatch")
        t = bad_shape[0]
        msgs.append(f"{len(bad_shape)} tensors differ in shape after gathering, e.g. {t.name}: "
                    f"{list(t.shape_candidate)} vs {list(t.shape_reference)}")
    nonfinite = [t for t in diffs if t.shape_ok and not t.finite]
    if nonfinite:
        failed.append("non_finite")
        t = nonfinite[0]
        msgs.append(f"{len(nonfinite)} tensors hold NaN or Inf, e.g. {t.name} ({t.nonfinite_candidate} in the "
                    f"candidate, {t.nonfinite_reference} in the reference)")
    ok = [t for t in diffs if t.shape_ok and t.finite]
    over = sorted((t for t in ok if not t.rel_l2 <= th.rel_l2),
                  key=lambda t: -t.rel_l2 if math.isfinite(t.rel_l2) else -math.inf)
    if over:
        failed.append("relative_l2")
        msgs.append(f"{len(over)} tensors above relative L2 {th.rel_l2:.3g}; worst {over[0].name}: "
                    f"{over[0].rel_l2:.4g} (norms {over[0].norm_candidate:.4g} vs {over[0].norm_reference:.4g}, cosine "
                    f"{over[0].cosine:.6f})")
    low = sorted((t for t in ok if not t.cosine >= th.cosine), key=lambda t: t.cosine)
    if low:
        failed.append("cosine")
        msgs.append(f"{len(low)} tensors below cosine {th.cosine:.6f}; worst {low[0].name}: {low[0].cosine:.6f}")
    return ParityResult(passed=not failed, failed_metrics=tuple(failed), tensors=diffs, missing=missing, extra=extra,
                        thresholds=th, candidate=candidate_label, reference=reference_label, messages=tuple(msgs))


@dataclass(frozen=True, slots=True)
class GradDump:
    """A gradient dump (the harness writes it, :mod:`launch.harness.grads`): ``index.json`` (what ran) and one
    ``.npy`` file per parameter."""

    path: Path
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.meta.get("layout_label") or self.path.name)

    def tensor(self, name: str) -> np.ndarray:
        """The gradient of ``name`` (float32, memory-mapped). Raises TunerError: the file is missing or not the recorded
        shape."""
        t = self.meta["tensors"][name]
        try:
            a: np.ndarray = np.load(self.path / t["file"], mmap_mode="r")
        except (OSError, ValueError) as e:
            raise TunerError(f"gradient dump {self.path}: cannot read {t['file']} for {name} ({e})") from None
        if list(a.shape) != list(t["shape"]):
            raise TunerError(f"gradient dump {self.path}: {t['file']} has shape {list(a.shape)}, the index says "
                             f"{t['shape']}")
        return a


def load_grad_dump(path: str | Path) -> GradDump:
    """Read a gradient dump's index. Raises TunerError: not a folder with an ``index.json`` of format
    :data:`GRAD_DUMP_FORMAT`."""
    p = Path(path)
    idx = p / "index.json"
    try:
        meta = json.loads(idx.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TunerError(f"{str(p)!r} is not a gradient dump (no readable index.json: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != GRAD_DUMP_FORMAT or not isinstance(meta.get("tensors"),
                                                                                              dict):
        raise TunerError(f"{idx}: not a gradient dump of format {GRAD_DUMP_FORMAT}")
    return GradDump(p, meta)


def compare_grad_dumps(candidate: str | Path | GradDump, reference: str | Path | GradDump,
                       thresholds: ParityThresholds | None = None) -> ParityResult:
    """:func:`compare_gradients` on two dumps, after checking they are comparable. Raises TunerError: a dump that cannot
    be read, or two dumps of another model (fingerprint), another starting checkpoint or another batch (data offset,
    global batch, sequence length, corpus)."""
    c = candidate if isinstance(candidate, GradDump) else load_grad_dump(candidate)
    r = reference if isinstance(reference, GradDump) else load_grad_dump(reference)
    for what, key in (("model", "model_fingerprint"), ("checkpoint", "checkpoint"), ("batch", "batch")):
        if c.meta.get(key) != r.meta.get(key):
            raise TunerError(f"the gradient dumps {c.path} and {r.path} are not of the same {what} "
                             f"({c.meta.get(key)!r} vs {r.meta.get(key)!r}): gradient parity compares two layouts "
                             "of one model from one checkpoint on one global batch")
    return compare_gradients(_Lazy(c), _Lazy(r), thresholds, candidate_label=c.label, reference_label=r.label)


class _Lazy(Mapping[str, np.ndarray]):
    """A dump's tensors, each memory-mapped only while compared (a model's thousands at once would run out of file
    descriptors)."""

    def __init__(self, dump: GradDump) -> None:
        self.dump = dump

    def __getitem__(self, k: str) -> np.ndarray:
        return self.dump.tensor(k)

    def __iter__(self) -> Iterator[str]:
        return iter(self.dump.meta["tensors"])

    def __len__(self) -> int:
        return len(self.dump.meta["tensors"])


def parity_block(result: ParityResult, *, date: str = "", gpu: str = "",
                 seconds: float | None = None) -> dict[str, Any]:
    """The recipe's ``correctness.grad_parity`` entry (seed style: short fields, the worst tensors by name and
    layout)."""
    worst = [{"tensor": t.name, "rel_l2": _sig(t.rel_l2), "cosine": _sig(t.cosine, 9)} for t in result.worst_tensors(3)]
    d: dict[str, Any] = {"result": result.result, "candidate": result.candidate, "reference": result.reference,
                         "tensors": len(result.tensors), "worst_rel_l2": _sig(result.worst_rel_l2),
                         "worst_cosine": _sig(result.worst_cosine, 9),
                         "threshold_rel_l2": _sig(result.thresholds.rel_l2),
                         "threshold_cosine": _sig(result.thresholds.cosine, 9),
                         "threshold_source": result.thresholds.source, "worst_tensors": worst}
    if result.failed_metrics:
        d["failed_metrics"] = list(result.failed_metrics)
    if gpu:
        d["gpu"] = gpu
    if date:
        d["date"] = date
    if seconds is not None:
        d["seconds"] = round(float(seconds), 1)
    d["note"] = ("one forward and backward of one global batch from one checkpoint in each layout; every parameter's "
                 "full fp32 gradient compared by relative L2 error and cosine")
    return d


def _sig(x: float, n: int = 3) -> float | None:
    """``x`` to ``n`` significant digits (17: exact); None when it is not finite."""
    return float(f"{x:.{n}g}") if math.isfinite(x) else None
