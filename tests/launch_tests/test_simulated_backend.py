"""The simulated backend (benchmarks/simulated.py): the backend contract where it applies, a world's truth (one seed,
one truth; the table and one layout agree; its error against the model is the configured size; out of memory
where the true peak is over HBM), the reporter and the pruner, and the GPU-seconds each trial costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.simulated import ErrorStructure, SimulatedBackend, World, WorldTable, slice_plan, startup_seconds
from launch import TrialFailed, TrialStopped, backend_class
from launch.base import FailureKind
from launch.harness.pruner import StepTimePruner
from search_spaces.rules import RuleEnv
from search_spaces.space import SearchSpace, enumerate_layouts
from specs import DEFAULT_RUN_OPTIONS, Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.model import slice_model

QUIET = {"crash_rate": 0.0, "hang_rate": 0.0}


@pytest.fixture(scope="module")
def base():
    """A 2-layer MiniMax-M2 slice on 8 H200: every valid layout of the default space."""
    model = slice_model(load_model("MiniMax-M2"), 2)
    cluster = parse_gpus("8xH200")
    wl = Workload(seq_length=8192, global_batch_size=16)
    en = enumerate_layouts(SearchSpace.load(None), model, 8, wl, RuleEnv.of(cluster, DEFAULT_RUN_OPTIONS))
    return WorldTable(model, cluster, wl, en.valid)


def _world(base, seed=0, **errors):
    return World(base, seed=seed, errors=ErrorStructure.for_model(base.model, source="kfold", **{**QUIET, **errors}))


def _run(backend, world, row, reporter=None):
    return backend.run(
        world.base.table.row(row), model=world.model, cluster=world.cluster, workload=world.workload, reporter=reporter,
        trial_number=1,
    )


def _fitting_row(world):
    return int(np.flatnonzero(world.fits)[0])


def test_one_seed_is_one_world_and_a_layout_alone_gets_its_row_s_truth(base):
    a, b, c = _world(base, 3), _world(base, 3), _world(base, 4)
    assert np.array_equal(a.true_step_time_s, b.true_step_time_s) and np.array_equal(
        a.true_peak_bytes, b.true_peak_bytes
    )
    assert not np.allclose(a.true_step_time_s, c.true_step_time_s)
    for i in (0, len(base.table) // 2, len(base.table) - 1):
        step, peak = a.truth_of(base.table.row(i))
        assert step == pytest.approx(a.true_step_time_s[i], rel=1e-12) and peak == pytest.approx(
            a.true_peak_bytes[i], rel=1e-12
        )


def test_the_error_against_the_model_has_the_configured_size(base):
    """Pooled over worlds, the median |true / predicted - 1| is the family's held-out error (MoE: 0.1453)."""
    errs = np.concatenate([np.abs(_world(base, s).step_errors()) for s in range(30)])
    assert ErrorStructure.for_model(base.model, source="kfold").median_step_error == 0.1453
    assert float(np.median(errs)) == pytest.approx(0.1453, rel=0.25)
    half = np.concatenate([np.abs(_world(base, s, median_step_error=0.05).step_errors()) for s in range(30)])
    assert float(np.median(half)) == pytest.approx(0.05, rel=0.25)


def test_by_default_the_error_bars_give_the_size_and_the_bias(base):
    from cost_model.uncertainty import error_bars

    band = error_bars(base.model, base.cluster.gpu, base.workload.precision).throughput
    e = ErrorStructure.for_model(base.model, base.cluster.gpu, base.workload.precision)
    assert e.throughput_bias == band.mu
    # the median |exp(sigma Z) - 1| of the band's sigma: about 0.6745 sigma for a narrow band
    assert e.median_step_error == pytest.approx(0.6745 * band.sigma, rel=0.05)
    w = World(base, seed=0)  # the default
    assert w.errors == e
    with pytest.raises(ValueError, match="accepted"):
        ErrorStructure.for_model(base.model, source="bars")


