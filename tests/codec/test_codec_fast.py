"""The encoder's fast paths store exactly what the general (Python) paths store: the numeric
list fast path (through marshal) and the C list conversion, which leave every other list to
the general path; the C loop over a dict's items; the cached JSON encoder; the one-copy read
of a dataclass sample; the joined-keys test of `_strip_queue`.

The Python paths (`python_only`) are the reference.  A test named "break" failed (or crashed
the interpreter) on the code it was written against, for the reason its docstring gives.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from helpers import python_array, python_only
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import codec
from archive_manager.codec import (
    _accel,
    build_chunk,
    decode_chunk,
    decode_tensor_blob,
    encode_chunk,
    materialize_tensor_refs,
)
from archive_manager.codec.tensor_ref import TensorRef
from archive_manager.samples import (
    QUEUE_PREFIX,
    fields_to_sample,
    is_queue_key,
    register_sample_class,
    sample_to_record,
)
from archive_manager.samples import records as samples


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
            bytes(enc.tensor_blobs[h].parts[0]) + bytes(enc.tensor_blobs[h].parts[1]), h
        ),
    )
    tokens, inner = sample["tokens"], sample["d"]
    out = materialize_tensor_refs(sample)
    assert out is not sample  # it held a ref
    assert out["tokens"] is tokens and out["d"] is inner  # no ref inside: the same objects
    assert out["mixed"][0] == 1 and torch.equal(out["mixed"][1], t)
    plain = {"a": [1, 2, 3], "b": ("x", None)}
    assert materialize_tensor_refs(plain) is plain


ROOT = Path(__file__).resolve().parents[2]


NATIVE = (codec._native_numbers, codec._native_first_leaves, codec._native_dict_items)


needs_native = pytest.mark.skipif(
    NATIVE[2] is None, reason=f"the C extension is not built or {_accel.NO_NATIVE_ENV} is set"
)


def _outcome(make: Callable[[], Any]) -> tuple[str, Any]:
    """What encoding a fresh ``make()`` gives: ("ok", tree bytes and arrays) or the error."""
    encoder = codec._Encoder(codec._Record(codec.DEFAULT_INLINE_LIMIT, {}))
    try:
        tree = codec.values._dumps(encoder.encode(make()))
    except Exception as exc:  # compared between the two paths, whatever it is
        return type(exc).__name__, str(exc)
    return "ok", (tree, b"".join(map(bytes, encoder.record.arrays)))


def _both(make: Callable[[], Any]) -> tuple[tuple[str, Any], tuple[str, Any]]:
    native = _outcome(make)
    with python_only():
        python = _outcome(make)
    return native, python


def _swapping(first: str, newkey: Any) -> Callable[[], Any]:
    """A dict whose tensor ref's loader (user code run by encode) removes one key and adds
    ``newkey``: the size stays, so only the iterator's count of items notices."""

    def make() -> Any:
        d: dict[Any, Any] = {}

        def loader(digest: str) -> torch.Tensor:
            del d["a"]
            d[newkey] = "x"
            return torch.zeros(2)

        ref = TensorRef("0" * 64, torch.float32, [2], 8, loader)
        if first == "a":  # the removed key already encoded
            d.update(a=1, b=ref)
        else:  # the removed key still ahead
            d.update(b=ref, a=1, c=2)
        return {"outer": d}

    return make


@pytest.mark.timeout(120)
@needs_native
@pytest.mark.parametrize("newkey", ["c", "$t"])
def test_break_a_key_swapped_under_the_c_loop_is_refused_as_the_python_loop_refuses_it(
    newkey: str,
) -> None:
    """Claim 1 (break): the C loop wrote a dict whose loader swapped an encoded key for a new
    one (``{"a": 1, "b": ref, "c": "x"}``, and with ``"$t"`` a tag node that made the record
    unreadable) where the Python loop's iterator raised "dictionary keys changed"."""
    native, python = _both(_swapping("a", newkey))
    assert native == python == ("RuntimeError", "dictionary keys changed during iteration")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("newkey", [5, "$t"])
def test_break_an_odd_key_swapped_in_ahead_is_refused_by_both_loops(newkey: Any) -> None:
    """Claim 1 (break, in the Python reference too): when the removed key is still ahead,
    neither iterator notices the swap, and both loops wrote the new key into the tree: an int
    key as a string (it loaded as ``"5"``), ``"$t"`` as a tag (an unreadable record)."""
    native, python = _both(_swapping("b", newkey))
    assert native == python == ("RuntimeError", "dictionary keys changed during iteration")


