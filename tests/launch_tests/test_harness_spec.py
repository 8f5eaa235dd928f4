"""The harness's input and command line, built from a ModelSpec and a Layout (no torch)."""

from __future__ import annotations

import json

import pytest

from launch.harness.spec import (
    HARNESS_MODULE,
    HarnessEnv,
    HarnessSpec,
    build_spec,
    parse_argv,
    recompute_kwargs,
    torchrun_command,
    unsupported_reasons,
)
from specs import Workload, load_model
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model

WL = Workload(seq_length=8192, global_batch_size=8)


@pytest.fixture(scope="module")
def m4():
    return slice_model(load_model("MiniMax-M2"), 4)


def test_slice_keeps_width_and_layer_kinds(m4):
    full = load_model("MiniMax-M2")
    assert m4.num_layers == 4 and m4.hidden_size == full.hidden_size and m4.num_experts == full.num_experts
    assert m4.moe_layer_freq == full.moe_layer_freq[:4]
    assert m4.mtp_num_layers == 0
    assert slice_model(full, None) is full
    dense_first = full.replace(moe_layer_freq=(0,) + full.moe_layer_freq[1:], ffn_hidden_size=8192)
    assert slice_model(dense_first, 2).moe_layer_freq == (0, 1)


@pytest.mark.parametrize("n", [0, -1, 63])
def test_slice_rejects_bad_counts(n):
    with pytest.raises(TunerError, match="--layers must be from 1 to 62"):
        slice_model(load_model("MiniMax-M2"), n)


def test_spec_round_trip_and_fields(m4):
    lay = Layout(
        world_size=4, tp=2, pp=2, ep=2, sequence_parallel=True, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, dispatcher="allgather",
    )
    spec = build_spec(m4, lay, WL, env=HarnessEnv(), steps=6, warmup_steps=2)
    again = HarnessSpec.from_json(spec.to_json())
    assert again == spec
    assert again.layout_obj() == lay and again.model_spec() == m4
    assert spec.num_microbatches == 8  # gbs 8 / (mbs 1 x dp 1)
    assert spec.use_transformer_engine is False
    assert any("no Transformer Engine" in n for n in spec.notes)
    d = json.loads(spec.to_json())
    assert d["layout"]["dispatcher"] == "allgather" and d["layout"]["tp"] == 2 and d["model"]["num_layers"] == 4


def test_spec_with_te_has_no_local_notes(m4):
    spec = build_spec(m4, Layout(world_size=4, ep=4), WL, env=HarnessEnv(transformer_engine=True))
    assert spec.use_transformer_engine and spec.notes == ()


def test_recompute_kwargs():
    assert recompute_kwargs(Layout(world_size=1).to_dict()) == {"recompute_granularity": None}
    sel = Layout(world_size=1, recompute_granularity="selective", recompute_modules=("core_attn", "moe_act")).to_dict()
    assert recompute_kwargs(sel) == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "moe_act"],
    }
    full = Layout(
        world_size=1, recompute_granularity="full", recompute_method="block", recompute_num_layers=2
    ).to_dict()
    assert recompute_kwargs(full) == {
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
    }


@pytest.mark.parametrize(
    "kw, env, needle",
    [
        (dict(cp=2), HarnessEnv(), "context parallelism (cp=2) needs Transformer Engine"),
        (dict(ep=4, dispatcher="flex+deepep"), HarnessEnv(), "needs DeepEP"),
        (dict(ep=4, dispatcher="flex+hybridep"), HarnessEnv(deep_ep=True), "needs HybridEP"),
        (dict(ep=4, exp_avg_dtype="bf16"), HarnessEnv(), "bf16 optimizer states"),
        # crashed at model build on H200 without TE (2026-11-29): megatron-core needs grouped GEMM for it
        (
            dict(ep=4, recompute_granularity="selective", recompute_modules=("core_attn", "moe_act")),
            HarnessEnv(),
            "moe_act needs grouped GEMM",
        ),
    ],
)
def test_refused_before_any_gpu_work(m4, kw, env, needle):
    lay = Layout(world_size=4, **kw)
    assert any(needle in r for r in unsupported_reasons(lay, m4, WL, env))
    with pytest.raises(InfeasibleLayout, match="harness_env"):
        build_spec(m4, lay, WL, env=env)


def test_supported_with_the_right_packages(m4):
    assert unsupported_reasons(Layout(world_size=4, cp=2), m4, WL, HarnessEnv(transformer_engine=True)) == []
    assert (
        unsupported_reasons(Layout(world_size=4, ep=4, dispatcher="flex+deepep"), m4, WL, HarnessEnv(deep_ep=True))
        == []
    )
    moe_act = Layout(world_size=4, ep=4, recompute_granularity="selective", recompute_modules=("moe_act",))
    assert unsupported_reasons(moe_act, m4, WL, HarnessEnv(transformer_engine=True)) == []
    off = Layout(world_size=4, ep=4, exp_avg_dtype="bf16", optimizer_offload_fraction=1.0)
    assert unsupported_reasons(off, m4, WL, HarnessEnv()) == []


def test_batch_must_split(m4):
    with pytest.raises(TunerError, match="not a multiple of micro-batch 2 x DP 4"):
        build_spec(
            m4,
            Layout(world_size=4, ep=4, micro_batch_size=2),
            Workload(seq_length=8192, global_batch_size=4),
            env=HarnessEnv(),
        )


def test_torchrun_command():
    cmd = torchrun_command(4, "s.json", "o.jsonl", master_port=1234, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and "--master-port=1234" in cmd
    i = cmd.index("-m", 3)
    assert cmd[i + 1] == HARNESS_MODULE and cmd[-4:] == ["--spec", "s.json", "--out", "o.jsonl"]


def test_parse_argv():
    assert parse_argv(["--spec", "a", "--out", "b"]) == ("a", "b")
    with pytest.raises(TunerError, match="usage"):
        parse_argv(["--spec", "a"])
    with pytest.raises(TunerError, match="unknown argument"):
        parse_argv(["--bogus"])


def test_harness_modules_do_not_import_torch():
    """In a fresh interpreter (another test may have imported torch into this one where it is installed)."""
    import subprocess
    import sys

    code = (
        "import sys, launch.harness, launch.local_backend, launch.harness.component, launch.harness.grads, "
        "launch.harness.gather, "
        "launch.harness.train, launch.harness.build, launch.harness.measure, launch.harness.step, "
        "tuner.verify.component, tuner.verify.correctness, tuner.verify.loss_check, tuner.verify.parity_check; assert "
        "'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
