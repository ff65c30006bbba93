"""Tests for archive_manager.codec: lossless round trips, compact storage, random access,
tensor blobs and lazy tensor refs, manifests, and refusal of values that cannot be stored."""

from __future__ import annotations

import copy
import dataclasses
import decimal
import enum
import json
import math
import struct
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_manager._util.digest import digest_of, is_digest
from archive_manager.codec import (
    DEFAULT_INLINE_LIMIT,
    ChunkReader,
    EncodedChunk,
    RawChunk,
    TensorRef,
    build_chunk,
    decode_array_blob,
    decode_chunk,
    decode_manifest,
    decode_tensor_blob,
    encode_chunk,
    encode_manifest,
    encode_tensor_blob,
    materialize_tensor_refs,
)
from archive_manager.errors import (
    ArchiveError,
    IntegrityError,
    InvalidInputError,
    UnencodableError,
    UnsupportedFormatError,
)
from archive_manager.interop.synthetic import make_rollout
from archive_manager.samples import Sample, register_sample_class

pytestmark = [
    pytest.mark.timeout(120),
    # torch's notes on the exotic tensors built here, not problems of the codec
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning"),
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning"),
]

# Every dtype the contract names; the ones this torch lacks are skipped.
TORCH_DTYPE_NAMES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
TORCH_DTYPES = [getattr(torch, n) for n in TORCH_DTYPE_NAMES if hasattr(torch, n)]
NUMPY_DTYPES = [
    np.dtype(n)
    for n in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
]


def float_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def float_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


NEG_NAN = float_from_bits(0xFFF8_0000_0000_0000)  # what x86 makes of inf * 0
PAYLOAD_NAN = float_from_bits(0x7FF8_0000_0000_0001)  # not representable as float32
NEG_PAYLOAD_NAN = float_from_bits(0xFFF4_0000_DEAD_BEEF)


# --------------------------------------------------------------------------- exact equality


def tensor_bits(t: torch.Tensor) -> bytes:
    """A tensor's values as bytes in C order (conj/neg views resolved)."""
    flat = t.resolve_conj().resolve_neg().reshape(-1)
    return bytes(flat.clone(memory_format=torch.contiguous_format).view(torch.uint8).numpy())


def short(x: Any) -> str:
    try:
        return repr(x)[:60]
    except ValueError:  # ints of over 4300 digits cannot be printed
        return f"<{type(x).__name__}>"


def assert_same(actual: Any, expected: Any, path: str = "value") -> None:
    """Exact equality: same types everywhere, floats and tensors compared bit for bit."""
    assert type(actual) is type(expected), (
        f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    )
    if isinstance(expected, float):  # Python floats and numpy float64 scalars
        assert float_bits(actual) == float_bits(expected), (
            f"{path}: {short(actual)} != {short(expected)}"
        )
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        assert tensor_bits(actual) == tensor_bits(expected), f"{path}: tensor values differ"
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        assert np.asarray(actual).tobytes() == np.asarray(expected).tobytes(), f"{path}: values"
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert len(actual) == len(expected), f"{path}: {len(actual)} keys != {len(expected)}"
        for i, ((ka, va), (ke, ve)) in enumerate(
            zip(actual.items(), expected.items(), strict=True)
        ):
            assert_same(ka, ke, f"{path}.key#{i}")
            assert_same(va, ve, f"{path}[{short(ke)}]")
    elif isinstance(expected, enum.Enum):
        assert actual is expected, f"{path}: {short(actual)} != {short(expected)}"
    elif dataclasses.is_dataclass(expected):
        assert_same(vars(actual), vars(expected), f"{path}.__dict__")
    elif not isinstance(expected, float):
        assert actual == expected, f"{path}: {short(actual)} != {short(expected)}"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0.0, -0.0),
        (math.nan, NEG_NAN),
        (math.nan, PAYLOAD_NAN),
        (1, True),
        (1, 1.0),
        ([1, 2], (1, 2)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({1: "x"}, {"1": "x"}),
        (np.float32(1), np.float64(1)),
        (np.array(1), np.array([1])),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64)),
        (torch.zeros(2), torch.zeros(1, 2)),
        (torch.tensor([0.0]), torch.tensor([-0.0])),
        (torch.tensor([math.nan, 1.0]), torch.tensor([1.0, math.nan])),
        (Sample(index=1), Sample(index=2)),
        (Sample(status=Sample.Status.FAILED), Sample(status=Sample.Status.ABORTED)),
        ({"t": torch.ones(1)}, {"t": torch.ones(1).numpy()}),
    ],
)
def test_assert_same_detects_differences(a: Any, b: Any) -> None:
    with pytest.raises(AssertionError):
        assert_same(a, b)
    with pytest.raises(AssertionError):
        assert_same(b, a)


def test_assert_same_accepts_equal_values() -> None:
    t = torch.arange(6.0).reshape(2, 3)
    value = {"x": [1, True, -0.0, math.nan], 2: (t.t(), np.float32(3))}
    assert_same(value, {"x": [1, True, -0.0, math.nan], 2: (t.t().contiguous(), np.float32(3))})


# --------------------------------------------------------------------------- helpers


def blob_bytes(blob: Any) -> bytes:
    return b"".join(bytes(p) for p in blob.parts)


class CountingLoader:
    """A tensor-blob loader over an encoded chunk's blobs that counts its calls; `array`
    is the array loader over the same blobs (its calls counted apart)."""

    def __init__(self, *chunks: EncodedChunk) -> None:
        self.blobs = {d: blob_bytes(b) for c in chunks for d, b in c.tensor_blobs.items()}
        self.calls: list[str] = []
        self.array_calls: list[str] = []

    def __call__(self, digest: str) -> torch.Tensor:
        self.calls.append(digest)
        return decode_tensor_blob(self.blobs[digest], digest)

    def array(self, digest: str) -> np.ndarray:
        self.array_calls.append(digest)
        return decode_array_blob(self.blobs[digest], digest)


def roundtrip(samples: list, inline_limit: int = DEFAULT_INLINE_LIMIT) -> list:
    enc = encode_chunk(samples, inline_limit=inline_limit)
    assert enc.samples == len(samples)
    assert enc.digest == digest_of(enc.data)
    loader = CountingLoader(enc)
    decoded = decode_chunk(enc.data, digest=enc.digest, loader=loader, array_loader=loader.array)
    assert not loader.calls, "decoding loaded a tensor blob"
    return [materialize_tensor_refs(s) for s in decoded]


def rt(value: Any, **kw: Any) -> Any:
    """One value through a chunk and back."""
    return roundtrip([{"v": value}], **kw)[0]["v"]


def record_tree(record: bytes) -> dict:
    (n,) = struct.unpack_from("<I", record, 0)
    return json.loads(record[4 : 4 + n].decode("utf-8", "surrogatepass"))


def stored_node(value: Any) -> Any:
    """The tree node the codec writes for ``value``."""
    return record_tree(build_chunk([{"v": value}]).records[0])["f"]["v"]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: Any
    y: Any = None
    color: Color = Color.RED


POINT_NAME = "tests.test_codec.Point"
register_sample_class(Point, POINT_NAME)


@dataclasses.dataclass
class Unregistered:
    x: int = 0


# --------------------------------------------------------------------------- strategies