@pytest.mark.timeout(120)
def test_a_str_key_swapped_in_ahead_is_written_as_the_python_loop_writes_it() -> None:
    """Claim 1: the same swap with a plain new key is what a dict iterator allows; both
    loops write the dict as it then is."""
    native, python = _both(_swapping("b", "z"))
    assert native == python
    assert native[0] == "ok" and b'"z":"x"' in native[1][0]


_DEEP = """
import sys
from archive_manager import codec
sys.setrecursionlimit(100_000)
value = inner = {}
for _ in range(DEPTH):
    inner["k"] = inner = {}
try:
    print(len(codec.encode_sample({"f": value}).record))
except codec.UnencodableError as exc:
    print(exc)
"""


@pytest.mark.timeout(120)
@needs_native
@pytest.mark.parametrize(("depth", "expect"), [(20_000, "120032"), (200_000, "nested too deeply")])
def test_break_deep_dicts_under_a_raised_recursion_limit_do_not_crash(
    depth: int, expect: str
) -> None:
    """Claim 1 (break): each level of dicts held C stack in dict_items and the interpreter
    frame it calls back, which the recursion limit does not bound; under
    ``sys.setrecursionlimit(100_000)`` 12,000 nested dicts were a segfault, where the Python
    loop stores them (and 200,000 are the clean "nested too deeply")."""
    outs = []
    for no_native in ("0", "1"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), _accel.NO_NATIVE_ENV: no_native}
        run = subprocess.run(
            [sys.executable, "-c", _DEEP.replace("DEPTH", str(depth))],
            env=env,
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert run.returncode == 0, (no_native, run.returncode, run.stderr[-500:])
        outs.append(run.stdout.strip())
    assert outs[0] == outs[1]
    assert expect in outs[0]


_THREAD_DEEP = """
import threading
from archive_manager import codec
threading.stack_size(256 * 1024)
def run():
    value = inner = {}
    for _ in range(480):
        inner["k"] = inner = {}
    try:
        codec.encode_sample({"f": value})
    except codec.UnencodableError as exc:
        print(exc)
thread = threading.Thread(target=run)
thread.start()
thread.join()
"""


@pytest.mark.timeout(120)
@needs_native
def test_break_deep_dicts_in_a_small_stack_thread_do_not_crash() -> None:
    """Claim 1 (break): in a thread of 256 KiB of stack (``threading.stack_size``; musl's
    default is smaller), 480 nested dicts under the default recursion limit were a segfault
    in dict_items where the Python loop refuses them cleanly."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(_accel.NO_NATIVE_ENV, None)
    run = subprocess.run(
        [sys.executable, "-c", _THREAD_DEEP],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-500:])
    assert "nested too deeply" in run.stdout


def _max_depth() -> int:
    """The most nested dicts a sample field stores under the recursion limit."""

    def stores(depth: int) -> bool:
        value: dict[str, Any] = {}
        inner = value
        for _ in range(depth):
            inner["k"] = inner = {}
        try:
            codec.encode_sample({"f": value})
        except codec.UnencodableError as exc:
            assert "nested too deeply" in str(exc)
            return False
        return True

    lo, hi = 1, 3000
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if stores(mid) else (lo, mid - 1)
    return lo


@pytest.mark.timeout(120)
@needs_native
def test_break_both_loops_refuse_dicts_nested_too_deeply_at_the_same_depth() -> None:
    """Claim 1 (break): the C loop took two frames of the recursion limit per level of dicts
    and the Python loop three (its comprehension): the extension stored 331 to 496 nested
    dicts that the fallback refuses (under the default limit)."""
    native = _max_depth()
    with python_only():
        python = _max_depth()
    assert native == python


@pytest.mark.timeout(120)
@needs_native
def test_dicts_past_the_c_depth_are_the_python_loops_bytes_and_bounds() -> None:
    """Claim 1: past the C loop's depth a dict goes to the Python loop; the tree, arrays,
    marks and bytes counted again are the same as the Python loop's all the way down."""
    shared = "shared-key-" * 3

    def make() -> Any:
        value: dict[str, Any] = {shared: 1.5}
        inner = value
        for i in range(300):
            inner["k"] = inner = {shared: [i, 2.5, "text" * 3, shared], "n": 10**9 + i}
        return value

    def outcome() -> tuple[Any, ...]:
        encoder = codec._Encoder(codec._Record(codec.DEFAULT_INLINE_LIMIT, {}))
        tree = codec.values._dumps(encoder.encode(make()))
        return tree, encoder.extra_bytes, encoder.repeated, len(encoder.leaves)

    native = outcome()
    with python_only():
        assert outcome() == native


class _Str(str):
    pass


class _Int(int):
    pass


class _Colour(enum.IntEnum):
    RED = 1


_SHARED_LIST = [1, 2, 3]


_SHARED_TEXT = "a shared text value"


_WEIRD_KEYS = st.sampled_from(
    ["$t", "$t2", "$", "\0", "a\0b", "\ud800", "\udfff\ud800", "é", "k" * 600, "_queue_x"]
) | st.text(max_size=3)


_WEIRD_LEAVES = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        10**7,
        -(10**7),
        10**8,
        2**63,
        -(2**63) - 1,
        10**700,
        1.5,
        -0.0,
        math.inf,
        math.nan,
        struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0],
        "x" * 512,
        "ab",
        "\ud800\udc00",
        _SHARED_TEXT,
        _SHARED_LIST,
        np.int64(3),
        np.float32(1.5),
        np.arange(3),
        _Colour.RED,
        _Int(2),
        _Str("s"),
        b"bytes",
    ]
)


