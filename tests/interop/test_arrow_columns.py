"""Arrow reads of some columns read only what those need (docs/architecture/getting-data-out.md,
"Getting data out", "Columns from the catalog"): `Archive.to_arrow(columns=)` and
`ArchiveManager.arrow_reader(columns=)` give exactly the columns a whole read gives, key
columns and the fields the catalog records exactly come from the catalog without reading a
chunk, other fields are the only ones decoded."""

from __future__ import annotations

import enum
import math
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import small_rollout

from archive_manager import ArchiveManager, Sample, register_sample_class
from archive_manager.errors import InvalidInputError
from archive_manager.metadata import CATALOG_FIELDS, describe_sample, inexact_fields
from archive_manager.samples import sample_to_record

DATA = Path(__file__).resolve().parents[1] / "data"
CATALOG_COLUMNS = ["sample_key", "task_key", "reward", "status", "response_length", "index"]


def _rollout() -> list[Sample]:
    """16 realistic samples (4 chunks of 4) with routed-expert tensors, a chat prompt and a
    field only some samples hold."""
    samples = small_rollout(16, seed=5, r3_layers=2, prompt_len=8, response_min=4, response_max=12)
    samples[3].prompt = [{"role": "user", "content": "2+2?"}]
    samples[9].extra = [1.5, 2.5]
    return samples


@pytest.fixture
def arc_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as opened:
        opened.save("r", _rollout(), rollout_id=3, attrs={"step": 3})
        yield opened


class _Reads:
    """The chunk blobs an archive reads (`Archive.reads_reported`)."""

    def __init__(self, arc: Any) -> None:
        self.arc = arc
        self.chunks = {row["digest"] for row in arc.chunks()}
        self.seen: list[str] = []

    def __call__(self, digest: str) -> None:
        if digest in self.chunks:
            self.seen.append(digest)


def _to_arrow(arc: Any, columns: list[str] | None) -> tuple[pa.Table, int]:
    """The table, and how many chunk blobs were read (twice where a later chunk widened the
    schema and the read started again)."""
    return _reading(arc, columns)[:2]  # type: ignore[return-value]


def _reading(arc: Any, columns: list[str] | None) -> tuple[pa.Table, int, set[str]]:
    reads = _Reads(arc)
    with arc.reads_reported(reads):
        table = arc.to_arrow(columns)
    return table, len(reads.seen), set(reads.seen)


def _same(part: pa.Table, whole: pa.Table) -> None:
    expected = whole.select(part.schema.names)
    assert part.schema.equals(expected.schema, check_metadata=True)
    assert part.equals(expected)


@pytest.mark.parametrize(
    "columns",
    [
        ["reward"],
        ["status", "reward", "sample_key"],
        ["task_key", "position", "archive", "rollout_id", "evaluation", "archive_attrs"],
        ["response_length", "index", "group_index"],
        ["tokens"],
        ["rollout_routed_experts"],
        ["rollout_routed_experts.shape"],
        ["prompt", "reward"],
        ["response", "loss_mask", "extra"],
        ["field.rollout_id", "metadata", "sample_class", "sample_converted"],
        ["sample_shared", "reward"],
    ],
    ids=lambda c: ",".join(c),
)
def test_columns_are_those_of_a_whole_read(arc_pool: ArchiveManager, columns: list[str]) -> None:
    arc = arc_pool.open_archive("r")
    whole, _ = _to_arrow(arc, None)
    part, _ = _to_arrow(arc, columns)
    _same(part, whole)
    asked = [c for c in columns if not c.endswith(".shape")]
    assert [n for n in part.schema.names if not n.endswith(".shape")] == asked  # as asked
    # "extra" is in one chunk only: the stream needs a scanned schema, as a whole read does
    streamed = arc_pool.arrow_reader(columns=columns, schema="scan").read_all()
    whole_stream = arc_pool.arrow_reader(schema="scan")
    _same(streamed, whole_stream.read_all())
    assert streamed.schema.names == part.schema.names
    # a whole schema given (a scan's, a SchemaDrift's) serves a read of some columns
    given = arc_pool.arrow_reader(columns=columns, schema=whole_stream.schema).read_all()
    assert given.equals(streamed)


def test_keys_and_catalog_fields_read_no_chunk(arc_pool: ArchiveManager) -> None:
    """Issue 35: ``arrow_reader(columns=["reward"])`` decoded every field of every sample."""
    arc = arc_pool.open_archive("r")
    whole, read = _to_arrow(arc, None)
    assert read >= 4  # (twice where a later chunk widens the schema: "extra")
    for columns in (CATALOG_COLUMNS, ["reward"], ["sample_key", "task_key"], ["group_index"]):
        part, read = _to_arrow(arc, columns)
        assert read == 0, columns
        _same(part, whole)
    # the same with no blob left at all: the catalog alone answers
    for path in (arc_pool.root / "blobs").rglob("*"):
        if path.is_file() and len(path.name) == 32:
            path.unlink()
    _same(arc.to_arrow(CATALOG_COLUMNS), whole)
    _same(arc_pool.arrow_reader(columns=CATALOG_COLUMNS).read_all(), whole)
    with pytest.raises(Exception, match="missing"):
        arc.to_arrow(["tokens"])


class Mood(enum.Enum):
    HAPPY = "happy"


class Level(enum.IntEnum):
    LOW = 1


