"""kill -9 a GC at random moments; the next GC finishes its work and deletes nothing owned."""

from __future__ import annotations

import os
import random
import select as select_module
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import canon, local_store, owned_blobs, tiny_rollout
from sqlalchemy import func, select

from archive_manager import ArchiveManager
from archive_manager.catalog import blobs_table, leases_table
from archive_manager.errors import ArchiveReleasedError
from archive_manager.pool import gc as gc_module

ROUNDS = 8
REPO = Path(__file__).resolve().parents[2]

# The GC in the child is slowed down (a pause inside its plan transaction, a pause per unlink
# inside its execution transactions) so that random kill moments land in every phase.
_CHILD = r"""
import sys, time
from archive_manager import ArchiveManager
from archive_manager.blobs import LocalBlobStore
from archive_manager.pool import gc as gc_module

pool = ArchiveManager.open(sys.argv[1], chunk_size=4, inline_limit=64)
real_delete = LocalBlobStore.delete
real_check = gc_module._check_invariant

def slow_delete(store, digest):
    time.sleep(0.004)
    return real_delete(store, digest)

def slow_check(conn, digests):
    time.sleep(0.03)
    real_check(conn, digests)

LocalBlobStore.delete = slow_delete  # the pool's store wraps one (RetryingReads)
gc_module._check_invariant = slow_check
print("ready", flush=True)
pool.gc(grace=0)
print("done", flush=True)
"""


def _open(root: Path) -> ArchiveManager:
    return ArchiveManager.open(root, chunk_size=4, inline_limit=64)


def _add_work(pool: ArchiveManager, round_: int, rng: random.Random, seeds: dict[str, int]) -> None:
    """Released archives (some sharing content with kept ones), a released archive a
    checkpoint keeps, a new kept archive, orphan files and a stale temp file."""
    for k in range(7):
        seed = rng.choice([0, 1, 2]) if k < 2 else 1000 * round_ + k
        name = f"r{round_}-{k}"
        pool.save(name, tiny_rollout(seed=seed), rollout_id=round_).release()
        seeds[name] = seed
    name = f"ckpt{round_}"
    pool.save(name, tiny_rollout(seed=500 + round_), rollout_id=round_)
    pool.retain(f"checkpoint:{round_}", name)
    pool.open_archive(name).release()
    seeds[name] = 500 + round_
    name = f"kept{round_}"
    pool.save(name, tiny_rollout(seed=round_ % 3), rollout_id=round_)
    seeds[name] = round_ % 3
    old = time.time() - 2 * gc_module.TEMP_MIN_AGE
    for i in range(3):
        path = local_store(pool).path(pool.store.put(f"orphan {round_} {i}".encode()))
        os.utime(path, (old, old))
    tmp = pool.root / "tmp" / f"dead-{round_}.tmp"
    tmp.write_bytes(b"partial")
    os.utime(tmp, (old, old))


def _kill_gc_at(root: Path, delay: float) -> str:
    """Start a GC in a child, kill -9 it ``delay`` seconds after it began; its last word."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    # The with-block closes the pipes whatever happens (an unclosed one is a ResourceWarning).
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        try:
            ready, _, _ = select_module.select([child.stdout], [], [], 120)
            assert ready, "the GC child did not start"
            line = child.stdout.readline().strip()
            assert line == "ready", (line, child.stderr.read())
            time.sleep(delay)
            child.kill()
            child.wait(timeout=60)
            rest = child.stdout.read().strip()
            err = child.stderr.read()
            assert child.returncode in (-9, 0), err
            assert child.returncode == -9 or rest == "done", (rest, err)
            return rest or "killed"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.mark.timeout(280)
def test_gc_killed_anywhere_is_finished_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    rng = random.Random(20240601)
    seeds: dict[str, int] = {}
    deleting_after_kill: list[int] = []
    with _open(root) as pool:
        for seed in range(3):  # kept archives whose content later released archives share
            pool.save(f"base{seed}", tiny_rollout(seed=seed), rollout_id=0)
            seeds[f"base{seed}"] = seed

    for round_ in range(ROUNDS):
        with _open(root) as pool:
            _add_work(pool, round_, rng, seeds)
        _kill_gc_at(root, rng.uniform(0.0, 0.45))

        with _open(root) as pool:
            with pool.catalog.read() as conn:
                deleting_after_kill.append(
                    conn.execute(
                        select(func.count())
                        .select_from(blobs_table)
                        .where(blobs_table.c.state == "deleting")
                    ).scalar_one()
                )
            # Whatever the killed GC did, nothing owned is gone yet.
            for digest in sorted(owned_blobs(pool)):
                pool.store.check(digest)

            pool.gc(grace=0)

            for info in pool.find():
                loaded = pool.open_archive(info.name).load_samples()
                assert [canon(s) for s in loaded] == [
                    canon(s) for s in tiny_rollout(seed=seeds[info.name])
                ]
            ckpt = pool.open_archive(f"ckpt{round_}")
            assert ckpt.state == "released"
            assert [canon(s) for s in ckpt.load_samples()] == [
                canon(s) for s in tiny_rollout(seed=seeds[ckpt.name])
            ]
            report = pool.verify(read_data=True)
            assert report.ok, report.problems[:5]
            assert report.notices == [], report.notices[:5]
            with pool.catalog.read() as conn:
                assert set(conn.execute(select(blobs_table.c.state)).scalars()) <= {"live"}
                assert conn.execute(select(leases_table)).all() == []
            # Released payload is gone: only what owners retain is left under blobs/.
            assert {d for d, _, _ in pool.store.iter_stat()} == owned_blobs(pool)
            with pytest.raises(ArchiveReleasedError):
                pool.open_archive(f"r{round_}-6").load_samples()
            assert list((root / "tmp").iterdir()) == []

    # The kills landed inside GC's execution at least once (rows left 'deleting').
    assert any(deleting_after_kill), deleting_after_kill
