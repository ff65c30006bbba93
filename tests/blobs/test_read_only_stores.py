"""The read-only gate of a pool's store (`AbstractBlobStore.read_only_view`, on a folder and
on S3; docs/architecture/shared-pools.md "Shared pools"), against a real S3 server (`tests/s3server.py`):
every public path of a read-only pool, in process and through the CLI, writes nothing (the
bucket's keys, ETags and multipart uploads and the catalog's bytes compared before and after);
`put_new` is refused; the view leaves the caller's store writable, and a writable open refuses
a reader's store; one wording for the refusal.  (The view of each store alone is held by the
contract suite, `ReadOnlyStoreContract`.)
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _s3 import s3_prefix, s3_root, s3_samples
from s3server import S3Server

from archive_manager import ArchiveManager
from archive_manager.blobs import AbstractBlobStore, ReadOnlyView
from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.errors import ArchiveError, InvalidInputError, ReadOnlyPoolError

REPO = str(Path(__file__).resolve().parents[2])

# Every S3 operation that changes a bucket.
_MUTATING = (
    "PutObject",
    "CopyObject",
    "DeleteObject",
    "DeleteObjects",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "PutObjectTagging",
    "PutObjectAcl",
)


@dataclass
class _Pool:
    root: str
    prefix: str
    url: str
    catalog: Path
    pending_upload: str  # the id of a multipart upload a killed writer left


def _snapshot(server: S3Server, bucket: str, pool: _Pool) -> tuple[Any, ...]:
    client: Any = server.client()
    objects = {
        item["Key"]: item["ETag"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=pool.prefix
        )
        for item in page.get("Contents", ())
    }
    uploads = sorted(
        (u["Key"], u["UploadId"])
        for u in client.list_multipart_uploads(Bucket=bucket, Prefix=pool.prefix).get("Uploads", ())
    )
    folder = pool.catalog.parent
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    return objects, uploads, files


def _record_writes(store: AbstractBlobStore) -> list[str]:
    """The mutating requests sent through the client of ``store`` (an S3 store, or a read-only
    view of one)."""
    shown = store.store if isinstance(store, ReadOnlyView) else store
    assert isinstance(shown, S3BlobStore)
    sent: list[str] = []
    for op in _MUTATING:
        shown._client.meta.events.register(
            f"before-call.s3.{op}", lambda op=op, **_: sent.append(op)
        )
    return sent


@pytest.fixture
def s3_pool(s3_env: S3Server, bucket: str, tmp_path: Path) -> Iterator[_Pool]:
    """A pool on S3 with two archives (one released, so GC has blobs to take), an owner, a
    journal, and a multipart upload left under ``blobs/`` by a killed writer."""
    prefix = s3_prefix()
    root = f"s3://{bucket}/{prefix}"
    folder = tmp_path / "cat"
    folder.mkdir()
    catalog = folder / "catalog.db"
    url = f"sqlite:///{catalog}"
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
        pool.save("a", s3_samples(8), rollout_id=0)
        pool.save("b", s3_samples(12)[4:], rollout_id=1)
        pool.retain("job:x", "a")
        pool.open_archive("b").release()
        chunk = pool.open_archive("a").chunks()[0]["digest"]
    client: Any = s3_env.client()
    key = f"{prefix}/blobs/{chunk[:2]}/{chunk[2:4]}/{chunk}"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    yield _Pool(root, prefix, url, catalog, upload)


# --------------------------------------------------------------------------- in process


def _stream(pool: ArchiveManager) -> None:
    with pool.writer("d", rollout_id=3) as writer:
        for sample in s3_samples(4):
            writer.add(sample)


def _every_public_path(pool: ArchiveManager, tmp: Path) -> list[tuple[str, BaseException]]:
    """Call every public read and write of ``pool``; the errors, by call."""
    archive = pool.open_archive("a")
    chunk = archive.chunks()[0]["digest"]
    upload = pool.store.incomplete_writes()
    (tmp / "out").mkdir(exist_ok=True)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("find", lambda: pool.find()),
        ("info", lambda: pool.info()),
        ("query", lambda: pool.query()),
        ("stats", lambda: pool.stats()),
        ("groups", lambda: pool.groups("a")),
        ("owners", lambda: pool.owners()),
        ("release_plan", lambda: pool.release_plan(owner="job:x")),
        ("payload_reclaimed", lambda: pool.payload_reclaimed(["a", "b"])),
        ("verify", lambda: pool.verify(read_data=True)),
        ("gc dry-run", lambda: pool.gc(grace=0, dry_run=True)),
        ("release dry-run", lambda: pool.release(["a"], dry_run=True)),
        ("export parquet", lambda: pool.export("a", tmp / "out" / "a.parquet")),
        ("export jsonl", lambda: pool.export("a", tmp / "out" / "a.jsonl")),
        ("export_many", lambda: pool.export_many(tmp / "out" / "many", format="jsonl")),
        ("arrow_reader", lambda: pool.arrow_reader().read_all()),
        ("load_samples", lambda: archive.load_samples()),
        ("iter_samples", lambda: list(archive.iter_samples())),
        ("keys", lambda: archive.keys()),
        ("owners of a", lambda: archive.owners()),
        ("store.get", lambda: pool.store.get(chunk)),
        ("store.check", lambda: pool.store.check(chunk)),
        ("store.stat", lambda: pool.store.stat(chunk)),
        ("store.read_head", lambda: pool.store.read_head(chunk, 4)),
        ("store.iter_stat", lambda: list(pool.store.iter_stat())),
        ("journal.entries", lambda: pool.journal.entries()),
        ("journal.strays", lambda: pool.journal.strays()),
        ("root.list", lambda: pool.root.list("journal")),  # type: ignore[attr-defined]
        ("root.read", lambda: pool.root.read("archive-pool.json")),  # type: ignore[attr-defined]
        # Writes: each must be refused.
        ("save", lambda: pool.save("c", s3_samples(4), rollout_id=2)),
        ("writer", lambda: _stream(pool)),
        ("release", lambda: pool.release(["a"])),
        ("archive.release", lambda: archive.release()),
        ("retain", lambda: pool.retain("job:y", "a")),
        ("release_owner", lambda: pool.release_owner("job:x")),
        ("forget", lambda: pool.forget(keep_last=1)),
        ("forget dry-run", lambda: pool.forget(keep_last=1, dry_run=True)),
        ("gc", lambda: pool.gc(grace=0)),
        ("rebuild_catalog", lambda: pool.rebuild_catalog()),
        ("import_table", lambda: pool.import_table(tmp / "out" / "a.parquet", name="imp")),
        ("share_with_group", lambda: pool.share_with_group(0)),
        ("store.put", lambda: pool.store.put(b"p" * 64)),
        ("store.put_new", lambda: pool.store.put_new([(b"q" * 64, None)])),
        ("store.delete_many", lambda: pool.store.delete_many(iter([chunk]))),
        ("store.sweep", lambda: pool.store.sweep_incomplete(time.time() + 3600)),
        *[
            (f"store.remove_incomplete {w.name}", lambda w=w: pool.store.remove_incomplete(w))
            for w in upload
        ],
        ("journal.quarantine", lambda: pool.journal.quarantine([pool.journal.entries()[0].name])),
        ("journal.remove", lambda: pool.journal.remove(pool.journal.entries())),
        ("root.write", lambda: pool.root.write("journal/z.rec", b"{}", exclusive=True)),  # type: ignore[attr-defined]
    ]
    errors: list[tuple[str, BaseException]] = []
    for name, call in calls:
        try:
            call()
        except (ArchiveError, TypeError, OSError) as exc:
            errors.append((name, exc))
    return errors


@pytest.mark.parametrize("how", ["read_only=True", "store passed in, read_only=True"])
def test_every_public_path_of_a_read_only_s3_pool_writes_nothing(
    s3_env: S3Server, bucket: str, s3_pool: _Pool, tmp_path: Path, how: str
) -> None:
    before = _snapshot(s3_env, bucket, s3_pool)
    store = S3BlobStore.from_url(s3_pool.root) if "store" in how else None
    with ArchiveManager.open(
        s3_pool.root, catalog_url=s3_pool.url, read_only=True, store=store
    ) as pool:
        sent = _record_writes(pool.store)
        errors = _every_public_path(pool, tmp_path)
    assert sent == []
    assert _snapshot(s3_env, bucket, s3_pool) == before
    refused = {name for name, exc in errors if isinstance(exc, ReadOnlyPoolError)}
    others = [(name, exc) for name, exc in errors if not isinstance(exc, ReadOnlyPoolError)]
    # Only the share may fail otherwise (an object store has no group bits); every read
    # answered.
    assert all(name == "share_with_group" for name, _ in others), others
    for write in (
        "save",
        "writer",
        "release",
        "archive.release",
        "retain",
        "release_owner",
        "gc",
        "rebuild_catalog",
        "import_table",
        "store.put",
        "store.put_new",
        "store.delete_many",
        "store.sweep",
        "journal.quarantine",
        "journal.remove",
        "root.write",
    ):
        assert write in refused, (write, errors)
    assert {n for n in refused if n.startswith("store.remove_incomplete")}
    if store is not None:
        # The caller's store was not made read-only by the open.
        digest = store.put(b"mine" * 16)
        assert store.delete(digest)


# --------------------------------------------------------------------------- the CLI

# Run in a child: every verb through click's runner (one interpreter for all), and, as a
# hostile user would, direct writes through pool.store and pool.root (of a default open,
# read_only=None, without --read-only: read-only only if the catalog is found unwritable).
_CHILD = r"""
import json, sys, time
from click.testing import CliRunner
from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import ReadOnlyPoolError

