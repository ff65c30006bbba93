"""Bad input everywhere: mutated real blobs into the decoders, forged manifests into the
catalog rebuild, malformed pointer files, hostile names and owners (API and CLI), samples the
codec must refuse, enormous values, keys of the wrong type, malformed catalog URLs.

The rule tested throughout: only the library's errors come out (`archive_manager.errors`;
in the CLI, one ``error:`` line and exit 1), and a refused call leaves the pool as it was.
What is valid but unusual (confusable unicode, huge ints, 64 MiB strings) round-trips.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result
from helpers import PoolSnapshot, canon, open_on, snapshot_pool, tiny_rollout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete

from archive_manager import ArchiveManager, RolloutArchive, Sample
from archive_manager.catalog import archives_table, blobs_table
from archive_manager.cli import cli
from archive_manager.codec import (
    ChunkReader,
    decode_manifest,
    decode_tensor_blob,
    encode_manifest,
    materialize_tensor_refs,
)
from archive_manager.compat import MAX_POINTER_BYTES
from archive_manager.errors import (
    ArchiveError,
    CatalogError,
    ForeignCatalogError,
    IntegrityError,
    InvalidInputError,
    InvalidNameError,
    UnencodableError,
    UnsupportedFormatError,
)

pytestmark = pytest.mark.timeout(120)

DECODER_ERRORS: tuple[type[Exception], ...] = (IntegrityError, UnsupportedFormatError)
FUZZ: dict[str, Any] = dict(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------- real blobs


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A SQLite pool holding one archive of several chunks, tensor blobs and a manifest."""
    root = tmp_path_factory.mktemp("real") / "pool"
    with ArchiveManager.open(root, chunk_size=4, inline_limit=256) as pool:
        arc = pool.save("src", tiny_rollout(10, seed=3), rollout_id=3, attrs={"lr": 0.5})
        chunks = [pool.store.get(c["digest"]) for c in arc.chunks()]
        manifest = pool.store.get(arc.manifest_digest)  # type: ignore[arg-type]
        tensors = {
            d: pool.store.get(d)
            for d in decode_manifest(manifest)["tensors"]  # one per sample
        }
        assert len(chunks) == 3 and tensors
        yield {"chunks": chunks, "manifest": manifest, "tensors": tensors}


def _loader(tensors: dict[str, bytes]) -> Callable[[str], torch.Tensor]:
    def load(digest: str) -> torch.Tensor:
        if digest not in tensors:
            raise IntegrityError(f"tensor blob {digest} is missing")
        return decode_tensor_blob(tensors[digest], digest)

    return load


#: One edit of a blob: flip a bit, overwrite, delete, insert, cut, or copy a range of
#: another real blob over it.  Positions are taken modulo the blob's length.
EDIT = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 2**20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 2**20), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("cut"), st.integers(0, 2**20)),
    st.tuples(st.just("splice"), st.integers(0, 2**20), st.integers(0, 2**20), st.integers(1, 512)),
)
EDITS = st.lists(EDIT, min_size=1, max_size=4)


def mutate(data: bytes, edits: list[tuple[Any, ...]], donor: bytes) -> bytes:
    """Apply ``edits`` to ``data``; ``splice`` copies from ``donor``."""
    out = bytearray(data)
    for kind, pos, *rest in edits:
        pos = pos % (len(out) + 1)
        if kind == "flip" and pos < len(out):
            out[pos] ^= 1 << rest[0]
        elif kind == "set":
            out[pos : pos + len(rest[0])] = rest[0]
        elif kind == "delete":
            del out[pos : pos + rest[0]]
        elif kind == "insert":
            out[pos:pos] = rest[0]
        elif kind == "cut":
            del out[pos:]
        elif kind == "splice":
            start = rest[0] % len(donor)
            piece = donor[start : start + rest[1]]
            out[pos : pos + len(piece)] = piece
    return bytes(out)


@settings(max_examples=400, **FUZZ)
@given(edits=EDITS, donor=st.integers(0, 3))
def test_mutated_real_manifests_decode_or_raise_library_errors(
    real: dict[str, Any], edits: list, donor: int
) -> None:
    donors = [*real["chunks"], real["manifest"]]
    data = mutate(real["manifest"], edits, donors[donor])
    try:
        manifest = decode_manifest(data, "fuzz")
    except DECODER_ERRORS:
        return
    assert type(manifest) is dict


