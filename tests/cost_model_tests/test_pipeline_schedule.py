"""Megatron's pipeline orders and their simulation (cost_model.pipeline_schedule)."""

from __future__ import annotations

import pytest

from cost_model.pipeline_schedule import Pass, megatron_order, schedule_table, simulate_pipeline, warmup_microbatches
from specs.errors import TunerError


def test_warmup_counts_are_megatron_s():
    # get_pp_rank_microbatches: 1F1B pp - rank - 1; interleaved (pp - rank - 1) * 2 + (vpp - 1) * pp, capped.
    assert [warmup_microbatches(4, r, 1, 8) for r in range(4)] == [3, 2, 1, 0]
    assert [warmup_microbatches(4, r, 2, 8) for r in range(4)] == [10, 8, 6, 4]
    assert warmup_microbatches(4, 0, 2, 4) == 8  # capped at M * vpp
    assert warmup_microbatches(1, 0, 1, 8) == 0


def test_schedule_table_matches_megatron_s_example():
    # schedules.py: "PP2 N3M5 with VP2": microbatch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1
    t = schedule_table(5, 2, 3)
    assert [mb for mb, _ in t] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in t] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_order_is_warmup_then_one_forward_one_backward():
    ops = megatron_order(4, 1, 1, 6)
    kinds = "".join(o.kind.value for o in ops)
    assert kinds == "FF" + "FB" * 4 + "BB"
    assert [o.microbatch for o in ops if o.kind is Pass.backward] == list(range(6))
    inter = megatron_order(2, 0, 2, 4)
    # backward chunks run in reverse: the first backward is of the last chunk
    first_b = next(o for o in inter if o.kind is Pass.backward)
    assert first_b.chunk == 1 and first_b.microbatch == 0
    assert len(inter) == 2 * 4 * 2


@pytest.mark.parametrize("pp,vpp,m", [(1, 1, 4), (4, 1, 8), (4, 2, 8), (8, 4, 16), (2, 8, 6)])
def test_uniform_stages_give_narayanan_s_bubble(pp, vpp, m):
    f, b = 1.0 / vpp, 2.0 / vpp
    ops = simulate_pipeline(pp, vpp, m, [[f] * vpp] * pp, [[b] * vpp] * pp)
    makespan = max(o.end_s for o in ops)
    assert makespan == pytest.approx((m + (pp - 1) / vpp) * 3.0)
    assert len(ops) == 2 * m * vpp * pp


def test_dependencies_hold_and_ranks_do_one_thing_at_a_time():
    pp, vpp, m = 4, 2, 8
    ts = [1.2, 1.0, 1.0, 1.3]
    ops = simulate_pipeline(pp, vpp, m, [[t / 6] * vpp for t in ts], [[t / 3] * vpp for t in ts], p2p_s=0.01)
    end = {(o.op.kind, o.op.microbatch, o.op.chunk * pp + o.rank): o.end_s for o in ops}
    for o in ops:
        s = o.op.chunk * pp + o.rank
        if o.op.kind is Pass.forward and s > 0:
            assert o.start_s >= end[(Pass.forward, o.op.microbatch, s - 1)] + 0.01 - 1e-12
        if o.op.kind is Pass.backward and s < pp * vpp - 1:
            assert o.start_s >= end[(Pass.backward, o.op.microbatch, s + 1)] + 0.01 - 1e-12
    for r in range(pp):
        mine = [o for o in ops if o.rank == r]
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))


def test_bad_schedules_are_refused():
    with pytest.raises(TunerError, match="Megatron needs at least pp"):
        megatron_order(4, 0, 2, 2)
    with pytest.raises(TunerError, match="not a valid pipeline"):
        megatron_order(4, 4, 1, 8)


@pytest.mark.parametrize("pp,vpp,m", [(4, 1, 8), (4, 2, 8), (8, 4, 16), (3, 1, 2), (2, 8, 6)])
def test_each_rank_runs_megatron_s_order_and_the_makespan_is_the_last_end(pp, vpp, m):
    import random

    from cost_model.pipeline_schedule import pipeline_makespan

    rng = random.Random(pp * 100 + vpp * 10 + m)
    f = [[rng.uniform(0.5, 1.5) for _ in range(vpp)] for _ in range(pp)]
    b = [[rng.uniform(1.0, 3.0) for _ in range(vpp)] for _ in range(pp)]
    ops = simulate_pipeline(pp, vpp, m, f, b, p2p_s=0.01)
    for r in range(pp):
        assert [o.op for o in ops if o.rank == r] == megatron_order(pp, r, vpp, m)
    assert pipeline_makespan(pp, vpp, m, f, b, p2p_s=0.01) == max(o.end_s for o in ops)


@pytest.mark.parametrize(
    "pp,vpp,m,uneven", [(4, 1, 700, True), (4, 2, 800, True), (3, 3, 600, False), (2, 4, 1000, False)]
)
def test_a_large_batch_s_makespan_is_the_full_simulation_s(pp, vpp, m, uneven):
    import random

    from cost_model import pipeline_schedule as ps

    assert m > ps.FULL_SIMULATION_MICROBATCHES  # the bounded path: a few periods simulated, the rest extrapolated
    rng = random.Random(pp * 100 + vpp * 10 + m)
    if uneven:  # the estimate's shape: equal middle ranks, the first and last (output layer) apart
        f = [[0.4] * vpp for _ in range(pp)]
        b = [[0.9] * vpp for _ in range(pp)]
        f[0], f[-1], b[-1] = [0.35] * vpp, [0.55] * vpp, [1.1] * vpp
    else:  # every chunk different
        f = [[rng.uniform(0.5, 1.5) for _ in range(vpp)] for _ in range(pp)]
        b = [[x * rng.uniform(1.5, 3.0) for x in r] for r in f]
    full = max(o.end_s for o in simulate_pipeline(pp, vpp, m, f, b))
    assert ps.pipeline_makespan(pp, vpp, m, f, b) == pytest.approx(full, rel=1e-12)
