"""The network, release and host-memory inputs of the main job and `tune estimate` / `tune check` (issue 14)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from typer.testing import CliRunner

from launch.exporters import validate_recipe
from specs import load_gpu
from tuner.cli import app

pytestmark = pytest.mark.slow  # a study of its own (module fixture)

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def efa_run(tmp_path_factory):
    """The main job on the seed's cluster (H200: AWS p5en, EFA v3 by default)."""
    d = tmp_path_factory.mktemp("results")
    r = _run(
        "--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "12", "--results-dir", str(d), "--study", "efa",
        "--verbose",
    )
    return r, d / "efa"


def test_main_job_prints_and_records_the_network(efa_run):
    r, out = efa_run
    assert r.exit_code == 0, r.output
    assert (
        "Network: NVLink domain 8 GPUs; efa-v3 (AWS EFA v3), 3,200 Gb/s per node; megatron-core 0.19 rules" in r.output
    )
    assert "dispatcher_fabric" in r.output  # the cross-node flex layouts are counted as refused
    rec = yaml.safe_load((out / "recipe.yaml").read_text())
    validate_recipe(rec)
    assert rec["gpu"]["network"]["fabric"] == "efa-v3" and rec["gpu"]["network"]["per_node_gbps"] == 3200
    assert set(rec["gpu"]["network"]["dispatchers_not_across"]) == {"flex+deepep", "flex+hybridep"}


def test_efa_main_job_never_recommends_a_dispatcher_that_does_not_run_there(efa_run):
    import csv
    import re

    _, out = efa_run
    rows = list(csv.DictReader((out / "pareto.csv").open()))
    assert rows
    for row in rows:  # the front: a flex layout keeps its EP group (ep x etp) inside one 8-GPU node
        if row["dispatcher"].startswith("flex"):
            ep = int((re.search(r"EP(\d+)", row["label"]) or re.search(r"(1)", "1")).group(1))  # type: ignore[union-attr]
            etp = int((re.search(r"ETP(\d+)", row["label"]) or re.search(r"(1)", "1")).group(1))  # type: ignore[union-attr]
            assert ep * etp <= 8, row
    rec = yaml.safe_load((out / "recipe.yaml").read_text())["layout"]
    if rec.get("moe_token_dispatcher_type") == "flex" or str(rec.get("dispatcher", "")).startswith("flex"):
        assert rec["ep"] * rec.get("etp", 1) <= 8


def test_network_on_infiniband_allows_cross_node_deepep(tmp_path):
    r = _run(
        "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "4", "--ep", "16", "--dispatcher", "flex+deepep",
        "--first-stage-layers", "16", "--last-stage-layers", "14", "--network", "ib-ndr",
    )
    assert r.exit_code == 0, r.output
    r = _run(
        "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "4", "--ep", "16", "--dispatcher", "flex+deepep",
        "--first-stage-layers", "16", "--last-stage-layers", "14",
    )
    assert r.exit_code == 2 and "dispatcher_fabric" in r.output and "AWS EFA v3" in r.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--network", "token-ring"), "--network 'token-ring': unknown network; known: efa-v2, efa-v3"),
        (("--megatron-core", "0.12"), "--megatron-core '0.12': unknown release 0.12; known: 0.13, 0.14"),
        (("--megatron-core", "latest"), "not a version such as 0.16"),
    ],
)
def test_bad_network_and_release_are_one_message_exit_2(tmp_path, args, needle):
    r = runner.invoke(app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--results-dir", str(tmp_path), *args])
    assert r.exit_code == 2
    assert needle in r.output and "Traceback" not in r.output
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_gpu_without_a_default_network_needs_one(tmp_path, monkeypatch):
    import specs.hardware as hw

    bare = dataclasses.replace(load_gpu("H100"), server="", network="")
    monkeypatch.setattr(hw, "load_gpu", lambda name: bare)
    r = runner.invoke(app, ["--model", "MiniMax-M2", "--gpus", "64xH100", "--results-dir", str(tmp_path)])
    assert r.exit_code == 2 and "has no default network; name it with --network (known: efa-v2" in r.output
    r = runner.invoke(
        app,
        [
            "estimate", "--model", "MiniMax-M2", "--gpus", "64xH100", "--pp", "8", "--ep", "8", "--recompute", "full",
            "--network", "ib-ndr", "--first-stage-layers", "7", "--last-stage-layers", "7",
        ],
    )
    assert r.exit_code == 0, r.output


def test_host_memory_below_the_model_s_needs_is_refused_with_both_numbers(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "tp: [2]\npp: [2]\nvpp: [1]\ncp: [1]\nep: [8]\netp: [1]\nmicro_batch_size: [1]\n"
        "recompute:\n  - {granularity: full, method: uniform, num_layers: [1]}\n"
        "optimizer_offload_fraction: [1.0]\ndispatcher: [alltoall]\n"
    )
    r = runner.invoke(
        app,
        [
            "--model", "MiniMax-M2", "--gpus", "64xH200", "--space", str(space), "--host-memory-gib", "64",
            "--results-dir", str(tmp_path / "r"),
        ],
    )
    assert r.exit_code == 2, r.output
    assert "--host-memory-gib 64: every layout that fits in GPU memory needs more host memory per node" in r.output
    assert "GiB predicted" in r.output
    r = runner.invoke(
        app,
        [
            "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "2", "--pp", "2", "--ep", "8",
            "--recompute", "full", "--optimizer-offload-fraction", "1", "--host-memory-gib", "300",
        ],
    )
    assert r.exit_code == 0 and "GiB per node of 300 GiB (does NOT fit)" in r.output


def test_resuming_with_other_host_memory_or_bandwidth_is_refused_in_the_options_terms(tmp_path):
    base = [
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--trials", "2", "--stack",
        "megatron", "--results-dir", str(tmp_path), "--study", "h",
    ]
    assert _run(*base).exit_code == 0
    r = _run(*base, "--host-memory-gib", "512")
    assert r.exit_code == 2 and "--host-memory-gib 2,048 GiB" in r.output and "--host-memory-gib 512 GiB" in r.output, (
        r.output
    )
    r = _run(*base, "--network-gbps", "400")
    assert r.exit_code == 2 and "--network-gbps 400 Gb/s per node" in r.output, r.output
    assert _run(*base).exit_code == 0  # the same inputs resume it


def test_a_study_opens_by_a_sqlite_url_with_a_query_and_names_a_changed_network(tmp_path):
    base = [
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--trials", "2", "--stack",
        "megatron", "--results-dir", str(tmp_path), "--study", "q",
    ]
    assert _run(*base).exit_code == 0
    db = tmp_path / "q" / "study.db"
    r = _run("pareto", "--study", "q", "--storage", f"sqlite:///{db}?timeout=5")
    assert r.exit_code == 0 and "Pareto front" in r.output, r.output
    r = _run(*base, "--network", "ib-ndr")
    assert r.exit_code == 2 and "--network efa-v3" in r.output and "--network ib-ndr" in r.output, r.output


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-5"])
def test_host_memory_that_is_not_a_finite_positive_number_is_refused(value):
    r = runner.invoke(
        app,
        [
            "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--ep", "8",
            "--host-memory-gib", value,
        ],
    )
    assert r.exit_code == 2 and "--host-memory-gib must be a finite positive number of GiB" in r.output, r.output
