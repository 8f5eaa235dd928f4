"""RL plans: split the GPUs between trainer and engines, shape the engines, lay out the trainer, rank.

A plan (:class:`PlanChoice`) fixes: colocated or not; the rollout GPUs (whole nodes) and the trainer GPUs; the engine
shape (TP, EP, attention-DP, PP), ``gpu_memory_utilization`` (the KV memory fraction), ``max_num_seqs`` and eager mode
vs CUDA graphs; the trainer backend; the async depth K. :func:`evaluate` predicts its step time and parts;
:func:`enumerate_plans` walks every plan that fits and ranks them.

Generation is simulated (:mod:`rl.simulator`) over the job's response-length distribution with each engine's
per-iteration latency; training and log-probs come from the project's estimate (:mod:`rl.trainer`); refit and switch
from :mod:`rl.refit`; they combine by :mod:`rl.step`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import numpy as np
import numpy.typing as npt

from rl.calibration import DEFAULT_RL_CALIBRATION, RLCalibration
from rl.engine import (
    Engine,
    EngineDataError,
    EngineShape,
    GenerationPrecision,
    LatencyTable,
    NamedEnum,
    aiconfigurator_latency_table,
    weight_bytes_per_param,
)
from rl.layouts import EngineLayout, TrainerLayout
from rl.lengths import LengthDistribution
from rl.refit import refit_s, switch_s
from rl.simulator import RolloutRun, simulate_rollout
from rl.step import StepParts, compose_step
from rl.trainer import TrainerBackend, TrainerPlan, best_trainer, rl_workload, trainer_for_layout
from specs import GIB, Cluster, ModelSpec, Precision, Workload
from specs.errors import TunerError

__all__ = [
    "MAX_ASYNC_STEPS", "Framework", "LatencyProvider", "PlanChoice", "PlanSet", "RLJob", "RLPlan", "check_async_steps",
    "default_latency", "engine_shapes", "enumerate_plans", "evaluate", "evaluate_layouts", "kv_capacity_tokens",
    "layout_trainer", "splits", "trainer_cluster",
]


class Framework(NamedEnum):
    """The RL framework the plan is exported for."""

    nemo_rl = "nemo-rl"
    slime = "slime"


#: ``(job, shape) -> LatencyTable``: where engine latencies come from (aiconfigurator by default; tests pass functions).
LatencyProvider = Callable[["RLJob", EngineShape], LatencyTable]

#: Memory an engine keeps per GPU outside weights and KV cache (bytes): activations of one
#: ``max_num_batched_tokens`` step and the CUDA / NCCL context. vLLM's profile run measures
#: ~1.5-3 GiB for these (``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``).
ENGINE_RESERVE_BYTES = 2.5 * GIB
#: Extra memory for captured CUDA graphs per GPU (vLLM logs 0.5-2 GiB "Graph capturing finished").
CUDA_GRAPH_BYTES = 1.5 * GIB
#: vLLM's KV block size default (``CacheConfig.block_size``).
BLOCK_SIZE = 16

#: Deepest async depth K (steps of off-policyness) a plan search sweeps. NeMo-RL's
#: ``grpo.async_grpo.max_trajectory_age_steps`` defaults to 1 and its recipes use 1-2; the
#: deepest published run (``benchmarks/data/rl_runs.csv``) is 8-off.
MAX_ASYNC_STEPS = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class RLJob:
    """What an RL step does, on which cluster."""

    model: ModelSpec
    cluster: Cluster
    framework: Framework = Framework.nemo_rl
    engine: Engine = Engine.vllm
    prompt_len: int
    """Longest prompt (tokens)."""
    response_len: int
    """Longest response (tokens; ``max_new_tokens`` / ``--rollout-max-response-len``)."""
    mean_prompt_len: float
    responses: LengthDistribution
    prompts_per_step: int
    generations_per_prompt: int
    train_global_batch_size: int = 0
    """Sequences per optimizer step; 0 = every sequence of the step in one optimizer step."""
    logprob_passes: int = 2
    """Forward passes for log-probs per step: the policy's (importance ratio) + the reference's (KL)."""
    max_seq_len: int = 0
    """``max_total_sequence_length``; 0 = prompt_len + response_len."""
    generation_precision: GenerationPrecision = GenerationPrecision.bf16
    """The engines' weight precision (NeMo-RL ``vllm_cfg.precision``)."""
    training_precision: Precision = Precision.bf16
    """The trainer's GEMM precision (NeMo-RL ``megatron_cfg.fp8_cfg``)."""

    def __post_init__(self) -> None:
        for f in ("prompt_len", "response_len", "prompts_per_step", "generations_per_prompt"):
            if getattr(self, f) < 1:
                raise TunerError(f"--{f.replace('_', '-')} {getattr(self, f)}: must be at least 1")
        if not (0 < self.mean_prompt_len <= self.prompt_len):
            raise TunerError(f"--mean-prompt-len {self.mean_prompt_len:g}: must be above 0 and at most --prompt-len "
                             f"{self.prompt_len:,}")
        if self.max_seq_len < 0:
            raise TunerError(f"--max-seq-len {self.max_seq_len}: must be 0 (prompt + response) or longer than "
                             f"--response-len {self.response_len:,}")
        if self.max_seq_len and self.response_len >= self.max_seq_len:
            raise TunerError(
                f"--response-len {self.response_len:,} is not shorter than --max-seq-len {self.max_seq_len:,}: "
                "a response must leave room for its prompt (use a max sequence of at least response + prompt)"
            )
        if self.responses.max > self.response_len:
            raise TunerError(f"the response lengths reach {self.responses.max:,} tokens, above --response-len "
                             f"{self.response_len:,}")
        tgb = self.train_global_batch_size
        if tgb < 0 or (tgb and self.sequences % tgb):
            raise TunerError(f"--train-global-batch {tgb}: must be 0 (all of a step) or a divisor of prompts x "
                             f"generations = {self.sequences}")
        if self.logprob_passes not in (1, 2):
            raise TunerError(
                f"--logprob-passes {self.logprob_passes}: accepted 1 (the policy's log-probs for the importance ratio) "
                "or 2 (and the reference's for KL)"
            )

    @property
    def sequences(self) -> int:
        return self.prompts_per_step * self.generations_per_prompt

    @property
    def workload(self) -> Workload:
        """The trainer's workload of one optimizer step (:func:`~rl.trainer.rl_workload`)."""
        return rl_workload(
            sequences=self.train_sequences, mean_total_len=self.mean_prompt_len + self.responses.mean,
            max_total_len=self.max_total_len, precision=self.training_precision
        )

    @property
    def max_total_len(self) -> int:
        return self.max_seq_len or self.prompt_len + self.response_len

    @property
    def optimizer_steps(self) -> int:
        return self.sequences // self.train_global_batch_size if self.train_global_batch_size else 1

    @property
    def train_sequences(self) -> int:
        return self.train_global_batch_size or self.sequences


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanChoice:
    """Every decision of one plan."""

    colocated: bool
    rollout_gpus: int
    trainer_gpus: int
    shape: EngineShape
    gpu_memory_utilization: float
    max_num_seqs: int
    enforce_eager: bool
    async_steps: int = 0
    trainer_backend: TrainerBackend = TrainerBackend.megatron
    engine: Engine = Engine.vllm

    @property
    def num_engines(self) -> int:
        return self.rollout_gpus // self.shape.gpus


