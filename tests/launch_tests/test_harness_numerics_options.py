"""The harness options of the Transformer Engine sweep and of gradient parity: spec fields, refusals, result lines, host
memory."""

from __future__ import annotations

import json

import pytest

from launch.harness.hostmem import offload_host_bytes, parse_kib_fields
from launch.harness.results import parse_results
from launch.harness.spec import FAULTS, HarnessEnv, HarnessSpec, build_spec
from specs import Workload, load_model
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model

TE, NO_TE = HarnessEnv(transformer_engine=True), HarnessEnv()
L1 = Layout(world_size=1)


@pytest.fixture(scope="module")
def mm():
    return slice_model(load_model("MiniMax-M2"), 1)


def test_new_options_reach_the_spec_and_round_trip(mm):
    wl = Workload(seq_length=8192, global_batch_size=8, precision="fp8")
    s = build_spec(
        mm,
        L1,
        wl,
        env=TE,
        options={
            "fp8_recipe": "tensorwise",
            "grad_reduce_in_fp32": False,
            "cross_entropy_fusion": True,
            "moe_permute_fusion": True,
            "saved_tensor_census": True,
            "dump_grads": "/tmp/g",
            "label": "x",
        },
    )
    back = HarnessSpec.from_json(s.to_json())
    assert (
        back == s and back.fp8_recipe == "tensorwise" and not back.grad_reduce_in_fp32 and back.dump_grads == "/tmp/g"
    )
    # fp8 without a recipe gets megatron's default (delayed); bf16 keeps none
    assert build_spec(mm, L1, wl, env=TE).fp8_recipe == "delayed"
    assert build_spec(mm, L1, Workload(seq_length=8192, global_batch_size=8), env=TE).fp8_recipe is None


def test_measurement_options_reach_the_spec(mm):
    wl = Workload(seq_length=8192, global_batch_size=8)
    s = build_spec(mm, L1, wl, env=TE, options={"forward_only_steps": 4, "memory_phases": True, "gc_after_build": True})
    back = HarnessSpec.from_json(s.to_json())
    assert back == s and back.forward_only_steps == 4 and back.memory_phases and back.gc_after_build
    assert build_spec(mm, L1, wl, env=TE).forward_only_steps == 0
    # Megatron-LM's default fusions: off unless asked (the shipped calibration's sweeps ran unfused)
    assert not build_spec(mm, L1, wl, env=TE).megatron_fusions
    fu = build_spec(mm, L1, wl, env=TE, options={"megatron_fusions": True})
    assert HarnessSpec.from_json(fu.to_json()) == fu and fu.megatron_fusions


@pytest.mark.parametrize(
    "opts, env, precision, match",
    [
        ({"fp8_recipe": "delayed"}, TE, "bf16", "needs --precision fp8"),
        ({"fp8_recipe": "mxfp8"}, TE, "fp8", "accepted delayed"),
        ({}, NO_TE, "fp8", "fp8 training needs Transformer Engine"),
        ({"cross_entropy_fusion": True}, NO_TE, "bf16", "fused cross-entropy"),
        ({"fp8_param_gather": True}, TE, "bf16", "fp8_param_gather needs"),
        ({"megatron_fusions": True}, NO_TE, "bf16", "megatron_fusions .* needs Transformer Engine"),
    ],
)
def test_options_this_machine_or_megatron_cannot_run_are_refused_before_gpu_time(mm, opts, env, precision, match):
    with pytest.raises(InfeasibleLayout, match=match):
        build_spec(mm, L1, Workload(seq_length=8192, global_batch_size=8, precision=precision), env=env, options=opts)


def test_fp8_delayed_with_moe_act_recompute_is_refused(mm):
    lay = Layout(world_size=1, recompute_granularity="selective", recompute_modules=("moe_act",))
    wl = Workload(seq_length=8192, global_batch_size=8, precision="fp8")
    with pytest.raises(InfeasibleLayout, match="Delayed scaling does not support moe_act"):
        build_spec(mm, lay, wl, env=TE, options={"fp8_recipe": "delayed"})
    assert build_spec(mm, lay, wl, env=TE, options={"fp8_recipe": "tensorwise"}).fp8_recipe == "tensorwise"


