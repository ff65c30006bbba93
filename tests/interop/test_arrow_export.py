"""Getting data out (docs/architecture/getting-data-out.md, "Getting data out"): `Archive.to_arrow`,
the pool-wide Arrow stream, Parquet/JSONL exports read back by pyarrow, pandas, DuckDB and
Hugging Face datasets, round trips through export and import, imports of other frameworks'
files, and bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _sharing import run_python
from click.testing import CliRunner
from helpers import assert_same_samples, small_rollout, snapshot_pool

from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    InvalidInputError,
    UnencodableError,
    UnsupportedFormatError,
)
from archive_manager.interop import export
from archive_manager.pool.arrow import SchemaDrift, reading

REPO = Path(__file__).resolve().parents[2]


def _odd_rollout() -> list[Sample]:
    """12 realistic samples (3 chunks of 4) with what hand-written exports trip on: a chat
    prompt among text ones, slime's empty ``apply_chat_template_kwargs``, a tuple, a
    non-text key, a NaN, a reward dict, a routed-expert tensor."""
    samples = small_rollout(12, seed=3, r3_layers=2, prompt_len=8, response_min=4, response_max=12)
    samples[5].prompt = [{"role": "user", "content": "2+2?"}]
    samples[6].metadata = {"pair": (1, "a"), 7: float("nan"), "inf": -math.inf}
    samples[7].reward = {"acc": 1.0, "fmt": 0.5}
    samples[8].loss_mask = None
    return samples


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as opened:
        opened.save(
            "odd",
            _odd_rollout(),
            rollout_id=7,
            evaluation=True,
            attrs={"step": 7, "note": "x"},
            task_keys=[f"task-{i % 3}" for i in range(12)],
        )
        yield opened


def test_to_arrow_types_each_column_and_keeps_every_value(pool: ArchiveManager) -> None:
    arc = pool.open_archive("odd")
    table = arc.to_arrow()
    names = table.schema.names
    assert names[:6] == [
        "archive",
        "position",
        "sample_key",
        "task_key",
        "rollout_id",
        "evaluation",
    ]
    assert names[-4:] == ["archive_attrs", "sample_class", "sample_converted", "sample_shared"]
    types = {f.name: f.type for f in table.schema}
    assert types["tokens"] == pa.list_(pa.int32())  # ids < 152,000: the narrowest exact type
    assert types["loss_mask"] == pa.list_(pa.int8())
    assert types["rollout_log_probs"] == pa.list_(pa.float32())  # float32 values, exactly
    assert types["rollout_routed_experts"] == pa.list_(pa.int32())
    assert types["status"] == pa.string() and types["response_length"] == pa.int64()
    # slime's sample rollout_id and task_key attribute are fields; the key columns win the name
    assert "field.rollout_id" in names and "field.task_key" in names
    rows = table.to_pylist()
    samples = arc.load_samples()
    assert [r["task_key"] for r in rows] == [tk for _, tk in arc.keys()]
    assert {r["rollout_id"] for r in rows} == {7} and all(r["evaluation"] for r in rows)
    for row, s in zip(rows, samples, strict=True):
        assert row["tokens"] == s.tokens and row["rollout_log_probs"] == s.rollout_log_probs
        assert row["status"] == s.status.value
        shape = row["rollout_routed_experts.shape"]
        assert shape == list(s.rollout_routed_experts.shape)
        assert row["rollout_routed_experts"] == s.rollout_routed_experts.reshape(-1).tolist()
    assert rows[8]["loss_mask"] is None
    # mixed and nested fields are JSON text, tagged where JSON would lose a value
    assert json.loads(rows[5]["prompt"]) == [{"role": "user", "content": "2+2?"}]
    assert json.loads(rows[4]["prompt"]) == samples[4].prompt
    assert json.loads(rows[0]["apply_chat_template_kwargs"]) == {}
    assert json.loads(rows[7]["reward"]) == {"acc": 1.0, "fmt": 0.5}
    assert json.loads(rows[0]["archive_attrs"]) == {"step": 7, "note": "x"}
    frame = arc.to_pandas(["position", "tokens", "reward"])
    assert list(frame.columns) == ["position", "tokens", "reward"] and len(frame) == 12
    assert frame["tokens"][3].tolist() == samples[3].tokens
    with pytest.raises(InvalidInputError, match="no column 'nope'"):
        arc.to_arrow(["tokens", "nope"])


def test_parquet_and_jsonl_round_trips_keep_keys_facts_and_samples(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    arc = pool.open_archive("odd")
    for suffix in (".parquet", ".jsonl"):
        path = pool.export("odd", tmp_path / f"odd{suffix}")
        back = pool.import_table(path, name=f"back{suffix}")
        assert (back.rollout_id, back.evaluation, back.attrs) == (7, True, {"step": 7, "note": "x"})
        assert back.keys() == arc.keys()
        assert_same_samples(back.load_samples(), arc.load_samples())
        assert back.sample_metadata() == arc.sample_metadata()
    # dict samples whose fields vary: an absent field stays absent, a None stays None
    dicts = [
        {"index": 0, "a": 1},
        {"index": 1, "b": None},
        {"index": 2, "a": None, "c": {"x": (1,)}},
    ]
    pool.save("dicts", dicts, rollout_id=None)
    for suffix in (".parquet", ".jsonl"):
        back = pool.import_table(
            pool.export("dicts", tmp_path / f"dicts{suffix}"), name=f"d{suffix}"
        )
        assert back.load_samples() == dicts and back.rollout_id is None and back.attrs is None
    # given facts win over the export's
    again = pool.import_table(tmp_path / "odd.jsonl", name="again", rollout_id=9, evaluation=False)
    assert (again.rollout_id, again.evaluation) == (9, False)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_parquet_dictionary_encodes_integer_tensors_only_where_values_repeat(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """Routed expert ids (few distinct values) are dictionary-encoded: a smaller file,
    written faster (docs/performance.md); token ids and log-probs are not.  Tensor items
    carry no min/max statistics; every other column does."""
    path = pool.export("odd", tmp_path / "odd.parquet")
    meta = pq.ParquetFile(path).metadata
    encodings: dict[str, Any] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            encodings.setdefault(column.path_in_schema, set()).update(column.encodings)
    assert "RLE_DICTIONARY" in encodings["rollout_routed_experts.list.element"]
    assert "RLE_DICTIONARY" not in encodings["tokens.list.element"]
    assert "RLE_DICTIONARY" not in encodings["rollout_log_probs.list.element"]
    # min/max statistics everywhere but on a tensor's items (a tenth of an R3 write)
    stats = {
        column.path_in_schema: column.is_stats_set
        for g in range(meta.num_row_groups)
        for column in (meta.row_group(g).column(c) for c in range(meta.row_group(g).num_columns))
    }
    assert not stats["rollout_routed_experts.list.element"]
    assert stats["rollout_routed_experts.shape.list.element"] and stats["tokens.list.element"]
    assert stats["position"] and stats["task_key"] and stats["reward"]
    back = pool.import_table(path, name="back")
    assert_same_samples(back.load_samples(), pool.open_archive("odd").load_samples())


def test_parquet_writes_a_large_batch_as_row_groups_of_bounded_size(
    pool: ArchiveManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch past `_GROUP_BYTES` is written as several row groups (pyarrow's buffers for
    one group of R3 rollouts cost more than the write: docs/performance.md); readers see the
    same table."""
    whole = pool.export("odd", tmp_path / "whole.parquet")
    assert pq.ParquetFile(whole).metadata.num_row_groups == 3  # one per chunk of 4
    monkeypatch.setattr(export, "_GROUP_BYTES", 1, raising=False)
    path = pool.export("odd", tmp_path / "rows.parquet")
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [1] * 12
    assert pq.read_table(path).equals(pq.read_table(whole), check_metadata=True)
    assert pq.read_schema(path).equals(pq.read_schema(whole), check_metadata=True)
    back = pool.import_table(path, name="back")
    assert_same_samples(back.load_samples(), pool.open_archive("odd").load_samples())


