"""Table files in and out (docs/architecture/getting-data-out.md, "Exports and imports"): a JSONL or
Parquet file the import cannot take is one clear error naming the file (and its row), writing
nothing; an export never replaces what it should not, takes any legal archive name and round-trips
non-finite floats; the CLI refuses options it would otherwise ignore.  Each test's docstring
says what went wrong before its fix."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from helpers import assert_same_samples, tiny_rollout

from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    UnencodableError,
    UnsupportedFormatError,
)
from archive_manager.pool import arrow


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        yield pool


def _import_fails_cleanly(pool: ArchiveManager, path: Path) -> None:
    """The import raises one UnsupportedFormatError naming the file and writes nothing;
    the CLI prints one line and exits non-zero."""
    with pytest.raises(UnsupportedFormatError, match=path.name):
        pool.import_table(path, name="x")
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("x")
    result = CliRunner().invoke(cli, ["--root", str(pool.root), "import", str(path), "--name", "x"])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.exception
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_jsonl_import_of_deeply_nested_json_is_a_clear_error(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A JSONL line nested 100,000 deep escapes as RecursionError (CLI traceback)."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "response": "x"}\n')
    _import_fails_cleanly(pool, path)


def test_jsonl_import_of_a_5000_digit_int_is_a_clear_error(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A JSONL int over Python's 4300-digit limit escapes as ValueError (CLI traceback)."""
    path = tmp_path / "bigint.jsonl"
    path.write_text('{"prompt": "a", "response": "b", "reward": ' + "9" * 5000 + "}\n")
    _import_fails_cleanly(pool, path)


