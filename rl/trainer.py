"""The trainer side of an RL step: its layout under the RL batch, training time and log-prob time.

Backends: ``megatron`` (slime; NeMo-RL ``policy.megatron_cfg``): :func:`search_spaces.enumerate_layouts` over
:data:`MEGATRON_RL_SPACE`, estimated by :func:`cost_model.estimate_table`, the fastest that fits. ``automodel``
(NeMo-RL's DTensor backend, FSDP2 with CP and EP meshes): the same estimate at ``tp = pp = 1`` with
``use_megatron_fsdp`` (states sharded over DP), full activation checkpointing and BF16 Adam moments; FSDP2's collectives
are modelled as Megatron-FSDP's, AutoModel's HybridEP as ``flex+hybridep``. Its **validated scope** for MiniMax-M3
(NeMo-RL ``docs/guides/models/minimax/minimax-m3.md``) is CP 8 + EP 128 on 32 x 8 GPUs at 8,192 tokens; other layouts
are marked outside it.

The RL batch: ``prompts x generations`` sequences of mean length per step, rounded up to a multiple of 256 tokens (``seq
% (2 cp) == 0``, ``seq % tp == 0``), packed without padding. Log-prob passes are forward only: ``passes x (compute -
recompute + tp + cp + ep) / 3`` of the training parts (Narayanan et al. 2021, Eq. 2) plus a third of the training
bubble; the policy's pass always, the reference's with the KL penalty."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from cost_model.calibration import DEFAULT_CALIBRATION
from cost_model.estimate import estimate_table
from rl.engine import NamedEnum
from search_spaces.rules import check_layout, check_table
from search_spaces.space import SearchSpace, enumerate_layouts
from specs import (
    Cluster,
    Dispatcher,
    Layout,
    LayoutTable,
    ModelSpec,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    RunOptions,
    Workload,
)
from specs.errors import TunerError
from specs.units import DEFAULT_MEMORY_HEADROOM

__all__ = [
    "AUTOMODEL_RL_SPACE", "AUTOMODEL_VALIDATED", "MEGATRON_RL_SPACE", "TrainerBackend", "TrainerPlan", "best_trainer",
    "rl_workload", "trainer_for_layout",
]


class TrainerBackend(NamedEnum):
    """The training stack."""

    megatron = "megatron"
    automodel = "automodel"


#: The Megatron search space for RL trainers: NeMo-RL's performance recipes use full
#: activation checkpointing (``activation_checkpointing: true`` = ``--recompute-granularity
#: full --recompute-method uniform --recompute-num-layers 1``), no interleaving, ETP 1, the
#: alltoall dispatcher; slime's MiniMax-M2 script the same plus optimizer offload.
MEGATRON_RL_SPACE: dict[str, Any] = {
    "tp": [1, 2, 4, 8],
    "pp": [1, 2, 4, 8, 16],
    "vpp": [1],
    "cp": [1, 2, 4],
    "ep": [1, 2, 4, 8, 16, 32, 64],
    "etp": [1],
    "micro_batch_size": [1],
    "recompute": [{"granularity": "full", "method": "uniform", "num_layers": 1}, {"granularity": "none"}],
    "optimizer_offload_fraction": [0.0],
    "dispatcher": ["alltoall"],
    "pipeline_split": {"even": True, "max_stage_deficit": 1},
    "exp_avg_dtype": ["fp32"],
    "exp_avg_sq_dtype": ["fp32"],
}

#: The AutoModel / DTensor space: FSDP2 with CP and EP only (tp = pp = 1), full activation
#: checkpointing, HybridEP, BF16 moments (the seed's recipe).
AUTOMODEL_RL_SPACE: dict[str, Any] = {
    **MEGATRON_RL_SPACE,
    "tp": [1],
    "pp": [1],
    "cp": [1, 2, 4, 8],
    "ep": [1, 2, 4, 8, 16, 32, 64, 128, 256],
    "recompute": [{"granularity": "full", "method": "uniform", "num_layers": 1}],
    "dispatcher": ["flex+hybridep"],
    "pipeline_split": {"even": True, "max_stage_deficit": 0},
    "exp_avg_dtype": ["bf16"],
    "exp_avg_sq_dtype": ["bf16"],
}

#: AutoModel layouts NeMo-RL has validated, per model (``docs/guides/models/minimax/minimax-m3.md``).
AUTOMODEL_VALIDATED: dict[str, tuple[tuple[int, int], ...]] = {"MiniMax-M3": ((8, 128),)}

_AUTOMODEL_OPTIONS = RunOptions(use_megatron_fsdp=True, overlap_grad_reduce=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerPlan:
    """A trainer layout with its predicted times for one RL step (seconds) and memory (bytes)."""

    backend: TrainerBackend
    layout: Layout
    gpus: int
    train_s: float
    """Optimizer steps of one RL step (forward + backward + optimizer)."""
    logprob_s: float
    """All log-prob passes of one RL step (forward only)."""
    logprob_passes: int
    peak_bytes: float
    usable_bytes: float
    optimizer_bytes: float
    """Optimizer-state bytes per GPU (moved to the host and back when colocated)."""
    weights_bytes: float
    """Parameter bytes per GPU."""
    in_validated_scope: bool
    note: str = ""

    @property
    def label(self) -> str:
        """The layout as ``validate`` CSVs write it (``megatron:tp=2,cp=2,ep=16,pp=8,vpp=1``,
        ``automodel:cp=8,ep=128``)."""
        return _label(self.backend, self.layout)


def _label(backend: TrainerBackend, lay: Layout) -> str:
    if backend == TrainerBackend.automodel:
        return f"automodel:cp={lay.cp},ep={lay.ep}"
    return f"megatron:tp={lay.tp},cp={lay.cp},ep={lay.ep},pp={lay.pp},vpp={lay.vpp}"


def rl_workload(*, sequences: int, mean_total_len: float, max_total_len: int,
                precision: Precision = Precision.bf16) -> Workload:
    """The training workload of one RL step: ``sequences`` rows (NeMo-RL ``train_global_batch_size``) of the mean
    length, capped at ``max_total_len``; ``precision`` the training GEMMs' (``fp8_recipe: blockwise`` is
    :attr:`specs.Precision.fp8_blockwise`).

    Raises TunerError: non-positive sizes."""
    if sequences < 1 or mean_total_len <= 0:
        raise TunerError(f"an RL step needs sequences >= 1 and a positive mean length, got {sequences}, "
                         f"{mean_total_len:g}")
    seq = int(min(math.ceil(mean_total_len / 256) * 256, math.ceil(max_total_len / 256) * 256))
    return Workload(seq_length=max(seq, 256), global_batch_size=sequences,
                    dataset="RL rollouts (mean prompt + response)", precision=precision)


@lru_cache(maxsize=4)
def _space(backend: TrainerBackend) -> SearchSpace:
    d = AUTOMODEL_RL_SPACE if backend == TrainerBackend.automodel else MEGATRON_RL_SPACE
    return SearchSpace.from_dict(d, source=f"the {backend} RL trainer space")


def _logprob_s(t: dict[str, np.ndarray], passes: int) -> np.ndarray:
    fwd = (t["compute"] - t["recompute"] + t["tp_comm"] + t["cp_comm"] + t["ep_comm"]) / 3.0 + t["pp_bubble"] / 3.0
    return np.asarray(passes * fwd, dtype=float)


def _plans(model: ModelSpec, cluster: Cluster, workload: Workload, table: LayoutTable, backend: TrainerBackend, *,
           optimizer_steps: int, logprob_passes: int, memory_headroom: float) -> list[TrainerPlan]:
    opts = _AUTOMODEL_OPTIONS if backend == TrainerBackend.automodel else RunOptions()
    est = estimate_table(model, cluster, workload, table, calibration=DEFAULT_CALIBRATION,
                         memory_headroom=memory_headroom, options=opts)
    lp = _logprob_s(est.time, logprob_passes)
    validated = AUTOMODEL_VALIDATED.get(model.name, ())
    out = []
    for i in range(len(table)):
        lay = table.row(i)
        scope = backend != TrainerBackend.automodel or not validated or (lay.cp, lay.ep) in validated
        out.append(TrainerPlan(
            backend=backend, layout=lay, gpus=cluster.num_gpus, train_s=float(est.step_time_s[i]) * optimizer_steps,
            logprob_s=float(lp[i]) * optimizer_steps, logprob_passes=logprob_passes,
            peak_bytes=float(est.peak_bytes[i]), usable_bytes=est.usable_bytes,
            optimizer_bytes=float(est.memory["optimizer"][i]), weights_bytes=float(est.memory["weights"][i]),
            in_validated_scope=scope,
            note="" if scope else ("outside AutoModel's validated scope (run with "
                                   + ", ".join(f"CP {c} x EP {e}" for c, e in validated)
                                   + ": other CP/EP pairs are not known to run)"),
        ))
    return out


def best_trainer(model: ModelSpec, cluster: Cluster, workload: Workload, backend: TrainerBackend, *,
                 optimizer_steps: int = 1, logprob_passes: int = 2) -> TrainerPlan | None:
    """The fastest (training + log-prob) trainer layout on ``cluster`` that fits the RL workload; None when none fits. A
    layout outside the backend's validated scope wins only when it is faster than every validated one.

    Raises TunerError: from the enumeration (a cluster size it cannot use)."""
    enum = enumerate_layouts(_space(backend), model, cluster.num_gpus, workload)
    if len(enum.valid) == 0:
        return None
    plans = _plans(model, cluster, workload, enum.valid, backend, optimizer_steps=optimizer_steps,
                   logprob_passes=logprob_passes, memory_headroom=DEFAULT_MEMORY_HEADROOM)
    fits = [p for p in plans if p.peak_bytes <= p.usable_bytes]
    return min(fits, key=lambda p: (p.train_s + p.logprob_s, not p.in_validated_scope), default=None)


def trainer_for_layout(model: ModelSpec, cluster: Cluster, workload: Workload, backend: TrainerBackend, *, tp: int = 1,
                       cp: int = 1, ep: int = 1, pp: int = 1, vpp: int = 1, optimizer_steps: int = 1,
                       logprob_passes: int = 2) -> TrainerPlan:
    """Predict one given trainer layout (a published run's, or the user's).

    Uneven first / last pipeline stages are tried when the even split breaks a rule
    (Qwen3-235B's 94 layers on pp 8 run as 11 + 6 x 12 + 11 in NeMo-RL's recipe).

    Raises TunerError: a layout that breaks a Megatron rule (the rule named)."""
    auto = backend == TrainerBackend.automodel
    base = Layout(
        world_size=cluster.num_gpus, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sequence_parallel=tp > 1,
        recompute_granularity=RecomputeGranularity.full, recompute_method=RecomputeMethod.uniform,
        recompute_num_layers=1, dispatcher=Dispatcher.flex_hybridep if auto else Dispatcher.alltoall,
        exp_avg_dtype="bf16" if auto else "fp32", exp_avg_sq_dtype="bf16" if auto else "fp32",
    )
    candidates = [base]
    if pp > 1 and model.num_layers % pp:
        per = math.ceil(model.num_layers / pp)
        for d in range(0, per):
            rest = model.num_layers - (pp - 2) * per
            first = rest // 2 - d
            last = rest - first
            if first >= 1 and last >= 1:
                candidates.append(Layout.from_dict({**base.to_dict(), "num_layers_in_first_pipeline_stage": first,
                                                    "num_layers_in_last_pipeline_stage": last}))
    table = LayoutTable.from_layouts(candidates)
    ok, _ = check_table(table, model, workload)
    good = np.flatnonzero(ok)
    if len(good) == 0:
        broken = "; ".join(f"{rid}: {why}" for rid, why in check_layout(base, model, workload))
        raise TunerError(f"trainer layout {_label(backend, base)} on {cluster.num_gpus} GPUs breaks a Megatron rule "
                         f"({broken})")
    plans = _plans(model, cluster, workload, table.select(good), backend, optimizer_steps=optimizer_steps,
                   logprob_passes=logprob_passes, memory_headroom=0.0)
    return min(plans, key=lambda p: p.train_s)