@settings(max_examples=300, **FUZZ)
@given(edits=EDITS, donor=st.integers(0, 3))
def test_mutated_real_chunks_decode_or_raise_library_errors(
    real: dict[str, Any], edits: list, donor: int
) -> None:
    donors = [*real["chunks"], real["manifest"]]
    data = mutate(real["chunks"][edits[0][1] % 3], edits, donors[donor])
    try:
        reader = ChunkReader(data, digest="fuzz", loader=_loader(real["tensors"]))
    except DECODER_ERRORS:
        return
    for i in range(len(reader)):
        with contextlib.suppress(*DECODER_ERRORS):
            materialize_tensor_refs(reader.sample(i))


# --------------------------------------------------------------------------- forged manifests


#: JSON values a forged manifest may hold anywhere.
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, 1, -1, 3, 2**31, 2**63, -(2**63) - 1, 10**30, 10**400]),
        st.sampled_from([0.5, float("nan"), float("inf"), -0.0, 1e308]),
        st.sampled_from(["", "../x", "a/b", "x\x00y", "é" * 200, "sample:0", "ab" * 16]),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)

#: One edit of a manifest's JSON: a path (indices taken modulo each level's size) and a
#: new value, or None to delete what the path reaches.
MANIFEST_EDIT = st.tuples(
    st.lists(st.integers(0, 63), min_size=1, max_size=3), st.none() | JSON_VALUES
)


def edit_manifest(manifest: dict[str, Any], path: list[int], value: Any) -> None:
    """Replace (or delete, ``value`` None) the item ``path`` reaches in ``manifest``."""
    node: Any = manifest
    for depth, step in enumerate(path):
        if isinstance(node, dict) and node:
            key = sorted(node)[step % len(node)]
        elif isinstance(node, list) and node:
            key = step % len(node)
        else:
            return
        if depth == len(path) - 1 or not isinstance(node[key], (dict, list)):
            if value is None:
                del node[key]
            else:
                node[key] = value
            return
        node = node[key]


@pytest.fixture(scope="module")
def rebuild_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    root = tmp_path_factory.mktemp("rebuild") / "pool"
    with ArchiveManager.open(root, chunk_size=4, inline_limit=256) as pool:
        pool.save("src", tiny_rollout(10, seed=4), rollout_id=4)
        yield pool


_forged = itertools.count()


@settings(max_examples=150, **FUZZ)
@given(edits=st.lists(MANIFEST_EDIT, min_size=1, max_size=3))
def test_rebuild_skips_forged_manifests_and_never_raises(
    rebuild_pool: ArchiveManager, edits: list
) -> None:
    pool = rebuild_pool
    manifest = decode_manifest(pool.store.get(pool.open_archive("src").manifest_digest))  # type: ignore[arg-type]
    manifest["name"] = f"forged-{next(_forged)}"
    for path, value in edits:
        edit_manifest(manifest, path, value)
    try:
        data = encode_manifest(manifest)
    except ValueError:
        return  # not JSON at all (a dict key that json refuses): cannot be a blob
    pool.store.put(data)
    report = pool.rebuild_catalog()  # must not raise, whatever the manifest holds
    name = manifest.get("name")
    if isinstance(name, str) and name in report.archives:
        # Restored: every row it needs is consistent, so it reads (or fails cleanly).
        with contextlib.suppress(ArchiveError):
            pool.open_archive(name).load_samples()
    assert pool.verify().ok