@dataclass(frozen=True, kw_only=True, slots=True)
class RLPlan:
    """A plan with its prediction."""

    choice: PlanChoice
    trainer: TrainerPlan
    parts: StepParts
    kv_capacity_tokens: int
    preemptions: int
    notes: tuple[str, ...] = ()

    @property
    def step_time_s(self) -> float:
        return self.parts.step_time_s

    @property
    def rollout_label(self) -> str:
        """The engine layout as ``validate`` CSVs write it (``vllm:tp=16,ep=16,pp=1``)."""
        return f"{self.choice.engine}:{self.choice.shape.label}"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSet:
    """What :func:`enumerate_plans` found."""

    plans: list[RLPlan]
    """Every evaluated plan, fastest first."""
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    """Why candidates were set aside (reason -> count)."""

    def _fastest_by(self, key: Callable[[PlanChoice], Any]) -> list[RLPlan]:
        best: dict[Any, RLPlan] = {}
        for p in self.plans:  # fastest first: the first of each key is its fastest
            best.setdefault(key(p.choice), p)
        return [best[k] for k in sorted(best)]

    def fastest_per_rollout_gpus(self) -> list[RLPlan]:
        """The fastest plan per rollout-GPU count (colocated plans at the full count, marked colocated).

        Not a Pareto front: a smaller count can be faster than every larger one (more rollout GPUs
        leave fewer to the trainer), and all its rows are kept."""
        return self._fastest_by(lambda c: (c.colocated, c.rollout_gpus))

    def fastest_per_async_depth(self) -> list[RLPlan]:
        """The fastest plan per async depth K (every depth kept, as for :meth:`fastest_per_rollout_gpus`)."""
        return self._fastest_by(lambda c: c.async_steps)