@st.composite
def _weird_dicts(draw: Any) -> Any:
    inner = st.dictionaries(_WEIRD_KEYS, _WEIRD_LEAVES | st.lists(_WEIRD_LEAVES, max_size=3))
    value = draw(st.dictionaries(_WEIRD_KEYS, _WEIRD_LEAVES | inner, max_size=6))
    if value and draw(st.booleans()):
        value[draw(st.sampled_from([_Str("sk"), 1, (1, "a"), None]))] = draw(_WEIRD_LEAVES)
    if value and draw(st.booleans()):  # the same dict twice: its leaves and keys met again
        value["again"] = value["again2"] = dict(value)
    return value


@pytest.mark.timeout(120)
@needs_native
@settings(max_examples=150, deadline=None)
@given(_weird_dicts())
def test_odd_keys_and_leaves_are_the_python_loops(value: dict) -> None:
    """Claim 1: lone surrogates, NUL, "$t"-like keys, str subclasses and non-str keys (a
    map), numpy scalars and arrays, IntEnum, int and str subclasses, NaN payloads, big ints
    and a list held twice: the same tree, arrays or refusal as the Python loop."""
    native, python = _both(lambda: value)
    assert native == python


class _Meddler:
    """A value whose ``__class__`` (read by isinstance inside encode) mutates its dict."""

    def __init__(self, target: dict, how: str) -> None:
        self.target = target
        self.how = how

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        if self.how == "grow":
            self.target[f"new{len(self.target)}"] = 1
        elif self.how == "swap" and "z" in self.target:
            del self.target["z"]
            self.target["$t"] = "injected"
        elif self.how == "clear":
            self.target.clear()
        return _Meddler


class _HashKey:
    """A key whose ``__hash__`` and ``__eq__`` mutate the dict being encoded."""

    def __init__(self, target: dict) -> None:
        self.target = target

    def __hash__(self) -> int:
        self.target.pop("victim", None)
        return hash("$t")

    def __eq__(self, other: object) -> bool:
        self.target["added"] = 1
        return False

    def __repr__(self) -> str:
        return "_HashKey()"


@pytest.mark.timeout(120)
@needs_native
@pytest.mark.parametrize("how", ["grow", "swap", "clear"])
def test_user_code_mutating_the_dict_under_encode_is_the_python_loops(how: str) -> None:
    """Claim 1: a value whose ``__class__`` property (run by encode's isinstance) grows,
    swaps or clears the dict being encoded: the same refusal, with the same path, as the
    Python loop; no crash."""

    def make() -> Any:
        d: dict[str, Any] = {"a": 1.5, "b": [1, 2], "z": "zz"}
        d["m"] = _Meddler(d, how)
        d["after"] = "text"
        return {"outer": d}

    native, python = _both(make)
    assert native == python
    assert native[0] in ("UnencodableError", "RuntimeError")


