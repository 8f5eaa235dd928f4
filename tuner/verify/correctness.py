"""The recipe's ``correctness`` block from what ``tune verify`` found (the seed's form).

Its ``result`` is ``pass`` only when both the convergence check and gradient parity pass (what
``launch.exporters`` needs for ``status: verified``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.verify.parity import ParityResult, parity_block


def correctness_block(*, convergence: Mapping[str, Any] | None = None,
                      grad_parity: ParityResult | Mapping[str, Any] | None = None,
                      component_tests: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The recipe's ``correctness`` block in the seed's form from the checks run (None / empty: not run): ``pass``
    only when the convergence check and gradient parity passed and no component test failed (``launch.exporters``
    then marks a measured recipe ``verified``), ``fail`` when one failed, ``error`` when one did not finish, else
    ``incomplete``."""
    conv = dict(convergence) if convergence is not None else None
    gp = (parity_block(grad_parity) if isinstance(grad_parity, ParityResult)
          else dict(grad_parity) if grad_parity is not None else None)
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
    parts = [f"{label} {'not run' if v is None else ('passed' if v == 'pass' else v)}"
             for label, v in zip(("convergence check", "gradient parity"), results.values())]
    if comps:
        n_pass = sum(1 for r in comp_results if r == "pass")
        parts.append(f"{n_pass} of {len(comps)} component test{'s' if len(comps) != 1 else ''} passed")
    word = {"pass": "passed", "fail": "failed", "error": "error", "incomplete": "incomplete"}[result]
    out: dict[str, Any] = {"result": result, "summary": f"{word}; " + ", ".join(parts)}
    if conv and conv.get("reference"):
        out["reference"] = conv["reference"]
    if comps:
        out["component_tests"] = comps
    if conv is not None:
        out["convergence"] = conv.get("convergence",
                                      {k: v for k, v in conv.items() if k not in ("summary", "reference")})
    if gp is not None:
        out["grad_parity"] = gp
    if result == "incomplete":
        missing = [label for k, label in (("convergence", "the convergence check (tune verify)"),
                                          ("grad_parity", "gradient parity (tune verify --grad-parity)"))
                   if results[k] is None]
        out["note"] = ("status verified needs both the convergence check and gradient parity; not run: "
                       + ", ".join(missing))
    return out


def stored_correctness(st: Any, trial_no: int | None, *, convergence: Any = None,
                       grad_parity: Any = None) -> dict[str, Any] | None:
    """The ``correctness`` block of a study's trial from what ``tune verify`` stored: the convergence check
    (``verify:N``), gradient parity (``verify-parity:N``) and the optimizer component test (``verify-component``),
    the given ones replacing the stored ones; None when nothing was checked (:func:`correctness_block`)."""
    attrs = st.user_attrs
    conv = convergence if convergence is not None else (attrs.get(f"verify:{trial_no}") if trial_no is not None
                                                        else None)
    par = grad_parity if grad_parity is not None else (attrs.get(f"verify-parity:{trial_no}")
                                                       if trial_no is not None else None)
    comp = attrs.get("verify-component")
    if conv is None and par is None and comp is None:
        return None
    return correctness_block(convergence=conv, grad_parity=par, component_tests=[comp] if comp else [])
