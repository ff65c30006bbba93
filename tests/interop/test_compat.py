"""The seed-compatible `RolloutArchive` facade: pointer files written per rollout by a
slime-like training loop, resumed by fresh objects, checked against a run's settings from the
pointer alone, collected; live queue context as task keys; shared pools; bad pointer files;
racing savers; and archive names made from pointer paths."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from helpers import local_store
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import ArchiveManager, RolloutArchive, Sample, describe_sample
from archive_manager._util.names import check_archive_name
from archive_manager.blobs import BlobStore
from archive_manager.cli import cli
from archive_manager.compat import POINTER_FORMAT, POINTER_VERSION, archive_name_for
from archive_manager.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    ArchiveReleasedError,
    CatalogError,
    ForeignCatalogError,
    IntegrityError,
    InvalidInputError,
    InvalidNameError,
    MetadataError,
    PoolNotFoundError,
    UnsupportedFormatError,
)

#: slime's settings for routing replay on a 2-layer MoE with top-8 routing.
R3_ARGS = SimpleNamespace(use_rollout_routing_replay=True, num_layers=2, moe_router_topk=8)


def save_open(path: Path, samples: Any, **kwargs: Any) -> RolloutArchive:
    """Save as the seed does (``save`` returns None), then open what was saved."""
    assert RolloutArchive.save(path, samples, **kwargs) is None
    return RolloutArchive(path, args=kwargs.get("args"))


def seed_view(metadata: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool's sample metadata with the seed's keys only (what check_metadata returns)."""
    keys = ("index", "group_index", "status", "tokens", "response_length", "loss_mask")
    return [
        {k: m[k] for k in keys}
        | {"rollout_log_probs": m["rollout_log_probs"]}
        | {"tensors": {k: v for k, v in m["tensors"].items() if k.startswith("rollout_")}}
        for m in metadata
    ]


def with_receipts(samples: list[Any]) -> list[Any]:
    """``samples`` with their ``task_key`` as a queue receipt: the seed (and so the facade)
    takes a task key from ``_queue_receipt``/``_queue_lease`` only, never ``task_key``."""
    for sample in samples:
        sample._queue_receipt = {"task_id": sample.task_key}
    return samples


