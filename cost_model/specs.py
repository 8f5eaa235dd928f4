"""Model, hardware and workload descriptions: the inputs of the cost model.

Everything here is in SI units (bytes, FLOP/s, bytes/s, seconds); only reports
convert to GiB or TFLOP/s.  Field names follow Megatron-core's
``TransformerConfig`` spelling where one exists.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cost_model.errors import TunerError

__all__ = [
    "Precision",
    "ModelSpec",
    "GPUSpec",
    "Cluster",
    "Workload",
    "RunOptions",
    "DEFAULT_RUN_OPTIONS",
    "HARNESS_RUN_OPTIONS",
    "load_model",
    "list_models",
    "load_gpu",
    "list_gpus",
    "parse_gpus",
    "DEFAULT_INTER_NODE_BYTES_PER_S",
    "DEFAULT_USD_PER_GPU_HOUR",
]

#: Per-node network bandwidth of the seed's cluster: AWS p5en.48xlarge, 3.2 Tb/s EFA
#: per node (seeds/001 ``stack.network``) = 400e9 bytes/s.
DEFAULT_INTER_NODE_BYTES_PER_S = 3.2e12 / 8

#: Price per GPU-hour that the seed implies: $1.08 per 1M tokens at 2,034.42
#: tokens/s/GPU (seeds/001 ``result``): 1.08 * 2034.42 * 3600 / 1e6 = 7.91 $/GPU-h.
DEFAULT_USD_PER_GPU_HOUR = round(1.08 * 2034.42 * 3600 / 1e6, 2)

#: Largest cluster the tool accepts.
MAX_GPUS = 1_000_000
#: Most decoder layers a model may have (the largest published models have ~100-200).
MAX_LAYERS = 10_000


class Precision(str, Enum):
    """Training precision of the GEMMs (weights are kept in bf16 in every case).

    ``fp8`` is Transformer Engine's per-tensor scaling (delayed or current scaling,
    Megatron ``--fp8-recipe delayed|tensorwise``); ``fp8_blockwise`` is DeepSeek-style
    128x128 weight / 1x128 activation blocks (``--fp8-recipe blockwise``, Hopper);
    ``mxfp8`` is the OCP MX format with one E8M0 scale per 32 elements
    (``--fp8-recipe mxfp8``, Blackwell); ``nvfp4`` is NVIDIA's FP4 with one FP8 scale per
    16 elements (``--fp4-format e2m1``, Blackwell).
    """

    bf16 = "bf16"
    fp8 = "fp8"
    fp8_blockwise = "fp8_blockwise"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"

    def __str__(self) -> str:
        return self.value

    @property
    def is_fp8(self) -> bool:
        """True for the three fp8 recipes (GEMMs at the GPU's fp8 peak)."""
        return self in (Precision.fp8, Precision.fp8_blockwise, Precision.mxfp8)

    @property
    def low_precision_weight_bytes(self) -> float:
        """Bytes per parameter of the quantised weight copy kept beside the bf16 weight.

        Sources (Transformer Engine ``Float8Tensor`` / ``MXFP8Tensor`` / ``NVFP4Tensor``):
        per-tensor and blockwise fp8 keep one fp8 copy (1 B; the transpose is made on the fly
        on Hopper, block scales add 4 B per 128x128 block, negligible); MX formats need both
        a row-wise and a column-wise quantised copy (their scales run along one axis), so
        mxfp8 keeps 2 x (1 + 1/32) B and nvfp4 2 x (0.5 + 1/16) B. bf16: 0.
        """
        return {
            Precision.bf16: 0.0,
            Precision.fp8: 1.0,
            Precision.fp8_blockwise: 1.0,
            Precision.mxfp8: 2.0 * (1.0 + 1.0 / 32),
            Precision.nvfp4: 2.0 * (0.5 + 1.0 / 16),
        }[self]


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts.

    Field names are Megatron-core's (``TransformerConfig``). Built from a Hugging
    Face ``config.json`` by :func:`load_model`.
    """

    name: str
    """Preset name or the path the config was read from."""
    num_layers: int
    """Decoder layers (``--num-layers``), MTP layers not included."""
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    """Key/value heads (GQA groups); equals ``num_attention_heads`` for MHA."""
    kv_channels: int
    """Head dimension (``--kv-channels``)."""
    ffn_hidden_size: int
    """FFN width of the dense layers (0 when every layer is MoE and no dense FFN exists)."""
    vocab_size: int
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    """Total width of the shared experts of a MoE layer (0: none)."""
    moe_layer_freq: tuple[int, ...] = ()
    """One entry per decoder layer: 1 = MoE layer, 0 = dense (Megatron's list form)."""
    gated_linear_unit: bool = True
    """SwiGLU-style MLP (3 weight matrices) when True, else 2."""
    untie_embeddings_and_output_weights: bool = True
    qk_layernorm: bool = False
    qk_layernorm_full_dim: bool = False
    """MiniMax-M2 style QK norm over all heads (weights of size heads*kv_channels)."""
    mtp_num_layers: int = 0
    # Multi-latent attention (DeepSeek-V2/V3); all 0 when not MLA.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    max_position_embeddings: int = 0
    # Sliding-window attention (GPT-OSS); 0 / () when every layer attends to the whole sequence.
    window_size: int = 0
    """Left window of sliding-window attention layers, tokens (Megatron ``--window-size``'s
    left value; HF ``sliding_window``); 0 = no sliding window."""
    window_attn_skip_freq: tuple[int, ...] = ()
    """One entry per decoder layer: 1 = full (causal) attention, 0 = sliding window (Megatron's
    list form of ``window_attn_skip_freq``; HF ``layer_types``). Empty = every layer full."""
    # Numerics that do not change the cost but must reach the run command (``--norm-epsilon`` etc.).
    norm_epsilon: float = 1e-5
    """RMSNorm epsilon (HF ``rms_norm_eps``)."""
    rotary_base: float = 10000.0
    """RoPE base (HF ``rope_theta``)."""
    rotary_percent: float = 1.0
    """Share of each head's dims that get RoPE (HF ``partial_rotary_factor`` or ``rotary_dim / head_dim``)."""
    rope_scaling_type: str = ""
    """HF ``rope_scaling.rope_type``: "" (none), "llama3" or "yarn"."""
    rope_scaling_factor: float = 1.0
    rope_scaling_mscale: float = 1.0
    rope_scaling_mscale_all_dim: float = 0.0
    moe_router_score_function: str = "softmax"
    """"softmax" or "sigmoid" (HF ``scoring_func``)."""
    moe_router_enable_expert_bias: bool = False
    """Aux-loss-free balancing bias (HF ``use_routing_bias`` / ``topk_method: noaux_tc``)."""
    moe_router_topk_scaling_factor: float = 0.0
    """HF ``routed_scaling_factor``; 0 = none."""
    moe_router_num_groups: int = 0
    moe_router_group_topk: int = 0
    extra_megatron_args: tuple[str, ...] = ()
    """Further Megatron flags the recipe needs (from a preset's ``tuner`` section)."""
    source: str = ""
    """Where the numbers come from (URL or file)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int",) and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise TunerError(f"model {self.name!r}: {f.name} must be a non-negative integer, got {v!r}")
            if f.type in ("float",) and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise TunerError(f"model {self.name!r}: {f.name} must be a finite number, got {v!r}")
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size"):
            if getattr(self, f) <= 0:
                raise TunerError(f"model {self.name!r}: {f} must be > 0, got {getattr(self, f)}")
        if self.num_layers > MAX_LAYERS:
            raise TunerError(f"model {self.name!r}: num_layers {self.num_layers:,} is more than this tool models (at most {MAX_LAYERS:,})")
        if self.num_attention_heads % self.num_query_groups:
            raise TunerError(
                f"model {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_query_groups})"
            )
        if self.num_experts and self.moe_router_topk > self.num_experts:
            raise TunerError(f"model {self.name!r}: num_experts_per_tok ({self.moe_router_topk}) exceeds num_experts ({self.num_experts})")
        if any(x not in (0, 1) for x in self.moe_layer_freq):
            raise TunerError(f"model {self.name!r}: moe_layer_freq entries must be 0 or 1")
        if self.num_layers > sum(self.moe_layer_freq) and self.ffn_hidden_size <= 0:
            raise TunerError(f"model {self.name!r}: dense layers need intermediate_size > 0")
        if self.norm_epsilon <= 0 or self.rotary_base <= 0 or not 0 < self.rotary_percent <= 1:
            raise TunerError(f"model {self.name!r}: rms_norm_eps and rope_theta must be > 0 and the rotary share in (0, 1]")
        if self.num_experts and (self.moe_router_topk <= 0 or self.moe_ffn_hidden_size <= 0):
            raise TunerError(
                f"model {self.name!r}: a MoE model needs moe_router_topk and moe_ffn_hidden_size > 0 "
                f"(got {self.moe_router_topk}, {self.moe_ffn_hidden_size})"
            )
        if self.window_attn_skip_freq and (
            len(self.window_attn_skip_freq) != self.num_layers or any(x not in (0, 1) for x in self.window_attn_skip_freq)
        ):
            raise TunerError(
                f"model {self.name!r}: window_attn_skip_freq needs {self.num_layers} entries of 0 (sliding window) "
                f"or 1 (full attention), got {len(self.window_attn_skip_freq)}"
            )
        if len(self.moe_layer_freq) != self.num_layers:
            raise TunerError(
                f"model {self.name!r}: moe_layer_freq has {len(self.moe_layer_freq)} entries, needs {self.num_layers}"
            )

    # ---- derived --------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_window_layers(self) -> int:
        """Decoder layers with sliding-window attention (0 when ``window_size`` is 0)."""
        if not self.window_size:
            return 0
        if not self.window_attn_skip_freq:
            return self.num_layers
        return self.num_layers - sum(self.window_attn_skip_freq)

    def attended_keys_per_query(self, seq_length: int, windowed: bool) -> float:
        """Mean keys a query attends to under a causal mask, optionally limited to ``window_size``.

        Causal full attention: ``(s + 1) / 2``; with a left window ``w`` a query at position
        ``i`` (1-based) sees ``min(i, w + 1)`` keys (itself and ``w`` before it, Megatron /
        flash-attention ``window_size=(w, 0)``).
        """
        s = float(seq_length)
        if not windowed or not self.window_size or self.window_size + 1 >= s:
            return (s + 1) / 2
        w1 = float(self.window_size + 1)
        return (w1 * (w1 + 1) / 2 + (s - w1) * w1) / s

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_freq)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 3 for gated (SwiGLU), 2 otherwise."""
        return 3 if self.gated_linear_unit else 2

    # ---- per-layer parameter counts (elements) -------------------------------
    def attention_params(self) -> int:
        """Matmul weights of one attention block (QKV and output projections).

        Non-MLA: ``h*d*(n + 2g) + n*d*h`` (Megatron ``theoretical_memory_usage.py``).
        MLA: DeepSeek-V3's down/up projections (same file, MLA branch), without norms.
        """
        h, n, g, d = self.hidden_size, self.num_attention_heads, self.num_query_groups, self.kv_channels
        if not self.is_mla:
            return h * d * (n + 2 * g) + n * d * h
        qk = self.qk_head_dim + self.qk_pos_emb_head_dim
        if self.q_lora_rank:
            q = self.q_lora_rank * (h + n * qk)
        else:
            q = h * n * qk
        kv = self.kv_lora_rank * (h + n * (self.qk_head_dim + self.v_head_dim)) + h * self.qk_pos_emb_head_dim
        return q + kv + n * self.v_head_dim * h

    def attention_norm_params(self) -> int:
        """Norm weights inside attention: QK norm (per head or full width) and MLA's latent norms."""
        n, g, d = self.num_attention_heads, self.num_query_groups, self.kv_channels
        if self.is_mla:  # the q and kv latent norms
            return self.kv_lora_rank + (self.q_lora_rank or 0)
        if self.qk_layernorm:
            return (n * d + g * d) if self.qk_layernorm_full_dim else 2 * d
        return 0

    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size

    def expert_params(self) -> int:
        """Weights of ONE routed expert."""
        return self.mlp_matrices * self.hidden_size * self.moe_ffn_hidden_size

    def shared_expert_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.moe_shared_expert_intermediate_size

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    def embedding_params(self) -> int:
        """Input embedding (vocab x hidden); the output layer has as many again when untied."""
        return self.vocab_size * self.hidden_size

    def active_params(self) -> int:
        """Parameters a token's matmuls pass through, N in MFU = 6 N tokens/s / peak.

        Counts every matmul weight a token passes through: attention projections,
        the router, its top-k routed experts, shared experts, dense MLPs, MTP
        layers when enabled (their projection and layer) and the output layer.
        Not counted: the input embedding (a lookup, not a matmul) and norm weights.
        For MiniMax-M2 this gives the seed's N = 10,415,112,192
        (seeds/001 ``result.mfu``).

        Returns:
            Number of parameters (elements).
        """
        attn = self.attention_params()
        moe_layer = attn + self.router_params() + self.moe_router_topk * self.expert_params() + self.shared_expert_params()
        dense_layer = attn + self.dense_mlp_params()
        n = self.num_moe_layers * moe_layer + self.num_dense_layers * dense_layer
        if self.mtp_num_layers:
            last = moe_layer if self.moe_layer_freq[-1] else dense_layer
            n += self.mtp_num_layers * (last + 2 * self.hidden_size * self.hidden_size)
        return n + self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every weight: embeddings, output layer (if untied), layers, norms, MTP.

        Returns:
            Number of parameters (elements).
        """
        h = self.hidden_size
        attn = self.attention_params() + self.attention_norm_params()
        moe_layer = attn + self.router_params() + self.num_experts * self.expert_params() + self.shared_expert_params()
        dense_layer = attn + self.dense_mlp_params()
        n = self.num_moe_layers * moe_layer + self.num_dense_layers * dense_layer + 2 * h * self.num_layers
        if self.mtp_num_layers:
            last = moe_layer if self.moe_layer_freq[-1] else dense_layer
            n += self.mtp_num_layers * (last + 2 * h * h + 5 * h)
        n += self.embedding_params() * (2 if self.untie_embeddings_and_output_weights else 1) + h
        return n

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)


def _as_int(value: Any, key: str, where: str) -> int:
    """An integer field of a config: ints and integral floats; anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise TunerError(f"model config {where!r}: {key} must be an integer, got {value!r}")
    return int(value)


def _as_float(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise TunerError(f"model config {where!r}: {key} must be a finite number, got {value!r}")
    return float(value)


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def model_from_hf_config(cfg: dict[str, Any], *, name: str, where: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary (see :func:`_model_from_hf_config`).

    Raises:
        TunerError: a required field is missing, or any field has a wrong type or value.
    """
    try:
        return _model_from_hf_config(cfg, name=name, where=where)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        if isinstance(e, TunerError):
            raise
        raise TunerError(f"model config {(where or name)!r}: a field has a wrong type or value ({type(e).__name__}: {e})") from None


def _model_from_hf_config(cfg: dict[str, Any], *, name: str, where: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary.

    Understands the key names of Llama, Mixtral, Qwen3 / Qwen3-MoE, DeepSeek-V3 /
    Kimi-K2 (MLA), GPT-OSS and MiniMax-M2. A ``"tuner"`` section may override
    derived fields (e.g. ``{"mtp_num_layers": 0}``); a ``text_config`` section
    (multimodal checkpoints) is used when present.

    Raises:
        TunerError: if a required field is missing or not a positive integer.
    """
    name_for_errors = where or name
    if "text_config" in cfg and "hidden_size" not in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise TunerError(f"model config {name_for_errors!r}: text_config must be an object")
        cfg = {**cfg["text_config"], "tuner": cfg.get("tuner", {})}
    if not isinstance(cfg.get("tuner") or {}, dict):
        raise TunerError(f"model config {name_for_errors!r}: its 'tuner' section must be an object")
    over = dict(cfg.get("tuner") or {})
    required = {
        "hidden_size": ("hidden_size", "n_embd", "d_model"),
        "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
        "num_attention_heads": ("num_attention_heads", "n_head"),
        "vocab_size": ("vocab_size",),
    }
    vals: dict[str, Any] = {}
    missing = []
    for k, alts in required.items():
        v = _first(cfg, *alts)
        if v is None:
            missing.append(k)
        vals[k] = v
    num_experts = _as_int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0, "num_local_experts", name_for_errors)
    inter = _first(cfg, "intermediate_size", "ffn_hidden_size", "n_inner")
    moe_inter = _first(cfg, "moe_intermediate_size", "expert_intermediate_size")
    if num_experts and moe_inter is None:
        moe_inter = inter  # Mixtral / MiniMax / GPT-OSS: intermediate_size is the expert width
    if inter is None and not num_experts:
        missing.append("intermediate_size")
    if num_experts and _first(cfg, "num_experts_per_tok", "moe_topk", "top_k") is None:
        missing.append("num_experts_per_tok")
    if missing:
        raise TunerError(
            f"model config {name_for_errors!r} is missing {', '.join(missing)}; a Hugging Face config.json with "
            "hidden_size, num_hidden_layers, num_attention_heads, vocab_size and intermediate_size "
            "(plus num_local_experts/num_experts_per_tok for MoE) is accepted"
        )
    for k, v in vals.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise TunerError(f"model config {name_for_errors!r}: {k} must be a positive integer, got {v!r}")
    h, L, n = vals["hidden_size"], vals["num_hidden_layers"], vals["num_attention_heads"]
    g = _as_int(_first(cfg, "num_key_value_heads", "num_query_groups", default=n), "num_key_value_heads", name_for_errors)
    d = _as_int(_first(cfg, "head_dim", "kv_channels", default=h // n), "head_dim", name_for_errors)
    topk = _as_int(_first(cfg, "num_experts_per_tok", "moe_topk", "top_k", default=0) or 0, "num_experts_per_tok", name_for_errors)
    # Shared experts.
    shared = _first(cfg, "shared_intermediate_size", "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    if shared is None and _first(cfg, "n_shared_experts", "num_shared_experts"):
        shared = _as_int(_first(cfg, "n_shared_experts", "num_shared_experts"), "n_shared_experts", name_for_errors) * _as_int(moe_inter, "moe_intermediate_size", name_for_errors)
    shared = _as_int(shared or 0, "shared_intermediate_size", name_for_errors)
    # Which layers are MoE.
    freq: list[int]
    if "moe_layer_freq" in over:
        freq = list(over.pop("moe_layer_freq"))
    elif not num_experts:
        freq = [0] * L
    elif "first_k_dense_replace" in cfg:
        k = _as_int(cfg["first_k_dense_replace"], "first_k_dense_replace", name_for_errors)
        step = _as_int(cfg.get("moe_layer_freq", 1) or 1, "moe_layer_freq", name_for_errors)
        freq = [1 if (i >= k and (i - k) % step == 0) else 0 for i in range(L)]
    elif "mlp_only_layers" in cfg or "decoder_sparse_step" in cfg:
        only = set(cfg.get("mlp_only_layers") or [])
        step = _as_int(cfg.get("decoder_sparse_step", 1) or 1, "decoder_sparse_step", name_for_errors)
        freq = [0 if (i in only or (i + 1) % step) else 1 for i in range(L)]
    else:
        freq = [1] * L
    mla = {
        "q_lora_rank": _as_int(cfg.get("q_lora_rank") or 0, "q_lora_rank", name_for_errors),
        "kv_lora_rank": _as_int(cfg.get("kv_lora_rank") or 0, "kv_lora_rank", name_for_errors),
        "qk_head_dim": _as_int(cfg.get("qk_nope_head_dim") or 0, "qk_nope_head_dim", name_for_errors),
        "qk_pos_emb_head_dim": _as_int(cfg.get("qk_rope_head_dim") or 0, "qk_rope_head_dim", name_for_errors),
        "v_head_dim": _as_int(cfg.get("v_head_dim") or 0, "v_head_dim", name_for_errors),
    }
    if mla["kv_lora_rank"]:
        d = mla["qk_head_dim"] + mla["qk_pos_emb_head_dim"]
        # MLA always normalises its q and kv latents (Megatron: --qk-layernorm with --multi-latent-attention).
        cfg = {**cfg, "qk_layernorm": True}
    window = 0
    skip: tuple[int, ...] = ()
    if cfg.get("sliding_window") and cfg.get("layer_types"):
        types = cfg["layer_types"]
        if not isinstance(types, list) or len(types) != L:
            raise TunerError(f"model config {name_for_errors!r}: layer_types must list one entry per layer ({L})")
        window = _as_int(cfg["sliding_window"], "sliding_window", name_for_errors)
        skip = tuple(0 if str(t) == "sliding_attention" else 1 for t in types)
    mtp = _as_int(_first(cfg, "num_nextn_predict_layers", default=0) or 0, "num_nextn_predict_layers", name_for_errors)
    if cfg.get("use_mtp") and not mtp:
        mtp = _as_int(cfg.get("num_mtp_modules") or 0, "num_mtp_modules", name_for_errors)
    qk_norm = bool(_first(cfg, "use_qk_norm", "qk_layernorm", default=str(cfg.get("model_type", "")).startswith("qwen3")))
    rs = cfg.get("rope_scaling") or {}
    if not isinstance(rs, dict):
        rs = {}
    rs_type = str(rs.get("rope_type") or rs.get("type") or "")
    if rs_type in ("default", "linear", "dynamic"):
        rs_type = ""
    partial = cfg.get("partial_rotary_factor")
    if partial is None and cfg.get("rotary_dim") and d:
        partial = float(cfg["rotary_dim"]) / d
    topk_method = str(cfg.get("topk_method", ""))
    numerics = dict(
        norm_epsilon=_as_float(_first(cfg, "rms_norm_eps", "layer_norm_eps", "norm_epsilon", default=1e-5), "rms_norm_eps", name_for_errors),
        rotary_base=_as_float(_first(cfg, "rope_theta", "rotary_base", default=10000.0), "rope_theta", name_for_errors),
        rotary_percent=float(partial if partial is not None else 1.0),
        rope_scaling_type=rs_type,
        rope_scaling_factor=float(rs.get("factor") or 1.0),
        rope_scaling_mscale=float(rs.get("mscale") or 1.0),
        rope_scaling_mscale_all_dim=float(rs.get("mscale_all_dim") or 0.0),
        moe_router_score_function="sigmoid" if str(cfg.get("scoring_func", "softmax")) == "sigmoid" else "softmax",
        moe_router_enable_expert_bias=bool(cfg.get("use_routing_bias")) or topk_method == "noaux_tc",
        moe_router_topk_scaling_factor=float(cfg.get("routed_scaling_factor") or 0.0) if num_experts else 0.0,
        moe_router_num_groups=int(cfg.get("n_group") or 0) if topk_method in ("group_limited_greedy", "noaux_tc") and int(cfg.get("n_group") or 1) > 1 else 0,
        moe_router_group_topk=int(cfg.get("topk_group") or 0) if topk_method in ("group_limited_greedy", "noaux_tc") and int(cfg.get("n_group") or 1) > 1 else 0,
    )
    spec = dict(
        name=name,
        num_layers=L,
        hidden_size=h,
        num_attention_heads=n,
        num_query_groups=g,
        kv_channels=d,
        ffn_hidden_size=_as_int(inter or 0, "intermediate_size", name_for_errors) if not (num_experts and moe_inter == inter and "moe_intermediate_size" not in cfg) else 0,
        vocab_size=vals["vocab_size"],
        num_experts=num_experts,
        moe_router_topk=topk,
        moe_ffn_hidden_size=_as_int(moe_inter or 0, "moe_intermediate_size", name_for_errors) if num_experts else 0,
        moe_shared_expert_intermediate_size=shared,
        moe_layer_freq=tuple(int(x) for x in freq),
        gated_linear_unit=str(_first(cfg, "hidden_act", default="silu")) in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu"),
        untie_embeddings_and_output_weights=not bool(cfg.get("tie_word_embeddings", False)),
        qk_layernorm=qk_norm,
        qk_layernorm_full_dim=str(cfg.get("qk_norm_type", "")) == "per_layer",
        mtp_num_layers=mtp,
        max_position_embeddings=_as_int(cfg.get("max_position_embeddings") or 0, "max_position_embeddings", name_for_errors),
        window_size=window,
        window_attn_skip_freq=skip,
        source=str(cfg.get("_source", "")),
        **mla,
        **numerics,
    )
    unknown = set(over) - {f.name for f in dataclasses.fields(ModelSpec)}
    if unknown:
        raise TunerError(f"model config {name_for_errors!r}: unknown keys in its 'tuner' section: {sorted(unknown)}")
    spec.update(over)
    for k in ("moe_layer_freq", "extra_megatron_args", "window_attn_skip_freq"):
        if isinstance(spec.get(k), list):
            spec[k] = tuple(spec[k])
    return ModelSpec(**spec)


_MODEL_DIR = "data/models"
_GPU_DIR = "data/gpus"


def _data_files(sub: str, suffix: str) -> dict[str, Any]:
    base = resources.files("cost_model").joinpath(sub)
    return {p.name[: -len(suffix)]: p for p in base.iterdir() if p.name.endswith(suffix)}


def list_models() -> list[str]:
    """Names of the bundled model presets, sorted."""
    return sorted(_data_files(_MODEL_DIR, ".json"))


def load_model(name_or_path: str) -> ModelSpec:
    """A bundled preset by name (case-insensitive), a ``config.json`` path or a folder holding one.

    Raises:
        TunerError: unknown name (with close names suggested), unreadable or
            malformed file, or missing fields.
    """
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():  # a Hugging Face model folder
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            what = "a folder without a config.json" if p.is_dir() else "no such file"
            raise TunerError(f"--model {name_or_path!r}: {what}; give a preset name ({', '.join(list_models())}) or a config.json path")
        try:
            cfg = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TunerError(f"--model {name_or_path!r}: cannot read it as JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise TunerError(f"--model {name_or_path!r}: expected a JSON object (a Hugging Face config.json)")
        cfg.setdefault("_source", str(p))
        # Hugging Face layout: <model name>/config.json
        display = p.resolve().parent.name if p.name == "config.json" and p.resolve().parent.name else p.stem
        return model_from_hf_config(cfg, name=display, where=str(p))
    files = _data_files(_MODEL_DIR, ".json")
    by_lower = {k.lower(): k for k in files}
    key = by_lower.get(name_or_path.lower())
    if key is None:
        close = difflib.get_close_matches(name_or_path.lower(), list(by_lower), n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
        raise TunerError(
            f"--model {name_or_path!r}: unknown model.{hint} Known presets: {', '.join(sorted(files))}; "
            "or give the path of a Hugging Face config.json."
        )
    cfg = json.loads(files[key].read_text())
    return model_from_hf_config(cfg, name=key)


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator, from a bundled YAML datasheet file (``cost_model/data/gpus``)."""

    name: str
    hbm_bytes: float
    """Memory the framework can use (bytes), as ``nvidia-smi`` reports it."""
    peak_flops_bf16: float
    """Dense (non-sparse) bf16 tensor-core peak, FLOP/s."""
    peak_flops_fp8: float
    """Dense fp8 peak, FLOP/s (0 if the GPU has no fp8)."""
    peak_flops_fp4: float = 0.0
    """Dense fp4 (NVFP4) peak, FLOP/s (0 if the GPU has no fp4 tensor cores)."""
    network_bytes_per_s_per_gpu: float = 0.0
    """Scale-out NIC bandwidth per GPU per direction in the reference system (bytes/s; DGX / NVL72
    racks have one NIC per GPU); 0 = unknown. Used by ``tune validate`` for published runs."""
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    """NVLink bandwidth per GPU per direction (bytes/s)."""
    pcie_bytes_per_s: float
    """Host <-> GPU bandwidth per direction (bytes/s)."""
    gpus_per_node: int
    """GPUs per server in the usual system (HGX / DGX)."""
    nvlink_domain: int
    """GPUs that share one NVLink domain (8 for HGX, 72 for an NVL72 rack)."""
    family: str
    """Architecture family (ampere, hopper, blackwell) for calibration constants."""
    source: str

    def peak_flops(self, precision: Precision) -> float:
        """Dense tensor-core peak (FLOP/s) of the GEMMs at ``precision``; 0 if the GPU lacks it."""
        if precision == Precision.bf16:
            return self.peak_flops_bf16
        if precision == Precision.nvfp4:
            return self.peak_flops_fp4
        if precision == Precision.mxfp8 and self.family != "blackwell":
            return 0.0  # MX formats need Blackwell tensor cores
        return self.peak_flops_fp8


def list_gpus() -> list[str]:
    return sorted(_data_files(_GPU_DIR, ".yaml"))


def load_gpu(name: str) -> GPUSpec:
    """A bundled GPU by name (case-insensitive, e.g. ``H200``).

    Raises:
        TunerError: unknown GPU, with the known ones listed.
    """
    files = _data_files(_GPU_DIR, ".yaml")
    by_lower = {k.lower(): k for k in files}
    key = by_lower.get(name.lower())
    if key is None:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=2, cutoff=0.5)
        hint = f" Did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
        raise TunerError(f"unknown GPU {name!r}.{hint} Known GPUs: {', '.join(sorted(files))}")
    d = yaml.safe_load(files[key].read_text())
    return GPUSpec(
        name=d["name"],
        hbm_bytes=float(d["hbm_mib"]) * 2**20,
        peak_flops_bf16=float(d["peak_tflops_bf16_dense"]) * 1e12,
        peak_flops_fp8=float(d.get("peak_tflops_fp8_dense") or 0) * 1e12,
        peak_flops_fp4=float(d.get("peak_tflops_fp4_dense") or 0) * 1e12,
        network_bytes_per_s_per_gpu=float(d.get("network_gb_per_s_per_gpu") or 0) * 1e9,
        hbm_bytes_per_s=float(d["hbm_tb_per_s"]) * 1e12,
        nvlink_bytes_per_s=float(d["nvlink_gb_per_s_per_direction"]) * 1e9,
        pcie_bytes_per_s=float(d["pcie_gb_per_s_per_direction"]) * 1e9,
        gpus_per_node=int(d["gpus_per_node"]),
        nvlink_domain=int(d["nvlink_domain"]),
        family=str(d["family"]),
        source=str(d["source"]),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The GPUs a job runs on."""

    gpu: GPUSpec
    num_gpus: int
    gpus_per_node: int
    inter_node_bytes_per_s: float = DEFAULT_INTER_NODE_BYTES_PER_S
    """Network bandwidth per node per direction (bytes/s), shared by its GPUs."""
    usd_per_gpu_hour: float = DEFAULT_USD_PER_GPU_HOUR

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise TunerError(f"--gpus: the GPU count must be at least 1, got {self.num_gpus}")
        if self.gpus_per_node <= 0:
            raise TunerError(f"--gpus-per-node must be at least 1, got {self.gpus_per_node}")
        if self.gpus_per_node > self.num_gpus:
            raise TunerError(f"--gpus-per-node {self.gpus_per_node} exceeds the {self.num_gpus} GPUs of --gpus")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            lo = self.num_gpus // self.gpus_per_node * self.gpus_per_node
            raise TunerError(
                f"--gpus {self.num_gpus}x{self.gpu.name}: {self.num_gpus} GPUs are not a whole number of "
                f"{self.gpus_per_node}-GPU nodes; use {lo or self.gpus_per_node} or {lo + self.gpus_per_node}, "
                "or set --gpus-per-node"
            )
        if not math.isfinite(self.inter_node_bytes_per_s) or self.inter_node_bytes_per_s <= 0:
            raise TunerError(f"--network-gbps must be a positive number, got {self.inter_node_bytes_per_s * 8 / 1e9:g}")
        if not math.isfinite(self.usd_per_gpu_hour) or self.usd_per_gpu_hour < 0:
            raise TunerError(f"--usd-per-gpu-hour must be a non-negative number, got {self.usd_per_gpu_hour:g}")
        if self.num_gpus > MAX_GPUS:
            raise TunerError(f"--gpus: {self.num_gpus:,} GPUs is more than this tool models (at most {MAX_GPUS:,})")

    @property
    def nvlink_size(self) -> int:
        """GPUs that reach each other over NVLink: the node, or the rack for rack-scale NVLink (GB200 NVL72)."""
        if self.gpu.nvlink_domain > self.gpu.gpus_per_node:
            return min(self.gpu.nvlink_domain, self.num_gpus)
        return min(self.gpus_per_node, self.gpu.nvlink_domain)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def label(self) -> str:
        if self.num_nodes > 1:
            return f"{self.num_nodes}x{self.gpus_per_node}x{self.gpu.name}"
        return f"{self.num_gpus}x{self.gpu.name}"


_GPUS_RE = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*[xX*]\s*([A-Za-z][A-Za-z0-9_-]*)\s*$")


def parse_gpus(
    text: str,
    *,
    gpus_per_node: int | None = None,
    inter_node_bytes_per_s: float | None = None,
    usd_per_gpu_hour: float | None = None,
) -> Cluster:
    """Parse ``64xH200`` (GPUs) or ``8x8xH200`` (nodes x GPUs per node).

    Raises:
        TunerError: malformed text, unknown GPU, zero GPUs, or a count that is
            not a whole number of nodes.
    """
    m = _GPUS_RE.match(text or "")
    if not m:
        raise TunerError(
            f"--gpus {text!r}: expected COUNTxGPU such as 64xH200, or NODESxPER_NODExGPU such as 8x8xH200 "
            f"(GPUs: {', '.join(list_gpus())})"
        )
    nodes, count, gname = m.group(1), int(m.group(2)), m.group(3)
    gpu = load_gpu(gname)
    if gpus_per_node is not None and gpus_per_node <= 0:
        raise TunerError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if inter_node_bytes_per_s is not None and not (math.isfinite(inter_node_bytes_per_s) and inter_node_bytes_per_s > 0):
        raise TunerError(f"--network-gbps must be a positive number, got {inter_node_bytes_per_s * 8 / 1e9:g}")
    if count > MAX_GPUS or (nodes is not None and int(nodes) * count > MAX_GPUS):
        raise TunerError(f"--gpus {text!r}: more GPUs than this tool models (at most {MAX_GPUS:,})")
    if nodes is not None:
        per = count
        total = int(nodes) * count
        if gpus_per_node is not None and gpus_per_node != per:
            raise TunerError(f"--gpus {text!r} says {per} GPUs per node but --gpus-per-node is {gpus_per_node}")
    else:
        total = count
        per = gpus_per_node or min(gpu.gpus_per_node, max(count, 1))
    if total <= 0 or per <= 0:
        raise TunerError(f"--gpus {text!r}: the GPU count must be at least 1")
    return Cluster(
        gpu=gpu,
        num_gpus=total,
        gpus_per_node=per,
        inter_node_bytes_per_s=DEFAULT_INTER_NODE_BYTES_PER_S if inter_node_bytes_per_s is None else inter_node_bytes_per_s,
        usd_per_gpu_hour=DEFAULT_USD_PER_GPU_HOUR if usd_per_gpu_hour is None else usd_per_gpu_hour,
    )


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What one optimizer step trains on."""

    seq_length: int = 8192
    """Tokens per row (``--seq-length``)."""
    global_batch_size: int = 128
    """Rows per optimizer step (``--global-batch-size``)."""
    precision: Precision = Precision.bf16
    dataset: str = "synthetic fixed-length rows"

    def __post_init__(self) -> None:
        if self.seq_length <= 0:
            raise TunerError(f"--seq-len must be a positive integer, got {self.seq_length}")
        if self.global_batch_size <= 0:
            raise TunerError(f"--global-batch must be a positive integer, got {self.global_batch_size}")
        if self.seq_length > 2**24 or self.global_batch_size > 2**24:
            raise TunerError(f"--seq-len and --global-batch must be at most {2**24:,}")
        try:
            object.__setattr__(self, "precision", Precision(self.precision))
        except ValueError:
            raise TunerError(f"--precision {self.precision!r}: accepted {', '.join(p.value for p in Precision)}") from None

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size


#: ``--cuda-graph-scope`` values (Megatron-core ``transformer_config.py``) that capture the MoE
#: router and token preprocessing, whose small kernels make up the fixed per-layer MoE cost.
CUDA_GRAPH_MOE_SCOPES = ("moe_router", "moe_preprocess", "moe", "full_iteration")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Run flags that change the cost but are not searched over (one value for the whole table).

    Defaults are the seed's run (seeds/001: slime, natural routing, no overlap flags, no CUDA
    graphs), so a model built without options predicts what it did before these existed.
    NVIDIA's published Megatron-Bridge runs set most of them (``tune validate`` reads them
    from each CSV row).
    """

    moe_router_force_load_balancing: bool = False
    """``--moe-router-force-load-balancing``: tokens are routed uniformly (benchmarks); False =
    natural routing, whose slowest expert rank carries ``Calibration.moe_load_imbalance`` x the mean."""
    cp_comm_type: str = "p2p"
    """``--cp-comm-type``: ``p2p`` (ring of K/V blocks, overlapped with attention) or ``a2a``
    (all-to-all of heads, Ulysses style, not overlapped)."""
    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm``: EP all-to-all overlapped with another micro-batch's compute."""
    cuda_graph_scope: tuple[str, ...] = ()
    """``--cuda-graph-scope`` values when CUDA graphs are on (``--cuda-graph-impl`` not none); empty = off."""
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp`` (ZeRO-3 style: parameters, gradients and optimizer states sharded over DP)."""
    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce`` / ``--overlap-param-gather``: DP communication overlapped with compute."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (Transformer Engine userbuffers): TP collectives overlapped with GEMMs."""
    te_attention: bool = True
    """Attention runs Transformer Engine's fused attention (``--transformer-impl transformer_engine``,
    the default of Megatron-core, NVIDIA's recipes and the seed's slime run): its output is already
    ``[s, b, h]`` and is saved once, as the output projection's input. False for a stack without TE
    (this project's trial harness, ``launch/harness``): ``scaled_dot_product_attention``'s output is
    permuted and reshaped (a copy) before the projection, so two copies of the attention output are
    saved (:data:`HARNESS_RUN_OPTIONS`)."""

    def __post_init__(self) -> None:
        if self.cp_comm_type not in ("p2p", "a2a"):
            raise TunerError(f"cp_comm_type {self.cp_comm_type!r}: accepted p2p or a2a")
        object.__setattr__(self, "cuda_graph_scope", tuple(str(x) for x in self.cuda_graph_scope))

    @property
    def cuda_graph_full(self) -> bool:
        """The whole iteration (or whole layers) is captured: every launch latency shrinks."""
        return any(x in ("full_iteration", "full") for x in self.cuda_graph_scope)

    @property
    def cuda_graph_moe(self) -> bool:
        """The MoE router / preprocessing is captured (or the whole iteration)."""
        return any(x in CUDA_GRAPH_MOE_SCOPES or x == "full" for x in self.cuda_graph_scope)


DEFAULT_RUN_OPTIONS = RunOptions()

#: Run options of this project's trial harness without Transformer Engine (``launch/harness``,
#: megatron-core's local layer spec): the seed's flags, attention output saved twice.
HARNESS_RUN_OPTIONS = RunOptions(te_attention=False)