FORGERIES: dict[str, Callable[[dict[str, Any]], None]] = {
    "metadata not objects": lambda m: m.update(metadata=[1] * len(m["metadata"])),
    "entry not a list": lambda m: m["entries"].__setitem__(0, "sample:0"),
    "sample key an int": lambda m: m["entries"][0].__setitem__(0, 5),
    "task key a list": lambda m: m["entries"][0].__setitem__(1, ["x"]),
    "sample key with NUL": lambda m: m["entries"][0].__setitem__(0, "a\x00"),
    "chunk ordinal out of range": lambda m: m["entries"][0].__setitem__(2, 99),
    "offset out of range": lambda m: m["entries"][0].__setitem__(3, 99),
    "chunk samples past INTEGER": lambda m: m["chunks"][0].__setitem__(1, 2**40),
    "chunk size negative": lambda m: m["chunks"][0].__setitem__(2, -1),
    "chunk digest escapes": lambda m: m["chunks"][0].__setitem__(0, "../../etc/passwd"),
    "entries and chunks disagree": lambda m: m.update(
        entries=m["entries"][:-1], metadata=m["metadata"][:-1]
    ),
    "rollout id past BIGINT": lambda m: m.update(rollout_id=10**30),
    "rollout id a str": lambda m: m.update(rollout_id="3"),
    "evaluation a str": lambda m: m.update(evaluation="no"),
    "attrs a list": lambda m: m.update(attrs=[1]),
    "attrs with NaN": lambda m: m.update(attrs={"x": float("nan")}),
    "created_at past any float": lambda m: m.update(created_at=10**400),
    "reference escapes": lambda m: m.update(reference="../x"),
    "name escapes": lambda m: m.update(name="../x"),
    "version true": lambda m: m.update(version=True),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_forged_manifest_is_skipped_and_the_rebuild_goes_on(
    tmp_path: Path, backend: Any, forgery: str
) -> None:
    """One forged manifest stopped every later rebuild (AttributeError, OverflowError or a
    database error escaped); now it is skipped with its reason, and a lost archive beside
    it is still restored."""
    with open_on(backend, tmp_path / "pool", chunk_size=4) as pool:
        pool.save("lost", tiny_rollout(8, seed=5), rollout_id=5)
        lost = decode_manifest(pool.store.get(pool.open_archive("lost").manifest_digest))  # type: ignore[arg-type]
        with pool.catalog.write() as conn:  # as if the catalog were a backup from before it
            digests = set(pool.store.iter_digests())
            conn.execute(delete(archives_table).where(archives_table.c.name == "lost"))
            conn.execute(delete(blobs_table).where(blobs_table.c.digest.in_(digests)))
        forged = copy.deepcopy(lost)
        forged["name"] = "forged"
        FORGERIES[forgery](forged)
        digest = pool.store.put(encode_manifest(forged))
        report = pool.rebuild_catalog()
        assert report.archives == ["lost"]
        assert digest in report.skipped
        assert "forged" not in {a.name for a in pool.find(state=None)}
        assert [canon(s) for s in pool.open_archive("lost").load_samples()] == [
            canon(s) for s in tiny_rollout(8, seed=5)
        ]
        assert pool.verify().ok


# --------------------------------------------------------------------------- pointer files


@pytest.fixture
def pointer(tmp_path: Path) -> dict[str, Any]:
    """A real pointer file's content (the archive is in ``tmp_path / "archive-pool"``)."""
    path = tmp_path / "saved.json"
    RolloutArchive.save(path, tiny_rollout(3), rollout_id=1)
    return json.loads(path.read_text())


def _write(path: Path, content: Any) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


BAD_POINTER_TEXT = {
    "nested 100,000 deep (RecursionError)": "[" * 100_000 + "]" * 100_000,
    "objects nested 100,000 deep": '{"a":' * 100_000 + "1" + "}" * 100_000,
}
BAD_POINTER_FIELDS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "version true (== 1 in Python)": ({"version": True}, UnsupportedFormatError, "version"),
    "version 1.0": ({"version": 1.0}, UnsupportedFormatError, "version"),
    "pool root with NUL": ({"pool_root": "/tmp/a\x00b"}, UnsupportedFormatError, "pool_root"),
    "catalog not a URL": ({"catalog": "not a url"}, UnsupportedFormatError, "not a SQLAlchemy"),
    "version 1 catalog URL not a URL": (
        {"version": 1, "catalog_url": "not a url"},
        UnsupportedFormatError,
        "not a SQLAlchemy",
    ),
    # A pointer alone never chooses a database to connect to, whatever its kind.
    "catalog of an unknown database": (
        {"catalog": "nosuchdb://x/y"},
        ForeignCatalogError,
        "does not choose the database server",
    ),
    "version 1 catalog URL of an unknown database": (
        {"version": 1, "catalog_url": "nosuchdb://x/y"},
        ForeignCatalogError,
        "does not choose the database server",
    ),
}


@pytest.mark.parametrize("case", list(BAD_POINTER_TEXT))
def test_pathologically_nested_pointer_is_not_a_pointer(tmp_path: Path, case: str) -> None:
    path = _write(tmp_path / "p.json", BAD_POINTER_TEXT[case])
    for call in (lambda: RolloutArchive(path), lambda: RolloutArchive.check_metadata(path, None)):
        with pytest.raises(UnsupportedFormatError, match="not JSON"):
            call()


@pytest.mark.parametrize("case", list(BAD_POINTER_FIELDS))
def test_malformed_pointer_fields(tmp_path: Path, pointer: dict[str, Any], case: str) -> None:
    fields, error, pattern = BAD_POINTER_FIELDS[case]
    path = _write(tmp_path / "p.json", {**pointer, **fields})
    with pytest.raises(error, match=pattern):
        RolloutArchive(path)


def test_pointer_path_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO used to block the reader forever; a device would be read without end."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(UnsupportedFormatError, match=r"not a regular file|Is a directory"):
            RolloutArchive(path)
        with pytest.raises(UnsupportedFormatError, match=r"not a regular file|Is a directory"):
            RolloutArchive.check_metadata(path, None)