def read_pointer(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write_pointer(path: Path, pointer: Any) -> Path:
    path.write_text(json.dumps(pointer), encoding="utf-8")
    return path


def as_json(value: Any) -> Any:
    """``value`` as it reads back from a JSON file (tuples become lists, ...)."""
    return json.loads(json.dumps(value))


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --------------------------------------------------------------------------- a training run


def test_training_loop_saves_resumes_checks_and_collects(
    tmp_path: Path, rollout, same_samples, blob_files_of
) -> None:
    run = tmp_path / "run"
    args = SimpleNamespace(use_rollout_routing_replay=False, num_layers=2, moe_router_topk=8)
    saved: dict[int, list] = {}
    for i in range(6):  # the training loop: one pointer file per rollout
        samples = with_receipts(rollout(16, seed=i, rollout_id=i))
        saved[i] = samples
        with save_open(run / f"rollout_{i}.json", samples, rollout_id=i, args=args) as arc:
            assert (arc.rollout_id, arc.evaluation, len(arc)) == (i, False, 16)
            assert arc.name == archive_name_for(run / f"rollout_{i}.json")

    pool_root = (run / "archive-pool").resolve()
    assert sorted(p.name for p in run.iterdir()) == [
        "archive-pool",
        *(f"rollout_{i}.json" for i in range(6)),
    ]
    pointer = read_pointer(run / "rollout_2.json")
    assert pointer["format"] == POINTER_FORMAT and pointer["version"] == POINTER_VERSION
    assert pointer["pool_root"] == str(pool_root)
    assert pointer["archive"] == archive_name_for(run / "rollout_2.json")
    assert (pointer["rollout_id"], pointer["evaluation"]) == (2, False)
    assert "catalog" not in pointer  # the default catalog is not spelled out
    assert pointer["metadata"] == as_json([describe_sample(s) for s in saved[2]])
    with ArchiveManager.open(pool_root, create=False) as pool:
        infos = pool.find()
        assert sorted(-1 if i.rollout_id is None else i.rollout_id for i in infos) == list(range(6))
        assert pointer["manifest_digest"] == pool.open_archive(pointer["archive"]).manifest_digest

    # Resume: fresh objects, from the pointer files alone.
    for i in range(6):
        path = run / f"rollout_{i}.json"
        metadata = RolloutArchive.check_metadata(path, args)
        assert [m["index"] for m in metadata] == [s.index for s in saved[i]]
        with RolloutArchive(path) as arc:
            assert arc.keys() == [
                (f"sample:{s.index}", f"rollout-{i}/group-{s.index // 8}") for s in saved[i]
            ]
            same_samples(arc.load_samples(), saved[i])
            same_samples(list(arc.iter_samples(materialize=True)), saved[i])
            group = arc.load_samples(task_key=f"rollout-{i}/group-1")
            same_samples(group, saved[i][8:])
            one = arc.load_samples(sample_key=f"sample:{saved[i][3].index}")
            same_samples(one, [saved[i][3]])
            with pytest.raises(KeyError, match="group-7"):
                arc.load_samples(task_key=f"rollout-{i}/group-7")
            assert seed_view(arc.sample_metadata()) == metadata
    # As the seed: samples without routes pass a routing-replay check.
    assert len(RolloutArchive.check_metadata(run / "rollout_5.json", R3_ARGS)) == 16

    # Release what the run no longer needs, collect, and keep training on the rest.
    for i in range(4):
        with RolloutArchive(run / f"rollout_{i}.json") as arc:
            arc.release()  # returns nothing, as the seed's
            arc.release()  # idempotent
    with ArchiveManager.open(pool_root, create=False) as pool:
        before = blob_files_of(pool).files()
        report = pool.gc(grace=0)
        assert report.blobs > 0 and report.bytes > 0
        after = blob_files_of(pool).files()
        assert len(before) - len(after) == report.blobs
        for i in range(6):
            chunks = blob_files_of(pool).chunks(archive_name_for(run / f"rollout_{i}.json"))
            kept = [local_store(pool).path(d).exists() for d in chunks]
            assert kept == [i >= 4] * len(kept)  # the released ones' chunks are gone
    for i in range(6):
        path = run / f"rollout_{i}.json"
        # The pointer and its metadata stay usable after a release.
        assert len(RolloutArchive.check_metadata(path, args)) == 16
        with RolloutArchive(path) as arc:
            if i < 4:
                with pytest.raises(ArchiveReleasedError, match="released"):
                    arc.load_samples()
            else:
                same_samples(arc.load_samples(), saved[i])


def test_one_folder_one_pool_with_dedup(tmp_path: Path, rollout, blob_files_of) -> None:
    samples = rollout(20, seed=4, rollout_id=1)
    with (
        save_open(tmp_path / "a.json", samples, rollout_id=1) as a,
        save_open(tmp_path / "b.json", samples, rollout_id=1) as b,
    ):
        assert a.pool.root == b.pool.root == (tmp_path / "archive-pool").resolve()
        files = blob_files_of(b.pool)
        assert files.chunks(a.name) == files.chunks(b.name)  # stored once
        # Only the second archive's manifest is new.
        assert len(files.files()) == len(set(files.digests(a.name))) + 1
    # Parent folders are made; a nested folder gets a pool of its own.
    with save_open(tmp_path / "x" / "y" / "c.json", samples[:2], rollout_id=1) as c:
        assert c.pool.root == (tmp_path / "x" / "y" / "archive-pool").resolve()


def test_pool_found_through_root_after_a_move(tmp_path: Path, rollout, same_samples) -> None:
    samples = rollout(5, seed=2)
    RolloutArchive.save(tmp_path / "run" / "r.json", samples, rollout_id=0)
    (tmp_path / "run" / "archive-pool").rename(tmp_path / "moved")
    with pytest.raises(PoolNotFoundError):
        RolloutArchive(tmp_path / "run" / "r.json")
    with RolloutArchive(tmp_path / "run" / "r.json", root=tmp_path / "moved") as arc:
        same_samples(arc.load_samples(), samples)


def test_facade_export_writes_slime_dump(tmp_path: Path, rollout, same_samples) -> None:
    samples = rollout(6, seed=3, rollout_id=7, r3_layers=2)
    with save_open(tmp_path / "r.json", samples, rollout_id=7) as arc:
        out = arc.export_pt(tmp_path / "dumps" / "r.pt")
        assert "r.json" in repr(arc)
    dump = torch.load(out, weights_only=True)
    assert dump["rollout_id"] == 7
    same_samples([Sample.from_dict(d) for d in dump["samples"]], samples)
    arc.close()  # closing twice is harmless


# --------------------------------------------------------------------------- metadata checks


def test_check_metadata_against_run_settings(tmp_path: Path, rollout) -> None:
    plain = rollout(4, seed=1)
    routed = rollout(4, seed=2, r3_layers=2)
    RolloutArchive.save(tmp_path / "plain.json", plain, rollout_id=0)
    RolloutArchive.save(tmp_path / "routed.json", routed, rollout_id=0)

    for args in (None, SimpleNamespace(), SimpleNamespace(use_rollout_routing_replay=False)):
        assert len(RolloutArchive.check_metadata(tmp_path / "plain.json", args)) == 4
    metadata = RolloutArchive.check_metadata(tmp_path / "routed.json", R3_ARGS)
    assert metadata[0]["tensors"]["rollout_routed_experts"] == {
        "shape": [len(routed[0].tokens) - 1, 2, 8],
        "dtype": "int32",
    }

    # As the seed: absent routes pass; present ones must fit (the first misfit raises).
    assert len(RolloutArchive.check_metadata(tmp_path / "plain.json", R3_ARGS)) == 4
    wider = SimpleNamespace(use_rollout_routing_replay=True, num_layers=2, moe_router_topk=4)
    with pytest.raises(MetadataError, match="Routed-experts shape/dtype does not match"):
        RolloutArchive.check_metadata(tmp_path / "routed.json", wider)


def test_check_metadata_never_reads_a_blob(
    tmp_path: Path, rollout, blob_files_of, monkeypatch
) -> None:
    plain, routed = rollout(3, seed=1), rollout(3, seed=2, r3_layers=2)
    RolloutArchive.save(tmp_path / "plain.json", plain, rollout_id=0)
    with save_open(tmp_path / "routed.json", routed, rollout_id=0) as arc:
        assert blob_files_of(arc.pool).delete_all() > 0
        with pytest.raises(IntegrityError):  # the payload really is gone
            arc.load_samples()
    # An older pointer, written before pointers carried metadata: the catalog answers.
    old = read_pointer(tmp_path / "plain.json")
    del old["metadata"]
    write_pointer(tmp_path / "old.json", old)

    def no_blob_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("check_metadata read a blob")

    monkeypatch.setattr(BlobStore, "get", no_blob_reads)
    monkeypatch.setattr(BlobStore, "get_view", no_blob_reads)
    monkeypatch.setattr(BlobStore, "open", no_blob_reads)
    assert len(RolloutArchive.check_metadata(tmp_path / "routed.json", R3_ARGS)) == 3
    assert len(RolloutArchive.check_metadata(tmp_path / "old.json", None)) == 3
    wider = SimpleNamespace(use_rollout_routing_replay=True, num_layers=2, moe_router_topk=4)
    with pytest.raises(MetadataError, match="Routed-experts shape/dtype"):
        RolloutArchive.check_metadata(tmp_path / "routed.json", wider)

    # A pointer with metadata needs nothing but itself: not even the pool.
    (tmp_path / "archive-pool").rename(tmp_path / "gone")
    assert len(RolloutArchive.check_metadata(tmp_path / "routed.json", R3_ARGS)) == 3
    assert len(RolloutArchive.check_metadata(tmp_path / "plain.json", R3_ARGS)) == 3
    with pytest.raises(PoolNotFoundError):  # without metadata the catalog is needed
        RolloutArchive.check_metadata(tmp_path / "old.json", None)


# --------------------------------------------------------------------------- queue context


@dataclass
class Lease:
    """A live queue lease: its lock must never reach the codec."""

    task_id: Any
    lock: Any


def test_task_keys_from_live_queue_context(tmp_path: Path, same_samples) -> None:
    def make(index: int, **queue: Any) -> Sample:
        sample = Sample(index=index, tokens=[1, 2, 3], response_length=1, loss_mask=[1])
        for attr, value in queue.items():
            setattr(sample, attr, value)
        return sample

    receipt = {"task_id": "task-a", "attempt": 2}
    samples: list[Any] = [
        make(0, _queue_receipt=receipt),
        make(1, _queue_lease=Lease(task_id=7, lock=threading.Lock())),
        {"index": 2, "tokens": [4], "_queue_receipt": {"task_id": "task-c"}},
        make(3, _queue_lease={"task_id": "task-d"}, _queue_position=11),
        make(4),
    ]
    with save_open(tmp_path / "r.json", samples, rollout_id=0) as arc:
        assert arc.keys() == [
            ("sample:0", "task-a"),
            ("sample:1", "7"),
            ("sample:2", "task-c"),
            ("sample:3", "task-d"),
            ("sample:4", None),
        ]
    assert samples[0]._queue_receipt is receipt  # the live objects are left alone
    assert "_queue_" not in json.dumps(read_pointer(tmp_path / "r.json")["metadata"])
    with RolloutArchive(tmp_path / "r.json") as arc:
        loaded = arc.load_samples()
        same_samples(loaded, samples)
        for sample in loaded:
            # As the seed: its five live queue fields are gone, other _queue_* ones stay.
            names = sample if isinstance(sample, dict) else vars(sample)
            queue = [k for k in names if k.startswith("_queue_")]
            assert queue == (["_queue_position"] if names is vars(loaded[3]) else []), names
        assert loaded[3]._queue_position == 11
        (got,) = arc.load_samples(task_key="7")
        assert got.index == 1 and not hasattr(got, "_queue_lease")
        assert arc.load_samples(task_key="task-c") == [{"index": 2, "tokens": [4]}]


# --------------------------------------------------------------------------- references


def test_reference_saves_share_chunks(tmp_path: Path, rollout, same_samples, blob_files_of) -> None:
    samples = with_receipts(rollout(10, seed=5, rollout_id=3))
    run = tmp_path / "run"
    base = save_open(run / "rollout_3.json", samples, rollout_id=3)
    by_object = save_open(run / "eval_3.json", None, rollout_id=3, evaluation=True, reference=base)
    by_path = save_open(
        run / "replay_3.json", None, rollout_id=3, reference=str(run / "rollout_3.json")
    )
    try:
        files = blob_files_of(base.pool)
        assert files.chunks(by_object.name) == files.chunks(base.name)
        assert files.chunks(by_path.name) == files.chunks(base.name)
        assert read_pointer(run / "eval_3.json")["evaluation"] is True
        assert by_object.evaluation is True and by_path.evaluation is False
        assert RolloutArchive.check_metadata(run / "eval_3.json", None) == seed_view(
            base.sample_metadata()
        )
        # The referencing archives keep the chunks alive after the original is released.
        base.release()
        base.pool.gc(grace=0)
        same_samples(by_object.load_samples(), samples)
        same_samples(by_path.load_samples(task_key="rollout-3/group-1"), samples[8:])
    finally:
        for arc in (base, by_object, by_path):
            arc.close()


def test_reference_must_share_the_pool(tmp_path: Path, rollout) -> None:
    RolloutArchive.save(tmp_path / "a" / "r.json", rollout(3), rollout_id=0)
    elsewhere = SimpleNamespace(archive_root=str(tmp_path / "other-pool"))
    with pytest.raises(InvalidInputError, match="same pool"):
        RolloutArchive.save(
            tmp_path / "b" / "r.json",
            None,
            rollout_id=0,
            args=elsewhere,
            reference=tmp_path / "a" / "r.json",
        )
    assert not (tmp_path / "b" / "r.json").exists()


# --------------------------------------------------------------------------- shared pools


def test_same_file_name_in_two_runs_shares_one_pool_without_collision(
    tmp_path: Path, rollout, same_samples
) -> None:
    shared = tmp_path / "shared-pool"
    args = SimpleNamespace(archive_root=str(shared))
    first, second = rollout(6, seed=10, rollout_id=3), rollout(6, seed=11, rollout_id=3)
    a = save_open(tmp_path / "run-a" / "rollout_3.json", first, rollout_id=3, args=args)
    b = save_open(tmp_path / "run-b" / "rollout_3.json", second, rollout_id=3, args=args)
    try:
        assert a.name != b.name
        assert a.pool.root == b.pool.root == shared.resolve()
        assert not (tmp_path / "run-a" / "archive-pool").exists()
        same_samples(a.load_samples(), first)
        same_samples(b.load_samples(), second)
        assert {info.name for info in a.pool.find(rollout_id=3)} == {a.name, b.name}
    finally:
        a.close()
        b.close()
    # Fresh objects find the shared pool through the pointer alone.
    with RolloutArchive(tmp_path / "run-b" / "rollout_3.json") as again:
        same_samples(again.load_samples(), second)


def test_catalog_url_is_recorded_when_not_the_default(
    tmp_path: Path, rollout, same_samples
) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'catalog.db'}"
    (tmp_path / "elsewhere").mkdir()
    args = SimpleNamespace(archive_root=str(tmp_path / "blobs-here"), archive_catalog_url=url)
    samples = rollout(4, seed=6)
    RolloutArchive.save(tmp_path / "run" / "r.json", samples, rollout_id=0, args=args)
    pointer = read_pointer(tmp_path / "run" / "r.json")
    assert pointer["catalog"] == url and "catalog_url" not in pointer
    assert pointer["pool_root"] == str((tmp_path / "blobs-here").resolve())
    assert not (tmp_path / "blobs-here" / "catalog.db").exists()
    with RolloutArchive(tmp_path / "run" / "r.json") as arc:
        assert arc.pool.catalog_url == url
        same_samples(arc.load_samples(), samples)


