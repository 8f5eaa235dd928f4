"""pareto.png: every point the printed table lists carries its trial number, and no two labels overlap."""

from __future__ import annotations

import itertools
import math

import pytest
from matplotlib.text import Text

from specs.layout import Layout
from tuner.report import front_figure, front_rows, plot_front
from tuner.study import TrialRow

pytestmark = pytest.mark.slow  # a study of its own (module fixture)


def _row(trial: int, gib: float, tps: float) -> TrialRow:
    return TrialRow(trial=trial, layout=Layout(world_size=8), peak_gib=gib, tokens_per_s_per_gpu=tps, mfu=0.1,
                    usd_per_million_tokens=1.0, headroom_gib=10.0, step_time_s=1.0)


def _crowded(n_front: int = 30, n_behind: int = 120) -> list[TrialRow]:
    """A front of ``n_front`` trials packed into 2 GiB and 3% of throughput, and trials behind it."""
    rows = [_row(100 + i, 60.0 + 2.0 * i / n_front, 2000.0 + 60.0 * math.sqrt(i / n_front)) for i in range(n_front)]
    rows += [_row(500 + j, 60.0 + (j % 17) * 0.9, 1500.0 + (j * 37 % 500)) for j in range(n_behind)]
    return rows


@pytest.fixture(scope="module")
def crowded():
    from specs import load_model

    rows = _crowded()
    front = front_rows(rows, load_model("Llama-3.1-8B"))
    assert len(front) == 30  # the synthetic front is what it claims to be
    fig, labels = front_figure(rows, front, "crowded", usable_gib=70.0, labelled=front)
    yield fig, labels, front
    import matplotlib.pyplot as plt

    plt.close(fig)


def _boxes(fig, labels):
    r = fig.canvas.get_renderer()
    return [Text.get_window_extent(a, r) for a in labels]


def test_every_listed_point_is_numbered_with_its_trial(crowded):
    fig, labels, front = crowded
    assert [a.get_text() for a in labels] == [str(r["trial"]) for r in front]
    assert [tuple(a.xy) for a in labels] == [
        (r["peak_gib"], r["tokens_per_s_per_gpu"]) for r in front
    ]  # each label points at its dot


def test_no_two_labels_overlap_on_a_crowded_front(crowded):
    fig, labels, _ = crowded
    boxes = _boxes(fig, labels)
    hits = [
        (labels[i].get_text(), labels[j].get_text())
        for i, j in itertools.combinations(range(len(boxes)), 2)
        if boxes[i].overlaps(boxes[j])
    ]
    assert not hits
    ax_box = fig.axes[0].get_window_extent(fig.canvas.get_renderer())
    assert all(ax_box.x0 <= b.x0 and b.x1 <= ax_box.x1 and ax_box.y0 <= b.y0 and b.y1 <= ax_box.y1 for b in boxes)


def test_labels_do_not_cover_the_front_points(crowded):
    fig, labels, front = crowded
    ax = fig.axes[0]
    boxes = _boxes(fig, labels)
    for r in front:
        x, y = ax.transData.transform((r["peak_gib"], r["tokens_per_s_per_gpu"]))
        assert not any(b.x0 < x < b.x1 and b.y0 < y < b.y1 for b in boxes), r["trial"]


def test_the_overlap_check_sees_overlapping_labels(crowded):
    """The check above can fail: labels at the same offset from neighbouring points do overlap."""
    fig, labels, _ = crowded
    for a in labels:
        a.xyann = (0, 0)
    boxes = _boxes(fig, labels)
    assert any(boxes[i].overlaps(boxes[j]) for i, j in itertools.combinations(range(len(boxes)), 2))


def test_plot_front_labels_only_the_listed_rows(tmp_path, monkeypatch):
    from specs import load_model

    rows = _crowded(12, 20)
    front = front_rows(rows, load_model("Llama-3.1-8B"))
    seen = {}
    real = front_figure

    def spy(*a, **k):
        fig, labels = real(*a, **k)
        seen["labels"] = [x.get_text() for x in labels]
        return fig, labels

    monkeypatch.setattr("tuner.report.front_figure", spy)
    plot_front(tmp_path / "p.png", rows, front, "t", 70.0, labelled=front[:5])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert seen["labels"] == [str(r["trial"]) for r in front[:5]]
