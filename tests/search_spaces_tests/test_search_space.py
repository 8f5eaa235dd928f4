"""The search space YAML and its enumeration (search_spaces/space.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from search_spaces.pipeline import emit_layout_string, layer_counts_from_string, stage_layer_counts
from search_spaces.rules import RULE_IDS, RULES, Rule, RuleEnv, check_layout, check_table
from search_spaces.space import PipelineSplitSpace, SearchSpace, enumerate_layouts
from specs import ModelSpec, RunOptions, Workload, load_model
from specs.errors import TunerError
from specs.layout import LayoutTable

WORKLOAD = Workload(seq_length=8192, global_batch_size=128)


@pytest.fixture(scope="module")
def minimax() -> ModelSpec:
    return load_model("MiniMax-M2")


# --------------------------------------------------------------------------- YAML


def test_default_space_values() -> None:
    s = SearchSpace.load()
    assert s.tp == (1, 2, 4, 8)
    assert s.pp == (1, 2, 4, 8, 16)
    assert s.vpp == (1, 2, 4, 8)
    assert s.cp == (1, 2)
    assert s.ep == (1, 2, 4, 8, 16, 32, 64)
    assert s.etp == (1, 2)
    assert s.micro_batch_size == (1, 2)
    assert s.optimizer_offload_fraction == (0.0, 0.5, 1.0)
    assert s.overlap_cpu_optimizer_d2h_h2d == (True,)
    assert [d.value for d in s.dispatcher] == ["alltoall", "allgather", "flex+deepep", "flex+hybridep"]
    assert s.pipeline_split == PipelineSplitSpace(even=True, max_stage_deficit=2)
    assert s.exp_avg_dtype == ("fp32",) and s.exp_avg_sq_dtype == ("fp32",)
    assert s.use_precision_aware_optimizer == (True,) and s.use_distributed_optimizer == (True,)
    assert [r.to_dict() for r in s.recompute] == [
        {"granularity": "none"},
        {"granularity": "selective", "modules": ["core_attn"]},
        {"granularity": "selective", "modules": ["core_attn", "moe_act", "layernorm"]},
        {"granularity": "selective", "modules": ["moe"]},
        {"granularity": "selective", "modules": ["mlp"]},
        {"granularity": "full", "method": "uniform", "num_layers": 1},
        {"granularity": "full", "method": "block", "num_layers": 1},
        {"granularity": "full", "method": "block", "num_layers": 2},
        {"granularity": "full", "method": "block", "num_layers": 4},
    ]


def test_to_dict_round_trip() -> None:
    s = SearchSpace.load()
    d = s.to_dict()
    assert set(d) == set(SearchSpace.keys())
    assert SearchSpace.from_dict(d) == s
    assert yaml.safe_load(yaml.safe_dump(d)) == d


def test_yaml_file_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "space.yaml"
    f.write_text("tp: [1, 2]\nvpp: 1\npipeline_split: {even: true, max_stage_deficit: 0}\ndispatcher: alltoall\n")
    s = SearchSpace.load(f)
    assert s.tp == (1, 2) and s.vpp == (1,) and [d.value for d in s.dispatcher] == ["alltoall"]
    assert s.pipeline_split.max_stage_deficit == 0
    assert s.pp == (1, 2, 4, 8, 16)  # untouched keys keep the default


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            "tp: [1, 2]\ntensor_parallel: [4]\nfoo: 1\n",
            ("unknown keys ['tensor_parallel', 'foo']", "accepted keys: tp, pp, vpp"),
        ),
        ("tp: [0, 2]\n", ("tp", "positive integer", "[0, 2]")),
        ("tp: [true]\n", ("tp", "positive integer")),
        ("micro_batch_size: [1, 99999999999999999999]\n", ("micro_batch_size", "below 2**31")),
        ("dispatcher: [alltoall, deepep]\n", ("dispatcher", "'deepep'", "flex+deepep")),
        ("optimizer_offload_fraction: [1.5]\n", ("optimizer_offload_fraction", "[0, 1]")),
        ("exp_avg_dtype: [fp8]\n", ("exp_avg_dtype", "accepted: fp32, bf16")),
        ("recompute: [{granularity: full, method: uniform}]\n", ("recompute[0].num_layers", "positive integer")),
        ("recompute: [{granularity: partial}]\n", ("recompute[0]", "none, selective, full")),
        (
            "recompute: [{granularity: selective, modules: [attn]}]\n",
            ("unknown recompute modules ['attn']", "core_attn"),
        ),
        ("recompute: [{granularity: none, method: block}]\n", ("unknown keys ['method']",)),
        (
            "pipeline_split: {even: true, deficit: 1}\n",
            ("pipeline_split", "unknown keys ['deficit']", "max_stage_deficit"),
        ),
        ("pipeline_split: {even: false, max_stage_deficit: 0}\n", ("no split is left",)),
        ("- tp\n", ("expected a mapping",)),
        ("tp: [1\n", ("not valid YAML",)),
        ("tp: [1, 2]\nep: [8]\ntp: [4]\n", ("--space", "key 'tp' appears twice (lines 1 and 3)")),
    ],
)
def test_bad_yaml_raises(tmp_path: Path, text: str, needles: tuple[str, ...]) -> None:
    f = tmp_path / "space.yaml"
    f.write_text(text)
    with pytest.raises(TunerError) as exc:
        SearchSpace.load(f)
    for needle in needles:
        assert needle in str(exc.value), (needle, str(exc.value))


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(TunerError, match="cannot read it"):
        SearchSpace.load(tmp_path / "nope.yaml")


def test_split_options() -> None:
    split = PipelineSplitSpace(even=True, max_stage_deficit=2)
    assert split.options(62, 1) == [(0, 0)]
    assert split.options(62, 2) == [(0, 0), (32, 30), (31, 31), (30, 32)]
    assert split.options(62, 8) == [(0, 0), (8, 6), (7, 7), (6, 8)]
    assert PipelineSplitSpace(even=False, max_stage_deficit=1).options(62, 8) == [(7, 7)]
    assert PipelineSplitSpace(even=False, max_stage_deficit=1).options(62, 1) == []


# --------------------------------------------------------------------------- enumeration


def test_minimax_default_enumeration(minimax: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    space = SearchSpace.load()
    # What keeps it fast (timed in benchmarks/bench_enumerate_estimate.py): each rule is one vectorised call
    # over the candidates still alive, never one call per layout.
    calls: list[tuple[str, int]] = []
    check = Rule.check

    def counted(self: Rule, table: LayoutTable, *args: Any) -> Any:
        calls.append((self.id, len(table)))
        return check(self, table, *args)

    monkeypatch.setattr(Rule, "check", counted)
    e = enumerate_layouts(space, minimax, 64, WORKLOAD)
    assert [rid for rid, _ in calls] == list(RULE_IDS)
    # 17 pipeline splits x tp 4 x cp 2 x ep 7 x etp 2 x mbs 2 x vpp 4 x recompute 8 (mlp dropped)
    # x offload 3 x dispatcher 4
    assert e.considered == 17 * 4 * 2 * 7 * 2 * 2 * 4 * 8 * 3 * 4 == 1_462_272
    assert list(e.rule_counts) == list(RULE_IDS)
    assert sum(e.rule_counts.values()) + len(e.valid) == e.considered
    assert len(e.valid) == 473_952
    assert e.rule_counts["world_div_etp_ep_pp"] == 491_520
    assert any("mlp" in n for n in e.notes)
    v = e.valid
    assert (v["world_size"] == 64).all()
    assert (v["sequence_parallel"] == (v["tp"] > 1)).all()
    assert not np.isin(v["recompute_modules"], ["mlp"]).any()

    def find(**want: Any) -> np.ndarray:
        mask = np.ones(len(v), dtype=bool)
        for k, val in want.items():
            mask &= v[k] == val
        return np.flatnonzero(mask)

    seed = find(
        tp=1, pp=8, vpp=4, cp=1, ep=8, etp=1, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, num_layers_in_first_pipeline_stage=7,
        num_layers_in_last_pipeline_stage=7, dispatcher="alltoall", optimizer_offload_fraction=0.0,
    )
    assert len(seed) == 1
    lay = v.row(int(seed[0]))
    assert lay.label == "TP1 PP8 VPP4 EP8 DP8"
    assert emit_layout_string(62, lay.pp, lay.vpp, 7, 7) == "Et|(tt|)*30tL"
    ref = find(
        tp=2, pp=2, vpp=1, cp=1, ep=8, etp=1, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, num_layers_in_first_pipeline_stage=0, dispatcher="alltoall",
        optimizer_offload_fraction=1.0,
    )
    assert len(ref) == 1 and v.row(int(ref[0])).sequence_parallel


def test_valid_rows_pass_check_layout(minimax: ModelSpec) -> None:
    e = enumerate_layouts(SearchSpace.load(), minimax, 64, WORKLOAD)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(e.valid), size=200, replace=False):
        assert check_layout(e.valid.row(int(i)), minimax, WORKLOAD) == []
    # Every valid split emits a layout string that parses back to its counts.
    keys = np.stack(
        [e.valid[c] for c in ("pp", "vpp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")],
        1,
    )
    for pp, vpp, first, last in np.unique(keys, axis=0).tolist():
        text = emit_layout_string(62, pp, vpp, first, last)
        assert layer_counts_from_string(text, pp, 62) == stage_layer_counts(62, pp, vpp, first, last)


def _brute_force(space: SearchSpace, model: ModelSpec, world: int) -> LayoutTable:
    """The full product of a space, built independently of the enumeration's staging."""
    pipe = [(pp, f, la) for pp in space.pp for f, la in space.pipeline_split.options(model.num_layers, pp)]
    dims: list[list[dict[str, Any]]] = [
        [
            {"pp": p, "num_layers_in_first_pipeline_stage": f, "num_layers_in_last_pipeline_stage": la}
            for p, f, la in pipe
        ],
        [{"tp": t, "sequence_parallel": t > 1} for t in space.tp],
        [{"vpp": x} for x in space.vpp],
        [{"cp": x} for x in space.cp],
        [{"ep": x} for x in space.ep],
        [{"etp": x} for x in space.etp],
        [{"micro_batch_size": x} for x in space.micro_batch_size],
        [
            {
                "recompute_granularity": r.granularity.value,
                "recompute_method": r.method.value,
                "recompute_num_layers": r.num_layers,
                "recompute_modules": ",".join(r.modules),
            }
            for r in space.recompute
        ],
        [{"optimizer_offload_fraction": x} for x in space.optimizer_offload_fraction],
        [{"overlap_cpu_optimizer_d2h_h2d": x} for x in space.overlap_cpu_optimizer_d2h_h2d],
        [{"dispatcher": d.value} for d in space.dispatcher],
        [{"exp_avg_dtype": x} for x in space.exp_avg_dtype],
        [{"exp_avg_sq_dtype": x} for x in space.exp_avg_sq_dtype],
        [{"use_precision_aware_optimizer": x} for x in space.use_precision_aware_optimizer],
        [{"use_distributed_optimizer": x} for x in space.use_distributed_optimizer],
    ]
    idx = np.indices([len(d) for d in dims]).reshape(len(dims), -1)
    cols: dict[str, np.ndarray] = {"world_size": np.full(idx.shape[1], world)}
    for d, ix in zip(dims, idx, strict=True):
        for key in d[0]:
            cols[key] = np.array([opt[key] for opt in d])[ix]
    return LayoutTable(cols)