@pytest.mark.timeout(120)
@needs_native
def test_a_key_whose_hash_mutates_the_dict_is_the_python_loops() -> None:
    """Claim 1: a non-str key with a ``__hash__``/``__eq__`` that mutates the dict: the C
    loop hands it to Python untouched, the outcome is the Python loop's."""

    def make() -> Any:
        d: dict[Any, Any] = {"victim": 1.25, "b": "bb"}
        d[_HashKey(d)] = 2
        return {"outer": d}

    native, python = _both(make)
    assert native == python


@pytest.mark.timeout(120)
@needs_native
def test_cycles_shared_values_and_huge_dicts_are_the_python_loops() -> None:
    """Claim 1: a dict holding itself (refused with its path), one list and one dict held in
    many places ("first-met" marking, the repeat bound), and a dict of 50,000 keys sharing
    their values: the same tree, arrays, marks and counts as the Python loop."""
    shared_list = [1.5, "two words", 10**9]
    shared_dict = {"k": shared_list, "long": "y" * 600}

    def cyclic() -> Any:
        d: dict[str, Any] = {"a": 1}
        d["self"] = {"inner": d}
        return d

    def shared() -> Any:
        return {f"k{i}": (shared_list if i % 2 else shared_dict) for i in range(200)}

    def huge() -> Any:
        text = "a value held fifty thousand times"
        return {f"key-{i}": (text, 2.5, i * 10**8) for i in range(50_000)}

    for make in (cyclic, shared, huge):
        native, python = _both(make)
        assert native == python, make.__name__
    assert "reference cycle" in _outcome(cyclic)[1]

    def counts(make: Callable[[], Any]) -> tuple[int, int, int]:
        encoder = codec._Encoder(codec._Record(codec.DEFAULT_INLINE_LIMIT, {}))
        encoder.encode(make())
        return encoder.extra_bytes, encoder.repeated, len(encoder.leaves)

    native_counts = counts(shared)
    with python_only():
        assert counts(shared) == native_counts


@pytest.mark.timeout(120)
@needs_native
def test_encoding_while_another_thread_mutates_never_crashes_or_writes_odd_keys() -> None:
    """Claim 1 under threads: two threads encode one dict while a third adds and removes
    keys (``"$t"`` and an int among them): each record loads (a ``"$t"`` never written as a
    tag), an int key never comes back as a string, or the save is refused with the dict
    iterator's RuntimeError; never a crash."""
    d: dict[Any, Any] = {f"k{i}": [float(j) for j in range(4)] for i in range(60)}
    stop = threading.Event()

    def mutate() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            key: Any = ("$t", 7, f"n{n % 5}")[n % 3]
            d[key] = [1.5] * 4
            d.pop(key, None)
            d.pop(f"k{n % 60}", None)
            d[f"k{n % 60}"] = [2.5] * 4

    outcomes: list[str] = []
    errors: list[BaseException] = []

    def encode() -> None:
        try:
            for _ in range(150):
                try:
                    record = codec.encode_sample({"f": d}, texts=()).record
                except RuntimeError as exc:
                    assert "changed" in str(exc)
                    outcomes.append("refused")
                    continue
                keys = codec.decode_record(memoryview(record), None)[1]["f"]
                assert "7" not in keys
                assert all(k in ("$t", 7) or k[0] in "kn" for k in keys)
                outcomes.append("written")
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    mutator = threading.Thread(target=mutate)
    encoders = [threading.Thread(target=encode) for _ in range(2)]
    mutator.start()
    try:
        for t in encoders:
            t.start()
        for t in encoders:
            t.join()
    finally:
        stop.set()
        mutator.join()
    assert errors == []
    assert len(outcomes) == 300


_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8", exclude_categories=()), max_size=8)
    | st.sampled_from(["\ud800", "a\udfffb", "\0", '"\\', "\u2028\u2029", "\x7f\x1f"])
)


_JSON_TREES = st.recursive(
    _JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children)
    ),
    max_leaves=20,
)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(_JSON_TREES)
def test_the_cached_json_encoder_writes_json_dumps_text(tree: Any) -> None:
    """Claim 2: `_encode_json` writes exactly ``json.dumps`` with the options, lone
    surrogates, NaN, infinities, -0.0, control characters and big ints included."""
    expected = json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    assert codec.values._encode_json(tree) == expected