CHARS = st.one_of(
    st.characters(),
    st.characters(categories=["Cs"]),  # lone surrogates occur in model output
    st.sampled_from(["\0", "\n", '"', "\\", "$", "é", "😀", "\u2028", "\ufeff"]),
)
TEXT = st.text(CHARS, max_size=12)
LONG_TEXT = st.text(CHARS, min_size=1, max_size=6).map(lambda s: s * (600 // len(s) + 1))
SPECIAL_FLOATS = st.sampled_from(
    [0.0, -0.0, math.inf, -math.inf, math.nan, NEG_NAN, PAYLOAD_NAN, NEG_PAYLOAD_NAN, 5e-324]
)
FLOATS = st.one_of(st.floats(), SPECIAL_FLOATS, st.integers(0, 2**64 - 1).map(float_from_bits))
# Built by map: Python refuses to print ints of over 4300 digits, and so would Hypothesis.
BIG_INTS = st.one_of(
    st.sampled_from([2**63, -(2**63) - 1, 2**64, -(2**100)]),
    st.integers(4000, 6000).map(lambda n: 10**n - 1),
)
INTS = st.one_of(st.integers(), st.integers(-(2**70), 2**70), BIG_INTS)
INT_RANGES = [
    (-128, 127),
    (0, 255),
    (-(2**15), 2**15 - 1),
    (0, 2**16 - 1),
    (-(2**31), 2**31 - 1),
    (0, 2**32 - 1),
    (-(2**63), 2**63 - 1),
    (-(2**70), 2**70),
]
INT_LISTS = st.sampled_from(INT_RANGES).flatmap(
    lambda r: st.lists(st.integers(*r), min_size=0, max_size=40)
)
FLOAT_LISTS = st.one_of(
    st.lists(st.floats(width=32), max_size=40),
    st.lists(FLOATS, max_size=40),
)
MIXED_LISTS = st.lists(
    st.one_of(st.integers(-3, 3), st.booleans(), st.floats(-2, 2), st.none()),
    min_size=8,
    max_size=20,
)


def _bytes_tensor(raw: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


@st.composite
def tensors(draw: st.DrawFn, dtypes: list[torch.dtype] = TORCH_DTYPES) -> torch.Tensor:
    """Any dtype, 0-d to 3-d, possibly empty, any bit pattern, possibly a non-contiguous view."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    view = draw(st.sampled_from(["plain", "transpose", "step", "offset", "expand", "conj"]))
    base_shape = list(shape)
    if view in ("step", "offset") and shape:
        base_shape[0] = 2 * shape[0] + 1
    n = math.prod(base_shape)
    if dtype is torch.bool:
        t = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
        t = t.reshape(base_shape)
    else:
        size = n * torch.empty((), dtype=dtype).element_size()
        t = _bytes_tensor(draw(st.binary(min_size=size, max_size=size)), dtype, base_shape)
    if view == "transpose" and t.dim() >= 2:
        t = t.transpose(0, t.dim() - 1)
    elif view == "step" and shape:
        t = t[::2][: shape[0]]
    elif view == "offset" and shape:
        t = t[1 : 1 + shape[0]]
    elif view == "expand" and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(3, *t.shape[1:])
    elif view == "conj" and dtype in (torch.complex64, torch.complex128):
        t = t.conj()  # a lazy conjugate view: the conj bit is set, the memory is not
    return t


@st.composite
def ndarrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(NUMPY_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    n = math.prod(shape)
    if dtype == np.bool_:
        arr = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    else:
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        arr = np.frombuffer(raw, dtype=dtype).copy()
    arr = arr.reshape(shape)
    if draw(st.booleans()) and arr.ndim >= 2:
        arr = arr.T  # Fortran order
    return arr


NP_SCALARS = ndarrays().filter(lambda a: a.size > 0).map(lambda a: a.reshape(-1)[0])
HASHABLE = st.one_of(
    st.none(), st.booleans(), INTS, FLOATS, TEXT, st.tuples(st.integers(), TEXT), NP_SCALARS
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    INTS,
    FLOATS,
    TEXT,
    LONG_TEXT,
    INT_LISTS,
    FLOAT_LISTS,
    MIXED_LISTS,
    tensors(),
    ndarrays(),
    ndarrays().filter(lambda a: a.size > 0).map(lambda a: a.reshape(-1)[:1].reshape(())),
    NP_SCALARS,
)
TAGGY_KEYS = st.sampled_from(["$t", "o", "n", "d", "v", "sh", "c", "f", "$t2", ""])
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.one_of(TEXT, TAGGY_KEYS), children, max_size=4),
        st.dictionaries(HASHABLE, children, max_size=3),
    ),
    max_leaves=12,
)
SAMPLE_FIELDS = [f.name for f in dataclasses.fields(Sample) if f.name != "status"]
EXTRA_NAMES = st.from_regex(r"x_[a-z0-9]{1,6}", fullmatch=True)
QUEUE = {"_queue_receipt": {"task_id": 7}, "_queue_lease": object()}


@st.composite
def samples(draw: st.DrawFn) -> tuple[Any, Any]:
    """(what is encoded, what must come back): dicts, Sample objects and registered points."""
    kind = draw(st.sampled_from(["dict", "sample", "point"]))
    if kind == "dict":
        keys = st.one_of(TEXT, TAGGY_KEYS, HASHABLE)
        entries = draw(st.dictionaries(keys, VALUES, max_size=5))
        return ({**entries, **QUEUE} if draw(st.booleans()) else dict(entries)), entries
    # Samples and points carry attributes added at run time: typed as Any.
    expected: Any
    given_sample: Any
    if kind == "point":
        expected = Point(draw(VALUES), draw(VALUES), draw(st.sampled_from(Color)))
        for name, value in draw(st.dictionaries(EXTRA_NAMES, VALUES, max_size=2)).items():
            setattr(expected, name, value)
        given_sample = copy.copy(expected)
        given_sample._queue_lease = {"task_id": 1}
        return given_sample, expected
    expected = Sample(status=draw(st.sampled_from(Sample.Status)))
    for name, value in draw(st.dictionaries(st.sampled_from(SAMPLE_FIELDS), VALUES)).items():
        if name not in ("spec_info", "prefix_cache_info"):
            setattr(expected, name, value)
    expected.spec_info.spec_verify_ct = draw(st.integers(0, 10))
    for name, value in draw(st.dictionaries(EXTRA_NAMES, VALUES, max_size=3)).items():
        setattr(expected, name, value)
    given_sample = copy.copy(expected)
    if draw(st.booleans()):
        given_sample._queue_receipt = {"task_id": 7}  # live queue state: never stored
    return given_sample, expected


# --------------------------------------------------------------------------- property tests


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batch=st.lists(samples(), min_size=1, max_size=3),
    inline_limit=st.sampled_from([0, 16, DEFAULT_INLINE_LIMIT]),
    data=st.data(),
)
def test_arbitrary_samples_round_trip_exactly(
    batch: list[tuple[Any, Any]], inline_limit: int, data: st.DataObject
) -> None:
    given_samples = [g for g, _ in batch]
    expected = [e for _, e in batch]
    enc = encode_chunk(given_samples, inline_limit=inline_limit)
    loader = CountingLoader(enc)
    decoded = decode_chunk(enc.data, loader=loader, array_loader=loader.array)
    assert not loader.calls
    materialized = [materialize_tensor_refs(s) for s in decoded]
    assert_same(materialized, expected)
    # random access decodes the same sample on its own
    i = data.draw(st.integers(0, len(batch) - 1))
    assert_same(
        materialize_tensor_refs(
            ChunkReader(enc.data, loader=loader, array_loader=loader.array).sample(i)
        ),
        expected[i],
    )
    # encoding is deterministic and canonical: re-encoding what came back gives the same bytes
    assert encode_chunk(materialized, inline_limit=inline_limit).data == enc.data
    assert encode_chunk(given_samples, inline_limit=inline_limit).data == enc.data


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=tensors(), inline_limit=st.sampled_from([0, 8, DEFAULT_INLINE_LIMIT]))
def test_tensors_round_trip_inline_and_as_blobs(t: torch.Tensor, inline_limit: int) -> None:
    enc = encode_chunk([{"t": t}], inline_limit=inline_limit)
    back = decode_chunk(enc.data, loader=CountingLoader(enc))[0]["t"]
    nbytes = t.numel() * t.element_size()
    if nbytes > inline_limit:
        assert isinstance(back, TensorRef)
        assert (back.dtype, back.shape, back.nbytes) == (t.dtype, t.shape, nbytes)
        assert set(enc.tensor_blobs) == {back.digest}
        back = back.materialize()
    else:
        assert not enc.tensor_blobs
    assert_same(back, t)
    # the decoded tensor owns writable memory
    assert back.is_contiguous()
    if back.numel():
        back.reshape(-1)[:1].view(torch.uint8)[0] ^= 1


@settings(max_examples=60, deadline=None)
@given(t=tensors())
def test_tensor_blob_round_trip(t: torch.Tensor) -> None:
    blob = encode_tensor_blob(t)
    data = blob_bytes(blob)
    assert blob.size == len(data)
    assert blob.digest == digest_of(data) and is_digest(blob.digest)
    assert data[:8] == b"AMTENSR\x00"
    back = decode_tensor_blob(data, blob.digest)
    assert_same(back, t)
    back_mv = decode_tensor_blob(memoryview(bytearray(data)))
    assert_same(back_mv, t)


# --------------------------------------------------------------------------- scalars and lists


@pytest.mark.parametrize(
    "x",
    [0.0, -0.0, math.inf, -math.inf, math.nan, NEG_NAN, PAYLOAD_NAN, NEG_PAYLOAD_NAN, 5e-324],
    ids=lambda x: hex(float_bits(x)),
)
def test_float_scalars_and_short_lists_are_bit_exact(x: float) -> None:
    assert float_bits(rt(x)) == float_bits(x)
    back = rt([x, 1.5, x])
    assert [float_bits(v) for v in back] == [float_bits(x), float_bits(1.5), float_bits(x)]
    assert_same(rt({x: x}), {x: x})


@pytest.mark.parametrize(
    "x",
    [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 3**500, 10**700, -(10**5000)],
    ids=lambda x: f"bits{x.bit_length()}{'neg' if x < 0 else ''}",
)
def test_ints_of_any_size(x: int) -> None:
    assert_same(rt(x), x)
    assert_same(rt([x] * 9), [x] * 9)  # beyond int64 a list falls back to exact JSON
    assert_same(rt([1] * 8 + [x]), [1] * 8 + [x])
    assert_same(rt({x: (x,)}), {x: (x,)})


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], "int8"),
        ([-128, 127] * 4, "int8"),
        ([0, 255] * 4, "uint8"),
        ([-1, 255] * 4, "int16"),
        ([-(2**15), 2**15 - 1] * 4, "int16"),
        ([0, 2**16 - 1] * 4, "uint16"),
        ([-1, 2**16 - 1] * 4, "int32"),
        ([-(2**31), 2**31 - 1] * 4, "int32"),
        ([0, 2**32 - 1] * 4, "uint32"),
        ([-1, 2**32 - 1] * 4, "int64"),
        ([-(2**63), 2**63 - 1] * 4, "int64"),
        (list(range(151_990, 152_000)), "int32"),  # token ids of a 152k vocabulary
    ],
)
def test_int_lists_are_narrowed_to_the_smallest_dtype(values: list[int], dtype: str) -> None:
    node = stored_node(values)
    assert node["$t"] == "list"
    assert node["d"] == dtype
    assert node["n"] == len(values) * np.dtype(dtype).itemsize
    assert_same(rt(values), values)


def test_int_list_beyond_int64_is_exact_but_not_an_array() -> None:
    values = [2**63, *range(10)]
    assert type(stored_node(values)) is list  # JSON, element by element
    assert_same(rt(values), values)


def test_long_int_lists_compress_to_their_narrow_size() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 100, size=20_000).tolist()
    enc = encode_chunk([{"tokens": tokens}])
    # int8 array, zstd on top: well under 1 byte per token (int64 would be 8)
    assert len(enc.data) < 20_000
    assert_same(decode_chunk(enc.data)[0]["tokens"], tokens)


F32 = [struct.unpack("<f", struct.pack("<I", b))[0] for b in (0x3F800000, 0x00000001, 0xBF000001)]


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([0.5, -0.25, 1.0, 2.0, -0.0, math.inf, -math.inf, 3.0], "float32"),
        ([math.nan, NEG_NAN, -0.0, 0.0, *F32, 2.0**100], "float32"),
        ([0.5] * 7 + [0.1], "float64"),  # 0.1 is not a float32
        ([0.5] * 7 + [PAYLOAD_NAN], "float64"),  # a payload float32 cannot hold
        ([0.5] * 7 + [1e300], "float64"),
        ([0.5] * 7 + [5e-324], "float64"),
    ],
)
def test_float_lists_are_float32_only_when_bit_exact(values: list[float], dtype: str) -> None:
    node = stored_node(values)
    assert (node["$t"], node["d"]) == ("list", dtype)
    assert node["n"] == len(values) * np.dtype(dtype).itemsize
    back = rt(values)
    assert [float_bits(v) for v in back] == [float_bits(v) for v in values]
    assert all(type(v) is float for v in back)


def test_encoding_odd_floats_does_not_warn() -> None:
    signalling = float_from_bits(0x7FF0_0000_0000_0001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under python -W error
        for values in ([1e300] * 8, [signalling] * 8, [0.5] * 7 + [-1e39]):
            assert_same(rt(values), values)


@pytest.mark.parametrize(
    "values",
    [
        [1, True, 2, False, 3, 0, 1, True, 0],
        [True, False] * 5,
        [1, 2.0, 3, 4.0, 5, 6, 7, 8],
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1],
        [1.0] * 7 + [np.float64(1.0)],  # a float subclass
        [1] * 7 + [np.int64(1)],
        [1] * 7 + [None],
        [1] * 7 + ["1"],
        [0.5] * 8 + [[0.5]],
    ],
)
def test_lists_mixing_types_keep_each_elements_type(values: list) -> None:
    assert_same(rt(values), values)


def test_numeric_lists_come_back_as_lists() -> None:
    for values in (list(range(100)), [0.5] * 100, [0.1] * 100, []):
        back = rt(values)
        assert type(back) is list
        assert_same(back, values)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "\ud800",
        "a\udfffb",
        "\ud83d\ude00",  # a surrogate *pair* written as two code points stays two
        "😀 é \0 \u2028",
        "x" * 511,
        "x" * 512,
        "\ud800é😀" * 400,
        "step " * 100_000,
    ],
    ids=lambda s: f"len{len(s)}",
)
def test_strings_round_trip(text: str) -> None:
    back = rt(text)
    assert type(back) is str and back == text and len(back) == len(text)
    assert_same(rt({text: [text]}), {text: [text]})


def test_containers_round_trip_with_their_types() -> None:
    value: dict[str, Any] = {
        "tuple": (1, (2, [3, (4,)]), ()),
        "map": {1: "a", None: "b", False: "c", 2.5: "d", (1, "x"): "e", "s": "f"},
        "$t": "a key the codec uses as its tag",
        "nested": {"$t": {"$t": ["list", "tensor"]}, "o": 1, "n": 2},
        "empty": [{}, [], ()],
    }
    assert_same(rt(value), value)
    # non-str keys and the tag key also work at the top level of a dict sample
    top = {1: "a", "$t": "ref", (2, 3): [4]}
    assert_same(roundtrip([top])[0], top)


def test_numpy_arrays_and_scalars_round_trip() -> None:
    values = [
        np.arange(12, dtype=np.int16).reshape(3, 4),
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
        np.arange(10, dtype=np.uint64)[::3],
        np.array(7, dtype=np.int32),  # 0-d
        np.array(1.5),
        np.zeros((0, 3), dtype=np.complex64),
        np.array([True, False]),
        np.float32(1.5),
        np.float64(-0.0),
        np.int8(-3),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex128(1 - 2j),
        np.float16(math.nan),
    ]
    back = rt(values)
    assert_same(back, values)
    assert np.asarray(back[1]).flags.writeable


def test_every_torch_dtype_round_trips_inline_and_as_blob() -> None:
    for dtype in TORCH_DTYPES:
        itemsize = torch.empty((), dtype=dtype).element_size()
        raw = bytes(range(7, 7 + 6 * itemsize))
        if dtype is torch.bool:
            t = torch.tensor([True, False, True, True, False, False]).reshape(2, 3)
        else:
            t = _bytes_tensor(raw, dtype, [2, 3])
        for value in (t, t.t(), t[0, 0], t[:0], torch.empty((0, 5), dtype=dtype)):
            assert_same(rt(value), value, f"{dtype} inline")
            assert_same(rt(value, inline_limit=0), value, f"{dtype} blob")


def test_conjugate_and_negative_views_store_their_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    for view in (z.conj(), z.conj().imag, torch._neg_view(torch.tensor([1.0, -2.0]))):
        expected = view.resolve_conj().resolve_neg().clone()
        assert_same(rt(view), expected)
        assert_same(rt(view, inline_limit=0), expected)


def test_tensor_requiring_grad_is_stored_detached() -> None:
    t = torch.arange(4.0, requires_grad=True)
    back = rt(t)
    assert not back.requires_grad
    assert_same(back, t.detach())


# --------------------------------------------------------------------------- samples


def test_sample_objects_come_back_as_samples() -> None:
    # Any: it carries attributes a framework adds at run time.
    s: Any = Sample(
        index=3, tokens=[1, 2, 3] * 5, status=Sample.Status.ABORTED, reward={"acc": 1.0}
    )
    s.custom = {"verifier": [0.5, None]}
    s.spec_info.spec_accept_token_num = 5
    s._queue_receipt = {"task_id": 1}
    s._queue_lease = object()  # not storable, but never stored
    back: Any
    (back,) = roundtrip([s])
    assert type(back) is Sample
    assert back.status is Sample.Status.ABORTED
    assert vars(back)["custom"] == {"verifier": [0.5, None]}
    assert back.spec_info.spec_accept_token_num == 5
    assert not hasattr(back, "_queue_receipt") and not hasattr(back, "_queue_lease")
    expected = copy.copy(s)
    del expected._queue_receipt, expected._queue_lease
    assert_same(back, expected)


def test_queue_keys_of_dict_samples_are_dropped() -> None:
    (back,) = roundtrip([{"a": 1, "_queue_receipt": {"task_id": 2}, "_queue_x": object()}])
    assert back == {"a": 1}


def test_registered_dataclass_round_trips_with_enum_and_extras() -> None:
    p: Any = Point(x=[1, 2], y=torch.ones(2), color=Color.BLUE)  # with attributes of its own
    p.label = "extra"
    p._queue_lease = {"task_id": 3}
    back: Any
    (back,) = roundtrip([p])
    assert type(back) is Point and back.color is Color.BLUE and vars(back)["label"] == "extra"
    assert not hasattr(back, "_queue_lease")
    expected: Any = Point(x=[1, 2], y=torch.ones(2), color=Color.BLUE)
    expected.label = "extra"
    assert_same(back, expected)


def test_unregistered_dataclass_and_objects_are_refused() -> None:
    with pytest.raises(UnencodableError, match=r"Unregistered.*register"):
        encode_chunk([Unregistered()])
    with pytest.raises(UnencodableError, match="object"):
        encode_chunk([object()])


# The warning is checked in tests/codec/test_frameworks.py (once per name); here the value.
@pytest.mark.filterwarnings("ignore::archive_manager.errors.UnregisteredClassWarning")
def test_unknown_sample_class_name_comes_back_as_a_dict() -> None:
    raw = build_chunk([Point(x=1, y="y")])
    assert POINT_NAME.encode() in raw.records[0]
    forged = raw.records[0].replace(POINT_NAME.encode(), POINT_NAME[:-1].encode() + b"Z")
    enc = RawChunk([raw.records[0], forged], {}).pack()
    known, unknown = decode_chunk(enc.data)
    assert type(known) is Point
    assert unknown == {"x": 1, "y": "y", "color": "red"}


def test_realistic_rollout_round_trips() -> None:
    rollout = make_rollout(16, seed=5, prompt_len=32, response_min=40, response_max=60)
    back = roundtrip(rollout)
    assert_same(back, rollout)
    assert {s.status for s in back} <= {Sample.Status.COMPLETED, Sample.Status.TRUNCATED}
    assert all(s.task_key.startswith("rollout-0/group-") for s in back)
    tree = record_tree(build_chunk(rollout[:1]).records[0])["f"]
    assert (tree["tokens"]["d"], tree["loss_mask"]["d"]) == ("int32", "int8")
    assert tree["rollout_log_probs"]["d"] == "float32"  # float32 values held as Python floats
    assert_same(
        roundtrip(make_rollout(4, seed=5, as_dict=True, prompt_len=16)),
        make_rollout(4, seed=5, as_dict=True, prompt_len=16),
    )


def test_realistic_rollout_with_routed_experts_becomes_lazy_refs() -> None:
    rollout: list[Any] = make_rollout(
        8, seed=2, prompt_len=16, response_min=20, response_max=40, r3_layers=4, group_size=4
    )
    enc = encode_chunk(rollout, inline_limit=1024)
    assert len(enc.tensor_blobs) == len(rollout)

    loader = CountingLoader(enc)
    back: list[Any] = decode_chunk(enc.data, loader=loader)
    for got, want in zip(back, rollout, strict=True):
        ref: Any = got.rollout_routed_experts
        assert isinstance(ref, TensorRef) and not ref.loaded
        assert ref.shape == want.rollout_routed_experts.shape
        assert ref.dtype is torch.int32
    assert not loader.calls
    # only the samples touched load their blob
    assert torch.equal(back[3].rollout_routed_experts, rollout[3].rollout_routed_experts)
    assert len(loader.calls) == 1
    assert_same([materialize_tensor_refs(s) for s in back], rollout)
    assert len(loader.calls) == len(rollout)


def test_chunk_of_zero_samples() -> None:
    enc = encode_chunk([])
    assert enc.samples == 0 and not enc.tensor_blobs
    assert decode_chunk(enc.data) == []
    reader = ChunkReader(enc.data)
    assert len(reader) == 0 and list(reader) == []
    with pytest.raises(IndexError):
        reader.sample(0)


def test_chunk_of_64_samples_with_random_access() -> None:
    rollout = make_rollout(64, seed=9, prompt_len=8, response_min=10, response_max=30)
    enc = encode_chunk(rollout)
    reader = ChunkReader(enc.data, digest=enc.digest)
    assert len(reader) == 64
    order = np.random.default_rng(0).permutation(64)
    for i in order:
        assert_same(reader.sample(int(i)), rollout[i], f"sample {i}")
    for bad in (64, -1, 10**6):
        with pytest.raises(IndexError):
            reader.sample(bad)


def test_build_chunk_then_pack_equals_encode_chunk() -> None:
    rollout = make_rollout(4, seed=1, prompt_len=8, response_min=10, response_max=20)
    assert build_chunk(rollout).pack().data == encode_chunk(rollout).data


# --------------------------------------------------------------------------- random access


INDEX_AT = 16  # chunk header size; an index entry is 32 bytes (version 1) or 56 (version 2)


def record_span(data: bytes, i: int) -> tuple[int, int, int]:
    """Record ``i``'s offset, stored bytes (both parts of a version 2 record; the samples
    here have no text fields, so the rest is the whole record) and method."""
    if struct.unpack_from("<H", data, 8) == (1,):
        offset, stored, _raw, method = struct.unpack_from("<QQQB", data, INDEX_AT + 32 * i)
        return offset, stored, method
    offset, t_stored, _, r_stored, _, _, method = struct.unpack_from(
        "<QQQQQBB", data, INDEX_AT + 56 * i
    )
    return offset, t_stored + r_stored, method


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("compressible", [True, False])
@pytest.mark.parametrize("size", [2000, 400_000])  # the large: a buffer each, own threads
def test_damaged_record_does_not_affect_its_neighbours(
    compressible: bool, version: int, size: int
) -> None:
    rng = np.random.default_rng(1)
    if compressible:
        batch = [
            {"i": i, "text": "words " * 200, "ids": list(range(300)), "a": np.arange(size // 8)}
            for i in range(3)
        ]
    else:  # random bytes as a tensor: zstd does not pay, the record is stored raw
        batch = [
            {"i": i, "t": torch.frombuffer(bytearray(rng.bytes(size)), dtype=torch.uint8)}
            for i in range(3)
        ]
    enc = encode_chunk(batch, version=version)
    offset, stored, method = record_span(enc.data, 1)
    assert method == (1 if compressible else 0)
    for damage in ("ff", "zero", "flip-tree"):
        data = bytearray(enc.data)
        if damage == "ff":
            data[offset : offset + stored] = b"\xff" * stored
        elif damage == "zero":
            data[offset : offset + stored] = bytes(stored)
        else:
            data[offset + 4] ^= 0x40  # raw: the tree's "{"; zstd: the frame header
        reader = ChunkReader(bytes(data))
        reader.inflate(range(3))
        assert_same(reader.sample(0), batch[0])
        assert_same(reader.sample(2), batch[2])
        with pytest.raises(IntegrityError, match="record 1"):
            reader.sample(1)
        with pytest.raises(IntegrityError):
            decode_chunk(bytes(data))


def test_reader_accepts_bytes_bytearray_and_memoryview() -> None:
    batch = [{"a": i, "t": torch.arange(i + 1)} for i in range(3)]
    data = encode_chunk(batch).data
    for buf in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))):
        assert_same(decode_chunk(buf), batch)


@pytest.mark.parametrize("size", [64, 400_000])
def test_decoded_tensors_do_not_alias_the_chunk_buffer(size: int) -> None:
    # the large ones are random, stored raw: a writable part of the caller's buffer, which
    # no value may be a view of (see the next test)
    rng = np.random.default_rng(2)
    t = torch.frombuffer(bytearray(rng.bytes(size)), dtype=torch.uint8)
    a = np.frombuffer(rng.bytes(size), np.uint8)
    for sample in ({"t": t}, {"a": a}):
        buf = bytearray(encode_chunk([sample]).data)
        value = decode_chunk(buf)[0]
        before = bytes(buf)
        value["t" if "t" in sample else "a"] += 1
        assert bytes(buf) == before


def test_an_array_most_of_its_record_loads_in_place() -> None:
    """A numpy array or inline tensor holding most of its (large) record is a view of the
    buffer the record was inflated into, not a copy of it (issue 37's R3 load: the copy of
    125 MB of routed-expert ids was a third of it): writable and the caller's own.  An
    array that is a small part of its record is copied, so it does not keep the record
    alive."""
    rng = np.random.default_rng(5)
    # 0.9 MB, compressible: within the inline limit (a larger array is a blob of its own)
    experts = rng.integers(0, 256, (600, 48, 8), dtype=np.int32)
    inline = torch.from_numpy(rng.integers(0, 4, 200_000, dtype=np.int32))  # 0.8 MB
    small = np.arange(16.0)
    batch = [
        {"experts": experts, "tokens": list(range(3000))},
        {"t": inline, "ids": list(range(100))},
        {"small": small, "ids": rng.integers(0, 2**40, 60_000).tolist()},
    ]
    data = encode_chunk(batch).data
    for ahead in (False, True):
        reader = ChunkReader(data)
        if ahead:
            reader.inflate(range(3))
        tracemalloc.start()
        try:
            got = reader.sample(0)["experts"]
            _, peak = tracemalloc.get_traced_memory()
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            tensor = reader.sample(1)["t"]
            tensor_peak = tracemalloc.get_traced_memory()[1] - held
        finally:
            tracemalloc.stop()
        # inflated here (one buffer) or ahead (none), never copied out of it
        limit = 0.5 if ahead else 1.5
        assert peak < experts.nbytes * limit and tensor_peak < inline.nbytes * limit
        assert np.array_equal(got, experts) and got.flags.writeable
        assert torch.equal(tensor, inline)
        got[:] = 7
        tensor += 1
        again = ChunkReader(data)
        assert np.array_equal(again.sample(0)["experts"], experts)
        assert torch.equal(again.sample(1)["t"], inline)
        copied = reader.sample(2)["small"]
        assert np.array_equal(copied, small) and copied.flags.owndata


# --------------------------------------------------------------------------- inline limit


def test_inline_limit_boundary_and_zero() -> None:
    t = torch.arange(4, dtype=torch.int32)  # 16 bytes
    assert isinstance(stored_node(t), dict) and stored_node(t)["$t"] == "tensor"
    enc = encode_chunk([{"t": t}], inline_limit=16)
    assert not enc.tensor_blobs
    enc = encode_chunk([{"t": t}], inline_limit=15)
    assert len(enc.tensor_blobs) == 1
    enc = encode_chunk(
        [{"t": t, "s": torch.tensor(1), "e": torch.empty(0), "a": np.arange(9)}], inline_limit=0
    )
    loader = CountingLoader(enc)
    back = decode_chunk(enc.data, loader=loader, array_loader=loader.array)[0]
    assert isinstance(back["t"], TensorRef) and isinstance(back["s"], TensorRef)
    assert back["s"].shape == torch.Size([])
    assert type(back["e"]) is torch.Tensor  # zero bytes: nothing to put in a blob
    # a numeric array above the limit is a blob too, read as it is decoded
    assert type(back["a"]) is np.ndarray and np.array_equal(back["a"], np.arange(9))
    assert len(enc.tensor_blobs) == 3 and len(loader.array_calls) == 1
    with pytest.raises(ValueError):
        encode_chunk([{}], inline_limit=-1)


def test_identical_tensors_are_stored_once_across_samples() -> None:
    a = torch.arange(100, dtype=torch.int64)
    batch = [{"a": a, "b": a.clone()}, {"c": [a.clone()], "d": a.view(10, 10)}]
    enc = encode_chunk(batch, inline_limit=64)
    # a, its clones share one blob; the 10x10 view has another header, so another blob
    assert len(enc.tensor_blobs) == 2
    other = encode_chunk([{"x": a.to(torch.float64)}, {"y": a.clone()}], inline_limit=64)
    assert set(other.tensor_blobs) & set(enc.tensor_blobs)  # same digest across chunks
    loader = CountingLoader(enc)
    back = [
        materialize_tensor_refs(s)
        for s in decode_chunk(enc.data, loader=loader, array_loader=loader.array)
    ]
    assert_same(back, batch)
    for digest, blob in enc.tensor_blobs.items():
        assert digest == digest_of(blob_bytes(blob)) and blob.size == len(blob_bytes(blob))


# --------------------------------------------------------------------------- tensor blobs


def _tensor_blob(header: Any, body: bytes, *, version: int = 1, magic: bytes = b"AMTENSR\0"):
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<8sHHI", magic, version, 0, len(head)) + head + body


def test_tensor_blob_is_header_then_raw_bytes() -> None:
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    data = blob_bytes(encode_tensor_blob(t))
    assert data.endswith(t.numpy().tobytes())
    assert (len(data) - 12) % 64 == 0  # header padded so the tensor bytes are aligned
    assert_same(
        decode_tensor_blob(_tensor_blob({"dtype": "int16", "shape": [2, 3]}, t.numpy().tobytes())),
        t,
    )


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", IntegrityError, "blob-x"),
        (b"AMTENSR\x00", IntegrityError, "blob-x"),
        (
            _tensor_blob({"dtype": "int8", "shape": [1]}, b"\1", magic=b"AMCHUNK\0"),
            UnsupportedFormatError,
            "magic",
        ),
        (
            _tensor_blob({"dtype": "int8", "shape": [1]}, b"\1", version=2),
            UnsupportedFormatError,
            "version 2",
        ),
        (
            _tensor_blob({"dtype": "int8", "shape": [1]}, b"\1", version=0),
            UnsupportedFormatError,
            "version 0",
        ),
        (_tensor_blob({"dtype": "int8", "shape": [2]}, b"\1"), IntegrityError, "bytes"),
        (_tensor_blob({"dtype": "int8", "shape": [1]}, b"\1\2"), IntegrityError, "bytes"),
        (_tensor_blob({"dtype": "float128", "shape": [1]}, b"\1"), IntegrityError, "float128"),
        (_tensor_blob({"dtype": "int8", "shape": [-1]}, b"\1"), IntegrityError, "shape"),
        (_tensor_blob({"dtype": "int8", "shape": [1.0]}, b"\1"), IntegrityError, "shape"),
        (_tensor_blob({"dtype": "int8", "shape": [True]}, b"\1"), IntegrityError, "shape"),
        (_tensor_blob({"dtype": "int8", "shape": "1"}, b"\1"), IntegrityError, "shape"),
        (_tensor_blob({"dtype": "int8", "shape": [1] * 65}, b"\1"), IntegrityError, "dimensions"),
        (_tensor_blob({"dtype": "int8"}, b"\1"), IntegrityError, "shape"),
        (_tensor_blob([1, 2], b"\1"), IntegrityError, "blob-x"),
        (_tensor_blob(b"{not json", b"\1"), IntegrityError, "blob-x"),
        (_tensor_blob(b"\xff\xfe\xfa", b"\1"), IntegrityError, "blob-x"),
        (_tensor_blob({"dtype": "int8", "shape": [2**40]}, b"\1"), IntegrityError, "bytes"),
        (_tensor_blob({"dtype": "int8", "shape": [0, 2**70]}, b""), IntegrityError, "blob-x"),
        (
            _tensor_blob({"dtype": "int8", "shape": [0, 2**62, 2**62]}, b""),
            IntegrityError,
            "blob-x",
        ),
        (struct.pack("<8sHHI", b"AMTENSR\0", 1, 0, 2**32 - 1) + b"{}", IntegrityError, "blob-x"),
    ],
)
@pytest.mark.parametrize("decode", [decode_tensor_blob, decode_array_blob])
def test_tensor_blob_header_errors(data: bytes, error: type, match: str, decode: Any) -> None:
    """Both readers of the format (torch's, numpy's) refuse the same damage alike."""
    with pytest.raises(error, match=match) as info:
        decode(data, "blob-x")
    assert type(info.value) is error


# --------------------------------------------------------------------------- arrays as blobs


def test_an_array_above_the_limit_is_the_tensor_blob_of_its_values() -> None:
    """A numeric numpy array above the inline limit is a blob of the tensor-blob format
    (one blob for an array and a tensor of one dtype, shape and bytes), read back by numpy
    alone as the array the sample held: writable, the caller's own, exactly equal; arrays
    of text, and those within the limit, stay in the record."""
    experts = np.arange(2 * 300 * 8, dtype=np.int32).reshape(2, 300, 8)
    mask = np.ones(5000, dtype=bool)
    strided = np.arange(4000, dtype=np.float64).reshape(40, 100).T  # not C-contiguous
    sample = {
        "e": experts,
        "again": experts,  # the same array twice: one blob, one array on load
        "mask": mask,
        "t": strided,
        "small": np.arange(4, dtype=np.int8),
        "text": np.array(["x" * 200] * 30),  # 24 KB of text: stays inline
        "zero": np.zeros((0, 4096), dtype=np.float32),  # no bytes: nothing to put in a blob
    }
    enc = encode_chunk([sample], inline_limit=1024)
    node = record_tree(build_chunk([sample], inline_limit=1024).records[0])["f"]
    assert {k: node[k]["$t"] for k in sample} == {
        "e": "ndref",
        "again": "ndref",
        "mask": "ndref",
        "t": "ndref",
        "small": "ndarray",
        "text": "ndarray",
        "zero": "ndarray",
    }
    assert len(enc.tensor_blobs) == 3
    assert node["e"]["h"] == encode_tensor_blob(torch.from_numpy(experts)).digest
    loader = CountingLoader(enc)
    (back,) = decode_chunk(enc.data, loader=loader, array_loader=loader.array)
    assert loader.calls == [] and sorted(loader.array_calls) == sorted(enc.tensor_blobs)
    assert_same(back, sample)
    assert back["again"] is back["e"] and back["e"].flags.writeable
    back["e"][0, 0, 0] = -1
    (again,) = decode_chunk(enc.data, loader=loader, array_loader=loader.array)
    assert again["e"][0, 0, 0] == 0


def test_an_array_blob_needs_an_array_loader_and_its_own_values() -> None:
    """Without an array loader an array blob is not read (a clear error, not damage); a
    loader handing back another dtype or shape than the record says is damage."""
    arr = np.arange(1000, dtype=np.int64)
    enc = encode_chunk([{"a": arr}], inline_limit=0)
    (digest,) = enc.tensor_blobs
    with pytest.raises(InvalidInputError, match=f"{digest}.*array_loader"):
        decode_chunk(enc.data)
    for wrong in (arr.astype(np.int32), arr.reshape(10, 100)):

        def loader(_digest: str, wrong: np.ndarray = wrong) -> np.ndarray:
            return wrong

        with pytest.raises(IntegrityError, match=digest):
            decode_chunk(enc.data, array_loader=loader)


def test_an_array_blob_in_a_text_field_is_read_by_every_text_reader() -> None:
    """A text field (``prompt``: chat messages whose content parts hold an image) holding an
    array above the limit is read through the array loader by every reader of the text part,
    as by `ChunkReader.sample`: `ChunkReader.fields` and `search_texts` (a search, a grouping
    by ``prompt``).  Fixed: both decoded the text part without the loader and raised
    "needs an array_loader"."""
    image = np.arange(4000, dtype=np.uint8)
    prompt = [{"role": "user", "content": [{"type": "image", "image": image}, "hi"]}]
    enc = encode_chunk([{"prompt": prompt, "response": "ok", "x": 1}], inline_limit=1024)
    loader = CountingLoader(enc)
    reader = ChunkReader(enc.data, loader=loader, array_loader=loader.array)
    for found in (
        reader.fields(0, ["prompt", "x"]),
        dict(reader.search_texts([0], ["prompt"], None))[0],
    ):
        assert found is not None
        assert np.array_equal(found["prompt"][0]["content"][0]["image"], image)
    assert loader.array_calls == list(enc.tensor_blobs) * 2


def test_an_array_blob_of_a_dtype_numpy_lacks_is_damage() -> None:
    """A bfloat16 tensor blob named by an array node (no encoder writes one) is refused."""
    data = blob_bytes(encode_tensor_blob(torch.ones(4, dtype=torch.bfloat16)))
    with pytest.raises(IntegrityError, match="bfloat16"):
        decode_array_blob(data, "blob-x")


# --------------------------------------------------------------------------- TensorRef


@pytest.fixture
def ref_and_tensor() -> tuple[TensorRef, torch.Tensor, CountingLoader]:
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    enc = encode_chunk([{"t": t}], inline_limit=0)
    loader = CountingLoader(enc)
    ref = decode_chunk(enc.data, loader=loader)[0]["t"]
    assert isinstance(ref, TensorRef)
    return ref, t, loader


def test_tensor_ref_metadata_does_not_load(ref_and_tensor: Any) -> None:
    ref, t, loader = ref_and_tensor
    assert ref.shape == t.shape and ref.dtype == t.dtype
    assert len(ref) == 2 and ref.numel() == 24 and ref.dim() == 3
    assert ref.size() == t.size() and ref.size(1) == 3 and ref.nbytes == 96
    assert ref.digest in repr(ref) and "float32" in repr(ref)
    assert not ref.loaded and loader.calls == []


@pytest.mark.parametrize(
    "touch",
    [
        lambda r, t: torch.equal(r, t),
        lambda r, t: torch.equal(t, r),
        lambda r, t: bool(torch.all(r.materialize() == t)),
        lambda r, t: r.sum().item() == t.sum().item(),
        lambda r, t: r.tolist() == t.tolist(),
        lambda r, t: torch.equal(r[1, 2], t[1, 2]),
        lambda r, t: bool((r == t).all()),
        lambda r, t: not bool((r != t).any()),
        lambda r, t: torch.equal(t + r, 2 * t),
        lambda r, t: torch.equal(torch.add(r, 1), t + 1),
        lambda r, t: torch.equal(torch.cat([r, t]), torch.cat([t, t])),
        lambda r, t: np.array_equal(np.asarray(r), t.numpy()),
        lambda r, t: r.is_contiguous(),
    ],
)
def test_tensor_ref_loads_once_when_touched(
    ref_and_tensor: Any, touch: Callable[[TensorRef, torch.Tensor], bool]
) -> None:
    ref, t, loader = ref_and_tensor
    assert touch(ref, t)
    assert ref.loaded and loader.calls == [ref.digest]
    assert touch(ref, t)
    assert ref.materialize() is ref.materialize()
    assert loader.calls == [ref.digest]


def test_tensor_ref_loads_once_under_threads() -> None:
    t = torch.arange(1000)
    blob = encode_tensor_blob(t)
    calls = []

    def slow_loader(digest: str) -> torch.Tensor:
        calls.append(digest)
        time.sleep(0.05)
        return decode_tensor_blob(blob_bytes(blob), digest)

    ref = TensorRef(blob.digest, t.dtype, t.shape, 8000, slow_loader)
    results: list[torch.Tensor] = []
    threads = [threading.Thread(target=lambda: results.append(ref.materialize())) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(calls) == 1 and len(results) == 8
    assert all(r is results[0] for r in results)


def test_zero_dim_ref_has_no_len() -> None:
    ref = TensorRef("0" * 32, torch.int64, [], 8)
    assert ref.numel() == 1 and ref.dim() == 0
    with pytest.raises(TypeError):
        len(ref)


@pytest.mark.parametrize(
    "returned",
    [
        torch.zeros(2, 3, 4, dtype=torch.float64),
        torch.zeros(2, 3, 5),
        torch.zeros(24),
        torch.zeros((), dtype=torch.float32),
    ],
)
def test_tensor_ref_rejects_a_loader_returning_another_tensor(returned: torch.Tensor) -> None:
    ref = TensorRef("ab" * 16, torch.float32, [2, 3, 4], 96, lambda d: returned)
    with pytest.raises(IntegrityError, match="ab" * 16):
        ref.materialize()
    assert not ref.loaded


def test_tensor_ref_without_loader() -> None:
    ref = TensorRef("ab" * 16, torch.float32, [2], 8)
    with pytest.raises(ArchiveError, match="no loader"):
        ref.materialize()
    with pytest.raises(ArchiveError):
        ref.sum()


def test_tensor_ref_reencodes_as_its_tensor(ref_and_tensor: Any) -> None:
    ref, t, _ = ref_and_tensor
    assert_same(rt({"again": ref}), {"again": t})


def test_materialize_tensor_refs_in_containers_and_samples() -> None:
    t = torch.arange(10)
    s: Any = Sample(index=1)  # with an attribute of its own
    s.rollout_routed_experts = t
    s.extra = {"chunks": [t, (t,)]}
    enc = encode_chunk([{"x": [t, (t, {"k": t})], "n": 1}, s], inline_limit=0)
    loader = CountingLoader(enc)
    d, back = decode_chunk(enc.data, loader=loader)
    assert isinstance(back.rollout_routed_experts, TensorRef)
    assert isinstance(back.extra["chunks"][1][0], TensorRef)
    md = materialize_tensor_refs(d)
    assert_same(md, {"x": [t, (t, {"k": t})], "n": 1})
    same = materialize_tensor_refs(back)
    assert same is back  # dataclass samples are updated in place
    assert_same(back, s)
    # one blob for all six refs; the refs of one tensor within a sample are one ref, loaded
    # once per sample when materialized
    assert len(enc.tensor_blobs) == 1
    assert len(loader.calls) == 2 and set(loader.calls) == set(enc.tensor_blobs)
    assert back.extra["chunks"][0] is back.rollout_routed_experts
    assert materialize_tensor_refs(5) == 5 and materialize_tensor_refs(None) is None


# --------------------------------------------------------------------------- manifests


def test_manifest_round_trip() -> None:
    manifest = {
        "format": "archive_manager.manifest",
        "name": "run/rollout_3 — ü",
        "rollout_id": 3,
        "evaluation": False,
        "attrs": {"lr": 1e-6, "nested": [1, [2, None]], "big": 2**80},
        "chunks": ["ab" * 16] * 3,
        "entries": [[i, f"sample:{i}", None, 0, i] for i in range(200)],
    }
    data = encode_manifest(manifest)
    assert data[:8] == b"AMMANIF\x00"
    assert decode_manifest(data, "m") == manifest
    assert decode_manifest(memoryview(bytearray(data))) == manifest
    assert len(data) < len(json.dumps(manifest))  # compressed


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda d: b"AMCHUNK\0" + d[8:], UnsupportedFormatError, "magic"),
        (lambda d: d[:8] + struct.pack("<H", 9) + d[10:], UnsupportedFormatError, "version 9"),
        (lambda d: d[:20], IntegrityError, "manifest blob m"),
        (lambda d: d[:10], IntegrityError, "manifest blob m"),
        (lambda d: d[:12] + struct.pack("<I", 1) + d[16:], IntegrityError, "size"),
        (lambda d: d[:12] + struct.pack("<I", 2**32 - 1) + d[16:], IntegrityError, "size"),
        (lambda d: d[:16] + b"\0" * (len(d) - 16), IntegrityError, "manifest blob m"),
    ],
)
def test_manifest_errors(mutate: Callable[[bytes], bytes], error: type, match: str) -> None:
    data = encode_manifest({"name": "a", "entries": list(range(50))})
    with pytest.raises(error, match=match) as info:
        decode_manifest(mutate(data), "m")
    assert type(info.value) is error


def test_manifest_must_be_a_mapping() -> None:
    data = encode_manifest([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(IntegrityError, match="mapping"):
        decode_manifest(data)


# --------------------------------------------------------------------------- chunk headers


def test_chunk_header_errors() -> None:
    data = encode_chunk([{"a": 1}]).data
    with pytest.raises(UnsupportedFormatError, match="version 3"):
        ChunkReader(data[:8] + struct.pack("<H", 3) + data[10:])
    with pytest.raises(UnsupportedFormatError, match="magic"):
        decode_chunk(b"AMTENSR\0" + data[8:])
    with pytest.raises(UnsupportedFormatError, match="magic"):
        decode_chunk(encode_manifest({"a": 1}))
    with pytest.raises(IntegrityError, match="chunk blob c1"):
        ChunkReader(data[:15], digest="c1")
    with pytest.raises(IntegrityError, match="index"):
        ChunkReader(data[:12] + struct.pack("<I", 1000) + data[16:])


# --------------------------------------------------------------------------- unencodable


class Plain:
    pass


class Level(enum.IntEnum):
    LOW = 1


class Name(str):
    pass


def _cycle_list() -> list:
    a: list = [1]
    a.append(a)
    return a


def _cycle_dict() -> dict:
    a: dict = {}
    a["self"] = {"inner": [a]}
    return a


def _deep(depth: int) -> list:
    root: list = []
    cur = root
    for _ in range(depth):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    return root


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Plain(), "Plain"),
        (lambda: {1, 2}, "set"),
        (lambda: frozenset(), "frozenset"),
        (lambda: memoryview(b"x"), "memoryview"),
        (lambda: 1 + 2j, "complex"),
        (lambda: decimal.Decimal("1.5"), "Decimal"),
        (lambda: Level.LOW, "Level"),
        (lambda: [Level.LOW] * 8, "Level"),
        (lambda: Name("x"), "Name"),
        (lambda: torch.float32, "dtype"),
        (lambda: range(3), "range"),
        (lambda: (x for x in range(0)), "generator"),
        (lambda: torch.zeros(3).to_sparse(), "sparse"),
        (lambda: torch.zeros(2, 2).to_sparse_csr(), "sparse"),
        (lambda: torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.quint8), "quint8"),
        (lambda: torch.empty(3, device="meta"), "meta"),
        (lambda: np.array([object()]), "object"),  # numpy text and object arrays are values:
        # tests/codec/test_value_types.py; an object array's items are judged one by one
        (lambda: np.zeros(2, dtype=">f4"), ">f4"),
        (lambda: np.array(["2020-01-01"], dtype="datetime64[D]"), "datetime64"),
        (lambda: np.ma.masked_array([1.0, 2.0], mask=[True, False]), "MaskedArray"),
        (lambda: _cycle_list(), "cycle"),
        (lambda: _cycle_dict(), "cycle"),
        (lambda: _deep(5000), "deep"),
    ],
)
def test_unencodable_values_are_refused_with_their_type(
    make: Callable[[], Any], match: str
) -> None:
    with pytest.raises(UnencodableError, match=match):
        encode_chunk([{"ok": 1, "bad": make()}])
    with pytest.raises(UnencodableError, match=match):
        encode_chunk([{"ok": [1, 2, 3], "nested": {"k": [make()]}}], inline_limit=0)


def test_unencodable_map_key_is_refused() -> None:
    with pytest.raises(UnencodableError, match="frozenset"):
        encode_chunk([{frozenset([1]): 1}])
    with pytest.raises(UnencodableError, match="Plain"):
        encode_chunk([{"m": {Plain(): 1}}])


def test_deep_but_reasonable_nesting_round_trips() -> None:
    value = _deep(150)
    assert rt(value) == value


def test_shared_subvalues_are_not_cycles() -> None:
    shared = [1, 2, 3]
    value = {"a": shared, "b": [shared, (shared,)], "c": {"x": shared}}
    assert_same(rt(value), value)


def test_tensor_ref_supports_the_tensor_operators() -> None:
    tensor = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    loads = []

    def loader(digest: str) -> torch.Tensor:
        loads.append(digest)
        return tensor.clone()

    # Any: the operators reach the tensor through __torch_function__, which no stub declares.
    ref: Any = TensorRef("0" * 32, tensor.dtype, tensor.shape, 24, loader)
    assert torch.equal(ref + 1, tensor + 1)

    assert torch.equal(1 + ref, tensor + 1)
    assert torch.equal(-ref, -tensor)
    assert torch.equal(ref * ref, tensor * tensor)
    assert torch.equal(ref > 2, tensor > 2)
    assert torch.equal(next(iter(ref)), tensor[0])
    assert loads == ["0" * 32]  # loaded once, on first use