# --------------------------------------------------------------------------- bad pointers


@pytest.fixture
def saved_pointer(tmp_path: Path, rollout) -> dict[str, Any]:
    """A valid pointer's content (its archive saved in ``tmp_path / "archive-pool"``)."""
    RolloutArchive.save(tmp_path / "good.json", rollout(3, seed=8), rollout_id=0)
    return read_pointer(tmp_path / "good.json")


def _without(*keys: str):
    return lambda p: {k: v for k, v in p.items() if k not in keys}


def _with(**changes: Any):
    return lambda p: {**p, **changes}


# (mutation of a valid pointer, error, message pattern, caught by the pointer alone)
BAD_POINTERS = {
    "missing archive": (_without("archive"), UnsupportedFormatError, "lacks archive", True),
    "missing root and digest": (
        _without("pool_root", "manifest_digest"),
        UnsupportedFormatError,
        "lacks pool_root, manifest_digest",
        True,
    ),
    "missing format": (_without("format"), UnsupportedFormatError, "format None", True),
    "other format": (
        _with(format="vime.straw"),
        UnsupportedFormatError,
        "format 'vime.straw'",
        True,
    ),
    "newer version": (_with(version=3), UnsupportedFormatError, "version 3", True),
    "version as text": (_with(version="2"), UnsupportedFormatError, "version '2'", True),
    "version as bool": (_with(version=True), UnsupportedFormatError, "version True", True),
    "not an object": (lambda p: [p], UnsupportedFormatError, "not a JSON object", True),
    "malformed metadata": (_with(metadata="x"), UnsupportedFormatError, "metadata", True),
    "malformed pool root": (_with(pool_root=7), UnsupportedFormatError, "pool_root", True),
    "malformed catalog": (_with(catalog=5), UnsupportedFormatError, "malformed catalog", True),
    "unparsable catalog": (
        _with(catalog="::not a url"),
        UnsupportedFormatError,
        "malformed catalog .not a SQLAlchemy URL",
        True,
    ),
    "malformed version 1 catalog_url": (
        _with(version=1, catalog_url=5),
        UnsupportedFormatError,
        "malformed catalog_url",
        True,
    ),
    "digest escapes the pool": (
        _with(manifest_digest="../../etc/passwd"),
        InvalidNameError,
        "digest",
        True,
    ),
    "uppercase digest": (_with(manifest_digest="A" * 32), InvalidNameError, "digest", True),
    "archive escapes": (_with(archive="../../etc"), InvalidNameError, "archive name", False),
    "no such pool": (_with(pool_root="/nonexistent/pool"), PoolNotFoundError, "no pool", False),
    "no such archive": (_with(archive="nope"), ArchiveNotFoundError, "nope", False),
    "digest mismatch": (
        _with(manifest_digest="0" * 32),
        MetadataError,
        "names manifest 0{32} but",
        False,
    ),
}


