"""Per-iteration latency of one generation engine, and the aiconfigurator adapter that provides it.

:class:`LatencyTable` interpolates a grid of decode (``n`` sequences at mean context ``c``) and prefill (``t`` tokens)
latencies; the grid comes from aiconfigurator's ``EngineHandle`` (NVIDIA, Apache-2.0; the ``rl`` extra,
``aiconfigurator==0.12.0``: per-operation tables measured per GPU for vLLM 0.24 and SGLang 0.5.14/0.5.16), or from any
functions (:meth:`LatencyTable.from_functions`).

Caching: a handle per (model, system, backend, shape, precision) stays in memory; each shape's grid is an ``.npz`` under
``$XDG_CACHE_HOME/megatron-layout-tuner/rl/`` (``MLT_CACHE_DIR`` overrides), a shape without data a ``.nodata.txt`` with
the message; the key holds the aiconfigurator version."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specs.errors import TunerError

__all__ = [
    "AIC_VERSION", "Engine", "EngineDataError", "EngineShape", "GenerationPrecision", "LatencyTable", "NamedEnum",
    "aiconfigurator_latency_table", "weight_bytes_per_param",
]

#: The aiconfigurator release this adapter is written against (``pyproject.toml`` extra ``rl``).
#: Pinned on purpose: 0.12.0's CLI announces that 0.13 renames the distribution to ``aisimulate``.
AIC_VERSION = "0.12.0"

_FLOAT = npt.NDArray[np.float64]


class NamedEnum(str, Enum):
    """An option's accepted names: prints (and formats) as its value."""

    def __str__(self) -> str:
        return str(self.value)


class Engine(NamedEnum):
    """Serving framework of the rollout engines."""

    vllm = "vllm"
    sglang = "sglang"


def _collapse_repeats(text: str) -> str:
    """``"a: a: a: b"`` -> ``"a: b"``: aiconfigurator's nested errors repeat their prefix once per level."""
    return re.sub(r"((?:[^:]+: ))\1+", r"\1", text)


class EngineDataError(TunerError):
    """The engine model cannot time this job at any shape: aiconfigurator is not installed, or has no
    configuration for the model, no system for the GPU, or no checkpoint for the precision. Plan
    enumeration stops on it (a shape without data only sets that shape aside)."""


class GenerationPrecision(NamedEnum):
    """Weights and arithmetic of the generation engines (the KV cache and attention stay BF16 in every case).

    - ``bf16``: every GEMM and expert in BF16 (NeMo-RL's and slime's default ``precision: bfloat16``).
    - ``fp8``: the FP8 checkpoint's block-scaled FP8 weights (128 x 128 blocks; NeMo-RL
      ``policy.generation.vllm_cfg.precision: fp8``): DeepSeek-V3/R1, Kimi-K2 and MiniMax-M2.5 ship
      FP8 checkpoints; for Qwen3 aiconfigurator bundles the ``-FP8`` variant's configuration.
    - ``checkpoint``: whatever the checkpoint's ``config.json`` declares (MXFP4 experts for gpt-oss,
      FP8 blocks for DeepSeek-V3, BF16 for a model without a ``quantization_config``).
    """

    bf16 = "bf16"
    fp8 = "fp8"
    checkpoint = "checkpoint"


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineShape:
    """The parallel shape of one generation engine (one vLLM / SGLang server instance).

    GPUs per engine = ``tp * pp * attention_dp``. MoE experts are sharded over
    ``ep`` ranks (vLLM's ``enable_expert_parallel``: EP = TP x DP; SGLang ``--ep-size``),
    the rest of an expert's weight over ``tp * attention_dp / ep`` (expert TP).
    """

    tp: int = 1
    """``tensor_parallel_size`` / ``--tp-size``."""
    pp: int = 1
    """``pipeline_parallel_size``."""
    ep: int = 1
    """``expert_parallel_size`` / ``--ep-size``; 1 = experts tensor-parallel."""
    attention_dp: int = 1
    """Attention data parallel ranks inside the engine (vLLM ``data_parallel_size`` with EP,
    SGLang ``--enable-dp-attention --dp-size``); each rank holds its own sequences."""

    def __post_init__(self) -> None:
        if (self.tp * self.attention_dp) % self.ep:
            raise TunerError(
                f"engine ep={self.ep} must divide tp x attention_dp = {self.tp * self.attention_dp} "
                "(experts are sharded over the engine's tensor and attention-data ranks)"
            )

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        """Tensor-parallel degree inside one expert: ``tp * attention_dp / ep`` (aiconfigurator's ``moe_tp_size``)."""
        return self.tp * self.attention_dp // self.ep

    @property
    def label(self) -> str:
        s = f"tp={self.tp},ep={self.ep},pp={self.pp}"
        return s + (f",dp={self.attention_dp}" if self.attention_dp > 1 else "")


