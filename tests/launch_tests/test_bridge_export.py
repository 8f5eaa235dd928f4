"""The ``bridge`` format: a Megatron-Bridge YAML with the layout written into its own keys. Read back with
``tune --from`` it gives the same layout; every key it does not write loads as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from flag_parsing import launch_inputs_of
from typer.testing import CliRunner

from launch.exporters import ExportContext, get_exporter
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Dispatcher, Layout, RecomputeGranularity, RecomputeMethod
from tuner.cli import app

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/launch"
OVERRIDE = FIX / "bridge_override.yaml"
DUMP = FIX / "gpt_oss_120b_pretrain_h100_config_dump.yaml"
PERF = FIX / "qwen3_30b_a3b_llm_pretrain.yaml"




def _context(path: Path | None, model: str, gpus: str, layout: Layout, gbs: int = 512) -> ExportContext:
    return ExportContext(
        model=load_model(model),
        cluster=parse_gpus(gpus),
        workload=Workload(seq_length=4096, global_batch_size=gbs),
        layout=layout,
        bridge_yaml=path.read_text() if path else "",
    )


def _written(always: dict, if_present: dict, doc: dict) -> set[tuple[str, str]]:
    return {(s, k) for s, kv in always.items() for k in kv} | {
        (s, k) for s, kv in if_present.items() for k in kv if isinstance(doc.get(s), dict) and k in doc[s]
    }


def _others(doc: dict, written: set[tuple[str, str]]) -> dict:
    return {
        s: {k: v for k, v in body.items() if (s, k) not in written} if isinstance(body, dict) else body
        for s, body in doc.items()
    }


QWEN_PP = Layout(
    world_size=16, tp=2, pp=2, vpp=2, ep=4, etp=1, micro_batch_size=2, sequence_parallel=True,
    recompute_granularity=RecomputeGranularity.full, recompute_method=RecomputeMethod.uniform, recompute_num_layers=1,
    optimizer_offload_fraction=0.5, dispatcher=Dispatcher.alltoall, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16",
    num_layers_in_first_pipeline_stage=22, num_layers_in_last_pipeline_stage=26,
)
GPT_OSS = Layout(
    world_size=64, tp=2, pp=2, ep=8, micro_batch_size=1, sequence_parallel=True,
    recompute_granularity=RecomputeGranularity.selective, recompute_modules=("core_attn", "moe_act"),
)


@pytest.mark.parametrize(
    ("path", "model", "gpus", "lay"),
    [
        (OVERRIDE, "Qwen3-30B-A3B", "16xH100", QWEN_PP),
        (OVERRIDE, "Qwen3-30B-A3B", "16xH100", Layout(world_size=16, ep=16, micro_batch_size=1)),
        (DUMP, "GPT-OSS-120B", "64xH100", GPT_OSS),
    ],
    ids=["override-pp", "override-flat", "saved-config"],
)
def test_the_layout_reads_back_and_the_other_keys_are_kept(tmp_path, path, model, gpus, lay):
    from launch.exporters._bridge import bridge_settings

    ctx = _context(path, model, gpus, lay)
    out = get_exporter("bridge").write(ctx, tmp_path / "megatron_bridge.yaml")
    fi = launch_inputs_of(out, gpus, model if path == OVERRIDE else None)
    assert Layout.from_dict(fi.baseline) == lay
    before, after = yaml.safe_load(path.read_text()), yaml.safe_load(out.read_text())
    written = _written(*bridge_settings(ctx), before)
    assert list(after)[: len(before)] == list(before)  # sections in the file's order, new ones after
    assert _others(after, written) == _others(before, written)
    assert all(list(after[s])[: len(b)] == list(b) for s, b in before.items() if isinstance(b, dict))


def test_keys_the_layout_makes_irrelevant_are_cleared_only_where_the_file_has_them(tmp_path):
    doc = yaml.safe_load(OVERRIDE.read_text())
    doc["model"] |= {"num_layers_in_first_pipeline_stage": 20, "recompute_method": "block"}
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = yaml.safe_load(get_exporter("bridge").render(_context(f, "Qwen3-30B-A3B", "16xH100", QWEN_PP)))
    m = out["model"]
    assert m["pipeline_model_parallel_layout"] and m["num_layers_in_first_pipeline_stage"] is None
    assert (m["recompute_granularity"], m["recompute_method"], m["recompute_num_layers"]) == ("full", "uniform", 1)
    assert "num_layers_in_last_pipeline_stage" not in m and "account_for_loss_in_pipeline_split" not in m
    assert (out["optimizer"]["optimizer_cpu_offload"], out["optimizer"]["exp_avg_dtype"], out["optimizer"]["lr"]) == (
        True,
        "bf16",
        0.0003,
    )
    flat = yaml.safe_load(
        get_exporter("bridge").render(_context(f, "Qwen3-30B-A3B", "16xH100", Layout(world_size=16, ep=16)))
    )
    assert (
        flat["model"]["recompute_granularity"],
        flat["model"]["recompute_method"],
        flat["model"]["num_layers_in_first_pipeline_stage"],
    ) == (None, None, None)


def test_the_header_names_every_setting_the_export_sets_in_the_file():
    from launch.exporters._bridge import bridge_yaml

    lay = Layout(world_size=16, pp=2, vpp=2, ep=8, micro_batch_size=2)
    text = bridge_yaml(_context(OVERRIDE, "Qwen3-30B-A3B", "16xH100", lay))
    header = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("#"))
    assert "Set here: " in header and "model.pipeline_model_parallel_size" in header
    assert "train.micro_batch_size" in header and "train.train_iters" not in header  # kept as the file has it
    before, after = yaml.safe_load(OVERRIDE.read_text()), yaml.safe_load(text)
    named = header.split("Set here: ")[1].split(".", 1)[0]  # the first section named
    assert named in after and all(after[s] == before[s] for s in before if f"{s}." not in header and s not in header)


def test_a_precision_other_than_the_file_s_is_named_in_its_header(tmp_path):
    """The file trains bf16 (no mixed_precision: Bridge's default); a study priced at fp8 says so."""
    ctx = _context(OVERRIDE, "Qwen3-30B-A3B", "16xH100", QWEN_PP)
    assert "Priced at" not in get_exporter("bridge").render(ctx)
    f = tmp_path / "bf16.yaml"
    f.write_text(OVERRIDE.read_text() + "mixed_precision: bf16_mixed\n")
    fp8 = ExportContext(
        model=ctx.model,
        cluster=ctx.cluster,
        layout=QWEN_PP,
        bridge_yaml=f.read_text(),
        workload=Workload(seq_length=4096, global_batch_size=512, precision="fp8"),
    )
    assert "# Priced at fp8, but its mixed_precision is bf16: set it to match." in get_exporter("bridge").render(fp8)


def test_without_a_bridge_file_it_writes_an_override_of_the_layout_keys_only():
    out = yaml.safe_load(get_exporter("bridge").render(_context(None, "Qwen3-30B-A3B", "16xH100", QWEN_PP)))
    assert list(out) == ["model", "train", "optimizer", "ddp"]
    assert out["train"] == {"micro_batch_size": 2, "global_batch_size": 512}
    assert (out["model"]["expert_model_parallel_size"], out["model"]["virtual_pipeline_model_parallel_size"]) == (4, 2)
    assert "seq_length" not in out["model"] and "lr" not in out["optimizer"]


def test_a_performance_config_is_refused_and_left_out_of_the_main_job():
    ctx = _context(PERF, "Qwen3-30B-A3B", "16xH100", QWEN_PP)
    bridge = get_exporter("bridge")
    assert not bridge.in_main_job(ctx) and bridge.in_main_job(_context(OVERRIDE, "Qwen3-30B-A3B", "16xH100", QWEN_PP))
    assert not bridge.in_main_job(_context(None, "Qwen3-30B-A3B", "16xH100", QWEN_PP))
    with pytest.raises(
        TunerError,
        match="writes into a Megatron-Bridge override YAML or saved ConfigContainer; .* performance config .* use "
        "--format recipe or megatron",
    ):
        bridge.render(ctx)


def test_the_main_job_from_a_bridge_yaml_writes_it_and_export_gives_the_same(tmp_path):
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "--from", str(OVERRIDE), "--model", "Qwen3-30B-A3B", "--gpus", "16xH100", "--trials", "1", "--study", "b",
            "--results-dir", str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    assert ("note: recipe.yaml, run_slime.sh, megatron_args.sh: not derived from your Megatron-Bridge file's training "
            "settings") in " ".join(r.output.split())
    written = (tmp_path / "b" / "megatron_bridge.yaml").read_text()
    r = runner.invoke(app, ["export", "--study", "b", "--results-dir", str(tmp_path), "--format", "bridge"])
    assert r.exit_code == 0, r.output
    assert r.stdout == written and yaml.safe_load(written)["logger"] == {"log_interval": 1}


def test_lora_writes_bridge_s_peft_section_and_the_main_job_writes_it(tmp_path):
    """``--task lora``: the LoRA class, rank and targets (Megatron-Bridge ``peft/lora.py``); a file's own adapter
    class and settings are kept. Megatron-LM's and slime's scripts have none, so they train every weight."""
    from launch.exporters import exporters

    lora = Workload(seq_length=4096, global_batch_size=512, task="lora", lora_rank=16,
                    lora_target_modules=("linear_qkv", "linear_fc1"))
    lay = Layout(world_size=16, ep=16, micro_batch_size=1)
    ctx = ExportContext(model=load_model("Qwen3-30B-A3B"), cluster=parse_gpus("16xH100"), workload=lora, layout=lay)
    bridge = get_exporter("bridge")
    assert bridge.in_main_job(ctx) and not bridge.in_main_job(_context(None, "Qwen3-30B-A3B", "16xH100", lay))
    assert yaml.safe_load(bridge.render(ctx))["peft"] == {
        "_target_": "megatron.bridge.peft.lora.LoRA", "dim": 16, "target_modules": ["linear_qkv", "linear_fc1"]}
    f = tmp_path / "dora.yaml"
    f.write_text(OVERRIDE.read_text() + "peft:\n  _target_: megatron.bridge.peft.dora.DoRA\n  dim: 8\n  alpha: 64\n")
    own = yaml.safe_load(bridge.render(ExportContext(model=ctx.model, cluster=ctx.cluster, workload=lora, layout=lay,
                                                     bridge_yaml=f.read_text())))["peft"]
    assert own == {"_target_": "megatron.bridge.peft.dora.DoRA", "dim": 16, "alpha": 64,
                   "target_modules": ["linear_qkv", "linear_fc1"]}
    assert "peft" not in yaml.safe_load(bridge.render(_context(None, "Qwen3-30B-A3B", "16xH100", lay)))
    # read back with --from: the same task (another adapter class is refused: test_launch_file_keys.py)
    fi = launch_inputs_of(bridge.write(ctx, tmp_path / "megatron_bridge.yaml"), "16xH100", "Qwen3-30B-A3B")
    assert (fi.run.task, fi.run.lora_rank, fi.run.lora_target_modules) == ("lora", 16, "linear_qkv,linear_fc1")
    assert not fi.launch.not_understood
    assert {e.file_name for e in exporters().values() if e.trains_every_weight} == {"run_slime.sh",
                                                                                    "megatron_args.sh"}
    for name in ("megatron", "slime"):  # and their headers say so
        assert "this trains every weight" in " ".join(get_exporter(name).render(ctx).split())
        assert "every weight" not in get_exporter(name).render(_context(None, "Qwen3-30B-A3B", "16xH100", lay))


def _grads(path: Path | None, text: str = "", **workload) -> tuple[str, dict]:
    """The bridge export with bf16 gradient reduction priced (the ``megatron-bridge`` stack's), of ``path``'s file
    with ``text`` appended: (its header, its YAML)."""
    from specs import RunOptions

    ctx = ExportContext(model=load_model("Qwen3-30B-A3B"), cluster=parse_gpus("16xH100"),
                        workload=Workload(seq_length=4096, global_batch_size=512, **workload),
                        layout=Layout(world_size=16, ep=16, micro_batch_size=1),
                        bridge_yaml=(path.read_text() if path else "") + text,
                        options=RunOptions(grad_reduce_in_fp32=False))
    out = get_exporter("bridge").render(ctx)
    return "".join(x for x in out.splitlines(keepends=True) if x.startswith("#")), yaml.safe_load(out)


def test_bf16_gradient_reduction_is_written_where_bridge_reads_it_last(tmp_path):
    """Bridge's ``mixed_precision`` overwrites ``ddp.grad_reduce_in_fp32`` and its ``bf16_mixed`` preset (the recipes'
    default) reduces in fp32: the priced bf16 reduction is written into both, the preset as its config."""
    head, doc = _grads(OVERRIDE)  # no mixed_precision: the recipe's bf16_mixed
    mp = doc["mixed_precision"]
    assert doc["ddp"]["grad_reduce_in_fp32"] is False and mp["grad_reduce_in_fp32"] is False
    assert mp["_target_"].endswith("MixedPrecisionConfig") and mp["bf16"] and mp["params_dtype"]["_target_"] == (
        "torch.bfloat16")
    assert "# Gradients reduced in bf16, as priced" in head
    assert _grads(OVERRIDE, "mixed_precision: bf16-mixed\n")[1]["mixed_precision"] == mp
    _, saved = _grads(DUMP)  # a saved config's mapping: only its key is written
    assert saved["mixed_precision"]["grad_reduce_in_fp32"] is False and saved["mixed_precision"]["fp8_recipe"] == (
        "tensorwise")
    head, fp8 = _grads(OVERRIDE, "mixed_precision: bf16_with_fp8_current_scaling_mixed\n", precision="fp8")
    assert fp8["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    assert "# Not as priced: priced with bf16 gradient reduction, but mixed_precision: " in head
    # read back, the file reduces in bf16
    f = tmp_path / "megatron_bridge.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert launch_inputs_of(f, "16xH100", "Qwen3-30B-A3B").run.flags.grad_reduce_in_bf16 is True


@pytest.mark.parametrize("fmt", ["megatron", "slime", "recipe"])
def test_the_other_scripts_say_they_are_not_the_bridge_file_s_training(fmt):
    """From a Bridge YAML the Megatron-LM and slime scripts carry the tool's own hyperparameters (the file's are
    ConfigContainer keys): their headers say so and name megatron_bridge.yaml; without one they say nothing of it."""
    lay = Layout(world_size=16, ep=16, micro_batch_size=1)
    text = get_exporter(fmt).render(_context(OVERRIDE, "Qwen3-30B-A3B", "16xH100", lay))
    head = " ".join(x[2:] for x in text.splitlines()[1:5] if x.startswith("# "))
    assert head.startswith("Not derived from your Megatron-Bridge file's training settings (optimizer, learning rate")
    assert "megatron_bridge.yaml is your run with the tuned layout: use it." in head
    assert ("slime trains through its SFT path" in head) is (fmt != "megatron")
    assert "Not derived from" not in get_exporter(fmt).render(_context(None, "Qwen3-30B-A3B", "16xH100", lay))
