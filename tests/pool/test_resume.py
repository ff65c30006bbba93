"""Resuming a killed save: a job killed mid-save restarts and saves the same name at once.

A save records its process (host name, pid, start time) in its lease row.  A new save of a
name held by a pending save whose process is provably dead (this host, the pid gone or
another process now) rolls that save back in its own write transaction and proceeds; any
other holder keeps the name, and the error names it (docs/architecture/save-protocol.md, "Save
protocol", Resuming a killed save).  Issue 35, item 1.
"""

from __future__ import annotations

import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import Backend, assert_same_samples, die_before_publish, open_on, tiny_rollout
from sqlalchemy import select, update

from archive_manager import ArchiveManager
from archive_manager._util import failpoints
from archive_manager._util.holders import holder_is_dead, process_start_time, this_process
from archive_manager.catalog import archives_table, current_revision, head_revision, leases_table
from archive_manager.errors import ArchiveExistsError, SaveInFlightError

DATA = Path(__file__).resolve().parents[1] / "data"
#: Long enough that no lease lapses during a test: only a dead holder frees a name.
TTL = 3600.0


def _saver(root: Path, url: str | None, name: str) -> str:
    return textwrap.dedent(
        f"""
        from archive_manager import ArchiveManager
        from helpers import tiny_rollout
        with ArchiveManager.open({str(root)!r}, catalog_url={url!r}, lease_ttl={TTL},
                                 chunk_size=2) as pool:
            pool.save({name!r}, tiny_rollout(6, seed=1), rollout_id=1)
        print("not stopped")
        """
    )


def _start_saver(root: Path, backend: Backend, name: str, spec: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        failpoints.ENV: spec,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", _saver(root, backend.url(root), name)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lease_rows(pool: ArchiveManager, name: str) -> list[Any]:
    lt = leases_table
    with pool.catalog.read() as conn:
        return list(
            conn.execute(
                select(lt.c.owner, lt.c.holder, lt.c.expires_at).where(lt.c.archive_name == name)
            )
        )


def _state(pool: ArchiveManager, name: str) -> str | None:
    a = archives_table
    with pool.catalog.read() as conn:
        return conn.execute(select(a.c.state).where(a.c.name == name)).scalar_one_or_none()


def _resaved(pool: ArchiveManager, name: str) -> None:
    """A new save of ``name`` goes through at once; the archive loads; verify is clean."""
    samples = tiny_rollout(6, seed=2)
    started = time.monotonic()
    pool.save(name, samples, rollout_id=2)
    assert time.monotonic() - started < 60
    assert_same_samples(pool.open_archive(name).load_samples(), samples)
    report = pool.verify()
    assert report.ok, report.as_dict()
    assert _lease_rows(pool, name) == []


# NOTE: the tests that run a saver process are slow (an interpreter importing torch, ~4 s
# each): the fast loop leaves them out, as it does every file that kills or stops processes.
@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        "save.blobs.after_commit",  # a lease holding blobs, no archive row
        "save.ownership.after_commit",  # pending archive, no manifest file
        "save.manifest.after_write",  # pending archive with its manifest
    ],
)
def test_a_save_killed_mid_save_is_rolled_back_by_the_next_save_of_its_name(
    tmp_path: Path, backend: Backend, point: str
) -> None:
    root = tmp_path / "pool"
    pool = open_on(backend, root, lease_ttl=TTL, chunk_size=2)
    try:
        saver = _start_saver(root, backend, "x", f"{point}=kill")
        _, err = saver.communicate(timeout=120)
        assert saver.returncode == -signal.SIGKILL, err
        (lease,) = _lease_rows(pool, "x")
        assert lease.holder["pid"] == saver.pid
        assert lease.holder["host"] == this_process()["host"]
        assert lease.expires_at > time.time() + TTL / 2  # far from lapsing
        assert holder_is_dead(lease.holder)
        expected = "pending" if point != "save.blobs.after_commit" else None
        assert _state(pool, "x") == expected
        _resaved(pool, "x")
        assert _state(pool, "x") == "published"
    finally:
        pool.close()


@pytest.mark.slow
def test_a_stopped_saver_keeps_the_name_and_is_named(tmp_path: Path, backend: Backend) -> None:
    """A live holder (stopped with SIGSTOP) is never rolled back; once killed, it is."""
    root = tmp_path / "pool"
    pool = open_on(backend, root, lease_ttl=TTL, chunk_size=2)
    saver = _start_saver(root, backend, "x", "save.manifest.after_write=sleep:300")
    try:
        deadline = time.monotonic() + 120
        while _state(pool, "x") != "pending":
            assert saver.poll() is None, saver.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(saver.pid, signal.SIGSTOP)
        with pytest.raises(ArchiveExistsError) as info:
            pool.save("x", tiny_rollout(6, seed=2), rollout_id=2)
        message = str(info.value)
        assert f"pid {saver.pid} on host {this_process()['host']!r}" in message
        assert "in flight or crashed" in message and "archive-manager gc" in message
        assert "lapses at" in message
        with pytest.raises(ArchiveExistsError, match=f"pid {saver.pid}"):
            pool.writer("x", rollout_id=2)
        assert _state(pool, "x") == "pending"
        assert len(_lease_rows(pool, "x")) == 1
    finally:
        saver.kill()
        saver.communicate(timeout=60)
    try:
        _resaved(pool, "x")
    finally:
        pool.close()


