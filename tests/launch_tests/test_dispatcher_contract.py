"""The contract every registered MoE token dispatcher keeps, one suite run over every member of
:class:`specs.layout.Dispatcher` (Optuna's ``StorageTestCase`` pattern): a dispatcher added as one member
and one traits row passes it with no other edit. It estimates, exports a recipe the schema accepts (the
schema's enum comes from the same list), round-trips through the layout's spellings, and `tune check`
accepts it, names it when it breaks a rule and lists it among the accepted values."""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from cost_model.estimate import estimate
from cost_model.run_table import _dispatcher_cell
from launch.exporters import ExportContext, get_exporter, megatron_args_script, recipe_schema
from launch.harness.spec import HarnessEnv, unsupported_reasons
from search_spaces.rules import check_layout
from specs import LayoutTable, Workload, load_model, parse_gpus
from specs.layout import Dispatcher, Layout
from tuner.cli import app
from tuner.verify.inputs import parse_layout_spec

WL = Workload(seq_length=8192, global_batch_size=128)
#: MiniMax-M2 on 64 H200: EP 8 inside one NVLink domain, so every dispatcher runs on the default fabric
BASE = Layout(
    world_size=64, pp=4, ep=8, num_layers_in_first_pipeline_stage=15, num_layers_in_last_pipeline_stage=15,
    recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
)
CHECK = [
    "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "4", "--first-stage-layers", "15",
    "--last-stage-layers", "15", "--recompute", "full",
]


@pytest.fixture(scope="module")
def job():
    return load_model("MiniMax-M2"), parse_gpus("64xH200")


@pytest.fixture(params=list(Dispatcher), ids=str)
def disp(request) -> Dispatcher:
    return request.param


def test_it_is_valid_and_estimates(job, disp):
    m, c = job
    lay = BASE.replace(dispatcher=disp)
    assert check_layout(lay, m, WL) == []
    e = estimate(m, c, WL, lay)
    assert math.isfinite(e.step_time_s) and e.step_time_s > 0 and e.tokens_per_s_per_gpu > 0 and e.peak_bytes > 0


def test_it_exports_a_recipe_the_schema_accepts(job, disp):
    m, c = job
    lay = BASE.replace(dispatcher=disp)
    ctx = ExportContext(model=m, cluster=c, workload=WL, layout=lay, estimate=estimate(m, c, WL, lay))
    rec = yaml.safe_load(get_exporter("recipe").render(ctx))  # validated against the schema as it renders
    assert rec["layout"]["dispatcher"] == disp.value
    assert disp.value in recipe_schema()["properties"]["layout"]["properties"]["dispatcher"]["enum"]
    args = megatron_args_script(m, c, WL, lay)
    assert f"--moe-token-dispatcher-type {disp.moe_token_dispatcher_type}" in args
    assert ("--moe-flex-dispatcher-backend" in args) == (disp.moe_flex_dispatcher_backend is not None)


def test_it_round_trips_through_the_layout_spellings(disp):
    lay = BASE.replace(dispatcher=disp)
    assert Dispatcher(disp.value) is disp and Layout(world_size=64, ep=8, dispatcher=disp.value).dispatcher is disp
    assert Layout.from_dict(lay.to_dict()) == lay and f"dispatcher={disp.value}" in lay.key()
    assert LayoutTable.from_layouts([lay]).row(0) == lay  # the table's string column keeps the whole name
    spec = (
        "pp=4,ep=8,recompute=full,num_layers_in_first_pipeline_stage=15,num_layers_in_last_pipeline_stage=15,"
        "dispatcher="
    )
    assert parse_layout_spec(spec + disp.value, 64) == lay


def test_its_published_spellings_read_back_and_the_harness_names_what_it_needs(job, disp):
    for word in disp.traits.published_words:
        assert _dispatcher_cell(f"  {word.upper()} ", {}) is disp
    m, _ = job
    lay = BASE.replace(dispatcher=disp)
    everything = HarnessEnv(transformer_engine=True, deep_ep=True, hybrid_ep=True)
    assert not [r for r in unsupported_reasons(lay, m, WL, everything) if "dispatcher" in r]
    missing = [r for r in unsupported_reasons(lay, m, WL, HarnessEnv(transformer_engine=True)) if "dispatcher" in r]
    probe = disp.traits.harness_probe
    assert missing == (
        []
        if probe is None
        else [f"the {disp} dispatcher needs {disp.traits.library} ({probe}), which is not installed here"]
    )


def test_tune_check_accepts_it_and_lists_it(disp):
    runner = CliRunner()
    ok = runner.invoke(app, [*CHECK, "--ep", "8", "--dispatcher", disp.value])
    assert ok.exit_code == 0 and ok.output.startswith("valid: TP1 PP4 EP8 DP16"), ok.output
    bad = runner.invoke(app, [*CHECK, "--ep", "8", "--dispatcher", "not-a-dispatcher"])
    assert bad.exit_code == 2 and disp.value in bad.output
    if disp.is_flex:  # flex needs expert TP x EP > 1: the broken rule names it
        one = runner.invoke(app, [*CHECK, "--ep", "1", "--dispatcher", disp.value])
        assert one.exit_code == 2 and f"({disp.value}) needs etp*ep > 1" in one.output, one.output
