"""Real-text training data for the harness: a corpus, tokenised to bytes, read in Megatron's sample order.

Plain Python (no torch), so CI tests it. Used by ``tune verify``, where two layouts
must see **the same rows in the same order**, and the loss must fall (synthetic
random tokens stay the default for speed trials: their loss does not fall).

Corpus: any UTF-8 text file (``--corpus FILE``); by default, the documentation that
ships inside CPython (``pydoc_data.topics``: the language reference's topics, about
0.47 MB on Python 3.11), so nothing is downloaded at run time. Both arms of a check run
on the same machine with the same interpreter, so they read the same bytes; the
corpus's SHA-256 is recorded with each run and compared.

Tokeniser: bytes. Token id = the UTF-8 byte (0..255), which every model's vocabulary
(``vocab_size`` >= 256) can hold. The loss starts near ``ln(vocab_size)`` and falls
as the model learns the byte statistics: enough to compare two loss curves.

Sample order (source: megatron-core ``MegatronPretrainingSampler`` in
``megatron/training/datasets/data_samplers.py``): each micro-step takes
``micro_batch_size * dp`` consecutive samples and data-parallel rank ``r`` takes the
``r``-th ``micro_batch_size`` of them. So sample index for optimizer step ``k``
(0-based), micro-batch ``i``, DP rank ``r``, row ``j`` is
``k * global_batch + i * micro_batch_size * dp + r * micro_batch_size + j``: the set
of rows in one optimizer step is the same whatever the layout.
Sample ``n`` is the ``seq_length + 1`` bytes starting at byte ``n * seq_length``
(wrapping around the corpus): inputs are the first ``seq_length``, labels the last.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specs.errors import TunerError

__all__ = ["Corpus", "load_corpus", "sample_index", "sample_tokens", "DEFAULT_CORPUS"]

#: Name of the default corpus, as recorded in results.
DEFAULT_CORPUS = "python:pydoc_data.topics"

#: Smallest corpus accepted (bytes): below this a 20-step check would mostly repeat itself.
MIN_CORPUS_BYTES = 65_536


@dataclass(frozen=True, slots=True)
class Corpus:
    """A byte corpus: the token stream of the harness's ``corpus`` data."""

    data: bytes
    source: str
    """``python:pydoc_data.topics`` or the file's path."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def __len__(self) -> int:
        return len(self.data)


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The corpus at ``path`` (any UTF-8 text file), or CPython's bundled documentation when None.

    Raises:
        TunerError: the path is not a regular file, cannot be read, is not UTF-8 text, or is
            smaller than 64 KiB; or (no path) this Python has no
            ``pydoc_data`` (then give a file).
    """
    if path is None:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            raise TunerError(
                "this Python has no pydoc_data (the default verification corpus); give a text file with --corpus FILE"
            ) from None
        data = "".join(topics[k] for k in sorted(topics)).encode("utf-8")
        return Corpus(data=data, source=DEFAULT_CORPUS)
    p = Path(path)
    try:
        if not p.is_file():
            raise TunerError(f"--corpus {str(p)!r}: no such file, or not a regular file; give a UTF-8 text file")
        data = p.read_bytes()
    except OSError as e:
        raise TunerError(f"--corpus {str(p)!r}: cannot read it ({e.strerror or e})") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TunerError(f"--corpus {str(p)!r}: not UTF-8 text (byte {e.start}); give a plain text file") from None
    if len(data) < MIN_CORPUS_BYTES:
        raise TunerError(f"--corpus {str(p)!r}: {len(data):,} bytes; give at least {MIN_CORPUS_BYTES:,} bytes of text")
    return Corpus(data=data, source=str(p))


def sample_index(step: int, microbatch: int, dp_rank: int, row: int, *, micro_batch_size: int, dp: int, global_batch_size: int) -> int:
    """Global sample index of one row, in Megatron's pretraining-sampler order (see the module docstring).

    Args:
        step: optimizer step, 0-based.
        microbatch: micro-batch within the step, ``0 .. global_batch / (micro_batch_size * dp) - 1``.
        dp_rank: data-parallel rank, ``0 .. dp - 1``.
        row: row within the micro-batch, ``0 .. micro_batch_size - 1``.

    Raises:
        TunerError: an argument out of its range, or a global batch that is not a
            multiple of ``micro_batch_size * dp``.
    """
    per_micro = micro_batch_size * dp
    if micro_batch_size < 1 or dp < 1 or global_batch_size < 1 or global_batch_size % per_micro:
        raise TunerError(f"global batch {global_batch_size} is not a multiple of micro-batch {micro_batch_size} x DP {dp}")
    m = global_batch_size // per_micro
    if not (step >= 0 and 0 <= microbatch < m and 0 <= dp_rank < dp and 0 <= row < micro_batch_size):
        raise TunerError(f"sample position out of range: step {step}, micro-batch {microbatch}/{m}, dp rank {dp_rank}/{dp}, row {row}/{micro_batch_size}")
    return step * global_batch_size + microbatch * per_micro + dp_rank * micro_batch_size + row


def sample_tokens(corpus: Corpus | bytes, index: int, seq_length: int) -> list[int]:
    """The ``seq_length + 1`` byte tokens of sample ``index`` (wrapping around the corpus).

    Raises:
        TunerError: ``seq_length`` < 1, a negative index, or an empty corpus.
    """
    data = corpus.data if isinstance(corpus, Corpus) else corpus
    if seq_length < 1 or index < 0 or not data:
        raise TunerError(f"bad sample request: index {index}, seq_length {seq_length}, corpus of {len(data)} bytes")
    n = len(data)
    start = (index * seq_length) % n
    need = seq_length + 1
    out = bytearray()
    while len(out) < need:
        take = data[start : start + need - len(out)]
        out += take
        start = 0
    return list(out)
