"""numpy views of a result's vectors in each output encoding (see ``schemas/README.md``).

- float32: float32 (n, dim).
- float16: float16 (n, dim).
- int8: int8 (n, dim) codes; values ~= ``codes * scales[:, None]``.
- binary: uint8 (n, ceil(dim / 8)), sign bits packed 8 per byte, most significant first
  (numpy.packbits order); :func:`unpack_bits` gives (n, dim) zeros and ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kembed_shared.encodings import decode_scales, decode_vectors, dequantize_int8, to_float32
from schemas import EmbedResult, Encoding
from schemas.v1 import Span

__all__ = [
    "Embeddings",
    "decode_scales",
    "decode_vectors",
    "dequantize_int8",
    "hamming_distances",
    "unpack_bits",
]


@dataclass(frozen=True, slots=True)
class Embeddings:
    """A result with everything it carries: the encoded vectors and how to read them."""

    vectors: npt.NDArray[Any]
    """(n, dim) float32, float16 or int8, or (n, ceil(dim / 8)) uint8 for binary."""
    encoding: Encoding
    dim: int
    """Dimensions per vector (for binary: bits, not bytes, per row)."""
    scales: npt.NDArray[np.float32] | None
    """int8 only: one scale per vector, value ~= code * scale."""
    tokens: tuple[int, ...]
    """Tokens per row (input, or chunk), special tokens included; after truncation, or with
    ``chunking`` and pooling ``mean`` the sum of the input's chunks' tokens."""
    model: str
    chunks: tuple[int, ...] | None = None
    """With ``chunking``: per input, how many chunks it was cut into."""
    spans: tuple[Span, ...] | None = None
    """With ``chunking``: per chunk, ``[start, end)`` in its input."""

    @classmethod
    def from_result(cls, result: EmbedResult) -> Embeddings:
        return cls(
            vectors=decode_vectors(result),
            encoding=Encoding(result.dtype),
            dim=result.dim,
            scales=decode_scales(result),
            tokens=result.tokens,
            model=result.model,
            chunks=result.chunks,
            spans=result.spans,
        )

    def to_float32(self) -> npt.NDArray[np.float32]:
        """The values as float32 (n, dim): exact for float32, widened for float16,
        ``codes * scales`` for int8. Binary vectors keep only signs: use :func:`unpack_bits`."""
        return to_float32(
            self.encoding,
            self.vectors,
            self.scales,
            refusal="binary vectors hold only signs; use unpack_bits() for the bits",
        )


def unpack_bits(packed: npt.NDArray[np.uint8], dim: int) -> npt.NDArray[np.uint8]:
    """Binary vectors (n, ceil(dim / 8)) to (n, dim) bits, 1 where the value was > 0."""
    if packed.ndim != 2 or packed.shape[1] != (dim + 7) // 8:
        raise ValueError(f"expected shape (n, {(dim + 7) // 8}) for {dim} dimensions")
    return np.unpackbits(packed, axis=1, count=dim, bitorder="big")


def hamming_distances(
    queries: npt.NDArray[np.uint8], vectors: npt.NDArray[np.uint8]
) -> npt.NDArray[np.int64]:
    """Hamming distances (q, n) between packed binary vectors (padding bits are all 0)."""
    if queries.ndim != 2 or vectors.ndim != 2 or queries.shape[1] != vectors.shape[1]:
        raise ValueError("expected two 2-d packed arrays of the same width")
    differing = np.bitwise_xor(queries[:, None, :], vectors[None, :, :])
    distances: npt.NDArray[np.int64] = np.unpackbits(differing, axis=2).sum(axis=2, dtype=np.int64)
    return distances
