"""Several processes saving into one pool at once: nobody fails on a locked catalog, every
archive loads, and identical content is stored once however many processes wrote it.
On SQLite 4 processes, on PostgreSQL (the catalog of many machines) 8."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

from helpers import local_store

from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

PROCESSES = {"sqlite": 4, "postgresql": 8}
ARCHIVES_PER_PROCESS = 3
INLINE_LIMIT = 1024


def _rollout() -> list:
    # 130 samples: three chunks; every sample has a routed-expert tensor blob (~2-4 KB).
    return make_rollout(
        130,
        seed=42,
        rollout_id=1,
        prompt_len=32,
        response_min=16,
        response_max=96,
        r3_layers=2,
        r3_topk=4,
    )


def _saver(root: str, url: str | None, worker: int, barrier, results) -> None:
    try:
        samples = _rollout()
        with ArchiveManager.open(root, catalog_url=url, inline_limit=INLINE_LIMIT) as pool:
            barrier.wait(timeout=120)  # every process starts saving at the same moment
            for k in range(ARCHIVES_PER_PROCESS):
                pool.save(f"w{worker}-{k}", samples, rollout_id=1)
        results.put((worker, "ok"))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def test_processes_save_identical_content_at_once(
    tmp_path: Path, backend, blob_files_of, same_samples
) -> None:
    root = tmp_path / "pool"
    url = backend.url(root)
    processes = PROCESSES[backend.name]
    ArchiveManager.open(root, catalog_url=url, inline_limit=INLINE_LIMIT).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_saver, args=(str(root), url, worker, barrier, results))
        for worker in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = dict(results.get(timeout=300) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    failures = {w: out for w, out in outcomes.items() if out != "ok"}
    assert not failures, "\n".join(failures.values())  # e.g. "database is locked"
    assert all(proc.exitcode == 0 for proc in procs)

    expected = _rollout()
    names = sorted(f"w{w}-{k}" for w in range(processes) for k in range(ARCHIVES_PER_PROCESS))
    with ArchiveManager.open(root, catalog_url=url, inline_limit=INLINE_LIMIT) as pool:
        assert [i.name for i in pool.find()] == names
        assert pool.find(state=None) == pool.find()  # nothing left pending
        for name in names:
            same_samples(pool.open_archive(name).load_samples(), expected)

        files = blob_files_of(pool)
        shared = files.digests(names[0], "chunk") + files.digests(names[0], "tensor")
        assert len(files.digests(names[0], "chunk")) == 3
        assert len(files.digests(names[0], "tensor")) == 130
        manifests = set()
        for name in names:
            assert files.digests(name, "chunk") + files.digests(name, "tensor") == shared
            (manifest,) = files.digests(name, "manifest")
            manifests.add(manifest)
        assert len(manifests) == len(names)
        # Every chunk and tensor blob exists once, however many processes wrote it.
        assert len(files.files()) == len(shared) + len(manifests)
        assert sorted(pool.store.iter_digests()) == sorted(set(shared) | manifests)
        assert local_store(pool).temp_files() == []
        for digest in set(shared) | manifests:
            pool.store.check(digest)
