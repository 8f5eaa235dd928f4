"""`tune validate --json` and `tune validate --trials` (issue 14, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app

ROOT = Path(__file__).resolve().parents[2]
TE_SWEEP = (
    ROOT / "tests/fixtures/h200_te_call12/sweep.jsonl"
)  # a copy of benchmarks/results/h200_te_2026-12-01/call12/sweep.jsonl
NO_TE = ROOT / "tests/fixtures/h200_minimax_slice.jsonl"
runner = CliRunner()


def _ran(transformer: dict | list, drop: str = "") -> str:
    """The first TE sweep row with its ``run_options.transformer`` updated by ``transformer`` (or replaced, when not a
    dict), and field ``drop`` left out: one JSON line."""
    d = json.loads(TE_SWEEP.read_text().splitlines()[0])
    ran = {**d["run_options"]["transformer"], **transformer} if isinstance(transformer, dict) else transformer
    d["run_options"] = {**d["run_options"], "transformer": ran}
    return json.dumps({k: v for k, v in d.items() if k != drop})


def test_validate_json_has_every_row_and_the_summary():
    r = runner.invoke(app, ["validate", "--data", str(ROOT / "cost_model/data/seed_runs.csv"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["published"]
    assert len(d["rows"]) == 2 and {"id", "published", "predicted", "error", "fits", "peak_gib"} <= set(d["rows"][0])
    assert d["summary"]["all"]["rows"] == 2 and "median_abs_error" in d["summary"]["all"]
    assert d["summary"]["predicted_not_to_fit"] == 0


def test_validate_trials_predicts_each_stack_with_its_calibration(tmp_path):
    r = runner.invoke(app, ["validate", "--trials", str(TE_SWEEP), "--trials", str(NO_TE), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["trials"]
    te = [x for x in d["rows"] if x["transformer_engine"]]
    no_te = [x for x in d["rows"] if not x["transformer_engine"]]
    assert len(te) == 4 and len(no_te) >= 12
    assert {x["calibration"] for x in te} == {"shipped (TE)"}
    assert all(x["calibration"] != "shipped (TE)" for x in no_te)
    assert any("status 'skipped'" in s for s in d["skipped"])  # the budget-skipped cases are listed, not predicted
    fp8 = next(x for x in te if x["label"] == "mm-fp8-tensorwise")
    assert fp8["precision"] == "fp8" and fp8["peak_gib"]["measured_reserved"] == pytest.approx(103.421875)
    assert d["summary"]["te"]["rows"] == 4 and d["summary"]["no_te"]["rows"] == len(no_te)
    # the table form prints the same summary
    r = runner.invoke(app, ["validate", "--trials", str(TE_SWEEP)])
    assert r.exit_code == 0 and "step median" in r.output and "mm-fp8-delayed" in r.output


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "not JSON"),
        (json.dumps({"model": "MiniMax-M2", "status": "ok"}), "the row has no layout"),
        ("[1, 2, 3]", "the line is a JSON list, not an object"),
        (
            json.dumps({"model": "GPT-5", "layout": {"tp": 1}, "status": "ok"}),
            "model 'GPT-5' is not a bundled model or a slice of one",
        ),
        (json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "versions": "x"}), "cannot read the row"),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "seq_length": True}),
            "seq_length must be a whole number >= 1, got True",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "global_batch_size": 8.9}),
            "global_batch_size must be a whole number",
        ),
        (
            json.dumps(
                {
                    **json.loads(TE_SWEEP.read_text().splitlines()[0]),
                    "run_options": {"harness": {"cross_entropy_fusion": "false"}},
                }
            ),
            "run_options.harness.cross_entropy_fusion must be true or false, got 'false'",
        ),
        (
            json.dumps(
                {
                    **json.loads(TE_SWEEP.read_text().splitlines()[0]),
                    "run_options": {"harness": {"megatron_fusions": 1}},
                }
            ),
            "run_options.harness.megatron_fusions must be true or false, got 1",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "options": {"megatron_fusions": "yes"}}),
            "options.megatron_fusions must be true or false, got 'yes'",
        ),
        (
            json.dumps(
                {
                    **json.loads(TE_SWEEP.read_text().splitlines()[0]),
                    "options": {"megatron_fusions": True},
                    "run_options": {"harness": {"megatron_fusions": False}},
                }
            ),
            "the row contradicts itself",
        ),
        (
            TE_SWEEP.read_text().splitlines()[0].replace('"global_batch_size": 8', '"global_batch_size": 1e400'),
            "global_batch_size must be a whole number >= 1, got inf",
        ),
        (
            json.dumps(
                {
                    **json.loads(TE_SWEEP.read_text().splitlines()[0]),
                    "layout": {
                        k: v for k, v in json.loads(TE_SWEEP.read_text().splitlines()[0])["layout"].items() if k != "pp"
                    },
                }
            ),
            "the layout lacks pp",
        ),
        (
            json.dumps({k: v for k, v in json.loads(TE_SWEEP.read_text().splitlines()[0]).items() if k != "gpus"}),
            "the row lacks gpus",
        ),
        (
            json.dumps(
                {
                    **json.loads(TE_SWEEP.read_text().splitlines()[0]),
                    "run_options": {"harness": {"fp8_recipe": "blockwise"}},
                }
            ),
            "fp8_recipe 'blockwise': the trials reader predicts the delayed and tensorwise recipes",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "model": "MiniMax-M2[0 layers]"}),
            "model 'MiniMax-M2[0 layers]': a slice has 1 to 62 layers",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "versions": {"transformer_engine": 123}}),
            "versions.transformer_engine must be a version string",
        ),
        (
            json.dumps(
                {**json.loads(TE_SWEEP.read_text().splitlines()[0]), "versions": {"transformer_engine": "banana"}}
            ),
            "got 'banana'",
        ),
        (
            TE_SWEEP.read_text().splitlines()[0].replace('"step_time_s": ', '"step_time_s": 1.0, "step_time_s": ', 1),
            "key 'step_time_s' appears twice in one object",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "model": "Qwen3-30B-A3B[1 layers]"}),
            "has hidden_size 2048, but megatron-core ran hidden_size 3072 (run_options.transformer): the row is of "
            "another model",
        ),
        (
            json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "model": "MiniMax-M2[2 layers]"}),
            "has num_layers 2, but megatron-core ran num_layers 1",
        ),
        (_ran({"fp8": "hybrid"}, drop="precision"), "the row's precision is not given but it ran fp8"),
        (_ran({"fp8": "e4m3"}), "the row's precision is bf16 but it ran fp8"),
        (_ran({"hidden_size": 4096.0}), "megatron-core ran hidden_size 4096"),
        (_ran([]), "cannot read the row"),
    ],
)
def test_bad_trials_files_are_one_message_exit_2(tmp_path, line, needle):
    f = tmp_path / "t.jsonl"
    f.write_text(TE_SWEEP.read_text().splitlines()[0] + "\n" + line + "\n")
    before = f.read_text()
    r = runner.invoke(app, ["validate", "--trials", str(f)])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "line 2" in r.output and "Traceback" not in r.output
    assert f.read_text() == before  # nothing lost


def test_validate_trials_applies_each_row_s_model_overrides(tmp_path):
    """The GPT-OSS rows ran one EP rank's 16 experts with features turned off in turn (``model_overrides``): predicted
    as
    they ran, the biases-off row is faster and every slice holds 16 experts' memory, not 128."""
    rows = ROOT / "benchmarks/results/h200_te_2026-12-01/call18/sweep.jsonl"
    r = runner.invoke(app, ["validate", "--trials", str(rows), "--json"])
    assert r.exit_code == 0, r.output
    by = {x["label"]: x for x in json.loads(r.output)["trials"]["rows"]}
    assert by["oss-no-bias"]["step_time_s"]["predicted"] < by["oss-full"]["step_time_s"]["predicted"]
    assert by["oss-full"]["peak_gib"]["predicted"] < 1.2 * by["oss-full"]["peak_gib"]["measured_reserved"]
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        json.dumps({**json.loads(rows.read_text().splitlines()[1]), "model_overrides": {"experts": 16}}) + "\n"
    )
    r = runner.invoke(app, ["validate", "--trials", str(bad)])
    assert r.exit_code == 2 and "model_overrides names ['experts']" in r.output


