"""Many users, one pool (issue 21; docs/architecture.md, Shared pools): read-only readers and
group-shared writers.

* A pool opened read-only (asked for, or detected: a read-only mount, no write permission, a
  PostgreSQL role that may only read) answers every read and writes nothing, not a byte;
  every write fails at once with `ReadOnlyPoolError`.
* On a real read-only bind mount (a private mount namespace), every read verb and API call
  runs in a subprocess and the pool's folder is byte-for-byte the same afterwards; with a
  writer active on the writable side, the reader sees its new commits.
* PostgreSQL: the README's GRANTs for a reader and a writer role, on a real server.
* Two throwaway accounts of one group both save into, release from and collect one pool set up
  by ``archive-manager init --shared-group``; ``verify`` names what would lock one out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
    child_env,
    read_only_mount_command,
    require_mount_namespace,
    require_users,
    throwaway_users,
    tree,
)
from click.testing import CliRunner
from helpers import TINY_ROLLOUT, Backend, open_on, snapshot_pool
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
    RolloutArchive.save(pointer, rollout(1), rollout_id=1).close()
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
    RolloutArchive.save(pointer, rollout(7), rollout_id=7, args=_Args(root, url)).close()
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
    text = (WORKTREE / "README.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    grants = [b for b in blocks if "rollouts_reader" in b and "rollouts_writer" in b]
    assert len(grants) == 1, "the README's GRANTs for a reader and a writer role"
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
            with pytest.raises(ReadOnlyPoolError), reader.catalog.engine.connect() as conn:
                conn.exec_driver_sql("DELETE FROM retention")
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
