"""The safety net of the estimate: every output column over whole search spaces matches its recorded digest.

The main job's case is MiniMax-M2 on 64 x H200 with the default space as ``--stack slime`` leaves it
(348,396 valid layouts); three more cases cover MLA, dense layers, MTP, fp8 / MX precisions, CUDA
graphs, FSDP, CP all-to-all, the no-TE harness and the NVL72 domain. A change that is meant to move
numbers re-records the digests (``benchmarks/estimate_digest.py --write``) and says why in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import estimate_digest

pytestmark = pytest.mark.slow  # the estimate of every layout of the default spaces

ROOT = Path(__file__).resolve().parents[2]

RECORDED = json.loads((ROOT / "tests/fixtures/estimate_digest.json").read_text())


@pytest.mark.parametrize("case", estimate_digest.CASES, ids=lambda c: c.name)
def test_every_column_matches_its_digest(case):
    n, cols = estimate_digest.run_case(case)
    ref = RECORDED[case.name]
    assert n == ref["valid"]
    got = {k: estimate_digest.digest_of(v) for k, v in cols.items()}
    assert set(got) == set(ref["columns"])
    changed = sorted(k for k in got if got[k] != ref["columns"][k])
    assert not changed, f"{case.name}: columns changed: {changed}"


def test_main_job_case_is_the_issue_s_enumeration():
    assert RECORDED["minimax_m2_64xh200_main_job"]["valid"] == 348_396


def test_digest_sees_a_small_change_and_ignores_rounding_noise():
    v = np.linspace(1.0, 2.0, 1000) * 1e9
    d = estimate_digest.digest_of(v)
    assert estimate_digest.digest_of(v * (1 + 1e-15)) == d
    w = v.copy()
    w[500] *= 1 + 1e-5
    assert estimate_digest.digest_of(w) != d
