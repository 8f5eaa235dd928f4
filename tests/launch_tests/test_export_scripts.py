"""The exported scripts run as they are: ``run_slime.sh`` executed against a fake slime ``train_async.py``,
``megatron_args.sh`` sourced into a fake ``pretrain_gpt.py`` (and executed on its own).

The fakes (``tests/launch_tests/fake_entry/``) parse the arguments as Megatron's argparse would,
check Megatron's cross-flag rules and the ``--pipeline-model-parallel-layout`` grammar, and dump
what arrived; the tests compare that with the layout that was exported. Nothing in a file is
edited: the entry points come from environment variables (``PYTHON``, ``SLIME_ENTRY``, ``SLIME_DIR``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launch.exporters import ExportContext, get_exporter
from launch.exporters._flags import megatron_args
from specs import Workload, load_model, parse_gpus
from specs.layout import Layout

FAKES = Path(__file__).resolve().parent / "fake_entry"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

W = Workload(seq_length=8192, global_batch_size=128)

LAYOUTS = {
    # the seed's tuned layout: 'Et|(tt|)*30tL', full recompute, alltoall
    "seed": Layout(
        world_size=64, tp=1, pp=8, vpp=4, ep=8, etp=1, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, num_layers_in_first_pipeline_stage=7,
        num_layers_in_last_pipeline_stage=7,
    ),
    # slime's reference port: TP 2 with SP, PP 2, optimizer offload
    "port": Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=2, ep=8, etp=1, micro_batch_size=1,
        recompute_granularity="full", recompute_method="block", recompute_num_layers=2, optimizer_offload_fraction=0.5,
        overlap_cpu_optimizer_d2h_h2d=True,
    ),
    # CP 2, micro-batch 2, selective recompute of two modules, flex + DeepEP, ETP 2, an uneven split
    "flex": Layout(
        world_size=64, tp=2, pp=4, vpp=2, cp=2, ep=4, etp=2, micro_batch_size=2, recompute_granularity="selective",
        recompute_modules=("core_attn", "moe_act"), dispatcher="flex+deepep", num_layers_in_first_pipeline_stage=15,
        num_layers_in_last_pipeline_stage=15,
    ),
}


@pytest.fixture(scope="module")
def model():
    return load_model("MiniMax-M2")


@pytest.fixture(scope="module")
def cluster():
    return parse_gpus("64xH200")


def _write(tmp_path: Path, name: str, model, cluster, layout: Layout) -> Path:
    exporter = get_exporter(name)
    return exporter.write(
        ExportContext(model=model, cluster=cluster, workload=W, layout=layout), tmp_path / exporter.file_name
    )


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    env.update(FAKE_ENTRY_DUMP=str(tmp_path / "dump.json"), **extra)
    return env


def _glob_trap(tmp_path: Path) -> Path:
    """A working folder where an unquoted ``[1]*62`` (the --moe-layer-freq value) would expand to a file name."""
    cwd = tmp_path / "work dir"
    cwd.mkdir()
    (cwd / "1-62").write_text("")
    return cwd


def _expected(layout: Layout, model) -> dict:
    from search_spaces.pipeline import emit_layout_string, layer_counts_from_string

    pls = emit_layout_string(
        model.num_layers, layout.pp, layout.vpp, layout.num_layers_in_first_pipeline_stage,
        layout.num_layers_in_last_pipeline_stage, model.mtp_num_layers,
    )
    counts = layer_counts_from_string(pls, layout.pp, model.num_layers, model.mtp_num_layers)
    full = layout.recompute_granularity.value == "full"
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "etp": layout.etp,
        "sequence_parallel": layout.sequence_parallel and layout.tp > 1,
        "recompute": {
            "granularity": layout.recompute_granularity.value,
            "method": layout.recompute_method.value if full else None,
            "num_layers": layout.recompute_num_layers if full else None,
            "modules": list(layout.recompute_modules) if not full else None,
        },
        "dispatcher": layout.dispatcher.moe_token_dispatcher_type,
        "flex_backend": layout.dispatcher.moe_flex_dispatcher_backend,
        "optimizer_offload_fraction": float(layout.optimizer_offload_fraction),
        "pipeline_layout": pls,
        "layers_per_rank": [sum(c) for c in counts],
        "num_layers": model.num_layers,
        "moe_layer_freq": "[1]*62",
    }


def _arrived(d: dict) -> dict:
    keys = (
        "tp", "pp", "vpp", "cp", "ep", "etp", "sequence_parallel", "recompute", "dispatcher", "flex_backend",
        "optimizer_offload_fraction", "pipeline_layout", "layers_per_rank", "num_layers", "moe_layer_freq",
    )
    return {k: d[k] for k in keys}


# --------------------------------------------------------------------------- run_slime.sh


FAKE_SLIME = str(FAKES / "fake_slime_train.py")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_run_slime_sh_executes_and_its_values_arrive(name, tmp_path, model, cluster):
    lay = LAYOUTS[name]
    script = _write(tmp_path, "slime", model, cluster, lay)
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    env = _env(
        tmp_path, PYTHON=sys.executable, SLIME_ENTRY=FAKE_SLIME, SLIME_DIR=str(FAKES), HF_CKPT="/ckpt/MiniMax M2",
        TORCH_DIST="/ckpt/torch dist", SFT_DATA="/data/rows;1.parquet", SAVE_DIR="/ckpt/out $HOME",
        TENSORBOARD_DIR="/tmp/prof $HOME", NVLINK_COUNT="4",
        FAKE_ENTRY_ENV="CUDA_DEVICE_MAX_CONNECTIONS,PYTORCH_CUDA_ALLOC_CONF,TORCHINDUCTOR_COMPILE_THREADS,NCCL_NVLS_ENABLE",
    )
    p = subprocess.run([str(script)], env=env, cwd=_glob_trap(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    want = _expected(lay, model)
    if lay.dispatcher.value == "allgather":  # slime rewrites it; the script asks for alltoall
        want["dispatcher"] = "alltoall"
    assert _arrived(d) == want
    # slime packs rows by tokens: no --micro-batch-size, the micro-batch's tokens per GPU instead
    assert (
        d["micro_batch_size"] is None
        and d["dynamic_batch"]
        and d["max_tokens_per_gpu"] == lay.micro_batch_size * W.seq_length // lay.cp
    )
    assert d["global_batch_size"] == 128 and d["seq_length"] == 8192
    assert d["spec"] == ["slime_plugins.models.minimax_m2", "get_minimax_m2_layer_spec"]
    # the caller's paths arrive as one word each, with their spaces, ';' and '$' untouched; one epoch of slime's SFT
    assert d["slime"] == {
        "--actor-num-nodes": "8",
        "--actor-num-gpus-per-node": "8",
        "--hf-checkpoint": "/ckpt/MiniMax M2",
        "--ref-load": "/ckpt/torch dist",
        "--prompt-data": "/data/rows;1.parquet",
        "--tensorboard-dir": "/tmp/prof $HOME",
        "--load": "/ckpt/out $HOME",
        "--save": "/ckpt/out $HOME",
        "--save-interval": "1000",
        "--num-epoch": "1",
        "--rollout-batch-size": "128",
        "--loss-type": "sft_loss",
        "--debug-train-only": "",
        "--rollout-shuffle": "",
        "--rollout-function-path": "slime.rollout.sft_rollout.generate_rollout",
    }
    assert d["env"] == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "NCCL_NVLS_ENABLE": "1",
    }


BASE = dict(
    PYTHON=sys.executable, SLIME_ENTRY=FAKE_SLIME, SLIME_DIR=str(FAKES), HF_CKPT="/c", TORCH_DIST="/t", SFT_DATA="/d",
    SAVE_DIR="/s", NVLINK_COUNT="0",
)


@pytest.mark.parametrize(("extra", "want"), [
    ({"NUM_ROLLOUT": "300", "SAVE_INTERVAL": "50"}, {"--num-rollout": "300", "--save-interval": "50"}),
    ({"NUM_EPOCH": "3"}, {"--num-epoch": "3"}),
    # the seed's benchmark: its pre-tokenized rollout module, 20 steps, nothing saved (SAVE_DIR not needed)
    ({"BENCHMARK": "1", "SAVE_DIR": None}, {"--rollout-function-path": "pretokenized_sft_rollout.generate_rollout",
                                             "--num-rollout": "20", "--load": None, "--save": None,
                                             "--rollout-shuffle": None}),
])  # fmt: skip
def test_run_slime_sh_steps_and_benchmark_come_from_variables(extra, want, tmp_path, model, cluster):
    script = _write(tmp_path, "slime", model, cluster, LAYOUTS["seed"])
    env = _env(tmp_path, **{k: v for k, v in {**BASE, **extra}.items() if v is not None})
    p = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads((tmp_path / "dump.json").read_text())["slime"]
    assert {k: got.get(k) for k in want} == want


NEEDED_SLIME = {
    "HF_CKPT": "set HF_CKPT to the Hugging Face checkpoint folder",
    "TORCH_DIST": "set TORCH_DIST to the torch_dist",
    "SFT_DATA": "set SFT_DATA to your training rows",
    "SAVE_DIR": "set SAVE_DIR to where checkpoints",
}


@pytest.mark.parametrize("missing", [("SFT_DATA",), ("SAVE_DIR",), tuple(NEEDED_SLIME)])
def test_run_slime_sh_names_every_missing_variable_at_once(tmp_path, model, cluster, missing):
    """Run with bash against the fake slime, the needed variables left out (all of them: an empty environment but for
    the fake's): one message names each, exit 2, before anything runs."""
    script = _write(tmp_path, "slime", model, cluster, LAYOUTS["seed"])
    env = _env(tmp_path, **{k: v for k, v in BASE.items() if k not in missing})
    p = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("run_slime.sh: these variables are needed and not set:\n"), (
        p.stderr
    )
    assert [ln.split()[1] for ln in p.stderr.splitlines()[1:]] == list(missing)
    assert all(NEEDED_SLIME[v] in p.stderr for v in missing)
    assert not (tmp_path / "dump.json").exists()  # stopped before the launch
    if missing == ("SAVE_DIR",):  # the benchmark saves nothing: SAVE_DIR is not needed there
        p = subprocess.run(
            ["bash", str(script)],
            env={**env, "BENCHMARK": "1"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr


def test_run_slime_sh_counts_nvlinks_without_nvidia_smi(tmp_path, model, cluster):
    script = _write(tmp_path, "slime", model, cluster, LAYOUTS["seed"])
    # without NVLINK_COUNT and without nvidia-smi on PATH the count is 0, not an error under `set -e`
    env = _env(tmp_path, **{k: v for k, v in BASE.items() if k != "NVLINK_COUNT"}, FAKE_ENTRY_ENV="NCCL_NVLS_ENABLE")
    env["PATH"] = os.pathsep.join(
        str(Path(x).parent) for x in (shutil.which("bash"), shutil.which("grep"), shutil.which("wc"))
    )
    p = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "dump.json").read_text())["env"] == {"NCCL_NVLS_ENABLE": "0"}


def test_run_slime_sh_runs_slimes_train_async_by_default_and_fails_when_the_entry_fails(tmp_path, model, cluster):
    """``SLIME_ENTRY`` defaults to ``$SLIME_DIR/train_async.py``; strict mode: the script's exit status is the
    launch's."""
    script = _write(tmp_path, "slime", model, cluster, LAYOUTS["seed"])
    slime_dir = tmp_path / "slime"
    slime_dir.mkdir()
    (slime_dir / "train_async.py").write_text("import sys\nprint('train_async', len(sys.argv) > 50)\n")
    env = _env(tmp_path, **{**BASE, "SLIME_DIR": str(slime_dir)})
    env.pop("SLIME_ENTRY")
    p = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "train_async True\n", p.stderr
    env = _env(tmp_path, **{**BASE, "SLIME_ENTRY": str(tmp_path / "no_such_entry.py")})
    p = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no slime entry point at" in p.stderr and "no_such_entry.py" in p.stderr


# --------------------------------------------------------------------------- megatron_args.sh


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_megatron_args_sh_sourced_into_pretrain_gpt(name, tmp_path, model, cluster):
    lay = LAYOUTS[name]
    f = _write(tmp_path, "megatron", model, cluster, lay)
    assert f.read_text().startswith("#!/usr/bin/env bash\n") and stat.S_IMODE(f.stat().st_mode) == 0o755
    env = _env(tmp_path, PYTHON=sys.executable)
    cmd = 'source "$1"; "$PYTHON" "$2" "${MEGATRON_ARGS[@]}"'
    p = subprocess.run(
        [BASH, "-c", cmd, "bash", str(f), str(FAKES / "pretrain_gpt.py")], env=env, cwd=_glob_trap(tmp_path),
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    assert _arrived(d) == _expected(lay, model)
    assert d["micro_batch_size"] == lay.micro_batch_size and not d["dynamic_batch"]
    assert d["argv"] == megatron_args(model, cluster, W, lay)  # every element intact, in order


def test_megatron_args_sh_print_prints_its_arguments_and_sourced_keeps_shell_options(tmp_path, model, cluster):
    lay = LAYOUTS["seed"]
    f = _write(tmp_path, "megatron", model, cluster, lay)
    p = subprocess.run(
        [str(f), "--print"], env=_env(tmp_path), cwd=_glob_trap(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == megatron_args(model, cluster, W, lay)
    # sourced: defines the array, prints nothing, leaves errexit / nounset / pipefail as they were
    cmd = (
        'source "$1"; echo "flags=$-"; shopt -qo pipefail && echo pipefail-on || echo pipefail-off; '
        'echo "n=${#MEGATRON_ARGS[@]}"'
    )
    p = subprocess.run(
        [BASH, "-c", cmd, "bash", str(f)], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("flags=") and not set("eu") & set(lines[0].removeprefix("flags="))
    assert lines[1:] == ["pipefail-off", f"n={len(megatron_args(model, cluster, W, lay))}"]


def _launch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = _env(
        tmp_path,
        PYTHON=sys.executable,
        PRETRAIN_SCRIPT=str(FAKES / "pretrain_gpt.py"),
        FAKE_ENTRY_ENV="FAKE_TORCHRUN_OPTS",
        **extra,
    )
    env["PATH"] = f"{FAKES}{os.pathsep}{env['PATH']}"  # the fake torchrun
    return env


def test_megatron_args_sh_run_launches_pretrain_gpt_with_the_users_data(tmp_path, model, cluster):
    lay = LAYOUTS["seed"]
    f = _write(tmp_path, "megatron", model, cluster, lay)
    env = _launch_env(
        tmp_path, DATA_PATH="/data/my corpus_text_document", TOKENIZER_MODEL="/ckpt/MiniMax M2", TRAIN_ITERS="500",
        NODE_RANK="3", MASTER_ADDR="10.0.0.1",
    )
    p = subprocess.run([str(f)], env=env, cwd=_glob_trap(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    assert _arrived(d) == _expected(lay, model)
    n = len(megatron_args(model, cluster, W, lay))
    assert d["argv"][:n] == megatron_args(model, cluster, W, lay)
    assert d["argv"][n:] == [
        "--data-path", "/data/my corpus_text_document", "--split", "99,1,0", "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", "/ckpt/MiniMax M2", "--train-iters", "500", "--save", "checkpoints/MiniMax-M2", "--load",
        "checkpoints/MiniMax-M2", "--save-interval", "1000",
    ]
    assert d["env"]["FAKE_TORCHRUN_OPTS"].split() == [
        "--nnodes=8", "--node-rank=3", "--nproc-per-node=8", "--master-addr=10.0.0.1", "--master-port=29500",
    ]


def test_megatron_args_sh_run_with_mock_data_and_missing_variables(tmp_path, model, cluster):
    f = _write(tmp_path, "megatron", model, cluster, LAYOUTS["seed"])
    for env_extra, missing in (
        ({}, ["DATA_PATH", "TRAIN_ITERS", "TOKENIZER_MODEL"]),
        ({"TRAIN_ITERS": "5"}, ["DATA_PATH", "TOKENIZER_MODEL"]),
        ({"DATA_PATH": "MOCK"}, ["TRAIN_ITERS"]),
        ({"DATA_PATH": "/d", "TRAIN_ITERS": "5"}, ["TOKENIZER_MODEL"]),
    ):
        p = subprocess.run(
            ["bash", str(f)],
            env=_launch_env(tmp_path, **env_extra),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and p.stderr.startswith(
            "megatron_args.sh: these variables are needed and not set:\n"
        ), p.stderr
        assert [ln.split()[1] for ln in p.stderr.splitlines()[1:]] == missing, p.stderr
        assert "set DATA_PATH to your data" in p.stderr or "DATA_PATH" not in missing
        assert not (tmp_path / "dump.json").exists()
    env = _launch_env(tmp_path, DATA_PATH="MOCK", TRAIN_ITERS="5", CHECKPOINT_PATH="/ck", TENSORBOARD_DIR="/tb")
    p = subprocess.run([str(f)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    argv = json.loads((tmp_path / "dump.json").read_text())["argv"]
    assert argv[-13:] == [
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "5", "--save", "/ck", "--load", "/ck",
        "--save-interval", "1000", "--tensorboard-dir", "/tb",
    ]


#: A Megatron-LM launch's training settings as ``tune --from`` keeps them (without effect on the estimate): its schedule
#: (warm-up in iterations), data, tokenizer through its own variable, checkpoints and logging.
USER = (
    "--use-mcore-models", "--max-position-embeddings", "131072", "--train-iters", "50000", "--lr", "1.5e-4", "--min-lr",
    "1.5e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2000", "--weight-decay", "0.1", "--clip-grad", "1.0",
    "--attention-dropout", "0.0", "--data-path", "$DATA_PATH", "--tokenizer-type", "HuggingFaceTokenizer",
    "--tokenizer-model", "$TOKENIZER", "--split", "99,1,0", "--save-interval", "1000", "--save", "/ckpt/out", "--load",
    "/ckpt/out", "--tensorboard-dir", "/logs/tb", "--wandb-project", "llama70b-pretrain", "--log-throughput",
)


def _last(argv: list[str], flag: str) -> str:
    """The value argparse keeps for ``flag``: the one after its last occurrence."""
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


def _with_user_args(tmp_path: Path, name: str, model, cluster) -> Path:
    exporter = get_exporter(name)
    ctx = ExportContext(model=model, cluster=cluster, workload=W, layout=LAYOUTS["seed"], user_args=USER)
    return exporter.write(ctx, tmp_path / exporter.file_name)


def test_with_the_users_launch_megatron_args_sh_runs_the_users_training(tmp_path, model, cluster):
    """``tune --from``: the layout is the tool's, the training the user's: no hyperparameter of the tool's (Megatron
    refuses --lr-warmup-fraction beside the launch's --lr-warmup-iters), the launch's --save, data and tokenizer
    variable, each flag once."""
    from launch.exporters._flags import HPARAM_FLAGS

    f = _with_user_args(tmp_path, "megatron", model, cluster)
    assert "TOKENIZER_MODEL" not in f.read_text()  # one tokenizer variable: the launch's
    p = subprocess.run([str(f)], env=_launch_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and [ln.split()[1] for ln in p.stderr.splitlines()[1:]] == ["DATA_PATH", "TOKENIZER"], (
        p.stderr
    )
    p = subprocess.run(
        [str(f)],
        env=_launch_env(tmp_path, DATA_PATH="/data/tok", TOKENIZER="/ckpt/llama"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    argv = d["argv"]
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)), flags
    assert not set(flags) & (HPARAM_FLAGS - set(USER)), set(flags) & HPARAM_FLAGS  # e.g. no --adam-beta2 0.98
    want = {
        "--lr": "1.5e-4",
        "--save": "/ckpt/out",
        "--load": "/ckpt/out",
        "--data-path": "/data/tok",
        "--tokenizer-model": "/ckpt/llama",
        "--max-position-embeddings": "131072",
        "--wandb-project": "llama70b-pretrain",
    }
    assert {k: _last(argv, k) for k in want} == want
    assert _arrived(d) == _expected(LAYOUTS["seed"], model)


def test_with_the_users_launch_run_slime_sh_runs_the_users_training(tmp_path, model, cluster):
    """As megatron_args.sh: the launch's schedule, checkpoints and logging, no SAVE_DIR needed, each flag once."""
    from launch.exporters._flags import HPARAM_FLAGS

    f = _with_user_args(tmp_path, "slime", model, cluster)
    env = {k: v for k, v in BASE.items() if k != "SAVE_DIR"}
    p = subprocess.run(
        [str(f)],
        env=_env(tmp_path, **env, DATA_PATH="/data/tok", TOKENIZER="/ckpt/llama"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())  # the fake refuses --save, --load, ... given twice
    flags = [a for a in d["argv"] if a.startswith("--")]
    assert len(flags) == len(set(flags)), flags
    assert not set(flags) & (HPARAM_FLAGS - set(USER)), set(flags) & HPARAM_FLAGS
    assert _last(d["argv"], "--lr") == "1.5e-4" and _last(d["argv"], "--wandb-project") == "llama70b-pretrain"
    assert {k: d["slime"][k] for k in ("--save", "--load", "--tensorboard-dir")} == {
        "--save": "/ckpt/out",
        "--load": "/ckpt/out",
        "--tensorboard-dir": "/logs/tb",
    }


def test_with_the_users_mock_data_megatron_args_sh_needs_no_variable_and_adds_no_tokenizer(tmp_path, model, cluster):
    ctx = ExportContext(
        model=model, cluster=cluster, workload=W, layout=LAYOUTS["seed"],
        user_args=("--mock-data", "--train-iters", "10", "--recompute-activations"),
    )
    f = get_exporter("megatron").write(ctx, tmp_path / "megatron_args.sh")
    p = subprocess.run([str(f)], env=_launch_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "dump.json").read_text())
    assert "--tokenizer-type" not in d["argv"] and d["argv"].count("--train-iters") == 1
    assert "--recompute-activations" not in d["argv"] and _arrived(d) == _expected(LAYOUTS["seed"], model)


def test_megatron_args_sh_print_needs_no_environment(tmp_path, model, cluster):
    f = _with_user_args(tmp_path, "megatron", model, cluster)
    for env, shown in (({}, "$DATA_PATH"), ({"DATA_PATH": "/data/tok"}, "/data/tok")):
        p = subprocess.run(
            [str(f), "--print"], env=_env(tmp_path, **env), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0 and not p.stderr, p.stderr
        out = p.stdout.splitlines()
        assert out[out.index("--data-path") + 1] == shown and out[-1] == "--log-throughput"


def test_the_recipe_run_block_is_run_slime_sh_without_its_frame(model, cluster):
    import yaml

    ctx = ExportContext(model=model, cluster=cluster, workload=W, layout=LAYOUTS["seed"])
    script = get_exporter("slime").render(ctx)
    run = yaml.safe_load(get_exporter("recipe").render(ctx))["run"]
    head, body = script.split("\n", 3)[:3], script.split("\n", 3)[3]
    assert head == [
        "#!/usr/bin/env bash",
        "# run_slime.sh, exported by megatron-layout-tuner: run it as it is (./run_slime.sh).",
        "set -euo pipefail",
    ]
    assert body == run and "set -e" not in run  # pasting `run` into a shell does not turn on errexit there


# --------------------------------------------------------------------------- hostile names and values


def test_scripts_from_a_hostile_name_run_only_the_launch(tmp_path, model, cluster):
    """A model name and a config's launch argument full of shell syntax (a newline too, past the name check) reach the
    scripts as comments and quoted words: `bash -n` parses them, and run for real nothing but the launch runs."""
    import dataclasses

    trap = _glob_trap(tmp_path)
    evil = f"M2 $(touch {trap}/a) `touch {trap}/b`; touch {trap}/c #'\""
    hostile = dataclasses.replace(model, extra_megatron_args=(*model.extra_megatron_args, "--x", evil))
    object.__setattr__(
        hostile, "name", f"{evil}\ntouch {trap}/d #\r\x1b[2J"
    )  # ModelSpec refuses it: the exporter's own guard
    lay = LAYOUTS["seed"]
    slime, meg = _write(tmp_path, "slime", hostile, cluster, lay), _write(tmp_path, "megatron", hostile, cluster, lay)
    for f in (slime, meg):
        assert subprocess.run([BASH, "-n", str(f)], capture_output=True).returncode == 0
        assert not any(line.startswith("touch") for line in f.read_text().splitlines())
    env = _env(tmp_path, **BASE)
    p = subprocess.run([str(slime)], env=env, cwd=trap, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    argv = json.loads((tmp_path / "dump.json").read_text())["argv"]
    assert argv[argv.index("--x") + 1] == evil  # one word, as written
    p = subprocess.run(
        [
            BASH, "-c", 'source "$1"; "$PYTHON" "$2" "${MEGATRON_ARGS[@]}"', "bash", str(meg),
            str(FAKES / "pretrain_gpt.py"),
        ],
        env=env,
        cwd=trap,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in trap.iterdir()) == ["1-62"]  # nothing but the launch ran


def test_a_comment_carries_no_control_character():
    from launch.exporters._shell import comment

    assert comment("a\nb\rc\x1bd", None) == ["# a b c d"]
    assert all("\n" not in line for line in comment("x\n" * 80))


@pytest.mark.parametrize("name", ["slime", "megatron"])
def test_a_variable_the_users_kept_arguments_expand_is_named_when_unset(name, tmp_path, model, cluster):
    """``tune --from`` keeps the launch's other arguments, ``$PROFILE_DIR`` included: run with it unset, the script
    names it among the missing variables (exit 2) instead of dying on ``set -u``."""
    exporter = get_exporter(name)
    ctx = ExportContext(
        model=model, cluster=cluster, workload=W, layout=LAYOUTS["seed"], user_args=("--profile-dir", "$PROFILE_DIR")
    )
    script = exporter.write(ctx, tmp_path / exporter.file_name)
    env = _env(tmp_path, **BASE)
    env.pop("PROFILE_DIR", None)
    p = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "set PROFILE_DIR to" in p.stderr and "unbound" not in p.stderr, p.stderr


def test_megatron_args_sh_requires_only_the_variables_of_the_arguments_it_writes(model, cluster):
    """A slime launch's own arguments (``--hf-checkpoint "$HF_CKPT"``) are not Megatron-LM's: megatron_args.sh leaves
    them out, and with them their variables; a kept argument's variable stays required."""
    ctx = ExportContext(model=model, cluster=cluster, workload=W, layout=LAYOUTS["seed"],
                        user_args=("--hf-checkpoint", "$HF_CKPT", "--profile-dir", "$PROFILE_DIR"))
    text = get_exporter("megatron").render(ctx)
    assert "HF_CKPT" not in text and "--hf-checkpoint" not in text
    assert "set PROFILE_DIR to" in text and '--profile-dir "$PROFILE_DIR"' in text


# --------------------------------------------------------------------------- what Megatron-LM asserts at start-up


def _options(core: str | None = "0.16", **flags):
    from specs.stacks import RunFlags, resolve_run_options

    return resolve_run_options(RunFlags(**flags), megatron_core=core).options


def _render(name: str, model, cluster, options) -> str:
    ctx = ExportContext(model=model, cluster=cluster, workload=W, layout=LAYOUTS["port"], options=options)
    return get_exporter(name).render(ctx)


@pytest.mark.parametrize(("core", "flags", "alloc", "register"), [
    # arguments.py l.1270-1277 at 1dcf0da (slime's pin), l.1961-1968 at d98e8a64: NCCL_GRAPH_REGISTER=0 beside
    # expandable segments with TE's graphs
    ("0.16", {"cuda_graph_impl": "transformer_engine"}, "expandable_segments:True", "0"),
    (None, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",)}, "expandable_segments:True", "0"),
    ("0.16", {"cuda_graph_impl": "local"}, "expandable_segments:True", None),
    (None, {"cuda_graph_impl": "full_iteration"}, "expandable_segments:True", None),
    ("0.16", {}, "expandable_segments:True", None),
    # core_v0.15.0 l.1198-1201: no expandable segments with any CUDA graph
    ("0.15", {"cuda_graph_impl": "transformer_engine"}, "expandable_segments:False", None),
    ("0.15", {}, "expandable_segments:True", None),
])  # fmt: skip
def test_the_slime_launch_env_is_one_megatron_accepts_beside_its_cuda_graphs(core, flags, alloc, register, model,
                                                                            cluster):
    import yaml

    opts = _options(core, **flags)
    script = _render("slime", model, cluster, opts)
    exported = dict(ln.removeprefix("export ").split("=", 1) for ln in script.splitlines()
                    if ln.startswith("export ") and "PYTHONPATH" not in ln)
    assert (exported["PYTORCH_CUDA_ALLOC_CONF"], exported.get("NCCL_GRAPH_REGISTER")) == (alloc, register)
    assert exported["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert yaml.safe_load(_render("recipe", model, cluster, opts))["env"] == exported  # the recipe's env is the same


@pytest.mark.parametrize(("flags", "nan_check_off"), [
    ({"cuda_graph_impl": "full_iteration"}, True),  # arguments.py l.1235-1237 at d98e8a64
    ({"cuda_graph_impl": "local", "cuda_graph_scope": ("full_iteration",)}, True),  # l.724-727 at 1dcf0da
    ({"cuda_graph_impl": "transformer_engine"}, False),
    ({}, False),
])  # fmt: skip
def test_a_whole_iteration_cuda_graph_is_exported_with_the_nan_check_off(flags, nan_check_off, model, cluster):
    from launch.exporters._flags import NO_NAN_CHECK

    opts = _options(None, **flags)
    argv = megatron_args(model, cluster, W, LAYOUTS["port"], options=opts)
    assert argv.count(NO_NAN_CHECK) == nan_check_off
    assert _render("slime", model, cluster, opts).count(NO_NAN_CHECK) == nan_check_off


@pytest.mark.parametrize(("flags", "want"), [
    # TP 2 on Hopper: arguments.py l.1453-1479 at d98e8a64 asserts CUDA_DEVICE_MAX_CONNECTIONS=1
    ({}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_GRAPH_REGISTER": None}),
    ({"cuda_graph_impl": "transformer_engine"}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_GRAPH_REGISTER": "0"}),
    # Megatron-FSDP: l.1166-1167 asserts it is not 1
    ({"use_megatron_fsdp": True}, {"CUDA_DEVICE_MAX_CONNECTIONS": None, "NCCL_GRAPH_REGISTER": None}),
])  # fmt: skip
def test_megatron_args_sh_run_exports_the_env_megatron_asserts(flags, want, tmp_path, model, cluster):
    f = tmp_path / "megatron_args.sh"
    f.write_text(_render("megatron", model, cluster, _options(None, **flags)))
    env = _launch_env(tmp_path, DATA_PATH="MOCK", TRAIN_ITERS="1")
    env["FAKE_ENTRY_ENV"] += "," + ",".join(want)
    p = subprocess.run([BASH, str(f)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads((tmp_path / "dump.json").read_text())["env"]
    assert {k: got[k] for k in want} == want
    if not flags:  # sourced, it changes nothing of the caller's environment
        cmd = 'source "$1"; echo "${CUDA_DEVICE_MAX_CONNECTIONS-unset}"'
        p = subprocess.run([BASH, "-c", cmd, "bash", str(f)], env=_env(tmp_path), capture_output=True, text=True,
                           timeout=60)
        assert p.stdout.strip() == "unset", p.stderr