def test_a_pending_writer_of_this_process_keeps_the_name(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    with pytest.raises(ArchiveExistsError, match=f"pid {os.getpid()} on host") as info:
        pool.save("x", tiny_rollout(6, seed=2), rollout_id=2)
    # The specific error, with what the message says as attributes.
    error = info.value
    assert isinstance(error, SaveInFlightError)
    (lease,) = _lease_rows(pool, "x")
    assert (error.name, error.lease, error.holder) == ("x", lease.owner, this_process())
    assert (error.holder_status, error.expires_at) == ("alive", lease.expires_at)
    assert ", alive, lapses at" in str(error) and "\n" not in str(error)
    # the lapse in this machine's zone, named once ("... UTC local time" named two)
    shown = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(lease.expires_at))
    assert f"lapses at {shown} unless renewed" in str(error)
    assert _state(pool, "x") == "pending"
    assert len(_lease_rows(pool, "x")) == 1


def _saves(pool: ArchiveManager) -> list[tuple[str | None, bool, str | None, int | None, str]]:
    return [(s.archive, s.pending, s.host, s.pid, s.status) for s in pool.owners().saves]


def _pending_notice(pool: ArchiveManager) -> str:
    (notice,) = [n.message for n in pool.verify().notices if n.kind == "pending-save"]
    return notice