# --------------------------------------------------------------------------- latency table


#: Grids of the latency tables: running sequences per engine (per attention-DP rank) and mean context length (tokens).
#: Between grid points the latency is interpolated linearly (decode cost is close to linear in both: weights are read
#: once per iteration, KV bytes grow with n x c).
SEQ_GRID = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
CTX_GRID = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
PREFILL_GRID = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass(frozen=True, slots=True)
class LatencyTable:
    """Per-iteration latency of one engine on grids (seconds).

    ``decode`` has shape ``(len(seqs), len(ctx))``: one decode iteration of ``seqs[i]`` sequences per attention-DP rank
    at mean context ``ctx[j]`` tokens. ``prefill`` has shape ``(len(prefill_tokens),)``: the prefill of that many prompt
    tokens in one iteration. ``attention_dp`` ranks split the running sequences.
    """

    seqs: _FLOAT
    ctx: _FLOAT
    decode: _FLOAT
    prefill_tokens: _FLOAT
    prefill: _FLOAT
    attention_dp: int = 1
    source: str = ""
    _grid: tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[float, ...], ...]] = field(init=False, repr=False,
                                                                                              compare=False)
    """``(seqs, ctx, decode rows)`` as Python floats: :meth:`decode_s` is called once per simulator
    event (about 10^5 times per ``tune rl``), where numpy's per-call overhead on scalars dominates."""

    def __post_init__(self) -> None:
        grid = (tuple(map(float, self.seqs)), tuple(map(float, self.ctx)),
                tuple(tuple(map(float, row)) for row in np.asarray(self.decode)))
        object.__setattr__(self, "_grid", grid)

    def decode_s(self, num_seqs: float, ctx_len: float) -> float:
        """One decode iteration of ``num_seqs`` running sequences (whole engine) at mean context ``ctx_len`` (s).

        Bilinear interpolation on the grid; linear extrapolation in ``num_seqs`` past the
        last grid point (memory-bound decode grows linearly there), clamped in ``ctx_len``.
        """
        seqs, ctx, dec = self._grid
        n = max(float(num_seqs) / self.attention_dp, 1.0)
        c = min(max(float(ctx_len), ctx[0]), ctx[-1])
        j = min(max(bisect_left(ctx, c), 1), len(ctx) - 1)
        wc = (c - ctx[j - 1]) / (ctx[j] - ctx[j - 1])

        def at(i: int) -> float:
            return dec[i][j - 1] * (1 - wc) + dec[i][j] * wc

        if n <= seqs[-1]:
            i = min(max(bisect_left(seqs, n), 1), len(seqs) - 1)
            ws = (n - seqs[i - 1]) / (seqs[i] - seqs[i - 1])
            return at(i - 1) * (1 - ws) + at(i) * ws
        last, before = at(len(seqs) - 1), at(len(seqs) - 2)
        return last + (last - before) / (seqs[-1] - seqs[-2]) * (n - seqs[-1])

    def prefill_s(self, tokens: float) -> float:
        """Prefill of ``tokens`` prompt tokens spread over the engine's attention-DP ranks (s); 0 for none."""
        if tokens <= 0:
            return 0.0
        t = float(tokens) / self.attention_dp
        x = self.prefill_tokens
        if t <= x[-1]:
            return float(np.interp(t, np.concatenate(([0.0], x)), np.concatenate(([0.0], self.prefill))))
        return float(self.prefill[-1] * t / x[-1])

    @classmethod
    def from_functions(cls, decode: Callable[[int, int], float], prefill: Callable[[int], float], *,
                       max_ctx: int = CTX_GRID[-1], attention_dp: int = 1, source: str = "functions") -> LatencyTable:
        """A table sampled from ``decode(num_seqs, ctx_len) -> s`` and ``prefill(tokens) -> s`` on the grids."""
        ctx = _ctx_grid(max_ctx)
        seqs = np.asarray(SEQ_GRID, dtype=float)
        dec = np.array([[decode(int(n), int(c)) for c in ctx] for n in seqs], dtype=float)
        pt = np.asarray(PREFILL_GRID, dtype=float)
        pre = np.array([prefill(int(t)) for t in pt], dtype=float)
        return cls(seqs, ctx, dec, pt, pre, attention_dp, source)