def test_gc_control_rows_are_left_out_and_json_is_strict(tmp_path):
    """The fifth batch's gc.collect() controls are not predicted (the model prices the first steps' peak), and --json is
    standard JSON: a one-row Spearman is null, not NaN."""
    rows = ROOT / "benchmarks/results/h200_te_2026-12-01/call21/sweep.jsonl"
    r = CliRunner().invoke(app, ["validate", "--trials", str(rows)])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "mem-mm-offload-0.5-gc: a control run with gc.collect() after the optimizer build" in out
    one = tmp_path / "one.jsonl"
    one.write_text(TE_SWEEP.read_text().splitlines()[0] + "\n")
    j = CliRunner().invoke(app, ["validate", "--trials", str(one), "--json"])
    assert j.exit_code == 0, j.output

    def no_nan(c: str) -> None:
        raise AssertionError(f"non-standard JSON constant {c}")

    d = json.loads(j.stdout, parse_constant=no_nan)
    assert d["trials"]["summary"]["all"]["rows"] == 1 and d["trials"]["summary"]["all"]["step_spearman"] is None


def test_a_row_run_with_megatron_fusions_is_predicted_with_the_fused_rope(tmp_path):
    """The harness's ``megatron_fusions`` rows ran the fused RoPE: predicted with ``apply_rope_fusion`` on, so an MLA
    row is predicted faster than the same row run unfused (by the measured unfused-RoPE cost)."""
    from tuner.validate_trials import predict_trials, read_trials

    src = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-01" / "call16" / "sweep.jsonl"
    line = next(ln for ln in src.read_text().splitlines() if '"ds-mla-base"' in ln and '"ok"' in ln)
    d = json.loads(line)
    d.setdefault("run_options", {}).setdefault("harness", {})["megatron_fusions"] = True
    f = tmp_path / "t.jsonl"
    f.write_text(line + "\n" + json.dumps(d) + "\n")
    rows, _ = read_trials([f])
    assert [r.options.apply_rope_fusion for r in rows] == [False, True]
    # a row that only asked for the fusions (options, no run_options.harness record) is read as asked
    asked = {k: v for k, v in json.loads(line).items() if k != "run_options"}
    asked["options"] = {**asked.get("options", {}), "megatron_fusions": True}
    g = tmp_path / "u.jsonl"
    g.write_text(json.dumps(asked) + "\n")
    assert read_trials([g])[0][0].options.apply_rope_fusion
    unfused, fused = predict_trials(rows)
    assert fused.step_time_s < unfused.step_time_s


