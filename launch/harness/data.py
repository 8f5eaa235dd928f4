"""Real-text training data for the harness (``tune verify``): a corpus as bytes, in Megatron's sample order, so that two
layouts see the same rows and the loss falls. Plain Python.

Corpus: a UTF-8 file, by default CPython's ``pydoc_data.topics`` (nothing downloaded; its SHA-256 is recorded). Token
= the UTF-8 byte (0..255). Sample order (megatron-core ``MegatronPretrainingSampler``,
``megatron/training/datasets/data_samplers.py``): index ``k * global_batch + i * mbs * dp + r * mbs + j`` for step
``k``, micro-batch ``i``, DP rank ``r``, row ``j``; sample ``n`` is the ``seq_length + 1`` bytes from byte ``n *
seq_length`` (wrapping)."""

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
    source: str  # ``python:pydoc_data.topics`` or the file's path

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def __len__(self) -> int:
        return len(self.data)


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The corpus at ``path`` (UTF-8 text), or CPython's bundled documentation when None.

    Raises:
        TunerError: not a readable UTF-8 file of at least 64 KiB, or no ``pydoc_data``.
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


def sample_index(step: int, microbatch: int, dp_rank: int, row: int, *, micro_batch_size: int, dp: int,
                 global_batch_size: int) -> int:
    """Global sample index of one row in Megatron's pretraining-sampler order (0-based arguments)."""
    per_micro = micro_batch_size * dp
    return step * global_batch_size + microbatch * per_micro + dp_rank * micro_batch_size + row


def sample_tokens(corpus: Corpus | bytes, index: int, seq_length: int) -> list[int]:
    """The ``seq_length + 1`` byte tokens of sample ``index`` (wrapping around the corpus)."""
    data = corpus.data if isinstance(corpus, Corpus) else corpus
    n = len(data)
    start = (index * seq_length) % n
    need = seq_length + 1
    out = bytearray()
    while len(out) < need:
        take = data[start : start + need - len(out)]
        out += take
        start = 0
    return list(out)