@pytest.mark.parametrize("case", list(BAD_POINTERS))
def test_bad_pointer_files_give_clear_errors(
    tmp_path: Path, saved_pointer: dict[str, Any], case: str
) -> None:
    mutate, error, pattern, pointer_only = BAD_POINTERS[case]
    path = write_pointer(tmp_path / "bad.json", mutate(dict(saved_pointer)))
    with pytest.raises(error, match=pattern):
        RolloutArchive(path)
    if pointer_only:  # check_metadata refuses it too, before reading anything else
        with pytest.raises(error, match=pattern):
            RolloutArchive.check_metadata(path, None)
    else:
        # The metadata check trusts the pointer's own metadata; without it, the catalog
        # is consulted and the same error surfaces.
        write_pointer(path, _without("metadata")(mutate(dict(saved_pointer))))
        with pytest.raises(error, match=pattern):
            RolloutArchive.check_metadata(path, None)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"not json {", "not JSON"),
        (b"", "not JSON"),
        (b"\xff\xfe\x00garbage", "cannot read pointer file"),
        (b"null", "not a JSON object"),
    ],
)
def test_unreadable_pointer_files(tmp_path: Path, content: bytes, pattern: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(UnsupportedFormatError, match=pattern):
        RolloutArchive(path)
    with pytest.raises(UnsupportedFormatError, match=pattern):
        RolloutArchive.check_metadata(path, None)


def test_missing_pointer_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RolloutArchive(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError):
        RolloutArchive.check_metadata(tmp_path / "nope.json", None)


def test_digest_mismatch_from_another_pool(tmp_path: Path, rollout) -> None:
    """Two pools hold an archive of the same name; a pointer is aimed at the wrong one."""
    one, two = tmp_path / "one" / "r.json", tmp_path / "two" / "r.json"
    RolloutArchive.save(one, rollout(3, seed=1), rollout_id=0)
    RolloutArchive.save(two, rollout(3, seed=2), rollout_id=0)
    crossed = read_pointer(one)
    crossed["archive"] = read_pointer(two)["archive"]
    crossed["pool_root"] = read_pointer(two)["pool_root"]
    with pytest.raises(MetadataError, match="replaced, or the pointer belongs to another pool"):
        RolloutArchive(write_pointer(tmp_path / "crossed.json", crossed))


# --------------------------------------------------------------------------- existing paths


def test_save_refuses_an_existing_path_and_saves_nothing(tmp_path: Path, rollout, snapshot) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "taken.json").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists"):
        RolloutArchive.save(run / "taken.json", rollout(3), rollout_id=0)
    assert (run / "taken.json").read_text() == "mine"
    assert not (run / "archive-pool").exists()  # not even a pool was made

    (run / "dangling.json").symlink_to(run / "nowhere")
    with pytest.raises(FileExistsError):
        RolloutArchive.save(run / "dangling.json", rollout(3), rollout_id=0)
    assert not (run / "nowhere").exists()

    RolloutArchive.save(run / "r.json", rollout(3), rollout_id=0)
    before = read_pointer(run / "r.json")
    with ArchiveManager.open(run / "archive-pool", create=False) as pool:
        state = snapshot(pool)
        with pytest.raises(FileExistsError):
            RolloutArchive.save(run / "r.json", rollout(3, seed=9), rollout_id=1)
        assert snapshot(pool) == state
    assert read_pointer(run / "r.json") == before