@pytest.mark.timeout(120)
def test_the_cached_json_encoder_is_thread_safe() -> None:
    """Claim 2: one encoder object shared by every thread writes each tree whole."""
    trees = [{"t": i, "v": [float(i)] * 50, "s": "x" * i} for i in range(8)]
    expected = [
        json.dumps(t, ensure_ascii=False, separators=(",", ":"), allow_nan=True) for t in trees
    ]
    bad: list[int] = []

    def work(i: int) -> None:
        for _ in range(500):
            if codec.values._encode_json(trees[i]) != expected[i]:
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


_REAL_MAKE = vars(json.encoder)["c_make_encoder"]  # the C encoder typeshed leaves out


def _raising_make(*args: Any) -> Any:
    """Refuses the codec's arguments (no markers), serves json.dumps's."""
    if args[0] is None:
        raise TypeError("c_make_encoder() takes other arguments")
    return _REAL_MAKE(*args)


def _encoder_raising_make(*args: Any) -> Any:
    if args[0] is not None:
        return _REAL_MAKE(*args)

    def call(tree: Any, level: int) -> Any:
        raise TypeError("an encoder called with other arguments")

    return call


def _wrong_make(*args: Any) -> Any:
    if args[0] is not None:
        return _REAL_MAKE(*args)
    return lambda tree, level: ["{}"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [_raising_make, _encoder_raising_make, _wrong_make])