# The child: chunk 1 read ahead (mapped, verified, inflated) while the caller holds the first
# batch, then its file truncated in place, as root's `cp` of a backup over a live pool does.
_TRUNCATED_AHEAD = """
import os, sys, threading
import archive_manager.blobs.local as local_blobs
local_blobs._MAP_MIN = 1  # every chunk mapped, however small
from archive_manager import ArchiveManager
from archive_manager.errors import IntegrityError
from archive_manager.pool.arrow import reading
read = threading.Event()
inflate_part = reading.inflate_part
def inflated(reader, part, texts=True):
    inflate_part(reader, part, texts)
    if part[0] == 1:
        read.set()
reading.inflate_part = inflated
pool = ArchiveManager.open(sys.argv[1], chunk_size=4)
arc = pool.save("r", [{"tokens": list(range(i, i + 300))} for i in range(12)], rollout_id=1)
path = pool.store.inner.path(arc.chunks()[1]["digest"])
batches = pool.arrow_reader()
batches.read_next_batch()
assert read.wait(60)
os.chmod(path, 0o644)
os.truncate(path, 0)
try:
    print(batches.read_all().num_rows, "more rows")
except IntegrityError as exc:
    print(exc)
"""


def test_a_chunk_truncated_after_it_was_read_ahead_fails_the_reader(tmp_path: Path) -> None:
    """A chunk file truncated in place after the Arrow reader read it ahead (a map of it,
    since 7a7b3d5), while the caller's code ran: IntegrityError naming it where reading on
    the map killed the process (SIGBUS; docs/architecture/reading.md, "Reading")."""
    done = run_python(_TRUNCATED_AHEAD, str(tmp_path / "pool"))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "archive 'r', chunk 1: blob " in done.stdout, done.stdout
    assert "was truncated while it was read" in done.stdout, done.stdout


