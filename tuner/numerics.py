"""The numerical checks of ``tune verify`` beyond the loss curve: gradient parity and the optimizer component test.

Pure Python and NumPy (no torch): CI tests every decision here on recorded numbers; the GPU
programs (:mod:`launch.harness.train` with ``dump_grads``, :mod:`launch.harness.component`) only
produce the numbers.

**Gradient parity** (:func:`compare_gradients`, :func:`compare_grad_dumps`). From one checkpoint and
one global batch, one forward and backward in the candidate and in the reference layout; every
parameter's full gradient (gathered over its TP / EP / PP / DP shards, fp32, named by its
layout-independent name, :mod:`launch.harness.gather`) is compared by

- relative L2 error ``||c - r|| / ||r||`` (``c`` candidate, ``r`` reference; 0 when both are zero,
  infinite when only ``r`` is) and
- cosine ``<c, r> / (||c|| ||r||)`` (1 when both are zero),

accumulated in float64 over chunks. A scaled gradient (``c = 2 r``) has cosine 1 and relative error
1: the relative error is the metric that catches the seed's bug class; the cosine catches a wrong
direction of similar size. The check fails on: a tensor missing on either side (``missing_tensor``),
a shape that differs after gathering (``shape_mismatch``), a NaN or Inf (``non_finite``), a relative
error above the threshold (``relative_l2``), a cosine below its threshold (``cosine``).

The **threshold** comes from the noise between two runs of the reference layout itself
(:meth:`ParityThresholds.from_noise`): ``max(NOISE_FACTOR x worst noise, BF16_RELATIVE_FLOOR)``.
The floor is there because two runs of one layout can repeat bit for bit (deterministic kernels),
while two layouts legitimately round differently in bf16 (another micro-batch size changes the
GEMM shapes and the order in which micro-batch gradients are added); it is
``torch.testing.assert_close``'s default relative tolerance for bfloat16 (1.6e-2), read here as a
tensor-wide L2 ratio. The cosine threshold is ``1 - t**2 / 2``: the cosine between two vectors of
equal length whose difference is ``t`` of that length.

**Optimizer component test** (:func:`decide_component_test`). Precision-aware Adam as megatron-core
runs it with Transformer Engine, fed the same gradients as an FP64 reference Adam
(:func:`adam_reference`); the worst tensor's relative L2 error of the update (the master weights'
displacement from the initial weights after 1 and after 3 steps) must be within the seed's bound,
``2 x the default GPU optimizer's error + 1e-3`` (``../shared/seeds/001_*``, its
``correctness.component_tests``), the FP32 masters that TE rebuilds from bf16 weights and 16-bit
remainders (:func:`reconstruct_fp32`) must be bitwise identical to an arm with explicit FP32
masters, and every negative control must fail.

:func:`correctness_block` builds the recipe's ``correctness`` block (component tests, gradient
parity, convergence) in the seed's form; its ``result`` is ``pass`` only when both the convergence
check and gradient parity pass (what ``launch.export`` needs for ``status: verified``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launch.harness.component import COMPONENT_ARMS, SEED_HYPER, AdamHyper, ComponentArm, clip_coefficient
from launch.harness.gather import GRAD_DUMP_FORMAT, model_fingerprint
from specs.errors import TunerError

__all__ = [
    "BF16_RELATIVE_FLOOR",
    "COMPONENT_ARMS",
    "COMPONENT_BOUND_ABS",
    "COMPONENT_BOUND_FACTOR",
    "GRAD_DUMP_FORMAT",
    "NOISE_FACTOR",
    "SEED_HYPER",
    "AdamHyper",
    "ComponentArm",
    "ComponentResult",
    "GradDump",
    "ParityResult",
    "ParityThresholds",
    "TensorDiff",
    "adam_reference",
    "clip_coefficient",
    "compare_grad_dumps",
    "compare_gradients",
    "component_bound",
    "correctness_block",
    "decide_component_test",
    "load_grad_dump",
    "model_fingerprint",
    "parity_block",
    "reconstruct_fp32",
    "split_fp32",
    "tensor_diff",
]

#: torch.testing.assert_close's default relative tolerance for torch.bfloat16 (``rtol=1.6e-2``,
#: torch/testing/_comparison.py ``_DTYPE_PRECISIONS``): the floor of the parity threshold.
BF16_RELATIVE_FLOOR = 1.6e-2
#: The parity threshold is this many times the worst relative error between two runs of the reference
#: (an order of magnitude above the measured noise; a choice, stated with every result).
NOISE_FACTOR = 10.0
#: The seed's bound of the component test: ``COMPONENT_BOUND_FACTOR x default error + COMPONENT_BOUND_ABS``
#: (``../shared/seeds/001_*``: "bound 2 x the default GPU optimizer's error + 1e-3").
COMPONENT_BOUND_FACTOR = 2.0
COMPONENT_BOUND_ABS = 1e-3
_CHUNK = 1 << 22


# --------------------------------------------------------------------------------------------------
# tensor comparison


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "shape_candidate": list(self.shape_candidate), "shape_reference": list(self.shape_reference),
            "numel": self.numel, "norm_candidate": self.norm_candidate, "norm_reference": self.norm_reference,
            "diff_norm": self.diff_norm, "rel_l2": self.rel_l2, "cosine": self.cosine, "max_abs_diff": self.max_abs_diff,
            "nonfinite_candidate": self.nonfinite_candidate, "nonfinite_reference": self.nonfinite_reference,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorDiff:
        return cls(**{**d, "shape_candidate": tuple(d["shape_candidate"]), "shape_reference": tuple(d["shape_reference"])})


def _as_array(x: Any, what: str) -> np.ndarray:
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything that is not array-like
        raise TunerError(f"{what} is not an array ({type(x).__name__}: {e})") from None
    if a.dtype.kind not in "fiu":
        raise TunerError(f"{what} has dtype {a.dtype}; a gradient is a float array")
    return a


def tensor_diff(name: str, candidate: Any, reference: Any, *, chunk: int = _CHUNK) -> TensorDiff:
    """Compare one tensor (any float dtype, any shape; flattened; sums in float64 over ``chunk`` elements).

    A shape mismatch is reported (``shape_ok`` False, metrics NaN), not raised: after gathering it
    is a finding about the layout (a wrong shard count, a padded vocabulary).

    Raises:
        TunerError: an input that is not a numeric array.
    """
    c = _as_array(candidate, f"candidate gradient {name!r}")
    r = _as_array(reference, f"reference gradient {name!r}")
    nan = float("nan")
    if c.shape != r.shape:
        return TensorDiff(name=name, shape_candidate=tuple(c.shape), shape_reference=tuple(r.shape), numel=int(r.size),
                          norm_candidate=nan, norm_reference=nan, diff_norm=nan, rel_l2=nan, cosine=nan, max_abs_diff=nan)
    cf, rf = c.reshape(-1), r.reshape(-1)
    cc = rr = cr = dd = 0.0
    mx = 0.0
    bad_c = bad_r = 0
    for i in range(0, cf.size, chunk):
        a = np.asarray(cf[i:i + chunk], dtype=np.float64)
        b = np.asarray(rf[i:i + chunk], dtype=np.float64)
        fa, fb = np.isfinite(a), np.isfinite(b)
        nba, nbb = int(a.size - np.count_nonzero(fa)), int(b.size - np.count_nonzero(fb))
        bad_c += nba
        bad_r += nbb
        if nba or nbb:
            continue
        d = a - b
        cc += float(np.dot(a, a))
        rr += float(np.dot(b, b))
        cr += float(np.dot(a, b))
        dd += float(np.dot(d, d))
        if d.size:
            mx = max(mx, float(np.max(np.abs(d))))
    if bad_c or bad_r:
        return TensorDiff(name=name, shape_candidate=tuple(c.shape), shape_reference=tuple(r.shape), numel=int(r.size),
                          norm_candidate=nan, norm_reference=nan, diff_norm=nan, rel_l2=nan, cosine=nan, max_abs_diff=nan,
                          nonfinite_candidate=bad_c, nonfinite_reference=bad_r)
    nc, nr, nd = math.sqrt(cc), math.sqrt(rr), math.sqrt(dd)
    rel = (0.0 if nd == 0 else math.inf) if nr == 0 else nd / nr
    if nc == 0 and nr == 0:
        cos = 1.0
    elif nc == 0 or nr == 0:
        cos = 0.0
    else:
        cos = max(-1.0, min(1.0, cr / (nc * nr)))
    return TensorDiff(name=name, shape_candidate=tuple(c.shape), shape_reference=tuple(r.shape), numel=int(r.size),
                      norm_candidate=nc, norm_reference=nr, diff_norm=nd, rel_l2=rel, cosine=cos, max_abs_diff=mx)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParityThresholds:
    """What a tensor may differ by between two layouts (see the module docstring for the rule)."""

    rel_l2: float = BF16_RELATIVE_FLOOR
    """Largest relative L2 error a tensor may have."""
    cosine: float = 1.0 - BF16_RELATIVE_FLOOR**2 / 2
    """Smallest cosine a tensor may have."""
    noise_rel_l2: float | None = None
    """The worst relative L2 error between two runs of the reference (None: not measured)."""
    noise_cosine: float | None = None
    """The smallest cosine between two runs of the reference (None: not measured)."""
    factor: float = NOISE_FACTOR
    floor: float = BF16_RELATIVE_FLOOR
    source: str = "floor only (the noise between two runs of the reference was not measured)"

    def __post_init__(self) -> None:
        for name in ("rel_l2", "factor", "floor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TunerError(f"parity threshold {name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.cosine, bool) or not isinstance(self.cosine, (int, float)) or not -1 <= self.cosine <= 1:
            raise TunerError(f"parity threshold cosine must be in [-1, 1], got {self.cosine!r}")

    @classmethod
    def from_noise(cls, noise: ParityResult | float, *, factor: float = NOISE_FACTOR, floor: float = BF16_RELATIVE_FLOOR) -> ParityThresholds:
        """Thresholds from the noise between two runs of the reference layout.

        Args:
            noise: the comparison of the reference's second run against its first
                (:func:`compare_gradients`), or its worst relative L2 error.
            factor: threshold = ``max(factor x noise, floor)``.
            floor: the smallest threshold (default: bf16's relative tolerance, see the module docstring).

        Raises:
            TunerError: the noise comparison itself is broken (missing tensors, other shapes, NaN):
                two runs of one layout must produce the same set of finite gradients.
        """
        if isinstance(noise, ParityResult):
            broken = [m for m in noise.failed_metrics if m in ("missing_tensor", "shape_mismatch", "non_finite", "no_tensors")]
            if broken:
                raise TunerError(f"the noise measurement (two runs of the reference) failed {', '.join(broken)}: "
                                 f"{'; '.join(noise.messages[:2])}; a threshold cannot be set from it")
            worst = noise.worst_rel_l2
            worst_cos = noise.worst_cosine
        else:
            worst = float(noise)
            worst_cos = None
        if not (math.isfinite(worst) and worst >= 0):
            raise TunerError(f"the reference's noise must be a finite relative error >= 0, got {worst!r}")
        t = max(factor * worst, floor)
        src = (f"max({factor:g} x the worst relative L2 error between two runs of the reference ({worst:.3g}), "
               f"bf16 floor {floor:g}) = {t:.3g}")
        return cls(rel_l2=t, cosine=1.0 - t * t / 2, noise_rel_l2=worst, noise_cosine=worst_cos, factor=factor, floor=floor, source=src)

    def to_dict(self) -> dict[str, Any]:
        return {"rel_l2": self.rel_l2, "cosine": self.cosine, "noise_rel_l2": self.noise_rel_l2, "noise_cosine": self.noise_cosine,
                "factor": self.factor, "floor": self.floor, "source": self.source}


@dataclass(frozen=True, kw_only=True, slots=True)
class ParityResult:
    """The outcome of a gradient comparison; ``failed_metrics`` names every check that failed."""

    passed: bool
    failed_metrics: tuple[str, ...]
    tensors: tuple[TensorDiff, ...]
    missing: tuple[str, ...] = ()
    """Tensors of the reference that the candidate lacks."""
    extra: tuple[str, ...] = ()
    """Tensors of the candidate that the reference lacks."""
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
        c = self.compared
        return max((t.rel_l2 for t in c), default=float("nan"))

    @property
    def worst_cosine(self) -> float:
        c = self.compared
        return min((t.cosine for t in c), default=float("nan"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParityResult:
        """Inverse of :meth:`to_dict` (with ``per_tensor``); the thresholds come back as recorded.

        Raises:
            TunerError: a dict without the per-tensor rows.
        """
        if "per_tensor" not in d:
            raise TunerError("a parity result needs its per-tensor rows to be read back")
        th = d.get("thresholds") or {}
        return cls(passed=bool(d["passed"]), failed_metrics=tuple(d["failed_metrics"]), tensors=tuple(TensorDiff.from_dict(t) for t in d["per_tensor"]),
                   missing=tuple(d.get("missing", ())), extra=tuple(d.get("extra", ())),
                   thresholds=ParityThresholds(**th) if th else ParityThresholds(), candidate=d.get("candidate", "candidate"),
                   reference=d.get("reference", "reference"), messages=tuple(d.get("messages", ())))

    def worst_tensors(self, k: int = 5) -> list[TensorDiff]:
        """The ``k`` tensors with the largest relative error (not-finite and mismatched ones first)."""
        def key(t: TensorDiff) -> tuple[int, float]:
            if not t.shape_ok or not t.finite:
                return (0, 0.0)
            return (1, -t.rel_l2 if t.rel_l2 == t.rel_l2 else 0.0)
        return sorted(self.tensors, key=key)[:k]

    def summary(self) -> str:
        n = len(self.compared)
        head = (f"{self.candidate} vs {self.reference}: {len(self.tensors)} tensors, worst relative L2 {self.worst_rel_l2:.3g} "
                f"(threshold {self.thresholds.rel_l2:.3g}), smallest cosine {self.worst_cosine:.7f} (threshold {self.thresholds.cosine:.7f})")
        if self.passed:
            return f"passed: {head} over {n} compared tensors"
        return f"failed {', '.join(self.failed_metrics)}: {head}; " + "; ".join(self.messages)

    def to_dict(self, *, all_tensors: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "result": self.result, "passed": self.passed, "failed_metrics": list(self.failed_metrics), "summary": self.summary(),
            "candidate": self.candidate, "reference": self.reference, "tensors_compared": len(self.compared), "tensors": len(self.tensors),
            "worst_rel_l2": _finite_or_none(self.worst_rel_l2), "worst_cosine": _finite_or_none(self.worst_cosine),
            "worst": [t.to_dict() for t in self.worst_tensors(5)], "missing": list(self.missing), "extra": list(self.extra),
            "thresholds": self.thresholds.to_dict(), "messages": list(self.messages),
        }
        if all_tensors:
            d["per_tensor"] = [t.to_dict() for t in self.tensors]
        return d


def _finite_or_none(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def compare_gradients(
    candidate: Mapping[str, Any],
    reference: Mapping[str, Any],
    thresholds: ParityThresholds | None = None,
    *,
    candidate_label: str = "candidate",
    reference_label: str = "reference",
) -> ParityResult:
    """Compare every gradient of ``candidate`` with the same-named one of ``reference`` (see the module docstring).

    Args:
        candidate, reference: ``{parameter name: full gradient}``; values are arrays (or lazily loaded
            arrays, e.g. ``numpy.load(..., mmap_mode="r")``), names layout-independent.
        thresholds: default :class:`ParityThresholds` (the bf16 floor alone) when None.

    Returns:
        The result; ``failed_metrics`` among ``no_tensors``, ``missing_tensor``, ``shape_mismatch``,
        ``non_finite``, ``relative_l2``, ``cosine``.

    Raises:
        TunerError: a value that is not a numeric array.
    """
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
            msgs.append(f"{len(missing)} tensors of the reference missing in the candidate, e.g. {', '.join(missing[:3])}")
        if extra:
            msgs.append(f"{len(extra)} tensors of the candidate missing in the reference, e.g. {', '.join(extra[:3])}")
    bad_shape = [t for t in diffs if not t.shape_ok]
    if bad_shape:
        failed.append("shape_mismatch")
        t = bad_shape[0]
        msgs.append(f"{len(bad_shape)} tensors differ in shape after gathering, e.g. {t.name}: {list(t.shape_candidate)} vs {list(t.shape_reference)}")
    nonfinite = [t for t in diffs if t.shape_ok and not t.finite]
    if nonfinite:
        failed.append("non_finite")
        t = nonfinite[0]
        msgs.append(f"{len(nonfinite)} tensors hold NaN or Inf, e.g. {t.name} ({t.nonfinite_candidate} in the candidate, "
                    f"{t.nonfinite_reference} in the reference)")
    ok = [t for t in diffs if t.shape_ok and t.finite]
    over = sorted((t for t in ok if not t.rel_l2 <= th.rel_l2), key=lambda t: -t.rel_l2 if math.isfinite(t.rel_l2) else -math.inf)
    if over:
        failed.append("relative_l2")
        msgs.append(f"{len(over)} tensors above relative L2 {th.rel_l2:.3g}; worst {over[0].name}: {over[0].rel_l2:.4g} "
                    f"(norms {over[0].norm_candidate:.4g} vs {over[0].norm_reference:.4g}, cosine {over[0].cosine:.6f})")
    low = sorted((t for t in ok if not t.cosine >= th.cosine), key=lambda t: t.cosine)
    if low:
        failed.append("cosine")
        msgs.append(f"{len(low)} tensors below cosine {th.cosine:.6f}; worst {low[0].name}: {low[0].cosine:.6f}")
    return ParityResult(passed=not failed, failed_metrics=tuple(failed), tensors=diffs, missing=missing, extra=extra, thresholds=th,
                        candidate=candidate_label, reference=reference_label, messages=tuple(msgs))


# --------------------------------------------------------------------------------------------------
# gradient dumps (the harness writes them, :mod:`launch.harness.grads`)


@dataclass(frozen=True, slots=True)
class GradDump:
    """A gradient dump: ``index.json`` (what ran) and one ``.npy`` file per parameter (loaded lazily, memory-mapped)."""

    path: Path
    meta: dict[str, Any]

    @property
    def names(self) -> list[str]:
        return sorted(self.meta["tensors"])

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.meta.get("layout_label") or self.path.name)

    def tensor(self, name: str) -> np.ndarray:
        """The gradient of ``name`` (float32, memory-mapped).

        Raises:
            TunerError: the file is missing or not the recorded shape.
        """
        t = self.meta["tensors"][name]
        f = self.path / t["file"]
        try:
            a = np.load(f, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise TunerError(f"gradient dump {self.path}: cannot read {t['file']} for {name} ({e})") from None
        if list(a.shape) != list(t["shape"]):
            raise TunerError(f"gradient dump {self.path}: {t['file']} has shape {list(a.shape)}, the index says {t['shape']}")
        return a

    def mapping(self) -> _LazyDump:
        return _LazyDump(self)


class _LazyDump(Mapping[str, np.ndarray]):
    def __init__(self, dump: GradDump) -> None:
        self._d = dump

    def __getitem__(self, k: str) -> np.ndarray:
        return self._d.tensor(k)

    def __iter__(self) -> Any:
        return iter(self._d.names)

    def __len__(self) -> int:
        return len(self._d.meta["tensors"])


def load_grad_dump(path: str | Path) -> GradDump:
    """Read a gradient dump's index.

    Raises:
        TunerError: not a folder with an ``index.json`` of format :data:`GRAD_DUMP_FORMAT`.
    """
    p = Path(path)
    idx = p / "index.json"
    try:
        meta = json.loads(idx.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TunerError(f"{str(p)!r} is not a gradient dump (no readable index.json: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != GRAD_DUMP_FORMAT or not isinstance(meta.get("tensors"), dict):
        raise TunerError(f"{idx}: not a gradient dump of format {GRAD_DUMP_FORMAT}")
    return GradDump(p, meta)


def _same(what: str, a: Any, b: Any, ca: GradDump, cb: GradDump) -> None:
    if a != b:
        raise TunerError(f"the gradient dumps {ca.path} and {cb.path} are not of the same {what} ({a!r} vs {b!r}): "
                         "gradient parity compares two layouts of one model from one checkpoint on one global batch")


def compare_grad_dumps(candidate: str | Path | GradDump, reference: str | Path | GradDump, thresholds: ParityThresholds | None = None) -> ParityResult:
    """:func:`compare_gradients` on two dumps, after checking they are comparable.

    Raises:
        TunerError: a dump that cannot be read, or two dumps of another model (fingerprint), another
            starting checkpoint or another batch (data offset, global batch, sequence length, corpus).
    """
    c = candidate if isinstance(candidate, GradDump) else load_grad_dump(candidate)
    r = reference if isinstance(reference, GradDump) else load_grad_dump(reference)
    _same("model", c.meta.get("model_fingerprint"), r.meta.get("model_fingerprint"), c, r)
    _same("checkpoint", c.meta.get("checkpoint"), r.meta.get("checkpoint"), c, r)
    _same("batch", c.meta.get("batch"), r.meta.get("batch"), c, r)
    return compare_gradients(c.mapping(), r.mapping(), thresholds, candidate_label=c.label, reference_label=r.label)


def parity_block(result: ParityResult, *, date: str = "", gpu: str = "", seconds: float | None = None, note: str = "") -> dict[str, Any]:
    """The recipe's ``correctness.grad_parity`` entry (seed style: short fields, the worst tensors by name and layout)."""
    worst = [{"tensor": t.name, "rel_l2": _sig(t.rel_l2), "cosine": _sig(t.cosine, 9)} for t in result.worst_tensors(3)]
    d: dict[str, Any] = {
        "result": result.result,
        "candidate": result.candidate,
        "reference": result.reference,
        "tensors": len(result.tensors),
        "worst_rel_l2": _sig(result.worst_rel_l2),
        "worst_cosine": _sig(result.worst_cosine, 9),
        "threshold_rel_l2": _sig(result.thresholds.rel_l2),
        "threshold_cosine": _sig(result.thresholds.cosine, 9),
        "threshold_source": result.thresholds.source,
        "worst_tensors": worst,
    }
    if result.failed_metrics:
        d["failed_metrics"] = list(result.failed_metrics)
    if gpu:
        d["gpu"] = gpu
    if date:
        d["date"] = date
    if seconds is not None:
        d["seconds"] = round(float(seconds), 1)
    d["note"] = note or ("one forward and backward of one global batch from one checkpoint in each layout; every parameter's "
                         "full fp32 gradient compared by relative L2 error and cosine")
    return d


def _sig(x: float, n: int = 3) -> float | None:
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    return float(f"{x:.{n}g}")


# --------------------------------------------------------------------------------------------------
# the optimizer component test


def split_fp32(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """FP32 values as Transformer Engine stores them with ``store_param_remainders``: (bf16 bits, int16 remainder).

    The high 16 bits are the bf16 weight, rounded up (in magnitude of the bit pattern) when the low
    16 bits read as a negative int16; the low 16 bits are the remainder. Source:
    ``transformer_engine/common/multi_tensor/adam.cu``, ``AdamFunctorMasterParamRemainder``
    ("Split into BF16 params (rounded-to-nearest) and remainders").

    Returns:
        (``uint16`` bf16 bit patterns, ``int16`` remainders), same shape as ``x``.
    """
    bits = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    hi = (bits >> 16).astype(np.uint16)
    lo = (bits & 0xFFFF).astype(np.uint16).view(np.int16)
    hi = (hi + (lo < 0).astype(np.uint16)).astype(np.uint16)
    return hi, lo


def reconstruct_fp32(bf16_bits: Any, remainder: Any) -> np.ndarray:
    """The FP32 master TE rebuilds from a bf16 weight and its int16 remainder (inverse of :func:`split_fp32`).

    Source: ``AdamFunctorMasterParamRemainder`` ("Reconstruct FP32 params": the bf16 pattern is
    decremented when the remainder is negative, "undo rounding", then joined with it).

    Args:
        bf16_bits: ``uint16`` (or ``int16``) bit patterns of the bf16 weights.
        remainder: ``int16`` remainders, same shape.
    """
    hi = np.asarray(bf16_bits).astype(np.int32) & 0xFFFF
    rem = np.asarray(remainder).astype(np.int16)
    hi = (hi - (rem < 0).astype(np.int32)) & 0xFFFF
    bits = (hi.astype(np.uint32) << 16) | (rem.view(np.uint16).astype(np.uint32))
    return bits.view(np.float32)


def adam_reference(p0: Any, grads: Sequence[Any], hyper: AdamHyper, *, weight_decay: float | None = None,
                   clip_coeffs: Sequence[float] | None = None) -> list[np.ndarray]:
    """Adam with decoupled weight decay in float64: the reference the optimizer arms are measured against.

    For step ``t`` (from 1), gradient ``g`` (times the step's clip coefficient):
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, ``p = p - lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)``.
    The form of TE's ``AdamFunctor`` (``adam.cu``, "weight decay" mode) and, in exact arithmetic, of
    ``torch.optim.AdamW`` (which decays first: ``p (1 - lr wd)``, then the same step).

    Args:
        p0: the initial weights (any float dtype).
        grads: one gradient per step.
        weight_decay: this tensor's decay (megatron-core leaves biases and norms undecayed); default ``hyper.weight_decay``.
        clip_coeffs: one clip coefficient per step (:func:`clip_coefficient` of the step's global norm); default 1.

    Returns:
        The weights after each step (float64), one array per step.
    """
    p = np.asarray(p0, dtype=np.float64).copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    wd = hyper.weight_decay if weight_decay is None else weight_decay
    out = []
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64) * (clip_coeffs[t - 1] if clip_coeffs is not None else 1.0)
        m = hyper.beta1 * m + (1 - hyper.beta1) * g
        v = hyper.beta2 * v + (1 - hyper.beta2) * g * g
        mh = m / (1 - hyper.beta1**t)
        vh = v / (1 - hyper.beta2**t)
        p = p - hyper.lr * (mh / (np.sqrt(vh) + hyper.eps) + wd * p)
        out.append(p.copy())
    return out


def component_bound(default_error: float) -> float:
    """The seed's bound on the worst tensor's relative L2 error of the update: ``2 x default_error + 1e-3``."""
    return COMPONENT_BOUND_FACTOR * float(default_error) + COMPONENT_BOUND_ABS


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentResult:
    """The decision of the component test, from the component program's JSON lines."""

    passed: bool
    steps: tuple[int, ...]
    default_error: dict[int, float]
    bound: dict[int, float]
    arms: dict[str, dict[str, Any]]
    """Per arm: ``kind``, ``errors`` {step: worst relative L2}, ``worst_tensor`` {step: name}, ``verdict``
    (``pass`` / ``fail`` for tested arms, ``failed as expected`` / ``did not fail`` for controls), ``why``."""
    bitwise: dict[str, Any]
    problems: tuple[str, ...] = ()
    required_moments: tuple[str, ...] = ("fp32",)

    @property
    def result(self) -> str:
        return "pass" if self.passed else "fail"

    def detail(self) -> str:
        """One paragraph in the seed's style (the ``detail`` field of a component test)."""
        parts = []
        for name in ("gpu", "offload", "gpu_bf16_moments"):
            a = self.arms.get(name)
            if not a:
                continue
            errs = ", ".join(f"{_fmt(a['errors'].get(s))} after {s} step{'s' if s != 1 else ''} (bound {_fmt(self.bound.get(s))})" for s in self.steps)
            parts.append(f"{name.replace('_', ' ')}: worst tensor (update) relative L2 error {errs}: {a['verdict']}")
        b = self.bitwise
        if b:
            parts.append("reconstructed FP32 masters " + ("bitwise identical to" if b.get("identical") else "NOT bitwise identical to")
                         + f" the arm with explicit FP32 masters ({b.get('mismatched', '?')} of {b.get('elements', '?')} elements differ)")
        ctl = [(n, a) for n, a in self.arms.items() if a["kind"] == "control"]
        if ctl:
            parts.append("negative controls: " + "; ".join(f"{n.removeprefix('control_').replace('_', ' ')} {a['verdict']} ({a['why']})" for n, a in ctl))
        parts.append(f"bound 2 x the default GPU optimizer's error + 1e-3 (default: {', '.join(_fmt(self.default_error.get(s)) for s in self.steps)})")
        if self.problems:
            parts.append("problems: " + "; ".join(self.problems))
        return "; ".join(parts)

    def entry(self, *, shape: str, gpu: str, date: str, note: str = "") -> dict[str, Any]:
        """The recipe's ``correctness.component_tests`` entry in the seed's form (test, shape, gpu, date, result, detail, note)."""
        offl = "offload" in self.arms
        return {
            "test": "precision-aware Adam on the GPU" + (" and CPU optimizer offload (fraction 1.0, overlapped copies)" if offl else "")
                    + ", each against an FP64 reference",
            "shape": shape,
            "gpu": gpu,
            "date": date,
            "result": self.result,
            "detail": self.detail(),
            "note": note or "the optimizer step is elementwise: the arms are fed the same recorded gradients as the FP64 reference",
        }

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "steps": list(self.steps), "default_error": {str(k): v for k, v in self.default_error.items()},
                "bound": {str(k): v for k, v in self.bound.items()}, "arms": self.arms, "bitwise": self.bitwise,
                "problems": list(self.problems), "required_moments": list(self.required_moments), "detail": self.detail()}


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def decide_component_test(rows: Iterable[Mapping[str, Any]], *, required_moments: Sequence[str] = ("fp32",)) -> ComponentResult:
    """Decide the component test from the component program's JSON lines (:mod:`launch.harness.component`).

    Rows used: ``{"event": "arm", "arm", "kind", "step", "worst_rel_l2", "worst_tensor"}`` per arm and
    measured step; ``{"event": "bitwise", "arm", "against", "step", "identical", "mismatched", "elements"}``;
    ``{"event": "arm_error", "arm", "message"}``.

    Pass when: every ``test`` arm whose moments are in ``required_moments`` (the recipe's: ``fp32`` unless it
    sets bf16 moments) is within :func:`component_bound` of the ``default`` arm's error at every step; the
    bitwise comparison is identical at every step; for every class of bug (``ComponentArm.detects``: dropped
    remainders, a wrong hyperparameter, bf16 masters) at least one ``control`` arm exceeds the bound at some step
    (or differs bitwise); a control whose run failed detected nothing and fails the test; a control that stays within
    the bound is reported as "did not fail" (e.g. beta2 0.95 for 0.98: Adam's bias-corrected first update does not
    depend on beta2, and after 3 steps the change is within the bound, measured on
    the H200, ``benchmarks/results/h200_te_2026-12-01/call12``). Tested arms
    outside ``required_moments`` are reported with their verdict but do not decide.

    Raises:
        TunerError: no row of the ``default`` arm (no bound can be set).
    """
    rows = list(rows)
    by_arm: dict[str, dict[int, Mapping[str, Any]]] = {}
    kinds: dict[str, str] = {}
    errors: dict[str, str] = {}
    bit_rows = []
    for r in rows:
        ev = r.get("event")
        if ev == "arm":
            by_arm.setdefault(str(r["arm"]), {})[int(r["step"])] = r
            kinds[str(r["arm"])] = str(r.get("kind", ""))
        elif ev == "arm_error":
            errors[str(r["arm"])] = str(r.get("message", ""))
            kinds.setdefault(str(r["arm"]), str(r.get("kind", "")))
        elif ev == "bitwise":
            bit_rows.append(r)
    if "default" not in by_arm:
        raise TunerError("the component test has no result for the default GPU optimizer"
                         + (f" (it failed: {errors['default'][:200]})" if "default" in errors else "") + ": no bound can be set")
    steps = tuple(sorted(by_arm["default"]))
    default_error = {s: float(by_arm["default"][s]["worst_rel_l2"]) for s in steps}
    bound = {s: component_bound(e) for s, e in default_error.items()}
    spec = {a.name: a for a in COMPONENT_ARMS}
    arms: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    passed = True
    for name in list(by_arm) + [n for n in errors if n not in by_arm]:
        kind = kinds.get(name) or (spec[name].kind if name in spec else "")
        rs = by_arm.get(name, {})
        errs = {s: float(rs[s]["worst_rel_l2"]) for s in rs}
        worst = {s: str(rs[s].get("worst_tensor", "")) for s in rs}
        over = [s for s in steps if s in errs and not errs[s] <= bound[s]]
        info: dict[str, Any] = {"kind": kind, "errors": errs, "worst_tensor": worst}
        if kind in ("baseline", "bitwise"):
            info["verdict"] = "reference" if name not in errors else "error"
            info["why"] = errors.get(name, "")
            if name in errors:
                passed = False
                problems.append(f"arm {name} failed: {errors[name][:200]}")
        elif kind == "test":
            moments = spec[name].moments if name in spec else "fp32"
            required = moments in required_moments
            if name in errors:
                info["verdict"], info["why"] = "error", errors[name][:300]
            elif set(steps) - set(errs):
                info["verdict"], info["why"] = "fail", f"no result after step(s) {sorted(set(steps) - set(errs))}"
            elif over:
                s = over[0]
                info["verdict"], info["why"] = "fail", f"{errs[s]:.3g} > {bound[s]:.3g} after {s} steps ({worst[s]})"
            else:
                info["verdict"], info["why"] = "pass", ""
            info["required"] = required
            if required and info["verdict"] != "pass":
                passed = False
                problems.append(f"arm {name}: {info['verdict']} {info['why']}")
        elif kind == "control":
            bits = [b for b in bit_rows if b.get("arm") == name and not b.get("identical")]
            err = errors.get(name)
            if over:
                s = over[0]
                info["verdict"], info["why"] = "failed as expected", f"relative_l2 {errs[s]:.3g} > {bound[s]:.3g} after {s} step{'s' if s != 1 else ''}"
            elif bits:
                info["verdict"], info["why"] = "failed as expected", "masters differ bitwise"
            elif err is not None:  # a control that crashed detected nothing
                info["verdict"], info["why"] = "error", f"the control could not run: {err[:200]}"
                passed = False
                problems.append(f"negative control {name} could not run: {err[:200]}")
            else:
                info["verdict"] = "did not fail"
                info["why"] = "within the bound at every step: " + ", ".join(f"{_fmt(errs.get(s))} <= {_fmt(bound[s])}" for s in steps)
            info["detects"] = spec[name].detects if name in spec else name
        arms[name] = info
    # Every class of bug must be caught by at least one of its controls (one wrong hyperparameter, eps or beta2,
    # is enough for that class); a control that did not fail is reported in its verdict either way.
    classes: dict[str, list[str]] = {}
    for name, info in arms.items():
        if info["kind"] == "control":
            classes.setdefault(str(info.get("detects") or name), []).append(name)
    for cls, names in sorted(classes.items()):
        if not any(arms[n]["verdict"] == "failed as expected" for n in names):
            passed = False
            problems.append(f"no negative control of class {cls} failed: " + "; ".join(f"{n} {arms[n]['verdict']} ({arms[n].get('why', '')})" for n in names))
    need = [a.name for a in COMPONENT_ARMS if a.kind == "test" and a.moments in required_moments and a.name not in arms]
    for n in need:
        passed = False
        problems.append(f"arm {n} was not run")
    bit = {}
    main = [b for b in bit_rows if b.get("arm") == "gpu"]
    if main:
        bit = {"arm": "gpu", "against": main[0].get("against"), "steps": sorted(int(b["step"]) for b in main),
               "identical": all(bool(b.get("identical")) for b in main), "mismatched": sum(int(b.get("mismatched", 0)) for b in main),
               "elements": sum(int(b.get("elements", 0)) for b in main)}
        if not bit["identical"]:
            passed = False
            problems.append("the rebuilt masters are not bitwise identical to the explicit-master arm's")
    elif "gpu" in arms:
        passed = False
        problems.append("no bitwise comparison of the rebuilt masters was recorded")
    return ComponentResult(passed=passed, steps=steps, default_error=default_error, bound=bound, arms=arms, bitwise=bit,
                           problems=tuple(problems), required_moments=tuple(required_moments))


