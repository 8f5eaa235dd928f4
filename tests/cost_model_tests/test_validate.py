"""tune validate / tune calibrate, the run-table reader, and the issue-3 presets and options."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cost_model.calibration import load_calibration
from cost_model.estimate import estimate
from cost_model.validate import predict_runs, read_runs
from specs import Precision, RunOptions, Workload, load_gpu, load_model, parse_gpus
from specs.layout import Layout
from tuner.cli import app

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "cost_model" / "data" / "seed_runs.csv"
HEADER = SEED.read_text().splitlines()[0]
ROW = ",".join(
    [
        "7", "src", "Megatron-Bridge / NeMo container 26.04", "Pre-Training", "LLAMA3_8B", "N", "H100", "8", "1", "1",
        "", "1", "1", "", "8", "", "1", "128", "", "8192", "FP8", "", "", "", "", "14000", "reported", "700",
        "reported", "", "51.5", "high",
    ]
)
runner = CliRunner()


def _csv(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    p = tmp_path / "runs.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


PUBLISHED = ROOT / "benchmarks" / "data" / "published_runs.csv"


def _published(*ids: str) -> list[dict[str, str]]:
    """Copies of the published table's rows with these ids, in the table's order."""
    return [dict(r) for r in csv.DictReader(PUBLISHED.open(encoding="utf-8-sig")) if r["id"] in ids]


def _table(tmp_path: Path, rows: list[dict[str, str]], encoding: str = "utf-8") -> Path:
    """``rows`` written as a run table (the published table's columns) at ``tmp_path / "runs.csv"``."""
    p = tmp_path / "runs.csv"
    with p.open("w", encoding=encoding, newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    return p


def test_validate_good_and_bad_rows(tmp_path):
    bad_gpu = ROW.replace(",H100,", ",H900,").replace("7,src", "8,src", 1)
    bad_num = ROW.replace(",8192,", ",eight,").replace("7,src", "9,src", 1)
    hybrid = ROW.replace("LLAMA3_8B", "Nemotron_3_Nano").replace("7,src", "10,src", 1)
    r = runner.invoke(app, ["validate", "--data", str(_csv(tmp_path, ROW, bad_gpu, bad_num, hybrid))])
    assert r.exit_code == 0, r.output
    assert "row 2 (id 8), column 'gpu_type'" in r.output and "H900" in r.output
    assert "row 3 (id 9), column 'seq_len'" in r.output and "'eight' is not a number" in r.output
    assert "Mamba" in r.output  # listed with its reason, not dropped
    assert "Llama-3.1-8B" in r.output and "Traceback" not in r.output


def test_a_row_with_more_or_fewer_cells_than_the_header_is_left_out_named(tmp_path):
    """csv.DictReader pads a short row with blanks and sets a long row's surplus apart: either would read shifted
    or missing settings as defaults, so the row is left out with its cell count."""
    n = len(ROW.split(","))
    long_row = ROW.replace("7,src", "13,src", 1) + ",surplus"
    short_row = ",".join(ROW.replace("7,src", "14,src", 1).split(",")[:-2])
    r = runner.invoke(app, ["validate", "--data", str(_csv(tmp_path, long_row, ROW, short_row))])
    assert r.exit_code == 0, r.output
    assert f"row 1 (id 13), column '(row)': {n + 1} cells where the header has {n}" in r.output
    assert f"row 3 (id 14), column '(row)': {n - 2} cells where the header has {n}" in r.output
    assert "1 runs estimated" in r.output and "Traceback" not in r.output


def test_validate_missing_column_and_nothing_usable(tmp_path):
    r = runner.invoke(app, ["validate", "--data", str(_csv(tmp_path, "1,2", header="model,tp"))])
    assert r.exit_code == 2 and "missing column(s) gpu_type" in r.output
    r = runner.invoke(app, ["validate", "--data", str(_csv(tmp_path, ROW.replace(",H100,", ",H900,")))])
    assert r.exit_code == 2 and "no usable row" in r.output
    r = runner.invoke(app, ["validate", "--data", str(tmp_path / "nope.csv")])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_seed_rows_match_the_anchor_estimates(minimax, h200x64, seed_workload, seed_tuned):
    runs, problems = read_runs(SEED)
    assert not problems and all(not r.unrepresentable for r in runs)
    tuned = runs[0]
    assert tuned.layout == seed_tuned and tuned.options == RunOptions()
    assert tuned.model == minimax and tuned.workload == seed_workload


def test_calibrate_writes_a_loadable_file_with_provenance(tmp_path):
    out = tmp_path / "cal.yaml"
    r = runner.invoke(app, ["calibrate", "--data", str(SEED), "--out", str(out), "--max-nfev", "5"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["provenance"]["runs_fitted"] == 2 and doc["constants"]
    assert "the fit is underdetermined" in r.output  # 2 runs for more constants than that
    cal = load_calibration(out)
    assert all(getattr(cal, k) == pytest.approx(v) for k, v in doc["constants"].items())
    r = runner.invoke(app, ["calibrate", "--out", str(out)])
    assert r.exit_code == 2 and "--data" in r.output


def test_new_presets_and_gpus():
    m3 = load_model("MiniMax-M3")
    assert (m3.num_layers, m3.num_dense_layers, m3.num_experts, m3.moe_router_topk) == (60, 3, 128, 4)
    assert m3.moe_shared_expert_intermediate_size == 3072 and m3.ffn_hidden_size == 12288 and m3.num_query_groups == 4
    for name in ("Kimi-K2", "Mixtral-8x22B", "GPT-OSS-120B", "Llama-3.1-405B"):
        assert load_model(name).source
    gb300 = load_gpu("GB300")
    assert gb300.nvlink_domain == 72 and gb300.peak_flops(Precision.nvfp4) > gb300.peak_flops(Precision.mxfp8) > 0
    assert load_gpu("H100").peak_flops(Precision.mxfp8) == 0  # MX formats need Blackwell


def test_precision_changes_rate_and_weight_memory():
    m = load_model("Llama-3.1-8B")
    c = parse_gpus("8xB200")
    lay = Layout(world_size=8)
    e = {p: estimate(m, c, Workload(precision=p, global_batch_size=64), lay) for p in ("bf16", "fp8", "mxfp8", "nvfp4")}
    assert e["bf16"].memory["weights"] < e["fp8"].memory["weights"] < e["mxfp8"].memory["weights"]
    assert e["bf16"].step_time_s > e["fp8"].step_time_s


def test_run_options_move_the_prediction_the_right_way(minimax, h200x64, seed_workload, seed_tuned):
    base = estimate(minimax, h200x64, seed_workload, seed_tuned)
    balanced = estimate(
        minimax, h200x64, seed_workload, seed_tuned, options=RunOptions(moe_router_force_load_balancing=True)
    )
    overlap = estimate(
        minimax,
        h200x64,
        seed_workload,
        seed_tuned,
        options=RunOptions(overlap_moe_expert_parallel_comm=True, overlap_grad_reduce=True),
    )
    graphs = estimate(
        minimax, h200x64, seed_workload, seed_tuned, options=RunOptions(cuda_graph_scope=("full_iteration",))
    )
    for other in (balanced, overlap, graphs):
        assert other.step_time_s <= base.step_time_s
    with pytest.raises(ValueError):
        RunOptions(cp_comm_type="ring")


@pytest.mark.slow
def test_the_blackwell_ultra_factor_is_fitted_only_beside_other_blackwell_rows(tmp_path):
    """On B300 / GB300 rows alone the Ultra factor and Blackwell's multiply the same peaks: only Blackwell's is
    fitted."""
    import csv

    from cost_model.calibrate import fit_calibration

    src = Path(__file__).parents[2] / "benchmarks" / "data" / "published_runs.csv"
    with src.open() as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0])

    def fitted(gpus: set[str]) -> tuple[str, ...]:
        out = tmp_path / f"{'-'.join(sorted(gpus))}.csv"
        with out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(r for r in rows if r["gpu_type"] in gpus and r["model"] == "LLAMA3_8B")  # 2 GB300 rows, 4 GB200
        runs, _ = read_runs([str(out)])
        return fit_calibration(runs, max_nfev=2).fitted

    only_ultra = fitted({"GB300"})
    assert "gemm_family_factor_blackwell" in only_ultra and "gemm_generation_factor_blackwell_ultra" not in only_ultra
    assert "gemm_generation_factor_blackwell_ultra" in fitted({"GB300", "GB200"})


def test_a_release_regression_of_one_configuration_is_left_out_with_the_faster_row_named(tmp_path):
    """Two runs of one configuration 1.3x or more apart: the slower is a release's regression (published rows 59, 211,
    212); closer runs are both kept, and a run of another layout is never compared."""
    from cost_model.validate import RELEASE_REGRESSION_RATIO

    fast = ROW
    slow = ROW.replace("7,src", "8,src", 1).replace(",14000,", f",{14000 / RELEASE_REGRESSION_RATIO - 1:.0f},")
    near = ROW.replace("7,src", "9,src", 1).replace(",14000,", f",{14000 / RELEASE_REGRESSION_RATIO + 50:.0f},")
    other = ROW.replace("7,src", "10,src", 1).replace(",128,", ",256,").replace(",14000,", ",7000,")
    runs, _ = read_runs(_csv(tmp_path, fast, slow, near, other))
    why = {r.run_id: r.unrepresentable for r in runs}
    assert why["8"].startswith("a release regression: row 7") and "1.30x faster" in why["8"]
    assert why["7"] == why["9"] == why["10"] == ""
    published, _ = read_runs(PUBLISHED)
    assert sorted(r.run_id for r in published if r.unrepresentable.startswith("a release regression")) == [
        "211",
        "212",
        "59",
    ]
    # the threshold sits in the gap of the published repeats: 55 configurations within 1.16x, three at 1.58-1.77x
    assert 1.16 < RELEASE_REGRESSION_RATIO < 1.58


def test_a_run_table_refuses_a_column_twice_and_a_repeated_id(tmp_path):
    r = runner.invoke(app, ["validate", "--data", str(_csv(tmp_path, ROW, header=HEADER.replace(",vpp,", ",tp,")))])
    assert r.exit_code == 2 and "column(s) tp appear twice in the header" in r.output
    runs, problems = read_runs(_csv(tmp_path, ROW, ROW.replace(",14000,", ",13000,")))
    assert [r.run_id for r in runs] == ["7"]
    why = {(p.run_id, p.column): p.message for p in problems}
    assert "id '7' is already the id of row 1" in why[("7", "id")]


def test_rows_without_ids_in_two_tables_are_not_repeats(tmp_path):
    header = HEADER.replace("id,", "", 1)
    row = ROW.split(",", 1)[1]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = _csv(tmp_path / "a", row, header=header), _csv(tmp_path / "b", row, header=header)
    runs, problems = read_runs([a, b])
    assert len(runs) == 2 and not problems


def test_bridge_bf16_rows_hand_the_optimizer_fp8_recipe_tensorwise():
    # benchmarks/data/published_runs_cards.md F1: Megatron-Bridge's bf16 runs keep fp32 masters (the optimizer gets
    # MixedPrecisionConfig's fp8_recipe "tensorwise"); fp8 rows follow their own recipe; rows without a recipe read stay
    # None
    published, _ = read_runs(PUBLISHED)
    by_id = {r.run_id: r for r in published if r.options is not None}
    assert by_id["8"].options.optimizer_fp8_recipe == "tensorwise"  # GPT-OSS-120B H100 bf16, Bridge v0.3.0
    assert not by_id["8"].options.precision_aware_owns_masters(Precision.bf16)
    assert by_id["52"].options.optimizer_fp8_recipe is None  # Qwen3-235B H100 fp8: its fp8_recipe decides
    assert all(
        r.options.optimizer_fp8_recipe is None
        for r in published
        if r.options is not None and r.workload is not None and r.workload.precision != Precision.bf16
    )


def test_a_bad_note_or_setting_leaves_out_its_row_only(tmp_path):
    # an adversarial review (2026-12-03): a note's first-stage split or MTP depth, or a setting column's garbage, had
    # stopped the whole table (exit 2 without a row named, or an internal error), or was read silently as false
    keep = _published("1", "8", "9", "10")
    keep[0]["other_notes"] += "; first_stage_layers=1000"
    keep[1]["other_notes"] += "; mtp_num_layers=abc"
    keep[2]["overlap_moe_expert_parallel_comm"] = "banana"
    keep[3]["optimizer_fp8_recipe"] = "None"  # blank and "none" both mean unset
    runs, problems = read_runs(
        _table(tmp_path, keep, encoding="utf-8-sig")
    )  # with a byte-order mark, as spreadsheets write
    why = {r.run_id: r.unrepresentable for r in runs}
    assert set(why) == {"1", "8", "9", "10"} and not problems  # the ids were read: the BOM is not part of 'id'
    assert "first (1000) + last (0) leaves" in why["1"]
    assert why["8"].startswith("note mtp_num_layers='abc'")
    assert "overlap_moe_expert_parallel_comm 'banana': expected true or false" in why["9"]
    assert why["10"] == "" and next(r for r in runs if r.run_id == "10").options.optimizer_fp8_recipe is None
    assert len(predict_runs(runs)) == 1  # the good row is still predicted


def test_allgather_in_the_dispatcher_cell_is_read(tmp_path):
    rows = _published("8")
    rows[0]["dispatcher"] = "allgather"
    runs, _ = read_runs(_table(tmp_path, rows))
    assert runs[0].layout is not None and runs[0].layout.dispatcher.value == "allgather"


def test_a_published_run_of_an_older_release_is_predicted_slower_by_the_measured_gain_a_month(tmp_path):
    """The release term: the same row in container 26.04 and 26.08 is predicted (1 + gain) ** 4 apart, throughput only;
    a row naming no container release (a verification card, NeMo 24.07, the project's own runs) is at the reference."""
    from cost_model.validate import REFERENCE_RELEASE, RELEASE_GAIN_PER_MONTH, release_factor

    assert REFERENCE_RELEASE == (26, 8)
    assert release_factor("Megatron-Bridge / NeMo container 26.08") == 1.0
    assert release_factor("Megatron-Bridge / NeMo container 26.02.01") == pytest.approx(
        (1 + RELEASE_GAIN_PER_MONTH) ** -6
    )
    assert release_factor("Megatron-Bridge / NeMo container 25.11") == pytest.approx((1 + RELEASE_GAIN_PER_MONTH) ** -9)
    # the trend is not extrapolated: before 25.09 (the oldest table) as 25.09, after 26.08 as 26.08
    assert release_factor("Megatron-Bridge / NeMo container 20.01") == release_factor(
        "Megatron-Bridge / NeMo container 25.09"
    )
    assert release_factor("Megatron-Bridge / NeMo container 25.09") == pytest.approx(
        (1 + RELEASE_GAIN_PER_MONTH) ** -11
    )
    assert (
        release_factor("Megatron-Bridge / NeMo container 27.03")
        == release_factor("Megatron-Bridge / NeMo container 26.13")
        == 1.0
    )
    for none in (
        "Megatron-Bridge (model verification card, Jul/Aug-2026)", "NeMo 24.07 container (Megatron-Core ~0.8)",
        "seed: slime MiniMax-M2 recipe", "",
    ):
        assert release_factor(none) == 1.0
    new = ROW.replace("7,src", "8,src", 1).replace("container 26.04", "container 26.08").replace(",128,", ",256,")
    old = ROW.replace(",128,", ",256,")
    runs, _ = read_runs(_csv(tmp_path, old, new))
    p = {q.run.run_id: q for q in predict_runs(runs)}
    assert p["7"].tokens_per_s_per_gpu / p["8"].tokens_per_s_per_gpu == pytest.approx(
        (1 + RELEASE_GAIN_PER_MONTH) ** -4, rel=1e-9
    )
    assert p["7"].model_tflops_per_gpu / p["8"].model_tflops_per_gpu == pytest.approx(
        (1 + RELEASE_GAIN_PER_MONTH) ** -4, rel=1e-9
    )
    assert p["7"].peak_gib == p["8"].peak_gib


def test_the_release_gain_is_what_the_published_repeats_measure(tmp_path):
    """RELEASE_GAIN_PER_MONTH is measure_release_gain of the published table (oldest against newest run of each
    configuration published in releases of different months), not a fitted or chosen number."""
    from cost_model.validate import RELEASE_GAIN_PER_MONTH, measure_release_gain

    a = ROW.replace(",128,", ",256,")
    b = a.replace("7,src", "8,src", 1).replace("container 26.04", "container 26.08").replace(",14000,", ",15400,")
    c = (
        a.replace("7,src", "9,src", 1).replace("container 26.04", "container 26.06").replace(",14000,", ",12000,")
    )  # the middle one is not used
    runs, _ = read_runs(_csv(tmp_path, a, b, c))
    m = measure_release_gain(runs)
    assert m["pairs"] == [("7", "8", 4, pytest.approx(1.1))]
    assert m["gain_per_month"] == pytest.approx(1.1**0.25 - 1)
    published, _ = read_runs(PUBLISHED)
    m = measure_release_gain(published)
    assert len(m["pairs"]) == 30 and m["months"] == [2, 3, 4, 5, 7]
    assert abs(m["gain_per_month"] - RELEASE_GAIN_PER_MONTH) < 5e-5


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        (
            "cuda_graph_impl",
            "banana",
            "cuda_graph_impl 'banana': accepted none, local, transformer_engine, full_iteration",
        ),
        ("dispatcher", "banana", "dispatcher 'banana': name alltoall, allgather, DeepEP or HybridEP"),
        ("recompute_granularity", "banana", "recompute_granularity 'banana': accepted none, selective, full"),
        ("te_version", "2.-5", "te_version '2.-5': expected major.minor"),
        ("cpu_offloading_num_layers", "abc", "cpu_offloading_num_layers 'abc': expected a non-negative integer"),
        ("vpp", "4", "vpp 4 with pp 1: Megatron's virtual pipeline needs pp > 1"),
        (
            "other_notes",
            "optimizer_offload_fraction=1.5",
            "note optimizer_offload_fraction='1.5': expected a fraction from 0 to 1",
        ),
    ],
)
def test_a_setting_cell_the_reader_cannot_take_leaves_out_its_row_naming_the_column(tmp_path, column, value, reason):
    # an adversarial review (2026-12-03): these fell back quietly (graphs on, alltoall, no recompute, TE 2.-5 read, vpp
    # ignored) or ended in a message that named no column ("invalid literal for int()")
    rows = _published("131", "132")  # pp 1, EP
    rows[0][column] = value
    runs, problems = read_runs(_table(tmp_path, rows))
    why = {r.run_id: r.unrepresentable for r in runs}
    assert not problems and reason in why["131"], why["131"]
    assert why["132"] == ""


