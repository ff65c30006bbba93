"""Content digests: one place that says what a digest is and how it is computed."""

from __future__ import annotations

import re
from collections.abc import Iterable

import xxhash

from ..errors import InvalidNameError

__all__ = ["DIGEST_LEN", "Buffer", "check_digest", "digest_of", "is_digest"]

DIGEST_LEN = 32
_DIGEST_RE = re.compile(r"[0-9a-f]{32}")

Buffer = bytes | bytearray | memoryview


def is_digest(value: object) -> bool:
    """True when ``value`` is a canonical digest: 32 lowercase hex characters."""
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


def check_digest(value: object) -> str:
    """Return ``value`` if it is a canonical digest, else raise `InvalidNameError`."""
    if not is_digest(value):
        raise InvalidNameError(f"not a canonical xxh3-128 digest: {value!r:.80}")
    return value  # type: ignore[return-value]


def digest_of(data: Buffer | Iterable[Buffer]) -> str:
    """The xxh3-128 hex digest of ``data``, or of the concatenation of its parts."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return xxhash.xxh3_128_hexdigest(data)
    h = xxhash.xxh3_128()
    for part in data:
        h.update(part)
    return h.hexdigest()
