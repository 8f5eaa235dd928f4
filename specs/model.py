"""The model description: :class:`ModelSpec`, from a bundled preset or a Hugging Face ``config.json``.

Field names follow Megatron-core's ``TransformerConfig`` spelling where one exists."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specs._data import MODEL_DIR, data_files
from specs.errors import TunerError
from specs.files import load_user_json


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts.

    Field names are Megatron-core's (``TransformerConfig``). Built from a Hugging
    Face ``config.json`` by :func:`load_model`."""

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
    """Sliding window of the sliding-window layers, tokens (HF ``sliding_window``: GPT-OSS 128); the run command passes
    Megatron ``--window-size {window_size - 1},0`` as Megatron-LM's GPT-OSS example does
    (examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh: ``127,0``); the FLOP count keeps Megatron-Bridge's
    ``window_size + 1`` keys per query (``cost_model/flops.py``, within 1% of windowed attention); 0 = no sliding
    window."""
    window_attn_skip_freq: tuple[int, ...] = ()
    """One entry per decoder layer: 1 = full (causal) attention, 0 = sliding window (HF ``layer_types``).
    Empty: every layer slides when ``window_size`` > 0 (Megatron's ``None``). Note: Megatron's list form of
    ``window_attn_skip_freq`` has the opposite polarity (1 = sliding window:
    ``megatron/core/transformer/utils.py::is_layer_window_attention``)."""
    # GPT-OSS's layer details (Megatron-Bridge ``gpt_oss_bridge.py``); the defaults are every other model's.
    add_bias_linear: bool = False
    """Biases in the linear layers, experts included (Megatron ``add_bias_linear``; GPT-OSS)."""
    add_qkv_bias: bool = False
    """A bias on the QKV projection (Megatron ``add_qkv_bias``; HF ``attention_bias``)."""
    softmax_type: str = "vanilla"
    """Megatron ``softmax_type``: "vanilla", or "learnable" (GPT-OSS's attention sinks, a learned
    per-head offset in the softmax)."""
    activation_func: str = "silu"
    """The MLP's activation: "silu" (SwiGLU with ``gated_linear_unit``) or "quick_gelu" (GPT-OSS's
    clamped ``x * sigmoid(1.702 x)`` GLU, Megatron ``fused_bias_geglu.quick_gelu``)."""
    activation_func_clamp_value: float = 0.0
    """Megatron ``activation_func_clamp_value`` (GPT-OSS ``swiglu_limit`` 7.0); 0 = no clamp."""
    glu_linear_offset: float = 0.0
    """Megatron ``glu_linear_offset`` (GPT-OSS 1.0)."""
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
    rope_scaling_original_max_position_embeddings: int = 0
    """YaRN: HF ``rope_scaling.original_max_position_embeddings`` (0: not given; Megatron's default 4,096 applies)."""
    rope_scaling_beta_fast: float = 32.0
    """YaRN: HF ``rope_scaling.beta_fast`` (transformers' and Megatron's default 32)."""
    rope_scaling_beta_slow: float = 1.0
    """YaRN: HF ``rope_scaling.beta_slow`` (default 1)."""
    rope_scaling_truncate: bool = True
    """YaRN: HF ``rope_scaling.truncate``, rounding the correction range to integers (Megatron
    ``--[no-]yarn-correction-range-round-to-int``; GPT-OSS false)."""
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
        if isinstance(self.name, str) and not self.name.isprintable():
            raise TunerError(f"model {self.name!r}: a model name has no control characters (a newline, a tab, an "
                             "escape); rename its folder or file")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int",) and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise TunerError(f"model {self.name!r}: {f.name} must be a non-negative integer, got {v!r}")
            if f.type in ("float",) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                         or not math.isfinite(v)):
                raise TunerError(f"model {self.name!r}: {f.name} must be a finite number, got {v!r}")
            if f.type == "bool" and not isinstance(v, bool):
                raise TunerError(f"model {self.name!r}: {f.name} must be true or false, got {v!r}")
            if f.type == "str" and not isinstance(v, str):
                raise TunerError(f"model {self.name!r}: {f.name} must be a string, got {v!r}")
            if f.type.startswith("tuple[int") and (not isinstance(v, tuple)
                                                   or any(isinstance(x, bool) or not isinstance(x, int) for x in v)):
                raise TunerError(f"model {self.name!r}: {f.name} must be a list of integers (0 or 1, one per layer), "
                                 f"got {v!r}")
            if f.type.startswith("tuple[str") and (not isinstance(v, tuple) or any(not isinstance(x, str) for x in v)):
                raise TunerError(f"model {self.name!r}: {f.name} must be a list of strings (one per flag or value), "
                                 f"got {v!r}")
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                     "vocab_size"):
            if getattr(self, name) <= 0:
                raise TunerError(f"model {self.name!r}: {name} must be > 0, got {getattr(self, name)}")
        if self.mtp_num_layers > self.num_layers:
            raise TunerError(f"model {self.name!r}: mtp_num_layers {self.mtp_num_layers:,} is more than its "
                             f"{self.num_layers} decoder layers (MTP adds a few prediction layers: DeepSeek-V3 has 1)")
        if self.num_attention_heads % self.num_query_groups:
            raise TunerError(
                f"model {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_query_groups})")
        if self.num_experts and self.moe_router_topk > self.num_experts:
            raise TunerError(f"model {self.name!r}: num_experts_per_tok ({self.moe_router_topk}) exceeds num_experts "
                             f"({self.num_experts})")
        if any(x not in (0, 1) for x in self.moe_layer_freq):
            raise TunerError(f"model {self.name!r}: moe_layer_freq entries must be 0 or 1")
        if self.num_layers > sum(self.moe_layer_freq) and self.ffn_hidden_size <= 0:
            raise TunerError(f"model {self.name!r}: dense layers need intermediate_size > 0")
        if self.norm_epsilon <= 0 or self.rotary_base <= 0 or not 0 < self.rotary_percent <= 1:
            raise TunerError(f"model {self.name!r}: rms_norm_eps and rope_theta must be > 0 and the rotary share in "
                             "(0, 1]")
        if self.num_experts and (self.moe_router_topk <= 0 or self.moe_ffn_hidden_size <= 0):
            raise TunerError(f"model {self.name!r}: a MoE model needs moe_router_topk and moe_ffn_hidden_size > 0 "
                             f"(got {self.moe_router_topk}, {self.moe_ffn_hidden_size})")
        if self.rope_scaling_type == "yarn" and not (0 < self.rope_scaling_beta_slow <= self.rope_scaling_beta_fast
                                                     and 0 < self.rope_scaling_factor):
            raise TunerError(f"model {self.name!r}: YaRN rope_scaling needs 0 < beta_slow <= beta_fast and 0 < factor, "
                             "got beta_slow "
                             f"{self.rope_scaling_beta_slow!r}, beta_fast {self.rope_scaling_beta_fast!r}, factor "
                             f"{self.rope_scaling_factor!r}")
        if self.rope_scaling_type and self.rope_scaling_factor <= 0:
            raise TunerError(f"model {self.name!r}: rope_scaling.factor must be > 0, got {self.rope_scaling_factor!r}")
        if self.is_mla and (self.qk_head_dim <= 0 or self.v_head_dim <= 0):
            raise TunerError(f"model {self.name!r}: an MLA model (kv_lora_rank > 0) needs qk_nope_head_dim "
                             f"(qk_head_dim) and v_head_dim > 0, got {self.qk_head_dim} and {self.v_head_dim}")
        if self.softmax_type not in ("vanilla", "off-by-one", "learnable"):
            raise TunerError(f"model {self.name!r}: softmax_type must be vanilla, off-by-one or learnable, got "
                             f"{self.softmax_type!r}")
        if self.activation_func not in ("silu", "quick_gelu"):
            raise TunerError(f"model {self.name!r}: activation_func must be silu or quick_gelu, got "
                             f"{self.activation_func!r}")
        if self.activation_func == "quick_gelu" and not self.gated_linear_unit:
            raise TunerError(f"model {self.name!r}: activation_func quick_gelu is GPT-OSS's gated quick-GEGLU and "
                             "needs a gated MLP "
                             "(megatron-core refuses quick_gelu with bias_activation_fusion and no gated_linear_unit)")
        if (self.activation_func_clamp_value or self.glu_linear_offset) and self.activation_func != "quick_gelu":
            raise TunerError(f"model {self.name!r}: activation_func_clamp_value and glu_linear_offset apply to the "
                             "quick_gelu GLU only "
                             f"(got {self.activation_func_clamp_value!r} and {self.glu_linear_offset!r} with "
                             f"{self.activation_func!r})")
        if self.activation_func_clamp_value < 0:
            raise TunerError(f"model {self.name!r}: activation_func_clamp_value (HF swiglu_limit) must be >= 0 (0: no "
                             f"clamp), got {self.activation_func_clamp_value!r}")
        if self.window_attn_skip_freq and (len(self.window_attn_skip_freq) != self.num_layers
                                           or any(x not in (0, 1) for x in self.window_attn_skip_freq)):
            bad = [x for x in self.window_attn_skip_freq if x not in (0, 1)]
            raise TunerError(
                f"model {self.name!r}: window_attn_skip_freq needs {self.num_layers} entries, each 0 (sliding window) "
                f"or 1 (full attention); got {len(self.window_attn_skip_freq)}"
                + (f" with {bad[0]!r} among them" if bad else ""))
        if len(self.moe_layer_freq) != self.num_layers:
            raise TunerError(
                f"model {self.name!r}: moe_layer_freq has {len(self.moe_layer_freq)} entries, needs {self.num_layers}")

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

        Causal full attention: ``(s + 1) / 2``; with a left window ``w`` a query at position ``i`` (1-based) sees
        ``min(i, w + 1)`` keys (itself and ``w`` before it, Megatron / flash-attention ``window_size=(w, 0)``)."""
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

    def attention_params(self) -> int:
        """Matmul weights of one attention block (QKV and output projections).

        Non-MLA: ``h*d*(n + 2g) + n*d*h`` (Megatron ``theoretical_memory_usage.py``).
        MLA: DeepSeek-V3's down/up projections (same file, MLA branch), without norms."""
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

        Counts every matmul weight a token passes through: attention projections, the router, its top-k routed experts,
        shared experts, dense MLPs, MTP layers when enabled (their projection and layer) and the output layer.
        Not counted: the input embedding (a lookup, not a matmul) and norm weights. For MiniMax-M2 this gives the seed's
        N = 10,415,112,192 (seeds/001 ``result.mfu``).

        Returns: Number of parameters (elements)."""
        attn = self.attention_params()
        moe_layer = (attn + self.router_params() + self.moe_router_topk * self.expert_params()
                     + self.shared_expert_params())
        dense_layer = attn + self.dense_mlp_params()
        n = self.num_moe_layers * moe_layer + self.num_dense_layers * dense_layer
        if self.mtp_num_layers:
            last = moe_layer if self.moe_layer_freq[-1] else dense_layer
            n += self.mtp_num_layers * (last + 2 * self.hidden_size * self.hidden_size)
        return n + self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every weight: embeddings, output layer (if untied), layers, norms, MTP.

        Returns: Number of parameters (elements)."""
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                          and not value.is_integer()):
        raise TunerError(f"model config {where!r}: {key} must be an integer, got {value!r}")
    return int(value)