def test_huge_pointer_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as f:  # sparse: no disk space, no time
        f.write(b'{"format": "archive_manager.pointer", "pad": "')
        f.truncate(MAX_POINTER_BYTES + 1)
    with pytest.raises(UnsupportedFormatError, match="at most"):
        RolloutArchive(path)


# --------------------------------------------------------------------------- names and owners


def _owner_hostile(text: str) -> bool:
    """Whether ``checkpoint:<text>`` breaks an owner rule (not the path rules of names)."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text) or len(text.encode()) > 240


HOSTILE = [
    "../x",
    "a/b",
    "a\\b",
    "..",
    "nul\x00",
    "bell\x07",
    "new\nline",
    "del\x7f",
    "x" * 256,
    "é" * 128,
    " lead",
    "trail\t",
]
#: Owners never become paths, so separators and ".." are allowed in them (see
#: test_path_like_owners_are_labels); control characters, length and whitespace are not.
HOSTILE_OWNERS = [
    *("checkpoint:" + n for n in HOSTILE if n.strip() == n and _owner_hostile(n)),
    "no-colon",
    ":x",
    "x:",
    "archive:a",
    "lease:0",
]


@pytest.fixture
def hostile_pool(tmp_path: Path) -> Iterator[tuple[ArchiveManager, PoolSnapshot]]:
    """A SQLite pool and its snapshot: these refusals happen before the catalog is asked
    anything, so one backend suffices (the rollbacks are covered on both by test_save.py)."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:keep", "a")
        yield pool, snapshot_pool(pool)


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_hostile_names_in_every_call_change_nothing(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], name: str
) -> None:
    pool, before = hostile_pool
    calls = [
        lambda: pool.save(name, tiny_rollout(), rollout_id=1),
        lambda: pool.writer(name, rollout_id=1),
        lambda: pool.open_archive(name),
        lambda: pool.retain("checkpoint:x", name),
        lambda: pool.release_plan(name=name),
        lambda: pool.save("b", None, rollout_id=1, reference=name),
    ]
    for call in calls:
        with pytest.raises(InvalidNameError):
            call()
    assert snapshot_pool(pool) == before


@pytest.mark.parametrize("owner", HOSTILE_OWNERS, ids=repr)
def test_hostile_owners_change_nothing(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], owner: str
) -> None:
    pool, before = hostile_pool
    for call in (
        lambda: pool.retain(owner, "a"),
        lambda: pool.release_owner(owner),
        lambda: pool.release_plan(owner=owner),
    ):
        with pytest.raises(InvalidNameError):
            call()
    assert snapshot_pool(pool) == before


