"""Pipeline-rank classes: which decoder layers each pipeline rank holds, reduced to a few classes.

Every rank-dependent term has shape ``(n, K)``: one column per class of pipeline ranks that hold the same layers (K is 1
to 4 whatever ``pp``), so one vectorised call covers every rank of 10^5-10^6 layouts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from search_spaces.pipeline import stage_layer_counts
from specs import ModelSpec
from specs.layout import LayoutTable

Array = npt.NDArray[np.float64]


@lru_cache(maxsize=4096)
def rank_classes(moe_layer_freq: tuple[int, ...], pp: int, vpp: int, first: int,
                 last: int) -> tuple[tuple[int, int, int, int, tuple[int, ...]], ...]:
    """Pipeline ranks grouped into classes that have the same layers.

    Layers are assigned in execution order, stage ``i = v*pp + r`` (Megatron's VPP-major layout), so a model whose first
    layers are dense (DeepSeek-V3) puts them on rank 0's first chunk. Ranks with the same (layers, MoE layers, chunk
    sizes, first/last role) take the same time per micro-batch; among them the lowest rank holds the most in-flight
    micro-batches, so it stands for the class in memory.

    Returns: One tuple per class: (lowest rank, decoder layers, MoE layers, number of ranks, layers per chunk)."""
    counts = stage_layer_counts(len(moe_layer_freq), pp, vpp, first, last)
    n_layers = [0] * pp
    n_moe = [0] * pp
    pos = 0
    for v in range(vpp):
        for r in range(pp):
            c = counts[r][v]
            n_layers[r] += c
            n_moe[r] += sum(moe_layer_freq[pos : pos + c])
            pos += c
    classes: dict[tuple[bool, bool, int, int, tuple[int, ...]], list[int]] = {}
    for r in range(pp):
        key = (r == 0, r == pp - 1, n_layers[r], n_moe[r], tuple(counts[r]))
        classes.setdefault(key, []).append(r)
    return tuple((rs[0], k[2], k[3], len(rs), k[4]) for k, rs in classes.items())


@dataclass(frozen=True, kw_only=True, slots=True)
class RankArrays:
    """:func:`rank_classes` of every row, as arrays of shape ``(n, K)``; padding columns have ``count`` 0."""

    rank: Array
    """Representative (lowest) pipeline rank of the class; -1 in padding columns."""
    layers: Array
    """Decoder layers the rank holds (over all its chunks)."""
    moe: Array
    """MoE layers among them."""
    count: Array
    """Pipeline ranks in the class (0 = padding)."""
    block_layers: Array
    """Layers recomputed under block recompute: ``sum over chunks of min(chunk, recompute_num_layers)``
    (the first ``recompute_num_layers`` layers of every chunk, transformer_block.py ``_checkpointed_forward``)."""


def rank_arrays(model: ModelSpec, t: LayoutTable) -> RankArrays:
    """The rank classes of every row of ``t`` (one :func:`rank_classes` call per distinct pipeline split).

    Returns: A :class:`RankArrays` of shape ``(n, K)``, K the most classes of any row."""
    pp = t["pp"]
    vpp = t["vpp"]
    first = t["num_layers_in_first_pipeline_stage"]
    last = t["num_layers_in_last_pipeline_stage"]
    code = ((pp * 64 + vpp) * 4096 + first) * 4096 + last
    _, first_row, inv = np.unique(code, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    per = [rank_classes(model.moe_layer_freq, int(pp[i]), int(vpp[i]), int(first[i]), int(last[i])) for i in first_row]
    K = max(len(c) for c in per) if per else 1
    nmax = max((max(max(ch) for *_, ch in c) for c in per), default=1) + 1
    rep = np.full((len(per), K), -1.0)
    nl = np.zeros((len(per), K))
    nm = np.zeros((len(per), K))
    cnt = np.zeros((len(per), K))
    blk = np.zeros((len(per), K, nmax + 1))
    for u, classes in enumerate(per):
        for k_, (r, a, b, c, ch) in enumerate(classes):
            rep[u, k_], nl[u, k_], nm[u, k_], cnt[u, k_] = r, a, b, c
            chunks = np.array(ch, dtype=float)
            blk[u, k_] = [np.minimum(chunks, N).sum() for N in range(nmax + 1)]
    rnl = np.clip(t["recompute_num_layers"], 1, nmax)
    return RankArrays(
        rank=rep[inv], layers=nl[inv], moe=nm[inv], count=cnt[inv],
        block_layers=blk[inv[:, None], np.arange(K)[None, :], rnl[:, None]])
