"""Run options on the command line (Megatron-LM's flags), the stack presets, and ``tune --from`` (the user's launch)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from flag_parsing import launch_inputs_of
from typer.testing import CliRunner

from search_spaces.rules import RuleEnv, check_layout
from specs import DEFAULT_RUN_OPTIONS, Layout, Precision, RunOptions, TunerError, Workload, load_model
from specs.stacks import RunFlags, list_stacks, load_stack, resolve_run_options, run_option_args
from tuner.cli import app
from tuner.launch_file import read_launch

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SEED_LAUNCH = ROOT / "tests/fixtures/launch/seed_minimax_m2_launch.sh"
SEED_RECIPE = ROOT / "tests/fixtures/seed_minimax_m2_recipe.yaml"
#: The seed's layout as explicit flags (seeds/001: TP1 PP8 VPP4 EP8, first/last 7, full recompute, mbs 1).
SEED_FLAGS = [
    "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "8", "--ep", "8", "--recompute", "full", "--pipeline-layout",
    "Et|(tt|)*30tL",
]


def _estimate(*args: str) -> dict:
    r = runner.invoke(app, ["estimate", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# ---- presets ------------------------------------------------------------------------------------------------------


def test_the_default_stack_is_the_seeds_run_options():
    run = resolve_run_options(RunFlags())
    assert run.preset.name == "slime" and run.options == DEFAULT_RUN_OPTIONS and run.overrides == ()


def test_every_preset_loads_and_cites_an_upstream_file_at_a_commit():
    assert list_stacks() == ["megatron-bridge", "megatron-lm", "nemo-rl", "slime"]
    for name in list_stacks():
        p = load_stack(name)
        assert p.sources and all(re.search(r"@[0-9a-f]{8} \S+ l\.\d", s) for s in p.sources), p.sources
        raw = yaml.safe_load((ROOT / f"specs/data/stacks/{name}.yaml").read_text())
        assert all(re.fullmatch(r"[0-9a-f]{40}", s["commit"]) for s in raw["sources"])


def test_megatron_is_an_alias_of_megatron_lm():
    assert load_stack("megatron").name == "megatron-lm" == load_stack("Megatron-LM").name


def test_megatron_bridge_sets_its_perf_recipe_options():
    o = resolve_run_options(RunFlags(), "megatron-bridge").options
    assert (
        o.grad_reduce_in_fp32, o.cross_entropy_loss_fusion, o.cross_entropy_fusion_impl, o.optimizer_fp8_recipe,
    ) == (False, True, "te", "tensorwise")


def test_a_flag_overrides_the_preset_and_the_line_says_so():
    run = resolve_run_options(
        RunFlags(accumulate_allreduce_grads_in_fp32=True, cross_entropy_loss_fusion=True), "megatron-bridge"
    )
    assert run.options.grad_reduce_in_fp32 is True
    assert run.overrides == ("--accumulate-allreduce-grads-in-fp32",)  # the loss fusion repeats the preset's value
    assert "stack megatron-bridge" in run.line and "overrides: --accumulate-allreduce-grads-in-fp32" in run.line


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (RunFlags(grad_reduce_in_bf16=True, accumulate_allreduce_grads_in_fp32=True), "contradict each other"),
        (RunFlags(cuda_graph_impl="none", cuda_graph_scope=("moe_router",)), "no graph is captured"),
        (RunFlags(cross_entropy_fusion_impl="te"), "the cross-entropy loss fusion is off"),
        (RunFlags(cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="te"), "--no-cross-entropy-loss-fusion"),
        (RunFlags(fp8_param_gather=True), "--precision is bf16"),
        (RunFlags(cuda_graph_scope=("everything",)), "accepted full, full_iteration"),
        (RunFlags(fp8_recipe="mxfp9"), "--fp8-recipe 'mxfp9': accepted delayed, tensorwise"),
    ],
)
def test_contradictory_or_unknown_flags_are_refused(flags, message):
    with pytest.raises(TunerError, match=re.escape(message)):
        resolve_run_options(flags)


def test_an_unknown_stack_names_the_accepted_ones():
    r = runner.invoke(app, ["check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--stack", "deepspeed"])
    assert r.exit_code == 2 and "--stack 'deepspeed': accepted megatron-bridge, megatron-lm, nemo-rl, slime" in r.output


def test_fp8_recipe_with_bf16_is_the_optimizers_recipe():
    """Megatron copies --fp8-recipe onto the optimizer config: tensorwise keeps fp32 master weights in a bf16 run."""
    o = resolve_run_options(RunFlags(fp8_recipe="tensorwise")).options
    assert (o.fp8_recipe, o.optimizer_fp8_recipe, o.precision_aware_owns_masters(Precision.bf16)) == (
        "delayed",
        "tensorwise",
        False,
    )
    assert resolve_run_options(RunFlags(fp8_recipe="tensorwise"), precision="fp8").options.fp8_recipe == "tensorwise"


def test_cuda_graph_impl_without_scope_captures_whole_layers():
    assert resolve_run_options(RunFlags(cuda_graph_impl="transformer_engine")).options.cuda_graph_scope == ("full",)
    assert resolve_run_options(RunFlags(cuda_graph_impl="full_iteration")).options.cuda_graph_scope == (
        "full_iteration",
    )
    assert resolve_run_options(RunFlags(cuda_graph_scope=("attn,moe_router",))).options.cuda_graph_scope == (
        "attn",
        "moe_router",
    )


@pytest.mark.parametrize(
    "impl, scope, args",
    [
        ("local", None, ["--cuda-graph-impl", "local"]),
        ("transformer_engine", ("attn",), ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"]),
        ("full_iteration", None, ["--cuda-graph-impl", "full_iteration"]),
        (None, ("moe_router",), ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "moe_router"]),
    ],
)
def test_the_cuda_graph_impl_given_is_the_one_exported(impl, scope, args):
    o = resolve_run_options(RunFlags(cuda_graph_impl=impl, cuda_graph_scope=scope)).options
    a = run_option_args(o)
    i = a.index("--cuda-graph-impl")
    assert a[i : i + len(args)] == args and a.count("--cuda-graph-impl") == 1


def test_per_layer_cuda_graphs_refuse_full_recompute_and_cpu_offloading():
    """megatron/core/transformer/transformer_config.py at d98e8a64: per-layer graphs refuse both; full_iteration not."""
    env = RuleEnv.of(options=resolve_run_options(RunFlags(cuda_graph_impl="local")).options)
    full = dict(
        check_layout(
            Layout(
                world_size=8, tp=1, pp=1, recompute_granularity="full", recompute_method="uniform",
                recompute_num_layers=1,
            ),
            load_model("Llama-3.1-8B"),
            Workload(seq_length=8192, global_batch_size=128),
            env,
        )
    )
    assert "cuda_graphs" in full
    for impl, offload, bad in (("full_iteration", 0, False), ("local", 2, True), ("full_iteration", 2, False)):
        env = RuleEnv.of(options=RunOptions(cuda_graph_impl=impl, cpu_offloading_num_layers=offload))
        got = dict(
            check_layout(
                Layout(world_size=8, tp=1, pp=1),
                load_model("Llama-3.1-8B"),
                Workload(seq_length=8192, global_batch_size=128),
                env,
            )
        )
        assert ("cuda_graphs" in got) == bad, (impl, offload, got)


def test_a_perf_config_with_cuda_graphs_and_cpu_offloading_is_refused_by_name(tmp_path):
    """Megatron refuses cuda_graphs: true (impl local) with CPU offloading at start-up: so does tune, naming both."""
    f = tmp_path / "perf.yaml"
    f.write_text(
        BRIDGE_PERF.read_text()
        .replace(
            "        cuda_graphs: false\n        tp: 1\n        pp: 2\n",
            "        cuda_graphs: true\n        cpu_offloading_num_layers: 47\n        tp: 1\n        pp: 1\n",
            1,
        )
        .replace("vp: 12", "vp: null", 1)
    )
    r = runner.invoke(app, ["--from", str(f), "--model", "Qwen3-30B-A3B", "--gpus", "16xH100"])
    assert r.exit_code == 2, r.output
    assert "--cuda-graph-impl local with --cpu-offloading-num-layers 47" in " ".join(r.output.split())


# ---- the commands -------------------------------------------------------------------------------------------------


def test_estimate_prices_bf16_main_grads_and_says_which_stack():
    base = _estimate(*SEED_FLAGS)
    bf16 = _estimate(*SEED_FLAGS, "--grad-reduce-in-bf16")
    assert base["stack"] == "slime" and base["run_flags"] == [] and bf16["run_flags"] == ["--grad-reduce-in-bf16"]
    assert bf16["run_options"]["grad_reduce_in_fp32"] is False
    assert bf16["peak_gib"] < base["peak_gib"]
    r = runner.invoke(app, ["estimate", *SEED_FLAGS, "--stack", "megatron-bridge", "--no-cross-entropy-loss-fusion"])
    assert r.exit_code == 0, r.output
    assert (
        "stack megatron-bridge (specs/data/stacks/megatron-bridge.yaml); overrides: --no-cross-entropy-loss-fusion"
        in r.output
    )


def test_contradictory_flags_exit_2_on_every_estimating_command(tmp_path):
    bad = ["--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"]
    for cmd in (["estimate"], ["check"], ["timeline", "--out", str(tmp_path / "t.json")], []):
        r = runner.invoke(app, [*cmd, *SEED_FLAGS[:4], *bad, *(["--pp", "8", "--ep", "8"] if cmd else [])])
        assert r.exit_code == 2 and "contradict each other" in r.output, (cmd, r.output)
    assert not (tmp_path / "t.json").exists()


def test_every_run_flag_has_one_alias_on_every_estimating_command():
    import typer

    from tuner.cli._common import RUN_FLAG_OPTIONS

    assert set(RUN_FLAG_OPTIONS) == {f.name for f in dataclasses.fields(RunFlags)}
    root = typer.main.get_command(app)
    for cmd in (root, *(root.get_command(None, n) for n in ("estimate", "check", "timeline"))):
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for flag in (
            "--stack", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--cross-entropy-fusion-impl",
            "--cuda-graph-scope", "--moe-permute-fusion", "--no-moe-permute-fusion", "--fp8-recipe", "--task",
        ):
            assert flag in opts, (cmd.name, flag)


# ---- exports --------------------------------------------------------------------------------------------------------


def test_exported_commands_write_the_run_options():
    from launch.exporters._flags import megatron_args
    from launch.exporters._recipe import recipe_dict
    from specs import Layout, Workload, load_model, parse_gpus

    m, c, w = load_model("Qwen3-30B-A3B"), parse_gpus("16xH100"), Workload(seq_length=4096, global_batch_size=512)
    lay = Layout(world_size=16, ep=16)
    opts = resolve_run_options(RunFlags(), "megatron-bridge").options
    argv = megatron_args(m, c, w, lay, options=opts)
    assert "--grad-reduce-in-bf16" in argv and "--accumulate-allreduce-grads-in-fp32" not in argv
    assert argv[argv.index("--cross-entropy-fusion-impl") + 1] == "te" and "--cross-entropy-loss-fusion" in argv
    assert "--overlap-grad-reduce" in argv and "--moe-permute-fusion" in argv
    plain = megatron_args(m, c, w, lay)
    assert "--accumulate-allreduce-grads-in-fp32" in plain and "--cross-entropy-loss-fusion" not in plain
    rec = recipe_dict(m, c, w, lay, options=opts, stack="megatron-bridge")
    assert rec["stack"]["preset"] == "megatron-bridge"
    assert rec["stack"]["run_options"]["grad_reduce_in_fp32"] is False
    assert "--grad-reduce-in-bf16" in rec["run"]


def test_a_model_argument_is_not_written_twice():
    """MiniMax-M2's MODEL_ARGS already hold --moe-permute-fusion and --no-rope-fusion."""
    from launch.exporters._flags import megatron_args
    from specs import Layout, Workload, load_model, parse_gpus

    opts = dataclasses.replace(RunOptions(), moe_permute_fusion=True, apply_rope_fusion=False)
    argv = megatron_args(
        load_model("MiniMax-M2"), parse_gpus("64xH200"), Workload(), Layout(world_size=64, ep=8, pp=2), options=opts
    )
    assert argv.count("--moe-permute-fusion") == 1 and argv.count("--no-rope-fusion") == 1


