"""A stand-in for ``torchrun ... -m launch.harness.train``: no GPU, no torch.

Reads ``--spec`` and ``--out`` like the harness and writes the same JSON lines. What it
does is chosen by the environment variable FAKE_TRIAL_MODE:

- ``ok`` (default): every step, then the summary; step time from FAKE_STEP_S (default 0.01 s),
  or per tensor-parallel size from FAKE_STEP_S_TP<n>, or FAKE_FAST_STEP_S for the layouts that
  match FAKE_FAST_IF ("field=value,...");
- ``oom``: two steps, then rank 1 runs out of memory at 150 GiB (exit 3);
- ``oom_text``: prints PyTorch's out-of-memory message only (no JSON line), exit 1;
- ``hang``: one step, then sleeps (with a child process, to check the whole group is killed);
- ``crash``: raises an error (exit 1); ``nccl``: prints an NCCL error (exit 1).

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
"""

import json
import math
import os
import subprocess
import sys
import time

GIB = 2**30


def main() -> int:
    args = sys.argv[1:]
    with open(args[args.index("--spec") + 1]) as fh:
        spec = json.load(fh)
    out_path = args[args.index("--out") + 1]
    mode = os.environ.get("FAKE_TRIAL_MODE", "ok")
    lay = spec["layout"]
    step_s = float(os.environ.get(f"FAKE_STEP_S_TP{lay['tp']}", os.environ.get("FAKE_STEP_S", "0.01")))
    node = os.environ.get("NODE_RANK")
    dump = os.environ.get("FAKE_ENV_DUMP")  # a folder: each node writes the environment it was started with
    if dump:
        os.makedirs(dump, exist_ok=True)
        keys = ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "TUNE_TRIAL_ATTEMPT", "NCCL_NVLS_ENABLE",
                "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "FAKE_EXTRA")
        with open(os.path.join(dump, f"{os.path.basename(os.path.dirname(out_path))}.node{node}.attempt{os.environ.get('TUNE_TRIAL_ATTEMPT')}.json"), "w") as f:
            json.dump({"env": {k: os.environ.get(k) for k in keys}, "pid": os.getpid(), "t": time.time(), "out": out_path}, f)
    if node not in (None, "0"):  # other nodes of a multi-node trial: their ranks run, rank 0 (node 0) writes the lines
        time.sleep(step_s * spec["steps"] if mode != "hang" else 600)
        return 0
    fast_if = os.environ.get("FAKE_FAST_IF")  # "field=value,field=value": these layouts step in FAKE_FAST_STEP_S
    if fast_if and all(str(lay[k]) == v for k, v in (kv.split("=") for kv in fast_if.split(","))):
        step_s = float(os.environ.get("FAKE_FAST_STEP_S", "0.02"))
    world = lay["world_size"]
    tokens = spec["global_batch_size"] * spec["seq_length"]
    report_s = float(os.environ.get("FAKE_REPORT_STEP_S", "0")) or None  # a step time to report instead of the one slept

    def write(obj):
        with open(out_path, "a") as f:
            f.write(json.dumps(obj) + "\n")

    write({"event": "start", "world_size": world, "layout": lay, "versions": {"torch": "fake"}, "notes": spec["notes"],
           "data": spec.get("data", "synthetic"), "fault": spec.get("fault")})
    init = 1.0
    if spec.get("save_checkpoint"):
        os.makedirs(spec["save_checkpoint"], exist_ok=True)
        with open(os.path.join(spec["save_checkpoint"], "init.json"), "w") as f:
            json.dump({"init": 1.0 + (spec["seed"] % 97) / 970.0 + 0.01 * spec.get("pretrain_steps", 0), "layout": lay}, f)
        with open(os.path.join(spec["save_checkpoint"], "metadata.json"), "w") as fh:
            fh.write("{}")
        from tuner.numerics import model_fingerprint

        with open(os.path.join(spec["save_checkpoint"], "model.json"), "w") as f:
            json.dump({"model": spec["model"], "fingerprint": model_fingerprint(spec["model"])}, f)
    if spec.get("load_checkpoint"):
        ck = os.path.join(spec["load_checkpoint"], "init.json")
        if not os.path.exists(ck):
            write({"event": "error", "rank": 0, "type": "CheckpointingException", "message": f"no checkpoint at {ck}"})
            print(f"CheckpointingException: no checkpoint at {ck}", file=sys.stderr)
            return 1
        with open(ck) as fh:
            init = json.load(fh)["init"]
    if spec.get("data") == "corpus":
        write({"event": "data", "corpus": "fake", "corpus_bytes": 1, "corpus_sha256": spec.get("corpus_sha256"), "tokenizer": "bytes"})
    noise = float(os.environ.get("FAKE_LAYOUT_NOISE", "0.002")) * lay["tp"]
    loss_mode = os.environ.get("FAKE_LOSS_MODE", "")

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
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
              "of which 1.2 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB memory in use.", file=sys.stderr)
        return 1
    if mode == "crash":
        write({"event": "error", "rank": 0, "type": "AssertionError", "message": "boom"})
        print("Traceback (most recent call last):\nAssertionError: boom", file=sys.stderr)
        return 1
    if mode == "nccl":
        print("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error", file=sys.stderr)
        return 1
    if spec.get("dump_grads"):
        n = _dump_grads(spec, init, lay, loss_at(1))
        write({"event": "grads", "dir": spec["dump_grads"], "tensors": n, "seconds": 0.0, "replicas_max_abs_diff": 0.0})
    times = []
    for step in range(1, spec["steps"] + 1):
        time.sleep(step_s)
        times.append(step_s)
        if not (loss_mode == "missing" and step == 4 and spec.get("data") == "corpus"):
            rs = report_s or step_s
            write({"event": "step", "step": step, "step_time_s": rs, "tokens_per_s_per_gpu": tokens / rs / world, "loss": loss_at(step), "grad_norm": 1.0})
        if mode == "oom" and step == 2:
            write({"event": "oom", "rank": 1, "message": "CUDA out of memory", "allocated_bytes": 140 * GIB, "reserved_bytes": 150 * GIB, "max_allocated_bytes": 141 * GIB})
            return 3
        if mode == "hang":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            time.sleep(600)
    rs = report_s or step_s
    write({"event": "summary", "steps": len(times), "median_step_time_s": rs, "step_time_cv": 0.0,
           "tokens_per_s_per_gpu": tokens / rs / world, "peak_allocated_bytes": [80 * GIB] * world,
           "peak_reserved_bytes": [90 * GIB] * world, "layout": lay, "versions": {"torch": "fake"}, "notes": spec["notes"]})
    return 0


