"""The search benchmark's policies on simulated worlds (benchmarks/search_bench.py): a tiny run produces the metrics."""

from __future__ import annotations

import pytest

from benchmarks.search_bench import POLICIES, SLICE_POLICIES, prepare_case, run_world, summarize
from tuner.study import TuneConfig


@pytest.fixture(scope="module")
def case():
    """A 2-layer MiniMax-M2 slice on 8 H200, 6 trials a study."""
    return prepare_case(
        TuneConfig.from_dict(dict(backend="command", model="MiniMax-M2", gpus="8xH200", layers=2, global_batch_size=16,
                                  trials=6))
    )


def test_a_tiny_run_gives_every_metric_per_policy(case, tmp_path):
    policies = [p for p in POLICIES if p not in SLICE_POLICIES or p == "gain+slice"]  # the variants: the same loop
    results = [r for seed in range(2) for r in run_world(case, seed, policies, tmp_root=str(tmp_path))]
    assert [r.policy for r in results] == policies * 2
    by = {r.policy: r for r in results if r.seed == 0}
    assert by["model"].trials == 0 and by["model"].gpu_hours == 0.0
    assert (
        1 <= by["queue"].trials
        and by["queue"].gpu_hours > 0
        and sum(by["queue"].outcomes.values()) == by["queue"].trials
    )
    assert 1 <= by["gain"].trials and by["gain"].gpu_hours > 0
    # random order spends (at least) the gain policy's GPU-hours, stopping at the first trial that reaches them
    assert by["random"].gpu_hours >= by["gain"].gpu_hours
    assert by["gain+slice"].trials >= 1 and by["gain+slice"].pick  # the answer is a layout measured in full
    assert all(0.0 <= r.regret <= 1.0 for r in results)
    # the pick is one of the layouts measured to the end: the best of them is at least as good
    assert all(r.regret_best_measured <= r.regret + 1e-12 for r in results if r.policy != "model" and r.pick)
    s = summarize(results)
    assert list(s) == [p for p in POLICIES if p in policies]
    for m in s.values():
        assert m["worlds"] == 2 and 0 <= m["within_2pct"] <= m["within_5pct"] <= 1
        assert m["regret_median"] <= m["regret_p90"] and 0 <= m["best_pruned"] <= 1
    assert list(tmp_path.iterdir()) == []  # each study's folder is removed


def test_an_unknown_policy_is_refused(case):
    with pytest.raises(ValueError, match="available"):
        run_world(case, 0, ["best"])


def test_the_benchmark_s_own_loop_is_the_study_s_gain_policy(case, tmp_path):
    """Without slices, the loop that runs slice trials makes the study's choices: the same trials, GPU-hours, pick."""
    gain, loop = run_world(case, 1, ["gain", "gain-loop"], tmp_root=str(tmp_path))
    assert (loop.pick, loop.trials, loop.outcomes, loop.slices) == (gain.pick, gain.trials, gain.outcomes, 0)
    assert loop.gpu_hours == pytest.approx(gain.gpu_hours)