def _rows(table: LayoutTable) -> list[tuple[Any, ...]]:
    names = sorted(table.cols)
    return sorted(zip(*(table[n].tolist() for n in names), strict=True))


def test_the_valid_table_is_one_byte_a_row_per_dimension(minimax: ModelSpec) -> None:
    v = enumerate_layouts(SearchSpace.load(), minimax, 64, WORKLOAD).valid
    held = {id(a): a for a in v.cols.values() if 0 not in a.strides}
    # pipeline, tp, cp, ep, etp, micro_batch_size, vpp, recompute, offload, dispatcher; the rest hold one option
    assert [a.dtype.itemsize for a in held.values()] == [1] * 10
    assert v.cols["pp"] is v.cols["num_layers_in_first_pipeline_stage"]
    i = len(v) // 2
    assert v.row(i).to_dict() == {
        k: v[k][i].item() if k != "recompute_modules" else [x for x in v[k][i].split(",") if x] for k in v.cols
    }


def test_enumeration_matches_brute_force(tmp_path: Path, minimax: ModelSpec) -> None:
    f = tmp_path / "small.yaml"
    f.write_text(
        """
tp: [1, 2]
pp: [1, 2, 8]
vpp: [1, 4]
cp: [1, 2]
ep: [1, 8]
etp: [1, 2]
micro_batch_size: [1, 2]
recompute:
  - {granularity: none}
  - {granularity: selective, modules: [core_attn]}
  - {granularity: selective, modules: [moe_act, moe]}
  - {granularity: full, method: uniform, num_layers: [1, 2]}
  - {granularity: full, method: block, num_layers: 8}
optimizer_offload_fraction: [0.0, 1.0]
dispatcher: [alltoall, flex+deepep]
exp_avg_dtype: [fp32, bf16]
use_precision_aware_optimizer: [true, false]
use_distributed_optimizer: [true, false]
"""
    )
    space = SearchSpace.load(f)
    workload = Workload(seq_length=8192, global_batch_size=48)
    e = enumerate_layouts(space, minimax, 16, workload)
    full = _brute_force(space, minimax, 16)
    assert e.considered == len(full) == 110_592
    ok, counts = check_table(full, minimax, workload)
    assert counts == e.rule_counts
    assert int(ok.sum()) == len(e.valid)
    assert _rows(full.select(ok)) == _rows(e.valid)
    # Every rule fires at least once here except those the space cannot break.
    assert {k for k, v in counts.items() if v == 0} <= {
        "heads_div_tp",
        "query_groups_tp",
        "ffn_div_tp",
        "experts_div_ep",
        "moe_ffn_div_etp",
        "dense_no_expert_parallel",
        "seq_div_2cp",
        "sequence_parallel",
        "sp_seq_div_tp",
        "cp_attention_variant",
        "cpu_offloading",  # activation offloading is off here
        "cuda_graphs",  # CUDA graphs are off here
        "cuda_graph_scope",
        "cuda_graph_release",
        "ep_overlap",  # the run options' rules: default options here
        "ep_overlap_options",
        "dist_muon_options",
        "dist_muon",
        "fp8_param_gather_offload",
        "recompute_selective",
        "recompute_none",
        "recompute_modules_model",
        "dispatcher_fabric",  # no network named here
        "dispatcher_release",  # the newest release
    }

    # check_table and check_layout agree row by row on a random sample of the full product.
    masks = {r.id: r.check(full, minimax, workload) for r in RULES}
    rng = np.random.default_rng(1)
    for i in rng.choice(len(full), size=300, replace=False).tolist():
        broken = [rid for rid, _ in check_layout(full.row(i), minimax, workload)]
        assert broken == [rid for rid in RULE_IDS if not masks[rid][i]]
        assert (not broken) == bool(ok[i])