def test_mla_needs_te_and_the_spec_checks_its_fields(mm):
    ds = slice_model(load_model("DeepSeek-V3"), 1)
    with pytest.raises(InfeasibleLayout, match="multi-latent attention"):
        build_spec(ds, L1, Workload(seq_length=4096, global_batch_size=8), env=NO_TE)
    assert build_spec(ds, L1, Workload(seq_length=4096, global_batch_size=8), env=TE).model["q_lora_rank"] == 1536
    d = json.loads(build_spec(mm, L1, Workload(seq_length=8192, global_batch_size=8), env=TE).to_json())
    with pytest.raises(TunerError, match="fp8 needs a recipe"):
        HarnessSpec.from_json(json.dumps({**d, "precision": "fp8"}))


def test_faults_for_one_gpu_and_under_te(mm):
    wl = Workload(seq_length=4096, global_batch_size=8)
    assert "norm_grad_scaled" in FAULTS
    for env in (TE, NO_TE):  # the scaled-gradient fault and the mask fault run on one GPU, with or without TE
        assert build_spec(mm, L1, wl, env=env, options={"fault": "norm_grad_scaled"}).fault == "norm_grad_scaled"
        assert (
            build_spec(mm, L1, wl, env=env, options={"fault": "non_causal_attention"}).fault == "non_causal_attention"
        )
    with pytest.raises(InfeasibleLayout, match="TP > 1 with sequence parallelism"):
        build_spec(mm, L1, wl, env=TE, options={"fault": "sp_norm_grad_unreduced"})


def test_result_lines_of_parity_and_census_are_read_not_counted_as_bad():
    text = "\n".join(
        json.dumps(x)
        for x in [
            {"event": "start", "layout": {}},
            {"event": "grads", "dir": "/g", "tensors": 12},
            {"event": "step", "step": 1, "step_time_s": 1.0, "tokens_per_s_per_gpu": 1.0, "loss": 2.0},
            {
                "event": "summary",
                "peak_reserved_bytes": [1],
                "peak_host_rss_bytes": 5,
                "run_options": {"ddp": {"grad_reduce_in_fp32": False}},
            },
            {"event": "census", "module": "decoder.layers.0.mlp", "saved": [], "saved_bytes": 0},
        ]
    )
    r = parse_results(text)
    assert (
        r.bad_lines == 0 and r.grads["tensors"] == 12 and r.census[0]["module"] == "decoder.layers.0.mlp" and r.complete
    )
    assert r.summary["run_options"]["ddp"]["grad_reduce_in_fp32"] is False


def test_host_memory_fields_and_the_offload_prediction():
    status = "Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads: 4\n"
    assert parse_kib_fields(status, ("VmRSS", "VmHWM")) == {"VmRSS": 1024 * 1024, "VmHWM": 2048 * 1024}
    assert parse_kib_fields("MemTotal: 10 kB\nMemAvailable: 4 kB\n", ("MemAvailable",)) == {"MemAvailable": 4096}
    # 18 bytes per offloaded parameter with the precision-aware optimizer (bf16 pinned copy, fp32 copy, fp32 grad, two
    # moments), 16 without
    assert offload_host_bytes(10) == 160


def test_component_spec_and_how_many_experts_fit():
    from launch.harness.component import ComponentSpec, component_model, experts_that_fit
    from specs import ModelSpec

    s = ComponentSpec()
    assert s.params_per_expert == 3 * 4096 * 1024 and s.steps == (1, 3) and "default" in s.arms
    assert ComponentSpec.from_json(s.to_json()) == s
    gib = 2**30
    # 139 GiB GPU and 120 GiB host available: the host (32 bytes per parameter with 3 steps) limits it
    e = experts_that_fit(s, 139 * gib, 120 * gib)
    assert e % 8 == 0 and 10 <= e < 512 and e == int((120 * gib - 16 * gib) // 32 // s.params_per_expert) // 8 * 8
    assert experts_that_fit(s, 10**15, 10**15) == 512 and experts_that_fit(s, 0, 0) == 10
    ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in component_model(s, 64).items()})  # a valid model


