"""The engine-model check (benchmarks/rl_serving.py): the published-runs reader, request lengths, predictions on
synthetic latency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.rl_serving import ServingRun, predict_serving, read_serving_runs, serving_requests, summarise_serving
from rl.engine import LatencyTable

ROOT = Path(__file__).resolve().parents[2]
HEADER = (
    "id,source,model,gpu,engine,engine_version,precision,tp,ep,dp,load,concurrency,num_prompts,isl,osl,lengths,metric,"
    "measured,notes"
)


def _const(decode_s: float, prefill_per_token_s: float = 0.0):
    def latency(row: ServingRun, max_ctx: int) -> LatencyTable:
        return LatencyTable.from_functions(
            lambda n, c: decode_s, lambda t: prefill_per_token_s * t, max_ctx=max_ctx, source="const"
        )

    return latency


def _rows(tmp_path: Path, *lines: str) -> list[ServingRun]:
    f = tmp_path / "runs.csv"
    f.write_text("\n".join([HEADER, *lines]) + "\n")
    rows, errors = read_serving_runs(f)
    assert not errors, errors
    return rows


def test_published_table_reads_whole_and_names_its_sources():
    rows, errors = read_serving_runs(ROOT / "benchmarks" / "data" / "engine_decode.csv")
    assert not errors and len(rows) >= 20
    assert all(r.source.startswith("https://github.com/") for r in rows)
    assert {r.load for r in rows} == {"closed", "open"} and {r.engine.value for r in rows} == {"vllm", "sglang"}
    assert {r.gpu for r in rows} == {"H100", "H200"}


def test_bad_rows_are_named_by_line_and_column_and_good_rows_still_read(tmp_path):
    f = tmp_path / "runs.csv"
    good = "a,src,Qwen3-30B-A3B,H100,vllm,0.11,bf16,1,1,1,closed,4,40,1024,1024,fixed,tpot_ms,5.0,"
    f.write_text(
        "\n".join(
            [
                HEADER, good, good.replace(",closed,", ",sometimes,"), good.replace(",tpot_ms,", ",latency,"),
                good.replace(",fixed,", ",uniform:2,"),
            ]
        )
        + "\n"
    )
    rows, errors = read_serving_runs(f)
    assert len(rows) == 1
    assert errors == [
        "line 3: column load: cannot read 'sometimes'",
        "line 4: column metric: cannot read 'latency'",
        "line 5: column lengths: cannot read 'uniform:2'",
    ]
    f.write_text("id,model\nx,y\n")
    with pytest.raises(Exception, match="missing columns source, gpu, engine"):
        read_serving_runs(f)


def test_closed_load_tpot_and_throughput_on_a_known_schedule(tmp_path):
    # 40 requests of 100 in / 200 out, 4 in flight, 10 ms per decode iteration, prefill free:
    # 10 waves of 200 iterations = 20 s; TPOT = 10 ms; output = 8000 tokens / 20 s.
    (row,) = _rows(tmp_path, "a,src,Qwen3-30B-A3B,H100,vllm,,bf16,1,1,1,closed,4,40,100,200,fixed,tpot_ms,10.0,")
    p = predict_serving(row, latency=_const(0.010))
    assert p.predicted == pytest.approx(10.0) and p.rel_error == pytest.approx(0.0)
    assert p.run is not None and p.run.makespan_s == pytest.approx(20.0) and p.run.peak_running == 4
    (row,) = _rows(tmp_path, "a,src,Qwen3-30B-A3B,H100,vllm,,bf16,1,1,1,closed,4,40,100,200,fixed,output_tok_s,400.0,")
    assert predict_serving(row, latency=_const(0.010)).predicted == pytest.approx(400.0)
    # a prefill cost stalls the running requests: TPOT rises above the iteration time
    assert predict_serving(row, latency=_const(0.010, 1e-4)).predicted < 400.0


def test_open_load_runs_everything_at_once_and_per_gpu_divides(tmp_path):
    (row,) = _rows(
        tmp_path, "a,src,Qwen3-30B-A3B,H100,vllm,,bf16,2,1,1,open,,40,100,200,fixed,output_tok_s_per_gpu,1.0,"
    )
    p = predict_serving(row, latency=_const(0.010))
    assert p.run is not None and p.run.peak_running == 40 and p.run.makespan_s == pytest.approx(2.0)
    assert p.predicted == pytest.approx(8000 / 2.0 / 2)


def test_request_lengths_follow_the_row():
    base = dict(
        line=2, id="a", source="s", model="Qwen3-30B-A3B", gpu="H100", engine="vllm", engine_version="",
        precision="bf16", load="closed", concurrency=4, num_prompts=1000, metric="tpot_ms", measured=1.0, notes="",
    )
    from rl.engine import Engine, EngineShape

    base.update(engine=Engine.vllm, shape=EngineShape())
    p, o = serving_requests(ServingRun(isl=1024, osl=8192, lengths="uniform:0.8", **base))
    assert p.min() >= 819 and p.max() <= 1024 and o.min() >= 6553 and o.max() <= 8192
    assert abs(o.mean() - 0.9 * 8192) < 20  # uniform on [0.8 L, L]
    p, o = serving_requests(ServingRun(isl=220, osl=200, lengths="sharegpt", **base))
    assert abs(o.mean() - 200) < 5 and o.max() <= 2048 and np.percentile(o, 99) > 3 * 200  # exponential tail


def test_a_precision_the_engine_model_lacks_is_refused_by_name(tmp_path):
    (row,) = _rows(tmp_path, "m3,src,MiniMax-M3,H200,vllm,,mxfp8,8,1,1,closed,4,40,1024,1024,uniform:0.8,tpot_ms,8.4,")
    p = predict_serving(row)
    assert p.predicted is None and "mxfp8" in p.error and "bf16, fp8, checkpoint" in p.error
    s = summarise_serving([p, predict_serving(row, latency=_const(0.01))])
    assert s["rows"] == 2 and s["predicted"] == 0  # refused whatever the latency provider