def test_a_measurement_of_the_truth_with_the_reporter_called_after_every_step(base):
    w = _world(base)
    row = _fitting_row(w)
    seen: list[int] = []

    def reporter(tps):
        seen.append(len(tps))
        assert all(x > 0 for x in tps)

    b = SimulatedBackend(w, steps=6, warmup_steps=2)
    m = _run(b, w, row, reporter)
    assert seen == [1, 2, 3, 4, 5, 6]
    assert m.source == "measured" and b.measured and b.name == "simulated"
    assert len(m.step_times_s) == 4 and m.peak_bytes == pytest.approx(w.true_peak_bytes[row])
    assert m.tokens_per_s_per_gpu == pytest.approx(w.tokens_per_s_per_gpu(np.median(m.step_times_s)))
    # run-to-run noise around the true mean: the same layout again gives another number near it
    again = _run(b, w, row)
    assert again.tokens_per_s_per_gpu != m.tokens_per_s_per_gpu
    assert np.median(again.step_times_s) == pytest.approx(w.true_step_time_s[row], rel=0.3)


def test_out_of_memory_where_the_true_peak_is_over_hbm_costs_start_up_and_one_step(base):
    wl = Workload(seq_length=32768, global_batch_size=16)  # long sequences: some layouts do not fit
    en = enumerate_layouts(SearchSpace.load(None), base.model, 8, wl, RuleEnv.of(base.cluster, DEFAULT_RUN_OPTIONS))
    w = _world(WorldTable(base.model, base.cluster, wl, en.valid.select(np.arange(0, len(en.valid), 7))))
    over = np.flatnonzero(~w.fits)
    assert len(over), "the slice has layouts that do not fit"
    row = int(over[0])
    b = SimulatedBackend(w, startup_s=100.0)
    with pytest.raises(TrialFailed) as e:
        _run(b, w, row)
    assert e.value.kind == FailureKind.oom and e.value.memory_reached_bytes == w.cluster.gpu.hbm_bytes
    assert w.true_peak_bytes[row] > w.cluster.gpu.hbm_bytes
    assert b.gpu_seconds == pytest.approx((100.0 + w.true_step_time_s[row]) * 8)
    assert [t.outcome for t in b.trials] == ["oom"]


def test_gpu_hours_of_a_measured_trial_start_up_plus_steps_at_the_cluster_s_gpus(base):
    w = _world(base)
    b = SimulatedBackend(w, steps=5, warmup_steps=1, startup_s=50.0)
    _run(b, w, _fitting_row(w))
    wall = b.trials[0].gpu_seconds / 8
    assert wall > 50.0 and b.trials[0].steps == 5 and b.trials[0].outcome == "measured"
    assert b.gpu_hours == pytest.approx(b.gpu_seconds / 3600) == pytest.approx(b.trials[0].gpu_seconds / 3600)
    assert startup_seconds(64) == 300.0 and startup_seconds(1024) == pytest.approx(600.0)


def test_the_step_time_pruner_stops_a_slow_trial_which_pays_only_its_steps(base):
    w = _world(base)
    row = _fitting_row(w)
    pruner = StepTimePruner(warmup_steps=2, margin=0.25)
    best = 2 * w.tokens_per_s_per_gpu(w.true_step_time_s[row])  # a best twice as fast as this layout
    b = SimulatedBackend(w, steps=10, warmup_steps=2, startup_s=10.0)
    with pytest.raises(TrialStopped) as e:
        _run(b, w, row, lambda tps: pruner.decide(list(tps), best))
    assert len(e.value.step_times_s) == 4  # 2 warm-up + pruner's min_steps 2
    assert b.trials[0].outcome == "pruned" and b.trials[0].gpu_seconds == pytest.approx(
        (10.0 + sum(e.value.step_times_s)) * 8
    )