def check_async_steps(async_steps: int) -> None:
    """Check an async depth K: 0..:data:`MAX_ASYNC_STEPS`.

    Raises TunerError: K out of range."""
    if not 0 <= async_steps <= MAX_ASYNC_STEPS:
        raise TunerError(
            f"--async-steps {async_steps}: accepted 0..{MAX_ASYNC_STEPS} (steps of off-policyness; "
            f"NeMo-RL's max_trajectory_age_steps defaults to 1)"
        )


# --------------------------------------------------------------------------- memory of an engine


def _expert_params(model: ModelSpec) -> float:
    if not model.is_moe:
        return 0.0
    return float(model.num_moe_layers * model.num_experts * 3 * model.hidden_size * model.moe_ffn_hidden_size)


def engine_weight_bytes(model: ModelSpec, shape: EngineShape,
                        bytes_per_param: tuple[float, float] = (2.0, 2.0)) -> float:
    """Weight bytes per GPU of one engine (``bytes_per_param`` = (dense, expert); BF16 by default,
    :func:`~rl.engine.weight_bytes_per_param` for others).

    Experts are sharded over all the engine's ``tp * attention_dp`` ranks (EP x expert-TP);
    the other weights over ``tp * pp`` and replicated on each attention-DP rank.
    """
    experts = _expert_params(model)
    dense = model.total_params() - experts
    return (bytes_per_param[0] * dense / (shape.tp * shape.pp)
            + bytes_per_param[1] * experts / (shape.tp * shape.attention_dp * shape.pp))


def kv_bytes_per_token(model: ModelSpec, shape: EngineShape) -> float:
    """KV-cache bytes one token takes in one engine (all its GPUs; bf16).

    GQA: ``2 (K and V) x layers x kv_channels x 2 bytes x max(query_groups, tp)``: the heads are split over TP ranks,
    and replicated when TP exceeds them (vLLM ``get_num_kv_heads``). MLA (DeepSeek): the compressed latent
    ``kv_lora_rank + qk_pos_emb_head_dim`` per layer, cached on every TP rank (vLLM ``MLACommonImpl``).
    """
    if model.kv_lora_rank:
        per_layer = (model.kv_lora_rank + model.qk_pos_emb_head_dim) * 2.0 * shape.tp
    else:
        per_layer = 2.0 * model.kv_channels * 2.0 * max(model.num_query_groups, shape.tp)
    return per_layer * model.num_layers


def kv_capacity_tokens(model: ModelSpec, cluster: Cluster, shape: EngineShape, gpu_memory_utilization: float,
                       enforce_eager: bool, bytes_per_param: tuple[float, float] = (2.0, 2.0)) -> int:
    """Tokens the engine's KV cache holds: ``(utilization x HBM - weights - reserve) x GPUs / bytes per token``; 0 when
    the weights do not fit."""
    weights = engine_weight_bytes(model, shape, bytes_per_param)
    per_gpu = gpu_memory_utilization * cluster.gpu.hbm_bytes - weights - ENGINE_RESERVE_BYTES
    if not enforce_eager:
        per_gpu -= CUDA_GRAPH_BYTES
    if per_gpu <= 0:
        return 0
    return int(per_gpu * shape.gpus / kv_bytes_per_token(model, shape))


# --------------------------------------------------------------------------- requests and generation


