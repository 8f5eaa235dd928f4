"""A stand-in for ``python -m launch.harness.component``: no GPU, no torch; writes the program's JSON lines.

FAKE_COMPONENT_MODE: ``pass`` (default: every test arm within the bound, the masters bitwise identical, every
control over the bound), ``control_passes`` (both wrong-hyperparameter controls stay within the bound), ``bitwise`` (one
element of the rebuilt masters differs), ``offload_fails`` (the offloaded arm's error is above the bound),
``crash`` (exit 1 after the start line), ``no_default`` (the default arm fails with an error).
"""

import json
import os
import sys


def main() -> int:
    args = sys.argv[1:]
    with open(args[args.index("--spec") + 1]) as fh:
        spec = json.load(fh)
    out = args[args.index("--out") + 1]
    mode = os.environ.get("FAKE_COMPONENT_MODE", "pass")

    def write(obj):
        with open(out, "a") as f:
            f.write(json.dumps(obj) + "\n")

    experts = spec.get("experts") or min(spec["max_experts"], 128)
    write({"event": "start", "experts": experts, "experts_fit": 128, "shape": "fake", "versions": {"torch": "fake"}})
    if mode == "crash":
        write({"event": "error", "type": "RuntimeError", "message": "boom"})
        return 1
    write(
        {
            "event": "grads",
            "steps": max(spec["steps"]),
            "global_norms": [2.0, 1.9, 1.8],
            "clip_coeffs": [0.5, 0.53, 0.56],
        }
    )
    default = {1: 1e-7, 3: 5e-5}
    errs = {
        "default": default,
        "explicit_masters": {1: 2e-7, 3: 6e-5},
        "gpu": {1: 2e-7, 3: 6e-5},
        "gpu_bf16_moments": {1: 2e-7, 3: 3e-3},
        "offload": {1: 3e-7, 3: 8e-5},
        "control_remainders_dropped": {1: 0.4, 3: 0.5},
        "control_wrong_eps": {1: 0.02, 3: 0.03},
        "control_wrong_beta2": {1: 1e-7, 3: 0.05},
        "control_bf16_masters": {1: 0.6, 3: 0.7},
    }
    if mode == "control_passes":  # neither wrong hyperparameter is caught
        errs["control_wrong_eps"] = {1: 2e-7, 3: 6e-5}
        errs["control_wrong_beta2"] = {1: 1e-7, 3: 6e-5}
    if mode == "offload_fails":
        errs["offload"] = {1: 3e-7, 3: 5e-3}
    kinds = {
        "default": "baseline",
        "explicit_masters": "bitwise",
        "gpu": "test",
        "gpu_bf16_moments": "test",
        "offload": "test",
    }
    for arm in spec["arms"]:
        if mode == "no_default" and arm == "default":
            write({"event": "arm_error", "arm": arm, "kind": "baseline", "message": "RuntimeError: boom"})
            continue
        for s in spec["steps"]:
            write(
                {
                    "event": "arm",
                    "arm": arm,
                    "kind": kinds.get(arm, "control"),
                    "step": s,
                    "worst_rel_l2": errs[arm][s],
                    "worst_tensor": "decoder.layers.0.mlp.experts.linear_fc1.weight3",
                }
            )
            if arm == "gpu":
                write(
                    {
                        "event": "bitwise",
                        "arm": "gpu",
                        "against": "explicit_masters",
                        "step": s,
                        "identical": mode != "bitwise",
                        "mismatched": 1 if mode == "bitwise" else 0,
                        "elements": 1000,
                    }
                )
    write({"event": "summary", "experts": experts})
    return 0


if __name__ == "__main__":
    sys.exit(main())
