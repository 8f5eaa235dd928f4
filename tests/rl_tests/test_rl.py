"""RL step model: lengths, the continuous-batching simulator, the step formula, plans, validate and calibrate
readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl.calibrate import fit_from_measured, mean_measured, read_log
from rl.calibration import DEFAULT_RL_CALIBRATION, load_rl_calibration, save_rl_calibration
from rl.engine import EngineShape, LatencyTable
from rl.layouts import parse_engine_layout, parse_trainer_layout
from rl.lengths import LengthDistribution
from rl.plan import PlanChoice, RLJob, enumerate_plans, evaluate, kv_capacity_tokens
from rl.simulator import simulate_engine, simulate_rollout
from rl.step import compose_step
from rl.trainer import TrainerBackend, rl_workload, trainer_for_layout
from rl.validate import read_runs
from specs import load_model, parse_gpus
from specs.errors import TunerError

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def const_table(decode_s: float = 1e-3, prefill_per_token_s: float = 0.0) -> LatencyTable:
    return LatencyTable.from_functions(lambda n, c: decode_s, lambda t: prefill_per_token_s * t, max_ctx=65536)


# ---------------------------------------------------------------- lengths


def test_gamma_lengths_hit_the_mean_and_the_cap():
    d = LengthDistribution.from_mean_max(3072, 6144)
    assert d.mean == pytest.approx(3072, rel=0.01)
    assert d.max == 6144 and 0 < d.probs[-1] < 0.5  # the share cut at the cap
    x = d.draw(512, seed=3)
    assert x.max() <= 6144 and abs(x.mean() - 3072) / 3072 < 0.03
    assert np.array_equal(x, d.draw(512, seed=3))


def test_lengths_from_histogram_csv(tmp_path):
    f = tmp_path / "h.csv"
    f.write_text("response_len,count\n100,3\n300,1\n")
    d = LengthDistribution.from_file(f)
    assert d.mean == pytest.approx(150)
    assert d.max == 300
    assert LengthDistribution.from_file(f, max_len=200).max == 200


@pytest.mark.parametrize("text", ["response_len,count\nabc,1\n", "length\n0\n", "hello\n"])
def test_bad_histogram_is_one_error(tmp_path, text):
    f = tmp_path / "h.txt"
    f.write_text(text)
    with pytest.raises(TunerError):
        LengthDistribution.from_file(f)


def test_mean_at_or_above_the_cap_is_refused():
    with pytest.raises(TunerError, match="below --response-len"):
        LengthDistribution.from_mean_max(6144, 6144)


# ---------------------------------------------------------------- simulator


def test_makespan_of_a_known_schedule():
    # 10 requests of 100 tokens, 1 ms per iteration whatever the batch: all at once = 100 iterations;
    # 5 at a time = two waves = 200 iterations.
    p, r = np.full(10, 10), np.full(10, 100)
    run = simulate_engine(p, r, const_table(), kv_capacity_tokens=10**6, max_num_seqs=100)
    assert run.makespan_s == pytest.approx(0.100) and run.iterations == 100 and run.preemptions == 0
    run = simulate_engine(p, r, const_table(), kv_capacity_tokens=10**6, max_num_seqs=5)
    assert run.makespan_s == pytest.approx(0.200) and run.peak_running == 5


def test_longest_request_sets_the_makespan_and_prefill_adds():
    p = np.array([10, 10, 10])
    r = np.array([5, 50, 500])
    run = simulate_engine(p, r, const_table(1e-3, 1e-4), kv_capacity_tokens=10**6, max_num_seqs=10)
    assert run.iterations == 500
    assert run.prefill_s == pytest.approx(30 * 1e-4)
    assert run.makespan_s == pytest.approx(0.5 + 30e-4)


def test_tpot_counts_the_prefills_that_stall_a_request():
    # two slots; request 2 waits for request 1 (10 tokens) and its 100-token prefill (10 ms) stalls
    # request 0 (300 tokens): TPOT(0) = (330 - 21) ms / 299, the short ones 1 ms each.
    p, r = np.array([100, 100, 100]), np.array([300, 10, 10])
    run = simulate_engine(p, r, const_table(1e-3, 1e-4), kv_capacity_tokens=10**6, max_num_seqs=2)
    assert run.makespan_s == pytest.approx(0.330)
    assert run.mean_tpot_s == pytest.approx((0.309 / 299 + 1e-3 + 1e-3) / 3)
    # without stalls (prefill free, one wave) TPOT is the iteration latency
    even = simulate_engine(np.full(4, 8), np.full(4, 50), const_table(2e-3), kv_capacity_tokens=10**6, max_num_seqs=8)
    assert even.mean_tpot_s == pytest.approx(2e-3)


def test_kv_pressure_preempts_and_recomputes():
    p, r = np.full(10, 10), np.full(10, 100)
    free = simulate_engine(p, r, const_table(), kv_capacity_tokens=10**6, max_num_seqs=100, block_size=1)
    tight = simulate_engine(p, r, const_table(), kv_capacity_tokens=700, max_num_seqs=100, block_size=1)
    assert free.preemptions == 0
    assert tight.preemptions > 0
    assert tight.makespan_s > free.makespan_s
    assert tight.generated_tokens == free.generated_tokens == 1000


def test_request_larger_than_the_kv_cache_is_refused():
    with pytest.raises(TunerError, match="does not fit"):
        simulate_engine(np.array([100]), np.array([1000]), const_table(), kv_capacity_tokens=500, max_num_seqs=8)


def test_rollout_ends_with_its_slowest_engine():
    p = np.full(4, 1)
    r = np.array([10, 10, 10, 400])
    run = simulate_rollout(p, r, const_table(), num_engines=2, kv_capacity_tokens=10**6, max_num_seqs=8)
    assert run.makespan_s == pytest.approx(0.400)
    assert [e.iterations for e in run.engines] == [10, 400]


def test_latency_table_interpolates_and_extrapolates():
    t = LatencyTable.from_functions(lambda n, c: 1e-3 * n + 1e-6 * c, lambda tok: 1e-5 * tok, max_ctx=8192)
    assert t.decode_s(48, 1500) == pytest.approx(1e-3 * 48 + 1e-6 * 1500, rel=1e-6)
    assert t.decode_s(4096, 1024) == pytest.approx(1e-3 * 4096 + 1e-6 * 1024, rel=1e-6)
    assert t.prefill_s(3000) == pytest.approx(0.03, rel=1e-6)


# ---------------------------------------------------------------- step model


def test_colocated_step_is_the_sum():
    s = compose_step(
        generation_s=100, logprob_s=10, training_s=40, refit_s=5, switch_s=8, overhead_s=2, colocated=True,
        async_steps=0,
    )
    assert s.step_time_s == pytest.approx(165)


def test_async_step_overlaps_and_sync_split_has_the_bubble():
    kw = {
        "generation_s": 100,
        "logprob_s": 10,
        "training_s": 40,
        "refit_s": 5,
        "switch_s": 8,
        "overhead_s": 2,
        "colocated": False,
    }
    assert compose_step(**kw, async_steps=0).step_time_s == pytest.approx(157)  # no switch when split
    a = compose_step(**kw, async_steps=1)
    assert a.step_time_s == pytest.approx(107) and a.bound == "generation"
    kw["training_s"] = 200
    assert compose_step(**kw, async_steps=1).step_time_s == pytest.approx(217)


def test_colocated_async_is_refused():
    with pytest.raises(TunerError, match="non-colocated"):
        compose_step(
            generation_s=1, logprob_s=1, training_s=1, refit_s=1, switch_s=1, overhead_s=0, colocated=True,
            async_steps=1,
        )


# ---------------------------------------------------------------- plans (synthetic engine latency, no aiconfigurator)


def _job(**kw):
    base = dict(
        model=load_model("Qwen3-30B-A3B"), cluster=parse_gpus("4x8xH100"), prompt_len=256, response_len=4096,
        mean_prompt_len=150, responses=LengthDistribution.from_mean_max(2000, 4096), prompts_per_step=16,
        generations_per_prompt=16,
    )
    base.update(kw)
    return RLJob(**base)


def _latency(job, shape):
    # 8 ms per iteration at TP1, less with more GPUs; grows with batch and context
    return LatencyTable.from_functions(
        lambda n, c: (8e-3 + 2e-5 * n + 1e-9 * n * c) / shape.gpus**0.5,
        lambda t: 2e-5 * t / shape.gpus,
        max_ctx=job.max_total_len,
    )


def test_plans_are_ranked_and_the_fastest_per_rollout_gpus_covers_every_split():
    ps = enumerate_plans(_job(), latency=_latency, max_num_seqs=(256,), enforce_eager=(False,))
    times = [p.step_time_s for p in ps.plans]
    assert times == sorted(times)
    splits = {(p.choice.colocated, p.choice.rollout_gpus) for p in ps.fastest_per_rollout_gpus()}
    assert (True, 32) in splits and {
        (False, 16),
        (False, 24),
    } <= splits  # 8 + 24: no trainer layout divides 256 sequences over 24 GPUs
    assert any("trainer" in k for k in ps.rejected)
    best = ps.plans[0]
    assert best.parts.generation_s > 0 and best.parts.training_s > 0


def test_fastest_per_async_depth_is_monotone_for_a_generation_bound_job():
    ps = enumerate_plans(
        _job(), latency=_latency, colocated=False, async_steps=2, max_num_seqs=(256,), enforce_eager=(False,)
    )
    front = ps.fastest_per_async_depth()
    assert [p.choice.async_steps for p in front] == [0, 1, 2]
    assert front[1].step_time_s < front[0].step_time_s


def test_eager_costs_the_calibrated_slowdown_on_generation():
    job = _job()
    wl = rl_workload(sequences=job.sequences, mean_total_len=2150, max_total_len=job.max_total_len)
    sub = parse_gpus("2x8xH100")
    tr = trainer_for_layout(job.model, sub, wl, TrainerBackend.megatron, ep=8)
    kw = dict(
        colocated=False,
        rollout_gpus=16,
        trainer_gpus=16,
        shape=EngineShape(tp=2),
        gpu_memory_utilization=0.8,
        max_num_seqs=256,
    )
    g = evaluate(job, PlanChoice(**kw, enforce_eager=False), trainer=tr, latency=_latency).parts.generation_s
    e = evaluate(job, PlanChoice(**kw, enforce_eager=True), trainer=tr, latency=_latency).parts.generation_s
    assert e / g == pytest.approx(DEFAULT_RL_CALIBRATION.eager_slowdown, rel=1e-9)


def test_kv_capacity_falls_to_zero_when_weights_do_not_fit():
    m = load_model("MiniMax-M3")
    cl = parse_gpus("2x8xH200")
    assert kv_capacity_tokens(m, cl, EngineShape(tp=8, ep=8), 0.3, True) == 0
    assert kv_capacity_tokens(m, cl, EngineShape(tp=16, ep=16), 0.8, True) > 1_000_000


def test_response_longer_than_the_max_sequence_is_refused():
    with pytest.raises(TunerError, match="max-seq-len"):
        _job(max_seq_len=4000)


def test_rollout_gpus_beyond_the_cluster_are_refused():
    with pytest.raises(TunerError, match="rollout-gpus"):
        enumerate_plans(_job(), latency=_latency, colocated=False, rollout_gpus=[64])


# ---------------------------------------------------------------- layouts, runs table, logs


def test_layout_strings():
    t = parse_trainer_layout("megatron:tp=2,cp=2,ep=16,pp=8,vpp=1")
    assert (t.backend, t.tp, t.cp, t.ep, t.pp) == (TrainerBackend.megatron, 2, 2, 16, 8)
    assert parse_trainer_layout("automodel:cp=8,ep=128").ep == 128
    e = parse_engine_layout("vllm:tp=16,ep=16,pp=1,gpu_memory_utilization=0.8,enforce_eager=1")
    assert e.shape.gpus == 16 and e.enforce_eager and e.gpu_memory_utilization == 0.8
    assert parse_engine_layout("sglang:tp=1,ep=8").shape.attention_dp == 8
    for bad in ("megatron tp=2", "megatron:tp=two", "vllm:tq=2", "automodel:tp=2,cp=8"):
        with pytest.raises(TunerError):
            parse_trainer_layout(bad) if not bad.startswith("vllm") else parse_engine_layout(bad)


def test_published_runs_table_reads_whole():
    rows, errors = read_runs(ROOT / "benchmarks" / "data" / "rl_runs.csv")
    assert not errors and len(rows) == 49
    assert {r.source for r in rows} == {"nemo-rl-v0.4", "nemo-rl-v0.5", "nemo-rl-v0.6"}
    r = next(
        r
        for r in rows
        if r.source == "nemo-rl-v0.6" and r.model == "Qwen3-235B-A22B" and r.num_gpus == 256 and not r.colocated
    )
    assert (r.step_time_s, r.rollout_gpus, r.rollout.shape.tp, r.trainer.tp) == (231, 128, 8, 4)
    # the FP8 tables' rows (generation FP8, training FP8 blockwise); every other row is BF16 (blank columns)
    fp8 = [r for r in rows if r.generation_precision.value == "fp8"]
    assert [(r.source, r.step_time_s, r.rollout.max_num_seqs, r.training_precision.value) for r in fp8] == [
        ("nemo-rl-v0.5", 67.6, 32, "fp8_blockwise"),
        ("nemo-rl-v0.6", 59.2, 32, "fp8_blockwise"),
    ]
    assert all(
        r.generation_precision.value == "bf16" and r.training_precision.value == "bf16" for r in rows if r not in fp8
    )


def test_bad_rows_are_named_and_good_rows_still_read(tmp_path):
    text = (ROOT / "benchmarks" / "data" / "rl_runs.csv").read_text().splitlines()
    bad = text[1].replace("megatron:tp=1", "megatron:tp=x", 1)
    bad2 = text[2].split(",")
    bad2[17] = "fast"
    f = tmp_path / "runs.csv"
    f.write_text("\n".join([text[0], bad, ",".join(bad2), text[3]]) + "\n")
    rows, errors = read_runs(f)
    assert len(rows) == 1 and len(errors) == 2
    assert "line 2" in errors[0] and "trainer_layout" in errors[0]
    assert "line 3" in errors[1]


def test_step_times_must_be_positive_finite_numbers(tmp_path):
    import csv

    src = list(csv.DictReader((ROOT / "benchmarks" / "data" / "rl_runs.csv").open()))
    f = tmp_path / "runs.csv"
    with f.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(src[0]))
        w.writeheader()
        for v in ("0", "-5", "nan", "inf"):
            w.writerow({**src[0], "step_time_s": v})
        w.writerow(src[0])
    rows, errors = read_runs(f)
    assert len(rows) == 1 and len(errors) == 4
    assert all(
        f"line {i + 2}: column step_time_s: cannot read {v!r} (a positive finite number)" == e
        for i, (v, e) in enumerate(zip(("0", "-5", "nan", "inf"), errors))
    )


def test_missing_columns_are_listed(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("source,model\nx,y\n")
    with pytest.raises(TunerError, match="missing columns.*framework"):
        read_runs(f)


def test_nemo_rl_log_reader():
    steps = read_log(FIX / "rl_logs" / "nemo_rl_grpo_sync.log")
    assert [s.step_time_s for s in steps] == [300.0, 250.0, 254.0]
    assert steps[0].generation_s == 200.0 and steps[0].refit_s == 10.0 and steps[2].mean_generation_len == 3200.0
    m = mean_measured(steps)
    assert m["step_time_s"] == pytest.approx(252.0) and m["training_s"] == pytest.approx(46.0)


def test_slime_log_reader():
    steps = read_log(FIX / "rl_logs" / "slime_train.log")
    assert [s.step for s in steps] == [0, 1]
    s = steps[0]
    assert (s.step_time_s, s.generation_s, s.training_s, s.logprob_s, s.refit_s, s.switch_s) == (
        183.0, 120.0, 40.0, 10.0, 6.0, 5.0,
    )


def test_log_without_timing_is_one_error(tmp_path):
    f = tmp_path / "x.log"
    f.write_text("hello\n")
    with pytest.raises(TunerError, match="no step timing"):
        read_log(f)


def test_calibration_from_measured_parts_reproduces_them(tmp_path):
    job = _job()
    wl = rl_workload(sequences=job.sequences, mean_total_len=2150, max_total_len=job.max_total_len)
    tr = trainer_for_layout(job.model, parse_gpus("2x8xH100"), wl, TrainerBackend.megatron, ep=8)
    choice = PlanChoice(
        colocated=False,
        rollout_gpus=16,
        trainer_gpus=16,
        shape=EngineShape(tp=2),
        gpu_memory_utilization=0.8,
        max_num_seqs=256,
        enforce_eager=False,
    )
    before = evaluate(job, choice, trainer=tr, latency=_latency)
    measured = {
        "step_time_s": 400.0,
        "generation_s": 2 * before.parts.generation_s,
        "training_s": 1.5 * before.parts.training_s,
        "logprob_s": before.parts.logprob_s,
        "refit_s": 3.0,
        "switch_s": None,
    }
    cal = fit_from_measured(before, measured, DEFAULT_RL_CALIBRATION, source="test")
    after = evaluate(job, choice, trainer=tr, latency=_latency, calibration=cal)
    assert after.parts.generation_s == pytest.approx(measured["generation_s"], rel=1e-6)
    assert after.parts.training_s == pytest.approx(measured["training_s"], rel=1e-6)
    assert after.parts.refit_s == pytest.approx(3.0, rel=1e-6)
    assert after.step_time_s == pytest.approx(400.0, rel=1e-6)
    f = tmp_path / "cal.yaml"
    f.write_text(save_rl_calibration(cal))
    assert load_rl_calibration(f) == cal


@pytest.mark.slow
def test_aiconfigurator_path_on_a_small_case(tmp_path, monkeypatch):
    # not skipped: the `test` extra pins aiconfigurator==0.12.0 (as the `rl` extra does), so CI runs this path
    import importlib.util

    assert importlib.util.find_spec("aiconfigurator_core") is not None, (
        "install the test extra: pip install -e '.[test]' (it pins aiconfigurator==0.12.0)"
    )
    from rl.engine import Engine, GenerationPrecision, aiconfigurator_latency_table

    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path))
    t = aiconfigurator_latency_table("Qwen3-30B-A3B", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    assert 0 < t.decode_s(1, 1024) < t.decode_s(256, 1024) < 1.0
    assert t.prefill_s(2048) > t.prefill_s(256) > 0
    assert list(tmp_path.glob("aic-*.npz"))
    again = aiconfigurator_latency_table("Qwen3-30B-A3B", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    assert np.array_equal(again.decode, t.decode)
    with pytest.raises(TunerError, match="supported: MiniMax-M3"):
        aiconfigurator_latency_table("my-own-model", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    # gpt-oss has MXFP4 experts only: BF16 is refused naming the precision, its checkpoint precision is timed
    with pytest.raises(TunerError, match="no bf16 vllm data for openai/gpt-oss-120b"):
        aiconfigurator_latency_table("GPT-OSS-120B", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    mx = aiconfigurator_latency_table(
        "GPT-OSS-120B", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096, precision=GenerationPrecision.checkpoint
    )
    assert 0 < mx.decode_s(4, 1024) < 0.05 and "checkpoint" in mx.source
    with pytest.raises(TunerError, match="GPUs with vllm data"):
        aiconfigurator_latency_table("Qwen3-30B-A3B", "H20", Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    # DeepSeek-V3: only FP8-block expert tables; a BF16 engine is refused saying so, an FP8 one is timed
    with pytest.raises(TunerError, match="own checkpoint is FP8 .* a BF16 run is not predicted"):
        aiconfigurator_latency_table("DeepSeek-V3", "H100", Engine.vllm, EngineShape(tp=16), max_ctx=1536)
    # the refusal is cached too: the next run answers it without aiconfigurator
    import rl.engine as eng

    assert len(list(tmp_path.glob("aic-*.nodata.txt"))) == 2  # gpt-oss BF16 above, DeepSeek-V3 BF16 here
    monkeypatch.setattr(eng, "_handle", lambda *a: pytest.fail("asked aiconfigurator again"))
    with pytest.raises(TunerError, match="own checkpoint is FP8"):
        aiconfigurator_latency_table("DeepSeek-V3", "H100", Engine.vllm, EngineShape(tp=16), max_ctx=1536)
    monkeypatch.undo()
    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path))
    fp8 = aiconfigurator_latency_table(
        "DeepSeek-V3", "H100", Engine.vllm, EngineShape(tp=16), max_ctx=1536, precision=GenerationPrecision.fp8
    )
    assert "deepseek-ai/DeepSeek-V3 fp8" in fp8.source and 0 < fp8.decode_s(32, 1000) < 0.2
    # Qwen3's FP8 engine is aiconfigurator's -FP8 checkpoint (its own tables: slower than BF16 at batch 1 in 0.12.0),
    # cached apart
    q8 = aiconfigurator_latency_table(
        "Qwen3-30B-A3B", "H200", Engine.vllm, EngineShape(tp=1), max_ctx=4096, precision=GenerationPrecision.fp8
    )
    assert (
        "Qwen/Qwen3-30B-A3B-FP8 fp8" in q8.source
        and not np.array_equal(q8.decode, t.decode)
        and len(list(tmp_path.glob("aic-*.npz"))) >= 3
    )


def test_missing_aiconfigurator_names_the_extra(monkeypatch, tmp_path):
    import rl.engine as eng

    def no_module(name):
        raise ImportError(name)

    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(eng.importlib, "import_module", no_module)
    monkeypatch.setattr(eng, "_systems_with_data", lambda engine: None)
    eng._handle.cache_clear()
    with pytest.raises(TunerError, match=r"megatron-layout-tuner\[rl\]"):
        eng.aiconfigurator_latency_table("Qwen3-30B-A3B", "H200", eng.Engine.vllm, EngineShape(tp=1), max_ctx=4096)
    eng._handle.cache_clear()


def test_shared_fixed_cost_fit_recovers_known_factors():
    import dataclasses

    from rl.calibration import DEFAULT_RL_CALIBRATION
    from rl.validate import fit_calibrations, predict_rows, recalibrate

    rows, _ = read_runs(ROOT / "benchmarks" / "data" / "rl_runs.csv")
    pick = [r for r in rows if r.source == "nemo-rl-v0.5" and r.model in ("Qwen3-30B-A3B", "Llama-3.1-8B", "Qwen3-32B")]
    assert {r.gpu for r in pick} == {"H100", "GB200"} and len(pick) == 12
    res = predict_rows(pick, latency=_latency)
    assert all(r.plan is not None for r in res)
    truth = {
        "H100": DEFAULT_RL_CALIBRATION.replace(
            generation_scale=1.3, training_scale=0.8, logprob_scale=0.8, switch_fixed_s=25.0, step_overhead_s=9.0
        ),
        "GB200": DEFAULT_RL_CALIBRATION.replace(
            generation_scale=2.0, training_scale=1.1, logprob_scale=1.1, switch_fixed_s=25.0, step_overhead_s=9.0
        ),
    }
    measured = [
        dataclasses.replace(
            r, row=dataclasses.replace(r.row, step_time_s=recalibrate(r.plan, DEFAULT_RL_CALIBRATION, truth[r.row.gpu]))
        )
        for r in res
    ]
    fitted = fit_calibrations(measured)
    assert set(fitted) == {"H100", "GB200"}
    assert fitted["H100"].switch_fixed_s == fitted["GB200"].switch_fixed_s  # one pair of fixed costs
    for r in measured:
        assert recalibrate(r.plan, DEFAULT_RL_CALIBRATION, fitted[r.row.gpu]) == pytest.approx(
            r.row.step_time_s, rel=0.02
        )
    assert fitted["GB200"].generation_scale == pytest.approx(2.0, rel=0.1) and fitted[
        "H100"
    ].training_scale == pytest.approx(0.8, rel=0.1)
