"""Two hosts, one pool, on a real distributed filesystem (issue 20;
docs/architecture/shared-pools.md, "Shared pools"): a JuiceFS volume mounted through FUSE in two
mount namespaces at the same path (tests/jfshosts.py), the catalog on the session's throwaway
PostgreSQL server.

* The dedup race across hosts: both hosts save the same content over and over (plain and
  streaming saves, some released at once, a verify after each) while a GC loop runs on one.
  The hosts mount with JuiceFS's default 1 s metadata caches, so a host may see a blob the
  other just rewrote as missing: the store's reads try again (docs/architecture/shared-pools.md,
  "Shared pools"); ``$ARCHIVE_MANAGER_JFS_CACHES=off`` mounts with the caches off instead.
* A host crash: host b publishes an archive, then dies (its processes frozen, its FUSE client
  SIGKILLed, its processes killed) part way through a streaming save; host a's GC past lease
  and grace then finds nothing published lost or changed, the dead host's save invisible,
  nothing left over and ``verify(read_data=True)`` clean.
* What FUSE does differently: a JuiceFS ``--read-only`` mount keeps the kernel's mount
  read-write and lets access(2) say "writable" (only each write fails with EROFS), so the
  pool detects it another way; a SQLite catalog on the mount is refused.

Without root, FUSE, ``juicefs``, ``unshare`` or ``nsenter`` these skip with the reason, or
fail where ``$ARCHIVE_MANAGER_REQUIRE_SHARING`` or ``$ARCHIVE_MANAGER_REQUIRE_JUICEFS`` is set
(``.ci/run`` sets them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jfshosts import REQUIRE_ENVS, Host, TwoHosts, TwoHostsUnavailable
from pgserver import PgServer

from archive_manager.blobs.local import DEFAULT_SHARED_READ_RETRY, READ_RETRY_ENV

WORKER = str(Path(__file__).parents[1] / "_host_worker.py")
SKEW = 3 * 3600.0  # host a's clock in the check: past every lease and the grace


@pytest.fixture
def hosts(pg_server: PgServer) -> Iterator[tuple[TwoHosts, str]]:
    """Two hosts mounting a fresh volume (metadata in a database of its own) and the URL of
    an empty catalog database; every mount and process is gone afterwards."""
    meta = pg_server.create_database()
    catalog = pg_server.create_database()
    meta_url = f"postgres://postgres@{pg_server.host}:{pg_server.port}/{meta.rsplit('/', 1)[1]}"
    try:
        made = TwoHosts.start(meta_url + "?sslmode=disable")
    except TwoHostsUnavailable as exc:
        pg_server.drop_database(meta)
        pg_server.drop_database(catalog)
        if any(os.environ.get(name) for name in REQUIRE_ENVS):
            pytest.fail(f"{exc} (and ${' or $'.join(REQUIRE_ENVS)} is set)")
        pytest.skip(str(exc))
    try:
        yield made, catalog
    finally:
        made.close()
        pg_server.drop_database(catalog)
        pg_server.drop_database(meta)


class Worker:
    """tests/_host_worker.py running on a host; its output read line by line."""

    def __init__(self, host: Host, *args: str) -> None:
        self.proc = host.python(
            WORKER,
            *args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def line(self) -> dict[str, Any]:
        """Its next JSON line (it must not have failed)."""
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            assert self.proc.stderr is not None
            raise AssertionError(f"worker ended ({self.proc.wait()}): {self.proc.stderr.read()[-3000:]}")  # fmt: skip
        return json.loads(text)  # type: ignore[no-any-return]

    def tell(self, value: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(value) + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        """Its last line, after a clean exit."""
        out = self.line()
        assert self.proc.wait(timeout=120) == 0
        return out


def assert_clean(check: dict[str, Any]) -> None:
    assert all(check["loaded"].values()), check
    assert all(check["absent"].values()), check
    assert check["again"] == [0, 0, 0], check
    assert check["leftovers"] == 0, check
    assert check["files_are_rows"], check
    assert check["temp_files"] == 0, check
    assert check["verify"] == [], check
    assert check["blobs_checked"] > 0, check


def test_identical_savers_on_both_hosts_race_a_gc_loop(hosts: tuple[TwoHosts, str]) -> None:
    volume, url = hosts
    root = str(volume.mount_point / "pool")
    a, b = volume["a"], volume["b"]
    gc = Worker(a, "gc-loop", root, url)
    gc.line()  # the pool exists: made once, as an operator would before starting jobs
    savers = [Worker(a, "save", root, url, "a", "4", "7"), Worker(b, "save", root, url, "b", "4", "7")]  # fmt: skip
    saved = [s.result() for s in savers]
    kept = {**saved[0]["kept"], **saved[1]["kept"]}
    assert len(kept) == 6 and len(set(kept.values())) == 1  # identical content, deduplicated
    gc.tell({"kept": kept, "absent": []})
    check = gc.result()
    assert check["runs"] > 1, check
    assert_clean(check)
    # The store found the root on FUSE and retries its reads there (the hosts keep JuiceFS's
    # default metadata caches unless $ARCHIVE_MANAGER_JFS_CACHES=off).
    expected = float(os.environ.get(READ_RETRY_ENV) or DEFAULT_SHARED_READ_RETRY)
    assert [out["read_retry"] for out in (*saved, check)] == [expected] * 3
    print(
        f"caches {'on' if volume.caches else 'off'}: reads that waited for a stale cache: "
        f"{[out['reads_retried'] for out in (*saved, check)]}"
    )


def test_a_blob_another_host_just_rewrote_is_read(hosts: tuple[TwoHosts, str]) -> None:
    """Host a reads a blob, host b removes and writes it again (GC, then a saver), host a
    reads it at once: through JuiceFS's 1 s entry cache it is missing (without retries every
    such read failed, 10 of 10); the store's retry reads it once the cache has expired."""
    volume, url = hosts
    root = str(volume.mount_point / "pool")
    a, b = Worker(volume["a"], "blobs", root, url), Worker(volume["b"], "blobs", root, url)

    def ask(worker: Worker, **cmd: Any) -> dict[str, Any]:
        worker.tell(cmd)
        return worker.line()

    unretried: list[dict[str, Any]] = []
    retried: list[dict[str, Any]] = []

    for i in range(3):
        for retry, outcomes in ((0.0, unretried), (None, retried)):
            data = f"round {i}, retry {retry} "
            assert ask(a, op="put", data=data)["ok"] and ask(a, op="read", data=data)["ok"]
            assert ask(b, op="rewrite", data=data)["ok"]
            outcomes.append(ask(a, op="read", data=data, retry=retry))
    for worker in (a, b):
        assert worker.proc.stdin is not None
        worker.proc.stdin.close()
        assert worker.proc.wait(timeout=60) == 0
    if volume.caches:
        # The stale cache is there (else this test shows nothing) ...
        assert any("is missing" in out.get("error", "") for out in unretried), unretried
    else:
        assert all(out.get("ok") for out in unretried), unretried
    # ... and the default bound gets past it, well within the bound.
    bound = float(os.environ.get(READ_RETRY_ENV) or DEFAULT_SHARED_READ_RETRY)
    assert all(out.get("ok") and out["s"] < bound for out in retried), retried
    print(f"stale reads without retry: {unretried}; with: {retried}")