@pytest.mark.parametrize(
    "owner", ["checkpoint:/ckpt/run1/step-1200", "job:..", "queue:a\\b", "checkpoint:../../etc"]
)
def test_path_like_owners_are_labels(tmp_path: Path, owner: str) -> None:
    """An owner is a label in the catalog, never a path: path-like owners retain, show and
    release like any other, and nothing is created outside the pool for them."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        outside = sorted(p.name for p in tmp_path.iterdir())
        assert pool.retain(owner, "a") is True
        assert owner in pool.open_archive("a").owners()
        assert any(o.owner == owner for o in pool.owners().owners)
        assert pool.release_plan(owner=owner) is not None
        assert pool.release_owner(owner) == 1
        assert owner not in pool.open_archive("a").owners()
    assert sorted(p.name for p in tmp_path.iterdir()) == outside


def _cli(root: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--root", str(root), *args])


def _one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("name", ["../x", "a/b", "nul\x00", "esc\x1b[31m", "x" * 300], ids=repr)
def test_hostile_names_and_owners_in_the_cli(tmp_path: Path, name: str) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1).export_pt(tmp_path / "a.pt")
        before = snapshot_pool(pool)
    for args in (
        ["show", name],
        ["keys", name],
        ["export", name, str(tmp_path / "out.pt")],
        ["release", name, "--yes"],
        ["release", name, "--dry-run"],
        ["retain", "checkpoint:x", name],
        ["import-pt", str(tmp_path / "a.pt"), "--name", name],
        *(
            [
                ["retain", "checkpoint:" + name, "a"],
                ["release-owner", "checkpoint:" + name, "--yes"],
            ]
            if _owner_hostile(name)
            else []
        ),
    ):
        _one_line_error(_cli(root, *args))
    with ArchiveManager.open(root) as pool:
        assert snapshot_pool(pool) == before
    assert not (tmp_path / "out.pt").exists()


#: Valid names that look alike or are unusual: each is its own archive and round-trips.
#: (Invisible characters and the two Unicode spellings of one text: tests/pool/test_names.py.)
CONFUSABLES = [
    "rollout-1",
    "rollout\u20101",  # HYPHEN
    "r\u043ellout-1",  # CYRILLIC SMALL LETTER O
    "\uff52\uff4f\uff4c\uff4c\uff4f\uff55\uff54-1",  # fullwidth: NFC keeps it (NFKC would not)
    "caf\u00e9",  # NFC
    "\U0001f9ea rollout",
    "é" * 127 + "x",  # 255 bytes
]


def test_confusable_names_and_owners_round_trip(tmp_path: Path, backend: Any) -> None:
    assert all(unicodedata.is_normalized("NFC", name) for name in CONFUSABLES)
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        for i, name in enumerate(CONFUSABLES):
            pool.save(name, tiny_rollout(2, seed=i), rollout_id=i)
            pool.retain(f"checkpoint:{name[:100]}", name)
        assert sorted(a.name for a in pool.find()) == sorted(CONFUSABLES)
        for i, name in enumerate(CONFUSABLES):
            arc = pool.open_archive(name)
            assert arc.name == name and arc.rollout_id == i
            assert arc.owners() == sorted([f"archive:{name}", f"checkpoint:{name[:100]}"])
            assert [canon(s) for s in arc.load_samples()] == [
                canon(s) for s in tiny_rollout(2, seed=i)
            ]
        owners = {o.owner for o in pool.owners().owners}
        assert {f"checkpoint:{n[:100]}" for n in CONFUSABLES} <= owners
        # The hyphen's look-alike owner is another owner: releasing one leaves the other.
        assert pool.release_owner(f"checkpoint:{CONFUSABLES[1]}") == 1
        assert pool.open_archive(CONFUSABLES[0]).owners() == [
            f"archive:{CONFUSABLES[0]}",
            f"checkpoint:{CONFUSABLES[0]}",
        ]
    if backend.name == "sqlite":
        listed = json.loads(_cli(root, "ls", "--json").stdout)
        assert sorted(a["name"] for a in listed) == sorted(CONFUSABLES)
        for name in CONFUSABLES:
            assert _cli(root, "keys", name).exit_code == 0


# --------------------------------------------------------------------------- samples


class Opaque:
    pass


def _cyclic_list() -> list:
    loop: list = [1, 2]
    loop.append(loop)
    return loop


def _self_containing_dict() -> dict:
    sample: dict = {"index": 0, "tokens": [1, 2]}
    sample["again"] = sample
    return sample


def _sample_in_its_own_metadata() -> Sample:
    sample = Sample(index=0, tokens=[1, 2])
    sample.metadata = {"me": sample}
    return sample


BAD_SAMPLES: dict[str, Callable[[], Any]] = {
    "an object": lambda: Sample(index=0, metadata={"handle": Opaque()}),
    "a set": lambda: Sample(index=0, reward={1, 2}),  # type: ignore[arg-type]
    "a function": lambda: {"index": 0, "callback": print},
    "a lambda": lambda: Sample(index=0, train_metadata={"f": lambda: 1}),
    "a generator": lambda: {"index": 0, "tokens": (t for t in range(3))},
    "a list containing itself": lambda: Sample(index=0, tokens=_cyclic_list()),
    "a dict containing itself": _self_containing_dict,
    "a sample in its own metadata": _sample_in_its_own_metadata,
    "a status slime cannot read back": lambda: Sample(index=0, status="weird"),  # type: ignore[arg-type]
    "a status of the wrong type": lambda: Sample(index=0, status=3),  # type: ignore[arg-type]
    "not a sample": lambda: 42,
}


@pytest.mark.parametrize("case", list(BAD_SAMPLES))
@pytest.mark.parametrize("how", ["save", "writer"])
def test_unencodable_samples_are_refused_and_change_nothing(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], case: str, how: str
) -> None:
    pool, before = hostile_pool
    # A good chunk first (chunk size 64), so the refusal comes after blobs were written.
    samples = [*tiny_rollout(70, seed=9), BAD_SAMPLES[case]()]
    with pytest.raises(UnencodableError):
        if how == "save":
            pool.save("bad", samples, rollout_id=2)
        else:
            with pool.writer("bad", rollout_id=2) as writer:
                for sample in samples:
                    writer.add(sample)
    assert snapshot_pool(pool) == before


def test_status_given_as_its_value_round_trips(pool: ArchiveManager) -> None:
    pool.save("s", [Sample(index=0, status="truncated")], rollout_id=0)  # type: ignore[arg-type]
    (loaded,) = pool.open_archive("s").load_samples()
    assert loaded.status is Sample.Status.TRUNCATED


def test_huge_numbers_round_trip_and_stay_out_of_the_metadata(pool: ArchiveManager) -> None:
    """Rewards past any float, lengths past INTEGER and ints of 4,300+ digits used to fail
    the save half-way (OverflowError binding an index column, ValueError writing the
    metadata as JSON).  The samples keep them exactly; metadata and index say None."""
    samples = [
        Sample(index=0, reward=10**5000, response_length=10**30, tokens=[10**30, -1]),  # type: ignore[arg-type]
        Sample(index=1, reward=10**400, response_length=2**31, group_index=10**5000),  # type: ignore[arg-type]
        Sample(index=2, reward=2**64, response_length=7),
        {"index": 3, "task_key": 10**250, "reward": -1.5},  # a 251-digit task key fits
    ]
    arc = pool.save("huge", samples, rollout_id=2**63 - 1)
    assert [canon(s) for s in arc.load_samples()] == [canon(s) for s in samples]
    meta = [(m["reward"], m["response_length"], m["group_index"]) for m in arc.sample_metadata()]
    assert meta == [(None, None, None), (None, 2**31, None), (2**64, 7, None), (-1.5, None, None)]
    assert arc.keys()[3] == ("sample:3", str(10**250))
    assert pool.find(rollout_id=2**63 - 1)[0].name == "huge"
    rows = pool.query(min_reward=-2.0)
    assert [(r.position, r.reward, r.response_length) for r in rows] == [
        (2, float(2**64), 7),
        (3, -1.5, None),
    ]


@pytest.mark.parametrize(
    "sample",
    [
        {"index": 10**5000},  # no str at all
        {"index": 10**300},  # a 308-byte sample key
        {"index": 0, "task_key": 10**300},
        {"index": 0, "task_key": 10**5000},
    ],
    ids=["index of 5,000 digits", "index of 300 digits", "task key of 300 digits", "5,000"],
)
def test_ints_too_long_for_a_key_are_refused(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], sample: dict
) -> None:
    pool, before = hostile_pool
    with pytest.raises(InvalidInputError, match="key"):
        pool.save("b", [*tiny_rollout(70), sample], rollout_id=1)
    assert snapshot_pool(pool) == before


@pytest.mark.parametrize("rollout_id", [2**63, -(2**63) - 1, 10**30])
def test_rollout_id_past_64_bits_is_refused(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], rollout_id: int
) -> None:
    pool, before = hostile_pool
    with pytest.raises(InvalidInputError, match="64 bits"):
        pool.save("b", tiny_rollout(), rollout_id=rollout_id)
    with pytest.raises(InvalidInputError, match="64 bits"):
        pool.writer("b", rollout_id=rollout_id)
    with pytest.raises(InvalidInputError, match="64 bits"):
        pool.find(rollout_id=rollout_id)
    too_big: list[dict[str, Any]] = [{"min_reward": 10**400}, {"limit": 2**64}]
    for bounds in too_big:
        with pytest.raises(InvalidInputError):
            pool.query(**bounds)
    assert snapshot_pool(pool) == before


#: Lone surrogates where the catalog stores text: no driver can encode them.
SURROGATE_FIELDS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "status": ({"index": 0, "tokens": [1, 2], "status": "\ud800"}, UnencodableError, "status"),
    "sample key": ({"index": "\udcff", "tokens": [1, 2]}, InvalidInputError, "sample key"),
    "task key": ({"index": 0, "tokens": [1], "task_key": "x\udcff"}, InvalidInputError, "task"),
}


@pytest.mark.parametrize("field", list(SURROGATE_FIELDS))
@pytest.mark.parametrize("how", ["save", "writer"])
def test_lone_surrogates_in_stored_text_are_refused_and_change_nothing(
    open_pool: Callable[..., ArchiveManager], field: str, how: str
) -> None:
    """A status with a lone surrogate was the driver's UnicodeEncodeError in the middle of
    the save, on SQLite and PostgreSQL alike; it is refused, naming the field."""
    pool = open_pool()
    pool.save("a", tiny_rollout(), rollout_id=1)
    before = snapshot_pool(pool)
    sample, error, what = SURROGATE_FIELDS[field]
    # A good chunk first (chunk size 64), so the refusal comes after blobs were written.
    samples = [*tiny_rollout(70, seed=9), sample]
    with pytest.raises(error, match=what) as info:
        if how == "save":
            pool.save("bad", samples, rollout_id=2)
        else:
            with pool.writer("bad", rollout_id=2) as writer:
                for one in samples:
                    writer.add(one)
    assert "valid unicode" in str(info.value)
    assert snapshot_pool(pool) == before
    with pytest.raises(InvalidInputError, match="status"):
        pool.query(status=["truncated", "\udcff"])


@pytest.mark.parametrize(
    "grace",
    # Duration text is accepted ("1h", as the CLI's); text that is no duration is not.
    [10**400, 1e300, float("inf"), float("nan"), -1, timedelta(seconds=-1), "an hour", True],
    ids=repr,
)
def test_gc_grace_out_of_range_is_refused(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], grace: Any
) -> None:
    """``gc(grace=10**400)`` was an OverflowError, NaN was taken for a grace period."""
    pool, before = hostile_pool
    pool.open_archive("a").release()
    released = snapshot_pool(pool)
    for dry_run in (True, False):
        with pytest.raises(InvalidInputError, match="grace"):
            pool.gc(grace=grace, dry_run=dry_run)
    assert snapshot_pool(pool) == released != before
    # The longest grace a timedelta holds is fine (and reclaims nothing this young).
    assert pool.gc(grace=timedelta.max).blobs == 0
    assert pool.gc(grace=timedelta.max.total_seconds()).blobs == 0


def test_find_since_out_of_range_is_refused(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A naive datetime is local time: ``datetime.min`` east of Greenwich is before the year
    1 in UTC, and ``timestamp()`` raised a ValueError from ``find``."""
    pool, _ = hostile_pool
    monkeypatch.setenv("TZ", "JST-9")  # a POSIX zone string: no tz database needed
    time.tzset()
    try:
        with pytest.raises(InvalidInputError, match="since"):
            pool.find(since=datetime.min)
    finally:
        monkeypatch.undo()
        time.tzset()
    utc_min = datetime.min.replace(tzinfo=timezone.utc)
    assert [i.name for i in pool.find(since=utc_min)] == ["a"]
    assert pool.find(since=datetime.max.replace(tzinfo=timezone.utc)) == []


