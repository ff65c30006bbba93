"""Shared values (README, "What you save is what you load"; docs/architecture/samples-and-values.md,
"Samples and values"): one tensor or array held in several places of a sample is stored once and
loads as one object, through `load_samples`, Parquet and JSONL exports and `import_table` (the
``sample_shared`` column, bounded and checked against its row), and `export_pt`/`import_pt`;
alias indices a record cannot hold are integrity errors; one NaN object held twice loads as
documented.  Each test failed on the code it was written against, for the reason its
docstring gives ("Claim N" names the claim of the fix it broke).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same_samples

from archive_manager import ArchiveManager, TensorRef
from archive_manager.codec import decode_chunk, encode_chunk, values
from archive_manager.errors import IntegrityError, UnencodableError, UnsupportedFormatError
from archive_manager.pool.arrow import sharing

_names = itertools.count()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path_factory.mktemp("fidelity") / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


def round_trip(pool: ArchiveManager, sample: Any) -> Any:
    name = f"ok{next(_names)}"
    pool.save(name, [sample], rollout_id=1)
    (loaded,) = pool.open_archive(name).load_samples()
    return loaded


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim1_one_tensor_blob_in_many_places_loads_as_one(pool: ArchiveManager) -> None:
    """Claim 1: a tensor blob referenced 400 times in a sample loaded as 400 lazy refs, each
    materializing its own copy (400x the memory on load).  Decided: a tensor (or the same
    view of one storage: same offset, shape, strides, dtype) held in several places of one
    sample is stored once and loads as one object held in those places, inline or as a
    tensor blob; numpy arrays likewise.  Equal tensors that were distinct objects load as
    distinct objects."""
    big = torch.arange(100, dtype=torch.int64)  # 800 bytes: a tensor blob at limit 64
    small = torch.arange(3, dtype=torch.int8)
    arr = np.arange(5)
    sample = {
        "refs": [big] * 400,
        "views": [big.view(-1) for _ in range(3)],
        "small": [small, small],
        "arrays": [arr, arr, arr[:]],
        "distinct": [big.clone(), big.clone()],
    }
    loaded = round_trip(pool, sample)
    refs = loaded["refs"]
    assert all(r is refs[0] for r in refs) and isinstance(refs[0], TensorRef)
    assert all(v is refs[0] for v in loaded["views"])
    assert torch.equal(refs[0].materialize(), big) and refs[399].loaded
    assert loaded["small"][0] is loaded["small"][1]
    assert loaded["arrays"][0] is loaded["arrays"][1] is loaded["arrays"][2]
    assert loaded["distinct"][0] is not loaded["distinct"][1]
    assert loaded["distinct"][0].digest == refs[0].digest


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_hostile_alias_indices_are_integrity_errors() -> None:
    """A record whose nodes of one alias index describe different values is damaged."""
    t = torch.arange(3)
    (back,) = decode_chunk(encode_chunk([{"a": t, "b": t, "c": t.clone()}]).data)
    assert back["a"] is back["b"] and back["c"] is not back["a"]
    rec = values.encode_sample({"a": torch.arange(3), "b": torch.arange(4)}).record
    tree_len = int.from_bytes(rec[:4], "little")
    tree = json.loads(rec[4 : 4 + tree_len])
    tree["f"]["b"]["a"] = tree["f"]["a"]["a"]
    forged = json.dumps(tree, separators=(",", ":")).encode().ljust(tree_len)
    with pytest.raises(IntegrityError, match="alias"):
        values.decode_sample(memoryview(rec[:4] + forged + rec[4 + tree_len :]), None)


@pytest.mark.parametrize("value", [torch.arange(64), np.arange(64)], ids=["tensor", "array"])
def test_blob_nodes_of_one_alias_must_name_one_blob(value: Any) -> None:
    """Two blob nodes of one alias index naming different blobs (of one dtype and shape) are
    damage: the second blob is never read nor checked otherwise."""
    other = value + 1
    rec = values.encode_sample({"a": value, "b": other}, inline_limit=0).record
    tree_len = int.from_bytes(rec[:4], "little")
    tree = json.loads(rec[4 : 4 + tree_len])
    assert tree["f"]["a"]["h"] != tree["f"]["b"]["h"]
    tree["f"]["b"]["a"] = tree["f"]["a"]["a"]
    forged = json.dumps(tree, separators=(",", ":")).encode().ljust(tree_len)
    with pytest.raises(IntegrityError, match="alias"):
        values.decode_sample(
            memoryview(rec[:4] + forged + rec[4 + tree_len :]),
            lambda digest: torch.zeros(64, dtype=torch.int64),
            array_loader=lambda digest: np.zeros(64, dtype=np.int64),
        )


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """The expansion bound lowered to 1 MiB: the same rule, tested with small data."""
    monkeypatch.setattr(values, "_MAX_EXTRA_BYTES", 1 << 20)
    return 1 << 20


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
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


@pytest.mark.timeout(120)
def test_one_nan_object_held_as_a_key_and_a_value_loads_as_two_nans_as_documented(
    pool: ArchiveManager,
) -> None:
    """Claim 1 (sharing): distinct NaN keys now stay distinct because the decoder makes a
    new float per NaN it reads, but so does one NaN *object* held in two places: a sample
    keeping ``keys=[nan]`` and ``m={nan: ...}`` (math.nan is one object) finds
    ``m[keys[0]]`` before the save (dicts match keys by identity first) and raises
    KeyError after the load."""
    nan = math.nan
    sample: dict[str, Any] = {"keys": [nan], "m": {nan: "x"}}

    assert sample["m"][sample["keys"][0]] == "x"
    name = f"nan{next(_names)}"
    pool.save(name, [sample], rollout_id=1)
    (back,) = pool.open_archive(name).load_samples()
    # Decided (docs/architecture/samples-and-values.md, "Mapping keys"): scalars are values, so the
    # entry is there but only an equal-by-identity key finds it; the sample is otherwise whole.
    assert back["m"].get(back["keys"][0]) is None
    ((key, value),) = back["m"].items()
    assert math.isnan(key) and value == "x" and math.isnan(back["keys"][0])


def _import(pool: ArchiveManager, path: Path, row: dict[str, Any]) -> Any:
    path.write_text(json.dumps(row) + "\n")
    return pool.import_table(path, name=f"{path.stem}{next(_names)}")


@pytest.mark.timeout(120)
def test_a_sample_shared_column_costs_what_the_table_holds(
    pool: ArchiveManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim 1 vs a hostile (or merely large) table: `share_places` compared an array's
    bytes again for every time a place was named (a column naming one 8 MB array's place
    2,000 times: 5 s for a 10 KB column), and listed a dict's values once per place in it
    (4,000 places in a 100,000-item dict: 14 s for a 1.6 MB table, quadratic).  Now a place
    named again is skipped and a dict's keys are listed once (counted here, not timed: the
    import's time is the benchmarks' business)."""
    compared: list[int] = []
    listed: list[int] = []
    same_data, dict_keys = sharing._same_data, sharing._dict_keys

    def counting(a: Any, b: Any) -> bool:
        compared.append(1)
        return same_data(a, b)

    def listing(value: dict[Any, Any], keys: dict[int, Any]) -> list[Any]:
        if id(value) not in keys:
            listed.append(len(value))
        return dict_keys(value, keys)

    monkeypatch.setattr(sharing, "_same_data", counting)
    monkeypatch.setattr(sharing, "_dict_keys", listing)
    name = f"shq{next(_names)}"
    big = np.zeros(1 << 20)
    pool.save(name, [{"a": big, "u": [big]}], rollout_id=1)
    out = tmp_path / "shq.jsonl"
    pool.export(name, out)
    row = json.loads(out.read_text().splitlines()[0])
    assert row["sample_shared"] == [[["a"], ["u", 0]]]
    row["sample_shared"] = [[["a"]] + [["u", 0]] * 2000]
    _import(pool, tmp_path / "repeat.jsonl", row)
    assert len(compared) <= 1, len(compared)

    # distinct places in one big dict: its keys listed once, as the table holds it once
    n = 20_000
    small = np.zeros(2)
    m = {str(i): small for i in range(n)}
    name = f"shd{next(_names)}"
    pool.save(name, [{"m": m}], rollout_id=1)
    out = tmp_path / "shd.jsonl"
    pool.export(name, out)
    row = json.loads(out.read_text().splitlines()[0])
    assert len(row["sample_shared"][0]) == n
    compared.clear()
    back = _import(pool, tmp_path / "with.jsonl", row)
    assert listed == [n], listed[:5]
    assert len(compared) == n - 1  # each place against the first, once
    values = list(back.load_samples()[0]["m"].values())
    assert all(v is values[0] for v in values)