# --------------------------------------------------------------------------------------------------
# the recipe's correctness block


def correctness_block(
    *,
    convergence: Mapping[str, Any] | None = None,
    grad_parity: ParityResult | Mapping[str, Any] | None = None,
    component_tests: Sequence[Mapping[str, Any]] = (),
    reference: str | None = None,
    configuration: str | None = None,
) -> dict[str, Any]:
    """The recipe's ``correctness`` block in the seed's form, with gradient parity next to the convergence check.

    Args:
        convergence: the block of the loss-curve check (:func:`tuner.verify.correctness_block` of its
            outcome: ``result``, ``summary``, ``reference``, ``convergence``), or None if not run.
        grad_parity: a :class:`ParityResult` or its :func:`parity_block`, or None if not run.
        component_tests: entries in the seed's form (:meth:`ComponentResult.entry`).
        reference: the reference text (default: the convergence block's).
        configuration: the seed's ``configuration`` field (e.g. ``pass``), when a configuration check ran.

    Returns:
        ``result`` is ``pass`` only when the convergence check and gradient parity both ran and passed and
        no component test failed (``launch.export`` then marks a measured recipe ``verified``); ``fail`` when
        any of them failed; ``error`` when one could not finish; else ``incomplete`` (one of the two not run).
    """
    conv = dict(convergence) if convergence is not None else None
    gp = parity_block(grad_parity) if isinstance(grad_parity, ParityResult) else (dict(grad_parity) if grad_parity is not None else None)
    comps = [dict(c) for c in component_tests]
    results = {"convergence": conv.get("result") if conv else None, "grad_parity": gp.get("result") if gp else None}
    comp_results = [c.get("result") for c in comps]
    if "fail" in results.values() or "fail" in comp_results:
        result = "fail"
    elif "error" in results.values() or "error" in comp_results:
        result = "error"
    elif results["convergence"] == "pass" and results["grad_parity"] == "pass":
        result = "pass"
    else:
        result = "incomplete"
    parts = []
    for k, label in (("convergence", "convergence check"), ("grad_parity", "gradient parity")):
        v = results[k]
        parts.append(f"{label} {'not run' if v is None else ('passed' if v == 'pass' else v)}")
    if comps:
        n_pass = sum(1 for r in comp_results if r == "pass")
        parts.append(f"{n_pass} of {len(comps)} component test{'s' if len(comps) != 1 else ''} passed")
    word = {"pass": "passed", "fail": "failed", "error": "error", "incomplete": "incomplete"}[result]
    out: dict[str, Any] = {"result": result, "summary": f"{word}; " + ", ".join(parts)}
    ref = reference if reference is not None else (conv or {}).get("reference")
    if ref:
        out["reference"] = ref
    if configuration is not None:
        out["configuration"] = configuration
    if comps:
        out["component_tests"] = comps
    if conv is not None:
        out["convergence"] = conv.get("convergence", {k: v for k, v in conv.items() if k not in ("summary", "reference")})
    if gp is not None:
        out["grad_parity"] = gp
    if result == "incomplete":
        missing = [label for k, label in (("convergence", "the convergence check (tune verify)"),
                                          ("grad_parity", "gradient parity (tune verify --grad-parity)")) if results[k] is None]
        out["note"] = "status verified needs both the convergence check and gradient parity; not run: " + ", ".join(missing)
    return out
