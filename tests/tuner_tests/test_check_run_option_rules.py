"""``tune check`` and ``tune`` name the rule a run option breaks (search_spaces/rule_checks.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tuner.cli import app

runner = CliRunner()
QWEN = ["check", "--model", "Qwen3-30B-A3B", "--gpus", "8xH100", "--tp", "1", "--ep", "8"]


@pytest.mark.parametrize(("args", "rule"), [
    (["--recompute", "full", "--overlap-moe-expert-parallel-comm"], "ep_overlap"),
    (["--recompute", "selective", "--recompute-modules", "moe", "--cuda-graph-impl", "transformer_engine",
      "--cuda-graph-scope", "attn,moe_router,moe_preprocess"], "cuda_graphs"),
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "moe"], "cuda_graph_scope"),
    (["--megatron-core", "0.15", "--recompute", "full", "--cuda-graph-impl", "transformer_engine",
      "--cuda-graph-scope", "attn"], "cuda_graphs"),
    (["--optimizer", "dist_muon"], "dist_muon"),
    (["--megatron-core", "0.16", "--cuda-graph-impl", "full_iteration"], "cuda_graph_release"),
    (["--precision", "fp8", "--fp8-param-gather", "--optimizer-offload-fraction", "1", "--fp8-recipe", "tensorwise"],
     "fp8_param_gather_offload"),
])
def test_check_names_the_run_option_rule(args: list[str], rule: str) -> None:
    r = runner.invoke(app, QWEN + args)
    assert r.exit_code == 2, r.output
    assert f"[{rule}]" in r.output


def test_check_accepts_the_options_with_a_layout_that_fits() -> None:
    r = runner.invoke(app, QWEN + ["--overlap-moe-expert-parallel-comm", "--cuda-graph-impl", "transformer_engine",
                                   "--cuda-graph-scope", "attn,moe_router,moe_preprocess"])
    assert r.exit_code == 0, r.output


def test_tune_says_no_layout_runs_with_the_options() -> None:
    r = runner.invoke(app, ["--model", "Qwen3-30B-A3B", "--gpus", "8xH100", "--megatron-core", "0.16",
                            "--cuda-graph-impl", "full_iteration", "--trials", "8"])
    assert r.exit_code == 2
    assert "no layout can run with these run options" in r.output and "[cuda_graph_release]" in r.output
