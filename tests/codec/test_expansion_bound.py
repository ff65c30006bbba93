"""The expansion bound (README, "What you save is what you load";
docs/architecture/samples-and-values.md, "Samples and values"): every byte a save would write again
counts against the bound (256 MiB, lowered to 1 MiB here by ``small_bound``), past which the save is
refused with `UnencodableError` and the pool is unchanged: short strings, ints, floats and dict keys
held many times, views of one buffer (numpy, torch, ``__array_interface__``, DLPack, borrowed
memory counted by address), zero-stride and strided views; what memory already holds, small
views and repeated tensors still save.  Each test failed on the code it was written against,
for the reason its docstring gives ("Claim N" names the claim of the fix it broke).
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import snapshot_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import ArchiveManager, Sample
from archive_manager.codec import decode_chunk, encode_chunk, values
from archive_manager.codec.values import encode_sample
from archive_manager.errors import UnencodableError


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """The expansion bound lowered to 1 MiB: the same rule, tested with small data."""
    monkeypatch.setattr(values, "_MAX_EXTRA_BYTES", 1 << 20)
    return 1 << 20


S511 = "s" * 511  # one char below the long-string threshold: was never counted


I599 = 10**598 + 1  # 599 digits, below the tagged-int threshold: was never counted


K1000 = "k" * 1000  # one dict key object shared by many dicts


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: [[S511] * 100] * 40, id="short-string-dag"),
        pytest.param(lambda: [S511] * 4000, id="short-string-list"),
        pytest.param(lambda: [I599] * 4000, id="int-599-digits"),
        pytest.param(lambda: [[I599, 1.5e-300] * 50] * 40, id="int-dag"),
        pytest.param(lambda: [{K1000: i} for i in range(1100)], id="one-key-in-many-dicts"),
        pytest.param(lambda: [(np.float64(1.0), 2**70)] * 20000, id="numpy-scalar-and-int"),
    ],
)
def test_claim1_small_leaves_held_many_times_are_counted(small_bound: int, value) -> None:
    """Claim 1: the bound counted only strings of 512+ characters and ints of 600+ digits
    written again (and containers by items, up to 2**20), so many references to one
    511-character string or one 599-digit int, in one list or through a DAG of shared
    sub-lists, wrote hundreds of MB unbounded (measured on main: 40 shared lists of 100 such
    strings... scaled to 1,000 x 1,000, 514 MB of record).  Every leaf written again now
    counts its bytes; a leaf of at most 8 bytes (None, bools, short ints, 1-char strings) is
    no bigger than the reference that holds it."""
    data = value()
    with pytest.raises(UnencodableError, match=r"sample field 'x'\[.*bytes beyond"):
        encode_chunk([{"x": data}])


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim1_what_memory_holds_is_not_counted(small_bound: int) -> None:
    """Siblings: distinct objects are held by the sample (not counted), however equal; small
    leaves are free; a leaf held twice costs its bytes once."""
    distinct = {
        "x": ["s" * 511 + str(i) for i in range(4000)],
        "k": [{"k" * 600 + str(i): 0} for i in range(2000)],
    }
    small = {"x": [None, True, 7, "a", -(10**6)] * 40_000}
    long = S511 * 1000
    twice = {"x": [long, long]}
    for sample in (distinct, small, twice):
        (back,) = decode_chunk(encode_chunk([sample]).data)
        assert back == sample


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize(
    ("make", "same_view"),
    [
        pytest.param(lambda a, t: [a[:] for _ in range(12)], True, id="numpy-a[:]"),
        pytest.param(lambda a, t: [a[i:] for i in range(12)], False, id="numpy-slices"),
        pytest.param(lambda a, t: [t.view(-1) for _ in range(12)], True, id="torch-view"),
        pytest.param(lambda a, t: [t[i:] for i in range(12)], False, id="torch-slices"),
        pytest.param(lambda a, t: [t.view(4, -1)[i] for i in range(4)] * 12, True, id="rows"),
        pytest.param(
            lambda a, t: [torch.from_numpy(a)[i:] for i in range(12)], False, id="from-numpy"
        ),
        pytest.param(lambda a, t: [t.numpy()[i:] for i in range(12)], False, id="tensor-numpy"),
    ],
)
@pytest.mark.parametrize("limit", [1 << 30, 64], ids=["inline", "tensor-blob"])
def test_claim1_views_of_one_buffer_are_counted(
    small_bound: int, make, same_view: bool, limit: int
) -> None:
    """Claim 1: each view (``a[:]``, ``t.view(-1)``, slices) is a new object, so the "leaf
    written before" check (by id) missed them: 12 views of one 128 KiB buffer wrote 1.5 MiB,
    and 300 views of a 1 MiB one 300 MB, unbounded.  Decided: a view is stored as data each
    time, and the bytes written from one buffer (torch storage, numpy base) beyond its size
    count against the bound, inline or as tensor blobs (a tensor blob of exactly the same
    view is not written again: see tests/codec/test_shared_values.py)."""
    a = np.zeros(1 << 14)  # 128 KiB
    t = torch.arange(1 << 15, dtype=torch.float32)  # 128 KiB
    data = make(a, t)
    if limit == 64 and same_view:
        # exactly the same views of one storage: one tensor blob each, not written again
        enc = encode_chunk([{"x": data}], inline_limit=limit)
        assert len(enc.tensor_blobs) == len({_view_key(v) for v in data})
        return
    with pytest.raises(UnencodableError, match=r"sample field 'x'\[\d+\]: .*bytes beyond"):
        encode_chunk([{"x": data}], inline_limit=limit)
    # a buffer written out no more than it holds is free: views that tile it
    tiles = {"x": [t[i * 4096 : (i + 1) * 4096] for i in range(8)]}
    encode_chunk([tiles], inline_limit=limit)


def _view_key(v: Any) -> tuple[int, tuple[int, ...]]:
    """Where a tensor or array view starts in its buffer, and its shape."""
    if isinstance(v, np.ndarray):
        return v.__array_interface__["data"][0], v.shape
    return v.storage_offset(), tuple(v.shape)


_BYTES = bytes(1 << 17)  # 128 KiB


_ARRAY = np.zeros(1 << 14)  # 128 KiB, owns its memory


_CBUF = (ctypes.c_uint8 * (1 << 17))()  # 128 KiB


class ArrayInterface:
    """A new object per view exporting an array's memory through ``__array_interface__``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.__array_interface__ = arr.__array_interface__
        self.arr = arr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: [np.frombuffer(memoryview(_BYTES), np.uint8) for _ in range(40)],
            id="frombuffer-memoryview",
        ),
        pytest.param(lambda: [np.asarray(_ARRAY.data) for _ in range(40)], id="asarray-memoryview"),
        pytest.param(
            lambda: [np.ctypeslib.as_array(_CBUF) for _ in range(40)], id="ctypes-as-array"
        ),
        pytest.param(
            lambda: [np.asarray(ArrayInterface(_ARRAY)) for _ in range(40)],
            id="array-interface-exporter",
        ),
    ],
)
def test_views_through_a_fresh_buffer_wrapper_are_counted(
    small_bound: int, make: Callable[[], list[np.ndarray]]
) -> None:
    """Claim 1 (views of one buffer count against the bound): `_numpy_buffer` keys a buffer
    by the id of the array's base object, and each ``memoryview`` (``np.frombuffer``,
    ``np.asarray(memoryview(a))``, ``np.ctypeslib.as_array``) is a new base over the same
    memory, so 40 such views of one 128 KiB buffer write 5 MiB unbounded (1,000 views of a
    1 MiB buffer: a 1 GB record from 1 MiB held).  Fixed for memoryviews (the buffer is the
    object they export), then for an ``__array_interface__`` exporter made per view, whose
    memory is known by address only: borrowed memory is counted by its address ranges."""
    with pytest.raises(UnencodableError, match=r"sample field 'x'\[\d+\]: .*bytes beyond"):
        encode_chunk([{"x": make()}])


