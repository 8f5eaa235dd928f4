"""Mutation test of the cost model: perturb each term in turn and list the tests that notice.

    PYTHONPATH=. python benchmarks/mutate_terms.py [--jobs 2] [--only SUBSTRING] [--with-digest] [--markdown FILE]

Mutations (``benchmarks/mutation_plugin.py`` applies one per run):

- **scale**: every function of the term modules (``cost_model.terms.TERM_MODULES``, public and
  private) returns 1.1 x its value (a bool-valued one its negation);
- **edit** / **const** / **exec**: explicit one-line changes of formulas, constants and enum traits,
  among them the six that passed every test at commit 7ec9c3e (review of issue 13): shared-expert
  activations set to 0, logits ignoring the MTP heads, CP p2p overlap ignored, PP p2p traffic halved,
  the communicator count changed, the interleaved warm-up count without its ``* 2``.

Each mutation runs ``pytest tests/cost_model_tests`` in a fresh interpreter with the mutation applied
before the tests import the code. The digest test (``test_estimate_digest.py``) is left out unless
``--with-digest``: it catches every numerical change by construction, and the point is that the
term tests do. Prints a table (mutation, tests that failed); exit status 1 when a mutation
survives or a baseline test fails.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from cost_model.terms import TERM_MODULES

ROOT = Path(__file__).resolve().parents[1]


TESTS = "tests/cost_model_tests"
DIGEST_TEST = "tests/cost_model_tests/test_estimate_digest.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    spec: dict[str, Any]
    why: str = ""


def _edit(name: str, target: str, old: str, new: str, why: str = "") -> Mutation:
    return Mutation(name, {"kind": "edit", "target": target, "old": old, "new": new, "name": name}, why)


def _const(name: str, target: str, value: float, why: str = "") -> Mutation:
    return Mutation(name, {"kind": "const", "target": target, "value": value}, why)


T = "cost_model.terms."

#: Explicit mutations: the review's six survivors first, then further one-line changes.
EXPLICIT: tuple[Mutation, ...] = (
    _edit(
        "shared-expert activations set to 0", T + "activations:shared_expert_bytes",
        "return c.tokens / col(c.tp) * (_mlp_bytes_per_token(c, m.shared_ffn) + own_input)", "return 0 * c.tokens",
        "review survivor",
    ),
    _edit("logits ignore the MTP heads", T + "memory:logits_bytes", "* (1 + m.mtp)", "* 1", "review survivor"),
    _edit("CP p2p overlap ignored", T + "comm:cp_ring_time", " * (1 - c.cal.cp_p2p_overlap)", "", "review survivor"),
    _edit(
        "PP p2p traffic halved", T + "schedule:pp_p2p_time", "P2P_TRANSFERS_PER_BOUNDARY * c.micro_batches",
        "P2P_TRANSFERS_PER_BOUNDARY / 2 * c.micro_batches", "review survivor",
    ),
    _edit(
        "communicator count changed", T + "memory:process_groups", "n + c.cal.base_process_groups",
        "n + c.cal.base_process_groups + 1", "review survivor",
    ),
    _edit(
        "interleaved warm-up without its * 2", T + "schedule:inflight_interleaved", "(pp - c.rank - 1) * 2",
        "(pp - c.rank - 1)", "review survivor",
    ),
    _edit("logits FLOPs ignore the MTP heads", T + "compute:logits_flops", "* (1 + m.mtp)", "* 1"),
    _edit("expert weights not split by EP", T + "params:expert_params", "(m.experts / col(c.ep))", "m.experts"),
    _edit(
        "1F1B in-flight count off by one", T + "schedule:inflight_1f1b", "col(c.pp) - c.rank", "col(c.pp) - c.rank - 1"
    ),
    _edit(
        "ring collectives move the whole tensor", T + "comm:ring_time", "bytes_full * (g - 1) / g / bw",
        "bytes_full / bw",
    ),
    _edit(
        "allgather dispatcher priced as an all-to-all", T + "comm:ep_all_to_all_time",
        "nccl = np.where(c.allgather, send / ring_bandwidth(c, col(c.etp * c.ep), 1.0), nccl)", "pass",
    ),
    _edit(
        "cross-node rings through one NIC per GPU", T + "comm:ring_bandwidth", "np.minimum(nv, per_domain * net)", "net"
    ),
    _edit(
        "ring NICs counted without the group's stride", T + "comm:ring_bandwidth", "np.clip(c.nvlink_size // s, 1, g)",
        "np.clip(c.nvlink_size + 0 * s, 1, g)",
    ),
    _edit(
        "DP with the distributed optimizer as an all-reduce", T + "comm:dp_bytes_per_param", "grad + gather, 2 * grad",
        "2 * grad, 2 * grad",
    ),
    Mutation(
        "HybridEP counted as allgather",
        {
            "kind": "exec",
            "code": (
                "import specs.layout as L\n"
                "L._DISPATCHER_TRAITS[L.Dispatcher.flex_hybridep] = L._DispatcherTraits('allgather', None)"
            ),
        },
    ),
    _edit(
        "no-TE attention output kept once", T + "activations:attention_bytes", "out = 2 * BF16_BYTES * m.ctx_dim",
        "out = BF16_BYTES * m.ctx_dim",
    ),
    _const("TE attention keeps three hidden tensors", T + "activations:TE_ATTENTION_HIDDEN_TENSORS", 3.0),
    _edit(
        "fp8: the QKV input kept in bf16", T + "activations:attention_bytes", "* BF16_BYTES * m.h + g * m.h",
        "* BF16_BYTES * m.h + BF16_BYTES * m.h",
    ),
    _edit(
        "fp8: no quantised copy of the attention output", T + "activations:attention_bytes",
        "(g * m.ctx_dim if c.quantized else 0.0)", "0.0",
    ),
    _const("a second hidden-size tensor per routed copy", T + "activations:EXPERT_HIDDEN_TENSORS", 2.0),
    _const("unfused SwiGLU keeps 2 more tensors, not 3", T + "activations:UNFUSED_EXPERT_ACTIVATION_TENSORS", 2.0),
    _const("router keeps 8 B per token-expert", T + "activations:ROUTER_BYTES_PER_TOKEN_EXPERT", 8.0),
    _const("bf16 main grads at 4 B", T + "state:MAIN_GRAD_BYTES_PARAM_DTYPE", 4.0),
    _const("Muon keeps Adam's 12 B", T + "state:MUON_BYTES_PER_PARAM", 12.0),
    _edit(
        "fp8_param_gather keeps the bf16 copy", T + "state:weight_bytes",
        "per_param = c.low_precision_weight_bytes if low_only else",
        "per_param = BF16_BYTES + c.low_precision_weight_bytes if low_only else",
    ),
    _edit(
        "precision-aware masters 2 B for every recipe", T + "state:optimizer_bytes_per_param",
        "c.precision_aware & owns", "c.precision_aware",
    ),
    _const("TE CE in place keeps fp32", T + "memory:TE_CE_INPLACE_BYTES", 4.0),
    _const("TE CE from 2.18 as the code-read fp32 gradient + logits", T + "memory:TE_CE_BYTES_SINCE_2_18", 6.0),
    _edit(
        "offload keeps no layer in transit", T + "memory:offload_kept_bytes", "per_rank - off * per_layer + per_layer",
        "per_rank - off * per_layer",
    ),
    _const("current scaling quantises in one kernel", T + "comm:FP8_CURRENT_SCALING_KERNELS", 1.0),
    _const(
        "host: 18 B per offloaded parameter (the bf16 copy kept)", T + "optimizer:HOST_BYTES_PER_OFFLOADED_PARAM", 18.0
    ),
    _const("host: no pinned-allocator overhead", T + "optimizer:HOST_PINNED_OVERHEAD_BYTES_PER_OFFLOADED_PARAM", 0.0),
    _edit(
        "host: the first optimizer's clones over the shards only", T + "optimizer:host_bytes_per_node",
        "owned if params is None else params", "owned",
    ),
    _const("offload: no first-optimizer clones", T + "state:OFFLOAD_BUILD_LEAK_BYTES", 0.0),
    _const("offload: no cached bf16 build clones", T + "state:OFFLOAD_BUILD_CACHED_BYTES", 0.0),
    _edit(
        "offload: the GPU share keeps the precision-aware states", T + "state:optimizer_state_bytes",
        "np.where(f > 0, OFFLOAD_GPU_STATE_BYTES, optimizer_bytes_per_param(c))", "optimizer_bytes_per_param(c)",
    ),
    _edit(
        "every loss priced as TE's fused cross-entropy", T + "compute:loss_time",
        "CROSS_ENTROPY_BYTES_PER_LOGIT[c.options.cross_entropy_path]", 'CROSS_ENTROPY_BYTES_PER_LOGIT["te"]',
    ),
    _edit(
        "the loss ignores the MTP heads", T + "compute:loss_time", "* (1 + m.mtp) / c.hbm_bytes_per_s",
        "/ c.hbm_bytes_per_s",
    ),
    _edit(
        "core_attn frees the output under TE bf16", T + "activations:core_attention_bytes",
        "frees_output = c.quantized or not c.options.te_attention", "frees_output = True",
    ),
    _edit(
        "mla_up_proj recompute frees nothing", T + "activations:saved_attention_bytes",
        'np.where(c.recomputes("mla_up_proj"), up, 0)', "0",
    ),
    _edit(
        "flex SM share under overlap ignored", T + "comm:ep_all_to_all_time",
        "np.where(c.flex, hidden * c.cal.flex_sm_share, 0.0)", "0.0",
    ),
    _edit(
        "full uniform keeps every layer's input", T + "activations:stored_layer_bytes",
        "layer_input / c.recompute_num_layers", "layer_input",
    ),
    _edit("bubble ignores VPP", T + "schedule:fill_drain_microbatches", "(c.pp - 1) / c.vpp", "(c.pp - 1)"),
    _edit(
        "moe_act recompute frees nothing", T + "activations:saved_moe_bytes", "expert_activation_fn_bytes(c, copies)",
        "0 * copies",
    ),
    _const("master weights 4 B with the precision-aware optimizer", T + "state:MASTER_REMAINDER_BYTES", 4.0),
    _edit(
        "no host sync of the tokens per expert", T + "comm:_fixed_layer_cost", "layer + cal.moe_host_sync_latency_s + ",
        "layer + ",
    ),
    _const("GEMM backward = forward", T + "compute:GEMM_PASSES", 2.0),
    _edit(
        "Blackwell Ultra priced as Blackwell", T + "context:build_context",
        "cal.family_factor(gpu.family, gpu.generation)", "cal.family_factor(gpu.family)",
    ),
    _const("two SP collectives per block", T + "comm:SP_COLLECTIVES_PER_BLOCK", 2.0),
    _const("no-TE attention keeps two hidden tensors", T + "activations:ATTENTION_HIDDEN_TENSORS", 2.0),
    _edit(
        "recompute re-runs the backward's elementwise work too", T + "recompute:_forward_share",
        "return 1.0 + c.cal.elementwise_backward_ratio", "return 1.0",
    ),
    _edit(
        "flex buffers sized like alltoall's", T + "memory:dispatcher_buffer_bytes",
        "np.where(c.flex, c.cal.flex_dispatcher_buffer_bytes,", "np.where(False, c.cal.flex_dispatcher_buffer_bytes,",
    ),
    _edit(
        "EP peers counted as adjacent (ETP ignored)", T + "comm:ep_local_peers",
        "c.nvlink_size // np.maximum(c.etp, 1)", "c.nvlink_size // 1",
    ),
    _edit(
        "working set without full recompute: a whole layer", T + "memory:working_set_bytes",
        "one_layer * c.cal.backward_working_set_fraction", "one_layer",
    ),
    _edit(
        "full block recompute's working set: the whole block (as uniform's group)", T + "memory:working_set_bytes",
        "np.where(c.uniform, c.recompute_num_layers, 1.0)", "c.recompute_num_layers",
    ),
    _edit(
        "nvfp4 GEMMs on Blackwell Ultra take the generation factor too", T + "context:build_context",
        "cal.family_factor(gpu.family) if prec == Precision.nvfp4 else fam", "fam",
    ),
    _edit(
        "grouped-GEMM half-point blind to the expert's shape", T + "compute:grouped_gemm_efficiency",
        "cal.grouped_gemm_half_rows + cal.grouped_gemm_half_rows_work * etp / (m.h * m.moe_ffn)",
        "cal.grouped_gemm_half_rows",
    ),
    _edit(
        "grouped-GEMM half-point blind to ETP's split of the expert", T + "compute:grouped_gemm_efficiency",
        "cal.grouped_gemm_half_rows_work * etp / (m.h * m.moe_ffn)",
        "cal.grouped_gemm_half_rows_work / (m.h * m.moe_ffn)",
    ),
    _edit(
        "a per-node network figure read per remote GPU", T + "comm:flex_dispatch_time",
        "np.where(c.network_counted_per_node,", "np.where(False,",
    ),
    _edit(
        "per-node copies counted over GPUs, not NVLink domains", T + "comm:flex_dispatch_time",
        "holders_hit(c.model, domains)", "holders_hit(c.model, ep)",
    ),
    _edit("group-limited routing ignored", T + "comm:holders_hit", "if not (g > 1 and 0 < kg < g):", "if True:"),
    _edit(
        "group-limited routing: groups taken as holders either way", T + "comm:holders_hit",
        "return np.where(h >= g, spans, within)", "return spans",
    ),
    _edit(
        "grouped-GEMM efficiency without its floor", T + "compute:grouped_gemm_efficiency",
        "np.maximum(eff, cal.grouped_gemm_efficiency_floor)", "eff",
    ),
    _edit(
        "TP overlap ignored", T + "comm:_tp_kept",
        "1.0 - c.cal.tp_comm_overlap_fraction if c.options.tp_comm_overlap else 1.0", "1.0",
    ),
    _edit(
        "EP overlap ignored", T + "comm:ep_all_to_all_time", "hidden = one * c.cal.ep_a2a_overlap", "hidden = one * 0.0"
    ),
    _edit("DP overlap ignored", T + "comm:dp_comm_time", "share = cal.dp_overlap if", "share = 0.0 if"),
    _edit("DP overlap not bounded by one micro-batch", T + "comm:dp_comm_time", "if window is not None:", "if False:"),
    _edit(
        "DP overlap window of FSDP: one micro-batch", T + "comm:dp_comm_time",
        "(col(c.micro_batches) if opt.use_megatron_fsdp else 1.0)", "1.0",
    ),
    _edit(
        "expert biases cost nothing", T + "compute:moe_elementwise_time",
        "c.cal.expert_bias_bytes_per_copy_moe if c.dims.expert_bias", "0.0 if c.dims.expert_bias",
    ),
    _edit(
        "MLA RoPE priced unfused when fused", T + "compute:mla_unfused_rope_time",
        "if c.options.apply_rope_fusion or not c.model.is_mla:", "if not c.model.is_mla:",
    ),
    _edit(
        "mla_up_proj recompute without the unfused RoPE", T + "recompute:selective_attention_time",
        "up_projection + unfused_rope * c.cal.unfused_mla_rope_forward_share", "up_projection",
    ),
    _edit(
        "attention: no fixed part of a call", T + "compute:core_attention_work",
        "call = cal.attention_call_macs * col(c.mbs)", "call = 0.0 * col(c.mbs)",
    ),
    _edit(
        "attention: the fixed part on windowed layers too", T + "compute:core_attention_work",
        "+ cal.attention_window_extra_keys + sinks),", "+ cal.attention_window_extra_keys + sinks) + call,",
    ),
    _edit(
        "attention: a window costs its keys only", T + "compute:core_attention_work",
        "+ cal.attention_window_extra_keys + sinks),", "+ sinks),",
    ),
    _edit(
        "attention: sinks cost nothing", T + "compute:core_attention_work",
        'sinks = cal.attention_sink_extra_keys if c.model.softmax_type != "vanilla" else 0.0', "sinks = 0.0",
    ),
    _edit(
        "attention: one speed for every head dim", T + "compute:core_attention_work", "/ attention_head_dim_factor(c)",
        "/ 1.0",
    ),
    _edit(
        "attention: head dims interpolated by qk alone", T + "compute:head_dim_factor", "np.interp(sum(pair),",
        "np.interp(2 * pair[0],",
    ),
    _edit(
        "attention: a long window dearer than none", T + "compute:core_attention_work",
        "                           full_layer)", "                           np.inf)",
    ),
    _const("attention: forward a third, as a GEMM's", T + "compute:ATTENTION_FORWARD_SHARE", 1 / 3),
    _edit(
        "attention: MLA at head dim 128's speed", T + "compute:attention_head_dim_factor",
        "pair = (model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim)", "pair = (128, 128)",
    ),
)


def scale_mutations() -> list[Mutation]:
    """One 1.1x mutation per function defined in each term module."""
    out = []
    for modname in TERM_MODULES:
        mod = importlib.import_module(modname)
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ == modname:
                out.append(
                    Mutation(
                        f"{modname.removeprefix(T)}.{name} x 1.1",
                        {"kind": "scale", "target": f"{modname}:{name}", "factor": 1.1},
                    )
                )
    return out


@dataclass
class Outcome:
    mutation: Mutation
    failed: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)")


def run(m: Mutation | None, with_digest: bool) -> Outcome:
    """``pytest`` over the cost-model tests with ``m`` applied (None: the baseline)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if m is not None:
        env["COST_MODEL_MUTATION"] = json.dumps(m.spec)
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.mutation_plugin", "-p", "no:cacheprovider", "--tb=no",
        "-rfE", TESTS,
    ]
    if not with_digest:
        cmd += ["--ignore", DIGEST_TEST]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    out = Outcome(m or Mutation("baseline", {}), seconds=time.perf_counter() - t0)
    out.failed = sorted(
        {mm.group(1).split("::", 1)[-1] for line in p.stdout.splitlines() if (mm := _FAILED.match(line))}
    )
    if p.returncode not in (0, 1) or (p.returncode == 1 and not out.failed):
        out.error = (p.stdout[-1500:] + p.stderr[-1500:]).strip()
    return out