def test_out_of_range_numbers_in_the_cli(tmp_path: Path) -> None:
    """``ls --rollout-id 2**64`` was an OverflowError traceback; bounds past every value
    are fine in a query (they match nothing, or everything)."""
    root = tmp_path / "pool"
    ArchiveManager.open(root).close()
    assert "64 bits" in _one_line_error(_cli(root, "ls", "--rollout-id", str(2**64)))
    for args in (
        ["query", "--rollout-id", f"0..{2**64}"],
        ["query", "--min-reward", str(10**400)],
        ["query", "--max-length", str(2**70)],
    ):
        result = _cli(root, *args)
        assert result.exit_code == 0, (result.output, result.exception)


def test_enormous_string_round_trips(tmp_path: Path) -> None:
    response = ("the answer is 42. " * 4_000_000)[: 64 << 20]  # 64 MiB
    assert len(response) == 64 << 20
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("big", [Sample(index=0, response=response, tokens=[1, 2])], rollout_id=0)
        (loaded,) = pool.open_archive("big").load_samples()
        assert loaded.response == response
        del loaded
        before = snapshot_pool(pool)
        with pytest.raises(InvalidInputError):
            pool.save("key", [{"index": 0}], rollout_id=0, task_keys=[response])
        with pytest.raises(InvalidNameError):
            pool.save(response, [{"index": 0}], rollout_id=0)
        with pytest.raises(InvalidNameError):
            pool.retain("checkpoint:" + response, "big")
        assert snapshot_pool(pool) == before