root, url, out, flag = sys.argv[1:5]
base = ["--root", root, "--catalog-url", url] + ([flag] if flag else [])
verbs = [
    ["ls"], ["info"], ["show", "a"], ["keys", "a"], ["sample", "a", "--position", "0"],
    ["groups", "a"], ["stats"], ["owners"], ["query"], ["prompts", "--from", "0", "--to", "1"],
    ["grep", "x"],
    ["verify", "--read-data"], ["gc", "--dry-run", "--grace", "0"],
    ["forget", "--keep-last", "1", "--dry-run"], ["release-owner", "job:x", "--dry-run"],
    ["export", "a", out + "/a.jsonl"], ["db", "current"],
    ["init"], ["gc", "-y", "--grace", "0"], ["release", "a", "-y"], ["retain", "job:y", "a"],
    ["release-owner", "job:x", "-y"], ["forget", "--keep-last", "1", "-y"],
    ["rebuild-catalog", "-y"], ["rebind", "-y"], ["import", out + "/a.jsonl", "--name", "c"],
    ["db", "upgrade"],
]
results = {}
for verb in verbs:
    done = CliRunner().invoke(cli, base + verb, catch_exceptions=True)
    results[" ".join(verb).replace(out, "OUT")] = [done.exit_code, done.output[-400:], repr(done.exception)]
