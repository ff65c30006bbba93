"""Issue 24, third review: cases that break the claims of the second fix (README, "What you
save is what you load"; docs/architecture.md, "Samples and values").  Each test failed on the
code it was written against, for the reason its docstring gives.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same_samples
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import ArchiveManager
from archive_manager.codec import encode_chunk, values
from archive_manager.errors import UnencodableError, UnsupportedFormatError
from archive_manager.samples import _ENUM_FIELDS, register_sample_class

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()
CALLS: list[str] = []


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path_factory.mktemp("rev24") / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """The expansion bound lowered to 1 MiB: the same rule, tested with small data."""
    monkeypatch.setattr(values, "_MAX_EXTRA_BYTES", 1 << 20)
    return 1 << 20


# --------------------------------------------------------------------------- claim 1

_BYTES = bytes(1 << 17)  # 128 KiB
_ARRAY = np.zeros(1 << 14)  # 128 KiB, owns its memory
_CBUF = (ctypes.c_uint8 * (1 << 17))()  # 128 KiB


class ArrayInterface:
    """A new object per view exporting an array's memory through ``__array_interface__``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.__array_interface__ = arr.__array_interface__
        self.arr = arr


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: [np.frombuffer(memoryview(_BYTES), np.uint8) for _ in range(40)],
            id="frombuffer-memoryview",
        ),
        pytest.param(
            lambda: [np.asarray(memoryview(_ARRAY)) for _ in range(40)], id="asarray-memoryview"
        ),
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


def test_table_export_of_a_shared_tensor_is_bounded(
    pool: ArchiveManager, small_bound: int, tmp_path: Path
) -> None:
    """Claim 1 vs the exports: a tensor blob held in N places is accepted by the save (one
    blob, N small nodes), but the JSONL export (and Parquet's JSON columns, the viewer) writes
    the tensor out N times: 200 places of a 16 KiB tensor export 16 MB of text (2,000 places
    of 64 KiB: a 1.4 MB archive exported as 164 MB in 29 s; the save's bound admits about two
    million places).  What the save bounded should not come back unbounded on export."""
    name = f"amp{next(_names)}"
    big = torch.zeros(1 << 12)  # 16 KiB
    pool.save(name, [{"x": [big] * 200}], rollout_id=1)
    out = tmp_path / "amp.jsonl"
    try:
        pool.export(name, out)
    except UnencodableError:
        # refused: bounded, and nothing left under the target's name or beside it
        assert not out.exists() and list(tmp_path.iterdir()) == []
        return
    assert out.stat().st_size <= small_bound + 64 * big.nbytes


# --------------------------------------------------------------------------- claim 2


def test_table_round_trip_keeps_one_tensor_held_twice(pool: ArchiveManager, tmp_path: Path) -> None:
    """Claim 2 (one tensor held in several places loads as one object) is kept by every load
    and by export_pt/import_pt, but was not by the JSONL round trip: ``{"t": t, "u": [t]}``
    came back as two separate tensors.  The export's ``sample_shared`` column now lists the
    places, and the import gives them one tensor."""
    name = f"sh{next(_names)}"
    t = torch.arange(100, dtype=torch.float32)
    pool.save(name, [{"t": t, "u": [t]}], rollout_id=1)
    (loaded,) = pool.open_archive(name).load_samples()
    assert loaded["t"] is loaded["u"][0]
    out = tmp_path / "sh.jsonl"
    pool.export(name, out)
    pool.import_table(out, name=f"{name}i")
    (back,) = pool.open_archive(f"{name}i").load_samples()
    assert back["t"] is back["u"][0]


def _shared_sample() -> dict[str, Any]:
    """One tensor (a tensor blob) in a typed column and three JSON places, a small tensor
    twice inside a tuple and a dict keyed by a float, one numpy array in a typed column and
    inside JSON."""
    t = torch.arange(100, dtype=torch.float32)
    small = torch.tensor([1, 2], dtype=torch.int16)
    a = np.arange(6.0).reshape(2, 3)
    return {"t": t, "u": [t, (small, {"k": a, 3.5: small})], "a": a, "v": {"x": t}}