def test_a_large_chunk_is_read_and_handed_on_in_pieces(
    pool: ArchiveManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose records inflate past `PIECE_BYTES` is inflated, decoded and written a
    piece at a time (the reading thread inflates the next piece while this one is used:
    docs/architecture/getting-data-out.md); the table and the file hold what they held."""
    whole = pool.export("odd", tmp_path / "whole.parquet")
    chunks = list(pool.arrow_reader(names=["odd"], schema="scan"))
    monkeypatch.setattr(reading, "PIECE_BYTES", 1)
    source = pool.open_archive("odd").arrow_source()
    assert [len(rows) for rows in reading.iter_chunk_rows(source, pieces=True)] == [1] * 12
    # one piece a sample, whose types differ from its chunk's (a chat prompt among text
    # ones): the export starts again a chunk at a time, and writes the same table
    path = pool.export("odd", tmp_path / "pieces.parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    assert pq.read_table(path).equals(pq.read_table(whole), check_metadata=True)
    # pieces typed alike are written as they come
    pool.save("even", small_rollout(8, seed=4, r3_layers=2), rollout_id=8)
    whole = pool.export("even", tmp_path / "even-whole.parquet")
    path = pool.export("even", tmp_path / "even-pieces.parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    assert pq.read_table(path).equals(pq.read_table(whole), check_metadata=True)
    # what users read is still a batch a chunk
    assert [b.num_rows for b in pool.arrow_reader(names=["odd"], schema="scan")] == [
        b.num_rows for b in chunks
    ]


def test_ints_past_2_53_before_floats_end_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rewards past 2**53 in a first chunk and floats in the next: merged, the column is
    float64, which the ints do not fit; it must end as JSON, not start the export again
    for ever."""
    samples = small_rollout(4, seed=1)
    for i, sample in enumerate(samples):
        sample.reward = 2**60 + i if i < 2 else 0.5
    made = 0
    batches = export.archive_batches

    def counted(*args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        nonlocal made
        made += 1
        assert made < 10, "the export starts again for ever"
        return batches(*args, **kwargs)

    monkeypatch.setattr(export, "archive_batches", counted)
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        pool.save("big", samples, rollout_id=1)
        table = pq.read_table(pool.export("big", tmp_path / "big.parquet"))
        assert pool.open_archive("big").to_arrow()["reward"].equals(table["reward"])
    assert [json.loads(v) for v in table["reward"].to_pylist()] == [2**60, 2**60 + 1, 0.5, 0.5]


@pytest.mark.parametrize("rewards", [[True, True, 3, 3], [3, 3, True, True]])
def test_a_chunk_of_bools_and_one_of_ints_keep_both(tmp_path: Path, rewards: list[Any]) -> None:
    """Bools in one chunk and ints in the next (Arrow casts 3 to True, True to 1): the
    column is JSON, and the round trip gives back each value with its type."""
    samples = small_rollout(4, seed=2)
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        pool.save("r", samples, rollout_id=1)
        path = pool.export("r", tmp_path / "r.parquet")
        back = pool.import_table(path, name="back")
        got = [s.reward for s in back.load_samples()]
        table = pool.open_archive("r").to_arrow()
    assert [(v, type(v)) for v in got] == [(v, type(v)) for v in rewards]
    assert [json.loads(v) for v in table["reward"].to_pylist()] == rewards


def _whole_and_in_pieces(
    pool: ArchiveManager, rewards: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[pa.Table, Path]:
    """Archive ``r`` of 4 samples with these rewards, exported whole (its chunks' types) and
    then a sample a piece: the first file's table and the second file."""
    samples = small_rollout(4, seed=2)
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    pool.save("r", samples, rollout_id=1)
    whole = pq.read_table(pool.export("r", tmp_path / "whole.parquet"))
    monkeypatch.setattr(reading, "PIECE_BYTES", 1)
    return whole, pool.export("r", tmp_path / "pieces.parquet")


@pytest.mark.parametrize(
    "rewards",
    [[True, True, 3, 3], [1, 2, 0.5, 1.5], [0.5, 1.5, 1, 2]],
    ids=["bools-then-ints", "ints-then-floats", "floats-then-ints"],
)
def test_pieces_typed_otherwise_write_what_the_whole_chunk_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewards: list[Any]
) -> None:
    """Pieces of one chunk whose types differ (a chunk's ints and floats are JSON, its bools
    and ints too; merged, they would be float64, or bools that turn 3 into True): the
    export writes the whole chunk's table, exactly."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as pool:
        whole, path = _whole_and_in_pieces(pool, rewards, tmp_path, monkeypatch)
        back = pool.import_table(path, name="back")
        assert [s.reward for s in back.load_samples()] == rewards
    assert pq.read_table(path).equals(whole, check_metadata=True)


@pytest.mark.parametrize(
    ("rewards", "groups"),
    [([1, 2, 0.5, 1.5], 4), ([0.5, 1.5, True, False], 4), ([0.5, 1.5, 1, 2.5], 2)],
    ids=["ints-then-floats", "floats-then-bools", "then-a-chunk-of-ints-and-floats"],
)
def test_chunks_typed_otherwise_keep_their_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewards: list[Any], groups: int
) -> None:
    """Pieces are compared within their chunk only: a chunk of int rewards and one of float
    rewards, each cut in pieces typed alike, export in pieces (a row group each), not a
    chunk at a time after a start again, and write what the chunks whole write; a chunk
    whose own pieces differ still starts the export again a chunk at a time."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        whole, path = _whole_and_in_pieces(pool, rewards, tmp_path, monkeypatch)
    assert pq.ParquetFile(path).metadata.num_row_groups == groups
    assert pq.read_table(path).equals(whole, check_metadata=True)


def test_exports_read_back_with_pyarrow_pandas_duckdb_and_datasets(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    arc = pool.open_archive("odd")
    samples = arc.load_samples()
    path = pool.export("odd", tmp_path / "rollout.parquet")
    assert pq.read_table(path).num_rows == 12
    frame = pd.read_parquet(path)
    assert frame["tokens"][2].tolist() == samples[2].tokens
    relation = duckdb.sql(
        f"select position, len(tokens), status from '{path}' where task_key = 'task-1' order by position"
    )
    assert relation is not None  # a SELECT's relation
    rows = relation.fetchall()

    assert rows == [(p, len(samples[p].tokens), samples[p].status.value) for p in (1, 4, 7, 10)]
    data = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf"))
    assert data.num_rows == 12 and data[3]["tokens"] == samples[3].tokens
    lines = (pool.export("odd", tmp_path / "rollout.jsonl")).read_text().splitlines()
    assert [json.loads(line)["tokens"] for line in lines] == [s.tokens for s in samples]
    # the pool-wide stream, straight into DuckDB
    pool.save("more", small_rollout(6, seed=4, rollout_id=8), rollout_id=8)
    pool.save("eval", small_rollout(3, seed=5), rollout_id=8, evaluation=True)
    reader = pool.arrow_reader(
        min_rollout_id=8, max_rollout_id=8, evaluation=False, columns=["archive", "tokens"]
    )
    assert isinstance(reader, pa.RecordBatchReader)
    counted: Any = duckdb.sql(
        "select archive, count(*), sum(len(tokens)) from reader group by archive"
    )
    more = pool.open_archive("more").load_samples()
    assert counted.fetchall() == [("more", 6, sum(len(s.tokens) for s in more))]
    # a selection whose first chunk types a field (prompt: text) that a later one holds as
    # chat messages: the stream says so, and a scan first finds the schema that fits all
    with pytest.raises(SchemaDrift, match="'prompt'"):
        pool.arrow_reader(status=["completed", "truncated"]).read_all()
    everything = pool.arrow_reader(status=["completed", "truncated"], schema="scan").read_all()
    assert json.loads(everything["prompt"][5].as_py())[0]["content"] == "2+2?"
    assert everything.num_rows == 21 and set(everything["archive"].to_pylist()) == {
        "odd",
        "more",
        "eval",
    }
    assert pool.arrow_reader(task_key="nope").read_all().num_rows == 0


def test_import_of_verl_jsonl_with_a_field_mapping(pool: ArchiveManager, tmp_path: Path) -> None:
    dump = tmp_path / "12.jsonl"  # verl's trainer.rollout_data_dir: one line per sample
    lines = [
        {
            "input": f"q{i}",
            "output": f"a{i}",
            "score": float(i % 2),
            "step": 12,
            "uid": f"u{i // 2}",
        }
        for i in range(6)
    ]
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli,
        ["--root", str(pool.root), "import", str(dump), "--name", "verl-12", "--rollout-id", "12",
         "--map", "prompt=input,response=output,reward=score", "--map", "task_key=uid"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    arc = pool.open_archive("verl-12")
    assert arc.rollout_id == 12 and [tk for _, tk in arc.keys()] == [f"u{i // 2}" for i in range(6)]
    got = arc.load_samples()
    assert [(s.prompt, s.response, s.reward, s.step) for s in got] == [
        (f"q{i}", f"a{i}", float(i % 2), 12) for i in range(6)
    ]
    frame = pd.DataFrame({"question": ["a", "b"], "score": [1.0, 0.0]})
    frame.to_parquet(tmp_path / "frame.parquet")
    arc = pool.import_table(
        tmp_path / "frame.parquet", name="frame", mapping={"prompt": "question"}
    )
    assert [s.prompt for s in arc.load_samples()] == ["a", "b"]


def test_imports_of_foreign_rows_invent_no_status_or_length(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """Issue 38: verl's dump and TRL's completions, finished and scored, imported as 100%
    pending with length 0 (the Sample class's defaults recorded as facts); TRL's step column
    could not be the rollout id."""
    trl = tmp_path / "completions_00003.parquet"  # TRL's log_completions: one file per step
    pd.DataFrame(
        {
            "step": [3, 3, 3],
            "prompt": ["p0", "p0", "p1"],
            "completion": ["c0", "c1", "c2"],
            "reward": [1.0, 0.0, 0.5],
            "advantage": [0.7, -0.7, 0.0],
        }
    ).to_parquet(trl)
    result = CliRunner().invoke(
        cli,
        ["--root", str(pool.root), "import", str(trl), "--name", "trl-3",
         "--rollout-id-column", "step", "--map", "response=completion,task_key=prompt"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    arc = pool.open_archive("trl-3")
    assert arc.rollout_id == 3
    rows = [r for r in pool.query(rollout_ids=3) if r.archive == "trl-3"]
    assert [(r.status, r.response_length, r.reward) for r in rows] == [
        (None, None, 1.0),
        (None, None, 0.0),
        (None, None, 0.5),
    ]
    (stats,) = pool.stats(3)
    assert stats.archives == 1 and stats.samples == 3 and stats.length_mean is None
    assert "pending" not in dict(stats.status)
    # A row that holds a status and a length keeps them.
    dump = tmp_path / "7.jsonl"
    dump.write_text(json.dumps({"input": "q", "status": "truncated", "response_length": 9}) + "\n")
    pool.import_table(dump, name="verl-7", mapping={"prompt": "input"}, rollout_id=7)
    (row,) = [r for r in pool.query(rollout_ids=7) if r.archive == "verl-7"]
    assert (row.status, row.response_length) == ("truncated", 9)
    # Steps that differ within one file are refused whole.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"input": "q", "step": s}) + "\n" for s in (1, 2)))
    with pytest.raises(InvalidInputError, match="rollout ids 1 and 2"):
        pool.import_table(mixed, name="mixed", rollout_id_column="step")
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive("mixed")


def test_bad_input_is_refused_whole(pool: ArchiveManager, tmp_path: Path) -> None:
    before = snapshot_pool(pool)
    good = tmp_path / "good.jsonl"
    good.write_text('{"input": "q", "score": 1.0}\n')
    cases = [
        (UnsupportedFormatError, "suffix", lambda: pool.export("odd", tmp_path / "x.csv")),
        (UnsupportedFormatError, "unknown format", lambda: pool.export("odd", tmp_path / "x", format="xlsx")),
        (InvalidInputError, "'answer'", lambda: pool.import_table(good, name="n", mapping={"response": "answer"})),
        (InvalidInputError, "give the archive a name", lambda: pool.import_table(good)),
        (InvalidInputError, "did you mean 'prompt'", lambda: pool.import_table(good, name="n", mapping={"promt": "input"})),
    ]  # fmt: skip
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet\n")
    cases.append(
        (UnsupportedFormatError, "not a Parquet file", lambda: pool.import_table(fake, name="n"))
    )
    binary = tmp_path / "fake.jsonl"
    binary.write_bytes(b"PAR1\x00\xff")
    cases.append(
        (UnsupportedFormatError, "line 1 is not JSON", lambda: pool.import_table(binary, name="n"))
    )
    stamps = tmp_path / "stamps.parquet"
    pq.write_table(
        pa.table(
            {
                "prompt": ["a"],
                "when": pa.array([np.datetime64("2024-01-01", "s")], pa.timestamp("s")),
            }
        ),
        stamps,
    )
    cases.append((UnencodableError, "'when'", lambda: pool.import_table(stamps, name="n")))
    for error, words, call in cases:
        with pytest.raises(error, match=words):
            call()
    assert snapshot_pool(pool) == before
    # an export that fails midway leaves no file and no temp file
    pool.save(
        "bad-text",
        [{"index": 0, "response": "ok"}, {"index": 1, "response": "\ud800"}],
        rollout_id=1,
    )
    with pytest.raises(UnencodableError, match=r"'response'.*lone surrogate"):
        pool.export("bad-text", tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    path = pool.export("bad-text", tmp_path / "bad.jsonl")  # JSONL escapes it, exactly
    back = pool.import_table(path, name="bad-back")
    assert back.load_samples()[1]["response"] == "\ud800"
    with pytest.raises(ArchiveExistsError, match="--force"):
        pool.export("bad-text", path)


def test_cli_export_by_suffix_and_per_archive(pool: ArchiveManager, tmp_path: Path) -> None:
    pool.save("train-1", small_rollout(5, seed=1), rollout_id=1)
    pool.save("eval-1", small_rollout(3, seed=2), rollout_id=1, evaluation=True)
    runner = CliRunner()

    def run(*args: str) -> object:
        return runner.invoke(cli, ["--root", str(pool.root), *args])

    done = run("export", "train-1", str(tmp_path / "one.jsonl"))
    assert done.exit_code == 0 and "exported 5 samples" in done.output  # type: ignore[attr-defined]
    assert len((tmp_path / "one.jsonl").read_text().splitlines()) == 5
    done = run(
        "export",
        "--rollout-id",
        "0..7",
        "--no-evaluation",
        str(tmp_path / "out"),
        "--format",
        "parquet",
    )
    assert done.exit_code == 0, done.output  # type: ignore[attr-defined]
    assert "exported 1 archive to" in done.output  # type: ignore[attr-defined]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train-1.parquet"]
    done = run("export", "--rollout-id", "1..7", str(tmp_path / "out"))
    assert done.exit_code == 1 and "--force" in done.stderr  # type: ignore[attr-defined]
    assert not (tmp_path / "out" / "eval-1.parquet").exists()  # refused before writing any
    assert run("export", "--rollout-id", "1..7", str(tmp_path / "out"), "--force").exit_code == 0  # type: ignore[attr-defined]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "eval-1.parquet",
        "odd.parquet",
        "train-1.parquet",
    ]
    bad = run("export", "train-1", str(tmp_path / "x.csv"))
    assert bad.exit_code == 1 and bad.stderr.count("\n") == 1 and "suffix" in bad.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in bad.output  # type: ignore[attr-defined]
    mapping = run("import", str(tmp_path / "one.jsonl"), "--map", "prompt")
    assert mapping.exit_code == 2 and "FIELD=COLUMN" in mapping.output  # type: ignore[attr-defined]
    # A count of one takes the singular (it said "exported 1 samples").
    pool.save("single", small_rollout(1, seed=3), rollout_id=9)
    done = run("export", "single", str(tmp_path / "single.pt"))
    assert "exported 1 sample of 'single' to" in done.output  # type: ignore[attr-defined]
    done = run("import", str(tmp_path / "one.jsonl"), "--name", "again")
    assert "imported 5 samples from" in done.output  # type: ignore[attr-defined]


def test_no_pyarrow_at_import_and_no_torch_for_a_tensor_free_export(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("plain", small_rollout(4, seed=1), rollout_id=1)
    code = (
        "import sys\n"
        "import archive_manager, archive_manager.cli\n"
        "heavy = [m for m in ('pyarrow', 'pandas', 'duckdb', 'datasets', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from archive_manager.cli import main\n"
        "try:\n"
        f"    main(['--root', {str(root)!r}, 'export', 'plain', {str(tmp_path / 'p.parquet')!r}])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "print('torch' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 4


def test_bench_export_smoke(tmp_path: Path) -> None:
    """tools/bench_export.py at a tiny size, so it cannot rot (figures: README)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench_export.py"), "--samples", "8", "--repeat", "1",
         "--dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "speed-up" in done.stdout and "Cannot write struct type" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["results"]["archive_manager"]["rows"] == 8 and figures["speedup"] > 0
    assert not list(tmp_path.glob("bench-export-*")), "the work folder was left behind"