hostile = {}
with ArchiveManager.open(root, url, read_only=True if flag else None) as pool:
    hostile["read_only"] = [pool.read_only, pool.read_only_reason]
    for name, call in (
        ("put_new", lambda: pool.store.put_new([(b"h" * 64, None)])),
        ("sweep", lambda: pool.store.sweep_incomplete(time.time() + 3600)),
        ("root.write", lambda: pool.root.write("journal/h.rec", b"{}")),
    ):
        try:
            call()
            hostile[name] = "done"
        except ReadOnlyPoolError as exc:
            hostile[name] = "refused: " + str(exc)
json.dump({"cli": results, "hostile": hostile}, sys.stdout)
"""

_READS = (
    "ls", "info", "show a", "keys a", "sample a --position 0", "groups a", "stats",
    "owners", "query", "prompts --from 0 --to 1", "grep x", "export a OUT/a.jsonl", "db current",
    "verify --read-data", "gc --dry-run --grace 0",
    "forget --keep-last 1 --dry-run", "release-owner job:x --dry-run",
)  # fmt: skip
_WRITES = (
    "init", "gc -y --grace 0", "release a -y", "retain job:y a", "release-owner job:x -y",
    "rebuild-catalog -y", "rebind -y", "import OUT/a.jsonl --name c",
)  # fmt: skip


def _run_child(server: S3Server, pool: _Pool, out: Path, *, flag: str, mount: bool) -> Any:
    import json

    from _sharing import child_env, read_only_mount_command, require_mount_namespace

    command = [sys.executable, "-c", _CHILD, pool.root, pool.url, str(out), flag]
    if mount:
        require_mount_namespace()
        folder = pool.catalog.parent
        command = read_only_mount_command(folder, folder, command)
    done = subprocess.run(
        command,
        env=child_env(**server.env(), PYTHONPYCACHEPREFIX="/tmp/pyc-read-only-child"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "how", ["--read-only", "catalog folder on a read-only mount", "both"]
)  # fmt: skip
def test_the_cli_on_a_read_only_s3_pool_writes_nothing(
    s3_env: S3Server, bucket: str, s3_pool: _Pool, tmp_path: Path, how: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = _snapshot(s3_env, bucket, s3_pool)
    found = _run_child(
        s3_env,
        s3_pool,
        out,
        flag="" if how.startswith("catalog") else "--read-only",
        mount=how != "--read-only",
    )
    assert _snapshot(s3_env, bucket, s3_pool) == before
    cli = found["cli"]
    for verb in _READS:
        assert cli[verb][0] == 0, (verb, cli[verb])
    for verb in _WRITES:
        code, output, _ = cli[verb]
        assert code != 0 and "Traceback" not in output, (verb, cli[verb])
        # rebind is refused on every pool on S3, before the read-only check.
        assert "read-only" in output or verb == "rebind -y", (verb, output)
    hostile = found["hostile"]
    assert hostile["read_only"][0] is True
    for name in ("put_new", "sweep", "root.write"):
        assert hostile[name].startswith("refused: "), (name, hostile)


# --------------------------------------------------------------------------- PostgreSQL reader


def test_a_postgresql_reader_role_on_s3_writes_nothing_to_the_bucket(
    s3_env: S3Server, bucket: str, pg_server: Any, tmp_path: Path
) -> None:
    # A role without INSERT/UPDATE/DELETE, opened without read_only (and with read_only=False):
    # the catalog is found read-only, so the store and the root refuse too.  Its password
    # (ignored by the test server's trust auth) must not reach a refusal.
    import psycopg

    role = f"reader_{os.urandom(4).hex()}"
    owner_url = pg_server.create_database()
    database = owner_url.rsplit("/", 1)[-1]
    root = f"s3://{bucket}/{s3_prefix()}"
    prefix = root.split("/", 3)[3]
    pool_files = _Pool(root, prefix, owner_url, tmp_path / "none", "")
    (tmp_path / "none").mkdir()
    try:
        with ArchiveManager.open(root, owner_url, chunk_size=4) as pool:
            pool.save("a", s3_samples(8), rollout_id=0)
        with psycopg.connect(
            host=pg_server.host, port=pg_server.port, user="postgres", dbname=database,
            autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'hunter2-secret'")  # type: ignore[arg-type]
            conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')  # type: ignore[arg-type]
            conn.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')  # type: ignore[arg-type]
            conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')  # type: ignore[arg-type]
        url = owner_url.replace("://postgres@", f"://{role}:hunter2-secret@")
        before = _snapshot(s3_env, bucket, pool_files)
        for read_only in (None, False):
            with ArchiveManager.open(root, url, read_only=read_only) as pool:
                assert pool.read_only, read_only
                sent = _record_writes(pool.store)
                assert len(pool.open_archive("a").load_samples()) == 8
                assert pool.verify(read_data=True).ok
                messages = []
                for write in (
                    lambda: pool.save("b", s3_samples(4), rollout_id=1),
                    lambda: pool.store.put_new([(b"r" * 64, None)]),
                    lambda: pool.store.sweep_incomplete(time.time() + 3600),
                    lambda: pool.root.write("journal/r.rec", b"{}"),  # type: ignore[attr-defined]
                ):
                    with pytest.raises(ReadOnlyPoolError) as caught:
                        write()
                    messages.append(str(caught.value))
                assert sent == []
                for message in messages:
                    assert "hunter2" not in message and s3_env.endpoint not in message, message
        assert _snapshot(s3_env, bucket, pool_files) == before
    finally:
        pg_server.drop_database(owner_url)
        with psycopg.connect(
            host=pg_server.host, port=pg_server.port, user="postgres", dbname="postgres",
            autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')  # type: ignore[arg-type]


# --------------------------------------------------------------------------- copies


def test_the_read_only_view_of_an_s3_store_sends_no_write(s3_env: S3Server, bucket: str) -> None:
    store = S3BlobStore(bucket, s3_prefix())
    sent = _record_writes(store)
    view = store.read_only_view("a test", where=store.url)
    # The original writes, the view refuses before any request, in either order.
    with pytest.raises(ReadOnlyPoolError, match=rf"{store.url} is read-only here \(a test\)"):
        view.put(b"v" * 64)
    assert sent == []
    digest = store.put(b"v" * 64)
    sent.clear()
    for write in (
        lambda: view.delete(digest),
        lambda: view.put_many([(b"w" * 64, None)] * 3, workers=3),
        lambda: view.sweep_incomplete(time.time() + 3600),
        lambda: view.pool_root().write("note", b"x"),
        lambda: copy.copy(view).put(b"x" * 64),  # a shallow copy, as a caller might make
    ):
        with pytest.raises(ReadOnlyPoolError):
            write()
    assert sent == []
    # Reads go through the store's own client and settings.
    assert view.get(digest) == store.get(digest) == b"v" * 64
    assert (view.url, view.bucket, view.deadline) == (store.url, store.bucket, store.deadline)
    assert store.delete(digest)
    assert store.pool_root().write("note", b"x") and store.pool_root().delete("note")
    # The root a catalog records elsewhere (`S3Root.other`, read to see whether the pool is
    # still there) is only looked at, from the store and from its view.
    elsewhere = f"s3://{bucket}/{s3_prefix()}"
    S3BlobStore.from_url(elsewhere).pool_root().write("archive-pool.json", b"{}")
    sent.clear()
    for other in (store.pool_root().other(elsewhere), view.pool_root().other(elsewhere)):
        assert str(other) == elsewhere and other.read("archive-pool.json") == b"{}"
        with pytest.raises(ReadOnlyPoolError, match="another root, only looked at"):
            other.write("archive-pool.json", b"changed")
        with pytest.raises(ReadOnlyPoolError):
            other.delete("archive-pool.json")
    assert sent == []


# --------------------------------------------------------------------------- filesystem


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("given", [False, True], ids=["own store", "store passed in"])
def test_a_read_only_filesystem_pool_writes_nothing_through_its_store(
    tmp_path: Path, given: bool
) -> None:
    # Break (store passed in), fixed: the filesystem reader used a caller's store as it was,
    # so pool.store deleted a published archive's chunk and swept a live writer's temp file,
    # though the open was read_only=True.  Now seen through its read-only view.
    from archive_manager.blobs import BlobStore

    with ArchiveManager.open(tmp_path, chunk_size=4) as pool:
        pool.save("a", s3_samples(8), rollout_id=0)
        chunk = pool.open_archive("a").chunks()[0]["digest"]
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "tmp" / f"{chunk}.1.live.tmp").write_bytes(b"a live writer's")
    before = _files(tmp_path)
    store = BlobStore(tmp_path) if given else None
    with ArchiveManager.open(tmp_path, read_only=True, store=store) as pool:
        for write in (
            lambda: pool.store.put(b"f" * 64),
            lambda: pool.store.put_many([(b"g" * 64, None)]),
            lambda: pool.store.put_new([(b"h" * 64, None)]),
            lambda: pool.store.delete(chunk),
            lambda: pool.store.delete_many([chunk]),
            lambda: pool.store.sweep_incomplete(time.time() + 3600),
            lambda: [pool.store.remove_incomplete(w) for w in pool.store.incomplete_writes()],
        ):
            with pytest.raises(ReadOnlyPoolError, match="nothing was changed"):
                write()
        # The folder store's own removal is refused, or not offered through the view.
        with pytest.raises((ReadOnlyPoolError, AttributeError)):
            pool.store.remove_temp(tmp_path / "tmp" / f"{chunk}.1.live.tmp")  # type: ignore[attr-defined]
        # Reads answer as before, the folder store's reading extras included.
        assert pool.store.path(chunk).is_file()  # type: ignore[attr-defined]
        assert pool.store.has(chunk) and pool.store.get(chunk)
        assert pool.store.capabilities.local_paths
        assert len(pool.open_archive("a").load_samples()) == 8
        assert pool.verify(read_data=True).ok
    assert _files(tmp_path) == before
    if store is not None:
        digest = store.put(b"mine" * 16)  # the caller's store stays writable
        assert store.delete(digest)


# --------------------------------------------------------------------------- a reader's store reused


def test_a_readers_s3_store_reused_for_a_writable_open_is_refused_at_the_open(
    s3_env: S3Server, bucket: str, s3_pool: _Pool
) -> None:
    # Break, fixed: a busy engineer keeps reader.store and opens a writer with it; the open
    # succeeded as a writable pool (read_only False) whose saves began in the catalog, then
    # failed at the store with "the pool ... is read-only here ... nothing was changed".
    with ArchiveManager.open(s3_pool.root, s3_pool.url, read_only=True) as reader:
        kept = reader.store
    before = _snapshot(s3_env, bucket, s3_pool)
    for read_only in (None, False):
        with pytest.raises(InvalidInputError, match=r"refuses writes .*read_only=True"):
            ArchiveManager.open(s3_pool.root, s3_pool.url, store=kept, read_only=read_only)
    assert _snapshot(s3_env, bucket, s3_pool) == before
    # As a reader's store it serves again.
    with ArchiveManager.open(s3_pool.root, s3_pool.url, store=kept, read_only=True) as again:
        assert again.read_only and len(again.open_archive("a").load_samples()) == 8
    assert _snapshot(s3_env, bucket, s3_pool) == before


def test_a_readers_folder_store_reused_for_a_writable_open_is_refused(tmp_path: Path) -> None:
    from archive_manager.blobs import BlobStore

    with ArchiveManager.open(tmp_path, chunk_size=4) as pool:
        pool.save("a", s3_samples(8), rollout_id=0)
    for given in (None, BlobStore(tmp_path)):
        with ArchiveManager.open(tmp_path, read_only=True, store=given) as reader:
            kept = reader.store
        before = _files(tmp_path)
        with pytest.raises(InvalidInputError, match="refuses writes"):
            ArchiveManager.open(tmp_path, store=kept)
        assert _files(tmp_path) == before


def test_a_read_only_store_refuses_put_new(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path, chunk_size=8) as pool:
        pool.save("a", s3_samples(8), rollout_id=0)
    before = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    with ArchiveManager.open(tmp_path, read_only=True) as pool, pytest.raises(ReadOnlyPoolError):
        pool.store.put_new([(b"x" * 100, None)])
    after = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    assert after == before


# Fixed: the read-only view, the second gate a read-only open puts on pool.store.
def test_a_read_only_s3_pool_refuses_put_new(s3_env: S3Server, bucket: str, tmp_path: Path) -> None:
    root, url = s3_root(bucket), _sqlite(tmp_path)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8) as pool:
        pool.save("a", s3_samples(8), rollout_id=0)
        before = sorted(pool.store.iter_digests())
    with ArchiveManager.open(root, catalog_url=url, read_only=True) as pool:
        try:
            with pytest.raises(ReadOnlyPoolError):
                pool.store.put_new([(b"x" * 100, None)])
        finally:
            assert sorted(pool.store.iter_digests()) == before


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"
