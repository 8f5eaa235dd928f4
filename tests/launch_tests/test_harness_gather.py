"""The shard-gathering plan of gradient parity (launch.harness.gather), on simulated TP / EP / PP / VPP layouts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from launch.harness.gather import GatherPlan, ParamShard, assemble, canonical_name, gather_plan, strip_wrappers
from specs.errors import TunerError

CAT = lambda xs, d: np.concatenate(xs, axis=d)  # noqa: E731
CHUNK = lambda x, n, d: np.split(x, n, axis=d)  # noqa: E731


def layer_offsets(
    num_layers: int, pp: int, vpp: int = 1, first: int = 0, last: int = 0
) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(pp_rank, vpp_rank): (first global layer, layer count)}`` for megatron-core's split.

    Even split over the ``pp x vpp`` virtual stages in execution order (stage ``vpp_rank x pp + pp_rank``),
    or ``first`` / ``last`` layers on the first / last pipeline rank and the rest even
    (``num_layers_in_first/last_pipeline_stage``, without VPP). Source: megatron-core 0.19
    ``transformer/transformer_block.py`` ``get_num_layers_to_build`` and ``get_transformer_layer_offset``.

    """
    out: dict[tuple[int, int], tuple[int, int]] = {}
    if first or last:
        if vpp != 1:
            raise TunerError("uneven first/last pipeline stages with VPP are not modelled here")
        mid = num_layers - first - last
        n_mid = pp - (1 if first else 0) - (1 if last else 0)
        if n_mid < 0 or (n_mid == 0 and mid) or (n_mid and mid % n_mid):
            raise TunerError(f"{num_layers} layers do not split over PP {pp} with first {first} and last {last}")
        counts = [
            (first if (r == 0 and first) else last if (r == pp - 1 and last) else (mid // n_mid if n_mid else 0))
            for r in range(pp)
        ]
        start = 0
        for r, c in enumerate(counts):
            out[(r, 0)] = (start, c)
            start += c
        return out
    stages = pp * vpp
    if num_layers % stages:
        raise TunerError(f"{num_layers} layers do not split evenly over PP {pp} x VPP {vpp}")
    per = num_layers // stages
    for v in range(vpp):
        for r in range(pp):
            out[(r, v)] = ((v * pp + r) * per, per)
    return out


def shard_like_megatron(
    full: Any,
    plan: GatherPlan,
    rank: int,
    chunk: Callable[[Any, int, int], list[Any]],
    cat: Callable[[list[Any], int], Any],
) -> Any:
    """Rank ``rank``'s piece of ``full`` as megatron-core splits it (the inverse of :func:`assemble`).

    A gated fc1 weight: the rank's slice of the gate rows followed by its slice of the up rows.
    """
    if plan.group is None:
        return full
    if plan.glu:
        gate, up = chunk(full, 2, 0)
        return cat([chunk(gate, plan.group_size, 0)[rank], chunk(up, plan.group_size, 0)[rank]], 0)
    return chunk(full, plan.group_size, plan.dim)[rank]


def test_canonical_names():
    assert strip_wrappers("module.module.decoder.layers.0.mlp.router.weight") == "decoder.layers.0.mlp.router.weight"
    assert (
        canonical_name("decoder.layers.1.self_attention.linear_qkv.weight", layer_offset=6)
        == "decoder.layers.7.self_attention.linear_qkv.weight"
    )
    assert (
        canonical_name(
            "decoder.layers.0.mlp.experts.linear_fc1.weight3", layer_offset=2, ep_rank=2, num_local_experts=4
        )
        == "decoder.layers.2.mlp.experts.linear_fc1.weight11"
    )
    assert (
        canonical_name("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", ep_rank=1, num_local_experts=8)
        == "decoder.layers.0.mlp.experts.local_experts.9.linear_fc2.weight"
    )
    assert (
        canonical_name("embedding.word_embeddings.weight", layer_offset=3, ep_rank=1, num_local_experts=2)
        == "embedding.word_embeddings.weight"
    )
    with pytest.raises(TunerError, match="num_local_experts"):
        canonical_name("decoder.layers.0.mlp.experts.linear_fc1.weight0")


def test_layer_offsets():
    assert layer_offsets(8, 2) == {(0, 0): (0, 4), (1, 0): (4, 4)}
    assert layer_offsets(8, 2, 2) == {
        (0, 0): (0, 2),
        (1, 0): (2, 2),
        (0, 1): (4, 2),
        (1, 1): (6, 2),
    }  # execution order: vpp-major
    assert layer_offsets(10, 3, first=2, last=4) == {(0, 0): (0, 2), (1, 0): (2, 4), (2, 0): (6, 4)}
    with pytest.raises(TunerError):
        layer_offsets(7, 2)


# A tiny GPT-MoE with megatron-core's TE parameter names and partition attributes.
H, F, V, E, L, HEADS, GROUPS, D = 8, 6, 16, 4, 4, 4, 2, 2


def _full() -> dict[str, tuple[np.ndarray, dict]]:
    rng = np.random.default_rng(1)
    out = {
        "embedding.word_embeddings.weight": (rng.standard_normal((V, H)), {"tp": 0}),
        "decoder.final_layernorm.weight": (rng.standard_normal(H), {}),
        "output_layer.weight": (rng.standard_normal((V, H)), {"tp": 0}),
    }
    for i in range(L):
        p = f"decoder.layers.{i}."
        out[p + "self_attention.linear_qkv.layer_norm_weight"] = (rng.standard_normal(H), {})
        out[p + "self_attention.linear_qkv.weight"] = (rng.standard_normal(((HEADS + 2 * GROUPS) * D, H)), {"tp": 0})
        out[p + "self_attention.q_layernorm.weight"] = (rng.standard_normal(D), {})
        out[p + "self_attention.linear_proj.weight"] = (rng.standard_normal((H, HEADS * D)), {"tp": 1})
        out[p + "pre_mlp_layernorm.weight"] = (rng.standard_normal(H), {})
        out[p + "mlp.router.weight"] = (rng.standard_normal((E, H)), {})
        for e in range(E):
            out[p + f"mlp.experts.linear_fc1.weight{e}"] = (rng.standard_normal((2 * F, H)), {"tp": 0, "expert": True})
            out[p + f"mlp.experts.linear_fc2.weight{e}"] = (rng.standard_normal((H, F)), {"tp": 1, "expert": True})
    return out


def _local_name(name: str, offset: int, ep_rank: int, nle: int) -> str | None:
    """The global name back to this rank's local name (None when the rank does not hold it)."""
    import re

    m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", name)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        e = re.search(r"experts\.linear_fc[12]\.weight(\d+)$", rest)
        if e:
            g = int(e.group(1))
            if not ep_rank * nle <= g < (ep_rank + 1) * nle:
                return None
            rest = rest[: e.start(1)] + str(g - ep_rank * nle)
        return f"decoder.layers.{i - offset}.{rest}"
    return name


@pytest.mark.parametrize(
    "tp, etp, ep, pp, vpp",
    [(1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (2, 2, 2, 1, 1), (1, 1, 4, 1, 1), (1, 1, 1, 2, 2), (2, 1, 2, 2, 1)],
)
def test_every_rank_gathers_the_tp1_tensors_once(tp, etp, ep, pp, vpp):
    """Shard a TP-1 model the way megatron-core does on every rank of the layout, run each rank's plan (TP pieces in
    rank
    order), and check that every global tensor comes back exactly, written once, under its TP-1 name."""
    full = _full()
    offs = layer_offsets(L, pp, vpp)
    nle = E // ep
    written: dict[str, list] = {}
    for pp_rank in range(pp):
        for v in range(vpp):
            first, count = offs[(pp_rank, v)]
            pre, post = pp_rank == 0 and v == 0, pp_rank == pp - 1 and v == vpp - 1
            for ep_rank in range(ep):
                for gname, (t, attrs) in full.items():
                    if gname.startswith("decoder.layers."):
                        li = int(gname.split(".")[2])
                        if not first <= li < first + count:
                            continue
                    elif (
                        gname.startswith("embedding.")
                        and not pre
                        or not gname.startswith(("embedding.", "decoder.layers."))
                        and not post
                    ):
                        continue
                    local = _local_name(gname, first, ep_rank if attrs.get("expert") else 0, nle)
                    if local is None:
                        continue
                    expert = attrs.get("expert", False)
                    size = etp if expert else tp
                    shard_shape = list(t.shape)
                    if "tp" in attrs:
                        shard_shape[attrs["tp"]] //= size
                    p = ParamShard(
                        name="module.module." + local,
                        shape=tuple(shard_shape),
                        tensor_model_parallel="tp" in attrs,
                        partition_dim=attrs.get("tp", -1),
                        is_expert=expert,
                        pre_process=pre,
                    )
                    plan = gather_plan(
                        p, tp=tp, etp=etp, layer_offset=first, ep_rank=ep_rank if expert else 0, num_local_experts=nle
                    )
                    assert plan.name == gname
                    pieces = [shard_like_megatron(t, plan, r, CHUNK, CAT) for r in range(size)]
                    assert all(x.shape == tuple(shard_shape) for x in pieces)
                    got = assemble(pieces, plan, CAT, CHUNK)
                    assert got.shape == plan.full_shape == t.shape
                    # the owner (TP/ETP rank 0, DP rank 0) writes it; other EP ranks hold other experts or a replica
                    if expert or ep_rank == 0:
                        written.setdefault(gname, []).append(got)
    assert set(written) == set(full)
    for gname, gots in written.items():
        assert len(gots) == 1, gname
        assert np.array_equal(gots[0], full[gname][0]), gname


def test_the_swiglu_interleave_is_undone():
    """fc1 of a gated MLP holds [gate_r; up_r] on TP rank r: plain concatenation would give [g0; u0; g1; u1]."""
    g, u = np.arange(8.0).reshape(4, 2), 100 + np.arange(8.0).reshape(4, 2)
    full = np.concatenate([g, u])
    plan = gather_plan(
        ParamShard(
            name="decoder.layers.0.mlp.linear_fc1.weight", shape=(4, 2), tensor_model_parallel=True, partition_dim=0
        ),
        tp=2,
        etp=1,
    )
    assert plan.glu
    r0, r1 = (shard_like_megatron(full, plan, r, CHUNK, CAT) for r in (0, 1))
    assert np.array_equal(r0, np.concatenate([g[:2], u[:2]]))
    assert np.array_equal(assemble([r0, r1], plan, CAT, CHUNK), full)
    assert not np.array_equal(np.concatenate([r0, r1]), full)
    nog = gather_plan(
        ParamShard(
            name="decoder.layers.0.mlp.linear_fc1.weight", shape=(4, 2), tensor_model_parallel=True, partition_dim=0
        ),
        tp=2,
        etp=1,
        gated_linear_unit=False,
    )
    assert not nog.glu


def test_plan_edge_cases():
    tied = gather_plan(
        ParamShard(
            name="output_layer.weight", shape=(8, 4), tensor_model_parallel=True, partition_dim=0,
            shared_embedding=True, pre_process=False,
        ),
        tp=2,
        etp=1,
    )
    assert tied.skip and "tied" in tied.reason
    rep = gather_plan(ParamShard(name="decoder.final_layernorm.weight", shape=(8,)), tp=4, etp=1)
    assert rep.group is None and rep.full_shape == (8,)
    with pytest.raises(TunerError, match="partition_stride"):
        gather_plan(
            ParamShard(name="x.weight", shape=(4, 4), tensor_model_parallel=True, partition_dim=0, partition_stride=2),
            tp=2,
            etp=1,
        )
    with pytest.raises(TunerError, match="partition_dim"):
        gather_plan(ParamShard(name="x.weight", shape=(4,), tensor_model_parallel=True, partition_dim=1), tp=2, etp=1)
    with pytest.raises(TunerError, match="pieces"):
        assemble(
            [np.zeros(2)],
            gather_plan(
                ParamShard(name="x.weight", shape=(2,), tensor_model_parallel=True, partition_dim=0), tp=2, etp=1
            ),
            CAT,
            CHUNK,
        )


def test_torch_side_matches_numpy_where_torch_is_installed():
    """The harness runs the same plan with torch.cat / torch.chunk, and rebuilds TE's masters with torch (CPU check)."""
    torch = pytest.importorskip("torch")
    from launch.harness.component import _rebuild_master
    from tuner.verify.component import split_fp32

    full = np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32)
    plan = gather_plan(
        ParamShard(
            name="decoder.layers.0.mlp.experts.linear_fc1.weight0", shape=(4, 3), tensor_model_parallel=True,
            partition_dim=0, is_expert=True,
        ),
        tp=1,
        etp=2,
        num_local_experts=1,
    )
    pieces = [shard_like_megatron(full, plan, r, CHUNK, CAT) for r in range(2)]
    t = assemble(
        [torch.from_numpy(x) for x in pieces],
        plan,
        lambda xs, d: torch.cat(xs, dim=d),
        lambda x, n, d: list(torch.chunk(x, n, dim=d)),
    )
    assert np.array_equal(t.numpy(), full)
    x = (np.random.default_rng(3).standard_normal(4096) * 0.02).astype(np.float32)
    hi, rem = split_fp32(x)
    m = _rebuild_master(torch.from_numpy(hi.view(np.int16)).view(torch.bfloat16), torch.from_numpy(rem))
    assert np.array_equal(m.numpy().view(np.uint32), x.view(np.uint32))


def test_saved_tensor_census_on_cpu():
    torch = pytest.importorskip("torch")
    from launch.harness.grads import SavedTensorCensus

    lin = torch.nn.Linear(4, 8)
    act = torch.nn.SiLU()
    seq = torch.nn.Sequential(lin, act)
    params = {p.untyped_storage().data_ptr() for p in seq.parameters()}
    x = torch.randn(5, 4, requires_grad=True)
    with SavedTensorCensus({"seq": seq, "act": act}, params) as c:
        y = seq(x)
    y.sum().backward()
    rep = {r["module"]: r for r in c.report()}
    # the linear saves its input (5 x 4) and its weight; SiLU saves its input (5 x 8)
    shapes = sorted(tuple(s["shape"]) for s in rep["seq"]["saved"] if not s["parameter"])
    assert (5, 4) in shapes and (5, 8) in shapes
    assert any(s["parameter"] for s in rep["seq"]["saved"])
    assert [tuple(s["shape"]) for s in rep["act"]["saved"]] == [(5, 8)] and rep["act"]["saved_bytes"] == 5 * 8 * 4
