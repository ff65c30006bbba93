"""The C list conversion (archive_manager/codec/_native.c) against the Python paths it replaces.

The Python paths (`_marshalled_numbers`, then the general path of `_Encoder._array`) are the
reference: the extension must return exactly their dtype, bytes and shuffle flag for every
list, and None for every list they leave to JSON; and the fallback must work without it.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import python_array, python_only
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import codec
from archive_manager.codec import _accel, build_chunk, encode_sample
from archive_manager.interop.synthetic import make_rollout

ROOT = Path(__file__).resolve().parents[2]
# .ci/run builds the extension and sets this: there a missing build fails instead of skipping.
REQUIRE_NATIVE_ENV = "ARCHIVE_MANAGER_REQUIRE_NATIVE"

if codec._native_numbers is None:
    why = (
        "the C extension is not built (python setup.py build_ext --inplace) or "
        f"{_accel.NO_NATIVE_ENV} is set"
    )
    if os.environ.get(REQUIRE_NATIVE_ENV):
        raise RuntimeError(f"{REQUIRE_NATIVE_ENV} is set but {why}")
    pytest.skip(why, allow_module_level=True)

_numbers, _first_leaves, _dict_items = (
    codec._native_numbers,
    codec._native_first_leaves,
    codec._native_dict_items,
)
assert _numbers is not None and _first_leaves is not None and _dict_items is not None
NATIVE, FIRST_LEAVES, DICT_ITEMS = _numbers, _first_leaves, _dict_items


class Colour(enum.IntEnum):
    RED = 1


class MyInt(int):
    pass


class MyFloat(float):
    pass


@pytest.fixture
def no_native() -> Iterator[None]:
    with python_only():
        yield


def _assert_same(value: list) -> None:
    # `_array` sees only lists of _MIN_ARRAY_LEN or more (shorter ones are JSON, and the
    # Python paths are not defined for an empty list): shorter ones are held by the records.
    assert len(value) >= codec.values._MIN_ARRAY_LEN
    assert NATIVE(value) == python_array(value)


def _double(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


def _single(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


EDGES = [
    -(2**63) - 1,
    -(2**63),
    2**63 - 1,
    2**63,
    2**64,
    -(2**31) - 1,
    -(2**31),
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    -32769,
    -32768,
    32767,
    32768,
    65535,
    65536,
    -129,
    -128,
    127,
    128,
    255,
    256,
    -1,
    0,
    10**400,
]
INTS = st.integers() | st.sampled_from(EDGES) | st.integers(-(2**64), 2**64) | st.integers(0, 300)
FLOATS = (
    st.floats()
    | st.floats(width=32)
    | st.integers(0, 2**64 - 1).map(_double)  # any bits: NaN payloads, signalling NaNs
    | st.integers(0, 2**32 - 1).map(_single)
    | st.sampled_from([-0.0, 0.0, math.inf, -math.inf, math.nan, 3.4028235e38, 3.5e38, 1e-45])
)
ODD = st.sampled_from(
    [True, False, None, "x", Colour.RED, MyInt(3), MyFloat(2.5), np.int64(4), np.float64(1.5)]
)


def _with_odd(draw: Any, base: st.SearchStrategy[list]) -> list:
    value = draw(base)
    if value and draw(st.booleans()):
        value[draw(st.integers(0, len(value) - 1))] = draw(ODD | INTS | FLOATS)
    return value


@st.composite
def number_lists(draw: Any, min_size: int = 0) -> list:
    base = draw(
        st.sampled_from(
            [
                st.lists(INTS, min_size=min_size, max_size=40),
                st.lists(FLOATS, min_size=min_size, max_size=40),
                st.lists(st.integers(-(2**31), 2**31 - 1), min_size=min_size, max_size=40),
                st.lists(st.integers(0, 2**32), min_size=min_size, max_size=40),
                st.lists(INTS | FLOATS | ODD, min_size=min_size, max_size=20),
            ]
        )
    )
    return _with_odd(draw, base)


@settings(max_examples=600, deadline=None)
@given(number_lists(min_size=codec.values._MIN_ARRAY_LEN))
def test_native_matches_the_python_paths(value: list) -> None:
    _assert_same(value)


@settings(max_examples=150, deadline=None)
@given(st.lists(number_lists(), max_size=4))
def test_records_are_byte_identical_with_and_without_native(lists: list[list]) -> None:
    sample = {f"f{i}": v for i, v in enumerate(lists)}
    sample["shared"] = lists  # a list met again counts its array's bytes (the bound)
    native = _outcome(sample)
    with python_only():
        python = _outcome(sample)
    assert native == python


def _outcome(sample: dict) -> bytes | str:
    """The record, or the refusal (an IntEnum, an int subclass: not storable at all)."""
    try:
        return encode_sample(sample).record
    except codec.UnencodableError as exc:
        return str(exc)


@pytest.mark.parametrize(
    "value",
    [
        [-0.0] * 8,
        [math.nan] * 8,
        [_double(0x7FF0_0000_0000_0001)] * 9,  # a signalling NaN: float64
        [_double(0x7FF8_0000_2000_0000)] * 9,  # a quiet NaN whose payload float32 keeps
        [_double(0xFFF8_0000_0000_0001)] * 9,
        [1e-310] * 8,  # a subnormal double: float64
        [_single(1)] * 8,  # the smallest subnormal single: float32
        [3.5e38] * 8,  # beyond float32's range
        [1.0, 2.0, 3, 4.0, 5.0, 6.0, 7.0, 8.0],
        [1, 2, 3, True, 5, 6, 7, 8],
        [True] * 8,
        [1, 2, 3, Colour.RED, 5, 6, 7, 8],
        [MyInt(1)] * 8,
        [MyFloat(1.0)] * 8,
        [np.int64(1)] * 8,
        [np.float64(1.0)] * 8,
        [1, 2, 3, 2**63, 5, 6, 7, 8],
        [1, 2, 3, -(2**63) - 1, 5, 6, 7, 8],
        [-(2**63), 2**63 - 1] * 4,
        [0, 2**32 - 1] * 4,
        [-1, 2**31 - 1] * 4,
        [None] * 8,
        ["a"] * 8,
        [[1], 2, 3, 4, 5, 6, 7, 8],
    ],
)
def test_edge_cases(value: list) -> None:
    _assert_same(value)


def test_long_lists_of_every_dtype() -> None:
    rng = random.Random(25)
    for lo, hi in [
        (-128, 127),
        (0, 255),
        (-32768, 32767),
        (0, 65535),
        (-(2**31), 2**31 - 1),
        (0, 2**32 - 1),
        (-(2**63), 2**63 - 1),
    ]:
        value = [rng.randint(lo, hi) for _ in range(100_003)] + [lo, hi]
        _assert_same(value)
        assert NATIVE(value) is not None
    singles = [_single(rng.getrandbits(32)) for _ in range(50_001)]
    doubles = [rng.random() for _ in range(50_001)]
    for floats in (singles, doubles):
        _assert_same(floats)
    assert NATIVE(singles)[0] == "float32"  # type: ignore[index]
    assert NATIVE(doubles)[0] == "float64"  # type: ignore[index]


def test_only_exact_lists() -> None:
    assert NATIVE((1, 2, 3, 4, 5, 6, 7, 8)) is None  # type: ignore[arg-type]

    class MyList(list):
        pass

    assert NATIVE(MyList(range(8))) is None


# The decoder's half (`stored_list`): a stored numeric array's items as numpy's tolist gives
# them, from the record's bytes (byte planes or not), for every dtype the encoder writes.
STORED_DTYPES = (
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"
)  # fmt: skip


def _same_items(got: list, want: list) -> bool:
    """Equal item by item, in type and (for floats: NaN payloads, -0.0) in bits."""
    return len(got) == len(want) and all(
        type(g) is type(w) and struct.pack("<d", g) == struct.pack("<d", w)
        if type(w) is float
        else type(g) is type(w) and (_same_items(g, w) if type(w) is list else g == w)
        for g, w in zip(got, want, strict=True)
    )


def test_stored_lists_are_the_python_paths_lists() -> None:
    stored_list = codec._native_stored_list
    assert stored_list is not None, "the extension was built without stored_list: rebuild it"
    rng = np.random.default_rng(37)
    for name in STORED_DTYPES:
        dtype = codec._NUMPY_DTYPES[name]
        for count in (0, 1, 2, 7, 3_301):
            data = memoryview(rng.integers(0, 256, count * dtype.itemsize, np.uint8).tobytes())
            for shuffled in (False, True):
                want = codec.values._unshuffle(data, dtype, shuffled).tolist()
                got = stored_list(data, name, shuffled)
                assert got is not None and _same_items(got, want), (name, count, shuffled)
    # what it leaves to numpy (which raises the damaged record's error, or decodes the dtype)
    assert stored_list(b"abc", "int16", True) is None
    assert stored_list(b"ab", "bool", False) is None
    assert stored_list(b"ab", "float16", False) is None


@settings(max_examples=150, deadline=None)
@given(number_lists(min_size=codec.values._MIN_ARRAY_LEN))
def test_lists_load_as_saved_through_the_native_decoder(value: list) -> None:
    try:
        record = encode_sample({"v": value, "nested": [value]}).record
    except codec.UnencodableError:
        return  # an int subclass, an IntEnum: refused at save either way
    calls = []
    native = codec._native_stored_list
    assert native is not None

    def counted(*args: Any) -> Any:
        calls.append(args[1])
        return native(*args)

    codec._native_stored_list = counted
    try:
        got = codec.decode_sample(memoryview(record), None)
    finally:
        codec._native_stored_list = native
    with python_only():
        want = codec.decode_sample(memoryview(record), None)
    assert _same_items(got["v"], want["v"]) and _same_items(got["nested"][0], want["nested"][0])
    if python_array(value) is not None:  # stored as an array: decoded in C, both times
        assert len(calls) == 2


# A load's arenas made ahead (`arenas_ahead`, docs/architecture/reading.md "Arenas made ahead").
LINUX = sys.platform.startswith("linux")


def _arenas_ahead() -> Any:
    ahead = _accel.native_arenas_ahead
    assert ahead is not None, "the extension was built without arenas_ahead: rebuild it"
    return ahead


def _arena_threads() -> int:
    """The threads making arenas ahead (by the name the extension gives them)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names.count("archive-arenas")


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_arenas_made_ahead_hold_objects_and_the_allocator_comes_back_at_the_last_end() -> None:
    ahead = _arenas_ahead()
    assert ahead(True) is True
    assert ahead(True) is True  # a second load (nested or on another thread) joins the first
    made = [float(i) + 0.5 for i in range(1_000_000)]  # 24 MB of floats: arenas from the thread
    assert _arena_threads() == 1
    assert ahead(False) is False  # the other load still runs
    assert ahead(False) is True  # the last: pymalloc's allocator is back
    assert ahead(False) is False  # an end without a begin changes nothing
    # freed by pymalloc's own allocator now, arenas made ahead and its own alike
    assert sum(made) == sum(i + 0.5 for i in range(1_000_000))
    del made
    assert ahead(True) is True  # and made again by the next load
    again = [float(i) for i in range(1_000_000)]
    assert ahead(False) is True
    assert again[-1] == 999_999.0


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_a_load_makes_arenas_ahead_until_it_ends_even_when_it_raises() -> None:
    ahead = _arenas_ahead()
    for fails in (False, True):
        with contextlib.suppress(ValueError), codec.values.gc_paused(promote=True):
            # inside a load, this begin is a second one and its end not the last
            assert ahead(True) is True and ahead(False) is False
            if fails:
                raise ValueError
        assert ahead(True) is True and ahead(False) is True
    with codec.values.gc_paused():  # not a load: a save's or a record's pause
        assert ahead(True) is True and ahead(False) is True


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_a_child_forked_during_a_load_gets_pymallocs_allocator_back() -> None:
    script = """
import os, sys
from archive_manager.codec import _accel
ahead = _accel.native_arenas_ahead
ahead(True)
made = [float(i) for i in range(1_000_000)]  # the thread runs
pid = os.fork()
if pid == 0:
    # no load of the child's began: its first begin installs, its end puts back
    more = [float(i) for i in range(1_000_000)]
    ok = ahead(True) is True and ahead(False) is True and more[-1] == 999_999.0
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert ahead(False) is True and made[-1] == 999_999.0
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


# A profiler's arena allocator (counting, on mmap and munmap so that it frees pymalloc's arenas
# made before it safely), installed through the same hook: loaded with ctypes.
_TOOL_ARENAS = r"""
#include <Python.h>
#include <sys/mman.h>
static PyObjectArenaAllocator prev;
static long n_alloc;
static void *t_alloc(void *ctx, size_t size) {
    (void)ctx;
    n_alloc++;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void t_free(void *ctx, void *p, size_t size) { (void)ctx; munmap(p, size); }
void install(void) {
    PyObjectArenaAllocator a = {NULL, t_alloc, t_free};
    PyObject_GetArenaAllocator(&prev);
    PyObject_SetArenaAllocator(&a);
}
void uninstall(void) { PyObject_SetArenaAllocator(&prev); }
long allocs(void) { return n_alloc; }
"""


def _tool_arenas(tmp_path: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not Path(include, "Python.h").is_file():
        if os.environ.get(REQUIRE_NATIVE_ENV):
            pytest.fail("no C compiler or Python headers to build the tool's allocator")
        pytest.skip("no C compiler or Python headers")
    source = tmp_path / "tool_arenas.c"
    source.write_text(_TOOL_ARENAS)
    built = tmp_path / "tool_arenas.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", f"-I{include}", str(source), "-o", str(built)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return built


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_a_tools_arena_allocator_found_at_import_is_never_handed_arenas_made_ahead(
    tmp_path: Path,
) -> None:
    # Found by a red team: the allocator found at import was taken for pymalloc's own, so a
    # tool's installed before it would free mappings of ours with its own free() (glibc's
    # aborted, for a tool on malloc).
    script = f"""
import ctypes
tool = ctypes.CDLL({str(_tool_arenas(tmp_path))!r})
tool.install()
from archive_manager.codec import _accel
ahead = _accel.native_arenas_ahead
assert ahead(True) is False, "installed over a tool's allocator"
made = [float(i) + 0.5 for i in range(2_000_000)]
del made  # pymalloc frees the emptied arenas through the tool's free()
assert ahead(False) is False
assert tool.allocs() > 10
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_a_tools_arena_allocator_installed_during_a_load_stays_installed(tmp_path: Path) -> None:
    # The load's end put pymalloc's back over the tool's; the tool, putting back what it
    # found (this one) after the load, then left it installed for good, its thread running.
    script = f"""
import ctypes, os
tool = ctypes.CDLL({str(_tool_arenas(tmp_path))!r})
from archive_manager.codec import _accel
ahead = _accel.native_arenas_ahead

def threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{{task}}/comm").read().strip())
        except OSError:
            pass
    return names.count("archive-arenas")

assert ahead(True) is True
tool.install()
a = [float(i) for i in range(500_000)]
assert ahead(False) is False, "the end replaced the tool's allocator"
before = tool.allocs()
b = [float(i) for i in range(500_000)]
assert tool.allocs() > before, "the tool's allocator is no longer installed"
tool.uninstall()  # puts back what it found: this extension's, outside any load
c = [float(i) for i in range(2_000_000)]
assert threads() == 0, "arenas made ahead with no load running"
assert ahead(True) is True and ahead(False) is True and threads() == 0
assert a[-1] == b[-1] == 499_999.0 and c[-1] == 1_999_999.0
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.skipif(not LINUX, reason="arenas are made ahead on Linux only")
def test_frames_of_many_locals_do_not_count_as_arenas() -> None:
    # The hook also allocates the interpreter's frame stacks: four frames of 40,000 locals
    # (512 KiB chunks) at a load's start made the thread map chunks of that size, which no
    # arena request then took.
    source = "def big():\n    " + "\n    ".join(f"v{i} = {i}" for i in range(40_000))
    namespace: dict[str, Any] = {}
    exec(source + "\n    return v0\n", namespace)
    big = namespace["big"]
    ahead = _arenas_ahead()
    assert ahead(True) is True
    try:
        for _ in range(6):
            big()
        assert _arena_threads() == 0, "frame stacks started the thread"
    finally:
        assert ahead(False) is True


def test_the_realistic_rollouts_chunk_digests_are_identical_without_native(
    no_native: None,
) -> None:
    """tools/bench.py's rollout (make_rollout, seed 1), chunked as pool.save chunks it."""
    samples = make_rollout(128, seed=1)

    def digests() -> list[str]:
        return [build_chunk(samples[i : i + 64]).pack().digest for i in range(0, 128, 64)]

    python = digests()
    codec._native_numbers, codec._native_first_leaves = NATIVE, FIRST_LEAVES
    codec._native_dict_items = DICT_ITEMS
    native = digests()
    assert native == python


# The bound accounting of plain leaves (`first_leaves`): the same tree, arrays, marks in
# `leaves` and bytes counted again, or the same refusal, as the Python loop.
LONG = "y" * 511  # the longest string still written in the tree
SHARED = [1.0000000001, -3.25, 10**12, 2**62, "shared", LONG, math.nan, 2**70, "z" * 600]
LEAVES = (
    st.sampled_from([*SHARED, None, True, False, "a", ""])
    | st.floats()
    | st.integers()
    | st.integers(-(10**8), 10**9)
    | st.text(max_size=3)
    | st.integers(0, 2**64 - 1).map(_double)
    | ODD
)


@st.composite
def leaf_values(draw: Any) -> Any:
    leaf_lists = st.lists(LEAVES, max_size=12)
    tuples = leaf_lists.map(tuple)
    values = draw(st.lists(leaf_lists | tuples | LEAVES, min_size=1, max_size=8))
    if draw(st.booleans()):  # one list held in several places
        values.append(values[0])
    return values


def _encoder_outcome(value: Any) -> tuple[Any, ...]:
    encoder = codec._Encoder(codec._Record(codec.DEFAULT_INLINE_LIMIT, {}))
    try:
        tree: Any = codec.values._dumps(encoder.encode(value))
    except codec.UnencodableError as exc:
        tree = str(exc)
    arrays = b"".join(map(bytes, encoder.record.arrays))
    return tree, arrays, encoder.leaves, encoder.extra_bytes, encoder.repeated


@settings(max_examples=500, deadline=None)
@given(leaf_values())
def test_leaf_accounting_is_the_python_loops(value: list) -> None:
    native = _encoder_outcome(value)
    with python_only():
        python = _encoder_outcome(value)
    assert native == python


def test_first_leaves_takes_only_first_appearances() -> None:
    x, s = 1.0000000001, "shared"
    leaves: dict[int, int] = {}
    assert FIRST_LEAVES([x, s, 5, None, True, "a"], leaves)
    assert leaves == {id(x): -1, id(s): -1}
    before = dict(leaves)
    y = 2.5000000001
    assert not FIRST_LEAVES([y, x], leaves)  # x met again: Python counts it
    assert not FIRST_LEAVES([y, 3.5, y], leaves)  # twice in one list
    assert not FIRST_LEAVES([y, math.nan], leaves)
    assert not FIRST_LEAVES([y, "z" * 512], leaves)
    assert not FIRST_LEAVES([y, 2**63], leaves)
    assert not FIRST_LEAVES([y, MyFloat(1.0)], leaves)
    assert not FIRST_LEAVES([y, [1]], leaves)
    assert leaves == before  # every refusal left the marks as they were


def test_a_leaf_held_in_many_lists_is_refused_past_the_bound_as_before() -> None:
    value = [[LONG] for _ in range(codec.values._MAX_EXTRA_BYTES // 513 + 2)]
    native = _encoder_outcome(value)
    with python_only():
        python = _encoder_outcome(value)
    assert "beyond the memory it holds" in native[0]
    assert native == python


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop(_accel.NO_NATIVE_ENV, None)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env=full,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


# `_Encoder._dict`'s loop in C (`dict_items`): the same tree, arrays, marks in `leaves`, bytes
# counted again and repeats, or the same refusal with the same path, as the Python loop.
KEYS = st.sampled_from(["a", "bc", "shared", "$t", "$", LONG, "k" * 600]) | st.text(max_size=4)
ODD_KEYS = st.sampled_from([1, 2.5, None, (1, "a"), True])


@st.composite
def dict_values(draw: Any) -> Any:
    leaf = LEAVES | st.sampled_from([{1, 2}, b"bytes", Colour.RED])
    inner = st.dictionaries(KEYS, leaf | st.lists(LEAVES, max_size=4), max_size=6)
    outer = st.dictionaries(KEYS, leaf | inner | st.lists(inner, max_size=3), max_size=8)
    value = draw(outer)
    if value and draw(st.booleans()):  # a key that is not a str: a map
        value[draw(ODD_KEYS)] = draw(leaf)
    if value and draw(st.booleans()):  # the same dict (and its leaves) held twice
        value["again"] = dict(value)
        value["again2"] = value["again"]
    return value


@settings(max_examples=500, deadline=None)
@given(dict_values())
def test_dict_accounting_is_the_python_loops(value: dict) -> None:
    native = _encoder_outcome(value)
    with python_only():
        python = _encoder_outcome(value)
    assert native == python


@settings(max_examples=200, deadline=None)
@given(dict_values())
def test_top_level_dicts_are_the_python_loops(value: dict) -> None:
    """The top of a sample (``_dict(top=True)``): keys never counted, paths without brackets."""

    def outcome() -> tuple[Any, ...]:
        encoder = codec._Encoder(codec._Record(codec.DEFAULT_INLINE_LIMIT, {}))
        try:
            tree: Any = codec.values._dumps(encoder._dict(value, top=True))
        except codec.UnencodableError as exc:
            tree = str(exc)
        return tree, b"".join(map(bytes, encoder.record.arrays)), encoder.leaves

    native = outcome()
    with python_only():
        python = outcome()
    assert native == python


def test_a_key_held_in_many_dicts_is_refused_past_the_bound_as_before() -> None:
    key = "k" * 500
    value = [{key: i} for i in range(codec.values._MAX_EXTRA_BYTES // 500 + 2)]
    native = _encoder_outcome(value)
    with python_only():
        python = _encoder_outcome(value)
    assert "beyond the memory it holds" in native[0]
    assert native == python


def test_dict_items_leaves_maps_and_tags_to_python() -> None:
    leaves: dict[int, int] = {}
    x = 1.0000000001

    def refuse(value: Any) -> Any:
        raise AssertionError("not called for a map")

    assert DICT_ITEMS({"a": x, 1: 2}, leaves, refuse, None, [None]) is None
    assert DICT_ITEMS({"a": x, "$t": 2}, leaves, refuse, None, [None]) is None
    assert leaves == {}  # nothing marked before the refusal


def test_dict_items_names_the_key_that_failed_and_stops_on_a_resized_dict() -> None:
    where: list[Any] = [None]
    value: dict[str, Any] = {"ok": 1, "bad": [1], "later": 2}

    def fail(item: Any) -> Any:
        raise codec.UnencodableError("no")

    with pytest.raises(codec.UnencodableError):
        DICT_ITEMS(value, {}, fail, None, where)
    assert where == ["bad"]

    def grow(item: Any) -> Any:
        value["new"] = 0
        return item

    with pytest.raises(RuntimeError, match="changed size"):
        DICT_ITEMS(value, {}, grow, None, [None])


_SAVE_AND_REPORT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    BLOCK
    import archive_manager
    from archive_manager import codec
    from archive_manager.errors import NativeFallbackWarning
    from archive_manager.interop.synthetic import make_rollout
    import importlib
    importlib.import_module("archive_manager.codec.values")
    digest = codec.build_chunk(make_rollout(16, seed=1)).pack().digest
print(codec._native_numbers is None)
print(sum(issubclass(w.category, NativeFallbackWarning) for w in caught))
print(digest)
print(*[w.message for w in caught if issubclass(w.category, NativeFallbackWarning)])
"""

_BLOCK_IMPORT = """
    import sys
    class _Refuse:
        def find_spec(self, name, path=None, target=None):
            if name == "archive_manager.codec._native":
                raise ImportError("refused by the test")
            return None
    sys.meta_path.insert(0, _Refuse())
"""


def test_fallback_by_env_var_is_silent_and_writes_the_same_bytes() -> None:
    native = _run(_SAVE_AND_REPORT.replace("BLOCK", "pass")).stdout.splitlines()
    forced = _run(
        _SAVE_AND_REPORT.replace("BLOCK", "pass"), **{_accel.NO_NATIVE_ENV: "1"}
    ).stdout.splitlines()
    assert native[:2] == ["False", "0"]
    assert forced[:2] == ["True", "0"]
    assert forced[2] == native[2]


def test_a_failed_import_falls_back_with_one_warning() -> None:
    done = _run(_SAVE_AND_REPORT.replace("BLOCK", _BLOCK_IMPORT.strip()))
    uses_python, warned, digest, message = done.stdout.splitlines()
    assert uses_python == "True"
    assert warned == "1"
    assert "refused by the test" in message  # the warning says why
    assert digest == _run(_SAVE_AND_REPORT.replace("BLOCK", "pass")).stdout.split()[2]


# --------------------------------------------------------------- the search's prefilter

_HOLDING = codec.chunk._texts_holding
assert _HOLDING is not codec.chunk._holding_py  # the C function, when the extension is built

_PIECES = [b"Kelvin", b"KELVIN", b"kelvin", b"\xe2\x84\xaa", b"\xc5\xbf", b"ab", b"AB", b"a", b"\n"]


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(
        st.lists(st.sampled_from(_PIECES) | st.binary(max_size=6), max_size=12).map(b"".join),
        max_size=8,
    ),
    needle=st.sampled_from([b"kelvin", b"ab", b"a", b"b\xe2", b"elvin\n", b""])
    | st.binary(min_size=1, max_size=4),
    folded=st.booleans(),
    also=st.lists(st.sampled_from([b"\xe2\x84\xaa", b"\xc5\xbf", b"Z"]), max_size=2).map(tuple),
)
def test_the_prefilter_keeps_exactly_the_parts_the_python_rule_keeps(
    parts: list[bytes], needle: bytes, folded: bool, also: tuple[bytes, ...]
) -> None:
    if folded:
        needle = needle.lower()
    want = codec.chunk._holding_py(parts, needle, folded, also)
    assert _HOLDING(parts, needle, folded, also) == want
    # any buffer: views, bytearrays, the segments zstandard inflates into
    views = [memoryview(b"##" + p)[2:] for p in parts]
    assert _HOLDING(views, needle, folded, also) == want
    assert _HOLDING([bytearray(p) for p in parts], needle, folded, also) == want


def test_the_prefilter_on_long_texts_and_bad_arguments() -> None:
    rng = random.Random(7)
    words = [b"answer", b"Boxed", b"BOXED", b"equation", b"solve", b"caf\xc3\xa9", b"x"]
    parts = [b" ".join(rng.choice(words) for _ in range(rng.randrange(3000))) for _ in range(50)]
    for needle in (b"boxed boxed", b"boxed", b"caf\xc3\xa9 x", b"solve answer solve", b"q"):
        for folded in (False, True):
            assert _HOLDING(parts, needle, folded, ()) == codec.chunk._holding_py(
                parts, needle, folded, ()
            )
    with pytest.raises(TypeError):
        _HOLDING(parts, "str needle", False, ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _HOLDING(parts, b"x", False, ("str",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _HOLDING([1], b"x", False, ())  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _HOLDING(7, b"x", False, ())  # type: ignore[arg-type]


def test_hand_over_lets_a_thread_waiting_for_the_gil_take_it() -> None:
    """`_native.hand_over` lets go of the GIL until a waiting thread has it: with the switch
    interval out of reach, that thread runs only through a hand-over
    (docs/architecture/save-protocol.md, "Handing the GIL over")."""
    hand_over = _accel.native_hand_over
    assert hand_over is not None
    go = threading.Event()
    ran: list[int] = []

    def waiter() -> None:
        go.wait()  # GIL-free; then it waits for the GIL
        ran.append(1)

    thread = threading.Thread(target=waiter)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        thread.start()
        go.set()
        for _ in range(2000):  # this thread never blocks: only hand_over lets go
            if ran:
                break
            hand_over(1_000_000)
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    assert ran == [1]


def test_hand_over_takes_only_a_budget_in_range() -> None:
    hand_over = _accel.native_hand_over
    assert hand_over is not None
    assert hand_over(0) in (True, False)
    for bad in (-1, 10**9 + 1):
        with pytest.raises(ValueError, match="budget_ns"):
            hand_over(bad)
    with pytest.raises(TypeError):
        hand_over("1")  # type: ignore[arg-type]


def test_the_encoders_hand_over_is_the_native_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`codec.GilHandOver` hands the GIL over through `_native.hand_over` when it is built, not
    by ``time.sleep(0)``, a timer nap whether or not a thread waits."""
    from archive_manager.codec import chunk as chunk_module

    calls: list[int] = []

    def hand_over_native(budget_ns: int) -> bool:
        calls.append(budget_ns)
        return False

    monkeypatch.setattr(chunk_module, "native_hand_over", hand_over_native)
    monkeypatch.setattr(chunk_module, "_HAND_OVER_EVERY", -1.0)  # due at every call
    monkeypatch.setattr(chunk_module.time, "sleep", lambda s: pytest.fail("slept"))
    hand_over = codec.GilHandOver()
    hand_over()
    hand_over()
    assert calls == [chunk_module._HAND_OVER_SPIN_NS] * 2