def _assert_shared(s: dict[str, Any]) -> None:
    assert s["t"] is s["u"][0] is s["v"]["x"]
    assert s["u"][1][0] is s["u"][1][1][3.5]
    assert s["u"][1][1]["k"] is s["a"]


def _assert_separate(s: dict[str, Any]) -> None:
    assert s["t"] is not s["u"][0] and s["u"][0] is not s["v"]["x"]
    assert s["u"][1][0] is not s["u"][1][1][3.5]
    assert s["u"][1][1]["k"] is not s["a"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_table_round_trip_keeps_what_each_sample_shares(
    pool: ArchiveManager, tmp_path: Path, suffix: str
) -> None:
    """Claim 2 through both table formats, typed and JSON columns, tuples and dicts on the
    way: the places of one tensor or array come back as one object; the same structure
    built of distinct equal objects (the second sample) comes back distinct."""
    name = f"shp{next(_names)}"
    first = _shared_sample()
    # the same structure, each place a copy of its own
    t, small, a = first["t"], first["u"][1][0], first["a"]
    second = {
        "t": t.clone(),
        "u": [t.clone(), (small.clone(), {"k": a.copy(), 3.5: small.clone()})],
        "a": a.copy(),
        "v": {"x": t.clone()},
    }
    pool.save(name, [first, second], rollout_id=1)
    out = tmp_path / f"shp{suffix}"
    pool.export(name, out)
    back = pool.open_archive(pool.import_table(out, name=f"{name}i").name).load_samples()
    assert_same_samples(back, pool.open_archive(name).load_samples())
    _assert_shared(back[0])
    _assert_separate(back[1])


def test_shared_column_leaves_the_table_readable(pool: ArchiveManager, tmp_path: Path) -> None:
    """The readers of the table formats see every place's values, and the ``sample_shared``
    column as text (null where a sample shares nothing): pandas, DuckDB and datasets."""
    datasets = pytest.importorskip("datasets")
    duckdb = pytest.importorskip("duckdb")
    pd = pytest.importorskip("pandas")
    name = f"shr{next(_names)}"
    second = {"t": torch.zeros(100), "u": [], "a": np.zeros((2, 3))}
    pool.save(name, [_shared_sample(), second], rollout_id=1)
    parquet, jsonl = tmp_path / "shr.parquet", tmp_path / "shr.jsonl"
    pool.export(name, parquet)
    pool.export(name, jsonl)
    want = [[["t"], ["u", 0], ["v", 0]], [["u", 1, 0], ["u", 1, 1, 1]], [["u", 1, 1, 0], ["a"]]]
    df = pd.read_parquet(parquet)
    assert [json.loads(v) if isinstance(v, str) else None for v in df["sample_shared"]] == [
        want,
        None,
    ]
    assert pd.isna(df["sample_shared"][1])
    assert list(df["t"][0]) == list(range(100))
    assert json.loads(df["u"][0])[0]["v"] == list(range(100))  # written in full at each place
    rows = duckdb.sql(f"select sample_shared, len(t) from '{parquet}' order by position").fetchall()
    assert rows == [(json.dumps(want), 100), (None, 100)]
    ds = datasets.Dataset.from_parquet(str(parquet), cache_dir=str(tmp_path / "cache"))
    assert json.loads(ds[0]["sample_shared"]) == want and ds[1]["sample_shared"] is None
    lines = pd.read_json(jsonl, lines=True)
    assert lines["sample_shared"][0] == want and pd.isna(lines["sample_shared"][1])


def test_shared_column_that_does_not_fit_its_row(pool: ArchiveManager, tmp_path: Path) -> None:
    """The table's values win: places the column says are one but that hold different
    values (an edited table) are refused, naming them; without the column (an export of an
    older release, or the column dropped) they import as separate values; a place in a
    column left out of the table is skipped; a malformed column is refused."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    name = f"shf{next(_names)}"
    pool.save(name, [_shared_sample()], rollout_id=1)
    out = tmp_path / "shf.parquet"
    pool.export(name, out)
    table = pq.read_table(out)

    def imported(t: Any) -> dict[str, Any]:
        path = tmp_path / f"{next(_names)}.parquet"
        pq.write_table(t, path)
        (sample,) = pool.import_table(path, name=f"{name}-{path.stem}").load_samples()
        return sample

    u = json.loads(table.column("u")[0].as_py())
    u[0]["v"][0] = 7.0  # one place edited
    edited = table.set_column(
        table.schema.get_field_index("u"), table.schema.field("u"), pa.array([json.dumps(u)])
    )
    with pytest.raises(UnsupportedFormatError, match=r"'t' and 'u'\[0\] hold one value"):
        imported(edited)
    assert not [a for a in pool.find(state=None) if a.name.startswith(f"{name}-")]
    _assert_separate(imported(table.drop_columns(["sample_shared"])))
    # the typed columns t and a left out: the JSON places still share among themselves
    partial = imported(table.drop_columns(["t", "t.shape", "a", "a.shape"]))
    assert partial["u"][0] is partial["v"]["x"] and "t" not in partial
    assert partial["u"][1][0] is partial["u"][1][1][3.5]
    for bad in ["{}", "[[1]]", '[[["u", 9]]]', '[[["u", 1, 1], ["u", 0]]]']:
        broken = table.set_column(
            table.schema.get_field_index("sample_shared"),
            table.schema.field("sample_shared"),
            pa.array([bad]),
        )
        with pytest.raises(UnsupportedFormatError, match="sample_shared"):
            imported(broken)


def test_export_pt_keeps_one_array_held_twice(pool: ArchiveManager, tmp_path: Path) -> None:
    """Claim 2 through export_pt/import_pt: one numpy array held twice loads as one object,
    but export_pt makes a tensor per place, so import_pt gives two tensors (one tensor held
    twice comes back as one)."""
    name = f"np{next(_names)}"
    a = np.arange(100.0)
    pool.save(name, [{"a": a, "b": [a]}], rollout_id=1)
    out = pool.open_archive(name).export_pt(tmp_path / "np.pt")
    (back,) = pool.import_pt(out, name=f"{name}i").load_samples()
    assert back["a"] is back["b"][0]


# --------------------------------------------------------------------------- claim 3


class RecordingMeta(type):
    """A metaclass whose attribute lookup is the user's code."""

    def __getattribute__(cls, name: str) -> Any:
        CALLS.append(f"metaclass __getattribute__ {name}")
        return super().__getattribute__(name)


@dataclasses.dataclass
class MetaDataclass(metaclass=RecordingMeta):
    x: int = 0


class ClassProperty:
    """An object whose ``__class__`` is a property: ``isinstance`` on it runs user code."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        CALLS.append("annotation __class__")
        return ClassProperty


LEVEL = ClassProperty()


@dataclasses.dataclass
class PropertyAnnotated:
    level: LEVEL = 0  # type: ignore[valid-type]


register_sample_class(PropertyAnnotated, "rev24.PropertyAnnotated")


def registered(cls: type) -> type | None:
    """``cls`` registered, or None when registering refuses it (as refused as at save)."""
    try:
        return register_sample_class(cls, f"rev24.{cls.__qualname__}")
    except UnencodableError:
        return None


@pytest.mark.parametrize(
    "sample",
    [
        pytest.param(
            lambda: registered(MetaDataclass) and MetaDataclass(3),
            id="dataclass-metaclass-getattribute",
        ),
        pytest.param(lambda: PropertyAnnotated(4), id="annotation-class-property"),
    ],
)
def test_loading_runs_no_code_of_a_registered_dataclass(
    pool: ArchiveManager, sample: Callable[[], Any]
) -> None:
    """Claim 3 (loading runs none of the user's code; classes a plain lookup cannot rebuild
    are refused at save): enums with a custom metaclass are refused, but a registered
    dataclass with one is saved, and the first load of a process (`_enum_fields` reads
    ``dataclasses.fields(cls)``, ``cls.__mro__``) runs its metaclass's ``__getattribute__``;
    an annotation naming an object is checked with ``isinstance``, which reads its
    ``__class__``, a property of the user's.  Either is fine: refused at save, or no call."""
    value = sample()
    if value is None:
        return  # refused at registration
    name = f"c{next(_names)}"
    try:
        pool.save(name, [value], rollout_id=1)
    except UnencodableError:
        return
    _ENUM_FIELDS.pop(type(value), None)  # as in a process that only loads
    CALLS.clear()
    (loaded,) = pool.open_archive(name).load_samples()
    assert CALLS == []
    assert loaded == value


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
