"""tuner.verify.parity, .component, .correctness: the gradient-parity metrics, the optimizer component test's arithmetic
and decision, the recipe block."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from launch.harness.component import AdamHyper, clip_coefficient
from launch.harness.gather import GRAD_DUMP_FORMAT, model_fingerprint
from specs.errors import TunerError
from tuner.verify.component import adam_reference, component_bound, decide_component_test, reconstruct_fp32, split_fp32
from tuner.verify.correctness import correctness_block
from tuner.verify.parity import (
    BF16_RELATIVE_FLOOR,
    ParityThresholds,
    compare_grad_dumps,
    compare_gradients,
    parity_block,
    tensor_diff,
)

RNG = np.random.default_rng(0)
G = {
    "a.weight": RNG.standard_normal((64, 32)).astype(np.float32),
    "b.norm.weight": RNG.standard_normal(32).astype(np.float32),
    "c.experts.linear_fc1.weight3": RNG.standard_normal((16, 8)).astype(np.float32),
}


# ---- tensor metrics on recorded gradients


def test_identical_gradients_have_zero_error_and_cosine_one():
    d = tensor_diff("a", G["a.weight"], G["a.weight"].copy())
    assert d.rel_l2 == 0.0 and d.cosine == pytest.approx(1.0, abs=1e-12) and d.max_abs_diff == 0.0
    r = compare_gradients(G, {k: v.copy() for k, v in G.items()})
    assert r.passed and r.failed_metrics == () and r.worst_rel_l2 == 0.0


def test_a_scaled_gradient_keeps_its_direction_but_fails_on_relative_error():
    """The seed's bug class: a norm weight's gradient summed twice. Cosine 1, relative L2 error 1."""
    cand = dict(G)
    cand["b.norm.weight"] = 2 * G["b.norm.weight"]
    d = tensor_diff("b", cand["b.norm.weight"], G["b.norm.weight"])
    assert d.rel_l2 == pytest.approx(1.0, rel=1e-6) and d.cosine == pytest.approx(1.0, abs=1e-9)
    r = compare_gradients(cand, G)
    assert not r.passed and r.failed_metrics == ("relative_l2",)
    assert r.worst_tensors(1)[0].name == "b.norm.weight" and "b.norm.weight" in r.summary()


def test_noise_below_the_threshold_passes_and_above_it_fails():
    noise = {k: v * (1 + 1e-3 * RNG.standard_normal(v.shape)).astype(np.float32) for k, v in G.items()}
    assert compare_gradients(noise, G).passed
    big = {k: v + 0.1 * np.abs(v).mean() * RNG.standard_normal(v.shape).astype(np.float32) for k, v in G.items()}
    r = compare_gradients(big, G)
    assert not r.passed and "relative_l2" in r.failed_metrics
    # a wrong direction of the same size fails on the cosine too
    flip = dict(G)
    flip["a.weight"] = -G["a.weight"]
    r = compare_gradients(flip, G)
    assert {"relative_l2", "cosine"} <= set(r.failed_metrics) and r.worst_cosine == pytest.approx(-1.0)


def test_nan_missing_tensor_and_shape_mismatch_fail_with_their_metric():
    nan = {k: v.copy() for k, v in G.items()}
    nan["a.weight"][3, 4] = np.nan
    r = compare_gradients(nan, G)
    assert r.failed_metrics == ("non_finite",) and r.tensors[0].nonfinite_candidate == 1
    missing = {k: v for k, v in G.items() if k != "c.experts.linear_fc1.weight3"}
    r = compare_gradients(missing, G)
    assert "missing_tensor" in r.failed_metrics and r.missing == ("c.experts.linear_fc1.weight3",)
    r = compare_gradients({**G, "extra.weight": G["b.norm.weight"]}, G)
    assert "missing_tensor" in r.failed_metrics and r.extra == ("extra.weight",)
    shp = dict(G)
    shp["a.weight"] = np.concatenate([G["a.weight"], G["a.weight"][:1]])  # e.g. a vocabulary padded to another TP size
    r = compare_gradients(shp, G)
    assert r.failed_metrics == ("shape_mismatch",) and "[65, 32] vs [64, 32]" in r.messages[0]
    assert compare_gradients({}, {}).failed_metrics == ("no_tensors",)


def test_zero_gradients():
    z = np.zeros(4, np.float32)
    assert tensor_diff("z", z, z).rel_l2 == 0.0 and tensor_diff("z", z, z).cosine == 1.0
    d = tensor_diff("z", np.ones(4), z)
    assert math.isinf(d.rel_l2) and d.cosine == 0.0


def test_chunked_sums_equal_one_pass():
    a = RNG.standard_normal(10_001)
    b = a + 1e-3 * RNG.standard_normal(10_001)
    assert tensor_diff("x", a, b, chunk=97).rel_l2 == pytest.approx(tensor_diff("x", a, b).rel_l2, rel=1e-12)


def test_a_parity_result_reads_back_from_its_dict():
    r = compare_gradients({**G, "b.norm.weight": 2 * G["b.norm.weight"]}, G, ParityThresholds.from_noise(1e-3))
    back = type(r).from_dict(json.loads(json.dumps(r.to_dict())))
    assert (
        back.failed_metrics == r.failed_metrics
        and back.worst_rel_l2 == r.worst_rel_l2
        and back.thresholds == r.thresholds
    )
    with pytest.raises(TunerError, match="per-tensor"):
        type(r).from_dict(r.to_dict(all_tensors=False))


def test_threshold_from_the_reference_noise():
    rep = {k: v * (1 + 1e-4 * RNG.standard_normal(v.shape)).astype(np.float32) for k, v in G.items()}
    noise = compare_gradients(rep, G)
    th = ParityThresholds.from_noise(noise)
    assert th.rel_l2 == BF16_RELATIVE_FLOOR and th.noise_rel_l2 == pytest.approx(
        noise.worst_rel_l2
    )  # 10 x noise is below the floor
    th = ParityThresholds.from_noise(0.01)
    assert th.rel_l2 == pytest.approx(0.1) and th.cosine == pytest.approx(1 - 0.01 / 2) and "0.01" in th.source
    bad = compare_gradients({k: v for k, v in G.items() if k != "a.weight"}, G)
    with pytest.raises(TunerError, match="noise measurement"):
        ParityThresholds.from_noise(bad)


def _dump(path, grads, **meta):
    path.mkdir(parents=True)
    (path / "tensors").mkdir()
    t = {}
    for k, v in grads.items():
        np.save(path / "tensors" / f"{k}.npy", v)
        t[k] = {"file": f"tensors/{k}.npy", "shape": list(v.shape), "dtype": "float32"}
    m = {
        "format": GRAD_DUMP_FORMAT,
        "label": path.name,
        "model_fingerprint": "abc",
        "checkpoint": "/ck",
        "batch": {"data_step_offset": 40},
        "tensors": t,
    }
    m.update(meta)
    (path / "index.json").write_text(json.dumps(m))
    return path


def test_grad_dumps_compare_and_refuse_other_models_checkpoints_or_batches(tmp_path):
    ref = _dump(tmp_path / "ref", G)
    cand = _dump(tmp_path / "cand", {**G, "b.norm.weight": 2 * G["b.norm.weight"]})
    r = compare_grad_dumps(cand, ref)
    assert r.failed_metrics == ("relative_l2",) and r.candidate == "cand" and r.reference == "ref"
    with pytest.raises(TunerError, match="same model"):
        compare_grad_dumps(_dump(tmp_path / "other", G, model_fingerprint="zzz"), ref)
    with pytest.raises(TunerError, match="same checkpoint"):
        compare_grad_dumps(_dump(tmp_path / "ck", G, checkpoint="/other"), ref)
    with pytest.raises(TunerError, match="same batch"):
        compare_grad_dumps(_dump(tmp_path / "b", G, batch={"data_step_offset": 0}), ref)
    with pytest.raises(TunerError, match="not a gradient dump"):
        compare_grad_dumps(tmp_path / "nothing", ref)
    blk = parity_block(r, date="2026-12-02", gpu="H200", seconds=12.34)
    assert blk["result"] == "fail" and blk["worst_tensors"][0]["tensor"] == "b.norm.weight" and blk["seconds"] == 12.3
    assert blk["failed_metrics"] == ["relative_l2"]


def test_model_fingerprint_ignores_the_source_text_only():
    m = {"name": "x", "num_layers": 2, "source": "a"}
    assert model_fingerprint(m) == model_fingerprint({**m, "source": "b"}) != model_fingerprint({**m, "num_layers": 3})


# ---- the component test's arithmetic


def test_te_remainders_rebuild_fp32_bit_for_bit():
    x = np.concatenate(
        [
            RNG.standard_normal(100_000).astype(np.float32) * 0.02,
            np.array([0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-40, np.inf, -np.inf], np.float32),
            np.array([0x3F808000, 0xBF808000, 0x3F80FFFF, 0x00008000], np.uint32).view(np.float32),
        ]
    )
    hi, rem = split_fp32(x)
    assert hi.dtype == np.uint16 and rem.dtype == np.int16
    back = reconstruct_fp32(hi, rem)
    assert np.array_equal(back.view(np.uint32), x.view(np.uint32))
    # the bf16 half is the fp32 value rounded to nearest (ties away from zero in the bit pattern)
    fin = np.isfinite(x) & (np.abs(x) < 3e38)
    bits = x.view(np.uint32)[fin]
    lo = ((bits >> 16) << 16).view(np.float32).astype(np.float64)
    up = (((bits >> 16) + 1) << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    b = (hi[fin].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.all(np.abs(b - x[fin]) <= np.abs(up - lo) / 2)
    # dropping the remainders loses the low bits
    assert not np.array_equal(reconstruct_fp32(hi, np.zeros_like(rem)).view(np.uint32), x.view(np.uint32))


def test_adam_reference_one_step_by_hand_and_against_decay_first_form():
    h = AdamHyper(lr=1e-3, beta1=0.9, beta2=0.98, eps=1e-8, weight_decay=0.1)
    p0 = np.array([0.5, -0.25, 0.0])
    g = np.array([1e-3, -2e-2, 0.0])
    (p1,) = adam_reference(p0, [g], h)
    # step 1: m_hat = g, v_hat = g^2 -> update g / (|g| + eps)
    want = p0 - h.lr * (g / (np.abs(g) + h.eps) + h.weight_decay * p0)
    assert np.allclose(p1, want, rtol=0, atol=1e-15)
    # torch.optim.AdamW's order (decay first, then the step) is the same in exact arithmetic
    gs = [RNG.standard_normal(5) * 1e-3 for _ in range(3)]
    p = p0r = RNG.standard_normal(5)
    m = v = np.zeros(5)
    for t, gg in enumerate(gs, 1):
        p = p * (1 - h.lr * h.weight_decay)
        m = h.beta1 * m + (1 - h.beta1) * gg
        v = h.beta2 * v + (1 - h.beta2) * gg * gg
        p = p - h.lr * (m / (1 - h.beta1**t)) / (np.sqrt(v / (1 - h.beta2**t)) + h.eps)
    assert np.allclose(adam_reference(p0r, gs, h)[-1], p, rtol=1e-12, atol=1e-15)
    # clipping scales the gradients; no weight decay for a norm
    (q,) = adam_reference(p0, [g], h, weight_decay=0.0, clip_coeffs=[0.5])
    assert np.allclose(q, p0 - h.lr * (0.5 * g / (np.abs(0.5 * g) + h.eps)), atol=1e-15)


def test_clip_coefficient_is_megatrons():
    assert clip_coefficient(2.0, 1.0) == pytest.approx(1.0 / (2.0 + 1e-6))
    assert clip_coefficient(0.5, 1.0) == 1.0 and clip_coefficient(5.0, 0.0) == 1.0


def _rows(errs, *, bitwise=True, errors=()):
    kinds = {
        "default": "baseline",
        "explicit_masters": "bitwise",
        "gpu": "test",
        "gpu_bf16_moments": "test",
        "offload": "test",
    }
    rows = []
    for arm, by_step in errs.items():
        for s, e in by_step.items():
            rows.append(
                {
                    "event": "arm",
                    "arm": arm,
                    "kind": kinds.get(arm, "control"),
                    "step": s,
                    "worst_rel_l2": e,
                    "worst_tensor": f"{arm}.w",
                }
            )
    for s in (1, 3):
        rows.append(
            {
                "event": "bitwise",
                "arm": "gpu",
                "against": "explicit_masters",
                "step": s,
                "identical": bitwise,
                "mismatched": 0 if bitwise else 7,
                "elements": 100,
            }
        )
    for arm in errors:
        rows.append({"event": "arm_error", "arm": arm, "message": "RuntimeError: boom"})
    return rows


GOOD = {
    "default": {1: 1e-7, 3: 5e-5},
    "explicit_masters": {1: 1e-7, 3: 5e-5},
    "gpu": {1: 2e-7, 3: 6e-5},
    "gpu_bf16_moments": {1: 2e-7, 3: 4e-3},
    "offload": {1: 3e-7, 3: 8e-5},
    "control_remainders_dropped": {1: 0.4, 3: 0.5},
    "control_wrong_eps": {1: 0.02, 3: 0.03},
    "control_wrong_beta2": {1: 1e-7, 3: 0.05},
    "control_bf16_masters": {1: 0.6, 3: 0.7},
}


def test_component_decision_pass_and_the_seed_form():
    r = decide_component_test(_rows(GOOD))
    assert (
        r.passed
        and r.bound == {1: component_bound(1e-7), 3: component_bound(5e-5)}
        and r.bound[3] == pytest.approx(1.1e-3)
    )
    assert (
        r.arms["control_wrong_beta2"]["verdict"] == "failed as expected"
        and "after 3 steps" in r.arms["control_wrong_beta2"]["why"]
    )
    assert (
        r.arms["gpu_bf16_moments"]["verdict"] == "fail" and r.arms["gpu_bf16_moments"]["required"] is False
    )  # reported, not deciding
    e = r.entry(shape="one MoE layer", gpu="H200", date="2026-12-02")
    assert set(e) == {"test", "shape", "gpu", "date", "result", "detail", "note"} and e["result"] == "pass"
    assert "bitwise identical" in e["detail"] and "negative controls" in e["detail"]
    # with bf16 moments in the recipe, their arm decides
    assert not decide_component_test(_rows(GOOD), required_moments=("fp32", "bf16")).passed


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"control_wrong_eps": {1: 2e-7, 3: 6e-5}, "control_wrong_beta2": {1: 1e-7, 3: 6e-5}},
            "no negative control of class hyperparameter failed",
        ),
        ({"control_remainders_dropped": {1: 2e-7, 3: 6e-5}}, "no negative control of class remainders failed"),
        ({"control_bf16_masters": {1: 2e-7, 3: 6e-5}}, "no negative control of class masters failed"),
        ({"offload": {1: 3e-7, 3: 5e-3}}, "arm offload: fail"),
    ],
)
def test_component_decision_fails_when_a_control_passes_or_an_arm_is_off(change, problem):
    r = decide_component_test(_rows({**GOOD, **change}))
    assert not r.passed and any(problem in p for p in r.problems)


def test_one_wrong_hyperparameter_caught_is_enough_and_the_other_is_reported():
    # The controls: "a wrong epsilon or beta". On the H200 (2026-12-01) beta2 0.95 for 0.98 stayed within the
    # bound after 3 steps while epsilon 1e-6 failed at once: the test passes and says which control did not fail.
    r = decide_component_test(_rows({**GOOD, "control_wrong_beta2": {1: 1e-7, 3: 6e-5}}))
    assert (
        r.passed
        and r.arms["control_wrong_beta2"]["verdict"] == "did not fail"
        and r.arms["control_wrong_eps"]["verdict"] == "failed as expected"
    )
    assert r.arms["control_wrong_beta2"]["detects"] == "hyperparameter"


def test_component_decision_bitwise_mismatch_errors_and_missing_default():
    assert not decide_component_test(_rows(GOOD, bitwise=False)).passed
    errs = {k: v for k, v in GOOD.items() if k != "control_wrong_eps"}
    r = decide_component_test(_rows(errs, errors=("control_wrong_eps",)))
    assert not r.passed and r.arms["control_wrong_eps"]["verdict"] == "error" and "could not run" in r.problems[0]
    with pytest.raises(TunerError, match="default GPU optimizer"):
        decide_component_test(_rows({k: v for k, v in GOOD.items() if k != "default"}))


# ---- the recipe block


CONV = {
    "result": "pass",
    "summary": "passed",
    "reference": "TP1 PP1",
    "convergence": {"steps": 20, "result": "pass", "correlation": 0.9998},
}


def test_correctness_block_verified_needs_both_checks():
    good_par = compare_gradients(G, G)
    b = correctness_block(convergence=CONV, grad_parity=good_par, component_tests=[{"test": "t", "result": "pass"}])
    assert b["result"] == "pass" and b["convergence"]["correlation"] == 0.9998 and b["grad_parity"]["result"] == "pass"
    assert (
        b["reference"] == "TP1 PP1"
        and b["component_tests"][0]["test"] == "t"
        and "1 of 1 component test passed" in b["summary"]
    )
    only = correctness_block(convergence=CONV)
    assert only["result"] == "incomplete" and "gradient parity" in only["note"]
    bad_par = compare_gradients({**G, "b.norm.weight": 2 * G["b.norm.weight"]}, G)
    assert correctness_block(convergence=CONV, grad_parity=bad_par)["result"] == "fail"
    assert (
        correctness_block(convergence=CONV, grad_parity=good_par, component_tests=[{"result": "fail"}])["result"]
        == "fail"
    )
    assert correctness_block(convergence={**CONV, "result": "error"}, grad_parity=good_par)["result"] == "error"


def test_a_recipe_with_both_checks_is_verified():
    from cost_model.estimate import estimate
    from launch import exporters as export
    from launch.base import Measurement
    from specs import Workload, load_model, parse_gpus
    from specs.layout import Layout
    from specs.model import slice_model

    m, c, w = (
        slice_model(load_model("MiniMax-M2"), 1),
        parse_gpus("1xH200"),
        Workload(seq_length=8192, global_batch_size=8),
    )
    lay = Layout(world_size=1)
    meas = Measurement(
        layout=lay, source="measured", tokens_per_s_per_gpu=30000.0, peak_bytes=100 * 2**30, step_times_s=(1.0, 1.0)
    )
    blk = correctness_block(convergence=CONV, grad_parity=compare_gradients(G, G))
    rec = export.recipe_dict(
        m, c, w, lay, estimate=estimate(m, c, w, lay), measurement=meas, study="s", correctness=blk
    )
    export.validate_recipe(rec)
    assert rec["status"] == "verified" and rec["correctness"]["grad_parity"]["result"] == "pass"
    rec = export.recipe_dict(
        m,
        c,
        w,
        lay,
        estimate=estimate(m, c, w, lay),
        measurement=meas,
        study="s",
        correctness=correctness_block(convergence=CONV),
    )
    assert rec["status"] == "measured"
