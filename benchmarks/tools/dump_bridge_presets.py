# Dump every WorkloadBaseConfig preset of a Megatron-Bridge tag as JSON lines, the tag's perf scripts on the import
# path:
#   PYTHONPATH=<checkout of the tag>/scripts/performance python benchmarks/tools/dump_bridge_presets.py >
#   presets_<tag>.jsonl
import dataclasses
import importlib
import json
import os
import sys

import utils.utils  # the perf scripts' helpers, imported first as the scripts do

root = os.path.dirname(os.path.dirname(utils.utils.__file__))  # <checkout>/scripts/performance

out = []
cfgdir = os.path.join(root, "configs")
for fam in sorted(os.listdir(cfgdir)):
    if not os.path.isdir(os.path.join(cfgdir, fam)):
        continue
    for f in sorted(os.listdir(os.path.join(cfgdir, fam))):
        if not f.endswith(".py") or "workload_base_configs" not in f:
            continue
        modname = f"configs.{fam}.{f[:-3]}"
        try:
            m = importlib.import_module(modname)
        except Exception as e:
            print("ERR", modname, e, file=sys.stderr)
            continue
        for k, v in vars(m).items():
            if dataclasses.is_dataclass(v) and not isinstance(v, type) and k.isupper():
                d = dataclasses.asdict(v)
                out.append({"family": fam, "name": k, **d})
for o in out:
    print(json.dumps(o, default=str))