def test_a_te_release_with_a_suffix_is_read_by_its_major_minor(tmp_path):
    from tuner.validate_trials import read_trials

    f = tmp_path / "t.jsonl"
    row = json.loads(TE_SWEEP.read_text().splitlines()[0])
    f.write_text(
        "\n".join(
            json.dumps({**row, "versions": {**row.get("versions", {}), "transformer_engine": v}})
            for v in ("2.20rc1", "2.20+abc", "1.13.0.dev0+git")
        )
        + "\n"
    )
    rows, _ = read_trials([f])
    assert [r.options.te_version for r in rows] == ["2.20", "2.20", "1.13"]


def test_a_file_whose_every_row_is_left_out_says_why(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({**json.loads(TE_SWEEP.read_text().splitlines()[0]), "step_time_s": -1.0}) + "\n")
    r = runner.invoke(app, ["validate", "--trials", str(f)])
    assert r.exit_code == 2 and "1 rows left out" in r.output
    assert "step_time_s -1.0" in " ".join(r.output.split()) and "not a positive number" in " ".join(r.output.split())


def test_validate_trials_pools_the_spread_of_configurations_run_more_than_once(tmp_path):
    """Rows of one configuration in several files are runs of one layout: their pooled spread, the median |error| a
    model
    exact on their mean would show on single runs, and the model's error against each configuration's mean."""
    first, second = (json.loads(x) for x in TE_SWEEP.read_text().splitlines()[:2])
    runs = [{**first, "step_time_s": t} for t in (1.0, 1.1, 1.2)]
    f = tmp_path / "repeats.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [*runs, second]) + "\n")
    r = runner.invoke(app, ["validate", "--trials", str(f), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["trials"]
    sp = d["summary"]["run_spread"]
    assert (sp["configurations"], sp["repeated"], sp["repeat_runs"], sp["dof"]) == (2, 1, 3, 2)
    assert sp["spread"] == pytest.approx(0.1 / 1.1)  # sample standard deviation over the mean
    assert sp["noise_floor"] == pytest.approx(0.6745 * 0.1 / 1.1)
    pred = {x["label"] if x["source"].endswith(":4") else "run": x["step_time_s"]["predicted"] for x in d["rows"]}
    of_means = sorted([abs(pred["run"] / 1.1 - 1), abs(d["rows"][3]["step_time_s"]["error"])])
    assert sp["step_median_abs_error_of_means"] == pytest.approx(sum(of_means) / 2)
    r = runner.invoke(app, ["validate", "--trials", str(f), "--no-rows"])
    assert r.exit_code == 0 and "1 configuration ran more than once (3 runs)" in r.output.replace("\n", " ")
    # a file with no repeat says the spread cannot be measured from it, and gives no number
    one = tmp_path / "once.jsonl"
    one.write_text(json.dumps(first) + "\n")
    r = runner.invoke(app, ["validate", "--trials", str(one), "--json"])
    assert json.loads(r.output)["trials"]["summary"]["run_spread"]["spread"] is None
    r = runner.invoke(app, ["validate", "--trials", str(one), "--no-rows"])
    assert "no configuration ran twice" in r.output.replace("\n", " ")


def test_the_spread_counts_runs_not_copies_and_keeps_apart_what_ran_differently(tmp_path):
    """One file given twice is refused (each row would count as two runs); a row that repeats another's measurement to
    the last digit is a copy, counted once; rows of one layout run with a setting that changes the timed steps but not
    the model's inputs (TE's fused permutation, a profiled step) are not runs of one configuration; the same GPU spelled
    another way is."""
    first = json.loads(TE_SWEEP.read_text().splitlines()[0])
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({**first, "step_time_s": 1.0}) + "\n" + json.dumps({**first, "step_time_s": 1.2}) + "\n")
    link = tmp_path / "b.jsonl"
    link.symlink_to(f)
    for second in (f, link, tmp_path / "." / "a.jsonl"):
        r = runner.invoke(app, ["validate", "--trials", str(f), "--trials", str(second)])
        assert r.exit_code == 2 and "the same file as --trials" in r.output and "Traceback" not in r.output
    rows = [
        {**first, "step_time_s": 1.0},
        {**first, "step_time_s": 1.0},
        {**first, "step_time_s": 1.2, "gpus": "1xh200"},
        {**first, "step_time_s": 0.8, "options": {**first["options"], "moe_permute_fusion": True}},
        {**first, "step_time_s": 0.9, "options": {**first["options"], "profile_step": 6}},
    ]
    g = tmp_path / "rows.jsonl"
    g.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    r = runner.invoke(app, ["validate", "--trials", str(g), "--json"])
    assert r.exit_code == 0, r.output
    sp = json.loads(r.output)["trials"]["summary"]["run_spread"]
    # 1.0 (its copy counted once) and 1.2 on "1xh200" pool; the fused and the profiled runs are configurations of their
    # own
    assert (sp["configurations"], sp["repeated"], sp["repeat_runs"], sp["dof"], sp["identical_rows"]) == (3, 1, 2, 1, 1)
    assert sp["spread"] == pytest.approx((0.1 * 2**0.5) / 1.1)  # runs 1.0 and 1.2: standard deviation 0.1414, mean 1.1
    r = runner.invoke(app, ["validate", "--trials", str(g), "--no-rows"])
    text = r.output.replace("\n", " ")
    assert (
        "1 configuration ran more than once (2 runs)" in text
        and "1 degree of freedom" in text
        and "1 row repeating" in text
    )
