"""A folder export (`ArchiveManager.export_many`, ``archive-manager export --rollout-id A..B
DIR``) writes one schema for every Parquet file (docs/architecture/getting-data-out.md, "Getting
data out"), so `pyarrow.dataset`, DuckDB and Hugging Face ``datasets`` read the folder as one table,
whatever fields and types each archive's samples hold; each file still imports back as its
archive."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from helpers import assert_same_samples, small_rollout

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.interop import export


def _steps() -> list[list[Any]]:
    """Three steps whose archives disagree on their fields' types: int rewards in one, float
    in the others; a field all None in one step and text in another; a field only one step
    has; a tensor in one and a list in another; and ints past 2**53 among floats."""
    steps = []
    for step in range(3):
        samples = small_rollout(6, seed=step, rollout_id=step, prompt_len=4, response_min=2,
                                response_max=6)  # fmt: skip
        for i, s in enumerate(samples):
            s.reward = [i % 2, 0.5 * i, 0.25][step]  # int in step 0
            s.label = None if step == 0 else f"answer-{i}"
            if step == 1:
                s.judge = {"score": i}  # a field only step 1 has
            s.extra = torch.arange(i + 1, dtype=torch.int16) if step == 2 else [i, i + 1]
            s.big = 2**60 + i if step == 0 else float(i)
        steps.append(samples)
    return steps


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as opened:
        for step, samples in enumerate(_steps()):
            opened.save(f"step-{step}", samples, rollout_id=step)
        yield opened


def test_a_folder_export_has_one_schema_every_reader_takes(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """Issue 35: each file had its own schema, and pyarrow.dataset and datasets refused the
    folder."""
    folder = tmp_path / "out"
    paths = pool.export_many(folder, format="parquet")
    assert [p.name for p in paths] == ["step-0.parquet", "step-1.parquet", "step-2.parquet"]
    schemas = [pq.read_schema(p) for p in paths]
    assert all(s.equals(schemas[0], check_metadata=True) for s in schemas)
    schema = schemas[0]
    assert schema.field("reward").type == pa.float64()
    assert schema.field("label").type == pa.string()
    assert schema.field("judge").type == pa.string()  # JSON text, null where absent

    table = ds.dataset(folder, format="parquet").to_table()
    assert table.num_rows == 18
    rewards = {(a, p): r for a, p, r in zip(*(table.column(c).to_pylist() for c in
               ("archive", "position", "reward")), strict=True)}  # fmt: skip
    assert rewards[("step-0", 1)] == 1.0 and rewards[("step-1", 3)] == 1.5

    relation = duckdb.sql(
        f"SELECT archive, count(*), avg(reward) FROM read_parquet('{folder}/*.parquet') "
        "GROUP BY archive ORDER BY archive"
    )
    assert relation is not None  # a SELECT's relation
    duck = relation.fetchall()

    assert [(a, n) for a, n, _ in duck] == [("step-0", 6), ("step-1", 6), ("step-2", 6)]
    assert math.isclose(duck[1][2], 1.25) and math.isclose(duck[2][2], 0.25)

    loaded = datasets.load_dataset(
        "parquet", data_files=sorted(map(str, paths)), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert loaded.num_rows == 18 and loaded[0]["archive"] == "step-0"
    assert loaded[17]["label"] == "answer-5" and loaded[0]["label"] is None

    # and each file still imports back as its archive
    for step, (path, saved) in enumerate(zip(paths, _steps(), strict=True)):
        back = pool.import_table(path, name=f"back-{step}").load_samples()
        if step == 0:
            # ints among the folder's floats come back as the floats they were written as
            assert [s.reward for s in back] == [float(s.reward) for s in saved]
            for s in back + saved:
                del s.reward
        for b, s in zip(back, saved, strict=True):
            # the folder's column order is one for all files: an extra attribute only some
            # archives have ("judge") comes after those of the first
            assert set(vars(b)) == set(vars(s))
            b.__dict__ = {k: vars(b)[k] for k in vars(s)}
        assert_same_samples(back, saved)


def test_a_folder_export_rewrites_large_batches_as_row_groups_of_bounded_size(
    pool: ArchiveManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files written again in the folder's schema are cut into row groups as a file
    export is (`export._write_groups`); the folder reads as the same table."""
    whole = pool.export_many(tmp_path / "whole", format="parquet")
    monkeypatch.setattr(export, "_GROUP_BYTES", 1, raising=False)
    paths = pool.export_many(tmp_path / "rows", format="parquet")
    for path, before in zip(paths, whole, strict=True):
        meta = pq.ParquetFile(path).metadata
        assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [1] * 6
        assert pq.read_table(path).equals(pq.read_table(before), check_metadata=True)
    table = ds.dataset(tmp_path / "rows", format="parquet").to_table()
    assert table.equals(ds.dataset(tmp_path / "whole", format="parquet").to_table())


def test_the_cli_folder_export_reads_as_one_table(pool: ArchiveManager, tmp_path: Path) -> None:
    folder = tmp_path / "cli-out"
    done = CliRunner().invoke(
        cli, ["--root", str(pool.root), "export", "--rollout-id", "0..2", str(folder)]
    )
    assert done.exit_code == 0, done.output
    table = ds.dataset(folder, format="parquet").to_table(columns=["archive", "reward", "big"])
    assert table.num_rows == 18
    assert pa.types.is_string(table.schema.field("big").type)  # 2**60 + i is no float64
    assert table.column("big").to_pylist()[:2] == [str(2**60), str(2**60 + 1)]


def test_a_later_export_into_the_folder_keeps_one_schema(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """Exporting rollouts 0..1 and later 2..2 into one folder wrote files of two schemas
    (step 2's tensor column and new types): pyarrow.dataset dropped columns in silence and
    datasets refused the folder. The earlier files are merged with, and written again."""
    folder = tmp_path / "out"
    first = pool.export_many(folder, format="parquet", rollout_ids=(0, 1))
    (folder / "notes.parquet").write_bytes(b"not parquet")  # not an export: left alone
    later = pool.export_many(folder, format="parquet", rollout_ids=(2, None))
    assert [p.name for p in later] == ["step-2.parquet"]
    paths = [*first, *later]
    schemas = [pq.read_schema(p) for p in paths]
    assert all(s.equals(schemas[0], check_metadata=True) for s in schemas)
    whole = tmp_path / "whole"
    assert pq.read_schema(pool.export_many(whole, format="parquet")[0]).names == schemas[0].names
    table = ds.dataset(paths, format="parquet").to_table()
    assert table.num_rows == 18 and "extra" in table.column_names
    loaded = datasets.load_dataset(
        "parquet", data_files=sorted(map(str, paths)), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert loaded.num_rows == 18
    assert (folder / "notes.parquet").read_bytes() == b"not parquet"
