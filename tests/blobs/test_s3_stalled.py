"""An object store that accepts connections and stops answering (docs/architecture/object-stores.md,
"Blobs on an object store", Deadlines): every call gives up within its deadline with one clear
error, catalog-only verbs never ask the store, and a save waiting on it holds no catalog lock.

The stalling endpoint is in this process (`s3server.StallingEndpoint`); pools are made on the
session's real S3 server (`tests/s3server.py`), then reached through the staller.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s3 import no_secret, s3_prefix, s3_samples
from click.testing import CliRunner, Result
from s3server import S3Server, StallingEndpoint

from archive_manager import ArchiveManager
from archive_manager.blobs import s3 as s3mod
from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.cli import cli
from archive_manager.errors import (
    BlobStoreTimeoutError,
    InvalidInputError,
    ReadOnlyPoolError,
    TransientBlobStoreError,
)

DIGEST = "0123456789abcdef0123456789abcdef"


def _tries(message: str) -> int:
    found = re.search(r"\((\d+) tr(?:y|ies), ", message)
    assert found, message
    return int(found.group(1))


@pytest.fixture
def silent(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[StallingEndpoint]:
    """An endpoint that never answers, as the environment's endpoint (credentials kept)."""
    with StallingEndpoint() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.endpoint)
        yield endpoint


# --------------------------------------------------------------------------- the store