# ---- tune --from --------------------------------------------------------------------------------------------------




def _estimate_from(fi) -> tuple[float, float]:
    from cost_model.estimate import estimate
    from specs import Layout, Workload, load_model, parse_gpus

    o = resolve_run_options(fi.run.flags, fi.run.stack).options
    e = estimate(
        load_model(fi.model),
        parse_gpus(fi.gpus),
        Workload(seq_length=fi.seq_len, global_batch_size=fi.global_batch),
        Layout.from_dict(fi.baseline),
        options=o,
    )
    return e.tokens_per_s_per_gpu, e.peak_bytes


def test_the_seed_launch_gives_the_explicit_flags_estimate():
    """seeds/001's run block with slime's MiniMax-M2 MODEL_ARGS: the same numbers as tune estimate with its flags."""
    fi = launch_inputs_of(SEED_LAUNCH)
    assert (fi.model, fi.gpus, fi.seq_len, fi.global_batch, fi.run.stack) == (
        "MiniMax-M2", "8x8xH200", 8192, 128, "slime",
    )
    explicit = _estimate(*SEED_FLAGS)
    tps, peak = _estimate_from(fi)
    assert (tps, peak / 2**30) == (explicit["tokens_per_s_per_gpu"], explicit["peak_gib"])
    # and the same from the seed's recipe.yaml (its run block, its model and GPUs)
    assert _estimate_from(launch_inputs_of(SEED_RECIPE, gpus=None)) == _estimate_from(fi)