def _catalog_tricks() -> list[dict[str, Any]]:
    """Samples whose reward, status, index... the catalog's description records as something
    else than the record holds (0/1 for a bool, None for a NaN or a dict, a number for a
    numpy scalar or a tensor, text for an enum the record keeps as a member); one chunk of
    4 of them is plain."""
    plain = {"reward": 0.5, "status": "completed", "response_length": 3, "index": 0}
    return [
        plain,
        {**plain, "reward": -0.0},  # JSON keeps the sign
        {**plain, "reward": 7, "index": 2**62},
        {**plain, "status": None, "reward": None},
        {**plain, "reward": True},
        {**plain, "reward": float("nan")},
        {**plain, "reward": np.float32(0.25)},
        {**plain, "reward": {"acc": 1.0}},
        {**plain, "reward": torch.tensor(1.5)},
        {**plain, "status": Mood.HAPPY},
        {**plain, "index": Level.LOW, "response_length": np.int64(4)},
        {k: v for k, v in plain.items() if k != "reward"},  # absent
    ]


def test_fields_the_catalog_records_otherwise_are_read_from_their_chunks(tmp_path: Path) -> None:
    register_sample_class(Mood)
    register_sample_class(Level)
    samples = _catalog_tricks()
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as pool:
        arc = pool.save("tricks", samples, rollout_id=0)
        whole, _ = _to_arrow(arc, None)
        plain = arc.chunks()[0]["digest"]
        for columns in (["reward"], ["status"], ["index", "response_length"], ["reward", "status"]):
            part, _, read = _reading(arc, columns)
            _same(part, whole)
            assert read and plain not in read, columns  # the catalog answers the plain chunk
        streamed = pool.arrow_reader(columns=["reward", "status"], schema="scan").read_all()
        _same(streamed, pool.arrow_reader(schema="scan").read_all())


NO_STATUS: Any = None  # a status a framework's sample may leave unset
NUMPY_INDEX: Any = np.int64(3)  # an index as numpy hands it over


@pytest.mark.parametrize(
    ("sample", "inexact"),
    [
        (Sample(reward=1.0, index=3, group_index=0, response_length=5), []),
        (Sample(reward=-0.0, status=NO_STATUS), []),
        (Sample(reward=2**70), []),  # a float holds it, and the description keeps the int
        (Sample(reward=True), ["reward"]),
        (Sample(reward=math.inf), ["reward"]),
        (Sample(reward=np.float64(0.5)), ["reward"]),
        (Sample(reward={"acc": 1.0}), ["reward"]),
        (Sample(index=NUMPY_INDEX), ["index"]),
        ({"reward": 1.0, "status": "x", "index": 1, "group_index": 2}, ["response_length"]),
        ({"status": Mood.HAPPY}, ["reward", "status", "response_length", "index", "group_index"]),
    ],
    ids=repr,
)
def test_inexact_fields_name_what_a_description_records_otherwise(
    sample: Any, inexact: list[str]
) -> None:
    register_sample_class(Mood)
    stored = {k: v for k, v in sample_to_record(sample)[1].items() if k in CATALOG_FIELDS}
    assert inexact_fields(describe_sample(sample), stored) == inexact


def test_an_older_save_without_the_note_reads_its_chunks(tmp_path: Path) -> None:
    # A pool of an older release: its descriptions say nothing of exactness.
    with tarfile.open(DATA / "pool-r5.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    with ArchiveManager.open(tmp_path / "pool-r5") as pool:
        for info in pool.find():
            arc = pool.open_archive(info.name)
            whole, read_all = _to_arrow(arc, None)
            part, read = _to_arrow(arc, ["reward", "status"])
            assert read == read_all > 0
            _same(part, whole)
            keys, read = _to_arrow(arc, ["sample_key"])
            assert read == 0
            _same(keys, whole)


def test_sample_metadata_hides_the_writers_note(arc_pool: ArchiveManager) -> None:
    arc = arc_pool.open_archive("r")
    assert arc.sample_metadata() == [describe_sample(s) for s in _rollout()]
    with arc_pool.catalog.read() as conn:
        from sqlalchemy import select

        from archive_manager.catalog import sample_metadata_table as m

        found = conn.execute(select(m.c.description).where(m.c.position == 3)).scalar_one()
    assert found["inexact"] == []


def test_unknown_columns_are_named_with_the_whole_reads_columns(arc_pool: ArchiveManager) -> None:
    arc = arc_pool.open_archive("r")
    for read in (
        lambda: arc.to_arrow(["reward", "rewrad"]),
        lambda: arc_pool.arrow_reader(columns=["reward", "rewrad"]),
    ):
        with pytest.raises(
            InvalidInputError, match=r"no column 'rewrad'; the columns are .*tokens"
        ):
            read()
    with pytest.raises(InvalidInputError, match="list of column names"):
        arc.to_arrow("reward")  # type: ignore[arg-type]


def test_reward_keys_and_long_task_keys_read_as_a_whole_read_does(tmp_path: Path) -> None:
    """A dict reward picked by ``reward_key`` (the catalog records the part, the record the
    dict) and a prompt too long for the catalog's key column (the catalog records its digest)
    give the same columns read alone as in a whole read."""
    prompt = "Solve: " + "x" * 400
    samples = [
        Sample(prompt=prompt, tokens=[1, 2, 3], response_length=1, reward={"acc": 1.0, "fmt": 0.5})
        for _ in range(3)
    ]
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        pool.save("r", samples, rollout_id=1, task_keys=[prompt] * 3, reward_key="acc")
        arc = pool.open_archive("r")
        whole, _ = _to_arrow(arc, None)
        for columns in (["task_key"], ["reward"], ["sample_key", "task_key", "reward"]):
            part, _ = _to_arrow(arc, columns)
            _same(part, whole)