@pytest.mark.parametrize(
    "keys",
    [
        {"sample_key": True},
        {"task_key": b"rollout-0/group-0"},
        {"sample_key": None, "task_key": {"k": 1}},
        {"sample_key": ["sample:0"], "task_key": None},
        {"sample_key": "sample:0", "task_key": ("rollout-0/group-0",)},
        {"sample_key": 0, "task_key": 0},
        {"sample_key": "sample:0\x00"},
        {"sample_key": "x" * 100_000},
    ],
    ids=repr,
)
def test_load_samples_with_keys_of_wrong_types(
    hostile_pool: tuple[ArchiveManager, PoolSnapshot], keys: dict
) -> None:
    arc = hostile_pool[0].open_archive("a")
    with pytest.raises(InvalidInputError):
        arc.load_samples(**keys)


# --------------------------------------------------------------------------- catalog URLs


@pytest.mark.parametrize(
    "url", ["not a url", "://", "nosuchdb://h/db", "postgresql+nodriver://h/d"]
)
def test_malformed_catalog_urls_are_catalog_errors(tmp_path: Path, url: str) -> None:
    """SQLAlchemy's ArgumentError used to escape (a traceback in the CLI)."""
    with pytest.raises(CatalogError):
        ArchiveManager.open(tmp_path / "pool", catalog_url=url)
    with pytest.raises(CatalogError):
        ArchiveManager.exists(tmp_path / "pool", catalog_url=url)
    line = _one_line_error(_cli(tmp_path / "pool", "--catalog-url", url, "info"))
    assert "catalog URL" in line


