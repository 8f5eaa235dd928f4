"""Error bars (cost_model.uncertainty) and the pruning they drive (tuner.study.prepare)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cost_model.uncertainty import Z90, Band, error_bars, family_of, load_error_bars
from specs import load_model, parse_gpus
from tuner.study import TuneConfig, prepare


def test_band_sigma_and_bias_are_the_log_interval():
    b = Band(low=0.8, high=1.25)
    assert b.sigma == pytest.approx((math.log(1.25) - math.log(0.8)) / (2 * Z90))
    assert b.mu == pytest.approx(0.0, abs=1e-12)
    assert Band(low=0.9, high=1.1, spread=0.02).sigma == 0.02


def test_families_fall_back_from_specific_to_all():
    h200 = parse_gpus("8xH200").gpu
    assert family_of(load_model("MiniMax-M2"), h200, "bf16") == ("moe-bf16-hopper", "moe-bf16", "moe")
    assert family_of(load_model("Llama-3.1-8B"), h200, "fp8")[1] == "dense-fp8"
    tput, mem = load_error_bars()
    b = error_bars(load_model("MiniMax-M2"), h200, "bf16")
    assert b.throughput == tput["moe-bf16"] and b.memory == mem["moe"]
    assert b.headroom == pytest.approx(1 - 1 / b.memory.high)


def test_shipped_bands_hold_their_measured_shape():
    """The shipped file is the fit of benchmarks/results/2026-12-07_error_bars: MoE wider than dense, the memory band's
    low end (runs that ran) far below its high end (measured peaks)."""
    tput, mem = load_error_bars()
    assert tput["moe"].high / tput["moe"].low > tput["dense"].high / tput["dense"].low
    assert mem["moe"].low < 1 < mem["moe"].high < 1.1


def _cfg(tmp_path, **kw):
    base = dict(
        model="Qwen3-30B-A3B", gpus="8xH100", layers=16, global_batch_size=16, stack="megatron",
        results_dir=str(tmp_path),
    )
    base.update(kw)
    return TuneConfig.from_dict(base)


def test_only_what_surely_does_not_fit_is_pruned(tmp_path):
    prep = prepare(_cfg(tmp_path))
    est, hbm = prep.estimates, prep.cluster.gpu.hbm_bytes
    low, high = prep.bars.memory.low, prep.bars.memory.high
    assert np.array_equal(prep.fits, (est.peak_bytes * low <= hbm) & est.host_fits)
    may = prep.fits & ~prep.surely_fits
    assert may.any() and np.all(est.peak_bytes[may] * high > hbm)
    assert prep.headroom == pytest.approx(1 - 1 / high)
    fixed = prepare(_cfg(tmp_path, memory_headroom=0.07))
    assert np.array_equal(fixed.fits, (fixed.estimates.peak_bytes <= hbm * 0.93) & fixed.estimates.host_fits)
    assert prep.n_fit > fixed.n_fit


def test_only_what_is_surely_slower_is_left_out_of_the_trials(tmp_path):
    prep = prepare(_cfg(tmp_path))
    tps = prep.estimates.tokens_per_s_per_gpu
    floor = tps[prep.surely_fits].max() * prep.bars.throughput.low
    assert np.array_equal(prep.contenders, prep.fits & (tps * prep.bars.throughput.high >= floor))
    assert prep.contenders.sum() < prep.fits.sum()


@pytest.mark.parametrize(
    ("args", "fit"),
    [
        (
            [
                "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "4", "--ep", "8", "--recompute", "full",
                "--first-stage-layers", "7", "--last-stage-layers", "7",
            ],
            "fits",
        ),
        (
            [
                "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "8", "--ep", "8", "--recompute", "selective",
                "--recompute-modules", "moe", "--mbs", "2", "--dispatcher", "flex+deepep", "--first-stage-layers", "7",
                "--last-stage-layers", "7",
            ],
            "may not fit",
        ),
        (["--gpus", "8xH200", "--ep", "8"], "does not fit"),
    ],
)
def test_estimate_says_whether_a_layout_fits_in_three_words(args, fit):
    import json

    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, ["estimate", "--model", "MiniMax-M2", *args, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fit"] == fit and d["peak_gib_low"] <= d["peak_gib"] <= d["peak_gib_high"]
    assert d["predicted_low"] <= d["tokens_per_s_per_gpu"] <= d["predicted_high"]


def test_the_ratio_of_two_layouts_is_within_error_below_its_90_percent_band():
    """Two layouts of one job differ by their own errors only (sigma 0.0628 each): 90% of ratios lie within
    exp(1.645 sqrt(2) sigma), about +16%."""
    from cost_model.uncertainty import BETWEEN_LAYOUTS_SIGMA, ratio_within_error

    z = np.random.default_rng(0).standard_normal((2, 200_000)) * BETWEEN_LAYOUTS_SIGMA
    within = np.mean(np.abs(z[0] - z[1]) < np.log1p(ratio_within_error()))
    assert 0.89 < within < 0.92 and abs(ratio_within_error() - 0.157) < 0.001


def _fit_module():
    from benchmarks import fit_error_bars

    return fit_error_bars


def test_conformal_ends_are_the_kth_order_statistics():
    """k = ceil((n + 1) 0.95): the k-th smallest and the k-th largest; fewer than 19 values take the extremes."""
    f = _fit_module()
    x = list(np.random.default_rng(1).permutation(100).astype(float))
    assert f.conformal_ends(x) == (4.0, 95.0)  # k = 96
    assert f.conformal_ends(x[:19]) == (min(x[:19]), max(x[:19]))  # k = 19 = n
    assert f.conformal_ends([3.0, 1.0, 2.0]) == (1.0, 3.0)  # k = 4 > n: the extremes
    with pytest.raises(ValueError, match="no values"):
        f.conformal_ends([])


def test_a_new_exchangeable_value_falls_past_each_conformal_end_at_most_5_percent_of_the_time():
    f = _fit_module()
    rng = np.random.default_rng(2)
    over = under = 0
    for _ in range(4000):
        z = rng.standard_normal(31)
        lo, hi = f.conformal_ends(list(z[:30]))
        over += z[30] > hi
        under += z[30] < lo
    # exactly 1 - 30/31 = 0.032 for continuous values (n = 30, k = 30)
    assert 0.022 < over / 4000 < 0.043 and 0.022 < under / 4000 < 0.043


def test_shipped_throughput_bands_and_judgement_are_the_fit_of_the_recorded_residuals():
    """cost_model/data/error_bars.yaml and fit_error_bars.json are what fit_error_bars.py gives on the recorded rows."""
    import json
    from pathlib import Path

    f = _fit_module()
    folder = Path(__file__).resolve().parents[2] / "benchmarks/results/2026-12-07_error_bars"
    rows = [json.loads(line) for line in (folder / "residuals.jsonl").read_text().splitlines()]
    tput, _ = load_error_bars()
    for fam, b in f.fit_bands(rows).items():
        assert (tput[fam].low, tput[fam].high, tput[fam].rows) == (
            round(math.exp(b["lo"]), 4),
            round(math.exp(b["hi"]), 4),
            b["rows"],
        )
    recorded = json.loads((folder / "fit_error_bars.json").read_text())["throughput_judged_leave_one_model_out"]
    assert f.judge(rows) == recorded


GIB = 2.0**30
HBM = 80 * GIB


def test_chance_to_fit_before_any_trial_is_the_policy_s_prior():
    from cost_model.uncertainty import chance_to_fit
    from tuner.study.policy import GainPolicy, PolicyParams

    peak = np.linspace(60, 90, 31) * GIB
    pol = GainPolicy(
        predicted=np.ones(31),
        step_time_s=np.ones(31),
        peak_bytes=peak,
        codes=np.zeros((31, 1), dtype=np.int64),
        hbm_bytes=HBM,
        gpus=8,
        params=PolicyParams(sigma=0.1, memory_sigma=0.0235, memory_bias=0.01),
    )
    got = chance_to_fit(peak, HBM, sigma=0.0235, shared=0.54, bias=0.01)
    assert np.allclose(got, pol.p_fit, atol=1e-12)


def test_an_out_of_memory_lowers_and_a_low_peak_raises_the_others_chance():
    from cost_model.uncertainty import chance_to_fit

    peak = np.array([76.0, 77.0, 78.0, 79.0, 70.0]) * GIB
    kw = dict(sigma=0.0235, shared=0.54)
    prior = chance_to_fit(peak, HBM, **kw)
    after_oom = chance_to_fit(peak, HBM, out_of_memory=[0], **kw)
    assert after_oom[0] == 0.0 and np.all(after_oom[1:] < prior[1:])
    low = chance_to_fit(peak, HBM, measured={0: 72.0 * GIB}, **kw)  # 5% under its prediction
    assert low[0] == 1.0 and np.all(low[1:4] > prior[1:4])
    # a job whose errors are the layouts' own learns nothing about the others
    alone = chance_to_fit(peak, HBM, out_of_memory=[0], sigma=0.0235, shared=0.0)
    assert np.allclose(alone[1:], chance_to_fit(peak, HBM, sigma=0.0235, shared=0.0)[1:])


def test_chance_to_fit_is_the_posterior_of_the_shared_error_model():
    """Against the model drawn: exact normal algebra for a measured peak, rejection sampling for out-of-memory."""
    from scipy.special import ndtr

    from cost_model.uncertainty import chance_to_fit

    sigma, shared = 0.0235, 0.54
    tau, s = sigma * math.sqrt(shared), sigma * math.sqrt(1 - shared)
    peak = np.array([78.0, 78.5, 79.0, 75.0]) * GIB
    t = np.log(HBM / peak)
    # measured peak 3% over: b | z ~ N(z tau^2 / (tau^2 + s^2), tau^2 s^2 / (tau^2 + s^2))
    z = math.log(1.03)
    m, v = z * tau**2 / (tau**2 + s**2), tau**2 * s**2 / (tau**2 + s**2)
    got = chance_to_fit(peak, HBM, sigma=sigma, shared=shared, measured={3: 75.0 * 1.03 * GIB})
    assert np.allclose(got[:3], ndtr((t[:3] - m) / math.sqrt(v + s**2)), atol=2e-4)
    # two out-of-memory layouts
    rng = np.random.default_rng(3)
    b = tau * rng.standard_normal(400_000)
    u = s * rng.standard_normal((400_000, 3))
    keep = (b + u[:, 0] > t[0]) & (b + u[:, 1] > t[1])
    want = np.mean(b[keep] + u[keep, 2] <= t[2])
    got = chance_to_fit(peak, HBM, sigma=sigma, shared=shared, out_of_memory={0, 1})
    assert got[2] == pytest.approx(want, abs=4 * math.sqrt(want * (1 - want) / keep.sum()) + 1e-3)
    assert got[2] < chance_to_fit(peak, HBM, sigma=sigma, shared=shared, out_of_memory={0})[2]


def test_the_memory_band_says_how_much_of_its_error_a_job_shares():
    """shared = 1 - within-job variance / all: measured on the H200 trials grouped by model and precision."""
    f = _fit_module()
    _, mem = load_error_bars()
    assert mem["moe"].shared == mem["all"].shared and 0.3 < mem["all"].shared < 0.8
    x = [0.0, 0.1, 0.2, 1.0, 1.1, 1.2, 5.0]
    assert f.shared_share(x, ["a", "a", "a", "b", "b", "b", "c"]) == pytest.approx(1 - 0.01 / np.var(x, ddof=1))


def test_the_fit_verdict_reads_both_ends_of_the_memory_interval():
    bars = error_bars(load_model("MiniMax-M2"), parse_gpus("64xH200").gpu, "bf16")
    lo, hi = bars.memory_interval(100.0)
    assert lo < 100.0 < hi
    assert bars.fit_verdict(100.0, hi) == "fits"
    assert bars.fit_verdict(100.0, (lo + hi) / 2) == "may not fit"
    assert bars.fit_verdict(100.0, lo * 0.99) == "does not fit"
