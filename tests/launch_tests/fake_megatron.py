"""A stand-in for a slime / Megatron-LM launch command: prints Megatron-style log lines (no GPU, no torch).

Usage: ``fake_megatron.py MODE ITERS STEP_MS [--dump FILE] [anything else]``; MODE is
``ok`` (ITERS iterations and memory reports, exit 0), ``oom`` (two iterations, then
PyTorch's out-of-memory message, exit 1), ``nccl`` (an NCCL error, exit 1), ``crash``
(a traceback, exit 7), ``hang`` (one iteration, then sleeps with a child process),
``silent`` (no iteration line, exit 0), ``slow`` (every iteration sleeps STEP_MS).
``--dump FILE`` writes its argv (after the program name) and some environment as JSON.
"""

import json
import os
import subprocess
import sys
import time


def it_line(i: int, n: int, ms: float) -> str:
    return (f" [2025-08-01 07:19:{i:02d}] iteration {i:8d}/{n:8d} | consumed samples: {8 * i:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000E-05 | global batch size:     8 | "
            f"lm loss: {10.0 - 0.1 * i:.6E} | loss scale: 1.0 | grad norm: {1.0 + i:.3f} | number of skipped iterations:   0 |")


def main() -> int:
    args = sys.argv[1:]
    mode, iters, step_ms = args[0], int(args[1]), float(args[2])
    if "--dump" in args:
        with open(args[args.index("--dump") + 1], "w") as f:
            json.dump({"argv": args, "env": {k: os.environ.get(k) for k in ("FAKE_EXTRA", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS")}}, f)
    print("training ...", flush=True)
    for i in range(1, iters + 1):
        if mode == "silent":
            break
        if mode == "slow":
            time.sleep(min(step_ms, 50.0) / 1000)  # the log says step_ms; the wait is capped to keep tests fast
        print(it_line(i, iters, step_ms * (3 if i == 1 else 1)), flush=True)
        if i == 1:
            for rank in range(2):
                print(f"[Rank {rank}] (after 1 iterations) memory (MB) | allocated: 1000.0 | max allocated: {2000.0 + rank * 1024} | "
                      f"reserved: 3000.0 | max reserved: {3072.0 + rank * 1024}", flush=True)
        if mode == "oom" and i == 2:
            print("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
                  "139.81 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB memory in use.",
                  file=sys.stderr, flush=True)
            return 1
        if mode == "nccl" and i == 2:
            print("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error", file=sys.stderr, flush=True)
            return 1
        if mode == "crash" and i == 2:
            print("Traceback (most recent call last):\nValueError: bad batch", file=sys.stderr, flush=True)
            return 7
        if mode == "hang":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
