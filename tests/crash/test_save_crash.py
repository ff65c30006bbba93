"""Crash safety of the save protocol: a process saving archives in a loop is killed with
SIGKILL at random moments; whatever it reported as published must load exactly, nothing
half-saved may be visible, and the next process must carry on in the same pool."""

from __future__ import annotations

import inspect
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import local_store
from sqlalchemy import select

import archive_manager
from archive_manager import ArchiveManager
from archive_manager.catalog import archive_blobs_table, archives_table, blobs_table
from archive_manager.errors import ArchiveNotFoundError

#: Tensors above this many bytes become their own blobs (the savers and the checks agree).
INLINE_LIMIT = 1024
#: The longest a saver runs on after its last awaited save before it is killed, in seconds.
MAX_RUN = 0.5


def rollout_for(i: int) -> list:
    """The samples of archive ``a<i>``: three distinct rollouts, so saves share blobs."""
    from archive_manager.interop.synthetic import make_rollout

    kind = i % 3
    return make_rollout(
        70,
        seed=kind,
        rollout_id=kind,
        prompt_len=48,
        response_min=16,
        response_max=96,
        r3_layers=2 if kind == 2 else None,  # 70 tensor blobs of ~3 KB
        r3_topk=4,
    )


# NOTE: a fresh interpreter needs ~1.5 s (far more on a busy machine) to import torch, so
# the helper is a fork server: it imports once, then forks one saver per round, and the test
# kills that saver with SIGKILL.  Each saver is a real process that dies at a random moment.
SERVER = f"""
import os
import sys
import traceback

from archive_manager import ArchiveManager

{textwrap.dedent(inspect.getsource(rollout_for))}

def save_loop(root, start, report):
    pool = ArchiveManager.open(root, inline_limit={INLINE_LIMIT})
    i = start
    with open(report, "a") as out:
        while True:
            pool.save(f"a{{i}}", rollout_for(i), rollout_id=i)
            out.write(f"a{{i}}\\n")
            out.flush()  # a write(2) per name: it survives the kill
            i += 1


print("ready", flush=True)
for line in sys.stdin:
    start, report = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            save_loop(sys.argv[1], int(start), report)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class SaverServer:
    """The fork server: ``start(first_index, report_path)`` forks a saver and returns its pid."""

    def __init__(self, script: Path, root: Path) -> None:
        env = dict(os.environ)
        package_parent = str(Path(archive_manager.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the saver server died:\n{self.close()}")
        return line.strip()

    def start(self, first: int, report: Path) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{first} {report}\n")
        self.proc.stdin.flush()
        return int(self._line())

    def exit_code(self) -> int:
        """Wait for the saver to end; its exit code (-9: killed by SIGKILL)."""
        return int(self._line())

    def close(self) -> str:
        """Stop the server; its stderr (savers' tracebacks land there)."""
        self.proc.kill()
        _, err = self.proc.communicate(timeout=60)
        return err


def _wait_for_reports(report: Path, count: int) -> None:
    deadline = time.monotonic() + 120
    while count and time.monotonic() < deadline:
        if report.exists() and len(report.read_text().split()) >= count:
            return
        time.sleep(0.005)
    assert not count, f"the saver did not publish {count} archives in time"


def _index(name: str) -> int:
    assert name.startswith("a"), name
    return int(name[1:])


def _archive_rows(pool: ArchiveManager) -> list[Any]:
    with pool.catalog.read() as conn:
        return list(
            conn.execute(
                select(archives_table.c.id, archives_table.c.name, archives_table.c.state)
            ).all()
        )


def _check_blobs(pool: ArchiveManager, archive_ids: list[int]) -> int:
    """Every blob those archives' rows name is live in the catalog, present and intact;
    except a pending archive's `writing` rows: its manifest and the last chunks its ownership
    transaction claimed (all its chunks, for a save small enough to defer its lease) are
    written after the ownership commit and marked live when the archive is published
    (docs/architecture/save-protocol.md, "The last chunks go with the manifest")."""
    ab, b, a = archive_blobs_table, blobs_table, archives_table
    with pool.catalog.read() as conn:
        rows = conn.execute(
            select(ab.c.digest, b.c.state, ab.c.kind, a.c.state)
            .join(b, b.c.digest == ab.c.digest, isouter=True)
            .join(a, a.c.id == ab.c.archive_id)
            .where(ab.c.archive_id.in_(archive_ids))
            .distinct()
        ).all()
    for digest, state, _kind, archive_state in rows:
        if archive_state == "pending" and state == "writing":
            continue
        assert state == "live", f"blob {digest} of a committed archive is {state}"
        pool.store.check(digest)  # rehashes: IntegrityError / BlobNotFoundError on damage
    return len(rows)


def _check_round(
    pool: ArchiveManager,
    start: int,
    reported: list[str],
    published_before: set[str],
    interrupted: set[str],
    same_samples: Callable[[list, list], None],
) -> set[str]:
    """Check the pool after a saver that was told to start at ``a<start>`` was killed.

    ``interrupted`` holds the names whose save an earlier kill interrupted; this round's is
    added.
    """
    # The saver reports names in order, each only after save() returned.
    assert reported == [f"a{i}" for i in range(start, start + len(reported))]
    in_flight = f"a{start + len(reported)}"  # the save the kill interrupted, if any

    infos = pool.find()
    assert all(info.state == "published" for info in infos)
    published = {info.name for info in infos}
    new = published - published_before
    assert published_before <= published
    assert set(reported) <= new, "a reported archive is not visible"
    # Published but not yet reported: only the save that was killed right after publishing.
    assert new - set(reported) <= {in_flight}

    rows = _archive_rows(pool)
    for _, name, state in rows:
        assert state in ("published", "pending"), (name, state)
        if state == "pending":
            # Killed between ownership (step 4) and publishing (step 5), in this round or an
            # earlier one (only GC rolls it back): invisible.
            assert name in interrupted | {in_flight}, f"{name} is pending but was never in flight"
            with pytest.raises(ArchiveNotFoundError):
                pool.open_archive(name)
    interrupted.add(in_flight)

    for name in sorted(new, key=_index):
        arc = pool.open_archive(name)
        i = _index(name)
        assert arc.rollout_id == i
        same_samples(arc.load_samples(), rollout_for(i))
    # Blobs of published archives, and of a pending one (its ownership is committed too).
    _check_blobs(pool, [archive_id for archive_id, _, _ in rows])
    return published


def _run_crash_rounds(
    tmp_path: Path, rounds: int, seed: int, same_samples: Callable[[list, list], None]
) -> None:
    root = tmp_path / "pool"
    ArchiveManager.open(root, inline_limit=INLINE_LIMIT).close()  # created before any saver
    script = tmp_path / "saver_server.py"
    script.write_text(SERVER)
    rng = random.Random(seed)
    published: set[str] = set()
    interrupted: set[str] = set()
    least = 0  # archives the savers must have published
    started = time.monotonic()
    server = SaverServer(script, root)
    try:
        for round_no in range(rounds):
            with ArchiveManager.open(root) as pool:
                rows = _archive_rows(pool)
            start = max((_index(name) + 1 for _, name, _ in rows), default=0)
            report = tmp_path / f"round-{round_no}.txt"
            pid = server.start(start, report)
            # Killed at a random moment: after 0-2 saves (so that even a slow machine makes
            # progress), plus a random part of the next one.
            wait_for = rng.randrange(3)
            least += wait_for
            _wait_for_reports(report, wait_for)
            time.sleep(rng.uniform(0, MAX_RUN))
            os.kill(pid, signal.SIGKILL)
            code = server.exit_code()
            assert code == -signal.SIGKILL, f"the saver failed on its own:\n{server.close()}"
            reported = report.read_text().split() if report.exists() else []
            with ArchiveManager.open(root) as pool:
                published = _check_round(
                    pool, start, reported, published, interrupted, same_samples
                )
    finally:
        server.close()
    assert len(published) >= least
    # The pool is still good for work: a save in this process reuses every shared blob.
    with ArchiveManager.open(root, inline_limit=INLINE_LIMIT) as pool:
        files_before = sum(1 for _ in pool.store.iter_digests())
        arc = pool.save("after", rollout_for(2), rollout_id=2)
        same_samples(arc.load_samples(), rollout_for(2))
        if any(_index(name) % 3 == 2 for name in published):
            assert sum(1 for _ in pool.store.iter_digests()) == files_before + 1  # a manifest
        assert _check_blobs(pool, [row.id for row in _archive_rows(pool)]) > 0
        pending = sum(1 for row in _archive_rows(pool) if row.state == "pending")
        with pool.catalog.read() as conn:
            writing = conn.execute(
                select(blobs_table.c.digest).where(blobs_table.c.state == "writing")
            ).all()
        temp = len(local_store(pool).temp_files())
    print(
        f"{rounds} rounds, {len(published)} archives, {len(interrupted)} saves interrupted "
        f"(left: {pending} pending archives, {len(writing)} 'writing' blobs, {temp} temp "
        f"files), {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )


def test_killed_saves_leave_a_consistent_pool(tmp_path: Path, same_samples) -> None:
    _run_crash_rounds(tmp_path, rounds=10, seed=20240601, same_samples=same_samples)


@pytest.mark.slow
def test_killed_saves_leave_a_consistent_pool_many_rounds(tmp_path: Path, same_samples) -> None:
    _run_crash_rounds(tmp_path, rounds=24, seed=7, same_samples=same_samples)
