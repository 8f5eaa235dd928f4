"""The harness's text data: corpus, byte tokens, Megatron's sample order (no torch)."""

from __future__ import annotations

import pytest

from launch.harness.data import DEFAULT_CORPUS, Corpus, load_corpus, sample_index, sample_tokens
from specs.errors import TunerError


def _step_rows(step, *, mbs, dp, gbs):
    """Sample indices of one optimizer step for every (DP rank, micro-batch, row) of a layout."""
    m = gbs // (mbs * dp)
    return [
        sample_index(step, i, r, j, micro_batch_size=mbs, dp=dp, global_batch_size=gbs)
        for r in range(dp)
        for i in range(m)
        for j in range(mbs)
    ]


@pytest.mark.parametrize("mbs,dp", [(1, 1), (1, 2), (2, 2), (1, 8), (2, 4), (4, 1)])
def test_every_layout_sees_the_same_rows_in_each_step(mbs, dp):
    gbs = 8
    for step in range(3):
        rows = _step_rows(step, mbs=mbs, dp=dp, gbs=gbs)
        assert sorted(rows) == list(range(step * gbs, (step + 1) * gbs))


def test_sample_order_is_megatrons_sampler():
    # micro-step i takes mbs*dp consecutive samples; DP rank r takes the r-th mbs of them
    assert [sample_index(0, 0, r, 0, micro_batch_size=1, dp=4, global_batch_size=8) for r in range(4)] == [0, 1, 2, 3]
    assert sample_index(0, 1, 0, 0, micro_batch_size=1, dp=4, global_batch_size=8) == 4
    assert sample_index(2, 0, 1, 1, micro_batch_size=2, dp=2, global_batch_size=8) == 16 + 2 + 1


def test_tokens_are_bytes_and_rows_chain():
    c = Corpus(data=b"abcdefghij", source="t")
    assert sample_tokens(c, 0, 4) == list(b"abcde")
    assert sample_tokens(c, 1, 4) == list(b"efghi")  # the label of row 0's last input is row 1's first token
    assert sample_tokens(c, 2, 4) == list(b"ijabc")  # wraps around
    assert sample_tokens(c, 0, 25) == list(b"abcdefghij" * 2 + b"abcdef")  # longer than the corpus


def test_default_corpus_is_real_text_and_stable():
    a, b = load_corpus(), load_corpus()
    assert a.source == DEFAULT_CORPUS and len(a) > 100_000 and a.sha256 == b.sha256
    text = a.data.decode("utf-8")
    assert "statement" in text and max(a.data) < 256
    toks = sample_tokens(a, 3, 512)
    assert len(toks) == 513 and all(0 <= t < 256 for t in toks)


def test_corpus_file_errors_name_the_file(tmp_path):
    with pytest.raises(TunerError, match="no such file"):
        load_corpus(tmp_path / "nope.txt")
    small = tmp_path / "small.txt"
    small.write_text("too short")
    with pytest.raises(TunerError, match="at least"):
        load_corpus(small)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe" * 40_000)
    with pytest.raises(TunerError, match="not UTF-8"):
        load_corpus(binary)
    with pytest.raises(TunerError, match="not a regular file"):
        load_corpus("/dev/zero")
    with pytest.raises(TunerError, match="not a regular file"):
        load_corpus(tmp_path)
    good = tmp_path / "good.txt"
    good.write_text("the quick brown fox. " * 4000)
    c = load_corpus(good)
    assert c.source == str(good) and len(c) == 84_000