def test_crashes_and_hangs_cost_what_they_ran_or_the_timeout(base):
    w = _world(base, crash_rate=1.0)
    b = SimulatedBackend(w, steps=4, warmup_steps=1, startup_s=10.0)
    with pytest.raises(TrialFailed) as e:
        _run(b, w, _fitting_row(w))
    assert e.value.kind == FailureKind.crash and b.trials[0].outcome == "crash" and b.trials[0].gpu_seconds > 10.0 * 8
    h = _world(base, hang_rate=1.0)
    b = SimulatedBackend(h, steps=4, warmup_steps=1, timeout_s=123.0)
    with pytest.raises(TrialFailed) as e:
        _run(b, h, _fitting_row(h))
    assert e.value.kind == FailureKind.timeout and b.gpu_seconds == pytest.approx(123.0 * 8)


def test_hooks_and_no_registration(base):
    b = SimulatedBackend(_world(base))
    lay = base.table.row(0)
    assert b.refusal(lay, base.model, base.workload) is None and b.cluster_gpus() is None
    b.close()
    b.close()
    b.cancel()
    with pytest.raises(KeyboardInterrupt):
        _run(b, b.world, 0)
    with pytest.raises(TunerError, match="unknown backend"):
        backend_class("simulated")  # never a user-facing backend
    assert math.isfinite(b.world.idiosyncratic_sigma) and b.world.idiosyncratic_sigma > 0


# ---- slice trials -----------------------------------------------------------------------------------------------

EXACT = {
    "throughput_bias": 0.0,
    "idiosyncratic_share": 0.0,
    "layout_sigma": 0.0,
    "run_sigma": 0.0,
    "step_sigma": 0.0,
    "warmup_slowdown": 0.0,
}


def _exact_world(base, **factors):
    """A world whose every time group is exact but ``factors``, with no noise and no layout's own error."""
    w = _world(base, **EXACT)
    w.time_factors = {g: factors.get(g, 1.0) for g in w.time_factors}
    return w


def test_a_slice_does_not_see_the_pipeline_bubble_and_does_see_compute(base):
    bubble = np.asarray(base.estimates.time["pp_bubble"])
    row = int(np.flatnonzero(bubble > 0.05 * np.asarray(base.estimates.step_time_s))[0])
    lay = base.table.row(row)
    w = _exact_world(base, pp_bubble=2.0)  # only the pipeline bubble is wrong
    full, _ = w.truth_of(lay)
    assert full > 1.05 * float(base.estimates.step_time_s[row])
    m = SimulatedBackend(w, steps=4, warmup_steps=1).run_slice(lay)
    assert m.step_time_s == pytest.approx(m.predicted_step_time_s, rel=1e-9)  # the slice measures what the model says
    m = SimulatedBackend(_exact_world(base, compute=2.0), steps=4, warmup_steps=1).run_slice(lay)
    assert m.step_time_s > 1.2 * m.predicted_step_time_s


def test_a_slice_costs_less_than_a_full_trial_and_knows_what_it_misses(base):
    w = _world(base)
    row = _fitting_row(w)
    b = SimulatedBackend(w, steps=6, warmup_steps=2)
    _run(b, w, row)
    m = b.run_slice(base.table.row(row))
    assert [t.outcome for t in b.trials] == ["measured", "slice"]
    assert m.gpus == 8 and m.gpu_seconds == pytest.approx(b.trials[1].gpu_seconds)
    assert b.trials[1].gpu_seconds < b.trials[0].gpu_seconds
    plan = slice_plan(base.model, base.cluster, base.table, base.estimates)
    unseen = w.slice_unseen_sigma(plan)
    pp1 = np.asarray(base.table["pp"]) == 1
    # with no pipeline, only the data-parallel gradients and the pipeline's features are unseen: less to miss
    assert unseen.min() > 0 and unseen[pp1].mean() < unseen[~pp1].mean()