def test_the_te_sweep_list_runs_here_and_covers_the_issue():
    """benchmarks/h200_te_layouts.py: every case builds a harness spec with TE and breaks no Megatron rule (no GPU time
    on
    a case that cannot start), and together they cover what issue 14 lists."""
    from benchmarks.h200_te_layouts import CASES, PROBE
    from search_spaces.rules import check_layout

    seen: set[str] = set()
    for c in [PROBE, *CASES]:
        m = slice_model(load_model(c["model"]), c["layers"])
        lay = Layout.from_dict(c["layout"])
        wl = Workload(seq_length=c["seq_len"], global_batch_size=c["global_batch"], precision=c["precision"])
        assert check_layout(lay, m, wl) == [], c["id"]
        s = build_spec(m, lay, wl, env=TE, steps=c["steps"], warmup_steps=c["warmup"], options=c["options"])
        seen |= {f"precision:{s.precision}:{s.fp8_recipe}", f"mbs:{lay.micro_batch_size}", f"model:{c['model']}"}
        seen |= {
            f"module:{x}" for x in (lay.recompute_modules if lay.recompute_granularity.value == "selective" else ())
        }
        if lay.recompute_granularity.value == "full":
            seen.add(f"full:{lay.recompute_method.value}")
        seen |= {
            f"pa:{lay.use_precision_aware_optimizer}",
            f"moments:{lay.exp_avg_dtype}",
            f"grads_fp32:{s.grad_reduce_in_fp32}",
            f"ce:{s.cross_entropy_fusion}",
            f"offload:{lay.optimizer_offload_fraction:g}",
        }
    need = {
        "precision:bf16:None",
        "precision:fp8:delayed",
        "precision:fp8:tensorwise",
        "mbs:1",
        "mbs:2",
        "mbs:4",
        "module:core_attn",
        "module:moe_act",
        "module:layernorm",
        "module:moe",
        "module:mla_up_proj",
        "module:mlp",
        "full:uniform",
        "full:block",
        "pa:True",
        "pa:False",
        "moments:bf16",
        "grads_fp32:True",
        "grads_fp32:False",
        "ce:True",
        "offload:0.5",
        "offload:1",
        "model:MiniMax-M2",
        "model:Qwen3-30B-A3B",
        "model:DeepSeek-V3",
    }
    assert need <= seen, need - seen
    assert len(CASES) >= 16 and len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("value", "needle"),
    [("banana", "expected COUNTxGPU"), ("2xH200", "run on one GPU"), ("1xH999", "H999"), ("0xH200", "at least 1")],
)
def test_the_te_sweep_refuses_a_sweep_gpus_it_cannot_record(monkeypatch, capsys, value, needle):
    """``SWEEP_GPUS`` names the GPU the machine has when it is not the cases' H200; anything but one GPU of a bundled
    type stops the driver before a case runs: one line naming SWEEP_GPUS (not a --gpus flag), exit 2 (a row recorded on
    a wrong
    GPU would be judged against the wrong datasheet). A GPU it accepts is written the one way rows are."""
    from benchmarks import h200_te

    monkeypatch.setenv("SWEEP_GPUS", value)
    with pytest.raises(SystemExit) as e:
        h200_te.sweep_gpus()
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and "SWEEP_GPUS" in err and "--gpus" not in err and len(err) < 400
    for spelled in ("1xH100", " 1 x h100 ", "01*H100"):
        monkeypatch.setenv("SWEEP_GPUS", spelled)
        assert h200_te.sweep_gpus() == "1xH100"
    monkeypatch.delenv("SWEEP_GPUS")
    assert h200_te.sweep_gpus() is None