def _dump_grads(spec, init, lay, loss):
    import numpy as np

    from tuner.numerics import GRAD_DUMP_FORMAT, model_fingerprint

    d = spec["dump_grads"]
    os.makedirs(os.path.join(d, "tensors"), exist_ok=True)
    rng = np.random.default_rng(int(init * 1e6) % 2**32)
    jitter = np.random.default_rng(os.getpid())
    shapes = {"embedding.word_embeddings.weight": (8, 4), "decoder.layers.0.self_attention.q_layernorm.weight": (4,),
              "decoder.layers.0.mlp.experts.linear_fc1.weight0": (6, 4), "output_layer.weight": (8, 4)}
    mode = os.environ.get("FAKE_GRAD_MODE", "")
    noise = float(os.environ.get("FAKE_GRAD_NOISE", "1e-3")) * (lay["micro_batch_size"] - 1 + (lay["dispatcher"] == "allgather"))
    run_noise = float(os.environ.get("FAKE_GRAD_RUN_NOISE", "1e-5"))
    tensors = {}
    for i, (name, shape) in enumerate(shapes.items()):
        base = rng.standard_normal(shape)
        g = base * (1 + noise * np.cos(np.arange(base.size).reshape(shape) + i)) + run_noise * jitter.standard_normal(shape) * np.abs(base).mean()
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
    meta = {"format": GRAD_DUMP_FORMAT, "label": spec.get("label") or "fake", "layout": lay, "layout_label": "fake",
            "model": spec["model"].get("name"), "model_fingerprint": model_fingerprint(spec["model"]),
            "checkpoint": os.path.realpath(spec["load_checkpoint"]) if spec.get("load_checkpoint") else None,
            "batch": {"data": spec.get("data"), "data_step_offset": spec.get("data_step_offset", 0), "global_batch_size": spec["global_batch_size"],
                      "seq_length": spec["seq_length"], "corpus_sha256": spec.get("corpus_sha256"), "seed": None},
            "fault": spec.get("fault"), "loss": loss, "tensors": tensors, "replicas": {}, "seconds": 0.0}
    with open(os.path.join(d, "index.json"), "w") as fh:
        json.dump(meta, fh)
    return len(tensors)


if __name__ == "__main__":
    sys.exit(main())
