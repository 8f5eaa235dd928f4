"""A digest of every output column of the estimate over whole search spaces: the safety net of refactors.

Each case enumerates a search space, checks the rules and estimates every valid layout; the digest
of a column is the SHA-256 of its values rounded to 7 significant digits (so a re-association
of floating-point sums, ~1e-16 relative, cannot change it, while any change of a term that
moves some layout's number by more than ~1e-7 does). ``tests/cost_model_tests/test_estimate_digest.py``
asserts the stored digests; a change that is meant to change numbers re-records them:

    PYTHONPATH=. python benchmarks/estimate_digest.py --write tests/fixtures/estimate_digest.json
    PYTHONPATH=. python benchmarks/estimate_digest.py --check tests/fixtures/estimate_digest.json
    # exact arrays
    PYTHONPATH=. python benchmarks/estimate_digest.py --save-arrays /tmp/before.npz
    # max relative difference per column
    PYTHONPATH=. python benchmarks/estimate_digest.py --compare /tmp/before.npz

The first case is the main job's: MiniMax-M2 on 64 x H200, seq 8,192, global batch 128, the default
space as ``--stack slime`` restricts it (348,396 valid layouts). The others cover terms MiniMax-M2 does
not use (MLA, dense layers, MTP, fp8 and MX precisions, CUDA graphs, FSDP, CP all-to-all, the no-TE
harness stack, the NVL72 domain).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.estimate import EstimateTable, estimate_table
from search_spaces.space import SearchSpace, enumerate_layouts
from specs import Dispatcher, Precision, RunOptions, Workload, load_model, parse_gpus

SIG_DIGITS = 7


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpus: str
    seq_length: int = 8192
    global_batch_size: int = 128
    precision: Precision = Precision.bf16
    drop_allgather: bool = False
    options: RunOptions = RunOptions()
    space_overrides: tuple[tuple[str, Any], ...] = ()


CASES = (
    Case("minimax_m2_64xh200_main_job", "MiniMax-M2", "64xH200", drop_allgather=True),
    Case(
        "deepseek_v3_128xh100_fp8_overlaps",
        "DeepSeek-V3",
        "128xH100",
        seq_length=4096,
        global_batch_size=512,
        precision=Precision.fp8,
        options=RunOptions(
            moe_router_force_load_balancing=True, overlap_moe_expert_parallel_comm=True, overlap_grad_reduce=True,
            tp_comm_overlap=True, cuda_graph_scope=("moe_router",),
        ),
    ),
    Case(
        "llama31_70b_64xh100_fsdp_noTE_cpa2a",
        "Llama-3.1-70B",
        "64xH100",
        seq_length=8192,
        global_batch_size=64,
        options=RunOptions(use_megatron_fsdp=True, te_attention=False, cp_comm_type="a2a"),
    ),
    Case(
        "qwen3_235b_72xgb200_mxfp8_graphs",
        "Qwen3-235B-A22B",
        "72xGB200",
        seq_length=4096,
        global_batch_size=576,
        precision=Precision.mxfp8,
        options=RunOptions(cuda_graph_scope=("full_iteration",)),
    ),
)


def columns(est: EstimateTable) -> dict[str, np.ndarray]:
    """Every output array of an :class:`EstimateTable`, by name (memory.*, time.*, totals)."""
    cols = {f"memory.{k}": v for k, v in est.memory.items()}
    cols.update({f"time.{k}": v for k, v in est.time.items()})
    cols.update(
        peak_bytes=est.peak_bytes, step_time_s=est.step_time_s, tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
        mfu=est.mfu, model_tflops_per_gpu=est.model_tflops_per_gpu, usd_per_million_tokens=est.usd_per_million_tokens,
        fits=est.fits.astype(float),
    )
    return cols


def run_case(case: Case) -> tuple[int, dict[str, np.ndarray]]:
    model, cluster = load_model(case.model), parse_gpus(case.gpus)
    w = Workload(seq_length=case.seq_length, global_batch_size=case.global_batch_size, precision=case.precision)
    space = SearchSpace.load(None)
    if case.drop_allgather:
        space = space.replace(dispatcher=tuple(d for d in space.dispatcher if d != Dispatcher.allgather))
    if case.space_overrides:
        space = space.replace(**dict(case.space_overrides))
    en = enumerate_layouts(space, model, cluster.num_gpus, w)
    est = estimate_table(model, cluster, w, en.valid, options=case.options)
    return len(en.valid), columns(est)


def digest_of(v: np.ndarray) -> str:
    """SHA-256 (first 16 hex digits) of ``v`` rounded to :data:`SIG_DIGITS` significant digits, each value
    as an (integer mantissa, decimal exponent) pair, so that the digest does not depend on the last bits."""
    v = np.asarray(v, dtype=float)
    finite = np.isfinite(v) & (v != 0)
    mag = np.zeros(v.shape, dtype=np.int64)
    mant = np.zeros(v.shape, dtype=np.int64)
    mag[finite] = np.floor(np.log10(np.abs(v[finite]))).astype(np.int64)
    mant[finite] = np.round(v[finite] / 10.0 ** mag[finite] * 10 ** (SIG_DIGITS - 1)).astype(np.int64)
    special = np.where(np.isnan(v), 1, np.where(np.isposinf(v), 2, np.where(np.isneginf(v), 3, 0))).astype(np.int64)
    h = hashlib.sha256()
    for arr in (mant, mag, special):
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


def digests(cases: tuple[Case, ...] = CASES) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in cases:
        n, cols = run_case(c)
        out[c.name] = {"valid": n, "columns": {k: digest_of(v) for k, v in sorted(cols.items())}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", help="record the digests in this JSON file")
    ap.add_argument("--check", help="compare with the digests in this JSON file (exit 1 on a difference)")
    ap.add_argument("--save-arrays", help="save every column of every case (.npz) for an exact comparison")
    ap.add_argument("--compare", help="print the largest relative difference per column against a --save-arrays file")
    a = ap.parse_args(argv)
    if a.save_arrays or a.compare:
        arrays = {}
        for c in CASES:
            _, cols = run_case(c)
            arrays.update({f"{c.name}/{k}": v for k, v in cols.items()})
        if a.save_arrays:
            np.savez_compressed(a.save_arrays, **arrays)
        if a.compare:
            ref = np.load(a.compare)
            worst = 0.0
            for k in sorted(set(ref.files) | set(arrays)):
                if k not in ref.files or k not in arrays:
                    print(f"{k}: only in {'the reference' if k in ref.files else 'this run'}")
                    worst = np.inf
                    continue
                x, y = ref[k], arrays[k]
                if x.shape != y.shape:
                    print(f"{k}: shape {x.shape} -> {y.shape}")
                    worst = np.inf
                    continue
                d = float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-300), initial=0.0))
                worst = max(worst, d)
                if d > 1e-12:
                    print(f"{k}: max relative difference {d:.3e}")
            print(f"largest relative difference over all columns: {worst:.3e}")
    if a.write or a.check:
        d = digests()
        if a.write:
            with open(a.write, "w") as f:
                json.dump(d, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"wrote {a.write}: " + ", ".join(f"{k} ({v['valid']:,} layouts)" for k, v in d.items()))
        if a.check:
            with open(a.check) as f:
                ref = json.load(f)
            bad = [
                f"{c}/{k}"
                for c in ref
                for k in ref[c]["columns"]
                if d.get(c, {}).get("columns", {}).get(k) != ref[c]["columns"][k]
            ]
            bad += [
                f"{c}: {ref[c]['valid']} -> {d.get(c, {}).get('valid')} layouts"
                for c in ref
                if ref[c]["valid"] != d.get(c, {}).get("valid")
            ]
            print("\n".join(bad) if bad else "all digests match")
            return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