def test_a_json_c_encoder_that_is_not_the_expected_one_falls_back(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim 2 (break, of the fallback): the probe falls back when the text differs, but a
    ``c_make_encoder`` of another signature (a private function) raised at the package's
    import instead of falling back to ``json.dumps``."""
    with monkeypatch.context() as m:  # json.dumps itself back to the real one afterwards
        m.setattr(json.encoder, "c_make_encoder", make)
        encode = codec.values._json_encoder()
    assert isinstance(encode, functools.partial)
    tree = {"a": [1.5, "\ud800", math.nan]}
    assert encode(tree) == json.dumps(
        tree, ensure_ascii=False, separators=(",", ":"), allow_nan=True
    )


def _slow_state(obj: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`_dataclass_state` through the getattr loop only (the reference)."""
    cls: Any = type(obj)
    plan = samples._rebuild_plan(cls)
    with monkeypatch.context() as m:
        m.setattr(samples, "_rebuild_plan", lambda cls: dataclasses.replace(plan, plain_names=None))
        try:
            return samples._dataclass_state(obj)
        except Exception as exc:
            return type(exc).__name__, str(exc)


def _fast_state(obj: Any) -> Any:
    try:
        return samples._dataclass_state(obj)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@dataclasses.dataclass
class Plain:
    x: int = 0
    y: str = "s"


register_sample_class(Plain, "codec_fast.Plain")


class _FakeDict(dict):
    """A ``__dict__`` that lies to whoever iterates it."""

    def __iter__(self) -> Iterator[Any]:
        return iter(["x", "y"])

    def keys(self) -> Any:
        return ["x", "y"]

    def __getitem__(self, key: Any) -> Any:
        return "made up"


@pytest.mark.timeout(120)
def test_break_a_dict_subclass_as_instance_dict_takes_the_getattr_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Claim 3 (break): ``obj.__dict__ = DictSubclass(...)`` passed the fast path's check
    (its ``__iter__`` gave the field names), and ``dict(state)`` read its overridden
    ``__getitem__``: the fields were saved as ``"made up"`` while ``obj.x`` is 1."""
    obj = Plain(1, "two")
    obj.__dict__ = _FakeDict(obj.__dict__)
    assert (obj.x, obj.y) == (1, "two")
    assert _fast_state(obj) == _slow_state(obj, monkeypatch) == {"x": 1, "y": "two"}


@pytest.mark.timeout(120)
def test_break_a_str_subclass_field_key_takes_the_getattr_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Claim 3 (break): a str-subclass key equal to a field's name in ``__dict__`` (getattr
    finds it) was copied as it is, and the encoder refused the sample the getattr loop saves
    (its field under an exact str name)."""
    obj = Plain(1, "two")
    obj.__dict__ = {_Str("x"): 1, "y": "two"}
    fast = _fast_state(obj)
    assert fast == _slow_state(obj, monkeypatch) == {"x": 1, "y": "two"}
    assert all(type(k) is str for k in fast)
    loaded = codec.decode_sample(memoryview(codec.encode_sample(obj, texts=()).record), None)
    assert type(loaded) is Plain and vars(loaded) == {"x": 1, "y": "two"}


class _Base:
    @property
    def shown(self) -> int:
        return 7

    def method(self) -> int:
        return 1


@dataclasses.dataclass
class Parent(_Base):
    a: int = 1
    b: list = dataclasses.field(default_factory=list)
    kind: ClassVar[str] = "parent"


@dataclasses.dataclass
class Child(Parent):
    c: float = 0.5
    a: int = 2  # redeclared: keeps its place first
    d: str = dataclasses.field(init=False, default="late")
    e: Any = dataclasses.field(init=False)
    seed: dataclasses.InitVar[int] = 0

    def __post_init__(self, seed: int) -> None:
        self.e = seed * 2


@dataclasses.dataclass(frozen=True)
class Frozen:
    p: int = 1
    q: tuple = (1, 2)


@dataclasses.dataclass(slots=True)
class Slotted:
    p: int = 1
    q: str = "q"


@dataclasses.dataclass
class WithGetattr:
    p: int = 1

    def __getattr__(self, name: str) -> Any:
        return f"missing {name}"


@dataclasses.dataclass
class WithGetattribute:
    p: int = 1

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        return value * 10 if name == "p" else value


for _cls in (Parent, Child, Frozen, Slotted, WithGetattr, WithGetattribute):
    register_sample_class(_cls, f"codec_fast.{_cls.__qualname__}")


def _variants() -> list[Any]:
    edited = Child(a=3, b=[1], c=1.5, seed=4)
    del edited.__dict__["a"]
    edited.a = 9  # now last in __dict__: out of declaration order
    extra: Any = Child(seed=1)
    extra.note = "added later"
    extra._queue_live = object()  # live queue state, never stored
    extra.__dict__[1] = "int key"
    missing = Child()
    del missing.e  # init=False field without a value
    shadowed = Parent()
    shadowed.__dict__["shown"] = 3  # behind the property's back
    return [
        Parent(5, [1, 2]),
        Child(a=3, b=[1], c=1.5, seed=4),
        edited,
        extra,
        missing,
        shadowed,
        Frozen(2, (3,)),
        Slotted(2, "r"),
        WithGetattr(3),
        WithGetattribute(4),
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", range(len(_variants())))
def test_dataclass_variants_read_as_the_getattr_loop_reads_them(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim 3: inheritance with a redeclared field, ClassVar, InitVar, init=False,
    ``__dict__`` edited after init, extra and ``_queue_*`` attributes, an int key, a field
    without a value, an attribute shadowed by a property, frozen, slots, ``__getattr__`` and
    ``__getattribute__``: the fast path's fields (or refusal) are the getattr loop's."""
    obj = _variants()[index]
    assert _fast_state(obj) == _slow_state(obj, monkeypatch)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", [0, 1, 2, 6, 7, 8])
def test_dataclass_variants_load_equal(index: int) -> None:
    """Claim 3: what the fast path saved loads back equal (and of its class)."""
    obj = _variants()[index]
    rec = codec.encode_sample(obj, texts=())
    loaded = codec.decode_sample(memoryview(rec.record), None)
    assert type(loaded) is type(obj) and loaded == obj
    assert sample_to_record(loaded) == sample_to_record(obj)


@pytest.mark.timeout(120)
def test_break_a_class_overriding_getattribute_loads_equal() -> None:
    """Claim 3 (break, in the getattr loop the fast path leaves such classes to): the loop
    saved what the class's ``__getattribute__`` made of a field (40), `_rebuild` put that
    back raw and the class read it through the override again: 400, not 40."""
    obj = WithGetattribute(4)
    assert obj.p == 40
    rec = codec.encode_sample(obj, texts=())
    loaded = codec.decode_sample(memoryview(rec.record), None)
    assert type(loaded) is WithGetattribute and loaded.p == 40 and loaded == obj
    assert vars(loaded) == vars(obj) == {"p": 4}


@pytest.mark.timeout(120)
def test_getattr_still_answers_for_a_field_without_a_value() -> None:
    """Claim 3: a field with no value in a class with ``__getattr__`` is saved as what
    ``__getattr__`` gives, as before; without one it is refused, as before."""

    @dataclasses.dataclass
    class Answering:
        p: int

        def __getattr__(self, name: str) -> Any:
            return f"missing {name}"

    @dataclasses.dataclass
    class Bare:
        p: int

    register_sample_class(Answering, "codec_fast.Answering")
    register_sample_class(Bare, "codec_fast.Bare")
    obj = Answering(3)
    del obj.p
    loaded = codec.decode_sample(memoryview(codec.encode_sample(obj, texts=()).record), None)
    assert loaded.p == obj.p == "missing p"
    bare = Bare(3)
    del bare.p
    with pytest.raises(codec.UnencodableError, match="has no value"):
        codec.encode_sample(bare)


@pytest.mark.timeout(120)
def test_a_class_redefined_under_its_name_is_read_by_its_own_plan() -> None:
    """Claim 3: a dataclass redefined (a notebook cell run twice) with its fields reordered
    replaces its predecessor; each instance is read by its own class's plan."""

    @dataclasses.dataclass
    class Redefined:
        a: int = 1
        b: int = 2

    old = Redefined()
    register_sample_class(Redefined, "codec_fast.Redefined")
    assert sample_to_record(old)[1] == {"a": 1, "b": 2}

    @dataclasses.dataclass
    class Redefined:  # type: ignore[no-redef]  # the redefinition is what is tested
        b: int = 3

        a: int = 4
        c: int = 5

    register_sample_class(Redefined, "codec_fast.Redefined")
    new = Redefined()
    fields = sample_to_record(new)[1]
    assert list(fields.items()) == [("b", 3), ("a", 4), ("c", 5)]
    assert fields_to_sample("codec_fast.Redefined", fields) == new


_NUMBER_ELEMS = st.sampled_from(
    [
        True,
        False,
        _Int(3),
        _Colour.RED,
        np.int64(2),
        np.float64(1.0),
        2**63,
        -(2**63) - 1,
        10**30,
        math.nan,
        -0.0,
        struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000123))[0],
        None,
        "1",
    ]
)


@pytest.mark.timeout(120)
@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(min_value=-(2**64), max_value=2**64), min_size=8, max_size=40),
        st.lists(st.integers(min_value=-(2**30), max_value=2**30), min_size=8, max_size=40),
        st.lists(st.floats(allow_nan=True, width=32), min_size=8, max_size=40),
        st.lists(st.floats(allow_nan=True), min_size=8, max_size=40),
    ),
    st.integers(min_value=0, max_value=39),
    _NUMBER_ELEMS | st.just(None),
    st.booleans(),
)
def test_numbers_are_the_python_paths_with_odd_elements_anywhere(
    value: list, at: int, odd: Any, put: bool
) -> None:
    """Claim 4: one-digit ints read in place, and a bool, an int subclass, an IntEnum, a
    numpy scalar, an int beyond int64, a NaN with a payload, -0.0 or a non-number at any
    place (first, middle, last): the same dtype, bytes and flag, or None, as the Python
    paths."""
    if put:
        value = list(value)
        value[min(at, len(value) - 1)] = odd
    assert NATIVE[0] is not None
    assert NATIVE[0](value) == python_array(value)