def test_every_argument_of_the_launch_is_sorted_once():
    lf = launch_inputs_of(SEED_LAUNCH).launch
    text = SEED_LAUNCH.read_text()
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    sorted_ = set(lf.understood) | set(lf.no_effect) | set(lf.not_understood)
    assert flags == sorted_ and not lf.not_understood
    assert not set(lf.understood) & set(lf.no_effect)
    assert (
        "--lr" in lf.no_effect and "--tensor-model-parallel-size" in lf.understood and "--hidden-size" in lf.understood
    )


def test_an_argument_not_understood_is_named_and_kept(tmp_path):
    f = tmp_path / "run.sh"
    f.write_text(
        SEED_LAUNCH.read_text().replace(
            "--attention-backend flash",
            "--attention-backend flash --my-new-flag 3 \\\n  --accumulate-allreduce-grads-in-fp32",
        )
    )
    lf = launch_inputs_of(f).launch
    assert lf.not_understood == ("--my-new-flag",) and "--my-new-flag 3" in " ".join(lf.user_args)
    assert "not understood: --my-new-flag" in lf.summary


def test_flags_on_the_command_line_win_over_the_file():
    from tuner.cli._common import RunChoice
    from tuner.cli._from import launch_inputs

    fi = launch_inputs(
        SEED_LAUNCH,
        None,
        model=None,
        gpus="H200",
        seq_len=8192,
        global_batch=128,
        precision="bf16",
        layers=None,
        run=RunChoice(stack="megatron-bridge", flags=RunFlags(grad_reduce_in_bf16=True)),
    )
    run = resolve_run_options(fi.run.flags, fi.run.stack)  # the file's --accumulate-allreduce-grads-in-fp32 gives way
    assert run.options.grad_reduce_in_fp32 is False and run.preset.name == "megatron-bridge"


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("hello world\n", "notes.txt", "no command with -- arguments"),
        (
            "a: 1\n",
            "x.yaml",
            "performance config (ConfigContainer, perf_matrix), a NeMo-RL config (policy section), or a recipe.yaml",
        ),
        ("torchrun pretrain_gpt.py --hidden-size 1234 --num-attention-heads 7\n", "run.sh", "is none of the presets"),
        ("torchrun pretrain_gpt.py --tensor-model-parallel-size 2\n", "run.sh", "names no model"),
        (
            "torchrun pretrain_gpt.py --tensor-model-parallel-size two\n",
            "run.sh",
            "--tensor-model-parallel-size: invalid int value: 'two'",
        ),
    ],
)
def test_a_file_that_is_not_a_launch_is_refused(tmp_path, text, name, message):
    f = tmp_path / name
    f.write_text(text)
    r = runner.invoke(app, ["--from", str(f), "--gpus", "8xH100"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_gpus_that_disagree_with_the_file_are_refused():
    with pytest.raises(TunerError, match=r"runs on 64 GPUs \(8 x 8\) but --gpus 32xH200 has 32"):
        launch_inputs_of(SEED_LAUNCH, gpus="32xH200")


def test_the_main_job_from_the_seed_launch(tmp_path):
    """The launch is the first trial, printed as the baseline beside the best; exports keep the user's arguments."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "tp: [1]\npp: [8]\nvpp: [4, 8]\ncp: [1]\nep: [8]\netp: [1]\nmicro_batch_size: [1]\n"
        "recompute:\n  - {granularity: full, method: uniform, num_layers: 1}\noptimizer_offload_fraction: [0.0]\n"
        "dispatcher: [alltoall]\n"
    )
    r = runner.invoke(
        app,
        [
            "--from", str(SEED_LAUNCH), "--gpus", "H200", "--space", str(space), "--trials", "2", "--results-dir",
            str(tmp_path), "--study", "s",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    explicit = _estimate(*SEED_FLAGS)
    assert (
        f"its layout TP1 PP8 VPP4 EP8 DP8: {explicit['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU predicted" in r.output
    )
    assert "the study evaluates it" in r.output and "none not understood" in r.output
    assert re.search(
        r"your launch \(trial 0\): [\d,.]+ tokens/s/GPU predicted \(90%: [\d,]+-[\d,]+\), [\d.]+ GiB; best: TP1 PP8 "
        r"VPP\d EP8 DP8, .*[+-]\d+%",
        r.output,
    )
    assert "stack slime (specs/data/stacks/slime.yaml)" in r.output
    assert "--command-template launch/templates/slime_command.yaml" in r.output
    run = (tmp_path / "s/run_slime.sh").read_text()
    assert "--calculate-per-token-loss" in run and run.count("  --hf-checkpoint ") == 1
    rec = yaml.safe_load((tmp_path / "s/recipe.yaml").read_text())
    assert rec["stack"]["preset"] == "slime" and "--lr" in rec["stack"]["user_args"]


def test_another_launch_of_the_same_job_is_evaluated_in_its_study(tmp_path):
    """A second `tune --from` of the same job (same run options, so the same study) with another layout: its layout
    is added to the study, and only it."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "tp: [1]\npp: [2, 8]\nvpp: [1]\ncp: [1]\nep: [8]\netp: [1]\nmicro_batch_size: [1]\n"
        "recompute:\n  - {granularity: full, method: uniform, num_layers: 1}\noptimizer_offload_fraction: [0.0]\n"
        "dispatcher: [alltoall]\n"
    )
    other = tmp_path / "pp2.sh"
    text = SEED_LAUNCH.read_text().replace("--pipeline-model-parallel-size 8", "--pipeline-model-parallel-size 2")
    other.write_text(text.replace(" \\\n  --pipeline-model-parallel-layout 'Et|(tt|)*30tL'", ""))
    args = ["--gpus", "H200", "--space", str(space), "--results-dir", str(tmp_path), "--study", "s"]
    first = runner.invoke(app, ["--from", str(SEED_LAUNCH), *args, "--trials", "1"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["--from", str(other), *args], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert "2 layouts evaluated in total (1 now)" in second.output and "your launch's layout added" in second.output
    assert "your launch (trial 1): " in second.output and "TP1 PP2 EP8 DP32" in second.output
    assert "GiB (may not fit); the study evaluates it" in second.output  # tune estimate's verdict, by the 90% band
    third = runner.invoke(app, ["--from", str(other), *args], env={"COLUMNS": "200"})
    assert "(0 now)" in third.output and "none added" in third.output


def test_estimate_from_the_seed_launch_is_the_explicit_flags_estimate():
    """`tune estimate --from` takes the launch's layout and options: the numbers of the explicit flags, and the launch's
    arguments as read."""
    d = _estimate("--from", str(SEED_LAUNCH), "--gpus", "H200")
    explicit = _estimate(*SEED_FLAGS)
    assert (d["tokens_per_s_per_gpu"], d["peak_gib"]) == (explicit["tokens_per_s_per_gpu"], explicit["peak_gib"])
    assert d["pipeline_model_parallel_layout"] == "Et|(tt|)*30tL" and d["stack"] == "slime"
    assert d["launch"]["not_understood"] == [] and "--lr" in d["launch"]["no_effect"]


def test_estimate_from_with_a_layout_flag_replaces_the_launchs_pipeline_split():
    """--pp given here drops the launch's layout string (its split is for PP 8); the rest of the launch stays."""
    args = ["--pp", "4", "--first-stage-layers", "15", "--last-stage-layers", "15"]
    d = _estimate("--from", str(SEED_LAUNCH), "--gpus", "H200", *args)
    explicit = _estimate(*SEED_FLAGS[:4], "--ep", "8", "--recompute", "full", *args)
    assert d["layout"] == explicit["layout"] and d["tokens_per_s_per_gpu"] == explicit["tokens_per_s_per_gpu"]


def test_timeline_from_the_seed_launch_is_the_explicit_flags_trace(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r = runner.invoke(app, ["timeline", "--from", str(SEED_LAUNCH), "--gpus", "H200", "--out", str(a)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["timeline", *SEED_FLAGS, "--out", str(b)])
    assert r.exit_code == 0, r.output
    assert a.read_text() == b.read_text()
    r = runner.invoke(app, ["timeline", "--from", str(SEED_LAUNCH), "--study", "s", "--results-dir", str(tmp_path)])
    assert r.exit_code == 2 and "leave out the layout flags, --from" in r.output


def test_a_megatron_bridge_override_yaml_is_read_setting_by_setting():
    fi = launch_inputs_of(ROOT / "tests/fixtures/launch/bridge_override.yaml", gpus="16xH100", model="Qwen3-30B-A3B")
    lf = fi.launch
    assert (lf.kind, fi.run.stack, fi.seq_len, fi.global_batch) == ("megatron-bridge", "megatron-bridge", 4096, 512)
    assert lf.not_understood == ("model.my_experimental_knob",)
    assert {"optimizer.lr", "logger.log_interval", "dist.use_torch_fsdp2", "model.gradient_accumulation_fusion"} <= set(
        lf.no_effect
    )
    assert {"model.expert_model_parallel_size", "ddp.grad_reduce_in_fp32", "model.recompute_modules"} <= set(
        lf.understood
    )
    assert (fi.baseline["ep"], fi.baseline["recompute_modules"], fi.baseline["use_distributed_optimizer"]) == (
        16,
        ["moe_act"],
        True,
    )
    o = resolve_run_options(fi.run.flags, fi.run.stack).options
    assert (o.grad_reduce_in_fp32, o.cross_entropy_fusion_impl, o.overlap_grad_reduce) == (False, "te", True)


BRIDGE_PERF = ROOT / "tests/fixtures/launch/qwen3_30b_a3b_llm_pretrain.yaml"


def _leaves(doc, prefix=""):
    """Every setting of a YAML mapping as ``a.b.c``."""
    for k, v in doc.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_a_megatron_bridge_performance_config_is_read_entry_by_entry():
    """Megatron-Bridge's own Qwen3-30B-A3B performance config: the --gpus entry of its perf_matrix, the --precision one
    of that; every setting of its ConfigContainer and of the entry read is sorted once, the rest named."""
    fi = launch_inputs_of(BRIDGE_PERF, gpus="H100", model="Qwen3-30B-A3B")
    lf = fi.launch
    assert (fi.gpus, fi.seq_len, fi.global_batch, fi.precision, fi.run.stack) == (
        "2x8xH100", 4096, 512, "bf16", "megatron-bridge",
    )
    b = fi.baseline
    assert (b["tp"], b["pp"], b["vpp"], b["ep"], b["micro_batch_size"], b["recompute_granularity"]) == (
        1, 2, 12, 8, 1, "none",
    )
    assert lf.not_understood == ("model.moe_router_fusion",)
    doc = yaml.safe_load(BRIDGE_PERF.read_text())
    read = {
        *_leaves(doc["ConfigContainer"]),
        *(
            f"perf_matrix.h100.num_gpus_16.{k}"
            for k in _leaves(doc["perf_matrix"]["h100"]["num_gpus_16"])
            if not k.startswith("fp8_cs")
        ),
        "perf_matrix.h100.num_gpus_16.bf16",
    }  # its precision
    got = [*lf.understood, *lf.no_effect, *lf.not_understood]
    assert len(got) == len(set(got)) and set(got) == read, set(got) ^ read
    fp8 = read_launch(BRIDGE_PERF, model="Qwen3-30B-A3B", gpus="16xH100", precision="fp8")
    assert (fp8.precision, fp8.layout["micro_batch_size"], fp8.run_flags.fp8_recipe) == ("fp8", 2, "tensorwise")
    assert "perf_matrix.h100.num_gpus_16.common.fsdp" in lf.no_effect  # Bridge's scripts read use_megatron_fsdp only
    gb = read_launch(BRIDGE_PERF, model="Qwen3-30B-A3B", gpus="GB200")
    assert (gb.nodes, gb.gpus_per_node, gb.layout["micro_batch_size"]) == (2, 4, 4)
    # cuda_graphs: true is model.enable_cuda_graph, megatron-core's cuda_graph_impl "local" (whole layers)
    assert (gb.run_flags.cuda_graph_impl, gb.run_flags.cuda_graph_scope) == ("local", None)
    assert "perf_matrix.gb200.num_gpus_8.common.cuda_graphs" in gb.understood and gb.not_understood == (
        "model.moe_router_fusion",
    )


@pytest.mark.parametrize(
    "key, value, flags",
    [
        ("cuda_graphs", "true", {"cuda_graph_impl": "local"}),
        ("cuda_graphs", "false", {}),
        ("recompute_num_layers", "5", {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5}),
        ("recompute_num_layers", "null", {}),
        ("cpu_offloading_num_layers", "20", {"cpu_offloading_num_layers": 20}),
        ("cpu_offloading_num_layers", "0", {}),
    ],
)
def test_a_performance_config_s_perf_matrix_settings_are_read_as_bridge_s_scripts_apply_them(
    tmp_path, key, value, flags
):
    """Megatron-Bridge 22a838d7 scripts/performance/utils/helpers.py l.114-135: each perf_matrix setting as the run
    option or layout flag it sets; a null, false or 0 sets nothing and is still understood."""
    f = tmp_path / "perf.yaml"
    f.write_text(BRIDGE_PERF.read_text().replace("        cuda_graphs: false\n", f"        {key}: {value}\n", 1))
    lf = read_launch(f, model="Qwen3-30B-A3B", gpus="H100")
    assert f"perf_matrix.h100.num_gpus_16.common.{key}" in lf.understood
    base = read_launch(BRIDGE_PERF, model="Qwen3-30B-A3B", gpus="H100")
    assert lf.run_flags == dataclasses.replace(
        base.run_flags, **{k: v for k, v in flags.items() if hasattr(base.run_flags, k)}
    )
    assert lf.layout == {**base.layout, **{k: v for k, v in flags.items() if not hasattr(base.run_flags, k)}}


def test_a_whole_megatron_bridge_config_as_it_saves_one_is_read_setting_by_setting():
    """A dumped ConfigContainer (GPT-OSS-120B's H100 performance recipe): the model found from its architecture, and
    each
    of its 669 settings sorted exactly once: understood, without effect, or named as not understood."""
    path = ROOT / "tests/fixtures/launch/gpt_oss_120b_pretrain_h100_config_dump.yaml"
    fi = launch_inputs_of(path, gpus="64xH100")
    lf = fi.launch
    assert (fi.model, fi.seq_len, fi.global_batch, fi.precision, fi.run.stack) == (
        "GPT-OSS-120B", 4096, 512, "bf16", "megatron-bridge",
    )
    b = fi.baseline
    assert (b["tp"], b["pp"], b["ep"], b["recompute_granularity"]) == (1, 4, 8, "selective")
    o = resolve_run_options(fi.run.flags, fi.run.stack).options  # ddp and mixed_precision agree on bf16 reduction
    assert (o.grad_reduce_in_fp32, o.cross_entropy_fusion_impl, o.cuda_graph_scope) == (
        False,
        "te",
        (),
    )  # impl none: no graphs
    doc = yaml.safe_load(path.read_text())
    settings = {
        f"{k}.{kk}" if isinstance(v, dict) and k != "optimizer_config_override_provider" else k
        for k, v in doc.items()
        for kk in (v if isinstance(v, dict) else [None])
    }
    got = [*lf.understood, *lf.no_effect, *lf.not_understood]
    assert len(settings) == 669 and len(got) == len(set(got)) and set(got) == settings, set(got) ^ settings
    assert {"model.moe_shared_expert_overlap", "model.delay_wgrad_compute"} <= set(lf.not_understood)
    assert {"checkpoint.save", "logger.log_interval", "optimizer.lr"} <= set(lf.no_effect)


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (None, "its perf_matrix has several GPUs (h100: 16 GPUs; gb200: 8 GPUs; b200: 8 GPUs); give --gpus"),
        ("32xH100", "its perf_matrix has no entry for 32 x H100"),
        ("H200", "its perf_matrix has no entry for H200"),
    ],
)
def test_a_performance_config_without_an_entry_for_the_gpus_is_refused(gpus, message):
    r = runner.invoke(
        app, ["estimate", "--from", str(BRIDGE_PERF), "--model", "Qwen3-30B-A3B", *(["--gpus", gpus] if gpus else [])]
    )
    assert r.exit_code == 2 and message in " ".join(r.output.split()) and "Traceback" not in r.output, r.output


def test_estimate_from_a_performance_config_is_its_entrys_explicit_flags():
    d = _estimate("--from", str(BRIDGE_PERF), "--model", "Qwen3-30B-A3B", "--gpus", "H100")
    explicit = _estimate(
        "--model", "Qwen3-30B-A3B", "--gpus", "16xH100", "--stack", "megatron-bridge", "--seq-len", "4096",
        "--global-batch", "512", "--pp", "2", "--vpp", "12", "--ep", "8", "--cross-entropy-fusion-impl", "te",
    )
    assert (d["tokens_per_s_per_gpu"], d["peak_gib"]) == (explicit["tokens_per_s_per_gpu"], explicit["peak_gib"])


def test_a_nemo_rl_config_is_read_through_its_defaults_chain():
    fi = launch_inputs_of(ROOT / "tests/fixtures/launch/nemo_rl_lora.yaml", gpus="H100")
    lf = fi.launch
    assert (lf.kind, fi.run.stack, fi.model, fi.gpus, fi.seq_len, fi.global_batch) == (
        "nemo-rl", "nemo-rl", "Llama-3.1-8B", "2x8xH100", 2048, 128,
    )
    assert (fi.baseline["tp"], fi.baseline["micro_batch_size"], fi.baseline["recompute_granularity"]) == (2, 2, "full")
    assert (fi.run.task, fi.run.lora_rank, fi.run.lora_target_modules) == ("lora", 16, "linear_qkv,linear_proj")
    assert {"grpo", "loss_fn", "policy.generation", "policy.megatron_cfg.optimizer.lr"} <= set(lf.no_effect)
    assert not lf.not_understood
    base = launch_inputs_of(ROOT / "tests/fixtures/launch/nemo_rl_base.yaml", gpus="H100")
    assert (
        base.baseline["recompute_granularity"] == "none" and base.run.task is None
    )  # checkpointing off: recompute unread


def test_a_lora_recipe_read_with_from_gives_its_task(tmp_path):
    """A recipe.yaml's workload.lora block (target_modules a YAML list) read as the --lora-* values."""
    rec = yaml.safe_load(SEED_RECIPE.read_text())
    rec["workload"] |= {"task": "lora", "lora": {"rank": 16, "target_modules": ["linear_qkv", "linear_proj"]}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(rec))
    fi = launch_inputs_of(tmp_path / "recipe.yaml", gpus=None)
    assert (fi.run.task, fi.run.lora_rank, fi.run.lora_target_modules) == ("lora", 16, "linear_qkv,linear_proj")
    kw = fi.run.workload_kw()
    assert kw == {"task": "lora", "lora_rank": 16, "lora_target_modules": ("linear_qkv", "linear_proj")}


def test_a_nemo_rl_config_without_its_defaults_file_is_refused(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text((ROOT / "tests/fixtures/launch/nemo_rl_lora.yaml").read_text())
    with pytest.raises(
        TunerError, match="defaults: file 'nemo_rl_base.yaml': cannot read it .*; put it beside the file"
    ):
        launch_inputs_of(f, gpus="H100")


def test_a_study_is_not_resumed_with_other_run_options(tmp_path):
    args = [
        "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--trials", "2", "--study", "r", "--results-dir", str(tmp_path),
    ]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, [*args, "--grad-reduce-in-bf16"])
    assert (
        r.exit_code == 2
        and "run options grad_reduce_in_fp32=True; this run asks for run options grad_reduce_in_fp32=False" in r.output
    )
    r = runner.invoke(app, [*args, "--task", "lora"])
    assert r.exit_code == 2 and "--task pretrain" in r.output and "--task lora" in r.output


def test_a_sourced_model_file_is_read_and_an_unset_array_is_named(tmp_path):
    """slime's run scripts source "${SCRIPT_DIR}/models/<model>.sh" for MODEL_ARGS."""
    text = SEED_LAUNCH.read_text()
    cut = text.index("export CUDA_DEVICE_MAX_CONNECTIONS")
    (tmp_path / "models").mkdir()
    (tmp_path / "models/minimax-m2.sh").write_text(text[:cut])
    run = tmp_path / "run.sh"
    run.write_text(
        'SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
        'source "${SCRIPT_DIR}/models/minimax-m2.sh"\n' + text[cut:]
    )
    assert _estimate_from(launch_inputs_of(run)) == _estimate_from(launch_inputs_of(SEED_LAUNCH))
    alone = tmp_path / "alone.sh"
    alone.write_text(text[cut:])
    lf = launch_inputs_of(alone, model="MiniMax-M2").launch
    assert lf.not_understood == ("${MODEL_ARGS[@]} (not set in the file)",)


def test_a_launch_outside_the_space_is_the_first_trial_priced_with_its_stack(tmp_path):
    """The seed's launch (VPP 4) with a space that holds only VPP 8, on the megatron-bridge stack: its layout is added
    as a candidate and trial 0 records the launch's own estimate (the model backend prices the study's run options)."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "tp: [1]\npp: [8]\nvpp: [8]\ncp: [1]\nep: [8]\netp: [1]\nmicro_batch_size: [1]\n"
        "recompute:\n  - {granularity: full, method: uniform, num_layers: 1}\noptimizer_offload_fraction: [0.0]\n"
        "dispatcher: [alltoall]\n"
    )
    r = runner.invoke(
        app,
        [
            "--from", str(SEED_LAUNCH), "--gpus", "H200", "--space", str(space), "--trials", "2", "--stack",
            "megatron-bridge", "--results-dir", str(tmp_path), "--study", "s",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    assert "the study evaluates it" in r.output
    # the shipped template runs slime: a megatron-bridge launch is pointed to how to write its own
    assert "slime_command.yaml" not in r.output and "docs/trials.md#a-template-for-a-torchrun-launch" in r.output
    import optuna

    first = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's/study.db'}").trials[0].user_attrs
    launch = re.search(r"its layout (TP1 PP8 VPP4 EP8 DP8): ([\d,.]+) tokens/s/GPU predicted, ([\d.]+) GiB", r.output)
    assert launch and first["label"] == launch[1]
    assert f"{first['tokens_per_s_per_gpu']:,.1f}" == launch[2] and f"{first['peak_gib']:.1f}" == launch[3]
    default = runner.invoke(app, ["estimate", *SEED_FLAGS, "--json"])
    assert json.loads(default.output)["tokens_per_s_per_gpu"] != pytest.approx(first["tokens_per_s_per_gpu"], rel=1e-6)


def test_the_comparison_names_what_to_change_from_the_launch():
    from specs import Layout
    from tuner.cli._from import layout_changes

    a = Layout.from_dict({"world_size": 16, "tp": 1, "pp": 2, "vpp": 12, "ep": 8, "micro_batch_size": 1})
    b = Layout.from_dict(
        {
            "world_size": 16,
            "tp": 1,
            "pp": 2,
            "vpp": 4,
            "ep": 8,
            "micro_batch_size": 2,
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": 4,
        }
    )
    assert layout_changes(a, b) == ["VPP 12->4", "micro-batch 1->2", "recompute none->full block 4"]
    assert layout_changes(a, a) == []


def _compare(best_tps: float, best_gib: float, src: str = "predicted", launch_src: str = "predicted",
             launch_gib: float = 60.0) -> str:
    """The compare line of a launch TP1 PP1 DP8 (1,000 tokens/s/GPU, 60 GiB, a 141 GiB GPU) against a best TP2 PP1
    DP4."""
    from types import SimpleNamespace

    from cost_model.uncertainty import Band, ErrorBars
    from specs import Layout
    from tuner.cli._from import compare_line
    from tuner.study import TrialRow

    launch, other = Layout(world_size=8), Layout(world_size=8, tp=2, sequence_parallel=True)
    bars = ErrorBars(family="x", throughput=Band(low=0.8, high=1.1), memory=Band(low=0.9, high=1.1))
    prep = SimpleNamespace(config=SimpleNamespace(job=SimpleNamespace(baseline=launch.to_dict()),
                                                  search=SimpleNamespace(memory_headroom=None)), bars=bars,
                           cluster=SimpleNamespace(gpu=SimpleNamespace(hbm_bytes=141 * 2**30)))
    rows = [TrialRow(trial=0, layout=launch, tokens_per_s_per_gpu=1000.0, peak_gib=launch_gib, source=launch_src)]
    best = {"trial": 1, "label": other.label, "layout": other, "tokens_per_s_per_gpu": best_tps, "peak_gib": best_gib,
            "source": src}
    return compare_line(prep, best, rows)


@pytest.mark.parametrize("best_tps", [990.0, 1100.0, 900.0])
def test_a_best_within_the_model_s_error_or_slower_is_no_change_to_make(best_tps):
    """The best is the least memory within 1% of the fastest (a little slower than the launch at a tie), or within the
    model's error on a ratio of two predictions: the line says to keep the launch or measure both, not to change."""
    line = _compare(best_tps, 50.0)
    assert "change:" not in line and f"{best_tps / 1000 - 1:+.0%};" in line
    assert ("your layout is within the model's error of the best: keep it, or measure both (a difference under 16% is "
            "within it; the best uses 10.0 GiB less; the best differs in: TP 1->2, sequence parallel off->on)") in line


def test_the_launch_s_own_predicted_trial_gets_the_job_s_fit_verdict():
    """A predicted trial of the launch near the GPU's memory is "may not fit" by the error bars (135 GiB: 121.5-148.5
    GiB against 141 GiB), as ``tune estimate`` says it; a measured one ran, so it fits."""
    assert "(may not fit, predicted)" in _compare(1300.0, 50.0, launch_gib=135.0)
    assert "fit" not in _compare(1300.0, 50.0, launch_gib=60.0).split(";")[0]
    assert "fit" not in _compare(1300.0, 50.0, launch_src="measured", launch_gib=135.0).split(";")[0]


def test_a_launch_whose_own_trial_ran_out_of_memory_is_told_to_change():
    """The launch's trial failed out of memory and no run of it finished: the line says so and names the change,
    instead of comparing the launch's prediction with the best."""
    from types import SimpleNamespace

    from specs import Layout
    from tuner.cli._from import compare_line

    launch, other = Layout(world_size=8), Layout(world_size=8, tp=2, sequence_parallel=True)
    prep = SimpleNamespace(config=SimpleNamespace(job=SimpleNamespace(baseline=launch.to_dict())))
    best = {"trial": 1, "label": other.label, "layout": other, "tokens_per_s_per_gpu": 8192.0, "peak_gib": 70.0,
            "source": "measured"}
    line = compare_line(prep, best, [], (0, {"kind": "oom", "memory_reached_gib": 138.5, "layout": launch.to_dict()}))
    assert line == ("your launch (trial 0): ran out of memory at 138.5 GiB in its trial; best: TP2 PP1 DP4, 8,192.0 "
                    "tokens/s/GPU measured, 70.0 GiB; change: TP 1->2, sequence parallel off->on")


def test_a_gain_beyond_the_error_is_a_change_and_a_much_slower_best_says_keep():
    assert _compare(1300.0, 50.0).endswith("+30%; change: TP 1->2, sequence parallel off->on")
    assert "; your layout is predicted 30% faster than the best: keep it, or measure both (" in _compare(700.0, 50.0)
    measured = _compare(990.0, 60.0, "measured", "measured")
    assert "measured as fast as the best or faster: keep it (the best differs in: TP 1->2" in measured
    assert _compare(1010.0, 60.0, "measured", "measured").endswith("+1%; change: TP 1->2, sequence parallel off->on")


def test_the_launch_s_prediction_has_its_90_percent_interval():
    """As ``tune estimate`` gives it: the prediction times the job's throughput band; none for a measurement."""
    assert _compare(1300.0, 50.0).startswith(
        "your launch (trial 0): 1,000.0 tokens/s/GPU predicted (90%: 800-1,100), 60.0 GiB; best: TP2 PP1 DP4")
    assert "(90%" not in _compare(1300.0, 50.0, "measured", "measured")


def test_allgather_under_slime_is_refused_or_taken_as_the_alltoall_slime_runs(tmp_path):
    """slime rewrites the allgather dispatcher to alltoall: an explicit --dispatcher allgather is refused under it, and
    a
    launch asking for allgather is estimated as the alltoall it runs."""
    r = runner.invoke(app, ["estimate", *SEED_FLAGS, "--dispatcher", "allgather"])
    assert r.exit_code == 2 and "--stack slime rewrites it to alltoall" in r.output
    ag = tmp_path / "seed_ag.sh"
    ag.write_text(SEED_LAUNCH.read_text().replace("alltoall", "allgather"))
    got = _estimate("--from", str(ag), "--gpus", "H200")
    assert got["tokens_per_s_per_gpu"] == _estimate(*SEED_FLAGS)["tokens_per_s_per_gpu"]


def test_a_recipe_read_back_with_from_keeps_its_stack_dispatcher_and_prediction(tmp_path):
    """A Megatron-Bridge study's recipe.yaml (its best is allgather, which the slime-style `run` command writes as
    alltoall) read back by `tune estimate --from` gives the recipe's own prediction, on its own stack."""
    perf = ROOT / "tests/fixtures/launch/qwen3_30b_a3b_llm_pretrain.yaml"
    r = runner.invoke(
        app,
        [
            "--from", str(perf), "--model", "Qwen3-30B-A3B", "--gpus", "H100", "--trials", "3", "--results-dir",
            str(tmp_path), "--study", "q",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "q/megatron_bridge.yaml").exists() and "no megatron_bridge.yaml: the --from file is a " \
        "performance config" in r.output  # and says why
    rec = yaml.safe_load((tmp_path / "q/recipe.yaml").read_text())
    back = _estimate("--from", str(tmp_path / "q/recipe.yaml"))
    assert back["stack"] == rec["stack"]["preset"] == "megatron-bridge"
    assert back["tokens_per_s_per_gpu"] == pytest.approx(rec["prediction"]["tokens_per_s_per_gpu"], rel=1e-6)


def test_a_megatron_lm_launch_without_bf16_is_refused_as_fp32(tmp_path):
    """Megatron-LM trains in fp32 without --bf16: not priced as bf16."""
    f = tmp_path / "fp32.sh"
    f.write_text(
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 8192 "
        "--max-position-embeddings 131072 --swiglu --normalization RMSNorm --tensor-model-parallel-size 2 "
        "--sequence-parallel\n"
    )
    r = runner.invoke(app, ["estimate", "--from", str(f), "--model", "Llama-3.1-8B", "--gpus", "8xH100"])
    assert r.exit_code == 2 and "no --bf16" in r.output and "fp32" in r.output, r.output
    f.write_text(f.read_text().replace("--swiglu", "--swiglu --bf16"))
    assert (
        runner.invoke(app, ["estimate", "--from", str(f), "--model", "Llama-3.1-8B", "--gpus", "8xH100"]).exit_code == 0
    )


def test_a_recipe_round_trip_does_not_repeat_the_scripts_own_arguments(tmp_path):
    """run_slime.sh's own `--save "$SAVE_DIR"` (and the like) read back from a recipe.yaml are not kept again."""
    src = SEED_LAUNCH
    for study in ("a", "b"):
        r = runner.invoke(
            app,
            ["--from", str(src), "--gpus", "H200", "--trials", "1", "--results-dir", str(tmp_path), "--study", study],
            env={"COLUMNS": "200"},
        )
        assert r.exit_code == 0, r.output
        src = tmp_path / study / "recipe.yaml"
    for name in ("run_slime.sh", "megatron_args.sh"):
        assert (tmp_path / "b" / name).read_text().count("--save ") == 1, name


#: A Megatron-LM launch as its examples write one: torchrun's arguments and the training arguments in arrays.
LLAMA_70B_LAUNCH = """GPUS_PER_NODE=8
NNODES=8
DISTRIBUTED_ARGS=(--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --master_addr $MASTER_ADDR --master_port 6000)
MODEL_ARGS=(--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention
  --num-query-groups 8 --kv-channels 128 --seq-length 8192 --swiglu --normalization RMSNorm --bf16)
PARALLEL_ARGS=(--tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 4
  --num-layers-per-virtual-pipeline-stage 5)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${PARALLEL_ARGS[@]}
"""


@pytest.mark.parametrize("quote", ["", '"'])
def test_torchruns_arguments_in_an_array_give_the_gpu_count(tmp_path, quote):
    f = tmp_path / "run.sh"
    f.write_text(LLAMA_70B_LAUNCH.replace("${DISTRIBUTED_ARGS[@]}", f"{quote}${{DISTRIBUTED_ARGS[@]}}{quote}"))
    lf = read_launch(f)
    assert (lf.model, lf.nodes, lf.gpus_per_node) == ("Llama-3.1-70B", 8, 8)


def test_layers_per_virtual_stage_are_megatrons_virtual_pipeline_size(tmp_path):
    """Megatron-LM's validate_args: vpp = num_layers // pp // N (80 // 4 // 5 = 4), the layer count the launch's
    --num-layers, else the model's."""
    f = tmp_path / "run.sh"
    f.write_text(LLAMA_70B_LAUNCH)
    fi = launch_inputs_of(f, gpus="H100")
    assert (fi.baseline["tp"], fi.baseline["pp"], fi.baseline["vpp"]) == (8, 4, 4)
    f.write_text(LLAMA_70B_LAUNCH.replace("--num-layers 80 ", ""))  # the preset's 80 layers
    assert read_launch(f).layout["vpp"] == 4
    f.write_text(LLAMA_70B_LAUNCH.replace("stage 5", "stage 20"))  # one virtual stage: no interleaving
    assert "vpp" not in read_launch(f).layout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            LLAMA_70B_LAUNCH.replace("stage 5", "stage 3"),
            "80 layers in 4 pipeline stages are not whole virtual stages of 3 layers",
        ),
        (
            "torchrun pretrain_gpt.py --bf16 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage "
            "5\n",
            "needs the model's layer count",
        ),
    ],
)
def test_layers_per_virtual_stage_that_cannot_be_read_are_refused(tmp_path, text, message):
    f = tmp_path / "run.sh"
    f.write_text(text)
    r = runner.invoke(app, ["estimate", "--from", str(f), "--gpus", "H100"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


#: A Megatron-LM launch whose pipeline split counts the embedding and the loss as layers: (62 + 2) / 8 = 8 a rank.
ACCOUNTED_LAUNCH = """torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 62 --hidden-size 3072 --ffn-hidden-size 1536 --num-attention-heads 48 --kv-channels 128 \\
  --group-query-attention --num-query-groups 8 --num-experts 256 --moe-ffn-hidden-size 1536 --moe-router-topk 8 \\
  --micro-batch-size 1 --global-batch-size 128 --seq-length 8192 \\
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 --expert-model-parallel-size 8 \\
  --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split \\
  --num-layers-per-virtual-pipeline-stage 2 --bf16
"""


def test_embedding_and_loss_counted_in_the_pipeline_split_are_megatrons_stage_sizes(tmp_path):
    """Megatron-LM's get_num_layers_to_build (transformer_block.py at d98e8a64): 8 layers a rank, vpp 8 / 2 = 4 virtual
    stages of 2; the first rank's first stage builds one fewer (the embedding), the last rank's last one (the loss)."""
    from search_spaces.pipeline import stage_layer_counts

    f = tmp_path / "acc.sh"
    f.write_text(ACCOUNTED_LAUNCH)
    lf = read_launch(f)
    assert not lf.not_understood and "--account-for-loss-in-pipeline-split" in lf.understood
    lay = lf.layout
    assert (lay["pp"], lay["vpp"], lay["first_stage_layers"], lay["last_stage_layers"]) == (8, 4, 7, 7)
    counts = stage_layer_counts(62, 8, 4, 7, 7)
    assert counts[0] == [1, 2, 2, 2] and counts[7] == [2, 2, 2, 1] and all(c == [2] * 4 for c in counts[1:7])
    r = runner.invoke(app, ["estimate", "--from", str(f), "--gpus", "H100"])
    assert r.exit_code == 0 and "'Et|(tt|)*30tL'" in r.output and "pipeline_split" not in r.output, r.output
    # the embedding only, pp 7, no virtual stages: (62 + 1) / 7 = 9 a rank, 8 decoder layers on the first
    f.write_text(ACCOUNTED_LAUNCH.replace("--account-for-loss-in-pipeline-split", "")
                 .replace("size 8 --expert", "size 7 --expert")
                 .replace("--num-layers-per-virtual-pipeline-stage 2", ""))
    lay = read_launch(f).layout
    assert (lay["first_stage_layers"], "last_stage_layers" in lay, "vpp" in lay) == (8, False, False)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("--num-layers-per-virtual-pipeline-stage 2", "--num-virtual-stages-per-pipeline-rank 3",
         "62 layers + 2 (embedding, loss) do not split into 8 pipeline ranks of 3 equal virtual stages"),
        ("--num-layers-per-virtual-pipeline-stage 2", "--decoder-first-pipeline-num-layers 6",
         "with --decoder-first-pipeline-num-layers: Megatron-LM accepts one way"),
    ],
)
def test_an_accounted_split_megatron_refuses_is_refused(tmp_path, old, new, message):
    f = tmp_path / "acc.sh"
    f.write_text(ACCOUNTED_LAUNCH.replace(old, new))
    r = runner.invoke(app, ["estimate", "--from", str(f), "--gpus", "H100"])
    assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output


def test_recompute_activations_is_selective_recompute(tmp_path):
    """Megatron-LM's validate_args: --recompute-activations sets recompute_granularity = 'selective'."""
    f = tmp_path / "run.sh"
    f.write_text(LLAMA_70B_LAUNCH.replace("--sequence-parallel", "--sequence-parallel --recompute-activations"))
    lf = read_launch(f)
    assert lf.layout["recompute"] == "selective" and "--recompute-activations" in lf.understood


def test_a_variables_default_is_the_files_value_else_the_default(tmp_path, monkeypatch):
    """${VAR:-default} and ${VAR-default}: the file's assignment, else the default; never the reader's environment."""
    monkeypatch.setenv("PP", "2")
    f = tmp_path / "run.sh"
    f.write_text(
        "TP=${TP:-4}\nEMPTY=\n"
        + LLAMA_70B_LAUNCH.replace("--tensor-model-parallel-size 8", "--tensor-model-parallel-size ${TP:-2}")
        .replace("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size=${PP:-4}")
        .replace("--seq-length 8192", "--seq-length ${EMPTY-8192}${EMPTY:-4096}")
    )
    lf = read_launch(f)
    assert (lf.layout["tp"], lf.layout["pp"], lf.seq_length) == (4, 4, 4096)


def test_the_exported_megatron_lm_script_reads_back_whole(tmp_path):
    """megatron_args.sh: torchrun's --nnodes x --nproc-per-node is the GPU count, its other arguments have no effect."""
    from launch.exporters._megatron import megatron_args_script
    from specs import Layout, Workload, load_model, parse_gpus

    f = tmp_path / "megatron_args.sh"
    f.write_text(
        megatron_args_script(load_model("Llama-3.1-8B"), parse_gpus("16xH100"), Workload(), Layout(world_size=16, tp=2))
    )
    lf = read_launch(f)
    assert (lf.model, lf.nodes, lf.gpus_per_node, lf.not_understood) == ("Llama-3.1-8B", 2, 8, ())
    args = re.split(r"^\s*torchrun ", f.read_text(), flags=re.M)[
        0
    ]  # the arguments; after an unknown script torchrun's are read
    f.write_text(
        args + 'torchrun --nnodes 2 --node_rank 0 --nproc-per-node 8 --master-addr h "$SCRIPT" "${MEGATRON_ARGS[@]}"\n'
    )
    lf = read_launch(f)
    assert (lf.nodes, lf.gpus_per_node, lf.not_understood) == (2, 8, ())
    assert {"--nnodes", "--nproc-per-node"} <= set(lf.understood) and {"--node_rank", "--master-addr"} <= set(
        lf.no_effect
    )
    assert not {"--nnodes", "--node_rank"} & set(" ".join(lf.user_args).split())


def test_the_torchrun_template_of_the_docs_loads(tmp_path):
    """docs/trials.md#a-template-for-a-torchrun-launch, where the main job points a non-slime launch."""
    from launch.command_backend import load_template

    doc = (ROOT / "docs/trials.md").read_text().split("### A template for a torchrun launch", 1)[1]
    text = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "t.yaml").write_text(text)
    tpl = load_template(tmp_path / "t.yaml")
    assert tpl.framework == "megatron" and "{layout_args}" in tpl.argv and "pretrain_gpt.py" in tpl.argv