def table(outcomes: list[Outcome]) -> str:
    """A markdown table: mutation, how many tests failed, which (the first three)."""
    lines = ["| mutation | tests failing | e.g. |", "|---|---|---|"]
    for o in outcomes:
        if o.error:
            caught = "error: " + o.error.splitlines()[-1][:80]
        else:
            caught = str(len(o.failed)) if o.failed else "**none (survived)**"
        eg = ", ".join(f"`{t}`" for t in o.failed[:3])
        why = f" ({o.mutation.why})" if o.mutation.why else ""
        lines.append(f"| {o.mutation.name}{why} | {caught} | {eg} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="mutations run at once (each a pytest process)")
    ap.add_argument("--only", default="", help="run the mutations whose name (or reason) contains this")
    ap.add_argument("--with-digest", action="store_true", help="also run the digest test")
    ap.add_argument("--markdown", help="write the table (with the command and date) to this file")
    a = ap.parse_args(argv)
    muts = [m for m in (*EXPLICIT, *scale_mutations()) if a.only in f"{m.name} ({m.why})"]
    base = run(None, a.with_digest)
    if base.failed or base.error:
        print(f"baseline: tests fail without a mutation: {base.failed or base.error}")
        return 1
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as ex:
        outcomes = list(ex.map(lambda m: run(m, a.with_digest), muts))
    survived = [o for o in outcomes if not o.failed or o.error]
    text = table(outcomes)
    n_scale = sum(o.mutation.spec.get("kind") == "scale" for o in outcomes)
    summary = (
        f"{len(outcomes)} mutations ({len(outcomes) - n_scale} explicit, {n_scale} scale x 1.1), "
        f"{len(outcomes) - len(survived)} caught, {len(survived)} survived or failed to apply; "
        f"{time.perf_counter() - t0:.0f} s, digest test {'included' if a.with_digest else 'left out'}"
    )
    print(text)
    print(summary)
    if a.markdown:
        cmd = (
            "PYTHONPATH=. python benchmarks/mutate_terms.py"
            + (f" --only {a.only!r}" if a.only else "")
            + (" --with-digest" if a.with_digest else "")
        )
        Path(a.markdown).write_text(f"`{cmd}` on {date.today().isoformat()}: {summary}.\n\n{text}\n")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
