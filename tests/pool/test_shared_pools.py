"""Many users, one pool (issue 21; docs/architecture/shared-pools.md, "Shared pools"): read-only
readers and group-shared writers.

* A pool opened read-only (asked for, or detected: a read-only mount, no write permission, a
  PostgreSQL role that may only read) answers every read and writes nothing, not a byte;
  every write fails at once with `ReadOnlyPoolError`.
* On a real read-only bind mount (a private mount namespace), every read verb and API call
  runs in a subprocess and the pool's folder is byte-for-byte the same afterwards; with a
  writer active on the writable side, the reader sees its new commits.
* PostgreSQL: the GRANTs of docs/shared-pools.md for a reader and a writer role, on a real server.
* Two throwaway accounts of one group both save into, release from and collect one pool set up
  by ``archive-manager init --shared-group``; ``verify`` names what would lock one out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sharing import (
    WORKTREE,
    as_user_prefix,
    blocking_ancestors,
    child_env,
    read_only_mount_command,
    require_mount_namespace,
    require_users,
    throwaway_users,
    tree,
)
from click.testing import CliRunner
from helpers import TINY_ROLLOUT, Backend, assert_loads, open_on, snapshot_pool, tiny_rollout
from sqlalchemy import select

from archive_manager import ArchiveManager, RolloutArchive
from archive_manager._util.permissions import FOLDER_BITS, shared_problems
from archive_manager.catalog import archives_table
from archive_manager.cli import cli
from archive_manager.errors import (
    CatalogError,
    InvalidInputError,
    PoolNotFoundError,
    ReadOnlyPoolError,
)
from archive_manager.interop.synthetic import make_rollout

READER = Path(__file__).parents[1] / "_read_only_reader.py"


def rollout(seed: int, n: int = 6) -> list[Any]:
    return make_rollout(n, seed=seed, **TINY_ROLLOUT)  # type: ignore[arg-type]


def fill(pool: ArchiveManager) -> None:
    """Two archives, one retained by an external owner."""
    pool.save("first", rollout(1), rollout_id=1)
    pool.save("second", rollout(2), rollout_id=2)
    pool.retain("checkpoint:keep", "first")


def side_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("catalog.db-"))


# --------------------------------------------------------------------------- the API


def test_a_read_only_pool_reads_everything_and_refuses_every_write(
    tmp_path: Path, backend: Backend
) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        fill(pool)
    before = tree(root)
    assert side_files(root) == []
    with open_on(backend, root, read_only=True, create=False) as reader:
        assert reader.read_only and reader.read_only_reason == "it was opened read-only"
        state = snapshot_pool(reader)
        assert [i.name for i in reader.find()] == ["first", "second"]
        arc = reader.open_archive("first")
        assert len(arc.load_samples()) == 6 and len(arc.sample_metadata()) == 6
        assert reader.verify(read_data=True).ok
        assert reader.gc(dry_run=True).blobs == 0
        writes = [
            lambda: reader.save("new", rollout(3), rollout_id=3),
            lambda: reader.writer("new", rollout_id=3),
            lambda: reader.open_archive("second").release(),
            lambda: reader.retain("checkpoint:other", "first"),
            lambda: reader.release_owner("checkpoint:keep"),
            lambda: reader.gc(grace=0),
            lambda: reader.rebuild_catalog(),
            lambda: reader.import_pt(tmp_path / "absent.pt"),
            lambda: reader.share_with_group(os.getgid()),
            lambda: reader.store.put(b"bytes"),
            lambda: reader.store.delete("0" * 32),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyPoolError, match="read-only here"):
                write()
        assert snapshot_pool(reader) == state
    # Not a byte changed: no -wal/-shm, no temp file, no identity rewrite, no catalog row.
    assert tree(root) == before


def test_a_read_only_open_creates_nothing_and_refuses_what_writes(tmp_path: Path) -> None:
    empty = tmp_path / "nothing"
    with pytest.raises(PoolNotFoundError, match="never creates"):
        ArchiveManager.open(empty, read_only=True)
    assert not empty.exists()
    root = tmp_path / "pool"
    ArchiveManager.open(root).close()
    with pytest.raises(ReadOnlyPoolError, match="recover"):
        ArchiveManager.open(root, read_only=True, recover=True)
    with pytest.raises(ReadOnlyPoolError, match="rebind"):
        ArchiveManager.open(root, read_only=True, rebind=True)
    with pytest.raises(InvalidInputError, match="read_only"):
        ArchiveManager.open(root, read_only="yes")  # type: ignore[arg-type]


def test_init_in_a_folder_this_process_may_not_write_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`archive-manager --root D init` on an existing folder the user may not write (chmod
    555, another account) said "no pool at D (...); create one with 'archive-manager init'":
    the open saw the folder unwritable, went read-only, and a reader never creates.  Root is
    not stopped by permission bits: access(2) is made to answer "no" for the folder."""
    root = tmp_path / "rodir"
    root.mkdir()
    real_access = os.access

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if Path(path) == root and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    result = CliRunner().invoke(cli, ["--root", str(root), "init"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot create a pool at {root}: this process may not write {root}"
    ]
    with pytest.raises(ReadOnlyPoolError, match="cannot create a pool"):
        ArchiveManager.open(root)
    assert list(root.iterdir()) == []
    # A verb that only reads still says there is no pool, and how to make one.
    result = CliRunner().invoke(cli, ["--root", str(root), "ls"])
    assert "no pool at" in result.stderr and "archive-manager init" in result.stderr


def test_a_catalog_file_this_process_may_not_write_opens_read_only(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    # Root is not stopped by permission bits: the check the open makes is access(2), so
    # pretend it answers "no" for the catalog file only.
    real_access = os.access

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if str(path).endswith("catalog.db") and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)

    before = tree(root)
    mp = pytest.MonkeyPatch()
    mp.setattr(os, "access", access)
    try:
        with ArchiveManager.open(root) as pool:
            assert pool.read_only
            assert "catalog file" in (pool.read_only_reason or "")
            assert len(pool.open_archive("second").load_samples()) == 6
            with pytest.raises(ReadOnlyPoolError):
                pool.save("new", rollout(3), rollout_id=3)
    finally:
        mp.undo()
    assert tree(root) == before


def test_an_older_catalog_is_not_migrated_by_a_reader(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
        # Stamped one revision back: what a catalog an older library wrote says of itself.
        with pool.catalog.write() as conn:
            older = conn.exec_driver_sql(
                "SELECT version_num FROM archive_manager_version"
            ).scalar_one()
            conn.exec_driver_sql(
                "UPDATE archive_manager_version SET version_num = :v",
                {"v": _previous_revision(older)},
            )
    before = tree(root)
    with pytest.raises(CatalogError, match="cannot migrate"):
        ArchiveManager.open(root, read_only=True)
    assert tree(root) == before


def _previous_revision(revision: str) -> str:
    from archive_manager.catalog.migrate import _script

    down = _script().get_revision(revision).down_revision
    assert isinstance(down, str)
    return down


def test_an_unchanging_catalog_that_changes_under_a_read_is_refused_then_followed(
    tmp_path: Path,
) -> None:
    """A reader that found no -wal reads the file as immutable (no lock, no side file); a
    writer that opens and checkpoints meanwhile makes that read fail loudly instead of
    returning rows of two states, and the next read sees the writer's commit."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    with ArchiveManager.open(root, read_only=True) as reader:
        with (
            pytest.raises(CatalogError, match="changed while this process read it"),
            reader.catalog.read() as conn,
        ):
            conn.execute(select(archives_table.c.name)).all()
            with ArchiveManager.open(root) as writer:
                writer.save("third", rollout(3), rollout_id=3)
        assert [i.name for i in reader.find()] == ["first", "second", "third"]


def test_a_reader_follows_a_writer_that_opens_after_it(tmp_path: Path) -> None:
    """Immutable while nobody had the catalog open; once a writer holds it (-wal and -shm
    exist) the reader's next read goes through the WAL and sees every commit."""
    from archive_manager.catalog.engine import sqlite_read_mode

    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    with ArchiveManager.open(root, read_only=True) as reader:
        assert sqlite_read_mode(root / "catalog.db") == "immutable"
        assert len(reader.find()) == 2
        with ArchiveManager.open(root) as writer:
            writer.save("third", rollout(3), rollout_id=3)
            assert sqlite_read_mode(root / "catalog.db") == "ro"
            assert [i.name for i in reader.find()] == ["first", "second", "third"]
            writer.save("fourth", rollout(4), rollout_id=4)
            assert len(reader.open_archive("fourth").load_samples()) == 6


def test_a_wal_without_its_shm_file_is_refused_clearly(tmp_path: Path) -> None:
    from archive_manager.catalog.engine import sqlite_read_mode

    database = tmp_path / "catalog.db"
    database.write_bytes(b"")
    assert sqlite_read_mode(database) == "immutable"
    Path(f"{database}-wal").write_bytes(b"")  # a writer opening it right now: no commit yet
    assert sqlite_read_mode(database) == "immutable"
    Path(f"{database}-wal").write_bytes(b"\0" * 4096)
    with pytest.raises(CatalogError, match="no -shm file"):
        sqlite_read_mode(database)
    Path(f"{database}-shm").write_bytes(b"")
    assert sqlite_read_mode(database) == "ro"


def test_the_facade_reads_a_pool_it_may_not_write(tmp_path: Path) -> None:
    pointer = tmp_path / "run" / "rollout_1.json"
    RolloutArchive.save(pointer, rollout(1), rollout_id=1)
    with RolloutArchive(pointer, read_only=True) as arc:
        assert arc.pool.read_only and len(arc.load_samples()) == 6
        with pytest.raises(ReadOnlyPoolError):
            arc.release()
    assert side_files(tmp_path / "run" / "archive-pool") == []


# --------------------------------------------------------------------------- the CLI


def _cli(root: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["--root", str(root), *args], env=env)


def test_cli_read_only_flag_and_environment_variable(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    before = tree(root)
    listed = _cli(root, "--read-only", "ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert [a["name"] for a in json.loads(listed.stdout)] == ["first", "second"]
    for args, env in (
        (["--read-only", "release", "first", "--yes"], None),
        (["release", "first", "--yes"], {"ARCHIVE_MANAGER_READ_ONLY": "1"}),
        (["--read-only", "gc", "--yes"], None),
        (["--read-only", "init"], None),
    ):
        result = _cli(root, *args, env=env)
        assert result.exit_code == 1, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "read-only" in lines[0]
        assert "Traceback" not in result.output
    assert tree(root) == before


def test_serve_opens_the_pool_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    seen: list[bool] = []

    def fake_serve(pool: ArchiveManager, host: str, port: int, announce: Any, **_: Any) -> None:
        seen.append(pool.read_only)

    monkeypatch.setattr("archive_manager.web.serve", fake_serve)
    before = tree(root)
    result = _cli(root, "serve", "--port", "0")
    assert result.exit_code == 0, result.output
    assert seen == [True]
    assert tree(root) == before


# --------------------------------------------------------------------------- a read-only mount


@pytest.fixture
def mount_point() -> Iterator[Path]:
    """An empty folder to bind the pool onto (inside a private namespace: never visible)."""
    folder = Path(tempfile.mkdtemp(prefix="am-ro-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _reader(
    source: Path, mount: Path, url: str | None, out: Path, pointer: Path | None, *extra: str
) -> list[str]:
    return read_only_mount_command(
        source,
        mount,
        [
            sys.executable,
            str(READER),
            str(mount / "pool"),
            url or "-",
            str(out),
            str(pointer) if pointer is not None else "-",
            *extra,
        ],
    )


def _check_reads(result: dict[str, Any]) -> None:
    assert result["read_only"] is True
    assert "read-only mount" in result["reason"]
    assert result["names"] == ["first", "second"]
    assert result["loaded"] == result["keys"] == result["one_by_one"] == result["metadata"] == 6
    assert result["by_key"] >= 1 and result["by_task"] >= 1 and result["as_arrays"] == 6
    assert result["owners"] == ["archive:first", "checkpoint:keep"]
    assert result["exported"] > 0 and result["verify"] is True
    assert result["verify_data"]["ok"] is True and result["verify_data"]["notices"] == []
    assert result["pages"] == [200] * 6
    for what, message in result["refused"].items():
        assert "read-only here" in message, (what, message)
    for verb, (code, stderr) in result["cli"].items():
        if verb in ("release", "retain", "gc", "rebuild"):
            lines = stderr.strip().splitlines()
            assert code == 1 and len(lines) == 1 and "read-only" in lines[0], (verb, stderr)
        else:
            assert code == 0, (verb, stderr)


@pytest.mark.timeout(900)  # a child Python per process, on a loaded 2-core machine
def test_every_read_on_a_read_only_mount_writes_nothing(
    tmp_path: Path, backend: Backend, mount_point: Path
) -> None:
    require_mount_namespace()
    source = tmp_path / "data"
    root = source / "pool"
    url = backend.url(root)
    with open_on(backend, root) as pool:
        fill(pool)
    pointer = tmp_path / "run" / "rollout_7.json"
    RolloutArchive.save(pointer, rollout(7), rollout_id=7, args=_Args(root, url))
    # The pointer records the writable path; the reader reaches the pool by the mount.
    data = json.loads(pointer.read_text())
    data["pool_root"] = str(mount_point / "pool")
    reader_pointer = tmp_path / "run" / "reader.json"
    reader_pointer.write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    assert side_files(root) == []
    before = tree(source)
    # A pointer file names no server catalog to connect to: the reader configures it.
    env = child_env() if url is None else child_env(ARCHIVE_MANAGER_CATALOG_URL=url)
    done = subprocess.run(
        _reader(source, mount_point, url, out, reader_pointer),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # the pointer's archive is a third one: the first two are the fill's
    result["names"] = [n for n in result["names"] if n in ("first", "second")]
    _check_reads(result)
    assert result["facade"] == [True, 6] and "read-only" in result["facade_release"]
    assert (out / "export.pt").stat().st_size > 0 and (out / "cli-export.pt").exists()
    after = tree(source)
    assert after.keys() == before.keys(), set(after) ^ set(before)
    assert after == before


class _Args:
    """The training run's ``args`` as `RolloutArchive.save` reads them."""

    def __init__(self, root: Path, url: str | None) -> None:
        self.archive_root = str(root)
        self.archive_catalog_url = url


@pytest.mark.timeout(900)
def test_a_reader_on_a_read_only_mount_follows_a_live_writer(
    tmp_path: Path, mount_point: Path
) -> None:
    """SQLite: with a writer's connection open on the writable side, -wal and -shm exist and
    the reader reads through them (mode=ro): it sees what the writer commits later."""
    require_mount_namespace()
    source = tmp_path / "data"
    root = source / "pool"
    out = tmp_path / "out"
    out.mkdir()
    with ArchiveManager.open(root) as writer:
        fill(writer)
        assert side_files(root) == ["catalog.db-shm", "catalog.db-wal"]
        reader = subprocess.Popen(
            _reader(source, mount_point, None, out, None, "live"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert reader.stdout is not None and reader.stdin is not None
            assert reader.stdout.readline().strip() == "READY"
            writer.save("third", rollout(3), rollout_id=3)
            reader.stdin.write("\n")
            reader.stdin.flush()
            stdout, stderr = reader.communicate(timeout=600)
        finally:
            if reader.poll() is None:
                reader.kill()
        assert reader.returncode == 0, stderr
        result = json.loads(stdout)
        assert result["names_later"] == ["first", "second", "third"]
        _check_reads(result)
        assert [i.name for i in writer.find()] == ["first", "second", "third"]


_KILLED_WRITER = """
import os, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
pool = ArchiveManager.open(sys.argv[1])
pool.save("third", make_rollout(6, seed=3, prompt_len=8, response_min=4, response_max=12,
                                group_size=2), rollout_id=3)
os._exit(0)  # as SIGKILL leaves it: -wal and -shm stay, the last commits only in the WAL
"""


@pytest.mark.timeout(900)
def test_a_reader_on_a_read_only_mount_reads_what_a_killed_writer_committed(
    tmp_path: Path, mount_point: Path
) -> None:
    """A training job killed with the catalog open leaves -wal and -shm and no process: the
    reader, which may recover nothing, still reads every commit (SQLite rebuilds the WAL index
    in its own memory) and changes nothing."""
    require_mount_namespace()
    source = tmp_path / "data"
    root = source / "pool"
    out = tmp_path / "out"
    out.mkdir()
    with ArchiveManager.open(root) as pool:
        fill(pool)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == 0, killed.stderr
    assert side_files(root) == ["catalog.db-shm", "catalog.db-wal"]
    before = tree(source)
    done = subprocess.run(
        _reader(source, mount_point, None, out, None),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["names"] == ["first", "second", "third"]
    result["names"] = ["first", "second"]
    _check_reads(result)
    assert tree(source) == before


# --------------------------------------------------------------------------- PostgreSQL roles


def _readme_grants() -> str:
    text = (WORKTREE / "docs" / "shared-pools.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    grants = [b for b in blocks if "rollouts_reader" in b and "rollouts_writer" in b]
    assert len(grants) == 1, "the GRANTs of docs/shared-pools.md for a reader and a writer role"
    return grants[0]


def test_readme_grants_give_a_reader_and_a_writer_role(tmp_path: Path, pg_server: Any) -> None:
    import psycopg

    tag = uuid.uuid4().hex[:8]
    reader_role, writer_role = f"reader_{tag}", f"writer_{tag}"
    owner_url = pg_server.create_database()
    database = owner_url.rsplit("/", 1)[-1]
    sql = (
        _readme_grants()
        .replace("rollouts_reader", reader_role)
        .replace("rollouts_writer", writer_role)
        .replace("DATABASE rollouts", f'DATABASE "{database}"')
    )
    root = tmp_path / "pool"
    try:
        with ArchiveManager.open(root, owner_url) as pool:  # the owner creates the catalog
            fill(pool)
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname=database,
            autocommit=True,
        ) as conn:
            code = "\n".join(ln for ln in sql.splitlines() if not ln.strip().startswith("--"))
            for statement in code.split(";"):
                if statement.strip():
                    conn.execute(statement)  # type: ignore[arg-type]

        def url(role: str) -> str:
            return owner_url.replace("://postgres@", f"://{role}@")

        with ArchiveManager.open(root, url(writer_role)) as writer:
            assert not writer.read_only
            writer.save("third", rollout(3), rollout_id=3)
            writer.open_archive("second").release()
            writer.retain("checkpoint:w", "third")
            assert writer.release_owner("checkpoint:w") == 1
            assert writer.gc(grace=0).blobs > 0
            assert writer.verify(read_data=True).ok

        with ArchiveManager.open(root, owner_url) as owner:
            state = snapshot_pool(owner)
        with ArchiveManager.open(root, url(reader_role)) as reader:
            assert reader.read_only
            assert "may not write" in (reader.read_only_reason or "")
            assert [i.name for i in reader.find()] == ["first", "third"]
            assert len(reader.open_archive("third").load_samples()) == 6
            assert reader.verify(read_data=True).ok and reader.stats()
            for write in (
                lambda: reader.save("fourth", rollout(4), rollout_id=4),
                lambda: reader.open_archive("first").release(),
                lambda: reader.release_owner("checkpoint:keep"),
                lambda: reader.gc(grace=0),
            ):
                with pytest.raises(ReadOnlyPoolError):
                    write()
            # The server refuses what got past the gate too, with the same error.
            with pytest.raises(ReadOnlyPoolError), reader.catalog.engine.connect() as engine_conn:
                engine_conn.exec_driver_sql("DELETE FROM retention")

        with ArchiveManager.open(root, owner_url) as owner:
            assert snapshot_pool(owner) == state
    finally:
        pg_server.drop_database(owner_url)
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            for role in (reader_role, writer_role):
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')  # type: ignore[arg-type]


# --------------------------------------------------------------------------- group-shared pools


def test_share_with_group_sets_the_bits_and_new_folders_keep_them(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    group = os.getgid()
    old = os.umask(0o022)  # the umask that would clear the group's write bit
    try:
        result = CliRunner().invoke(
            cli, ["--root", str(root), "init", "--shared-group", str(group)]
        )
        assert result.exit_code == 0, result.output
        assert "shared with group" in result.stdout
        with ArchiveManager.open(root) as pool:
            fill(pool)
            assert pool.verify().notices == []
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            assert folder.stat().st_mode & FOLDER_BITS == FOLDER_BITS, folder
        assert (root / "catalog.db").stat().st_mode & 0o060 == 0o060
        blobs = [p for p in (root / "blobs").rglob("*") if p.is_file() and len(p.name) == 32]
        assert blobs and all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in blobs)
    finally:
        os.umask(old)


def test_verify_names_permissions_that_lock_a_member_out(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
        pool.share_with_group(os.getgid())
        folder = next(p for p in (root / "blobs").iterdir() if p.is_dir())
        folder.chmod(0o755)
        (root / "catalog.db").chmod(0o644)
        notices = [n for n in pool.verify().notices if n.kind == "permissions"]
        assert len(notices) == 2
        assert str(folder) in notices[0].message
        assert "init --shared-group" in notices[0].message
        assert "catalog.db" in notices[1].message
        assert pool.verify().ok  # a notice, not damage
        result = CliRunner().invoke(cli, ["--root", str(root), "verify"])
        assert result.exit_code == 0 and "init --shared-group" in result.output
        pool.share_with_group(os.getgid())
        assert shared_problems(root, catalog_file=root / "catalog.db") == []


def test_sharing_a_hard_linked_copy_leaves_the_original_alone(tmp_path: Path) -> None:
    """``share-with-group`` on a ``cp -al`` copy changed the group and mode of the original's
    files through the inodes they share.  Refused before anything changes."""
    import subprocess

    root, copy = tmp_path / "pool", tmp_path / "copy"
    with ArchiveManager.open(root) as pool:
        fill(pool)
    (root / "archive-pool.json").chmod(0o600)  # its owner's alone, as a 077 umask makes it
    subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
    with ArchiveManager.open(copy, rebind=True) as pool:
        modes = {p: p.stat().st_mode for p in root.rglob("*") if p.is_file()}
        with pytest.raises(InvalidInputError, match="hard links"):
            pool.share_with_group(os.getgid())
    assert {p: p.stat().st_mode for p in root.rglob("*") if p.is_file()} == modes


def test_a_pool_that_is_not_shared_gets_no_permission_notice(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        fill(pool)
        root.chmod(0o700)
        assert pool.verify().notices == []


def test_shared_group_bad_input_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    result = CliRunner().invoke(
        cli, ["--root", str(root), "init", "--shared-group", "no-such-group-xyz"]
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: there is no group 'no-such-group-xyz' on this machine"
    ]
    with ArchiveManager.open(root) as pool, pytest.raises(InvalidInputError):
        pool.share_with_group("no-such-group-xyz")


_MEMBER = """
import json, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
root, action, name, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tiny = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
with ArchiveManager.open(root, create=False) as pool:
    out = {"read_only": pool.read_only}
    if action == "save":
        pool.save(name, make_rollout(40, seed=seed, **tiny), rollout_id=seed)
    elif action == "release":
        out["released"] = pool.open_archive(name).release()
    elif action == "gc":
        out["reclaimed"] = pool.gc(grace=0).blobs
    out["names"] = [i.name for i in pool.find()]
    out["loaded"] = {i.name: len(pool.open_archive(i.name).load_samples()) for i in pool.find()}
    report = pool.verify(read_data=True)
    out["ok"], out["notices"] = report.ok, [n.kind for n in report.notices]
print(json.dumps(out))
"""


@pytest.mark.timeout(900)
def test_two_accounts_of_one_group_share_a_pool(tmp_path: Path) -> None:
    """Two throwaway users of one group, umask 022: one creates the pool with
    ``init --shared-group``, both save (new fan-out folders each), release each other's
    archives and collect, and neither is ever locked out."""
    require_users()
    base = Path(tempfile.mkdtemp(prefix="am-shared-"))
    try:
        with throwaway_users(2) as (group, (alice, bob)):
            import pwd

            os.chmod(base, 0o755)
            os.chown(base, pwd.getpwnam(alice).pw_uid, -1)
            root = base / "pool"
            script = base / "member.py"
            script.write_text(_MEMBER)
            os.chmod(script, 0o644)
            steps: list[tuple[str, list[str]]] = [
                (
                    alice,
                    [
                        "-m",
                        "archive_manager.cli",
                        "--root",
                        str(root),
                        "init",
                        "--shared-group",
                        group,
                    ],
                ),
                (alice, [str(script), str(root), "save", "alice-1", "1"]),
                (bob, [str(script), str(root), "save", "bob-1", "2"]),
                (bob, [str(script), str(root), "release", "alice-1", "0"]),
                (bob, [str(script), str(root), "gc", "-", "0"]),
                (alice, [str(script), str(root), "save", "alice-2", "3"]),
                (alice, [str(script), str(root), "release", "bob-1", "0"]),
                (alice, [str(script), str(root), "gc", "-", "0"]),
                (bob, [str(script), str(root), "save", "bob-2", "4"]),
                (bob, [str(script), str(root), "-", "-", "0"]),
            ]
            lines = []
            for user, args in steps:
                setup, prefix = as_user_prefix(user, group, base)
                command = " ".join(
                    _quote(a)
                    for a in [
                        *prefix,
                        "sh",
                        "-c",
                        'umask 022 && exec "$@"',
                        "sh",
                        sys.executable,
                        *args,
                    ]
                )
                lines.append(f"{setup}{command}")
            outputs = []
            for line in lines:
                done = subprocess.run(
                    ["unshare", "-m", "sh", "-c", line],
                    capture_output=True,
                    text=True,
                    env=child_env(HOME=str(base)),
                    cwd=base,
                    check=False,
                    timeout=600,
                )
                assert done.returncode == 0, (line, done.stderr)
                outputs.append(done.stdout)
            results = [json.loads(o) for o in outputs[1:]]
            assert all(not r["read_only"] and r["ok"] for r in results), results
            assert not any("permissions" in r["notices"] for r in results), results
            assert results[3]["reclaimed"] > 0 and results[6]["reclaimed"] > 0
            assert results[-1]["names"] == ["alice-2", "bob-2"]
            assert results[-1]["loaded"] == {"alice-2": 40, "bob-2": 40}
            gid = root.stat().st_gid
            owners = set()
            for path in [root, *root.rglob("*")]:
                st = path.lstat()
                owners.add(st.st_uid)
                assert st.st_gid == gid, path
                if path.is_dir():
                    assert st.st_mode & FOLDER_BITS == FOLDER_BITS, path
            assert len(owners) == 2  # both accounts created folders or files
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


_DECIDER = """
import json, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
root, action = sys.argv[1], sys.argv[2]
tiny = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
with ArchiveManager.open(root, create=False) as pool:
    if action == "save":
        pool.save(sys.argv[3], make_rollout(40, seed=int(sys.argv[4]), **tiny), rollout_id=1)
    elif action == "hold-and-release":
        # A checkpoint keeps alice's archive, whose own owner then lets it go.
        assert pool.retain("checkpoint:step-100", sys.argv[3])
        assert pool.open_archive(sys.argv[3]).release()
    elif action == "gc":
        pool.gc(grace=0)
    out = {"owners": {}, "loaded": {}}
    for name in ("alice-1", "bob-1"):  # released ones included: find() lists published ones
        if name not in {i.name for i in pool.find(state=None)}:
            continue
        archive = pool.open_archive(name)
        out["owners"][name] = sorted(archive.owners())
        out["loaded"][name] = len(archive.load_samples())
print(json.dumps(out))
"""


@pytest.mark.timeout(900)
def test_a_members_umask_hides_no_decision_from_anothers_rebuild(tmp_path: Path) -> None:
    """Issue 36, case 6, with two real accounts: in a pool shared with ``init
    --shared-group``, bob (umask 077) retains alice's archive for a checkpoint and alice
    releases her own hold; the catalog is lost and alice (umask 022) rebuilds it with
    --resolve, then collects.  Bob's journal records were 0400: the rebuild called them
    damaged, --resolve quarantined them and the GC reclaimed the checkpoint's archive.  Every
    file bob wrote is readable by the group, and the archive is still there."""
    require_users()
    base = Path(tempfile.mkdtemp(prefix="am-umask-"))
    try:
        with throwaway_users(2) as (group, (alice, bob)):
            import pwd

            os.chmod(base, 0o755)
            os.chown(base, pwd.getpwnam(alice).pw_uid, -1)
            root = base / "pool"
            script = base / "decider.py"
            script.write_text(_DECIDER)
            os.chmod(script, 0o644)
            cli_args = ["-m", "archive_manager.cli", "--root", str(root)]

            def run_as(user: str, umask: str, args: list[str]) -> subprocess.CompletedProcess[str]:
                setup, prefix = as_user_prefix(user, group, base)
                shell = f'umask {umask} && exec "$@"'
                command = " ".join(
                    _quote(a) for a in [*prefix, "sh", "-c", shell, "sh", sys.executable, *args]
                )
                return subprocess.run(
                    ["unshare", "-m", "sh", "-c", f"{setup}{command}"],
                    capture_output=True,
                    text=True,
                    env=child_env(HOME=str(base)),
                    cwd=base,
                    check=False,
                    timeout=600,
                )

            for user, umask, args in [
                (alice, "022", [*cli_args, "init", "--shared-group", group]),
                (alice, "022", [str(script), str(root), "save", "alice-1", "1"]),
                (bob, "077", [str(script), str(root), "save", "bob-1", "2"]),
                (bob, "077", [str(script), str(root), "hold-and-release", "alice-1"]),
            ]:
                done = run_as(user, umask, args)
                assert done.returncode == 0, (user, args, done.stderr)
            bobs = [p for p in root.rglob("*") if p.lstat().st_uid == pwd.getpwnam(bob).pw_uid]
            assert any(p.parent.name == "journal" for p in bobs), bobs
            for path in bobs:
                mode = path.lstat().st_mode
                wanted = FOLDER_BITS if stat.S_ISDIR(mode) else stat.S_IRGRP
                assert mode & wanted == wanted, (path, oct(mode))
            for path in root.glob("catalog.db*"):
                path.unlink()  # the catalog is lost
            done = run_as(alice, "022", [*cli_args, "rebuild-catalog", "--resolve", "--yes"])
            assert done.returncode == 0, done.stderr + done.stdout
            assert "not applied" not in done.stdout and not (root / "journal" / "damaged").exists()
            done = run_as(alice, "022", [str(script), str(root), "gc"])
            assert done.returncode == 0, done.stderr
            result = json.loads(done.stdout)
            assert result["owners"] == {
                "alice-1": ["checkpoint:step-100"],
                "bob-1": ["archive:bob-1"],
            }
            assert result["loaded"] == {"alice-1": 40, "bob-1": 40}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_shared_pool_mounted_at_another_path_opens_on_postgresql(
    tmp_path: Path, backend: Backend
) -> None:
    """The scale-out deployment (PostgreSQL catalog, blobs on a shared filesystem): machine A
    mounts the blob root at /mnt/pool, machine B (a Kubernetes volume) at /data/pool.  Seen
    from B, the root holds the very identity file the catalog records (same pool id, same
    catalog id) and the path A recorded does not exist there.  B is refused ("two pools must
    not share one catalog") although it is one pool and one catalog; it should open (nothing
    about it is a copy or a second catalog).  Simulated by renaming the folder."""
    if backend.name != "postgresql":
        pytest.skip("a shared pool needs a server catalog")
    machine_a, machine_b = tmp_path / "mnt-pool", tmp_path / "data-pool"
    url = backend.url(machine_a)
    with ArchiveManager.open(machine_a, catalog_url=url) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    machine_a.rename(machine_b)  # what B sees: the same files, at its own mount point
    with ArchiveManager.open(machine_b, catalog_url=url) as pool:
        assert_loads(pool, "a", tiny_rollout(seed=1))


_CRASHING_WRITER = """
import os, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
kw = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
pool = ArchiveManager.open(sys.argv[1])
pool.save("first", make_rollout(6, seed=1, **kw), rollout_id=1)
pool.save("second", make_rollout(6, seed=2, **kw), rollout_id=2)
os._exit(0)  # killed: the catalog's -wal (with commits) and -shm stay behind
"""


def _crashed_writer_pool(root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (root / "catalog.db-wal").stat().st_size > 32
    assert (root / "catalog.db-shm").exists()


def test_read_only_reader_rewrites_the_shm_a_crashed_writer_left(tmp_path: Path) -> None:
    """Claim 1/2 (a read-only open writes nothing, the pool stays byte-identical): a writer
    that died (OOM-killed training job) leaves catalog.db-wal and catalog.db-shm.  A reader
    opened with ``read_only=True`` on the writable pool (an analyst who asked not to touch
    it, a ZFS/LVM snapshot mounted read-write, a backup being taken) uses ``mode=ro``, whose
    SQLite still opens the -shm read-write and rebuilds the wal-index in it (and writes its
    read marks): the pool's bytes change.  Matters because the docs promise "not even a
    -wal/-shm" and a backup tool comparing checksums sees the pool change under a reader.
    Fix: open the ``ro`` mode with ``readonly_shm=1`` (SQLite then keeps the index in
    heap memory when no writer is live) or use ``immutable=1`` when no process holds the
    -shm lock (probe with `sqlite_lock_holders`)."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    before = tree(root)
    with ArchiveManager.open(root, read_only=True) as pool:
        assert pool.read_only
        # Every commit is in the dead writer's -wal: the reader must see them all.
        assert sorted(i.name for i in pool.find()) == ["first", "second"]
        assert len(pool.open_archive("second").load_samples()) == 6
    after = tree(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"a read-only open changed {changed}"
    # The writable open that comes later still recovers the log the reader left alone.
    with ArchiveManager.open(root, create=False) as pool:
        assert sorted(i.name for i in pool.find()) == ["first", "second"]


class _WalIndexBusyOnce:
    """A sqlite3 connection whose first read answers as a read-only wal-index does while a
    live writer rewrites it (SQLITE_READONLY_CANTINIT)."""

    def __init__(self, real: sqlite3.Connection, code: int) -> None:
        self.real, self.code, self.failures = real, code, 0

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction

    def execute(self, sql: str) -> sqlite3.Cursor:
        if sql.startswith("PRAGMA") and self.failures == 0:
            self.failures += 1
            exc = sqlite3.OperationalError("attempt to write a readonly database")
            exc.sqlite_errorcode = self.code  # type: ignore[attr-defined]
            raise exc
        return self.real.execute(sql)


@pytest.mark.parametrize("code", [8 | (1 << 8), 8 | (5 << 8)])
def test_a_reader_retries_a_wal_index_a_live_writer_is_rewriting(tmp_path: Path, code: int) -> None:
    """A reader whose -shm is read-only (`reader_uri`) cannot fix the wal-index itself, and
    SQLite answers SQLITE_READONLY_RECOVERY / _CANTINIT when a read starts while a live writer
    rewrites it (measured: about 1 read in 30,000 beside a writer committing without pause).
    `begin_read_snapshot` retries at BEGIN, before the caller read anything; a persistent one
    is a CatalogError naming the -shm, never the ReadOnlyPoolError of a refused write."""
    from archive_manager.catalog.dialects.sqlite import begin_read_snapshot

    database = tmp_path / "c.db"
    sqlite3.connect(database).close()
    real = sqlite3.connect(database, isolation_level=None)
    flaky = _WalIndexBusyOnce(real, code)
    begin_read_snapshot(flaky, str(database), 1000)  # type: ignore[arg-type]
    assert flaky.failures == 1 and real.in_transaction
    real.execute("ROLLBACK")

    class Always(_WalIndexBusyOnce):
        def execute(self, sql: str) -> sqlite3.Cursor:
            self.failures = 0
            return super().execute(sql)

    with pytest.raises(CatalogError, match="-shm") as info:
        begin_read_snapshot(Always(real, code), str(database), 50)  # type: ignore[arg-type]
    assert not isinstance(info.value, ReadOnlyPoolError)
    assert not real.in_transaction
    real.close()


def test_a_reader_opens_again_when_the_last_writer_closed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The -wal and -shm seen when the reader chose ``mode=ro`` are deleted when the last
    writer closes; a read-only -shm is not created again, so SQLite answers CANTOPEN (seen
    with two threads creating one pool: test_compat's save race).  `connect_reader` chooses
    the mode anew (the main file now holds every commit).  Known residue of that instant:
    SQLite's WAL open creates an empty -wal in a writable folder before -shm fails (0 bytes,
    no commit: every open, a reader's included, takes it for none); never a -shm."""
    from archive_manager._util import sqlite_read as dialect

    database = tmp_path / "c.db"
    with sqlite3.connect(database) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = tree(tmp_path)
    real = dialect.sqlite_read_mode
    answers = iter(["ro"])  # as chosen while the writer still had its files open
    monkeypatch.setattr(dialect, "sqlite_read_mode", lambda p: next(answers, None) or real(p))
    reader = dialect.connect_reader(str(database), 1000)
    try:
        assert reader.read_mode == "immutable"
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)
    finally:
        reader.close()
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k != "."} == {
        **{k: v for k, v in before.items() if k != "."},
        "c.db-wal": after["c.db-wal"],
    }
    assert (tmp_path / "c.db-wal").stat().st_size == 0


def test_verify_misses_an_identity_file_the_group_cannot_read(tmp_path: Path) -> None:
    """Claim 4 (verify notices what would lock a member out): in a group-shared pool, an
    identity file (archive-pool.json, or its spare under blobs/) the group cannot read locks
    every other member out (`read_identity` raises PoolIdentityError "cannot read the pool
    identity file"), e.g. after a member with umask 077 ran `rebind` or an open that wrote
    a lost identity back.  `shared_problems` only looks at folders and the catalog files, so
    `verify` says nothing.  Fix: check the identity file(s) (and any non-blob regular file
    a member must read) for the group and group-read in `shared_problems`."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
        pool.share_with_group(os.getgid())
        assert pool.verify().notices == []
        (root / "archive-pool.json").chmod(0o600)  # the group may not read it
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
    assert any("archive-pool.json" in m for m in notices), notices
    result = CliRunner().invoke(cli, ["--root", str(root), "verify"])
    assert "archive-pool.json" in result.output, result.output
    assert "init --shared-group" in result.output, result.output  # the command that fixes it
    # The spare identity and the journal's files are read by every member too.
    records = sorted((root / "journal").iterdir())
    assert records, "the save wrote no journal record"
    for path in (root / "blobs" / ".archive-pool.json", records[0]):
        path.chmod(0o600)
    with ArchiveManager.open(root) as pool:
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
        assert len(notices) == 1 and "3 file(s)" in notices[0], notices
        assert ".archive-pool.json" in notices[0] and records[0].name in notices[0], notices
        # What the notice tells to run fixes it.
        pool.share_with_group(os.getgid())
        assert pool.verify().notices == []
        # Others may read but the group may not (0604): POSIX reads a member of the file's
        # group by the group bits alone, so members are locked out all the same.
        (root / "archive-pool.json").chmod(0o604)
        notices = [n.message for n in pool.verify().notices if n.kind == "permissions"]
        assert len(notices) == 1 and "archive-pool.json" in notices[0], notices


def test_a_read_only_postgresql_database_is_not_detected_as_read_only(
    tmp_path: Path, pg_server: Any
) -> None:
    """Claim 1 (a pool the process cannot write is detected and opened read-only, reported
    as such by ``info``/``pool.read_only``): analysts are pointed at a PostgreSQL hot standby
    (a read replica) or a database set ``default_transaction_read_only``; the role holds
    every privilege, so `_server_role_unwritable` answers "writable" and the pool opens as a
    writer (``read_only`` False, ``info`` says read-write).  A save there is still refused
    with ReadOnlyPoolError by the server-error translation and changes nothing (checked
    first below, passes); what fails is the detection, so a tool that picks read-only
    behaviour from ``pool.read_only`` (the viewer's controls, a CLI that hides write verbs)
    is misled.  Fix: also ask the server (``SHOW transaction_read_only``,
    ``pg_is_in_recovery()``) when deciding read-only in `Catalog.open`."""
    import psycopg

    url = pg_server.create_database()
    database = url.rsplit("/", 1)[-1]
    root = tmp_path / "pool"
    try:
        with ArchiveManager.open(root, url) as pool:
            pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')  # type: ignore[arg-type]
        with ArchiveManager.open(root, url, create=False) as reader:
            assert len(reader.open_archive("first").load_samples()) == 6
            before = tree(root)
            try:
                reader.save("second", make_rollout(6, seed=2, **TINY_ROLLOUT), rollout_id=2)  # type: ignore[arg-type]
                refused: object = "NOT REFUSED"
            except Exception as exc:  # what the user gets is the point
                refused = exc
            changed = sorted(k for k, v in tree(root).items() if before.get(k) != v)
            assert isinstance(refused, ReadOnlyPoolError) and changed == [], (
                f"save on a read-only database: {refused!r}; the blob root changed: {changed}"
            )
            assert reader.read_only, "a read-only database opened as a writer"
            assert "default_transaction_read_only" in (reader.read_only_reason or "")
        # What 'archive-manager info' shows (the CLI opens the pool as detected).
        shown = CliRunner().invoke(cli, ["--root", str(root), "--catalog-url", url, "info"])
        assert shown.exit_code == 0, shown.output
        assert "read-only (the catalog database or role is set read-only" in shown.output
    finally:
        with psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')  # type: ignore[arg-type]
        pg_server.drop_database(url)


def test_a_wal_without_shm_is_reported_as_no_pool_to_a_reader(tmp_path: Path) -> None:
    """Claim 3 (a reader of a catalog with a -wal but no -shm is refused clearly, with
    `sqlite_read_mode`'s message): a killed writer whose -shm was then lost (a backup or
    rsync that skipped it, a tmp cleaner) leaves every commit in catalog.db-wal.  The read-only
    open first asks `exists`, whose probe opens the main file ``immutable=1`` (it picks
    ``immutable`` whenever -shm is missing, ignoring a -wal with commits), finds no tables
    there and answers PoolNotFoundError "no pool at ... (a read-only open never creates
    one)": the analyst is told the pool does not exist.  Fix: make `probe_sqlite_catalog` use
    `sqlite_read_mode` (raise its CatalogError) instead of its own ``wal and shm`` rule."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    before = tree(root)
    try:
        ArchiveManager.open(root, read_only=True).close()
        got: object = "opened"
    except Exception as exc:  # which error the reader gets is the point
        got = exc
    assert not isinstance(got, PoolNotFoundError), f"the reader was told: {got}"
    assert isinstance(got, CatalogError) and "-shm" in str(got), repr(got)
    assert "write access" in str(got), str(got)  # what to do about it
    changed = sorted(k for k, v in tree(root).items() if before.get(k) != v)
    assert changed == [] and set(tree(root)) == set(before), f"the refused reader wrote {changed}"


def test_a_wal_without_shm_makes_a_writable_pool_vanish_for_the_cli(tmp_path: Path) -> None:
    """Claim 3 (same refusal, the writable side): on the writer's own, writable pool in that
    state, ``archive-manager ls`` (create=False, so `exists` asks the probe first) says
    "no pool at ...; create one with 'archive-manager init'", though a writable open would
    simply recover the WAL.  An operator told the pool is gone after a crash may re-init or
    delete it.  Fix: as above; the probe must read through (or refuse) a -wal with commits."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    result = CliRunner().invoke(cli, ["--root", str(root), "ls"])
    assert "no pool" not in result.output, result.output
    assert result.exit_code == 0, result.output
    assert "first" in result.output and "second" in result.output, result.output
    # The writable open recovered the log: a reader reads the pool again.
    with ArchiveManager.open(root, read_only=True) as reader:
        assert sorted(i.name for i in reader.find()) == ["first", "second"]


def test_init_on_a_pool_whose_writer_died_and_lost_its_shm(tmp_path: Path) -> None:
    """'init' (which asks whether a pool exists before it opens one) on the same state: it
    finds the pool ("already exists"), never makes a second one over it; '--read-only ls'
    there is refused naming the -shm, and writes nothing."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    before = tree(root)
    refused = CliRunner().invoke(cli, ["--root", str(root), "--read-only", "ls"])
    assert refused.exit_code != 0 and "-shm" in refused.output, refused.output
    assert "no pool" not in refused.output, refused.output
    assert tree(root) == before
    result = CliRunner().invoke(cli, ["--root", str(root), "init"])
    assert result.exit_code == 0, result.output
    assert "pool already exists" in result.output, result.output
    with ArchiveManager.open(root, create=False) as pool:
        assert sorted(i.name for i in pool.find()) == ["first", "second"]


_WRITER_WITH_A_READER = """
import os, subprocess, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
kw = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
root = sys.argv[1]
writer = ArchiveManager.open(root)
writer.save("first", make_rollout(6, seed=1, **kw), rollout_id=1)
# The training job opens a read-only view of its own pool (an eval hook, a DataLoader).
ArchiveManager.open(root, read_only=True).close()
# An analyst's 'archive-manager ls' opens and closes the catalog meanwhile.
subprocess.run([sys.executable, "-m", "archive_manager.cli", "--root", root, "ls"],
               check=True, capture_output=True)
writer.save("second", make_rollout(6, seed=2, **kw), rollout_id=2)
print("saved", flush=True)
os._exit(0)  # the job is killed after its save returned
"""


def test_a_read_only_open_beside_a_live_writer_loses_the_writers_commits(
    tmp_path: Path,
) -> None:
    """Claim 3 (a reader beside an active writer on the same machine never sees two states)
    and durability: opening the pool read-only in the writer's own process (an eval hook, a
    DataLoader in the training job) reads catalog.db with plain open()/close() (the probe
    behind `exists` and `_refuse_foreign_sqlite`); POSIX drops every fcntl lock the process
    holds on a file when any descriptor of it is closed (sqlite.org/howtocorrupt.html 2.2),
    so the writer's WAL SHARED lock is gone.  The next process that closes the catalog (any
    `ls`) believes it is the last, checkpoints and deletes -wal/-shm under the live writer,
    whose later commits land in an unlinked WAL: other processes never see them, and a
    crash loses a save that returned.  (A second writable open in one process does the same:
    the probe predates issue 21, the read-only path now runs it for every reader.)  Fix: read
    the header through the SQLite connection (or os.pread on a descriptor kept open for the
    process's lifetime, as SQLite's unixInodeInfo does), never open()/close() the catalog
    file beside a live connection."""
    root = tmp_path / "pool"
    done = subprocess.run(
        [sys.executable, "-c", _WRITER_WITH_A_READER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "saved" in done.stdout, done.stderr
    with ArchiveManager.open(root, create=False) as pool:
        names = [i.name for i in pool.find()]
    assert names == ["first", "second"], f"a save that returned was lost: {names}"


_LIST_READ_ONLY = (
    "import sys; from archive_manager import ArchiveManager as A; "
    "p = A.open(sys.argv[1], read_only=True); print(sorted(i.name for i in p.find()))"
)


def test_a_symlinked_catalog_hides_a_live_writers_commits_from_readers(tmp_path: Path) -> None:
    """Claim 3 (a reader sees the last commit before its read began, through the writer's
    WAL; docs "Shared pools", `sqlite_read_mode`): operators put catalog.db on faster storage
    and leave a symlink in the pool.  SQLite follows the link and keeps -wal/-shm beside the
    target, but `sqlite_read_mode` (and the probe) look for ``<link>-wal``, find none and open
    the target ``immutable=1``: the reader ignores the live writer's WAL, so every commit
    since the last checkpoint is invisible (up to ~1000 pages), and as ``immutable`` it reads
    the main file while the writer checkpoints into it.  Fix: resolve the catalog path
    (os.path.realpath) before looking for its -wal/-shm, in the reader engine and the probe
    alike (or refuse a symlinked catalog)."""
    root, elsewhere = tmp_path / "pool", tmp_path / "fast"
    root.mkdir()
    elsewhere.mkdir()
    (root / "catalog.db").symlink_to(elsewhere / "catalog.db")
    with ArchiveManager.open(root) as pool:
        pool.save("first", make_rollout(6, seed=1, **TINY_ROLLOUT), rollout_id=1)  # type: ignore[arg-type]
    with ArchiveManager.open(root) as writer:  # the training job, live
        writer.save("second", make_rollout(6, seed=2, **TINY_ROLLOUT), rollout_id=2)  # type: ignore[arg-type]
        assert (elsewhere / "catalog.db-wal").exists()
        done = subprocess.run(
            [sys.executable, "-c", _LIST_READ_ONLY, str(root)],
            env=child_env(),
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "['first', 'second']", (
        f"the reader missed a commit of the live writer: {done.stdout.strip()}"
    )


@pytest.mark.parametrize("verb", ["current", "upgrade"])
def test_db_verbs_recover_a_wal_without_shm_when_they_may_write(tmp_path: Path, verb: str) -> None:
    """'db current' and 'db upgrade' (what an operator runs first after upgrading) on a pool
    whose writer died and lost its -shm: with write access they recover the log as any
    writable verb does, instead of repeating the reader's refusal."""
    root = tmp_path / "pool"
    _crashed_writer_pool(root)
    (root / "catalog.db-shm").unlink()
    result = CliRunner().invoke(cli, ["--root", str(root), "db", verb])
    assert result.exit_code == 0, result.output
    assert "-shm" not in result.output, result.output
    with ArchiveManager.open(root, read_only=True) as reader:
        assert sorted(i.name for i in reader.find()) == ["first", "second"]


def test_every_folder_others_cannot_enter_gets_a_stand_in(tmp_path: Path) -> None:
    # A virtual environment in a private temp folder and the interpreter in root's home: only
    # the first such folder had a stand-in, so the other accounts could not start Python.
    venv = tmp_path / "private-a" / "venv" / "lib"
    python = tmp_path / "private-b" / "pyenv" / "bin"
    venv.mkdir(parents=True)
    python.mkdir(parents=True)
    os.chmod(tmp_path / "private-a", 0o700)
    os.chmod(tmp_path / "private-b", 0o700)
    os.chmod(tmp_path / "private-b" / "pyenv", 0o700)
    found = blocking_ancestors({venv, python})
    assert found[tmp_path / "private-a"] == {"venv"}
    assert found[tmp_path / "private-b"] == {"pyenv"}
    assert found[tmp_path / "private-b" / "pyenv"] == {"bin"}
    order = list(found)
    assert order.index(tmp_path / "private-b") < order.index(tmp_path / "private-b" / "pyenv")