def test_every_call_gives_up_within_its_deadline(
    silent: StallingEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call stops trying once another try could end past its deadline (it was 5 tries
    of a 60 s read timeout: five minutes per call) and raises `BlobStoreTimeoutError`, a
    transient error and an OSError, naming the endpoint, the deadline and how to set it.
    Calls right after fail at once, without a request: a failed save's rollback or GC's
    next batch does not wait it out again."""
    monkeypatch.setenv(s3mod.DEADLINE_ENV, "1.5")
    with pytest.raises(BlobStoreTimeoutError) as info:
        S3BlobStore("some-bucket", "p")  # checks the bucket: one HEAD
    message = str(info.value)
    assert f"http://127.0.0.1:{silent.port} did not answer within the 1.5 s deadline" in message
    assert s3mod.DEADLINE_ENV in message and "\n" not in message
    assert isinstance(info.value, TransientBlobStoreError) and isinstance(info.value, OSError)
    no_secret(info.value)
    assert silent.connections == _tries(message) == 1  # a second try would not fit in 1.5 s

    # Tries that fit are made: 0.3 s to answer each, 5 s in all.
    store = S3BlobStore("some-bucket", "p", check_bucket=False, read_timeout=0.3, deadline=5)
    assert silent.connections == 1  # check_bucket=False: no request made
    with pytest.raises(BlobStoreTimeoutError, match="within the 5 s deadline") as info:
        store.has(DIGEST)
    tries = _tries(str(info.value))
    assert tries >= 2
    assert silent.connections == 1 + tries  # each try after a timeout on a new connection
    for call in (lambda: store.get(DIGEST), lambda: store.put(b"x" * 100)):
        with pytest.raises(BlobStoreTimeoutError, match="within the 5 s deadline"):
            call()
    assert silent.connections == 1 + tries


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf", "nan", "1e9"])
def test_a_bad_deadline_is_refused(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(s3mod.DEADLINE_ENV, value)
    with pytest.raises(
        InvalidInputError, match=re.escape(f"${s3mod.DEADLINE_ENV} must be")
    ) as info:
        S3BlobStore("some-bucket", "p", check_bucket=False)
    assert str(info.value).endswith(f"not {value!r}")  # the text given, not what parsing made
    monkeypatch.delenv(s3mod.DEADLINE_ENV)
    given: Any = value if value == "abc" else float(value)
    with pytest.raises(InvalidInputError, match="deadline must be"):
        S3BlobStore("some-bucket", "p", check_bucket=False, deadline=given)


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def saved(s3_env: S3Server, bucket: str, tmp_path: Path) -> tuple[str, str, Path]:
    """A pool on the real server holding archive ``a``, its catalog, and ``a`` exported."""
    root, url = f"s3://{bucket}/{s3_prefix()}", f"sqlite:///{tmp_path / 'catalog.db'}"
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8) as pool:
        pool.save("a", s3_samples(16), rollout_id=3)
        dump = pool.open_archive("a").export_pt(tmp_path / "a.pt")
    return root, url, dump


def _cli(root: str, url: str, *args: str, **env: str) -> Result:
    return CliRunner().invoke(cli, ["--root", root, "--catalog-url", url, *args], env=env)


def test_catalog_verbs_never_ask_a_store_that_does_not_answer(
    saved: tuple[str, str, Path], silent: StallingEndpoint
) -> None:
    """ls, show, keys, query, stats, owners, info, groups and prompts answer from the catalog
    with the store silent, and not one connection reaches it (each waited out the store's
    tries before: ~300 s)."""
    root, url, _ = saved
    for args in (
        ["ls"],
        ["ls", "--state", "all", "--json"],
        ["show", "a"],
        ["keys", "a"],
        ["query", "--limit", "3"],
        ["stats"],
        ["owners"],
        ["info"],
        ["groups", "a"],
        ["prompts", "--from", "3", "--to", "3"],
    ):
        result = _cli(root, url, *args)
        assert result.exit_code == 0, (args, result.output)
        if args[0] in ("ls", "show", "info", "owners"):
            assert "a" in result.stdout
    assert silent.connections == 0


def test_a_cli_save_to_a_store_that_does_not_answer_fails_in_one_line(
    saved: tuple[str, str, Path], silent: StallingEndpoint
) -> None:
    root, url, dump = saved
    result = _cli(root, url, "import-pt", str(dump), "--name", "b", ARCHIVE_MANAGER_S3_DEADLINE="1")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"127.0.0.1:{silent.port} did not answer within the 1 s deadline" in lines[0]
    assert "Traceback" not in result.output


def test_a_catalog_only_pool_refuses_writes(saved: tuple[str, str, Path]) -> None:
    root, url, _ = saved
    with ArchiveManager.open(root, catalog_url=url, catalog_only=True) as pool:
        assert pool.read_only and pool.identity is None
        assert [a.name for a in pool.find()] == ["a"]
        assert len(pool.open_archive("a").load_samples()) == 16  # a load reads its blobs
        for write in (
            lambda: pool.save("b", s3_samples(4), rollout_id=4),
            lambda: pool.retain("job:x", "a"),
            lambda: pool.gc(grace=0),
            lambda: pool.store.put(b"x" * 100),
        ):
            with pytest.raises(ReadOnlyPoolError, match="read the catalog only"):
                write()
    with pytest.raises(InvalidInputError, match="catalog_only"):
        ArchiveManager.open(root, catalog_url=url, catalog_only=True, read_only=False)


# --------------------------------------------------------------------------- a save waiting


def test_a_save_waiting_on_the_store_holds_no_catalog_lock(
    s3_env: S3Server, bucket: str, catalog_url: str
) -> None:
    """A deduplicating save looks for each blob it already has (a HEAD each); the store stops
    answering at the first look (after the save checked the pool's identity, a GET).  Meanwhile another writer begins a save and gives it up
    (catalog-only transactions) within a 300 ms busy timeout: the looks are made outside the
    catalog's transactions (they held its write lock, and every other writer met
    CatalogLockedError).  The waiting save then fails with the deadline's error, publishes
    nothing and frees its name: the same save through a store that answers succeeds."""
    samples = s3_samples(16)
    with StallingEndpoint(s3_env.endpoint) as proxy:
        root = f"s3://{bucket}/{s3_prefix()}"
        store = S3BlobStore.from_url(root, endpoint_url=proxy.endpoint, deadline=4)
        with (
            ArchiveManager.open(root, catalog_url=catalog_url, chunk_size=8, store=store) as pool,
            ArchiveManager.open(root, catalog_url=catalog_url, busy_timeout_ms=300) as other,
        ):
            pool.save("a", samples, rollout_id=1)
            proxy.stall_at(b"HEAD ")
            failure: list[BaseException] = []

            def save_again() -> None:
                try:
                    pool.save("b", samples, rollout_id=2)
                except BaseException as exc:  # the test reads it below
                    failure.append(exc)

            saver = threading.Thread(target=save_again)
            saver.start()
            try:
                assert proxy.asked.wait(60)  # the save waits on the store
                w = other.writer("c", rollout_id=3)  # a lease: one write transaction
                w.abort()  # its rollback: another
                assert saver.is_alive()  # still waiting on the store
            finally:
                saver.join()
            [error] = failure
            assert isinstance(error, BlobStoreTimeoutError), error
            assert f"{proxy.endpoint} did not answer within the 4 s deadline" in str(error)
            assert [a.name for a in other.find(state=None)] == ["a"]
            assert other.owners().saves == []  # its lease was dropped
            again = other.save("b", samples, rollout_id=2)  # `other` reaches the store
            assert [s.tokens for s in again.load_samples()] == [s.tokens for s in samples]
            assert other.verify(read_data=True).ok
