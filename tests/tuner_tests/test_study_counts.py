"""The study-count line of `tune`: counts with thousands separators."""

from __future__ import annotations

from types import SimpleNamespace

from tuner.cli.main_job import _study_counts


def test_study_counts_have_thousands_separators():
    res = SimpleNamespace(study_name="s", evaluated_now=2000, pruned_now=1500, failed_now=1200, gpu_hours_now=1234.5)
    assert _study_counts(res, 102561, measured=False) == "Study s: 102,561 layouts evaluated in total (2,000 now)"
    assert _study_counts(res, 102561, measured=True).endswith(
        "(2,000 now; 1,500 pruned, 1,200 failed; 1,234.5 GPU-hours)"
    )