def _as_float(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise TunerError(f"model config {where!r}: {key} must be a finite number, got {value!r}")
    return float(value)


#: HF ``rope_scaling.rope_type`` values read ("" / default / linear / dynamic / longrope: Megatron's rope unscaled).
_ROPE_TYPES = frozenset({"", "default", "linear", "dynamic", "longrope", "llama3", "yarn"})


def _yarn_details(rs: dict[str, Any], cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """YaRN's ModelSpec fields from a config's ``rope_scaling`` as transformers reads them
    (``_compute_yarn_parameters``): ``original_max_position_embeddings`` (else the config's
    ``max_position_embeddings``), ``beta_fast`` (32) and ``beta_slow`` (1) when absent or null, ``truncate`` (true).

    Raises TunerError: a value of the wrong type (``truncate`` is checked by :class:`ModelSpec`)."""
    return {"rope_scaling_original_max_position_embeddings": _as_int(
                _first(rs, "original_max_position_embeddings", default=cfg.get("max_position_embeddings") or 0),
                "rope_scaling.original_max_position_embeddings", where),
            "rope_scaling_beta_fast": _as_float(_first(rs, "beta_fast", default=32.0), "rope_scaling.beta_fast", where),
            "rope_scaling_beta_slow": _as_float(_first(rs, "beta_slow", default=1.0), "rope_scaling.beta_slow", where),
            "rope_scaling_truncate": _first(rs, "truncate", default=True)}


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def model_from_hf_config(cfg: dict[str, Any], *, name: str, where: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary (see :func:`_model_from_hf_config`).

    Raises TunerError: a required field is missing, or any field has a wrong type or value."""
    try:
        return _model_from_hf_config(cfg, name=name, where=where)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:  # OverflowError: int(1e999)
        if isinstance(e, TunerError):
            raise
        raise TunerError(f"model config {(where or name)!r}: a field has a wrong type or value ({type(e).__name__}: "
                         f"{e})") from None


def _unwrap(cfg: dict[str, Any], w: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The text model's config (a multimodal checkpoint's ``text_config``) and the ``tuner`` section's overrides."""
    if "text_config" in cfg and "hidden_size" not in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise TunerError(f"model config {w!r}: text_config must be an object")
        cfg = {**cfg["text_config"], "tuner": cfg.get("tuner", {})}
    if not isinstance(cfg.get("tuner") or {}, dict):
        raise TunerError(f"model config {w!r}: its 'tuner' section must be an object")
    return cfg, dict(cfg.get("tuner") or {})


#: The required sizes and the key names each model family spells them with.
_REQUIRED = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"), "vocab_size": ("vocab_size",)}


def _sizes(cfg: dict[str, Any], w: str) -> tuple[dict[str, int], int, Any, Any]:
    """The required sizes (:data:`_REQUIRED`), the routed experts and the raw dense and expert FFN widths.

    Raises TunerError: a required size missing or not a positive integer."""
    vals = {k: _first(cfg, *alts) for k, alts in _REQUIRED.items()}
    missing = [k for k, v in vals.items() if v is None]
    num_experts = _as_int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0,
                          "num_local_experts", w)
    inter = _first(cfg, "intermediate_size", "ffn_hidden_size", "n_inner")
    moe_inter = _first(cfg, "moe_intermediate_size", "expert_intermediate_size")
    if num_experts and moe_inter is None:
        moe_inter = inter  # Mixtral / MiniMax / GPT-OSS: intermediate_size is the expert width
    if inter is None and not num_experts:
        missing.append("intermediate_size")
    if num_experts and _first(cfg, "num_experts_per_tok", "moe_topk", "top_k") is None:
        missing.append("num_experts_per_tok")
    if missing:
        raise TunerError(f"model config {w!r} is missing {', '.join(missing)}; a Hugging Face config.json with "
                         "hidden_size, num_hidden_layers, num_attention_heads, vocab_size and intermediate_size "
                         "(plus num_local_experts/num_experts_per_tok for MoE) is accepted")
    for k, v in vals.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise TunerError(f"model config {w!r}: {k} must be a positive integer, got {v!r}")
    return vals, num_experts, inter, moe_inter


def _shared_width(cfg: dict[str, Any], moe_inter: Any, w: str) -> int:
    """Total width of the shared experts: given, or their count x the routed expert's width."""
    shared = _first(cfg, "shared_intermediate_size", "shared_expert_intermediate_size",
                    "moe_shared_expert_intermediate_size")
    if shared is None and _first(cfg, "n_shared_experts", "num_shared_experts"):
        shared = _as_int(_first(cfg, "n_shared_experts", "num_shared_experts"), "n_shared_experts",
                         w) * _as_int(moe_inter, "moe_intermediate_size", w)
    return _as_int(shared or 0, "shared_intermediate_size", w)


def _moe_layer_freq(cfg: dict[str, Any], over: dict[str, Any], num_experts: int, L: int, w: str) -> list[int]:
    """Which layers are MoE (1) or dense (0): the ``tuner`` section's list (popped from ``over``), DeepSeek's
    ``first_k_dense_replace`` / ``moe_layer_freq``, Qwen's ``mlp_only_layers`` / ``decoder_sparse_step``, else all."""
    if "moe_layer_freq" in over:
        raw = over.pop("moe_layer_freq")
        if not isinstance(raw, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, int) for x in raw):
            raise TunerError(f"model config {w!r}: tuner.moe_layer_freq must be a list of 0 / 1 per layer "
                             f"(1 = MoE, Megatron's --moe-layer-freq list form), got {raw!r}"[:300])
        return list(raw)
    if not num_experts:
        return [0] * L
    if "first_k_dense_replace" in cfg:
        first_dense = _as_int(cfg["first_k_dense_replace"], "first_k_dense_replace", w)
        step = _as_int(cfg.get("moe_layer_freq", 1) or 1, "moe_layer_freq", w)
        if first_dense < 0 or step < 1:
            raise TunerError(f"model config {w!r}: first_k_dense_replace must be >= 0 and moe_layer_freq >= 1, "
                             f"got {first_dense} and {step}")
        return [1 if (i >= first_dense and (i - first_dense) % step == 0) else 0 for i in range(L)]
    if "mlp_only_layers" in cfg or "decoder_sparse_step" in cfg:
        raw_only = cfg.get("mlp_only_layers") or []
        if not isinstance(raw_only, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in raw_only):
            raise TunerError(
                f"model config {w!r}: mlp_only_layers must be a list of layer indices, got {raw_only!r}"[:300])
        only = set(raw_only)
        step = _as_int(cfg.get("decoder_sparse_step", 1) or 1, "decoder_sparse_step", w)
        return [0 if (i in only or (i + 1) % step) else 1 for i in range(L)]
    return [1] * L


def _windows(cfg: dict[str, Any], L: int, w: str) -> tuple[int, tuple[int, ...]]:
    """The sliding window (tokens, 0: none) and which layers attend fully (1) or slide (0), from ``layer_types``
    (GPT-OSS without it: transformers' ``GptOssConfig`` default, sliding on even layers, 0-indexed)."""
    types = cfg.get("layer_types")
    if cfg.get("sliding_window") and not types and str(cfg.get("model_type", "")) == "gpt_oss":
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if not (cfg.get("sliding_window") and types):
        return 0, ()
    if not isinstance(types, list) or len(types) != L:
        raise TunerError(f"model config {w!r}: layer_types must list one entry per layer ({L})")
    odd_types = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
    if odd_types:
        raise TunerError(f"model config {w!r}: layer_types entries must be sliding_attention or full_attention, got "
                         f"{odd_types[0]!r}")
    return _as_int(cfg["sliding_window"], "sliding_window", w), tuple(0 if str(t) == "sliding_attention"
                                                                      else 1 for t in types)


def _numerics(cfg: dict[str, Any], d: int, num_experts: int, w: str) -> dict[str, Any]:
    """The fields that reach the run command but not the cost: norm epsilon, RoPE and its scaling, the router's
    score function, expert bias, scaling factor and groups (DeepSeek's group-limited routing)."""
    rs = cfg.get("rope_scaling") or {}
    if not isinstance(rs, dict):
        raise TunerError(f"model config {w!r}: rope_scaling must be an object (e.g. {{\"rope_type\": \"yarn\", "
                         f"\"factor\": 32}}) or null, got {rs!r}")
    rs_type = rs.get("rope_type") or rs.get("type") or ""
    if rs_type not in _ROPE_TYPES:
        raise TunerError(f"model config {w!r}: rope_scaling.rope_type must be one of "
                         f"{', '.join(sorted(t for t in _ROPE_TYPES if t))}, got {rs_type!r}")
    # not carried to Megatron's flags (its rope is unscaled)
    if rs_type in ("default", "linear", "dynamic", "longrope"):
        rs_type = ""
    partial = cfg.get("partial_rotary_factor")
    if partial is None and cfg.get("rotary_dim") and d:
        partial = float(cfg["rotary_dim"]) / d
    topk_method = str(cfg.get("topk_method", ""))
    n_group = _as_int(cfg.get("n_group") or 1, "n_group", w) if topk_method in ("group_limited_greedy",
                                                                                "noaux_tc") else 1
    grouped = n_group > 1  # Megatron --moe-router-num-groups / --moe-router-group-topk
    return dict(
        norm_epsilon=_as_float(_first(cfg, "rms_norm_eps", "layer_norm_eps", "norm_epsilon", default=1e-5),
                               "rms_norm_eps", w),
        rotary_base=_as_float(_first(cfg, "rope_theta", "rotary_base", default=10000.0), "rope_theta", w),
        rotary_percent=float(partial if partial is not None else 1.0), rope_scaling_type=rs_type,
        rope_scaling_factor=_as_float(_first(rs, "factor", default=1.0), "rope_scaling.factor", w),
        rope_scaling_mscale=_as_float(_first(rs, "mscale", default=1.0), "rope_scaling.mscale", w),
        rope_scaling_mscale_all_dim=_as_float(_first(rs, "mscale_all_dim", default=0.0), "rope_scaling.mscale_all_dim",
                                              w),
        **(_yarn_details(rs, cfg, w) if rs_type == "yarn" else {}),
        moe_router_score_function="sigmoid" if str(cfg.get("scoring_func", "softmax")) == "sigmoid" else "softmax",
        moe_router_enable_expert_bias=bool(cfg.get("use_routing_bias")) or topk_method == "noaux_tc",
        moe_router_topk_scaling_factor=float(cfg.get("routed_scaling_factor") or 0.0) if num_experts else 0.0,
        moe_router_num_groups=n_group if grouped else 0,
        moe_router_group_topk=_as_int(cfg.get("topk_group") or 0, "topk_group", w) if grouped else 0)


def _model_from_hf_config(cfg: dict[str, Any], *, name: str, where: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary.

    Understands the key names of Llama, Mixtral, Qwen3 / Qwen3-MoE, DeepSeek-V3 / Kimi-K2 (MLA), GPT-OSS and MiniMax-M2.
    A ``"tuner"`` section may override derived fields (e.g. ``{"mtp_num_layers": 0}``); a ``text_config`` section
    (multimodal checkpoints) is used when present.

    Raises TunerError: if a required field is missing or not a positive integer."""
    w = where or name
    cfg, over = _unwrap(cfg, w)
    vals, num_experts, inter, moe_inter = _sizes(cfg, w)
    h, L, n = vals["hidden_size"], vals["num_hidden_layers"], vals["num_attention_heads"]
    d = _as_int(_first(cfg, "head_dim", "kv_channels", default=h // n), "head_dim", w)
    mla = {
        "q_lora_rank": _as_int(cfg.get("q_lora_rank") or 0, "q_lora_rank", w),
        "kv_lora_rank": _as_int(cfg.get("kv_lora_rank") or 0, "kv_lora_rank", w),
        "qk_head_dim": _as_int(cfg.get("qk_nope_head_dim") or 0, "qk_nope_head_dim", w),
        "qk_pos_emb_head_dim": _as_int(cfg.get("qk_rope_head_dim") or 0, "qk_rope_head_dim", w),
        "v_head_dim": _as_int(cfg.get("v_head_dim") or 0, "v_head_dim", w)}
    if mla["kv_lora_rank"]:
        d = mla["qk_head_dim"] + mla["qk_pos_emb_head_dim"]
        # MLA always normalises its q and kv latents (Megatron: --qk-layernorm with --multi-latent-attention).
        cfg = {**cfg, "qk_layernorm": True}
    gpt_oss: dict[str, Any] = {}
    if str(cfg.get("model_type", "")) == "gpt_oss":
        # Megatron-Bridge gpt_oss_bridge.py: biases everywhere, attention sinks (softmax_type learnable), the clamped
        # quick-GELU GLU with offset 1.0 and limit swiglu_limit (7.0).
        # add_qkv_bias follows add_bias_linear: Megatron-LM sets it whenever add_bias_linear is (arguments.py)
        gpt_oss = dict(add_bias_linear=True, add_qkv_bias=True, softmax_type="learnable", activation_func="quick_gelu",
                       activation_func_clamp_value=_as_float(cfg.get("swiglu_limit", 7.0), "swiglu_limit", w),
                       glu_linear_offset=1.0)
    mtp = _as_int(_first(cfg, "num_nextn_predict_layers", default=0) or 0, "num_nextn_predict_layers", w)
    if cfg.get("use_mtp") and not mtp:
        mtp = _as_int(cfg.get("num_mtp_modules") or 0, "num_mtp_modules", w)
    window, skip = _windows(cfg, L, w)
    moe_only = num_experts and moe_inter == inter and "moe_intermediate_size" not in cfg  # no dense FFN
    spec = dict(
        name=name, num_layers=L, hidden_size=h, num_attention_heads=n,
        num_query_groups=_as_int(_first(cfg, "num_key_value_heads", "num_query_groups", default=n),
                                 "num_key_value_heads", w),
        kv_channels=d, ffn_hidden_size=0 if moe_only else _as_int(inter or 0, "intermediate_size", w),
        vocab_size=vals["vocab_size"], num_experts=num_experts,
        moe_router_topk=_as_int(_first(cfg, "num_experts_per_tok", "moe_topk", "top_k", default=0) or 0,
                                "num_experts_per_tok", w),
        moe_ffn_hidden_size=_as_int(moe_inter or 0, "moe_intermediate_size", w) if num_experts else 0,
        moe_shared_expert_intermediate_size=_shared_width(cfg, moe_inter, w),
        moe_layer_freq=tuple(int(x) for x in _moe_layer_freq(cfg, over, num_experts, L, w)),
        gated_linear_unit=str(_first(cfg, "hidden_act", default="silu")) in ("silu", "swiglu", "gelu_pytorch_tanh",
                                                                             "geglu"),
        untie_embeddings_and_output_weights=not bool(cfg.get("tie_word_embeddings", False)),
        qk_layernorm=bool(_first(cfg, "use_qk_norm", "qk_layernorm",
                                 default=str(cfg.get("model_type", "")).startswith("qwen3"))),
        qk_layernorm_full_dim=str(cfg.get("qk_norm_type", "")) == "per_layer", mtp_num_layers=mtp,
        max_position_embeddings=_as_int(cfg.get("max_position_embeddings") or 0, "max_position_embeddings", w),
        window_size=window, window_attn_skip_freq=skip, **gpt_oss, source=str(cfg.get("_source", "")), **mla,
        **_numerics(cfg, d, num_experts, w))
    unknown = set(over) - {f.name for f in dataclasses.fields(ModelSpec)}
    if unknown:
        raise TunerError(f"model config {w!r}: unknown keys in its 'tuner' section: {sorted(unknown)}")
    spec.update(over)
    for k in ("moe_layer_freq", "extra_megatron_args", "window_attn_skip_freq"):
        if isinstance(spec.get(k), list):
            spec[k] = tuple(spec[k])
    return ModelSpec(**spec)


def list_models() -> list[str]:
    """Names of the bundled model presets, sorted."""
    return sorted(data_files(MODEL_DIR, ".json"))


def load_model(name_or_path: str, *, allow_config_args: bool = False) -> ModelSpec:
    """A bundled preset by name (case-insensitive), a ``config.json`` path or a folder holding one.

    A file's ``"tuner": {"extra_megatron_args": [...]}`` reaches every trial and exported script, so a file from
    elsewhere (a downloaded ``config.json``) can add ``--load``, ``--save`` or ``--data-path``: it is refused unless
    ``allow_config_args`` (``--allow-config-args``); the bundled presets' are the project's own.

    Raises TunerError: unknown name (with close names suggested), unreadable or malformed file
    (:func:`specs.files.load_user_json`), missing fields, or launch arguments not allowed."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():  # a Hugging Face model folder
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if p.is_dir() or not p.exists():
            what = "a folder without a config.json" if p.is_dir() else "no such file"
            raise TunerError(f"--model {name_or_path!r}: {what}; give a preset name ({', '.join(list_models())}) or a "
                             "config.json path")
        cfg = load_user_json(p, f"--model {name_or_path!r}", "a Hugging Face config.json")
        if not isinstance(cfg, dict):
            raise TunerError(f"--model {name_or_path!r}: expected a JSON object (a Hugging Face config.json)")
        cfg.setdefault("_source", str(p))
        # Hugging Face layout: <model name>/config.json
        display = p.resolve().parent.name if p.name == "config.json" and p.resolve().parent.name else p.stem
        model = model_from_hf_config(cfg, name=display, where=str(p))
        if model.extra_megatron_args and not allow_config_args:
            raise TunerError(f"--model {name_or_path!r}: its 'tuner' section adds launch arguments to every trial and "
                             f"exported script: {shlex.join(model.extra_megatron_args)[:300]}; read them, then pass "
                             "--allow-config-args to use them (or delete them from the file)")
        return model
    files = data_files(MODEL_DIR, ".json")
    by_lower = {k.lower(): k for k in files}
    key = by_lower.get(name_or_path.lower())
    if key is None:
        close = difflib.get_close_matches(name_or_path.lower(), list(by_lower), n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
        raise TunerError(f"--model {name_or_path!r}: unknown model.{hint} Known presets: {', '.join(sorted(files))}; "
                         "or give the path of a Hugging Face config.json.")
    cfg = json.loads(files[key].read_text())
    return model_from_hf_config(cfg, name=key)


def slice_model(model: ModelSpec, num_layers: int | None) -> ModelSpec:
    """``model`` cut to its first ``num_layers`` decoder layers at full width (their ``moe_layer_freq`` entries; MTP
    layers dropped).

    Raises:
        TunerError: ``num_layers`` is not from 1 to the model's layer count.
    """
    if num_layers is None or num_layers == model.num_layers:
        return model
    if not 1 <= num_layers <= model.num_layers:
        raise TunerError(f"--layers must be from 1 to {model.num_layers} (the layers of {model.name}), got "
                         f"{num_layers!r}")
    return model.replace(name=f"{model.name}[{num_layers} layers]", num_layers=num_layers,
                         moe_layer_freq=model.moe_layer_freq[:num_layers],
                         window_attn_skip_freq=model.window_attn_skip_freq[:num_layers], mtp_num_layers=0)
