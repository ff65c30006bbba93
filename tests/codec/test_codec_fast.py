"""The codec's fast path for numeric lists (through marshal): it must store exactly what the
general path stores, and leave every other list to it."""

from __future__ import annotations

import enum
import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from archive_manager import codec
from archive_manager.codec import (
    build_chunk,
    decode_chunk,
    decode_tensor_blob,
    encode_chunk,
    materialize_tensor_refs,
)


class Colour(enum.IntEnum):
    RED = 1


def _general(value: list) -> dict | None:
    """What `_Encoder._list` stores for ``value`` with the fast path switched off."""
    record = codec._Record(codec.DEFAULT_INLINE_LIMIT, {})
    fast, native = codec._marshalled_numbers, codec._native_numbers
    codec._marshalled_numbers = lambda v: None  # type: ignore[assignment]
    codec._native_numbers = None  # the C conversion: tests/codec/test_codec_native.py
    try:
        node = codec._Encoder(record)._list(value)
    finally:
        codec._marshalled_numbers, codec._native_numbers = fast, native
    if not isinstance(node, dict):
        return None
    return {"d": node["d"], "s": node["s"], "data": b"".join(map(bytes, record.arrays))}


def _fast(value: list) -> dict | None:
    got = codec._marshalled_numbers(value)
    if got is None:
        return None
    dtype, data, shuffled = got
    return {"d": dtype, "s": shuffled, "data": data}


def _roundtrip(value: list) -> list:
    (sample,) = decode_chunk(build_chunk([{"v": value}]).pack().data)
    return sample["v"]


INT32 = st.integers(-(2**31), 2**31 - 1)


@given(st.lists(INT32 | st.integers(0, 300) | st.integers(-200, 200), min_size=8, max_size=80))
def test_int_lists_encode_exactly_as_the_general_path(value: list) -> None:
    assert _fast(value) == _general(value)


@given(st.lists(st.floats(width=32) | st.floats(), min_size=8, max_size=80))
def test_float_lists_encode_exactly_as_the_general_path(value: list) -> None:
    assert _fast(value) == _general(value)


@pytest.mark.parametrize(
    "value",
    [
        [1, 2, 3, True, 5, 6, 7, 8],  # a bool is not an int
        [1, 2, 3, Colour.RED, 5, 6, 7, 8],  # nor is an IntEnum
        [1, 2, 3, np.int64(4), 5, 6, 7, 8],  # nor a numpy scalar
        [1, 2, 3, 2**31, 5, 6, 7, 8],  # beyond int32: the general path keeps int64
        [1, 2, 3, -(2**31) - 1, 5, 6, 7, 8],
        [1, 2, 3, 2**70, 5, 6, 7, 8],  # beyond int64: JSON
        [1.0, 2.0, 3, 4.0, 5.0, 6.0, 7.0, 8.0],  # mixed int and float
        [1, 2, 3, None, 5, 6, 7, 8],
        [1, 2, 3, "4", 5, 6, 7, 8],
        [[1], 2, 3, 4, 5, 6, 7, 8],
    ],
)
def test_lists_that_are_not_plain_numbers_take_the_general_path(value: list) -> None:
    assert codec._marshalled_numbers(value) is None
    with_fast = _chunk_or_error(value)
    fast, native = codec._marshalled_numbers, codec._native_numbers
    codec._marshalled_numbers = lambda v: None  # type: ignore[assignment]
    codec._native_numbers = None
    try:
        assert _chunk_or_error(value) == with_fast
    finally:
        codec._marshalled_numbers, codec._native_numbers = fast, native


def _chunk_or_error(value: list) -> bytes | type:
    try:
        return build_chunk([{"v": value}]).pack().data
    except codec.UnencodableError as exc:
        return type(exc)


def test_a_list_holding_itself_is_refused_not_crashed() -> None:
    value: list = [1, 2, 3, 4, 5, 6, 7, 8]
    value.append(value)
    assert codec._marshalled_numbers(value) is None
    with pytest.raises(codec.UnencodableError):
        build_chunk([{"v": value}])


def test_float_bits_survive_the_fast_path() -> None:
    nan_payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_1234))[0]
    value = [-0.0, math.inf, -math.inf, nan_payload, 1e-310, 0.1, 1.5, 2.0]
    back = _roundtrip(value)
    assert [struct.pack("<d", v) for v in back] == [struct.pack("<d", v) for v in value]
    assert _fast(value) == _general(value)
    assert _fast(value)["d"] == "float64"  # type: ignore[index]


def test_materialize_rebuilds_only_containers_holding_refs() -> None:
    t = torch.arange(4)
    enc = encode_chunk(
        [{"tokens": list(range(50)), "mixed": [1, t], "d": {"k": [2.0] * 9}}], inline_limit=0
    )
    (sample,) = decode_chunk(
        enc.data,
        loader=lambda h: decode_tensor_blob(
            enc.tensor_blobs[h].parts[0] + bytes(enc.tensor_blobs[h].parts[1]), h
        ),
    )
    tokens, inner = sample["tokens"], sample["d"]
    out = materialize_tensor_refs(sample)
    assert out is not sample  # it held a ref
    assert out["tokens"] is tokens and out["d"] is inner  # no ref inside: the same objects
    assert out["mixed"][0] == 1 and torch.equal(out["mixed"][1], t)
    plain = {"a": [1, 2, 3], "b": ("x", None)}
    assert materialize_tensor_refs(plain) is plain