_TENSOR = torch.zeros(1 << 15)  # 128 KiB


_BYTEARRAY = bytearray(1 << 17)  # 128 KiB, writable: torch.frombuffer warns on bytes


def _ctypes_from_address() -> np.ndarray:
    """A new ctypes array per view over one buffer's address."""
    fresh = (ctypes.c_uint8 * (1 << 17)).from_address(ctypes.addressof(_CBUF))
    return np.ctypeslib.as_array(fresh)


#: One view of a 128 KiB buffer, through a new lending object at each call.
_BORROWED_VIEWS: dict[str, Callable[[], Any]] = {
    "array-interface": lambda: np.asarray(ArrayInterface(_ARRAY)),
    "numpy-from-dlpack": lambda: np.from_dlpack(_TENSOR),
    "ctypes-from-address": _ctypes_from_address,
    "torch-from-numpy": lambda: torch.from_numpy(_ARRAY),
    "torch-frombuffer": lambda: torch.frombuffer(_BYTEARRAY, dtype=torch.uint8),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", _BORROWED_VIEWS.values(), ids=_BORROWED_VIEWS.keys())
def test_borrowed_memory_is_counted_by_address(small_bound: int, make: Callable[[], Any]) -> None:
    """The bound on bytes written again holds for memory lent by a new object per view: of
    8 views of one 128 KiB buffer 1 is the sample's own and 7 write 896 KiB again (under the
    1 MiB bound: accepted); a 9th writes 1 MiB again, and with the tensors' repeated nodes
    (same storage, same view) more: a 10th passes the bound whatever the view (refused).
    Counted by the addresses the views span, not by the object that lent them."""
    encode_chunk([{"x": [make() for _ in range(8)]}])
    with pytest.raises(UnencodableError, match=r"sample field 'x'\[(8|9)\]: .*bytes beyond"):
        encode_chunk([{"x": [make() for _ in range(10)]}])


_WINDOWS: dict[str, Callable[[int, int], Any]] = {
    "array-interface": lambda i, n: np.asarray(ArrayInterface(_ARRAY[i // 8 : (i + n) // 8])),
    "numpy-from-dlpack": lambda i, n: np.from_dlpack(_TENSOR[i // 4 : (i + n) // 4]),
    "torch-from-numpy": lambda i, n: torch.from_numpy(_ARRAY[i // 8 : (i + n) // 8]),
    "torch-frombuffer": lambda i, n: torch.frombuffer(
        _BYTEARRAY, dtype=torch.uint8, offset=i, count=n
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("window", _WINDOWS.values(), ids=_WINDOWS.keys())
def test_overlapping_windows_of_borrowed_memory_are_counted(
    small_bound: int, window: Callable[[int, int], Any]
) -> None:
    """Sliding windows, each through a new lender (``torch.from_numpy(a[i : i + n])`` is a
    new storage at a new address each time): 40 windows of 64 KiB a step of 1 KiB apart
    span 103 KiB and write 2.5 MiB, refused; the same windows side by side (each byte once,
    2.5 MiB spanned by 40 of them over 20 buffers' worth of distinct windows) are not."""
    with pytest.raises(UnencodableError, match="bytes beyond"):
        encode_chunk([{"x": [window(k << 10, 1 << 16) for k in range(40)]}])
    # disjoint windows: each byte of the buffer written once, however many lenders
    encode_chunk([{"x": [window(k << 13, 1 << 13) for k in range(16)] * 2}])


@pytest.mark.timeout(120)
@settings(deadline=None, database=None)  # a loaded CI machine: no per-example deadline
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 16), st.integers(0, 40)), max_size=30))
def test_address_ranges_charge_what_is_written_beyond_the_addresses_spanned(
    writes: list[tuple[int, int, int]],
) -> None:
    """`_AddressRanges` against a set of addresses: after each write the bytes charged so
    far are the most that the bytes written ever exceeded the addresses spanned."""
    ranges = values._AddressRanges()
    spanned: set[int] = set()
    written = charged = peak = 0
    for start, length, nbytes in writes:
        charged += ranges.add(start, start + length, nbytes)
        spanned.update(range(start, start + length))
        written += nbytes
        peak = max(peak, written - len(spanned))
        assert ranges.held == len(spanned)
        assert charged == peak
        assert all(a < b for a, b in zip(ranges.starts, ranges.ends, strict=True))
        assert all(b < a for a, b in zip(ranges.starts[1:], ranges.ends, strict=False))


@pytest.mark.timeout(120)
@settings(deadline=None, database=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(-40, 40)), min_size=1, max_size=4),
    st.sampled_from([1, 2, 4, 8]),
)
def test_a_views_footprint_is_the_bytes_its_elements_cover(
    dims: list[tuple[int, int]], itemsize: int
) -> None:
    """`values._footprint` against every element's bytes listed one by one: what a borrowed
    view vouches for is exactly what its elements cover (gaps, broadcasts, backward and
    overlapping strides included), never the span between them."""
    shape = [n for n, _ in dims]
    strides = [step for _, step in dims]
    covered: set[int] = set()
    for index in itertools.product(*(range(n) for n in shape)):
        first = 1000 + sum(i * step for i, step in zip(index, strides, strict=True))
        covered.update(range(first, first + itemsize))
    pieces = values._footprint(1000, shape, strides, itemsize)
    assert pieces is not None
    got: set[int] = set()
    for lo, hi in pieces:
        got.update(range(lo, hi))
    assert got == covered
    assert all(a[1] < b[0] for a, b in itertools.pairwise(pieces))  # merged, sorted


_names = itertools.count()


@pytest.fixture
def fresh_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path / "fresh_pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


def _name() -> str:
    return f"brk{next(_names)}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: torch.zeros(1).expand(2**40), id="torch-expand"),
        pytest.param(lambda: np.broadcast_to(np.zeros(1), (2**40,)), id="numpy-broadcast_to"),
    ],
)
def test_claim5_broadcast_views_raise_raw_errors_from_save(
    fresh_pool: ArchiveManager, value
) -> None:
    """Claims 4 and 5: a zero-stride view (``t.expand``, ``np.broadcast_to``: the "same
    memory many times" case of shared sub-objects) holds 8 bytes and expands to 4-8 TiB.
    Save calls ``.contiguous()`` / ``.tobytes()`` and raises a raw ``RuntimeError``
    ("DefaultCPUAllocator: can't allocate memory") or ``MemoryError`` instead of an
    `UnencodableError` naming the field; smaller expansions (say 2**31 of a 1-element view)
    silently allocate gigabytes.  Fix: bound the expanded byte size (numel * itemsize) of
    tensors and arrays against a documented limit before materialising, and refuse past it
    with the field named."""
    before = snapshot_pool(fresh_pool)
    # decided: refused before anything is expanded, past a bound on the bytes a record would
    # hold beyond the sample's own memory (codec.values._MAX_EXTRA_BYTES)
    with pytest.raises(UnencodableError, match=r"field 'metadata'\['view'\]: .*broadcast"):
        fresh_pool.save(_name(), [Sample(metadata={"view": value()})], rollout_id=1)
    assert snapshot_pool(fresh_pool) == before
    with (
        pytest.raises(UnencodableError, match="metadata"),
        fresh_pool.writer(_name(), rollout_id=1) as w,
    ):
        w.add(Sample(metadata={"view": value()}))
    assert snapshot_pool(fresh_pool) == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: torch.zeros(1).expand(2**31), id="torch-expand-8GiB"),
        pytest.param(lambda: torch.zeros(4, 1).expand(4, 2**28).t(), id="torch-expand-t"),
        pytest.param(
            lambda: torch.zeros(2**17).as_strided((2**16, 2**16), (1, 1)), id="torch-overlap"
        ),
        pytest.param(lambda: np.broadcast_to(np.zeros(1), (2**31,)), id="numpy-8GiB"),
        pytest.param(
            lambda: np.lib.stride_tricks.as_strided(np.zeros(2**17), (2**16, 2**16), (8, 8)),
            id="numpy-overlap",
        ),
        pytest.param(lambda: np.broadcast_to(np.float64(1.0), (2**31,)), id="numpy-scalar-base"),
    ],
)
def test_claim5_sibling_views_are_refused_before_they_expand(
    fresh_pool: ArchiveManager, value
) -> None:
    """Siblings: expansions of gigabytes (not only terabytes), transposed expansions, and
    overlapping strides without a zero stride; above and below the inline limit alike."""
    for limit in (64, 1 << 40):
        with pytest.raises(UnencodableError, match="broadcast"):
            encode_chunk([{"view": value()}], inline_limit=limit)
    before = snapshot_pool(fresh_pool)
    with pytest.raises(UnencodableError, match="metadata"):
        fresh_pool.save(_name(), [Sample(metadata={"view": value()})], rollout_id=1)
    assert snapshot_pool(fresh_pool) == before