@pytest.mark.timeout(120)
@needs_native
def test_numbers_bad_arguments_do_not_crash() -> None:
    """Claim 4: what is not an exact list is None, never a crash."""
    assert NATIVE[0] is not None
    for odd in ((1, 2, 3), [1, 2], None, "123", bytearray(b"12")):
        result = NATIVE[0](odd)  # type: ignore[arg-type]
        assert result is None or result[0] == "int8"

    class L(list):
        pass

    assert NATIVE[0](L([1] * 10)) is None


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                QUEUE_PREFIX + "x",
                QUEUE_PREFIX,
                "a\0" + QUEUE_PREFIX,
                QUEUE_PREFIX[:-1],
                "x" + QUEUE_PREFIX,
                _Str(QUEUE_PREFIX + "s"),
                _Str("plain"),
                1,
                None,
                (QUEUE_PREFIX,),
                b"_queue_b",
            ]
        )
        | st.text(max_size=9),
        st.integers(),
    ),
    st.frozensets(st.sampled_from([QUEUE_PREFIX + "x", QUEUE_PREFIX, "a"])),
)
def test_strip_queue_is_the_per_key_rule(fields: dict, declared: frozenset[str]) -> None:
    """Claim 5: the joined-keys test drops exactly the keys `is_queue_key` names, except the
    declared ones, whatever the other keys (NUL in a key, str subclasses, non-str keys)."""
    expected = {k: v for k, v in fields.items() if not (is_queue_key(k) and k not in declared)}
    assert samples._strip_queue(dict(fields), declared) == expected
