"""Tests of the exporters (launch/exporters) against the measured MiniMax-M2 seed
recipe.

The seed's YAML is in tests/fixtures/seed_minimax_m2_recipe.yaml, copied verbatim.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from flag_parsing import command_flags

from cost_model.types import Estimate
from launch.base import FailureKind, Measurement
from launch.exporters import dump_recipe, megatron_args_script, recipe_dict, slime_script, validate_recipe
from launch.exporters._flags import layout_args, megatron_args, model_args, model_for_release
from specs import RunOptions, Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Layout

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "seed_minimax_m2_recipe.yaml"
GIB = 2**30

#: slime's scripts/models/minimax-m2.sh MODEL_ARGS (slime 0.3.0, THUDM/slime a897e1f), as the seed recipe's run used
#: them.
SLIME_MINIMAX_M2_MODEL_ARGS = """
--spec slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec
--disable-bias-linear --num-layers 62 --hidden-size 3072 --ffn-hidden-size 1536 --num-attention-heads 48
--kv-channels 128 --num-query-groups 8 --normalization RMSNorm --position-embedding-type rope --norm-epsilon 1e-6
--swiglu --untie-embeddings-and-output-weights --vocab-size 200064 --group-query-attention --rotary-percent 0.5
--rotary-base 5000000 --qk-layernorm --no-rope-fusion --attention-softmax-in-fp32
--num-experts 256 --moe-ffn-hidden-size 1536 --moe-router-topk 8 --moe-layer-freq [1]*62 --moe-router-pre-softmax
--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-load-balancing-type none
--moe-token-dispatcher-type alltoall --moe-router-dtype fp32 --moe-aux-loss-coeff 0 --moe-grouped-gemm
--moe-permute-fusion
"""


# --------------------------------------------------------------------------- fixtures


def _stub_emit_layout_string(num_layers, pp, vpp, first=0, last=0, mtp_num_layers=0):  # pragma: no cover
    """Stand-in until search_spaces/pipeline.py lands, in its documented compressed form."""
    rest, mids = num_layers - first - last, pp - bool(first) - bool(last)
    per_rank = [first if (r == 0 and first) else last if (r == pp - 1 and last) else rest // mids for r in range(pp)]
    chunks = []  # chunks[r][v]: the short chunk first on rank 0 and the others, last on the last rank
    for r, n in enumerate(per_rank):
        base, rem = divmod(n, vpp)
        chunks.append(
            [base + 1] * rem + [base] * (vpp - rem) if r == pp - 1 else [base] * (vpp - rem) + [base + 1] * rem
        )
    stages = ["t" * chunks[i % pp][i // pp] for i in range(pp * vpp)]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp_num_layers + "L"
    stages = [re.sub(r"(.)\1{2,}", lambda m: f"{m.group(1)}*{len(m.group(0))}", st) for st in stages]
    out, i = [], 0
    while i < len(stages) - 1:
        k = 1
        while i + k < len(stages) - 1 and stages[i + k] == stages[i]:
            k += 1
        out.append(f"({stages[i]}|)*{k}" if k > 1 else stages[i] + "|")
        i += k
    return "".join(out) + stages[-1]


@pytest.fixture(autouse=True)
def _pipeline_module(monkeypatch):
    """Use search_spaces.pipeline when it exists, else a stub module."""
    if importlib.util.find_spec("search_spaces.pipeline") is None:  # pragma: no cover
        stub = types.ModuleType("search_spaces.pipeline")
        stub.emit_layout_string = _stub_emit_layout_string
        monkeypatch.setitem(sys.modules, "search_spaces.pipeline", stub)


@pytest.fixture(scope="module")
def seed() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


@pytest.fixture(scope="module")
def model():
    return load_model("MiniMax-M2")


@pytest.fixture(scope="module")
def cluster():
    return parse_gpus("64xH200")


@pytest.fixture(scope="module")
def workload():
    return Workload(seq_length=8192, global_batch_size=128)


@pytest.fixture(scope="module")
def seed_layout() -> Layout:
    return Layout(
        world_size=64, tp=1, pp=8, vpp=4, ep=8, etp=1, micro_batch_size=1,
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7,
    )  # fmt: skip


@pytest.fixture(scope="module")
def port_layout() -> Layout:
    """slime's run-minimax-m2.sh layout ported to 64 GPUs with EP 8 (the seed's reference recipe)."""
    return Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=2, ep=8, etp=1, micro_batch_size=1,
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True,
        use_distributed_optimizer=True, use_precision_aware_optimizer=True,
    )  # fmt: skip


def _estimate(layout: Layout) -> Estimate:
    memory = {
        "weights": 12.0 * GIB, "main_grads": 10.0 * GIB, "optimizer": 20.0 * GIB, "activations": 60.0 * GIB,
        "logits": 3.0 * GIB, "dispatcher_buffers": 2.0 * GIB, "framework_overhead": 5.0 * GIB,
    }  # fmt: skip
    time = {"compute": 3.1, "recompute": 0.9, "ep_comm": 0.8, "pp_bubble": 0.5, "pp_p2p": 0.05, "dp_comm": 0.1}
    return Estimate(
        layout=layout, memory=memory, peak_bytes=sum(memory.values()), hbm_bytes=143771 * 2**20,
        usable_bytes=130 * GIB, time=time, step_time_s=5.45, tokens_per_s_per_gpu=3006.5, mfu=0.19,
        model_tflops_per_gpu=201.3, usd_per_million_tokens=0.73,
    )  # fmt: skip


def _command_flags(script: str) -> dict[str, tuple[str, ...]]:
    return command_flags(script)


def _argv_flags(argv: list[str]) -> dict[str, tuple[str, ...]]:
    return _command_flags("python3 -m x " + " ".join(shlex.quote(a) for a in argv))


# --------------------------------------------------------------------------- the seed, flag for flag


def test_seed_layout_reproduces_seed_run_flag_for_flag(seed, model, cluster, workload, seed_layout):
    theirs = _command_flags(seed["run"])
    ours = _command_flags(slime_script(model, cluster, workload, seed_layout))
    names = list(theirs)
    relevant = names[names.index("--tensor-model-parallel-size") : names.index("--use-precision-aware-optimizer") + 1]
    relevant += [
        "--pipeline-model-parallel-layout", "--actor-num-nodes", "--actor-num-gpus-per-node",
        "--global-batch-size", "--seq-length",
    ]  # fmt: skip
    assert "--use-distributed-optimizer" in relevant and "--max-tokens-per-gpu" in relevant
    assert {f: ours.get(f) for f in relevant} == {f: theirs[f] for f in relevant}
    # Beyond those, every other flag of the seed's command comes back too, but the benchmark's: its rollout
    # function, step count and log folder come from RUN_ARGS (BENCHMARK=1 gives the seed's values:
    # test_export_scripts.py); the seed's `python3 -m <slime entry module> --async` is slime's train_async.py;
    # and the only flag we add is the dispatcher (slime has it in MODEL_ARGS).
    run_args = {"--rollout-function-path", "--num-rollout", "--tensorboard-dir", "--async"}
    assert {f: ours.get(f) for f in theirs if f not in run_args} == {
        f: v for f, v in theirs.items() if f not in run_args
    }
    assert set(ours) - set(theirs) == {"--moe-token-dispatcher-type"}
    assert ours["--moe-token-dispatcher-type"] == ("alltoall",)
    assert ours["--pipeline-model-parallel-layout"] == ("Et|(tt|)*30tL",)
    assert theirs["--rollout-function-path"] == ("pretokenized_sft_rollout.generate_rollout",) and theirs[
        "--num-rollout"
    ] == ("20",)


def test_seed_run_env_exports(seed, model, cluster, workload, seed_layout):
    script = slime_script(model, cluster, workload, seed_layout)
    for k, v in seed["env"].items():
        assert f"export {k}={v}\n" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_model_args_cover_slime_minimax_m2(model):
    slime = _argv_flags(SLIME_MINIMAX_M2_MODEL_ARGS.split())
    ours = _argv_flags(model_args(model))
    # The dispatcher is a layout flag and the fp32 softmax a misc flag here.
    moved = {"--moe-token-dispatcher-type", "--attention-softmax-in-fp32"}
    assert {f: v for f, v in slime.items() if f not in moved} == ours


def test_model_args_dense_and_mla():
    llama = _argv_flags(model_args(load_model("Llama-3.1-8B")))
    assert "--num-experts" not in llama and "--spec" not in llama and "--multi-latent-attention" not in llama
    assert llama["--num-query-groups"] == ("8",) and "--group-query-attention" in llama
    dsv3 = _argv_flags(model_args(load_model("DeepSeek-V3")))
    assert dsv3["--moe-layer-freq"] == ("[0]*3+[1]*58",)
    assert "--multi-latent-attention" in dsv3 and "--kv-channels" not in dsv3
    assert "--moe-shared-expert-intermediate-size" in dsv3


def test_model_args_gpt_oss_build_gpt_oss():
    """GPT-OSS's layers as Megatron-LM's own GPT-OSS example passes them (examples/post_training/modelopt/conf/openai/
    gpt-oss-120b.sh): biases on (no --disable-bias-linear), the clamped quick-GEGLU with offset 1, attention sinks, a
    127-token left window on every other layer (Megatron's integer form: layers 1, 3, ... of 36 slide, 2, 4, ...
    full)."""
    oss = _argv_flags(model_args(load_model("GPT-OSS-120B")))
    assert "--disable-bias-linear" not in oss and "--swiglu" not in oss and "--quick-geglu" in oss
    assert "--no-bias-dropout-fusion" in oss  # TEGroupedMLP refuses bias-dropout fusion with biases
    assert oss["--glu-linear-offset"] == ("1",) and oss["--activation-func-clamp-value"] == ("7",)
    assert (
        oss["--softmax-type"] == ("learnable",)
        and oss["--window-size"] == ("127,0",)
        and oss["--window-attn-skip-freq"] == ("2",)
    )
    odd = load_model("GPT-OSS-120B").replace(
        window_attn_skip_freq=(1, 1) + (0,) * 34
    )  # not periodic: the list, 1 = sliding
    assert _argv_flags(model_args(odd))["--window-attn-skip-freq"] == ("[0]*2+[1]*34",)
    lay = Layout(world_size=8, ep=8)
    wl = Workload(seq_length=4096, global_batch_size=64)
    gpt_oss = load_model("GPT-OSS-120B")
    # TE runs attention sinks only in cuDNN's fused attention: never --attention-backend flash for GPT-OSS
    assert _argv_flags(megatron_args(gpt_oss, parse_gpus("8xH100"), wl, lay))["--attention-backend"] == ("fused",)
    assert "--attention-backend fused" in slime_script(gpt_oss, parse_gpus("8xH100"), wl, lay)
    assert any("YaRN" in n for n in recipe_dict(gpt_oss, parse_gpus("8xH100"), wl, lay)["notes"])
    qwen = load_model("Qwen3-30B-A3B")
    assert _argv_flags(megatron_args(qwen, parse_gpus("8xH100"), wl, lay))["--attention-backend"] == ("flash",)
    assert not any("YaRN" in n for n in recipe_dict(qwen, parse_gpus("8xH100"), wl, lay)["notes"])
    for name in ("Qwen3-30B-A3B", "Llama-3.1-8B"):  # every other model: no bias, SwiGLU, no window
        other = _argv_flags(model_args(load_model(name)))
        assert "--disable-bias-linear" in other and "--swiglu" in other
        assert not {"--quick-geglu", "--softmax-type", "--window-size", "--glu-linear-offset"} & set(other)


def test_model_args_gpt_oss_yarn_as_its_config_says():
    """GPT-OSS's YaRN as Megatron-Bridge's GPT-OSS bridge sets it from config.json (factor 32, 4,096 original positions,
    betas 32 / 1, no rounding: ``truncate`` false), through megatron-core 0.19's --yarn-* flags; the recipe asks for
    0.19."""
    gpt_oss = load_model("GPT-OSS-120B")
    oss = _argv_flags(model_args(gpt_oss))
    assert oss["--position-embedding-type"] == ("yarn",) and oss["--rotary-base"] == ("150000",)
    assert oss["--rotary-scaling-factor"] == ("32",) and oss["--yarn-original-max-position-embeddings"] == ("4096",)
    assert oss["--yarn-beta-fast"] == ("32",) and oss["--yarn-beta-slow"] == ("1",)
    assert "--no-yarn-correction-range-round-to-int" in oss and "--yarn-correction-range-round-to-int" not in oss
    rounded = _argv_flags(model_args(gpt_oss.replace(rope_scaling_truncate=True, rope_scaling_beta_fast=16.0)))
    assert "--yarn-correction-range-round-to-int" in rounded and rounded["--yarn-beta-fast"] == ("16",)
    lay, wl = Layout(world_size=8, ep=8), Workload(seq_length=4096, global_batch_size=64)
    rec = recipe_dict(gpt_oss, parse_gpus("8xH100"), wl, lay)
    assert rec["stack"]["megatron_core"] == ">=0.19.0"
    assert (
        recipe_dict(load_model("Qwen3-30B-A3B"), parse_gpus("8xH100"), wl, lay)["stack"]["megatron_core"] != ">=0.19.0"
    )
    # an older release, or MTP layers (0.19 allows MTP only with rope): plain RoPE, and the reason as a note
    for release, m in (("0.18", gpt_oss), ("0.16", gpt_oss), (None, gpt_oss.replace(mtp_num_layers=1))):
        plain, why = model_for_release(m, release)
        assert plain.rope_scaling_type == "" and "does not reproduce the Hugging Face checkpoint" in why, release
        assert _argv_flags(model_args(plain))["--position-embedding-type"] == ("rope",)
    assert model_for_release(gpt_oss, "0.19") == (gpt_oss, None) and model_for_release(gpt_oss) == (gpt_oss, None)
    dsv3 = load_model("DeepSeek-V3")
    assert model_for_release(dsv3, "0.13") == (dsv3, None)  # MLA's YaRN is its own rope type
    for name in (
        "Qwen3-30B-A3B",
        "DeepSeek-V3",
    ):  # no YaRN, and MLA's YaRN: the rope position embedding, no --yarn-* flag
        other = _argv_flags(model_args(load_model(name)))
        assert other["--position-embedding-type"] == ("rope",) and not any(f.startswith("--yarn-") for f in other)


def test_summary_and_layout_match_seed(seed, model, cluster, workload, seed_layout):
    ours = recipe_dict(model, cluster, workload, seed_layout)
    for key in ("label", "summary", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "sequence_parallel", "layer_split",
                "max_tokens_per_gpu", "rows_per_microbatch", "recompute", "offload", "dispatcher"):  # fmt: skip
        assert ours["layout"][key] == seed["layout"][key], key
    seed_note = next(n for n in re.split(r"\n(?=- )", seed["notes"]) if "cuts the 62 layers" in n)
    want = " ".join(seed_note.removeprefix("- ").split())
    assert any(" ".join(n.split()) == want for n in ours["notes"])


# --------------------------------------------------------------------------- slime's reference port


def test_reference_port_flags(model, cluster, workload, port_layout):
    flags = _command_flags(slime_script(model, cluster, workload, port_layout))
    for f in ("--sequence-parallel", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
              "--use-precision-aware-optimizer", "--use-distributed-optimizer"):  # fmt: skip
        assert flags[f] == (), f
    assert flags["--tensor-model-parallel-size"] == ("2",)
    assert flags["--pipeline-model-parallel-size"] == ("2",)
    assert flags["--expert-model-parallel-size"] == ("8",)
    assert flags["--optimizer-offload-fraction"] == ("1.0",)
    assert "--pipeline-model-parallel-layout" in flags
    rec = recipe_dict(model, cluster, workload, port_layout)
    assert rec["layout"]["offload"] == {"optimizer_fraction": 1.0, "overlap_cpu_optimizer_d2h_h2d": True}
    assert rec["layout"]["summary"].startswith("TP 2 with sequence parallelism, PP 2, CP 1, EP 8, ETP 1, DP 16;")
    assert "CPU optimizer offload (fraction 1.0, overlapped copies)" in rec["layout"]["summary"]


def test_allgather_becomes_alltoall_for_slime_only(model, cluster, workload, seed_layout):
    lay = seed_layout.replace(dispatcher="allgather")
    script = slime_script(model, cluster, workload, lay)
    assert _command_flags(script)["--moe-token-dispatcher-type"] == ("alltoall",)
    assert re.search(r"^# .*allgather.*alltoall", script, re.M)
    assert _argv_flags(megatron_args(model, cluster, workload, lay))["--moe-token-dispatcher-type"] == ("allgather",)
    flex = _argv_flags(layout_args(seed_layout.replace(dispatcher="flex+hybridep"), model, workload))
    assert flex["--moe-token-dispatcher-type"] == ("flex",) and flex["--moe-flex-dispatcher-backend"] == ("hybridep",)


def test_layout_args_options(model, workload, seed_layout):
    sel = seed_layout.replace(
        recompute_granularity="selective", recompute_method="none", recompute_num_layers=0,
        recompute_modules=("core_attn", "moe_act"), exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16",
    )  # fmt: skip
    mega = _argv_flags(layout_args(sel, model, workload))
    assert mega["--recompute-modules"] == ("core_attn", "moe_act") and "--recompute-method" not in mega
    assert mega["--exp-avg-dtype"] == ("bf16",) and mega["--exp-avg-sq-dtype"] == ("bf16",)
    assert mega["--micro-batch-size"] == ("1",) and "--use-dynamic-batch-size" not in mega
    slime = _argv_flags(layout_args(sel.replace(cp=2, micro_batch_size=2), model, workload, framework="slime"))
    assert slime["--max-tokens-per-gpu"] == ("8192",) and "--micro-batch-size" not in slime
    with pytest.raises(TunerError, match="precision-aware"):
        layout_args(
            seed_layout.replace(use_precision_aware_optimizer=False, optimizer_offload_fraction=0.5), model, workload
        )


@pytest.mark.parametrize("user_args", [(), ("--lr", "3e-4")])
def test_optimizer_is_written_once(model, cluster, workload, seed_layout, user_args):
    lay = seed_layout.replace(use_precision_aware_optimizer=False)
    muon = RunOptions(optimizer="dist_muon")
    argv = megatron_args(model, cluster, workload, lay, options=muon, user_args=user_args)
    assert argv.count("--optimizer") == 1 and argv[argv.index("--optimizer") + 1] == "dist_muon"
    script = shlex.split(slime_script(model, cluster, workload, lay, options=muon, user_args=user_args))
    assert script.count("--optimizer") == 1 and script[script.index("--optimizer") + 1] == "dist_muon"
    assert megatron_args(model, cluster, workload, lay).count("--optimizer") == 1  # the seed's adam


def test_world_size_must_match_cluster(model, workload, seed_layout):
    with pytest.raises(TunerError, match="world_size 64"):
        slime_script(model, parse_gpus("32xH200"), workload, seed_layout)


# --------------------------------------------------------------------------- Megatron-LM bash array


def test_megatron_args_script_round_trips_through_bash(tmp_path, model, cluster, workload, seed_layout):
    argv = megatron_args(model, cluster, workload, seed_layout)
    assert "--bf16" in argv and "--micro-batch-size" in argv and "Et|(tt|)*30tL" in argv
    f = tmp_path / "megatron_args.sh"
    f.write_text(megatron_args_script(model, cluster, workload, seed_layout))
    out = subprocess.run(
        ["bash", "-c", 'source "$1"; printf "%s\\n" "${MEGATRON_ARGS[@]}"', "bash", str(f)],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert out.stdout.splitlines() == argv


# --------------------------------------------------------------------------- schema


def test_schema_accepts_seed_and_export(seed, model, cluster, workload, seed_layout):
    validate_recipe(seed)
    validate_recipe(recipe_dict(model, cluster, workload, seed_layout, estimate=_estimate(seed_layout)))


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda r: r["layout"].__setitem__("tp", 0), "$.layout.tp"),
        (lambda r: r.pop("layout"), "$: 'layout' is a required property"),
        (lambda r: r.__setitem__("status", "great"), "$.status: 'great' is not one of"),
        (lambda r: r["layout"].__setitem__("ep", 2.5), "$.layout.ep"),
    ],
)
def test_schema_rejects_bad_recipes(seed, mutate, path):
    bad = yaml.safe_load(FIXTURE.read_text())
    mutate(bad)
    with pytest.raises(TunerError) as e:
        validate_recipe(bad)
    assert any(line.startswith(path) for line in str(e.value).splitlines()[1:]), str(e.value)


def test_schema_lists_every_error_and_checks_degrees(seed):
    bad = yaml.safe_load(FIXTURE.read_text())
    bad["layout"]["tp"], bad["status"] = 0, "great"
    lines = str(pytest.raises(TunerError, validate_recipe, bad).value).splitlines()[1:]
    assert [ln.split(":")[0] for ln in lines] == ["$.layout.tp", "$.status"]
    bad = yaml.safe_load(FIXTURE.read_text())
    bad["layout"]["dp"] = 4
    with pytest.raises(TunerError, match=r"\$\.layout: tp\*pp\*cp\*dp = 32 but gpu.count is 64"):
        validate_recipe(bad)


# --------------------------------------------------------------------------- status, result, YAML


def test_status_measured_only_with_a_measured_measurement(model, cluster, workload, seed_layout):
    est = _estimate(seed_layout)
    predicted = Measurement(layout=seed_layout, source="predicted", tokens_per_s_per_gpu=3000.0, peak_bytes=1e11)
    assert recipe_dict(model, cluster, workload, seed_layout, estimate=est)["status"] == "predicted"
    assert recipe_dict(model, cluster, workload, seed_layout, measurement=predicted)["status"] == "predicted"
    measured = Measurement(
        layout=seed_layout, source="measured", tokens_per_s_per_gpu=2034.42, peak_bytes=120 * GIB,
        step_times_s=(4.0, 4.1, 3.9, 4.0), extra={"measured": "2026-10-21"},
    )  # fmt: skip
    rec = recipe_dict(model, cluster, workload, seed_layout, estimate=est, measurement=measured)
    assert rec["status"] == "measured"
    r = rec["result"]
    assert r["tokens_per_s_per_gpu"] == 2034.42 and r["usd_per_million_tokens"] == 1.08  # the seed's numbers
    assert r["mfu"] == 0.1285 and r["measured"] == dt.date(2026, 10, 21)
    assert r["step_time_cv_percent"] == pytest.approx(2.04, abs=0.01)
    assert (
        rec["prediction"]["tokens_per_s_per_gpu"] == 3006.5 and rec["prediction"]["note"] == "predicted, not measured"
    )
    validate_recipe(rec)
    oom = Measurement(
        layout=seed_layout, source="measured", tokens_per_s_per_gpu=0.0, peak_bytes=0, failure=FailureKind.oom
    )
    assert recipe_dict(model, cluster, workload, seed_layout, measurement=oom)["status"] == "failed"
    with pytest.raises(TunerError, match="measurement is for"):
        recipe_dict(model, cluster, workload, seed_layout.replace(vpp=2), measurement=measured)


def test_recipe_yaml_round_trips(model, cluster, workload, seed_layout):
    measured = Measurement(
        layout=seed_layout, source="measured", tokens_per_s_per_gpu=2034.42, peak_bytes=120 * GIB,
        step_times_s=(4.0, 4.1), extra={"measured": dt.date(2026, 10, 21)},
    )  # fmt: skip
    rec = recipe_dict(
        model, cluster, workload, seed_layout, estimate=_estimate(seed_layout), measurement=measured, study="s1"
    )
    assert list(rec)[:5] == ["schema_version", "model", "gpu", "author", "status"]
    text = dump_recipe(rec)
    assert yaml.safe_load(text) == rec
    assert "\nrun: |\n" in text


def test_model_args_carry_rope_norm_and_router_numerics():
    """Without these a run would train a different model than the checkpoint (Megatron defaults differ)."""
    from launch.exporters._flags import model_args
    from specs import load_model

    llama = _argv_flags(model_args(load_model("Llama-3.1-70B")))
    assert llama["--rotary-base"] == ("500000",) and llama["--norm-epsilon"] == ("1e-5",)
    assert "--use-rope-scaling" in llama and llama["--rope-scaling-factor"] == ("8",)
    ds = _argv_flags(model_args(load_model("DeepSeek-V3")))
    assert ds["--moe-router-score-function"] == ("sigmoid",) and "--moe-router-enable-expert-bias" in ds
    assert ds["--moe-router-topk-scaling-factor"] == ("2.5",)
    assert ds["--moe-router-num-groups"] == ("8",) and ds["--moe-router-group-topk"] == ("4",)
    assert ds["--rotary-scaling-factor"] == ("40",) and "--qk-layernorm" in ds
    qwen = _argv_flags(model_args(load_model("Qwen3-30B-A3B")))
    assert qwen["--rotary-base"] == ("1000000",) and qwen["--norm-epsilon"] == ("1e-6",)


def test_deepep_across_nodes_carries_a_network_note(model, cluster, workload, seed_layout):
    cross = seed_layout.replace(
        pp=4, vpp=8, ep=16, dispatcher="flex+deepep", num_layers_in_first_pipeline_stage=16,
        num_layers_in_last_pipeline_stage=14,
    )
    inside = seed_layout.replace(dispatcher="flex+deepep")  # EP 8 within one 8-GPU node
    note = "spans NVLink domains, so DeepEP's inter-node kernels"
    assert any(note in n for n in recipe_dict(model, cluster, workload, cross)["notes"])
    assert not any(note in n for n in recipe_dict(model, cluster, workload, inside)["notes"])


@pytest.mark.parametrize("command", ["export", "verify", "timeline"])
def test_trial_help_names_the_default_the_command_takes(command):
    """Without --trial these commands take the trial `tune` recommended (tuner.report.pick_trial_row with the study's
    best_trial, chosen by pick_best), which need not be the fastest on the front: the help says so."""
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "the study's best" in r.output and "fastest on" not in r.output, r.output


def test_the_users_arguments_and_the_tools_never_say_one_thing_twice_or_against_itself():
    """merge_user_args: a tuned flag stands (the user's --tensor-model-parallel-size, --fp16 beside --bf16 and
    --recompute-activations, selective recompute the layout did not choose, go), the
    user's setting replaces a free flag of the tool's and one Megatron refuses beside it (--lr-warmup-fraction)."""
    from launch.exporters._flags import merge_user_args

    tuned = [["--bf16"], ["--tensor-model-parallel-size", "4"]]
    free = [["--attention-backend", "flash"], ["--lr-warmup-fraction", "0.1"], ["--attention-softmax-in-fp32"]]
    user = [
        "--fp16", "--tensor-model-parallel-size", "8", "--recompute-activations", "--lr-warmup-iters", "5",
        "--attention-backend", "fused", "--attention-softmax-in-fp32", "--log-interval", "1",
    ]
    assert merge_user_args(tuned, free, user) == (
        [["--attention-softmax-in-fp32"]],
        [["--lr-warmup-iters", "5"], ["--attention-backend", "fused"], ["--log-interval", "1"]],
    )


def test_tp_comm_overlap_is_left_out_at_tp_1():
    """Megatron-LM turns sequence parallelism off at TP 1 and then refuses --tp-comm-overlap."""
    from specs import RunOptions

    qwen, wl, opts = (
        load_model("Qwen3-30B-A3B"),
        Workload(seq_length=4096, global_batch_size=64),
        RunOptions(tp_comm_overlap=True),
    )
    tp1, tp2 = Layout(world_size=8, ep=8), Layout(world_size=8, tp=2, ep=4, sequence_parallel=True)
    assert "--tp-comm-overlap" not in megatron_args(qwen, parse_gpus("8xH100"), wl, tp1, options=opts)
    assert "--tp-comm-overlap" not in slime_script(qwen, parse_gpus("8xH100"), wl, tp1, options=opts)
    assert "--tp-comm-overlap" in megatron_args(qwen, parse_gpus("8xH100"), wl, tp2, options=opts)