def test_dense_model_collapses_expert_dims() -> None:
    llama = load_model("Llama-3.1-8B")
    e = enumerate_layouts(SearchSpace.load(), llama, 64, WORKLOAD)
    assert any("dense" in n and "[alltoall]" in n for n in e.notes)
    assert any("moe" in n and "dropped" in n for n in e.notes)
    assert (e.valid["ep"] == 1).all() and (e.valid["etp"] == 1).all()
    assert set(e.valid["dispatcher"].tolist()) == {"alltoall"}
    mods = set(e.valid["recompute_modules"].tolist())
    assert mods == {"", "core_attn", "core_attn,layernorm", "mlp"}
    assert sum(e.rule_counts.values()) + len(e.valid) == e.considered
    assert e.rule_counts["dense_no_expert_parallel"] == 0


def test_bad_world_size(minimax: ModelSpec) -> None:
    with pytest.raises(TunerError, match="positive integer"):
        enumerate_layouts(SearchSpace.load(), minimax, 0, WORKLOAD)


def _small_space() -> SearchSpace:
    return dataclasses.replace(SearchSpace.load(), tp=(1, 2), pp=(1, 2), vpp=(1, 2), cp=(1,), ep=(4, 8),
                               micro_batch_size=(1,), optimizer_offload_fraction=(0.0, 1.0),
                               use_distributed_optimizer=(True, False))


@pytest.mark.parametrize(("core", "distopt"), [("0.19", {True, False}), ("0.17", {False})])
def test_dist_muon_turns_the_precision_aware_optimizer_off(core: str, distopt: set[bool]) -> None:
    env = RuleEnv.of(None, RunOptions(optimizer="dist_muon", megatron_core=core))
    e = enumerate_layouts(_small_space(), load_model("Qwen3-30B-A3B"), 8, WORKLOAD, env)
    assert len(e.valid) and not e.valid["use_precision_aware_optimizer"].any()
    assert set(e.valid["use_distributed_optimizer"].tolist()) == distopt
    assert not e.valid["optimizer_offload_fraction"].any()
    assert any("dist_muon" in n and "use_precision_aware_optimizer" in n for n in e.notes)


def test_options_no_layout_can_run_with_name_their_rule() -> None:
    env = RuleEnv.of(None, RunOptions(cuda_graph_impl="full_iteration", megatron_core="0.16"))
    with pytest.raises(TunerError, match=r"no layout can run with these run options: \[cuda_graph_release\]"):
        enumerate_layouts(_small_space(), load_model("Qwen3-30B-A3B"), 8, WORKLOAD, env)