def _ctx_grid(max_ctx: int) -> _FLOAT:
    g = [c for c in CTX_GRID if c < max_ctx]
    return np.asarray([*g, max(max_ctx, 2 * g[-1])] if g else [32.0, max(max_ctx, 64)], dtype=float)


# --------------------------------------------------------------------------- aiconfigurator adapter

#: Our model preset -> the Hugging Face id aiconfigurator 0.12.0 bundles a config for
#: (``aiconfigurator_core/model_configs/``). Models not listed are refused with this list.
AIC_MODELS: dict[str, str] = {
    "MiniMax-M3": "MiniMaxAI/MiniMax-M3",
    "MiniMax-M2": "MiniMaxAI/MiniMax-M2.5",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Qwen3-32B": "Qwen/Qwen3-32B",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "Kimi-K2": "moonshotai/Kimi-K2-Instruct",
    "Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-v0.1",
    "Mixtral-8x22B": "mistralai/Mixtral-8x22B-v0.1",
    "GPT-OSS-120B": "openai/gpt-oss-120b",
}

#: Our GPU name -> aiconfigurator's system name (``aiconfigurator_core/systems/*.yaml``).
AIC_SYSTEMS: dict[str, str] = {
    "H100": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "B300": "b300_sxm",
    "GB200": "gb200",
    "GB300": "gb300",
    "A100": "a100_sxm",
}


def aic_model_name(model: str) -> str:
    """aiconfigurator's model id for our preset ``model``.

    Raises TunerError: a model aiconfigurator has no configuration for (the supported ones listed)."""
    for k, v in AIC_MODELS.items():
        if k.lower() == model.lower():
            return v
    raise EngineDataError(f"--model {model!r}: aiconfigurator {AIC_VERSION} has no engine data for it; supported: "
                          f"{', '.join(AIC_MODELS)}")


def aic_system_name(gpu: str, engine: Engine) -> str:
    """aiconfigurator's system for our GPU name, checked to have data for ``engine``.

    Raises TunerError: a GPU without aiconfigurator data for that engine (the supported ones listed)."""
    system = AIC_SYSTEMS.get(gpu.upper() if gpu.upper() in AIC_SYSTEMS else gpu)
    supported = _systems_with_data(engine)
    if system is None or (supported is not None and system not in supported):
        have = sorted(k for k, v in AIC_SYSTEMS.items() if supported is None or v in supported)
        raise EngineDataError(f"--gpus {gpu}: aiconfigurator {AIC_VERSION} has no {engine} data for it; GPUs with "
                              f"{engine} data: {', '.join(have)}")
    return system