@pytest.mark.timeout(300)
def test_claim5_small_views_and_repeated_tensors_still_round_trip(
    fresh_pool: ArchiveManager,
) -> None:
    """A small broadcast view is stored expanded and loads equal; a tensor above the inline
    limit held in many places is hashed once and loads as equal copies."""
    big = torch.arange(1000)
    views: dict[str, Any] = {
        "t": torch.arange(3).expand(4, 3),
        "n": np.broadcast_to(np.arange(3), (4, 3)),
        "refs": [big] * 5000,
    }
    name = _name()
    fresh_pool.save(name, [views], rollout_id=1)
    (loaded,) = fresh_pool.open_archive(name).load_samples()
    assert torch.equal(loaded["t"], views["t"].contiguous())
    assert np.array_equal(loaded["n"], views["n"]) and loaded["n"].flags.writeable
    assert len(loaded["refs"]) == 5000
    assert all(torch.equal(r.materialize(), big) for r in loaded["refs"][:3])


_REPEATED_ARRAY_SCRIPT = textwrap.dedent(
    """
    import resource, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    import numpy as np
    from archive_manager import ArchiveManager, codec
    from archive_manager.errors import ArchiveError
    if sys.argv[1] == "python":
        codec._native_numbers = None  # the Python paths of the list conversion
    pool = ArchiveManager.open(tempfile.mkdtemp() + "/pool")
    # the address space in use now, plus 1 GiB
    vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
    limit = vm + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    a = np.arange(1 << 18, dtype=np.float64)  # 2 MiB, above the inline limit
    try:
        pool.save("refs", [{"refs": [a] * 1000, "mixed": [1] + [a] * 1000}], rollout_id=1)
        s = pool.open_archive("refs")[0]
        print("RESULT saved", s["refs"][0] is s["mixed"][-1], np.array_equal(s["refs"][9], a))
    except ArchiveError as exc:
        print("RESULT refused", type(exc).__name__, str(exc)[:200])
    except BaseException as exc:
        print("RESULT raw", type(exc).__name__, str(exc)[:200])
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["native", "python"])
def test_a_list_holding_one_array_many_times_is_not_expanded(path: str) -> None:
    """A list holding one 2 MiB array 1,000 times saves as 1,000 references to one blob
    (its node counted, not its bytes) in bounded memory.  Fixed: the numeric-list check
    handed the list to ``marshal.dumps``, which writes an object of the buffer protocol
    whole each time it meets it: 2 GB allocated (a raw MemoryError past the limit) before
    the list was found to hold no numbers; the same before the bound refused it, when
    such arrays were stored inline."""
    result = subprocess.run(
        [sys.executable, "-c", _REPEATED_ARRAY_SCRIPT, path],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines == ["RESULT saved True True"], (result.stdout[-2000:], result.stderr[-2000:])


_DAG_SCRIPT = textwrap.dedent(
    """
    import resource, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    from archive_manager import ArchiveManager, Sample
    from archive_manager.errors import ArchiveError
    fresh_pool = ArchiveManager.open(tempfile.mkdtemp() + "/fresh_pool")
    # the address space in use now, plus 1.5 GiB
    vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
    limit = vm + (3 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    v = "x" * (1 << 20)        # one 1 MiB string
    for _ in range(14):         # held in 2**14 places through 28 distinct small lists
        v = [v, v]
    try:
        fresh_pool.save("dag", [Sample(metadata={"dag": v})], rollout_id=1)
        print("RESULT saved")
    except ArchiveError as exc:
        print("RESULT refused", type(exc).__name__, str(exc)[:200])
    except BaseException as exc:
        print("RESULT raw", type(exc).__name__, str(exc)[:200])
    """
)


@pytest.mark.timeout(300)
def test_claim4_shared_leaves_are_not_bounded() -> None:
    """Claim 4: shared sub-objects are bounded.  The bound counts *items* of repeated
    containers (2**20), not the bytes written: 14 levels of ``v = [v, v]`` over one 1 MiB
    string (or a tensor below the inline limit, or a numpy array) repeats only ~32,000 items,
    so it is not refused, and it expands to 16 GiB of record.  Run with a 1.5 GiB address
    space budget, save dies with a raw MemoryError instead of a clear UnencodableError; with
    no limit it stalls and swaps.  Fix: count the bytes of leaves written again (strings
    >= _MIN_RAW_STR, inline tensors, arrays) against a byte bound too, or store a repeated
    leaf once and reference it."""
    out = subprocess.run(
        [sys.executable, "-c", _DAG_SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert result, out.stderr[-2000:]
    assert result[0].startswith("RESULT refused UnencodableError"), result[0]
    assert "sample field 'metadata'['dag']" in result[0] and "bytes beyond" in result[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "leaf",
    [
        pytest.param(lambda: np.zeros(1 << 17), id="numpy-array"),
        pytest.param(lambda: torch.zeros(1 << 18), id="inline-tensor"),
        pytest.param(lambda: "y" * (1 << 20), id="long-string"),
    ],
)
def test_claim4_sibling_leaves_repeated_in_one_list_are_bounded(leaf) -> None:
    """Siblings: no DAG needed, one list holding the same 1 MiB leaf 300 times (items far
    below the item bound) is refused by the byte bound, at the place that passes it (a
    tensor's or array's node counts too, so it passes one place earlier); 200 times is
    stored."""
    value = leaf()
    encode_chunk([{"many": [value] * 200}], inline_limit=1 << 30)
    with pytest.raises(UnencodableError, match=r"field 'many'\[25[67]\]: .*bytes beyond"):
        encode_chunk([{"many": [value] * 300}], inline_limit=1 << 30)


class _Exporter:
    """A new object per view exporting raw memory through ``__array_interface__``."""

    def __init__(self, address: int, shape: tuple[int, ...], strides: tuple[int, ...] | None):
        self.__array_interface__ = {
            "data": (address, True),
            "shape": shape,
            "strides": strides,
            "typestr": "|u1",
            "version": 3,
        }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("through", ["array_interface", "dlpack"])
def test_a_strided_view_does_not_vouch_for_the_gap_it_spans(
    monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    """Claim 1, the bound vs borrowed memory: `_AddressRanges` counts the union of the
    address ranges borrowed views *span* as held.  A 2-element view whose stride is the
    distance between two live buffers (a 1 MiB map and a 16-byte array: tens of TB apart in
    a 64-bit address space) spans the whole gap, so any number of views of the 1 MiB array
    are then written free: 40 MiB for 1 MiB held past a 1 MiB bound, and with the default
    bound an unbounded amount.  The same through DLPack: ``torch.from_dlpack`` of that view
    makes a storage of 4.6e13 bytes that torch cannot resize, counted as held whole."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(values, "_MAX_EXTRA_BYTES", 1 << 20)
    # Two live buffers more than 1 GiB apart, wherever the kernel places maps: the 1 MiB
    # region outside a 2 GiB read-only map (private, never written: one zero page is read),
    # and 16 bytes at whichever end of that map lies farther from it.  (A heap array next to
    # a map was sometimes within 1 GiB of it: the case could not be built.)
    big = np.frombuffer(
        mmap.mmap(-1, (2 << 30) + 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ), np.uint8
    )
    region = np.frombuffer(mmap.mmap(-1, 1 << 20), np.uint8)
    far = max((big[:16], big[-16:]), key=lambda end: abs(end.ctypes.data - region.ctypes.data))
    assert abs(region.ctypes.data - far.ctypes.data) > 1 << 30
    a, b = region.ctypes.data, far.ctypes.data
    lo, hi = min(a, b), max(a, b)
    views = [np.asarray(_Exporter(a, (region.size,), None)) for _ in range(40)]
    with pytest.raises(UnencodableError, match="beyond the memory"):
        encode_sample({"v": views})  # refused without the wide view: the rule holds
    wide: Any = np.asarray(_Exporter(lo, (2,), (hi - lo,)))
    if through == "dlpack":
        wide = torch.from_dlpack(wide)
    with pytest.raises(UnencodableError, match="beyond the memory"):
        encode_sample({"wide": wide, "v": views})