def test_no_fragment_of_an_unencoded_password_reaches_an_error_message(tmp_path: Path) -> None:
    """An operator pastes a password holding '@' without percent-encoding it
    (`postgresql+psycopg://trainer:hunter2@xyzzy@127.0.0.1:1/rl`).  SQLAlchemy takes the
    password to end at the first '@' and the rest (`xyzzy`) for part of the host, so the
    message ("cannot reach the catalog server of ...:***@xyzzy@127.0.0.1:1/rl: failed to
    resolve host 'xyzzy@127.0.0.1'") prints the password's tail twice; so does the CLI.  No
    part of a password may be shown: a URL whose host holds '@' should be treated like an
    unparsable one (not echoed)."""
    url = "postgresql+psycopg://trainer:hunter2@xyzzy@127.0.0.1:1/rl"
    with pytest.raises(ArchiveError) as caught:
        ArchiveManager.open(tmp_path / "pool", catalog_url=url).close()
    assert "xyzzy" not in str(caught.value)


@pytest.mark.parametrize("spelling", ["rollout_ids", "rollout_id"])
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("1..2", "must be None, an int, a range or (low, high), not str ('A..B' is (A, B) here)"),
        (True, "must be an int, a range or (low, high), not a bool"),
        ((1, "2"), "the ends of {} (low, high) must be ints or None"),
        ((3, 1), "{}: rollout id range 3..1 is empty"),
        (range(0, 9, 2), "{}: a range of rollout ids must have step 1"),
        (2**63, "{}: rollout id 9223372036854775808 does not fit in 64 bits"),
    ],
    ids=["text", "bool", "end", "empty", "step", "huge"],
)
def test_a_bad_rollout_filter_is_refused_naming_the_spelling_used(
    tmp_path: Path, spelling: str, bad: object, says: str
) -> None:
    """find(rollout_ids="1..2") complained about "rollout_id must be...", export_many raised
    TypeError or ValueError, query and stats had no rollout_id=: every method that filters by
    rollout id refuses a bad filter with InvalidInputError naming the parameter given, and
    writes nothing."""
    from archive_manager.data import RolloutDataset

    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(n=2), rollout_id=1)
        calls: list[Callable[..., object]] = [
            pool.find,
            pool.query,
            pool.stats,
            pool.arrow_reader,
            lambda **kw: pool.export_many(tmp_path / "out", format="jsonl", **kw),
            lambda **kw: RolloutDataset(pool, fields=["archive"], **kw),
        ]
        if spelling == "rollout_ids":
            calls += [
                lambda **kw: pool.forget(keep_last=1, dry_run=True, **kw),
                lambda **kw: pool.search("x", **kw),
                lambda **kw: pool.prompt_history("k", **kw),
            ]
        message = says.format(spelling) if "{}" in says else f"{spelling} {says}"
        for call in calls:
            with pytest.raises(InvalidInputError) as info:
                call(**{spelling: bad})
            assert message in str(info.value), call
        assert not (tmp_path / "out").exists()
        assert [a.name for a in pool.find()] == ["a"]


def test_a_huge_lease_ttl_is_a_library_error(tmp_path: Path) -> None:
    """`lease_ttl=10**400` (a config value in microseconds read as seconds, say) raises a raw
    `OverflowError: int too large to convert to float` from `ArchiveManager.open`; a library
    error (InvalidInputError, as `gc(grace=...)` gives) is expected."""
    with pytest.raises(InvalidInputError):
        ArchiveManager.open(tmp_path / "pool", lease_ttl=10**400).close()


@pytest.mark.parametrize(
    "ttl", [float("inf"), 1e300, timedelta.max], ids=["inf", "1e300", "timedelta.max"]
)
def test_an_unbounded_lease_ttl_is_refused_or_works_without_a_traceback(
    tmp_path: Path, ttl: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lease_ttl=timedelta.max` (or inf, 1e300) is accepted by `open`, but every save's
    heartbeat thread then dies at once with `OverflowError: timestamp out of range for
    platform time_t` (`Event.wait(ttl / n)`), a raw traceback on stderr of every training
    job.  Expected: refused on open with InvalidInputError (a lease that never expires also
    means a crashed writer leaks forever), or saves that work without a thread dying."""
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    try:
        pool = ArchiveManager.open(tmp_path / "pool", lease_ttl=ttl)  # type: ignore[arg-type]
    except InvalidInputError:
        return
    with pool:
        pool.save("a", tiny_rollout(n=1), rollout_id=1)
    assert died == []
