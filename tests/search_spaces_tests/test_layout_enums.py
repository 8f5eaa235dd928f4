"""What the layout enums mean (their properties), the table columns that hold them, and adding a dispatcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from specs.layout import (
    _DISPATCHER_TRAITS,
    CODED_COLUMNS,
    Dispatcher,
    Layout,
    LayoutTable,
    RecomputeGranularity,
    RecomputeMethod,
    enum_mask,
)

ROOT = Path(__file__).resolve().parents[2]


def test_dispatcher_properties():
    want = {
        # member: (--moe-token-dispatcher-type, --moe-flex-dispatcher-backend, is_flex, is_allgather)
        Dispatcher.alltoall: ("alltoall", None, False, False),
        Dispatcher.allgather: ("allgather", None, False, True),
        Dispatcher.flex_deepep: ("flex", "deepep", True, False),
        Dispatcher.flex_hybridep: ("flex", "hybridep", True, False),
    }
    assert set(want) == set(Dispatcher) == set(_DISPATCHER_TRAITS)
    for d, (kind, backend, flex, ag) in want.items():
        assert (d.moe_token_dispatcher_type, d.moe_flex_dispatcher_backend, d.is_flex, d.is_allgather) == (
            kind, backend, flex, ag,
        ), d


def test_recompute_properties():
    assert [g.recomputes_modules for g in RecomputeGranularity] == [False, True, False]
    assert [g.recomputes_whole_layers for g in RecomputeGranularity] == [False, False, True]
    assert [m.recomputes_every_layer for m in RecomputeMethod] == [False, True, False]


def test_enum_mask_reads_properties():
    t = LayoutTable.from_layouts(
        [Layout(world_size=8, ep=8, dispatcher=d) for d in ("alltoall", "flex+deepep", "allgather", "flex+hybridep")]
    )
    assert enum_mask(t, "dispatcher", Dispatcher, lambda d: d.is_flex).tolist() == [False, True, False, True]
    assert enum_mask(t, "dispatcher", Dispatcher, lambda d: d.is_allgather).tolist() == [False, False, True, False]
    assert enum_mask(t.select(slice(0, 0)), "dispatcher", Dispatcher, lambda d: d.is_flex).shape == (0,)


def test_string_columns_are_codes_into_categories():
    lays = [
        Layout(world_size=8, ep=8, dispatcher=d, exp_avg_dtype=x)
        for d, x in (("flex+deepep", "bf16"), ("alltoall", "fp32"), ("flex+deepep", "fp32"))
    ]
    t = LayoutTable.from_layouts(lays)
    assert {c: t.cols[c].dtype.itemsize for c in CODED_COLUMNS} == dict.fromkeys(CODED_COLUMNS, 2)
    assert t["dispatcher"].tolist() == ["flex+deepep", "alltoall", "flex+deepep"]
    assert t.isin("exp_avg_dtype", "fp32").tolist() == [False, True, True]
    assert t.where("dispatcher", lambda v: v.startswith("flex")).tolist() == [True, False, True]
    picked = t.select(np.array([2, 1]))
    assert [picked.row(i) for i in range(2)] == [lays[2], lays[1]]
    cats, codes = t.codes("dispatcher")
    same = LayoutTable({**t.cols, "dispatcher": codes.astype(np.int64)}, t.cats)
    assert list(same) == lays
    with pytest.raises(ValueError, match="categories given with"):
        LayoutTable({**t.cols, "dispatcher": t["dispatcher"]}, t.cats)
    with pytest.raises(ValueError, match="without categories"):
        LayoutTable(t.cols)


def test_a_value_longer_than_any_member_is_kept_whole():
    one = LayoutTable.from_layouts([Layout(world_size=8)])
    cols = {k: one[k] for k in one.cols}
    for dtype in (None, object):
        cols["dispatcher"] = np.array(["flex+deepep_ll"], dtype=dtype)
        assert LayoutTable(cols)["dispatcher"].tolist() == ["flex+deepep_ll"]


@pytest.mark.slow
def test_adding_a_dispatcher_is_one_member_and_one_traits_row(tmp_path):
    """The newcomer exercise: a copy of the product packages where specs/layout.py alone gains ``flex+deepep_ll``
    (DeepEP's low-latency kernels; 14 characters, longer than any member today). The table keeps it whole,
    the rules treat it as flex, the estimate gives it DeepEP's costs when its traits are DeepEP's, and the
    dispatcher contract suite (tests/launch_tests/test_dispatcher_contract.py) passes for it unchanged."""
    for pkg in ("specs", "search_spaces", "cost_model", "launch", "rl", "tuner"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tests" / "launch_tests" / "test_dispatcher_contract.py", tmp_path)
    layout_py = tmp_path / "specs" / "layout.py"
    src = layout_py.read_text()
    member = '    flex_hybridep = "flex+hybridep"\n'
    row = (
        '    Dispatcher.flex_hybridep: _DispatcherTraits("flex", "hybridep", "HybridEP", "hybrid_ep", ("hybridep",)),\n'
    )
    assert src.count(member) == 1 and src.count(row) == 1
    if "flex_deepep_ll" not in src:  # a contributor following CONTRIBUTING.md has added it already
        src = src.replace(member, member + '    flex_deepep_ll = "flex+deepep_ll"\n')
        new_row = ('    Dispatcher.flex_deepep_ll: _DispatcherTraits("flex", "deepep", "DeepEP", "deep_ep", '
                   '("deepep_ll",)),\n')
        src = src.replace(row, row + new_row)
    layout_py.write_text(src)
    script = textwrap.dedent(
        f"""
        import specs
        assert specs.__file__.startswith({str(tmp_path)!r}), specs.__file__
        from cost_model.estimate import estimate
        from search_spaces.rules import check_layout
        from specs import Layout, LayoutTable, Workload, load_model, parse_gpus
        lay = Layout(world_size=64, pp=4, ep=16, dispatcher="flex+deepep_ll", num_layers_in_first_pipeline_stage=15, num_layers_in_last_pipeline_stage=15,
                     recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        assert LayoutTable.from_layouts([lay]).row(0) == lay
        m, c, w = load_model("MiniMax-M2"), parse_gpus("64xH200"), Workload()
        assert check_layout(lay, m, w) == []
        assert [r for r, _ in check_layout(lay.replace(ep=1), m, w)] == ["dispatcher"]
        new, deep = estimate(m, c, w, lay), estimate(m, c, w, lay.replace(dispatcher="flex+deepep"))
        assert new.time == deep.time and new.memory == deep.memory, (new.time, deep.time)
        print("ok")
        """  # noqa: E501
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    suite = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
            "test_dispatcher_contract.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
    assert "25 passed" in suite.stdout  # 5 cases x 5 dispatchers, flex+deepep_ll among them


def test_appending_rows_keeps_coded_columns_coded_and_values_whole():
    """A layout appended to an enumeration's coded table (``tune --from``'s launch) reads back as itself, the table's
    rows unchanged, its string columns still codes."""
    from search_spaces.space import SearchSpace, enumerate_layouts
    from specs import Layout, LayoutTable, Workload, load_model

    m = load_model("Qwen3-30B-A3B")
    valid = enumerate_layouts(SearchSpace.load(), m, 8, Workload(seq_length=4096, global_batch_size=16)).valid
    extra = Layout.from_dict(
        {
            "world_size": 8,
            "tp": 1,
            "pp": 1,
            "ep": 8,
            "micro_batch_size": 3,
            "dispatcher": "allgather",
            "recompute_granularity": "selective",
            "recompute_modules": ["core_attn", "moe_act"],
        }
    )
    both = valid.append(LayoutTable.from_layouts([extra]))
    assert len(both) == len(valid) + 1 and both.row(len(valid)).key() == extra.key()
    assert all(both.row(i).key() == valid.row(i).key() for i in (0, len(valid) // 2, len(valid) - 1))
    assert set(both.cats) >= {"dispatcher", "recompute_modules"} and both.cols["dispatcher"].dtype.kind in "iu"
