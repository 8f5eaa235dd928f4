"""Layout strings of RL plans: ``megatron:tp=2,cp=2,ep=16,pp=8,vpp=1``, ``automodel:cp=8,ep=128``,
``vllm:tp=16,ep=16,pp=1``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rl.engine import Engine, EngineShape
from rl.trainer import TrainerBackend
from specs.errors import TunerError

__all__ = ["EngineLayout", "TrainerLayout", "parse_engine_layout", "parse_trainer_layout"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerLayout:
    """A trainer layout string parsed: ``megatron:tp=..,cp=..,ep=..,pp=..,vpp=..`` or ``automodel:cp=..,ep=..``."""

    backend: TrainerBackend
    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1
    vpp: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineLayout:
    """A rollout layout string parsed:
    ``vllm:tp=16,ep=16,pp=1[,dp=..][,gpu_memory_utilization=..][,enforce_eager=0|1][,max_num_seqs=..]``."""

    engine: Engine
    shape: EngineShape
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None
    max_num_seqs: int | None = None


_KV = re.compile(r"\s*([a-z_]+)\s*=\s*([0-9.]+)\s*")


def _kv(text: str, what: str, allowed: Sequence[str]) -> tuple[str, dict[str, float]]:
    if ":" not in text:
        raise TunerError(f"{what} {text!r}: expected KIND:key=value,... (e.g. megatron:tp=2,cp=2,ep=16,pp=8,vpp=1)")
    kind, _, rest = text.strip().partition(":")
    out: dict[str, float] = {}
    for part in filter(None, rest.split(",")):
        m = _KV.fullmatch(part)
        if not m or m.group(1) not in allowed:
            raise TunerError(f"{what} {text!r}: cannot read {part.strip()!r}; accepted keys: {', '.join(allowed)}")
        out[m.group(1)] = float(m.group(2))
    return kind.strip().lower(), out


def _int(v: float, key: str, text: str, what: str) -> int:
    if v != int(v) or v < 1:
        raise TunerError(f"{what} {text!r}: {key} must be a positive integer, got {v:g}")
    return int(v)


def parse_trainer_layout(text: str, what: str = "trainer_layout") -> TrainerLayout:
    """Parse a trainer layout string.

    Raises TunerError: an unknown backend or key, or a non-integer degree."""
    kind, kv = _kv(text, what, ("tp", "cp", "ep", "pp", "vpp"))
    try:
        backend = TrainerBackend(kind)
    except ValueError:
        raise TunerError(f"{what} {text!r}: backend {kind!r} unknown; accepted: "
                         f"{', '.join(b.value for b in TrainerBackend)}") from None
    d = {k: _int(v, k, text, what) for k, v in kv.items()}
    if backend == TrainerBackend.automodel and (d.get("tp", 1) > 1 or d.get("pp", 1) > 1):
        raise TunerError(f"{what} {text!r}: the AutoModel backend is modelled with CP and EP only (tp = pp = 1, its "
                         "validated scope)")
    return TrainerLayout(backend=backend, **d)


def parse_engine_layout(text: str, what: str = "rollout_layout") -> EngineLayout:
    """Parse a rollout layout string.

    Raises TunerError: an unknown engine or key, a bad value, or a shape whose EP does not divide its ranks."""
    kind, kv = _kv(text, what, ("tp", "ep", "pp", "dp", "gpu_memory_utilization", "enforce_eager", "max_num_seqs"))
    try:
        engine = Engine(kind)
    except ValueError:
        accepted = ", ".join(e.value for e in Engine)
        raise TunerError(f"{what} {text!r}: engine {kind!r} unknown; accepted: {accepted}") from None
    tp = _int(kv.get("tp", 1), "tp", text, what)
    ep = _int(kv.get("ep", 1), "ep", text, what)
    pp = _int(kv.get("pp", 1), "pp", text, what)
    dp = _int(kv.get("dp", max(1, ep // tp) if ep > tp else 1), "dp", text, what)
    util = kv.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        raise TunerError(f"{what} {text!r}: gpu_memory_utilization must be in (0, 1], got {util:g}")
    eager = kv.get("enforce_eager")
    seqs = kv.get("max_num_seqs")
    return EngineLayout(
        engine=engine,
        shape=EngineShape(tp=tp, ep=ep, pp=pp, attention_dp=dp),
        gpu_memory_utilization=util,
        enforce_eager=None if eager is None else bool(eager),
        max_num_seqs=None if seqs is None else _int(seqs, "max_num_seqs", text, what),
    )
