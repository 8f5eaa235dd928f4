"""launch.harness.sweep: bad input is one message (exit 2) before any trial; predictions use the layout as the harness
runs it."""

from __future__ import annotations

import pytest

from cost_model.estimate import estimate
from launch.harness import sweep
from launch.harness.spec import HarnessEnv, harness_layout
from specs import HARNESS_RUN_OPTIONS, Workload, load_model, parse_gpus
from specs.layout import Layout
from specs.model import slice_model


@pytest.mark.parametrize(
    "lines, extra, needle",
    [
        (None, [], "No such file"), (['{"ep": 2'], [], "line 1: not a layout"),
        (['{"ep": 2}', "[1, 2]"], [], "line 2: not a layout"),
        (['{"ep": 2, "no_such_field": 1}'], [], "line 1: not a layout"),
        (['{"ep": 2}'], ["--steps", "4", "--warmup", "4"], "warm-up steps in [0, steps)"),
    ],
)
def test_bad_input_is_one_message(tmp_path, capsys, lines, extra, needle):
    f = tmp_path / "layouts.jsonl"
    if lines is not None:
        f.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    rc = sweep.main(
        [
            "--layers", "2", "--gpus", "2xH200", "--layouts", str(f), "--out", str(out), "--trials-dir",
            str(tmp_path / "t"), *extra,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "t").exists()


def test_harness_layout_turns_precision_aware_off_without_te():
    lay = Layout(world_size=2, ep=2, use_precision_aware_optimizer=True)
    assert harness_layout(lay, HarnessEnv()).use_precision_aware_optimizer is False
    assert harness_layout(lay, HarnessEnv(transformer_engine=True)) == lay
    off = lay.replace(optimizer_offload_fraction=1.0)
    assert harness_layout(off, HarnessEnv()) == off  # with CPU offload megatron-core's own precision-aware path runs
    # what it changes in the prediction: fp32 master weights instead of 2-byte remainders (H200 2-GPU slice: ~8 GiB)
    m, c, w = (
        slice_model(load_model("MiniMax-M2"), 2),
        parse_gpus("2xH200"),
        Workload(seq_length=8192, global_batch_size=8),
    )
    on = estimate(m, c, w, lay.replace(micro_batch_size=2), options=HARNESS_RUN_OPTIONS).peak_bytes
    ran = estimate(
        m, c, w, harness_layout(lay.replace(micro_batch_size=2), HarnessEnv()), options=HARNESS_RUN_OPTIONS
    ).peak_bytes
    assert 6 * 2**30 < ran - on < 10 * 2**30


def test_nothing_starts_without_the_gpu_extra_or_the_gpus(tmp_path, capsys, monkeypatch):
    import importlib.util

    f = tmp_path / "layouts.jsonl"
    f.write_text('{"ep": 2}\n')
    args = [
        "--layers", "2", "--gpus", "2xH200", "--layouts", str(f), "--out", str(tmp_path / "o"), "--trials-dir",
        str(tmp_path / "t"),
    ]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "megatron.core") else real(name, *a)
    )
    assert sweep.main(args) == 2 and "gpu extra" in capsys.readouterr().err
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in ("torch", "megatron.core") else real(name, *a)
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert sweep.main(args) == 2 and "needs 2 GPUs and this machine shows 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