def test_flex_without_a_backend_is_deepep_and_a_form_feed_does_not_split_a_row(tmp_path):
    rows = _published("131", "132")
    rows[0]["dispatcher"] = "flex"
    rows[1]["dispatcher"] = "alltoall (flex backend unset)"
    rows[1]["other_notes"] = "page\fbreak"
    runs, problems = read_runs(_table(tmp_path, rows))
    assert not problems and [r.run_id for r in runs] == ["131", "132"]
    assert runs[0].layout.dispatcher == "flex+deepep" and runs[1].layout.dispatcher == "alltoall"


def test_the_kfold_measures_the_release_gain_on_its_training_models_only(tmp_path):
    """The held-out model's own repeats do not set the release gain its predictions use."""
    from cost_model.calibrate import kfold_by_model

    a = ROW.replace(",128,", ",256,")
    b = a.replace("7,src", "8,src", 1).replace("container 26.04", "container 26.08").replace(",14000,", ",15400,")
    other = (
        a.replace("7,src", "9,src", 1)
        .replace("LLAMA3_8B", "LLAMA3_70B")
        .replace(",14000,", ",1500,")
        .replace(",700,", ",600,")
    )
    other2 = other.replace("9,src", "10,src", 1).replace(",256,", ",512,")
    runs, problems = read_runs(_csv(tmp_path, a, b, other, other2))
    assert not problems and all(not r.unrepresentable for r in runs)
    folds = kfold_by_model(runs, max_nfev=2)
    held = {r.model.name: m for m, f in folds.items() for r in f["runs"]}
    assert folds[held["Llama-3.1-8B"]]["release_gain"] == 0.0  # its training fold (the 70B rows) has no repeats
    assert folds[held["Llama-3.1-70B"]]["release_gain"] == pytest.approx(1.1**0.25 - 1)
    one = kfold_by_model(runs, max_nfev=2, models=["Llama-3.1-70B"])  # one fold, still fitted on the other model
    assert list(one) == ["Llama-3.1-70B"] and [r.run_id for r in one["Llama-3.1-70B"]["runs"]] == ["9", "10"]
    assert one["Llama-3.1-70B"]["release_gain"] == folds["Llama-3.1-70B"]["release_gain"]


def test_a_second_adversarial_review_s_inputs_are_refused_or_left_out_with_their_name(tmp_path):
    # 2026-12-03, third session: an oversized layer count crashed (OverflowError, exit 1); a CUDA-graph scope was never
    # checked (read as no graphs); a container month 00 or 13 was priced as a release
    from cost_model.validate import container_release
    from specs.errors import TunerError

    assert container_release("NeMo Container 25.09") == (25, 9)
    assert container_release("container 26.00") is None and container_release("container 26.13") is None
    assert container_release("container 25.9") is None
    with pytest.raises(TunerError, match="cuda_graph_scope 'bogus': accepted full, full_iteration, attn"):
        RunOptions(cuda_graph_scope=("moe_router", "bogus"))
    assert RunOptions(cuda_graph_scope=("MOE_ROUTER",)).cuda_graph_moe
    rows = _published("147", "149")
    rows[0]["cuda_graph_scope"] = "bogus"
    runs, problems = read_runs(_table(tmp_path, rows))
    why = {r.run_id: r.unrepresentable for r in runs}
    assert "cuda_graph_scope 'bogus'" in why["147"] and why["149"] == ""