def _aic_root() -> Path | None:
    """The installed ``aiconfigurator_core`` package folder; None when it is not installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def _systems_with_data(engine: Engine) -> set[str] | None:
    """aiconfigurator systems with GEMM tables for ``engine``; None when aiconfigurator is not installed."""
    root = _aic_root()
    data = root / "systems" / "data" if root else None
    return {d.name for d in data.iterdir() if (d / "gemm" / str(engine)).is_dir()} if data and data.is_dir() else None


def cache_dir() -> Path:
    """Where latency tables are cached (``MLT_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``, plus
    ``megatron-layout-tuner/rl``)."""
    env = os.environ.get("MLT_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megatron-layout-tuner" / "rl"


#: aiconfigurator's name of the BF16 quantisation mode (``sdk/common.py``: ``GEMMQuantMode.bfloat16`` and kin).
_BF16 = "bfloat16"


def _bundled_config(model_id: str) -> Path | None:
    """The ``config.json`` aiconfigurator bundles for ``model_id``; None when it has none."""
    root = _aic_root()
    f = root / "model_configs" / f"{model_id.replace('/', '--')}_config.json" if root else None
    return f if f and f.is_file() else None


def _checkpoint_quant(model_id: str) -> str | None:
    """``quantization_config.quant_method`` of the configuration aiconfigurator bundles for ``model_id`` (None: BF16 or
    not found)."""
    f = _bundled_config(model_id)
    try:
        q = json.loads(f.read_text()).get("quantization_config") or {} if f else {}
    except (OSError, ValueError):
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    return str(method) if method else None


def aic_model_for_precision(model: str, precision: GenerationPrecision) -> tuple[str, dict[str, str]]:
    """aiconfigurator's model id and the quantisation keyword arguments of ``EngineHandle.compile`` for ``precision``:
    BF16 sets all four modes to ``bfloat16``; FP8 uses the bundled ``<id>-FP8`` configuration (Qwen3), else the base id
    of an FP8 checkpoint, GEMM and MoE modes left to aiconfigurator (``fp8_block``), KV cache and attention BF16;
    ``checkpoint`` the base id whatever its quantisation.

    Raises TunerError: an unsupported model (the supported ones listed), or ``fp8`` for a model without an FP8
    configuration in aiconfigurator."""
    model_id = aic_model_name(model)
    if precision == GenerationPrecision.bf16:
        return model_id, {"gemm_quant_mode": _BF16, "moe_quant_mode": _BF16, "kvcache_quant_mode": _BF16,
                          "fmha_quant_mode": _BF16}
    attn = {"kvcache_quant_mode": _BF16, "fmha_quant_mode": _BF16}
    if precision == GenerationPrecision.fp8:
        if _bundled_config(model_id + "-FP8"):
            return model_id + "-FP8", attn
        if _aic_root() is not None and _checkpoint_quant(model_id) != "fp8":
            raise EngineDataError(
                f"--generation-precision fp8: aiconfigurator {AIC_VERSION} bundles no FP8 checkpoint of {model_id} "
                f"(neither {model_id}-FP8 nor an FP8 quantization_config); use bf16"
            )
    return model_id, attn


def weight_bytes_per_param(model: str, precision: GenerationPrecision) -> tuple[float, float]:
    """Bytes per parameter of the engine's ``(dense, expert)`` weights at ``precision``.

    BF16 2; FP8 blocks 1 (one FP32 scale per 128 x 128 block: +0.02 %, left out); MXFP4 experts 0.53 (4 bits plus one
    E8M0 scale per 32 values, OCP MX spec v1.0), their attention and dense layers BF16 (gpt-oss). ``checkpoint`` reads
    the quantisation of the configuration aiconfigurator bundles; without aiconfigurator installed it is taken as BF16.
    """
    if precision == GenerationPrecision.bf16:
        return 2.0, 2.0
    if precision == GenerationPrecision.fp8:
        return 1.0, 1.0
    try:
        method = _checkpoint_quant(aic_model_name(model))
    except TunerError:
        method = None
    return {"fp8": (1.0, 1.0), "mxfp4": (2.0, 4.25 / 8)}.get(method or "", (2.0, 2.0))


@lru_cache(maxsize=64)
def _handle(model_id: str, system: str, backend: str, shape: EngineShape, quant: tuple[tuple[str, str], ...]) -> Any:
    try:
        mod = importlib.import_module("aiconfigurator_core.sdk.engine")
    except ImportError:  # not wrapped below: no shape can be timed
        raise EngineDataError("tune rl needs aiconfigurator for the engines' per-iteration latency: "
                              f"pip install 'megatron-layout-tuner[rl]' (aiconfigurator=={AIC_VERSION})") from None
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    try:
        return mod.EngineHandle.compile(model_id, system, backend, tp_size=shape.tp, pp_size=shape.pp,
                                        attention_dp_size=shape.attention_dp, moe_tp_size=shape.moe_tp,
                                        moe_ep_size=shape.ep, **dict(quant))
    # aiconfigurator raises its own error types (and ValueError / KeyError) for unsupported cases
    except Exception as e:
        raise TunerError(f"aiconfigurator {AIC_VERSION} cannot build a {backend} engine of {model_id} on {system} at "
                         f"{shape.label}: {e}") from None


def aiconfigurator_latency_table(model: str, gpu: str, engine: Engine, shape: EngineShape, *, max_ctx: int,
                                 precision: GenerationPrecision = GenerationPrecision.bf16) -> LatencyTable:
    """The latency grid of one engine shape from aiconfigurator, cached on disk and in memory: decode
    ``EngineHandle.decode_step_latency(n, c, 2)`` (ms; ``isl = c``, its ``isl + osl/2`` being the mean KV length),
    prefill ``predict_prefill_latency(1, t)`` (ms), up to ``max_ctx`` tokens (prompt + response). ``model`` and ``gpu``
    are our preset names (``MiniMax-M3``, ``H200``).

    Raises TunerError: an unsupported model or GPU (the supported ones named), aiconfigurator not installed (the ``rl``
    extra named), or a shape / precision it has no data for."""
    precision = GenerationPrecision(precision)
    model_id, quant_kw = aic_model_for_precision(model, precision)
    key = json.dumps([AIC_VERSION, model_id, gpu, str(engine), shape.tp, shape.pp, shape.ep, shape.attention_dp,
                      max_ctx, str(precision)])
    path = cache_dir() / f"aic-{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"
    missing = path.with_name(path.stem + ".nodata.txt")
    hit = _read_cached(path)
    if hit is not None:
        return hit
    try:
        raise TunerError(missing.read_text())  # a shape aiconfigurator had no data for on an earlier run
    except (OSError, UnicodeDecodeError):
        pass
    system = aic_system_name(gpu, engine)
    quant = tuple(sorted(quant_kw.items()))
    ctx = _ctx_grid(max_ctx)
    seqs = np.asarray(SEQ_GRID, dtype=float)
    pt = np.asarray(PREFILL_GRID, dtype=float)
    source = ""
    # Experts tensor-parallel over the engine (ep < tp x dp) lack MoE tables for many models in 0.12.0;
    # the same experts spread by EP over the same GPUs is the stand-in (equal expert bytes per GPU).
    ranks = shape.tp * shape.attention_dp
    tries = [shape] + ([] if shape.ep == ranks else [EngineShape(tp=shape.tp, pp=shape.pp, ep=ranks,
                                                                 attention_dp=shape.attention_dp)])
    first_error = ""
    for s in tries:
        try:
            h = _handle(model_id, system, str(engine), s, quant)
            dec = np.array([[h.decode_step_latency(int(n), int(c), 2) for c in ctx] for n in seqs], dtype=float) / 1e3
            pre = np.array([h.predict_prefill_latency(1, int(t)) for t in pt], dtype=float) / 1e3
            source = "" if s == shape else f" (MoE timed at {s.label}: no expert-TP data)"
            break
        except EngineDataError:
            raise
        except TunerError as e:
            first_error = first_error or str(e)
        except Exception as e:  # aiconfigurator's PerfDataNotAvailableError and kin: no measured data for this shape
            first_error = first_error or _collapse_repeats(str(e))[:200]
    else:
        hint = ""
        if (precision == GenerationPrecision.bf16 and "MoE data missing" in first_error
                and _checkpoint_quant(model_id) == "fp8"):
            hint = (f" [{model_id}'s own checkpoint is FP8 and aiconfigurator times its experts only as FP8 blocks: a "
                    "run that generated in FP8 is predicted with generation precision fp8; a BF16 run is not "
                    "predicted, as FP8 timing would understate BF16 decode (its expert weights are twice the bytes)]")
        message = (f"aiconfigurator {AIC_VERSION} has no {precision} {engine} data for {model_id} on {system} at "
                   f"{shape.label}: {first_error}{hint}")
        _write_atomic(missing, partial(Path.write_text, data=message))
        raise TunerError(message)
    if not (np.all(np.isfinite(dec)) and np.all(dec > 0) and np.all(np.isfinite(pre))):
        raise TunerError(f"aiconfigurator {AIC_VERSION} returned no latency for {model_id} on {system} {engine} at "
                         f"{shape.label}")
    table = LatencyTable(seqs, ctx, dec, pt, pre, shape.attention_dp,
                         f"aiconfigurator {AIC_VERSION} {system} {engine} {model_id} {precision} {shape.label}{source}")
    _write_atomic(path, lambda tmp: np.savez(tmp, seqs=seqs, ctx=ctx, decode=dec, prefill_tokens=pt, prefill=pre,
                                             attention_dp=table.attention_dp, source=table.source))
    return table


def _read_cached(path: Path) -> LatencyTable | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return LatencyTable(z["seqs"], z["ctx"], z["decode"], z["prefill_tokens"], z["prefill"],
                                int(z["attention_dp"]), str(z["source"]))
    except (OSError, KeyError, ValueError):
        return None


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary file next to ``path``, then move it there; a read-only home is skipped (asked again next
    time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
        write(tmp)
        tmp.replace(path)
    except OSError:
        pass
