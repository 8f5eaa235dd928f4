# Dump every WorkloadBaseConfig preset of a Megatron-Bridge tag as JSON lines: python dump_bridge_presets.py <checkout of the tag>/scripts/performance > presets_<tag>.jsonl
import dataclasses
import importlib
import json
import os
import sys

root = sys.argv[1]
sys.path.insert(0, root)
# stub modules that may be imported at module level without megatron.bridge
import utils.utils  # noqa: E402, F401 - the perf scripts' helpers, imported first as the scripts do

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