def test_owners_and_verify_name_each_pending_saves_holder_and_whether_it_lives(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where operators look (issue 35, item 1): the owners audit and verify show the holder
    of each save's lease, alive, dead or unknown."""
    here = this_process()
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    with pool.writer("y", rollout_id=3) as w:
        w.add(tiny_rollout(1)[0])
        assert (
            _saves(pool)
            == [
                ("x", True, here["host"], os.getpid(), "alive"),
                ("y", False, here["host"], os.getpid(), "alive"),
            ][:: 1 if _lease_rows(pool, "x")[0].owner < w.lease else -1]
        )
        report = pool.owners().as_dict()
        assert {s["archive"]: s["status"] for s in report["saves"]} == {"x": "alive", "y": "alive"}
    assert _saves(pool) == [("x", True, here["host"], os.getpid(), "alive")]
    notice = _pending_notice(pool)
    assert f"held by pid {os.getpid()} on host {here['host']!r}, alive, lapses at" in notice

    # Another host: this process cannot tell.
    _set_holder(pool, "x", {"host": "elsewhere.example", "pid": 7, "start": 1})
    assert _saves(pool) == [("x", True, "elsewhere.example", 7, "unknown")]
    assert "pid 7 on host 'elsewhere.example', unknown" in _pending_notice(pool)
    # An older version's lease: no holder recorded.
    _set_holder(pool, "x", None)
    assert _saves(pool) == [("x", True, None, None, "unknown")]
    assert "did not record itself" in _pending_notice(pool)
    # This host, its process gone: dead, and the next save of the name rolls it back.
    _set_holder(pool, "x", {**here, "pid": _dead_pid()})
    ((_, _, _, _, status),) = _saves(pool)
    assert status == "dead"
    notice = _pending_notice(pool)
    assert ", dead, lapses at" in notice and "the next save of 'x' rolls it back" in notice
    _resaved(pool, "x")
    assert pool.owners().saves == []


def test_the_cli_names_the_holder_in_one_line(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from archive_manager.cli import cli

    samples = tiny_rollout(4, seed=5)
    pool.save("src", samples, rollout_id=5)
    dump = tmp_path / "x.pt"
    pool.export("src", dump)
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    args = ["--root", str(pool.root), "--catalog-url", pool.catalog_url]
    result = CliRunner().invoke(cli, [*args, "import-pt", str(dump), "--name", "x"])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: archive 'x' already exists as a pending save")
    assert f"pid {os.getpid()} on host" in line and ", alive, lapses at" in line
    listed = CliRunner().invoke(cli, [*args, "owners"])
    assert listed.exit_code == 0, listed.output
    saves = listed.stdout.split("saves in flight or crashed")[1]
    (row,) = [r for r in saves.splitlines() if r.strip().startswith("lease:")]
    assert f"pid {os.getpid()} on" in row and " alive " in row and " pending " in row


def _set_holder(pool: ArchiveManager, name: str, holder: dict[str, Any] | None) -> None:
    lt = leases_table
    with pool.catalog.write() as conn:
        conn.execute(update(lt).where(lt.c.archive_name == name).values(holder=holder))


def _dead_pid() -> int:
    probe = subprocess.Popen([sys.executable, "-c", "pass"])
    probe.wait()
    return probe.pid


def test_a_holder_on_another_host_is_never_rolled_back(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    holder = {"host": "elsewhere.example", "pid": _dead_pid(), "start": 1}
    _set_holder(pool, "x", holder)
    assert not holder_is_dead(holder)
    with pytest.raises(ArchiveExistsError, match=r"on host 'elsewhere\.example'"):
        pool.save("x", tiny_rollout(6, seed=2), rollout_id=2)
    assert _state(pool, "x") == "pending"
    # This host name but another boot (a reboot, or another machine of that name) or another
    # pid namespace (a container sharing the host name): a process this one cannot see.
    here = this_process()
    for unseen in ({"boot": "another-boot"}, {"pidns": "pid:[1]"}):
        odd = {**holder, "host": here["host"], "boot": here["boot"], "pidns": here["pidns"]}
        odd.update(unseen)
        if here[next(iter(unseen))] is None:
            continue  # not Linux: nothing recorded to tell them apart
        _set_holder(pool, "x", odd)
        assert not holder_is_dead(odd)
        with pytest.raises(ArchiveExistsError):
            pool.save("x", tiny_rollout(6, seed=2), rollout_id=2)
    # The same holder on this host, boot and namespace: its pid is gone, so it is dead.
    _set_holder(
        pool, "x", {**holder, "host": here["host"], "boot": here["boot"], "pidns": here["pidns"]}
    )
    _resaved(pool, "x")


def test_a_lease_of_an_older_version_names_no_holder_and_is_waited_out(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    _set_holder(pool, "x", None)
    with pytest.raises(ArchiveExistsError, match="did not record itself"):
        pool.save("x", tiny_rollout(6, seed=2), rollout_id=2)
    assert _state(pool, "x") == "pending"


@pytest.mark.skipif(process_start_time(os.getpid()) is None, reason="no /proc/<pid>/stat")
def test_a_reused_pid_is_told_apart_by_its_start_time(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_before_publish(pool, "x", tiny_rollout(6, seed=1), monkeypatch)
    (lease,) = _lease_rows(pool, "x")
    assert lease.holder == this_process()
    # This pid, another start time: the holder was an earlier process with this pid.
    _set_holder(pool, "x", {**lease.holder, "start": lease.holder["start"] - 1})
    _resaved(pool, "x")


def test_an_older_pool_is_upgraded_and_its_leases_kept(tmp_path: Path) -> None:
    """tests/data/pool-r5.tar.gz was written at revision 0005; a lease taken then has no
    holder after the upgrade, and a new save records its own."""
    with tarfile.open(DATA / "pool-r5.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "pool-r5"
    with sqlite3.connect(root / "catalog.db") as db:
        db.execute(
            "INSERT INTO leases (owner, expires_at, generation, created_at, archive_name) "
            "VALUES ('lease:old', ?, 1, ?, 'x')",
            (time.time() + TTL, time.time()),
        )
    db.close()
    with ArchiveManager.open(root, lease_ttl=TTL) as pool:
        assert current_revision(pool.catalog.engine) == head_revision()
        assert [(r.owner, r.holder) for r in _lease_rows(pool, "x")] == [("lease:old", None)]
        with pool.writer("x", rollout_id=3) as w:
            for s in tiny_rollout(4, seed=3):
                w.add(s)
            mine = [r.holder for r in _lease_rows(pool, "x") if r.owner == w.lease]
            assert mine == [this_process()]
        # A live lease of unknown holder that never claimed the name does not block it.
        assert pool.open_archive("x").state == "published"
        assert [r.owner for r in _lease_rows(pool, "x")] == ["lease:old"]
        assert len(pool.open_archive("r0-0").load_samples()) > 0


_SYS_EXIT = {"x86_64": 60, "aarch64": 93}


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in _SYS_EXIT,
    reason="ends a main thread with the raw exit syscall (Linux x86_64, aarch64)",
)
def test_a_process_whose_main_thread_ended_is_not_taken_for_dead(tmp_path: Path) -> None:
    """Its /proc stat reads 'Z' (the main thread's state) while another thread, which may be
    the save, still runs: alive.  Once the whole process is gone, dead."""
    go = tmp_path / "go"
    child = textwrap.dedent(
        f"""
        import ctypes, os, sys, threading, time
        def worker():
            print("ready", flush=True)
            while not os.path.exists({str(go)!r}):
                time.sleep(0.02)
            os._exit(0)
        threading.Thread(target=worker).start()
        time.sleep(0.2)
        ctypes.CDLL(None).syscall({_SYS_EXIT[platform.machine()]}, 0)  # this thread only
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        holder = {**this_process(), "pid": proc.pid, "start": process_start_time(proc.pid)}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.02)
        assert not holder_is_dead(holder)
    finally:
        go.touch()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert holder_is_dead(holder)