def test_pointer_appearing_during_save_releases_the_new_archive(
    tmp_path: Path, rollout, monkeypatch
) -> None:
    path = tmp_path / "r.json"
    real_save = ArchiveManager.save

    def save_then_collide(self, *args: Any, **kwargs: Any):
        arc = real_save(self, *args, **kwargs)
        path.write_text("another writer")
        return arc

    monkeypatch.setattr(ArchiveManager, "save", save_then_collide)
    with pytest.raises(FileExistsError, match="appeared while saving"):
        RolloutArchive.save(path, rollout(3), rollout_id=0)
    assert path.read_text() == "another writer"
    assert temp_files(tmp_path) == []
    with ArchiveManager.open(tmp_path / "archive-pool", create=False) as pool:
        assert pool.open_archive(archive_name_for(path)).state == "released"


def test_failed_pointer_write_releases_the_new_archive(
    tmp_path: Path, rollout, monkeypatch
) -> None:
    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    # The pool exists already: creating one links its identity file, which would fail first.
    ArchiveManager.open(tmp_path / "archive-pool").close()
    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(OSError, match="No space left"):
        RolloutArchive.save(tmp_path / "r.json", rollout(3), rollout_id=0)
    monkeypatch.undo()
    assert not (tmp_path / "r.json").exists()
    assert temp_files(tmp_path) == []
    with ArchiveManager.open(tmp_path / "archive-pool", create=False) as pool:
        assert pool.open_archive(archive_name_for(tmp_path / "r.json")).state == "released"