def test_a_host_crash_mid_save_leaves_the_other_host_a_clean_pool(
    hosts: tuple[TwoHosts, str],
) -> None:
    volume, url = hosts
    root = str(volume.mount_point / "pool")
    a, b = volume["a"], volume["b"]
    survivor = Worker(a, "save-check", root, url, "a", "2", "3", str(SKEW))
    before = survivor.line()
    victim = Worker(b, "hold", root, url, "doomed", "11")
    published = victim.line()["fingerprint"]
    assert victim.line() == {}  # mid-save: chunks stored, the writer waiting
    b.crash()
    assert victim.proc.wait() == -9 and not b.alive
    survivor.tell(
        {
            "kept": {**before["kept"], "doomed-pub": published},
            "absent": ["doomed", *before["released"]],
        }
    )
    check = survivor.result()
    # The dead host's lease expired; the chunks it had stored were reclaimed.
    assert check["gc"]["expired_leases"] == 1 and check["gc"]["blobs"] > 0, check
    assert_clean(check)


READER = """
import json, os, sys
from archive_manager import ArchiveManager
from archive_manager.errors import ReadOnlyPoolError
root, url = sys.argv[1:]
out = {"access_says_writable": os.access(root, os.W_OK)}
with ArchiveManager.open(root, url, create=False) as pool:
    out["read_only"] = pool.read_only
    out["reason"] = pool.read_only_reason
    out["names"] = [a.name for a in pool.find()]
    out["loaded"] = len(pool.open_archive("a-0").load_samples())
    try:
        pool.save("x", [{"k": 1}], rollout_id=0)
    except ReadOnlyPoolError as exc:
        out["save"] = str(exc)
print(json.dumps(out))
"""


def test_fuse_read_only_mount_is_detected_and_sqlite_refused(
    hosts: tuple[TwoHosts, str],
) -> None:
    volume, url = hosts
    root = str(volume.mount_point / "pool")
    saved = Worker(volume["a"], "save", root, url, "a", "1", "5", "refuse-sqlite").result()
    assert "fuse.juicefs" in saved["sqlite"] and "refusing" in saved["sqlite"], saved
    reader = volume.mount("r", "--read-only")
    done = reader.run([sys.executable, "-c", READER, root, url])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # What makes such a client different: the kernel's mount is read-write, access(2) says
    # "writable"; without the library's probe the save below failed half-way with EROFS.
    assert out["access_says_writable"] is True
    assert out["read_only"] is True and "read-only mount" in out["reason"], out
    assert out["names"] == ["a-0"] and out["loaded"] == 10
    assert "read-only" in out["save"]
