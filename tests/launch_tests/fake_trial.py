"""A stand-in for a trial program: no GPU, no torch. It plays either the trial harness
(``torchrun ... -m launch.harness.train --spec S --out O``: the same JSON lines) or a user's
slime / Megatron-LM launch command (Megatron's log lines on stdout), for every backend's tests.

Settings come from FAKE_* environment variables, or from ``--FAKE_NAME=value`` arguments anywhere
on its command line (they win; a Ray node or a launch template gets them that way):

- FAKE_FORMAT: ``harness`` (default; needs ``--spec`` and ``--out``) or ``megatron``
  (FAKE_STEPS iterations, default 4, printed as Megatron's ``training_log`` and ``report_memory``
  print them; the same step times, peak 90 GiB reserved and 80 GiB allocated as the harness's lines);
- FAKE_TRIAL_MODE: ``ok`` (default: every step, then the summary); ``oom`` (two steps, then
  out of memory: the harness's report of rank 1 at 150 GiB, exit 3, or PyTorch's message at
  138.5 GiB in the log, exit 1); ``oom_text`` (harness: PyTorch's message only, exit 1);
  ``crash`` (harness: an error line, exit 1; megatron: a traceback after two iterations, exit 7);
  ``nccl`` (an NCCL error, exit 1); ``silent`` (exits 0 without a step); ``hang`` (FAKE_HANG_AFTER
  steps, default 1, then it starts a child and both sleep: the whole group must be killed;
  with FAKE_HANG_ATTEMPT=A only the Ray attempt A hangs, the others run ok);
- FAKE_STEP_S: seconds each step sleeps (default 0.01), or per tensor-parallel size
  FAKE_STEP_S_TP<n>, or FAKE_FAST_STEP_S for the layouts that match FAKE_FAST_IF ("field=value,...");
  FAKE_REPORT_STEP_S: a step time to report instead of the one slept; else the harness format reports the step slept
  FAKE_REPORT_SCALE times longer (default 100: a real step of these slices takes seconds, and a throughput above the
  GPU's peak is refused as implausible);
  FAKE_TAIL: ``N:S``; the steps after step N of the layouts that do not match FAKE_FAST_IF sleep S seconds
  (a trial to be stopped after step N is still running when its reader falls behind on a loaded machine);
- FAKE_PID_DIR: a folder; each process of the fake creates ``fake.<pid>`` there at its start, and
  ``child.<pid>`` for the child of ``hang`` (:func:`recorded_pids`, :func:`survivors`);
- FAKE_ENV_DUMP: a folder; each process writes ``<trial>.node<N>.attempt<A>.json`` there (its
  argv, pid, ``--out`` and some environment variables), ``<trial>`` the folder of ``--out`` ("run" without);
- FAKE_BARRIER: ``DIR:N``; each process adds itself to DIR and waits until N processes have, then
  goes on (at most 60 s, then it fails: exit 1); trials that finish ran at the same time.

For ``tune verify`` (spec ``data: corpus``) it also plays the checkpoint: ``save_checkpoint``
writes ``init.json`` there (a value drawn from the spec's seed); ``load_checkpoint`` reads it
and fails (exit 1) when it is not there. The loss curve then starts from that value and falls
the same way for every layout (to within FAKE_LAYOUT_NOISE, relative, times the layout's TP),
so two arms agree only when they loaded the same checkpoint; ``fault`` bends the curve, and
FAKE_LOSS_MODE=nan / missing puts a NaN at step 4 / leaves out step 4.

Gradient parity (spec ``dump_grads``): it writes a gradient dump in the harness's format (``index.json`` and one
``.npy`` per tensor, :mod:`launch.harness.grads`): four small tensors drawn from the loaded checkpoint's value, times
``1 + FAKE_GRAD_NOISE x (micro-batch size + 1 for allgather)`` (a layout's legitimate rounding), plus a per-run jitter
of FAKE_GRAD_RUN_NOISE (two runs of one layout differ by it); ``norm_grad_scaled`` doubles the q_layernorm
gradient, ``non_causal_attention`` bends every tensor; FAKE_GRAD_MODE=nan / missing / shape breaks one tensor.
The checkpoint it writes carries ``model.json`` (the model's fingerprint) as the harness's does.

Profiling (spec ``profile_step``): that step's line carries ``"profiled": true``, and before the summary it writes one
small Chrome trace per pipeline stage beside ``--out`` (``profile_step<N>_pp<r>.json``, as the harness's torch.profiler
export is named) and the ``{"event": "profile", "step", "files"}`` line.

Imported (by the tests), it gives the observers of those files: :func:`recorded_pids`,
:func:`alive`, :func:`survivors` and :func:`wait_until`.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

GIB = 2**30
FAKE = os.path.abspath(__file__)


def _settings(args):
    """The FAKE_* settings: the environment, overridden by ``--FAKE_NAME=value`` arguments."""
    cfg = {k: v for k, v in os.environ.items() if k.startswith("FAKE_")}
    for a in args:
        if a.startswith("--FAKE_") and "=" in a:
            k, _, v = a[2:].partition("=")
            cfg[k] = v
    return cfg


def _touch(folder, name):
    os.makedirs(folder, exist_ok=True)
    Path(folder, name).touch()


def _hang(pid_dir):
    """Start a child that sleeps 600 s (in this process's group: only a kill of the whole group ends it) and record
    it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if pid_dir:
        _touch(pid_dir, f"child.{child.pid}")


def _barrier(spec):
    folder, _, n = spec.rpartition(":")
    _touch(folder, str(os.getpid()))
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < int(n):
        if time.monotonic() > deadline:
            print(f"fake_trial: barrier {spec}: still alone after 60 s", file=sys.stderr)
            return False
        time.sleep(0.01)
    return True


def main() -> int:
    args = sys.argv[1:]
    cfg = _settings(args)
    out_path = args[args.index("--out") + 1] if "--out" in args else None
    node = os.environ.get("NODE_RANK")
    attempt = os.environ.get("TUNE_TRIAL_ATTEMPT")
    pid_dir = cfg.get("FAKE_PID_DIR")
    if pid_dir:
        _touch(pid_dir, f"fake.{os.getpid()}")
    mode = cfg.get("FAKE_TRIAL_MODE", "ok")
    if mode == "hang" and cfg.get("FAKE_HANG_ATTEMPT") not in (None, attempt):
        mode = "ok"
    dump = cfg.get("FAKE_ENV_DUMP")  # a folder: each process writes the environment it was started with
    if dump:
        os.makedirs(dump, exist_ok=True)
        keys = (
            "NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "TUNE_TRIAL_ATTEMPT",
            "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "FAKE_EXTRA",
        )
        trial = os.path.basename(os.path.dirname(out_path)) if out_path else "run"
        with open(os.path.join(dump, f"{trial}.node{node}.attempt{attempt}.json"), "w") as f:
            json.dump(
                {"argv": args, "env": {k: os.environ.get(k) for k in keys}, "pid": os.getpid(), "out": out_path}, f
            )
    if cfg.get("FAKE_BARRIER") and not _barrier(cfg["FAKE_BARRIER"]):
        return 1
    hang_after = int(cfg.get("FAKE_HANG_AFTER", "1"))
    if cfg.get("FAKE_FORMAT", "harness") == "megatron":
        return _megatron(cfg, mode, hang_after, pid_dir)
    return _harness(cfg, args, out_path, node, mode, hang_after, pid_dir)


def _harness(cfg, args, out_path, node, mode, hang_after, pid_dir) -> int:
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    lay = spec["layout"]
    step_s = float(cfg.get(f"FAKE_STEP_S_TP{lay['tp']}", cfg.get("FAKE_STEP_S", "0.01")))
    if node not in (None, "0"):  # other nodes of a multi-node trial: their ranks run, rank 0 (node 0) writes the lines
        time.sleep(step_s * spec["steps"] if mode != "hang" else 600)
        return 0
    fast_if = cfg.get("FAKE_FAST_IF")  # "field=value,field=value": these layouts step in FAKE_FAST_STEP_S
    fast = bool(fast_if) and all(str(lay[k]) == v for k, v in (kv.split("=") for kv in fast_if.split(",")))
    if fast:
        step_s = float(cfg.get("FAKE_FAST_STEP_S", "0.02"))
    tail_after, _, tail_s = cfg.get("FAKE_TAIL", "").partition(":")
    world = lay["world_size"]
    tokens = spec["global_batch_size"] * spec["seq_length"]
    report_s = float(cfg.get("FAKE_REPORT_STEP_S", "0")) or None  # a step time to report instead of the one slept
    scale = float(
        cfg.get("FAKE_REPORT_SCALE", "100")
    )  # else the step slept, this many times longer: a throughput a GPU can reach

    def write(obj):
        with open(out_path, "a") as f:
            f.write(json.dumps(obj) + "\n")

    if mode == "silent":
        return 0
    write(
        {
            "event": "start",
            "world_size": world,
            "layout": lay,
            "versions": {"torch": "fake"},
            "notes": spec["notes"],
            "data": spec.get("data", "synthetic"),
            "fault": spec.get("fault"),
        }
    )
    init = 1.0
    if spec.get("save_checkpoint"):
        os.makedirs(spec["save_checkpoint"], exist_ok=True)
        with open(os.path.join(spec["save_checkpoint"], "init.json"), "w") as f:
            json.dump(
                {"init": 1.0 + (spec["seed"] % 97) / 970.0 + 0.01 * spec.get("pretrain_steps", 0), "layout": lay}, f
            )
        Path(spec["save_checkpoint"], "metadata.json").write_text("{}")
        from launch.harness.gather import model_fingerprint

        Path(spec["save_checkpoint"], "model.json").write_text(
            json.dumps({"model": spec["model"], "fingerprint": model_fingerprint(spec["model"])})
        )
    if spec.get("load_checkpoint"):
        ck = os.path.join(spec["load_checkpoint"], "init.json")
        if not os.path.exists(ck):
            write({"event": "error", "rank": 0, "type": "CheckpointingException", "message": f"no checkpoint at {ck}"})
            print(f"CheckpointingException: no checkpoint at {ck}", file=sys.stderr)
            return 1
        init = json.loads(Path(ck).read_text())["init"]
    if spec.get("data") == "corpus":
        write(
            {
                "event": "data",
                "corpus": "fake",
                "corpus_bytes": 1,
                "corpus_sha256": spec.get("corpus_sha256"),
                "tokenizer": "bytes",
            }
        )
    noise = float(cfg.get("FAKE_LAYOUT_NOISE", "0.002")) * lay["tp"]
    loss_mode = cfg.get("FAKE_LOSS_MODE", "")

    def loss_at(step):
        if spec.get("data") != "corpus":
            return 12.0 - 0.1 * step
        if loss_mode == "nan" and step == 4:
            return float("nan")
        rate = 0.25 * (2.0 if spec.get("fault") == "non_causal_attention" else 1.0)
        base = 2.5 * init + 9.7 * math.exp(-rate * step)
        if spec.get("fault") == "sp_norm_grad_unreduced":
            base *= 1.0 + 0.01 * step
        if spec.get("fault") == "embedding_shard_misplaced":
            base *= 1.5
        return base * (1.0 + noise * math.sin(step))

    if mode == "oom_text":
        print(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "139.81 GiB "
            "of which 1.2 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB memory in use.",
            file=sys.stderr,
        )
        return 1
    if mode == "crash":
        write({"event": "error", "rank": 0, "type": "AssertionError", "message": "boom"})
        print("Traceback (most recent call last):\nAssertionError: boom", file=sys.stderr)
        return 1
    if mode == "nccl":
        print(
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error",
            file=sys.stderr,
        )
        return 1
    if spec.get("dump_grads"):
        n = _dump_grads(cfg, spec, init, lay, loss_at(1))
        write({"event": "grads", "dir": spec["dump_grads"], "tensors": n, "seconds": 0.0, "replicas_max_abs_diff": 0.0})
    times = []
    for step in range(1, spec["steps"] + 1):
        time.sleep(float(tail_s) if tail_after and not fast and step > int(tail_after) else step_s)
        times.append(step_s)
        if mode == "hang" and step == hang_after:
            _hang(pid_dir)  # before the step's line: a reader that sees the step finds the child running
        if not (loss_mode == "missing" and step == 4 and spec.get("data") == "corpus"):
            rs = report_s or step_s * scale
            line = {
                "event": "step",
                "step": step,
                "step_time_s": rs,
                "tokens_per_s_per_gpu": tokens / rs / world,
                "loss": loss_at(step),
                "grad_norm": 1.0,
            }
            write({**line, "profiled": True} if step == spec.get("profile_step") else line)
        if mode == "oom" and step == 2:
            write(
                {
                    "event": "oom",
                    "rank": 1,
                    "message": "CUDA out of memory",
                    "allocated_bytes": 140 * GIB,
                    "reserved_bytes": 150 * GIB,
                    "max_allocated_bytes": 141 * GIB,
                }
            )
            return 3
        if mode == "hang" and step == hang_after:
            time.sleep(600)
    if spec.get(
        "profile_step"
    ):  # the harness's torch.profiler traces of one step, one per pipeline stage (small stand-ins)
        files = []
        for r in range(lay["pp"]):
            f = os.path.join(os.path.dirname(out_path), f"profile_step{spec['profile_step']}_pp{r}.json")
            events = [
                {
                    "name": f"ProfilerStep#{spec['profile_step']}",
                    "ph": "X",
                    "cat": "cpu_op",
                    "pid": r,
                    "tid": 1,
                    "ts": 0,
                    "dur": step_s * 1e6,
                },
                {
                    "name": "fake_gemm_kernel",
                    "ph": "X",
                    "cat": "kernel",
                    "pid": r,
                    "tid": 7,
                    "ts": 10,
                    "dur": step_s * 5e5,
                },
            ]
            Path(f).write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
            files.append(f)
        write({"event": "profile", "step": spec["profile_step"], "files": files})
    rs = report_s or step_s * scale
    write(
        {
            "event": "summary",
            "steps": len(times),
            "median_step_time_s": rs,
            "step_time_cv": 0.0,
            "tokens_per_s_per_gpu": tokens / rs / world,
            "peak_allocated_bytes": [80 * GIB] * world,
            "peak_reserved_bytes": [90 * GIB] * world,
            "layout": lay,
            "versions": {"torch": "fake"},
            "notes": spec["notes"],
        }
    )
    return 0


def _dump_grads(cfg, spec, init, lay, loss):
    import numpy as np

    from launch.harness.gather import GRAD_DUMP_FORMAT, model_fingerprint

    d = spec["dump_grads"]
    os.makedirs(os.path.join(d, "tensors"), exist_ok=True)
    rng = np.random.default_rng(int(init * 1e6) % 2**32)
    jitter = np.random.default_rng(os.getpid())
    shapes = {
        "embedding.word_embeddings.weight": (8, 4),
        "decoder.layers.0.self_attention.q_layernorm.weight": (4,),
        "decoder.layers.0.mlp.experts.linear_fc1.weight0": (6, 4),
        "output_layer.weight": (8, 4),
    }
    mode = cfg.get("FAKE_GRAD_MODE", "")
    noise = float(cfg.get("FAKE_GRAD_NOISE", "1e-3")) * (
        lay["micro_batch_size"] - 1 + (lay["dispatcher"] == "allgather")
    )
    run_noise = float(cfg.get("FAKE_GRAD_RUN_NOISE", "1e-5"))
    tensors = {}
    for i, (name, shape) in enumerate(shapes.items()):
        base = rng.standard_normal(shape)
        g = (
            base * (1 + noise * np.cos(np.arange(base.size).reshape(shape) + i))
            + run_noise * jitter.standard_normal(shape) * np.abs(base).mean()
        )
        if spec.get("fault") == "norm_grad_scaled" and "q_layernorm" in name:
            g = 2 * g
        if spec.get("fault") == "non_causal_attention":
            g = g + 0.3 * rng.standard_normal(shape)
        if mode == "missing" and name == "output_layer.weight":
            continue
        if mode == "nan" and i == 0:
            g = g.copy()
            g.flat[0] = float("nan")
        if mode == "shape" and "q_layernorm" in name:
            g = np.concatenate([g, g[:1]])
        f = f"tensors/{name}.npy"
        np.save(os.path.join(d, f), g.astype(np.float32))
        tensors[name] = {"file": f, "shape": list(g.shape), "dtype": "float32", "local_name": name, "owner_rank": 0}
    meta = {
        "format": GRAD_DUMP_FORMAT,
        "label": spec.get("label") or "fake",
        "layout": lay,
        "layout_label": "fake",
        "model": spec["model"].get("name"),
        "model_fingerprint": model_fingerprint(spec["model"]),
        "checkpoint": os.path.realpath(spec["load_checkpoint"]) if spec.get("load_checkpoint") else None,
        "batch": {
            "data": spec.get("data"),
            "data_step_offset": spec.get("data_step_offset", 0),
            "global_batch_size": spec["global_batch_size"],
            "seq_length": spec["seq_length"],
            "corpus_sha256": spec.get("corpus_sha256"),
            "seed": None,
        },
        "fault": spec.get("fault"),
        "loss": loss,
        "tensors": tensors,
        "replicas": {},
        "seconds": 0.0,
    }
    Path(d, "index.json").write_text(json.dumps(meta))
    return len(tensors)


def _it_line(i: int, n: int, ms: float) -> str:
    return (
        f" [2025-08-01 07:19:{i % 60:02d}] iteration {i:8d}/{n:8d} | consumed samples: {8 * i:12d} | "
        f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000E-05 | global batch size:     8 | "
        f"lm loss: {10.0 - 0.1 * i:.6E} | loss scale: 1.0 | grad norm: {1.0 + i:.3f} | number of skipped iterations:   "
        "0 |"
    )


def _megatron(cfg, mode, hang_after, pid_dir) -> int:
    iters = int(cfg.get("FAKE_STEPS", "4"))
    step_s = float(cfg.get("FAKE_STEP_S", "0.01"))
    report_ms = 1000.0 * (float(cfg.get("FAKE_REPORT_STEP_S", "0")) or step_s)
    print("training ...", flush=True)
    if mode == "silent":
        return 0
    for i in range(1, iters + 1):
        time.sleep(step_s)
        if mode == "hang" and i == hang_after:
            _hang(pid_dir)
        print(_it_line(i, iters, report_ms), flush=True)
        if i == 1:
            for rank in range(2):
                print(
                    f"[Rank {rank}] (after 1 iterations) memory (MB) | allocated: 1000.0 | max allocated: "
                    f"{80896.0 + rank * 1024} | "
                    f"reserved: 3000.0 | max reserved: {91136.0 + rank * 1024}",
                    flush=True,
                )
        if mode == "hang" and i == hang_after:
            time.sleep(600)
        if mode == "oom" and i == 2:
            print(
                "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
                "capacity of "
                "139.81 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB memory "
                "in use.",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if mode == "nccl" and i == 2:
            print(
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if mode == "crash" and i == 2:
            print("Traceback (most recent call last):\nValueError: bad batch", file=sys.stderr, flush=True)
            return 7
    return 0


# --------------------------------------------------------------------------- observers, for the tests


def recorded_pids(pid_dir) -> dict:
    """``{"fake": [pids], "child": [pids]}``: the processes the fake recorded in FAKE_PID_DIR."""
    out = {"fake": [], "child": []}
    if os.path.isdir(pid_dir):
        for name in os.listdir(pid_dir):
            role, _, pid = name.partition(".")
            if role in out and pid.isdigit():
                out[role].append(int(pid))
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a dead process not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout_s: float = 30.0, poll_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout_s`` seconds have passed (False): waits for an
    event with a generous limit; it asserts nothing about how long the event took."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def survivors(pid_dir, timeout_s: float = 15.0) -> list:
    """The processes recorded in ``pid_dir`` that are still alive once a killed process had up to ``timeout_s``
    seconds to go (a SIGKILLed process is reaped a moment later)."""
    pids = [p for ps in recorded_pids(pid_dir).values() for p in ps]
    wait_until(lambda: not any(alive(p) for p in pids), timeout_s)
    return [p for p in pids if alive(p)]


if __name__ == "__main__":
    sys.exit(main())