def _requests(job: RLJob, steps: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Prompt and response lengths of ``steps`` consecutive steps (shape ``(steps * sequences,)``)."""
    prompts_n = job.prompts_per_step * steps
    if job.mean_prompt_len >= job.prompt_len:
        prompt = np.full(prompts_n, job.prompt_len, dtype=np.int64)
    else:
        prompt = LengthDistribution.from_mean_max(job.mean_prompt_len, job.prompt_len,
                                                  names=("--mean-prompt-len", "--prompt-len")).draw(prompts_n, seed=1)
    prompt = np.repeat(prompt, job.generations_per_prompt)
    resp = job.responses.draw(job.sequences * steps, seed=2)
    return prompt, resp


def default_latency(job: RLJob, shape: EngineShape) -> LatencyTable:
    """aiconfigurator's latency table for the job's model, GPU and engine at ``shape``."""
    return aiconfigurator_latency_table(job.model.name, job.cluster.gpu.name, job.engine, shape,
                                        max_ctx=job.max_total_len, precision=job.generation_precision)


class _Generation:
    """Memoised rollout simulations of one job: latency tables per shape, request lengths per step count, runs per
    configuration."""

    def __init__(self, job: RLJob, provider: LatencyProvider) -> None:
        self.job = job
        self.table: Callable[[EngineShape], LatencyTable] = lru_cache(maxsize=None)(partial(provider, job))
        self.requests = lru_cache(maxsize=None)(partial(_requests, job))
        self.run = lru_cache(maxsize=None)(self._run)

    def _run(self, shape: EngineShape, engines: int, kv: int, max_seqs: int, steps: int) -> RolloutRun:
        p, r = self.requests(steps)
        return simulate_rollout(p, r, self.table(shape), num_engines=engines, kv_capacity_tokens=kv,
                                max_num_seqs=max_seqs, block_size=BLOCK_SIZE)


# --------------------------------------------------------------------------- one plan


def _model_bytes(model: ModelSpec, bytes_per_param: tuple[float, float] = (2.0, 2.0)) -> float:
    experts = _expert_params(model)
    return bytes_per_param[0] * (model.total_params() - experts) + bytes_per_param[1] * experts


def evaluate(job: RLJob, choice: PlanChoice, *, trainer: TrainerPlan,
             calibration: RLCalibration = DEFAULT_RL_CALIBRATION, latency: LatencyProvider = default_latency,
             _gen: _Generation | None = None) -> RLPlan:
    """Predict one plan's step time and parts; ``trainer`` is the layout on ``choice.trainer_gpus`` GPUs
    (:func:`~rl.trainer.best_trainer` or :func:`~rl.trainer.trainer_for_layout`), its times before calibration.

    Raises TunerError: an engine whose weights do not fit, a request longer than the KV cache, or an engine count that
    does not tile the rollout GPUs."""
    gen = _gen or _Generation(job, latency)
    shape = choice.shape
    if choice.rollout_gpus % shape.gpus or choice.num_engines < 1:
        raise TunerError(f"{choice.rollout_gpus} rollout GPUs are not a whole number of {shape.gpus}-GPU engines "
                         f"({shape.label})")
    wbytes = weight_bytes_per_param(job.model.name, job.generation_precision)
    kv = kv_capacity_tokens(job.model, job.cluster, shape, choice.gpu_memory_utilization, choice.enforce_eager, wbytes)
    if kv <= 0:
        raise TunerError(
            f"engine {shape.label}: {job.model.name}'s weights "
            f"({engine_weight_bytes(job.model, shape, wbytes) / GIB:.1f} GiB per GPU) do not fit in "
            f"gpu_memory_utilization {choice.gpu_memory_utilization:g} of {job.cluster.gpu.hbm_bytes / GIB:.0f} GiB; "
            "use more GPUs per engine"
        )
    steps = choice.async_steps + 1
    run = gen.run(shape, choice.num_engines, kv, choice.max_num_seqs, steps)
    scale = calibration.generation_scale * (calibration.eager_slowdown if choice.enforce_eager else 1.0)
    generation = run.makespan_s * scale / steps
    # the trainer sends BF16 weights; an FP8 engine quantises them on arrival (NeMo-RL's FP8 generation)
    refit = refit_s(model_bytes=_model_bytes(job.model), colocated=choice.colocated, engine_gpus=shape.gpus,
                    gpus_per_node=job.cluster.gpus_per_node, inter_node_bytes_per_s=job.cluster.inter_node_bytes_per_s,
                    calibration=calibration)
    switch = 0.0 if not choice.colocated else switch_s(
        trainer_bytes_per_gpu=trainer.optimizer_bytes + trainer.weights_bytes,
        engine_bytes_per_gpu=engine_weight_bytes(job.model, shape, wbytes),
        pcie_bytes_per_s=job.cluster.gpu.pcie_bytes_per_s, calibration=calibration)
    parts = compose_step(generation_s=generation, logprob_s=trainer.logprob_s * calibration.logprob_scale,
                         training_s=trainer.train_s * calibration.training_scale, refit_s=refit, switch_s=switch,
                         overhead_s=calibration.step_overhead_s, colocated=choice.colocated,
                         async_steps=choice.async_steps)
    notes = []
    if run.preemptions:
        notes.append(f"{run.preemptions} preemptions (KV cache full)")
    if not trainer.in_validated_scope:
        notes.append(trainer.note)
    return RLPlan(choice=choice, trainer=trainer, parts=parts, kv_capacity_tokens=kv, preemptions=run.preemptions,
                  notes=tuple(notes))


#: vLLM V1's ``max_num_seqs`` default on GPUs with >= 70 GiB (``vllm/engine/arg_utils.py``,
#: ``_set_default_args``); NeMo-RL's performance recipes leave it unset.
DEFAULT_MAX_NUM_SEQS = 1024


def evaluate_layouts(job: RLJob, engines: EngineLayout, trainer: TrainerLayout, *, colocated: bool, rollout_gpus: int,
                     trainer_gpus: int, async_steps: int, calibration: RLCalibration = DEFAULT_RL_CALIBRATION,
                     latency: LatencyProvider = default_latency) -> RLPlan:
    """:func:`evaluate` a run of given layouts (a measured one); engine settings it leaves out take NeMo-RL's defaults
    (``gpu_memory_utilization`` 0.6 colocated, 0.8 split; :data:`DEFAULT_MAX_NUM_SEQS`; CUDA graphs).

    Raises TunerError: as :func:`layout_trainer` and :func:`evaluate`."""
    tr = layout_trainer(job, trainer_gpus, trainer)
    choice = PlanChoice(
        colocated=colocated, rollout_gpus=rollout_gpus, trainer_gpus=trainer_gpus, shape=engines.shape,
        gpu_memory_utilization=engines.gpu_memory_utilization or (0.6 if colocated else 0.8),
        max_num_seqs=engines.max_num_seqs or DEFAULT_MAX_NUM_SEQS, enforce_eager=bool(engines.enforce_eager),
        async_steps=async_steps, trainer_backend=trainer.backend, engine=engines.engine,
    )
    return evaluate(job, choice, trainer=tr, calibration=calibration, latency=latency)


# --------------------------------------------------------------------------- enumeration


def engine_shapes(job: RLJob, rollout_gpus: int, *, tp: Iterable[int] | None = None,
                  ep: Iterable[int] | None = None) -> list[EngineShape]:
    """Engine shapes that tile ``rollout_gpus`` whole: TP in powers of two; EP 1 or TP for MoE, and attention-DP ranks
    (EP = TP x DP) for MoE models with few KV heads. An engine's GPUs divide a node or are whole nodes."""
    per_node = job.cluster.gpus_per_node
    tps = list(tp) if tp is not None else [2**i for i in range(0, 8) if 2**i <= rollout_gpus]
    shapes: list[EngineShape] = []
    for t in tps:
        eps = list(ep) if ep is not None else ([1, t] if job.model.is_moe and t > 1 else [1])
        for e in eps:
            if e < t:
                if t % e:
                    continue
                shapes.append(EngineShape(tp=t, ep=e))
            else:
                if e % t:
                    continue
                shapes.append(EngineShape(tp=t, ep=e, attention_dp=e // t))
        if ep is None and job.model.is_moe and t <= 2:
            for d in (8 // t, 16 // t):
                if t * d <= rollout_gpus:
                    shapes.append(EngineShape(tp=t, ep=t * d, attention_dp=d))
    out = []
    for s in dict.fromkeys(shapes):
        g = s.gpus
        if g > rollout_gpus or rollout_gpus % g:
            continue
        if (g < per_node and per_node % g) or (g > per_node and g % per_node):
            continue
        out.append(s)
    return out


def enumerate_plans(job: RLJob, *, calibration: RLCalibration = DEFAULT_RL_CALIBRATION,
                    latency: LatencyProvider = default_latency,
                    backends: Iterable[TrainerBackend] = (TrainerBackend.megatron,), async_steps: int = 0,
                    colocated: bool | None = None, rollout_gpus: Iterable[int] | None = None,
                    engine_tp: Iterable[int] | None = None, engine_ep: Iterable[int] | None = None,
                    gpu_memory_utilization: Iterable[float] | None = None, max_num_seqs: Iterable[int] = (256, 1024),
                    enforce_eager: Iterable[bool] = (False, True),
                    trainer_layout: TrainerLayout | None = None) -> PlanSet:
    """Every plan that fits, ranked by predicted step time. Splits are whole nodes on both sides; ``async_steps`` = K
    evaluates every split at each depth 0..K; constraints narrow the search (None = all); ``trainer_layout`` fixes the
    trainer's layout (and backend) instead of searching it.

    Raises TunerError: constraints that leave no plan (the reasons counted), rollout GPUs that are not whole nodes or
    exceed the cluster, or K out of :func:`check_async_steps`'s range. Raises EngineDataError: no engine data for the
    job's model, GPU or precision, or aiconfigurator not installed (the accepted ones or the extra named)."""
    check_async_steps(async_steps)
    cl = job.cluster
    gen = _Generation(job, latency)
    trainers: dict[tuple[int, TrainerBackend], TrainerPlan | None] = {}
    rejected: dict[str, int] = {}
    example: dict[str, str] = {}  # reason -> the first full message it stands for
    considered = 0
    plans: list[RLPlan] = []
    utils_default = {True: (0.6, 0.8), False: (0.8, 0.9)}
    if trainer_layout is not None:
        backends = (trainer_layout.backend,)
    for is_coloc, r_gpus in splits(cl, colocated, rollout_gpus):
        t_gpus = cl.num_gpus if is_coloc else cl.num_gpus - r_gpus
        for backend in backends:
            trainer = _trainer_on(job, t_gpus, backend, trainer_layout, trainers)
            if trainer is None:
                key = f"no {backend} trainer layout fits the split's trainer GPUs (splits)"
                rejected[key] = rejected.get(key, 0) + 1
                continue
            for shape in engine_shapes(job, r_gpus, tp=engine_tp, ep=engine_ep):
                for util in gpu_memory_utilization or utils_default[is_coloc]:
                    for seqs in max_num_seqs:
                        for eager in enforce_eager:
                            for k in range(0, 1 if is_coloc else async_steps + 1):
                                considered += 1
                                choice = PlanChoice(
                                    colocated=is_coloc, rollout_gpus=r_gpus, trainer_gpus=t_gpus, shape=shape,
                                    gpu_memory_utilization=util, max_num_seqs=seqs, enforce_eager=eager, async_steps=k,
                                    trainer_backend=backend, engine=job.engine)
                                try:
                                    plans.append(evaluate(job, choice, trainer=trainer, calibration=calibration,
                                                          latency=latency, _gen=gen))
                                except EngineDataError:
                                    raise  # no shape can be timed: say so, not "no plan fits"
                                except TunerError as e:
                                    reason = _reason(str(e))
                                    rejected[reason] = rejected.get(reason, 0) + 1
                                    if reason != str(e):
                                        example.setdefault(reason, str(e))
    if not plans:
        why = "; ".join(_count(k, v, example) for k,
                        v in rejected.items()) or "no split, engine shape or trainer layout to try"
        raise TunerError(f"no RL plan fits {job.model.name} on {cl.label}: {why}")
    plans.sort(key=lambda p: p.step_time_s)
    return PlanSet(plans=plans, considered=considered, rejected=rejected)


def trainer_cluster(cl: Cluster, n: int) -> Cluster:
    """``n`` GPUs of ``cl``: the trainer's side of a split."""
    return Cluster(gpu=cl.gpu, num_gpus=n, gpus_per_node=min(cl.gpus_per_node, n),
                   inter_node_bytes_per_s=cl.inter_node_bytes_per_s, usd_per_gpu_hour=cl.usd_per_gpu_hour)


def layout_trainer(job: RLJob, n: int, t: TrainerLayout) -> TrainerPlan:
    """The trainer layout ``t`` on ``n`` GPUs of the job's cluster.

    Raises TunerError: a layout that breaks a Megatron rule (the rule named)."""
    return trainer_for_layout(job.model, trainer_cluster(job.cluster, n), job.workload, t.backend, tp=t.tp, cp=t.cp,
                              ep=t.ep, pp=t.pp, vpp=t.vpp, optimizer_steps=job.optimizer_steps,
                              logprob_passes=job.logprob_passes)


def _trainer_on(job: RLJob, n: int, backend: TrainerBackend, trainer_layout: TrainerLayout | None,
                cache: dict[tuple[int, TrainerBackend], TrainerPlan | None]) -> TrainerPlan | None:
    """The trainer's plan on ``n`` GPUs of the job's cluster: ``trainer_layout`` when given (None when it does not
    fit), else the best layout of ``backend`` (None when none fits); kept in ``cache`` by ``(n, backend)``."""
    key = (n, backend)
    if key not in cache:
        if trainer_layout is None:
            cache[key] = best_trainer(job.model, trainer_cluster(job.cluster, n), job.workload, backend,
                                      optimizer_steps=job.optimizer_steps, logprob_passes=job.logprob_passes)
        else:
            try:
                cache[key] = layout_trainer(job, n, trainer_layout)
            except TunerError:
                cache[key] = None
    return cache[key]


def splits(cl: Cluster, colocated: bool | None, rollout_gpus: Iterable[int] | None) -> list[tuple[bool, int]]:
    """The ``(colocated, rollout GPUs)`` splits to try: all GPUs colocated, and every whole-node split (or those of
    ``rollout_gpus``) that leaves the trainer a node.

    Raises TunerError: rollout GPUs that are not whole nodes or leave no trainer GPU; non-colocated on one node."""
    n, per = cl.num_gpus, cl.gpus_per_node
    if colocated is False and cl.num_nodes == 1:
        raise TunerError(f"--no-colocated: a split needs at least two nodes; --gpus {cl.label} has one (use "
                         "--colocated)")
    wanted = None if rollout_gpus is None else set(rollout_gpus)
    for g in sorted(wanted or ()):
        if g >= n or g < 1 or g % per:
            why = (f"{cl.label} has {n} GPUs and the trainer needs at least one node" if g >= n
                   else "rollout GPUs are whole nodes")
            accepted = (f"a multiple of {per} from {per} to {n - per}" if cl.num_nodes > 1
                        else "none: a split needs at least two nodes (use --colocated)")
            raise TunerError(f"--rollout-gpus {g}: {why}; accepted: {accepted}")
    out = [(True, n)] if colocated in (None, True) else []
    if colocated in (None, False):
        out += [(False, r) for r in range(per, n, per) if wanted is None or r in wanted]
    return out


def _count(k: str, v: int, example: dict[str, str]) -> str:
    """One rejection reason with its count, for the message when no plan fits."""
    if k.endswith(" (splits)"):
        return f"{k.removesuffix(' (splits)')} ({v} split{'s' if v != 1 else ''})"
    return f"{k} ({v} candidates" + (f"; the first: {example[k]}" if k == _NO_DATA and k in example else "") + ")"


def _reason(message: str) -> str:
    """A short reason for a rejected candidate, for the counts printed with the plans."""
    if "do not fit" in message or "does not fit" in message:
        return "engine weights or a request do not fit the engine's memory"
    if "has no" in message and "data" in message:
        return _NO_DATA
    return message


_NO_DATA = "aiconfigurator has no data for the engine shape"

