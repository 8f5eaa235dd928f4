from __future__ import annotations

import json

import pytest

from cost_model.flops import megatron_flops_per_token, mfu, usd_per_million_tokens
from specs import DEFAULT_USD_PER_GPU_HOUR, list_gpus, list_models, load_gpu, load_model, parse_gpus
from specs.errors import TunerError


def test_minimax_active_params_reproduce_seed(minimax):
    assert minimax.active_params() == 10_415_112_192
    assert minimax.num_layers == 62 and minimax.num_experts == 256 and minimax.moe_router_topk == 8
    assert minimax.mtp_num_layers == 0 and minimax.untie_embeddings_and_output_weights and minimax.qk_layernorm
    # total ~228.7B (HF safetensors: 228.70B including the MTP modules we leave out)
    assert 228.0e9 < minimax.total_params() < 229.0e9


def test_mfu_and_price_reproduce_seed(minimax):
    h200 = load_gpu("H200")
    assert round(mfu(minimax, 2034.42, h200.peak_flops_bf16), 4) == 0.1285
    assert DEFAULT_USD_PER_GPU_HOUR == 7.91
    assert round(usd_per_million_tokens(DEFAULT_USD_PER_GPU_HOUR, 2034.42), 2) == 1.08


@pytest.mark.parametrize(
    "name,seq,published",
    [
        # implied_gflop_per_token of shared/data/published_runs.csv (Megatron-Bridge tables)
        ("Llama-3.1-8B", 8192, 51.5),
        ("Llama-3.1-70B", 8192, 449.0),
        ("Qwen3-30B-A3B", 4096, 23.0),
        ("Qwen3-235B-A22B", 4096, 148.0),
        ("DeepSeek-V3", 4096, 260.0),
    ],
)
def test_megatron_flops_match_published(name, seq, published):
    got = megatron_flops_per_token(load_model(name), seq) / 1e9
    assert abs(got / published - 1) < 0.02, got


def test_catalogs_have_sources():
    assert {"H200", "H100", "B200", "GB200", "A100"} <= set(list_gpus())
    for g in list_gpus():
        spec = load_gpu(g)
        assert spec.source and spec.peak_flops_bf16 > 1e14 and spec.hbm_bytes > 40 * 2**30
    assert "MiniMax-M2" in list_models()
    for m in list_models():
        assert load_model(m).source


@pytest.mark.parametrize(
    "text,total,per_node,nodes",
    [
        ("64xH200", 64, 8, 8), ("8x8xH200", 64, 8, 8), ("4xH100", 4, 4, 1), ("16x4xGB200", 64, 4, 16),
        ("1xa100", 1, 1, 1),
    ],
)
def test_parse_gpus(text, total, per_node, nodes):
    c = parse_gpus(text)
    assert (c.num_gpus, c.gpus_per_node, c.num_nodes) == (total, per_node, nodes)
    # the server type's fabric, one NIC per GPU (H200: the seed's EFA, 3.2 Tb/s per 8-GPU node = 400e9 B/s)
    assert c.network is not None and c.inter_node_bytes_per_s == c.network.per_gpu_bytes_per_s * per_node
    if text == "64xH200":
        assert c.network.key == "efa-v3" and c.inter_node_bytes_per_s == 400e9


def test_network_override_and_bandwidth_override():
    c = parse_gpus("64xH200", network="ib-ndr")
    assert c.network is not None and c.network.key == "ib-ndr" and c.inter_node_bytes_per_s == 400e9
    c = parse_gpus(
        "64xH200", inter_node_bytes_per_s=100e9
    )  # --network-gbps 800 keeps the fabric, overrides the bandwidth
    assert c.network is not None and c.network.key == "efa-v3" and c.inter_node_bytes_per_s == 100e9
    with pytest.raises(TunerError, match="unknown network; known: efa-v2, efa-v3, ib-hdr, ib-ndr, ib-xdr, roce-v2"):
        parse_gpus("64xH200", network="myrinet")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("64xH2000", "unknown GPU 'H2000'"),
        ("60xH200", "not a whole number of 8-GPU nodes; use 56 or 64"),
        ("0xH200", "at least 1"),
        ("H200", "expected COUNTxGPU"),
        ("64x", "expected COUNTxGPU"),
        ("", "expected COUNTxGPU"),
        ("\uff11xH100", "expected COUNTxGPU"),  # a full-width digit is not a count
    ],
)
def test_parse_gpus_errors(text, needle):
    with pytest.raises(TunerError, match=None) as e:
        parse_gpus(text)
    assert needle in str(e.value)


def test_parse_gpus_reads_leading_zeros():
    assert parse_gpus("08xH100").num_gpus == 8
    assert parse_gpus("2x08xH200").num_nodes == 2


def test_unknown_model_suggests_close_names():
    with pytest.raises(TunerError) as e:
        load_model("MiniMax-M3x")
    assert "Did you mean" in str(e.value) and "MiniMax-M2" in str(e.value)


def test_config_json_missing_fields(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 1024, "num_attention_heads": 16}))
    with pytest.raises(TunerError) as e:
        load_model(str(p))
    assert "num_hidden_layers" in str(e.value) and "vocab_size" in str(e.value)


def test_config_json_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(TunerError, match="not JSON"):
        load_model(str(p))


def test_config_json_from_path_equals_preset(tmp_path):
    from importlib import resources

    text = resources.files("specs").joinpath("data/models/MiniMax-M2.json").read_text()
    p = tmp_path / "m2.json"
    p.write_text(text)
    m = load_model(str(p), allow_config_args=True)
    assert m.active_params() == 10_415_112_192


def test_a_model_folder_with_config_json_loads(tmp_path):
    from importlib import resources

    text = resources.files("specs").joinpath("data/models/MiniMax-M2.json").read_text()
    d = tmp_path / "MyMoE"
    d.mkdir()
    (d / "config.json").write_text(text)
    m = load_model(str(d), allow_config_args=True)
    assert m.name == "MyMoE" and m.active_params() == 10_415_112_192
    with pytest.raises(TunerError, match="a folder without a config.json"):
        load_model(str(tmp_path))


def test_mtp_depth_is_bounded_by_the_decoder():
    from specs import TunerError, load_model

    ds = load_model("DeepSeek-V3")
    assert ds.replace(mtp_num_layers=ds.num_layers).mtp_num_layers == ds.num_layers
    with pytest.raises(TunerError, match="mtp_num_layers 1,000,000,000 is more than its 61 decoder layers"):
        ds.replace(mtp_num_layers=10**9)  # a run table's note had predicted 0 tokens/s and entered the summary