def test_parquet_import_with_duplicate_column_names_is_a_clear_error(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A Parquet file with two columns named 'prompt' escapes as pyarrow's KeyError."""
    path = tmp_path / "dup.parquet"
    table = pa.table(
        [pa.array(["a"]), pa.array(["b"]), pa.array(["r"])], names=["prompt", "prompt", "response"]
    )
    pq.write_table(table, path)
    _import_fails_cleanly(pool, path)


def test_export_does_not_replace_a_dangling_symlink_without_force(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A symlink at the target (pointing nowhere yet) is silently replaced without --force."""
    pool.save("a", tiny_rollout(2), rollout_id=1)
    link = tmp_path / "out.parquet"
    os.symlink(tmp_path / "not-yet.parquet", link)
    with pytest.raises(ArchiveExistsError, match=r"out\.parquet"):
        pool.export("a", link)
    assert link.is_symlink()


def test_export_many_handles_a_long_legal_archive_name(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A 230-byte archive name (legal: up to 255) fits as '<name>.parquet' (238 bytes), but
    the temp file beside it ('.<name>.parquet.<pid>.<hex>.tmp') exceeds NAME_MAX: ENAMETOOLONG."""
    name = "r" * 230
    pool.save(name, tiny_rollout(2), rollout_id=1)
    (done,) = pool.export_many(tmp_path / "out", format="parquet")
    assert done.name == f"{name}.parquet" and done.is_file()
    assert [p.name for p in (tmp_path / "out").iterdir()] == [done.name]


def test_jsonl_round_trip_of_non_finite_floats_in_lists_and_arrays(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """A -inf log-prob in a number list (or nan in a numpy array) made the JSONL export raise
    ValueError ("Out of range float values are not JSON compliant"): CLI traceback."""
    samples = [
        {"rollout_log_probs": [-0.0, float("-inf"), float("nan"), -1.5], "tokens": [1, 2, 3, 4]},
        {"scores": np.array([np.nan, np.inf, 1.0], dtype=np.float32), "tokens": [5]},
    ]
    arc = pool.save("a", samples, rollout_id=1)
    pool.export("a", tmp_path / "a.jsonl")
    back = pool.import_table(tmp_path / "a.jsonl", name="b")
    assert_same_samples(back.load_samples(), arc.load_samples())


@pytest.mark.parametrize(
    "cell",
    ["{not json", "[" * 100_000 + "]" * 100_000, '{"a": ' + "9" * 5000 + "}"],
    ids=["invalid", "deep", "bigint"],
)
def test_parquet_import_of_a_bad_json_cell_is_a_clear_error(
    pool: ArchiveManager, tmp_path: Path, cell: str
) -> None:
    """An export's JSON column ('metadata') edited into bad text escaped as JSONDecodeError,
    RecursionError or ValueError (CLI traceback)."""
    pool.save("a", tiny_rollout(2), rollout_id=1)
    pool.export("a", tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    i = table.schema.get_field_index("metadata")
    table = table.set_column(i, table.schema.field(i), pa.array([cell] * table.num_rows))
    path = tmp_path / "edited.parquet"
    pq.write_table(table, path)
    _import_fails_cleanly(pool, path)


def test_parquet_import_error_names_the_row_in_the_file_not_in_its_batch(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """Rows are read in batches of 64: a bad row 70 was reported as 'row 6'."""
    status = ["completed"] * 100
    status[70] = "bogus"
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"prompt": ["p"] * 100, "response": ["r"] * 100, "status": status}), path
    )
    with pytest.raises(UnsupportedFormatError, match=r"row 70\b"):
        pool.import_table(path, name="t")


def test_cli_export_name_file_refuses_evaluation_instead_of_ignoring_it(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """`export NAME FILE --evaluation` exported a training archive, the flag silently
    ignored (`--rollout-id` with NAME FILE is refused)."""
    pool.save("a", tiny_rollout(2), rollout_id=1, evaluation=False)
    out = tmp_path / "a.parquet"
    result = CliRunner().invoke(
        cli, ["--root", str(pool.root), "export", "a", str(out), "--evaluation"]
    )
    assert result.exit_code != 0 and not out.exists(), result.output


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
@pytest.mark.parametrize("where", ["value", "key"])
def test_claim5_export_of_numpy_complex_scalar_is_not_importable(
    fresh_pool: ArchiveManager, tmp_path: Path, where: str
) -> None:
    """Claim 5: export_pt writes only files that import_pt reads back equal, or refuses at
    export naming the field.  A numpy complex scalar (which save stores and loads exactly)
    is exported as a Python ``complex`` (``np.generic.item()``); torch.load reads it, but
    import_pt then refuses the library's own export with "cannot store a value of type
    builtins.complex".  Fix: refuse complex numpy scalars at export naming the field (or
    export them as 0-d complex tensors, or teach the codec Python complex)."""
    meta: dict[Any, Any] = (
        {"z": np.complex64(1 + 2j)} if where == "value" else {np.complex128(1 + 2j): 1}
    )
    name = _name()
    fresh_pool.save(name, [Sample(metadata=meta)], rollout_id=1)
    assert fresh_pool.open_archive(name).load_samples()[0].metadata == meta
    path = tmp_path / "dump.pt"
    # decided: refused at export naming the field (the codec stores no Python complex)
    field = r"'metadata'\['z'\]" if where == "value" else r"'metadata'\[np.complex128"
    with pytest.raises(UnencodableError, match=rf"sample 0 .* field {field}.*complex"):
        fresh_pool.open_archive(name).export_pt(path)
    assert not list(tmp_path.glob("*dump*"))
    # a complex 0-d array (and any complex array) exports as a tensor and imports back
    name = _name()
    fresh_pool.save(name, [Sample(metadata={"z": np.array(1 + 2j, np.complex64)})], rollout_id=1)
    fresh_pool.open_archive(name).export_pt(path)
    imported = fresh_pool.import_pt(path, _name()).load_samples()[0].metadata["z"]
    assert torch.equal(imported, torch.tensor(1 + 2j, dtype=torch.complex64))


@pytest.fixture(scope="module")
def fidelity_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(
        tmp_path_factory.mktemp("fidelity") / "fidelity_pool", inline_limit=64
    )
    try:
        yield manager
    finally:
        manager.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_int_past_the_decimal_digit_limit_exports_and_imports(
    fidelity_pool: ArchiveManager, tmp_path: Path, suffix: str
) -> None:
    """Claim 1 (an archive that saved exports and imports back equal, or is refused with
    the library's error): the codec stores ints of any size (tagged), but the table export
    wrote them as JSON numbers, and Python refuses to write an int of more than 4,300
    decimal digits: `export` raised a bare ValueError ("Exceeds the limit (4300 digits)")
    for ``2**20000`` as a value, a dict key or a list item, in both formats.  Now such an
    int is a tagged hex string, and a malformed one is refused on import."""
    big = 2**20000
    sample = {"x": -(3**9000), "m": {big: 1}, "l": [big, 1], "t": (big,)}
    name = f"bigint{next(_names)}"
    fidelity_pool.save(name, [sample], rollout_id=1)
    out = tmp_path / f"{name}{suffix}"
    fidelity_pool.export(name, out)
    (back,) = fidelity_pool.import_table(out, name=f"{name}i").load_samples()
    assert back == sample
    for bad in ('{"$t": "int", "v": 5}', '{"$t": "int", "v": "0xzz"}'):
        with pytest.raises(UnsupportedFormatError, match="malformed 'int'"):
            arrow.from_json_value(json.loads(bad))


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_images_leave_and_come_back_in_tables(tmp_path: Path, suffix: str) -> None:
    """slime's multimodal samples hold PIL images (``multimodal_inputs["images"]``): a table
    export carries mode, size, palette, info and pixels, and its import gives them back."""
    from PIL import Image

    rgb = Image.new("RGB", (2, 2), (1, 2, 3))
    palette = Image.new("P", (2, 1))
    palette.putpalette([i % 256 for i in range(768)])
    sample = {"multimodal_inputs": {"images": [rgb, palette], "videos": None}, "reward": 1.0}
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("vlm", [sample], rollout_id=1)
        assert pool.open_archive("vlm").to_arrow().num_rows == 1
        out = pool.export("vlm", tmp_path / f"vlm.{suffix}")
        back = pool.import_table(out, name=f"back-{suffix}").load_samples()[0]
    assert back["multimodal_inputs"]["images"] == [rgb, palette]