def test_pointer_file_is_readable_like_any_file_the_run_writes(tmp_path: Path, rollout) -> None:
    old = os.umask(0o022)
    try:
        RolloutArchive.save(tmp_path / "r.json", rollout(2), rollout_id=0)
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def race_to_save(path: Path, candidates: list[list]) -> list[Any]:
    """Two threads save ``candidates[0]`` and ``[1]`` to ``path`` at once: "won" or the error."""
    outcome: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def save(k: int) -> None:
        barrier.wait()
        try:
            RolloutArchive.save(path, candidates[k], rollout_id=0)
            outcome[k] = "won"
        except Exception as exc:
            outcome[k] = exc

    threads = [threading.Thread(target=save, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcome


def test_two_threads_saving_to_one_path(tmp_path: Path, rollout, same_samples) -> None:
    for attempt in range(3):
        run = tmp_path / f"run-{attempt}"  # a new pool each time: its creation races too
        candidates = [rollout(4, seed=20 + attempt * 2 + k) for k in range(2)]
        outcome = race_to_save(run / "rollout_0.json", candidates)
        assert outcome.count("won") == 1, outcome
        winner = outcome.index("won")
        assert isinstance(outcome[1 - winner], FileExistsError), outcome
        with RolloutArchive(run / "rollout_0.json") as arc:
            same_samples(arc.load_samples(), candidates[winner])
            assert [info.name for info in arc.pool.find(state=None)] == [arc.name]
        assert temp_files(run) == []


# --------------------------------------------------------------------------- archive names


def test_archive_names_of_awkward_paths(tmp_path: Path, monkeypatch) -> None:
    paths = [
        "/runs/my run/rollout 3.json",
        "/runs/my%20run/rollout 3.json",
        "/runs/my/run/rollout 3.json",
        "/runs/my%2Frun/rollout 3.json",
        "/runs/my\\run/rollout 3.json",
        "/runs/my\trun/rollout 3.json",
        "/runs/my\nrun/rollout 3.json",
        "/runs/a 00/r.json",
        "/runs/a\u2000/r.json",  # once "%2000", like "a 00"
        "/runs/a\u2028/r.json",
        "/runs/a 28/r.json",
        "/runs/a\u3000/r.json",
        "/runs/x..y/...json",
        "/runs/x.%2Ey/...json",
        "/runs/x/../..json",
        "/runs/x/ .json",
        "/runs/x/.json ",
        "/runs/データ/ロールアウト.json",
        os.fsdecode(b"/runs/\xff\xfe/r.json"),  # undecodable bytes in a file name
        os.fsdecode(b"/runs/\xc3/r.json"),
    ]
    names = [archive_name_for(p) for p in paths]
    assert len(set(names)) == len(paths)  # distinct paths, distinct names
    for path, name in zip(paths, names, strict=True):
        assert check_archive_name(name) == name
        assert ".." not in name and "/" not in name and " " not in name
        assert urllib.parse.unquote(name, errors="surrogatepass") == os.path.abspath(path)
    assert archive_name_for("/runs/x/../y.json") == archive_name_for("/runs/y.json")

    monkeypatch.chdir(tmp_path)
    assert archive_name_for("rollout.json") == archive_name_for(tmp_path / "rollout.json")
    assert archive_name_for(Path("~") / "r.json") == archive_name_for(Path.home() / "r.json")


def test_archive_names_of_very_long_paths() -> None:
    folder = "/" + "/".join(["ロールアウトのデータ" * 6] * 8)
    paths = [
        f"{folder}/rollout_3.json",
        f"{folder}/rollout_4.json",
        folder.replace("ロ", "ろ", 1) + "/rollout_3.json",  # differs only far from the end
        "/" + "é" * 300 + "/rollout_3.json",
        "/" + "\U0001f600" * 200,
    ]
    names = [archive_name_for(p) for p in paths]
    assert len(set(names)) == len(paths)
    for name in names:
        assert len(name.encode("utf-8")) <= 255
        assert check_archive_name(name) == name
    assert names[0].endswith(tuple("0123456789abcdef"))
    assert "rollout_3.json~" in names[0]  # the tail is kept, for people reading names


def test_long_pointer_names_save_and_load(tmp_path: Path, rollout, same_samples) -> None:
    deep = tmp_path
    for _ in range(4):
        deep = deep / ("ロールアウト" * 12)  # 216 bytes per folder
    path = deep / (("é" * 100) + ".json")  # a 205-byte file name
    samples = rollout(3)
    # NOTE: a shared pool: SQLite cannot open a catalog whose path passes 512 bytes, so the
    # default pool beside this pointer would fail (CatalogError).
    args = SimpleNamespace(archive_root=str(tmp_path / "pool"))
    with save_open(path, samples, rollout_id=0, args=args) as arc:
        assert len(arc.name.encode("utf-8")) <= 255
    with RolloutArchive(path) as arc:
        same_samples(arc.load_samples(), samples)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=18))
def test_archive_name_decodes_to_the_absolute_path(tail: str) -> None:
    """Short paths: the name percent-decodes to the absolute path, so it is injective."""
    path = "/r/" + tail
    name = archive_name_for(path)
    assert check_archive_name(name) == name
    assert urllib.parse.unquote(name, errors="surrogatepass") == os.path.abspath(Path(path))


# --------------------------------------------------------------------------- pointers are input