def test_a_study_stored_before_a_run_option_existed_resumes_unless_one_it_has_differs():
    """``cuda_graph_impl`` is newer than some stored studies: a field the stored study lacks is not a difference."""
    from types import SimpleNamespace

    from cost_model.calibration import BASE_CALIBRATION
    from tuner.study.storage import check_study_config

    now = {"run_options": {"cuda_graph_scope": [], "cuda_graph_impl": "none"}}
    old = SimpleNamespace(user_attrs={"resolved": {"run_options": {"cuda_graph_scope": []}}})
    check_study_config(old, None, "s", BASE_CALIBRATION, now)  # type: ignore[arg-type]
    other = SimpleNamespace(user_attrs={"resolved": {"run_options": {"cuda_graph_scope": ["attn"]}}})
    with pytest.raises(TunerError, match=r"cuda_graph_scope=\['attn'\]"):
        check_study_config(other, None, "s", BASE_CALIBRATION, now)  # type: ignore[arg-type]


def test_estimate_refuses_full_recompute_under_per_layer_cuda_graphs():
    r = runner.invoke(
        app,
        [
            "estimate", "--model", "Llama-3.1-8B", "--gpus", "8xH200", "--tp", "1", "--pp", "1", "--recompute", "full",
            "--cuda-graph-impl", "local",
        ],
    )
    assert r.exit_code == 2 and "breaks rule cuda_graphs" in r.output, r.output