@pytest.fixture
def listener() -> Any:
    """A TCP socket listening on loopback that nobody should ever connect to."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def assert_never_connected(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        conn, _ = server.accept()
        conn.close()


def test_pointer_naming_a_server_catalog_never_gets_a_connection(
    tmp_path: Path, saved_pointer: dict[str, Any], listener: socket.socket, monkeypatch
) -> None:
    """A crafted pointer aims at a server the caller never configured, with the caller's
    ``$PGPASSWORD`` in reach: it is refused before any connection, in words that show no
    password, whatever else the caller configured."""
    port = listener.getsockname()[1]
    monkeypatch.setenv("PGPASSWORD", "hunter2-env")
    monkeypatch.setenv("ARCHIVE_MANAGER_BUSY_TIMEOUT_MS", "1000")  # old code: fail fast
    monkeypatch.delenv("ARCHIVE_MANAGER_CATALOG_URL", raising=False)
    evil = f"postgresql+psycopg://evil:hunter2-file@127.0.0.1:{port}/pool"
    v1 = {**saved_pointer, "version": 1, "catalog_url": evil}
    v2 = {**saved_pointer, "catalog": f"postgresql://evil@127.0.0.1:{port}/pool"}
    no_metadata = {k: v for k, v in v1.items() if k != "metadata"}
    ours = f"sqlite:///{tmp_path / 'archive-pool' / 'catalog.db'}"
    other_server = "postgresql+psycopg://me:mine@127.0.0.1:1/pool"
    for name, content in (("v1", v1), ("v2", v2), ("bare", no_metadata)):
        path = write_pointer(tmp_path / f"{name}.json", content)
        attempts: list[Callable[[], object]] = [
            partial(RolloutArchive, path),
            partial(RolloutArchive, path, catalog_url=ours),  # configured, but another
            partial(RolloutArchive, path, args=SimpleNamespace(archive_catalog_url=ours)),
            partial(RolloutArchive, path, catalog_url=other_server),
        ]
        if name == "bare":
            attempts.append(partial(RolloutArchive.check_metadata, path, None))
        for attempt in attempts:
            with pytest.raises(ForeignCatalogError, match=f"127.0.0.1:{port}") as info:
                attempt()
            assert_never_connected(listener)
            assert "hunter2" not in str(info.value) and "mine" not in str(info.value)
            assert "\n" not in str(info.value)
        # The environment's catalog is configuration too; another database is refused.
        monkeypatch.setenv("ARCHIVE_MANAGER_CATALOG_URL", other_server)
        with pytest.raises(ForeignCatalogError, match="not the configured") as info:
            RolloutArchive(path)
        assert "mine" not in str(info.value) and "hunter2" not in str(info.value)
        monkeypatch.delenv("ARCHIVE_MANAGER_CATALOG_URL")
    assert_never_connected(listener)
    # The pointer's own metadata needs no catalog at all.
    assert len(RolloutArchive.check_metadata(tmp_path / "v1.json", None)) == 3


def test_refusals_name_the_way_to_configure_the_catalog(
    tmp_path: Path, saved_pointer: dict[str, Any], monkeypatch
) -> None:
    monkeypatch.delenv("ARCHIVE_MANAGER_CATALOG_URL", raising=False)
    path = write_pointer(
        tmp_path / "p.json", {**saved_pointer, "catalog": "postgresql://team@db-host/rollouts"}
    )
    with pytest.raises(ForeignCatalogError) as info:
        RolloutArchive(path)
    message = str(info.value)
    assert "postgresql://team@db-host/rollouts" in message
    assert "catalog_url=" in message and "$ARCHIVE_MANAGER_CATALOG_URL" in message
    assert isinstance(info.value, CatalogError)


def _foreign_sqlite_files(folder: Path) -> dict[str, Path]:
    """A SQLite database of another program (rollback journal), one in WAL mode (closed), a
    text file and a FIFO, each named ``catalog.db`` in a folder of its own."""
    made: dict[str, Path] = {}
    for kind in ("rollback", "wal", "text", "fifo"):
        (folder / kind).mkdir(parents=True)
        made[kind] = path = folder / kind / "catalog.db"
        if kind == "text":
            path.write_text("not a database, but precious")
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            conn = sqlite3.connect(path)
            if kind == "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("CREATE TABLE accounts (name TEXT, balance INT)")
            conn.execute("INSERT INTO accounts VALUES ('alice', 10)")
            conn.commit()
            conn.close()
    return made


def _folder_state(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
        if not p.is_dir()
    }


def test_pointer_naming_a_foreign_sqlite_file_leaves_it_byte_identical(
    tmp_path: Path, saved_pointer: dict[str, Any]
) -> None:
    files = _foreign_sqlite_files(tmp_path / "theirs")
    before = _folder_state(tmp_path / "theirs")
    for kind, file in files.items():
        by_root = {**saved_pointer, "pool_root": str(file.parent)}
        by_url = {**saved_pointer, "catalog": f"sqlite:///{file}"}
        by_v1_url = {**saved_pointer, "version": 1, "catalog_url": f"sqlite:///{file}"}
        for n, content in enumerate((by_root, by_url, by_v1_url)):
            path = write_pointer(tmp_path / f"{kind}-{n}.json", content)
            with pytest.raises(ForeignCatalogError, match="not an archive_manager catalog"):
                RolloutArchive(path)
            bare = write_pointer(tmp_path / f"{kind}-{n}-bare.json", _without("metadata")(content))
            with pytest.raises(ForeignCatalogError, match="left untouched"):
                RolloutArchive.check_metadata(bare, None)
        # Asked directly, the pool API does not touch them either.
        assert ArchiveManager.exists(file.parent) is False
        assert ArchiveManager.catalog_status(file.parent).current is None
        with pytest.raises(PoolNotFoundError):
            ArchiveManager.open(file.parent, create=False)
        # Not even to create a pool in it (a file that is no SQLite file at all may be a
        # damaged catalog, and is named so).
        refusal = "not a usable SQLite" if kind == "text" else "not an archive_manager catalog"
        with pytest.raises(CatalogError, match=refusal):
            ArchiveManager.open(file.parent)
    assert _folder_state(tmp_path / "theirs") == before  # no byte changed, no -wal, no -shm


def test_caller_configuration_wins_over_the_pointer(tmp_path: Path, rollout, same_samples) -> None:
    samples = rollout(4, seed=3)
    RolloutArchive.save(tmp_path / "run" / "r.json", samples, rollout_id=0)
    pool = tmp_path / "run" / "archive-pool"
    moved = tmp_path / "moved"
    pool.rename(moved)
    # A crafted pool root in the pointer is ignored when the caller names the pool.
    pointer = read_pointer(tmp_path / "run" / "r.json")
    crafted = write_pointer(tmp_path / "crafted.json", {**pointer, "pool_root": "/nonexistent"})
    for how in (
        {"root": moved},
        {"args": SimpleNamespace(archive_root=str(moved))},
        {"root": moved, "catalog_url": f"sqlite:///{moved / 'catalog.db'}"},
        {"args": SimpleNamespace(archive_root=str(moved), archive_catalog_url=None)},
    ):
        with RolloutArchive(crafted, **how) as arc:
            assert arc.pool.root == moved.resolve()
            same_samples(arc.load_samples(), samples)
    args = SimpleNamespace(archive_root=str(moved))
    bare = write_pointer(tmp_path / "bare.json", _without("metadata")(pointer))
    assert len(RolloutArchive.check_metadata(bare, args)) == 4
    with pytest.raises(PoolNotFoundError, match="/nonexistent"):
        RolloutArchive(crafted)
    assert not Path("/nonexistent").exists()  # not made by opening


def test_version_1_pointers_still_open(tmp_path: Path, rollout, same_samples) -> None:
    samples = rollout(4, seed=5)
    (tmp_path / "elsewhere").mkdir()
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'catalog.db'}"
    args = SimpleNamespace(archive_root=str(tmp_path / "blobs"), archive_catalog_url=url)
    RolloutArchive.save(tmp_path / "a.json", samples, rollout_id=0)
    RolloutArchive.save(tmp_path / "b.json", samples, rollout_id=0, args=args)
    a, b = read_pointer(tmp_path / "a.json"), read_pointer(tmp_path / "b.json")
    assert a["version"] == b["version"] == POINTER_VERSION == 2
    old_a = write_pointer(tmp_path / "old-a.json", {**a, "version": 1})
    fields_b = {k: v for k, v in b.items() if k != "catalog"}
    old_b = write_pointer(tmp_path / "old-b.json", {**fields_b, "version": 1, "catalog_url": url})
    for path in (old_a, old_b):
        with RolloutArchive(path) as arc:
            same_samples(arc.load_samples(), samples)
            assert "catalog_url" not in arc.pointer
    with RolloutArchive(old_b, args=args) as arc:
        assert arc.pointer["catalog"] == url


# --------------------------------------------------------------------------- saving a path again


def _forget_pointer(path: Path, *, release: bool, collect: bool) -> None:
    with RolloutArchive(path) as arc:
        if release:
            arc.release()
        if collect:
            arc.pool.gc(grace=0)
    path.unlink()


def test_a_path_is_saved_again_after_its_archive_was_released(
    tmp_path: Path, rollout, same_samples
) -> None:
    path = tmp_path / "run" / "rollout_3.json"
    rounds = [rollout(4, seed=40 + k, rollout_id=3) for k in range(3)]
    names = []
    for k, samples in enumerate(rounds):
        with save_open(path, samples, rollout_id=3) as arc:
            names.append(arc.name)
            assert arc.name == archive_name_for(path, k + 1)
        assert read_pointer(path)["archive"] == names[-1]  # the pointer names the real one
        # Opening the pointer loads the newest archive, never a released one.
        with RolloutArchive(path) as arc:
            same_samples(arc.load_samples(), samples)
        assert RolloutArchive.check_metadata(path, None) == seed_view(
            [as_json(describe_sample(s)) for s in samples]
        )
        if k < len(rounds) - 1:
            _forget_pointer(path, release=True, collect=k == 0)  # collected, or not yet
    assert len(set(names)) == 3 and names[0] == archive_name_for(path)
    with ArchiveManager.open(tmp_path / "run" / "archive-pool", create=False) as pool:
        states = {info.name: info.state for info in pool.find(state=None)}
        assert states == {names[0]: "released", names[1]: "released", names[2]: "published"}
        with pytest.raises(ArchiveReleasedError):
            pool.open_archive(names[0]).load_samples()


def test_saving_over_a_deleted_pointer_of_a_published_archive_says_how(
    tmp_path: Path, rollout, same_samples, snapshot
) -> None:
    path = tmp_path / "run" / "rollout_3.json"
    RolloutArchive.save(path, rollout(4, seed=1), rollout_id=3)
    path.unlink()  # deleted without releasing: the archive is still published
    root = tmp_path / "run" / "archive-pool"
    with ArchiveManager.open(root, create=False) as pool:
        state = snapshot(pool)
        with pytest.raises(ArchiveExistsError, match="still published") as info:
            RolloutArchive.save(path, rollout(4, seed=2), rollout_id=3)
        assert snapshot(pool) == state
    assert isinstance(info.value, FileExistsError) and not path.exists()
    # The message holds the very command that makes the path usable again.
    message = str(info.value)
    command = message.split("release it (", 1)[1].split(", or Archive.release()", 1)[0]
    argv = shlex.split(command)
    assert argv[0] == "archive-manager"
    result = CliRunner().invoke(cli, [*argv[1:], "--yes"])
    assert result.exit_code == 0, result.output
    again = rollout(4, seed=2)
    with save_open(path, again, rollout_id=3) as arc:
        assert arc.name == archive_name_for(path, 2)
        same_samples(arc.load_samples(), again)


def test_archive_name_generations_never_collide_with_paths(tmp_path: Path) -> None:
    folder = "/" + "/".join(["ロールアウトのデータ" * 6] * 8)
    paths = ["/runs/r.json", "/runs/r.json%~2", "/runs/r.json%25~2", f"{folder}/r.json"]
    names = {archive_name_for(p, g) for p in paths for g in (1, 2, 3, 10, 12345)}
    assert len(names) == len(paths) * 5
    for name in names:
        assert check_archive_name(name) == name and len(name.encode("utf-8")) <= 255
    assert archive_name_for("/runs/r.json", 2) == archive_name_for("/runs/r.json") + "%~2"
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(InvalidInputError, match="generation"):
            archive_name_for("/runs/r.json", bad)  # type: ignore[arg-type]
