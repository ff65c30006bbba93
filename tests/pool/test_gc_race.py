"""The dedup race: savers of identical content against a GC running in a loop.

Every save reuses the chunk and tensor blobs of the archives before it, which were released
right away, so GC keeps finding them unretained and marks them ``deleting`` while savers are
taking them: a saver must either see the blob live and hold it under its lease before GC's
plan, or see it ``deleting`` and take it back, or find it gone and write it anew.  Published
archives must load exactly, always.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import canon, folder_store, owned_blobs, tiny_rollout
from sqlalchemy import select

from archive_manager import ArchiveManager
from archive_manager.catalog import (
    blobs_table,
    leases_table,
)
from archive_manager.errors import ArchiveReleasedError
from archive_manager.pool import gc as gc_module

SAVERS = 3
CHUNK_SIZE = 4
INLINE_LIMIT = 64
KEEP = 0.1  # a kept archive is released again after HOLD further saves, the last ones stay
HOLD = 3
REFERENCE = 0.1


def rollout(variant: int = 0) -> list[Any]:
    """One of the race's contents; every saver saves the same few again and again."""
    return tiny_rollout(seed=7 + variant)


def variant_of(name: str) -> int:
    """The content variant an archive of the race holds (its name ends in ``-v<n>``)."""
    return int(name.rsplit("-v", 1)[1])


@dataclass(frozen=True)
class _Race:
    """What the parent shares with the racers: a start line, a finish flag and counters."""

    barrier: Any
    stop: Any
    saved: Any
    runs: Any
    content_deleted: Any


def _open(root: str, url: str | None) -> ArchiveManager:
    return ArchiveManager.open(
        root, catalog_url=url, chunk_size=CHUNK_SIZE, inline_limit=INLINE_LIMIT
    )


def _run(out: str, work: Any) -> None:
    """Run ``work()`` in a child; write its result, or its traceback, to ``out``."""
    try:
        result = work()
    except BaseException:
        Path(out).write_text(json.dumps({"error": traceback.format_exc()}))
        raise
    Path(out).write_text(json.dumps(result))


def _saver(root: str, url: str | None, index: int, race: _Race, variants: int, out: str) -> None:
    def work() -> dict[str, Any]:
        contents = [rollout(v) for v in range(variants)]
        expected = [[canon(s) for s in samples] for samples in contents]
        rng = random.Random(index)
        held: list[tuple[str, int]] = []  # kept archives and the save count when kept
        saved = released = references = checked = taken_back = 0
        with _open(root, url) as pool:
            real_delete = folder_store(pool).delete

            def delete(digest: str) -> bool:
                # A saver unlinks only when it takes back a blob that GC marked 'deleting'.
                nonlocal taken_back
                taken_back += 1
                return real_delete(digest)

            folder_store(pool).delete = delete  # type: ignore[method-assign]
            race.barrier.wait(timeout=120)
            while not race.stop.is_set():
                if held and rng.random() < REFERENCE:
                    source = held[-1][0]
                    name = f"s{index}-{saved}-v{variant_of(source)}"
                    arc = pool.save(name, None, rollout_id=index, reference=source)
                    references += 1
                else:
                    # With several savers, several contents: each is now and then held by
                    # no save at all, so GC reclaims it while another saver is about to reuse it.
                    variant = rng.randrange(variants)
                    name = f"s{index}-{saved}-v{variant}"
                    arc = pool.save(name, contents[variant], rollout_id=index)
                saved += 1
                with race.saved.get_lock():
                    race.saved.value += 1
                if rng.random() < KEEP:
                    held.append((name, saved))
                else:
                    arc.release()
                    released += 1
                    # Now and then no save holds the content: GC's window to reclaim it.
                    time.sleep(rng.choice((0, 0, 0, 0.01)))
                # A kept archive must read back exactly while GC runs; then it is let go.
                while held and saved - held[0][1] >= HOLD:
                    old, _ = held.pop(0)
                    kept = pool.open_archive(old)
                    if [canon(s) for s in kept.load_samples()] != expected[variant_of(old)]:
                        raise AssertionError(f"archive {old!r} read back different samples")
                    checked += 1
                    kept.release()
                    released += 1
            # The last save of each saver stays published, for the checks after the race.
            pool.save(f"s{index}-last-v0", contents[0], rollout_id=index)
            held.append((f"s{index}-last-v0", saved))
        return {
            "kept": [n for n, _ in held],
            "saved": saved,
            "released": released,
            "references": references,
            "checked": checked,
            "taken_back": taken_back,
        }

    _run(out, work)


def _collector(root: str, url: str | None, race: _Race, out: str) -> None:
    def work() -> dict[str, Any]:
        runs = reclaimed = content_deleted = verifies = 0
        problems: list[str] = []
        with _open(root, url) as pool:
            content = set()
            real_delete = folder_store(pool).delete

            def delete(digest: str) -> bool:
                nonlocal content_deleted
                if digest in content:
                    content_deleted += 1
                    race.content_deleted.value = content_deleted
                return real_delete(digest)

            folder_store(pool).delete = delete  # type: ignore[method-assign]
            rng = random.Random(99)
            real_execute = gc_module._execute

            def slow_execute(*args: Any) -> None:
                # A GC slow between its plan and its unlinks leaves blobs 'deleting' for
                # longer: savers then meet them and must take them back.
                time.sleep(rng.choice((0, 0, 0.005, 0.02)))
                real_execute(*args)

            gc_module._execute = slow_execute  # type: ignore[assignment]
            race.barrier.wait(timeout=120)
            while not race.stop.is_set():
                with pool.catalog.read() as conn:
                    content = set(
                        conn.execute(
                            select(blobs_table.c.digest).where(blobs_table.c.kind != "manifest")
                        ).scalars()
                    )
                report = pool.gc(grace=0)
                runs += 1
                race.runs.value = runs
                reclaimed += report.blobs
                if runs % 4 == 0:
                    # verify while saves and GC are in flight: a busy pool is not a damaged one
                    verifies += 1
                    problems += [p.message for p in pool.verify().problems]
        return {
            "runs": runs,
            "reclaimed": reclaimed,
            "content_deleted": content_deleted,
            "verifies": verifies,
            "problems": problems,
        }

    _run(out, work)


def _race(
    tmp_path: Path,
    seconds: float,
    savers: int = SAVERS,
    url: str | None = None,
    variants: int = 1,
) -> None:
    """Race ``savers`` savers against a GC loop for at least ``seconds``, and on until the race
    has volume (saves, GC runs, content blobs reclaimed), at most four times as long: on a
    loaded machine the same seconds hold far fewer interleavings."""
    root = tmp_path / "pool"
    with _open(str(root), url):
        pass  # create and migrate the catalog once, before the children race to open it
    ctx = multiprocessing.get_context("spawn")
    race = _Race(
        barrier=ctx.Barrier(savers + 2),
        stop=ctx.Event(),
        saved=ctx.Value("i", 0),
        runs=ctx.Value("i", 0),
        content_deleted=ctx.Value("i", 0),
    )
    outs = [tmp_path / f"saver-{i}.json" for i in range(savers)]
    gc_out = tmp_path / "gc.json"
    procs = [
        ctx.Process(target=_saver, args=(str(root), url, i, race, variants, str(outs[i])))
        for i in range(savers)
    ]
    procs.append(ctx.Process(target=_collector, args=(str(root), url, race, str(gc_out))))
    for p in procs:
        p.start()
    try:
        race.barrier.wait(timeout=120)  # the parent counts the time the children race
        started = time.monotonic()
        while all(p.is_alive() for p in procs):
            elapsed = time.monotonic() - started
            enough = (
                race.saved.value >= 6 * savers
                and race.runs.value >= 10
                and race.content_deleted.value > 0
            )
            if (elapsed >= seconds and enough) or elapsed >= 4 * seconds:
                break
            time.sleep(0.2)
        race.stop.set()
        for p in procs:
            p.join(timeout=120)
    finally:
        race.stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    elapsed = time.monotonic() - started
    results = []
    for p, out in zip(procs, [*outs, gc_out], strict=True):
        assert out.exists(), f"{p.name} exited with {p.exitcode} and wrote no result"
        result = json.loads(out.read_text())
        assert "error" not in result, result.get("error")
        assert p.exitcode == 0
        results.append(result)
    by_saver, collector = results[:-1], results[-1]
    print(
        f"race of {len(by_saver)} savers, {elapsed:.0f} s: {sum(s['saved'] for s in by_saver)} saved, "
        f"{sum(s['taken_back'] for s in by_saver)} taken back from GC, {collector['runs']} GC "
        f"runs reclaimed {collector['reclaimed']} blobs ({collector['content_deleted']} content)"
    )

    # The race really happened: many saves, many GC runs, content blobs reclaimed and re-made.
    assert sum(s["saved"] for s in by_saver) >= 6 * len(by_saver), by_saver
    assert collector["runs"] >= 10, collector
    assert collector["content_deleted"] > 0, collector
    assert collector["problems"] == [], collector["problems"][:5]

    expected = [[canon(s) for s in rollout(v)] for v in range(variants)]
    kept = sorted(n for s in by_saver for n in s["kept"])
    with _open(str(root), url) as pool:
        assert sorted(i.name for i in pool.find()) == kept
        for name in kept:
            loaded = pool.open_archive(name).load_samples()
            assert [canon(s) for s in loaded] == expected[variant_of(name)], name
        needed = owned_blobs(pool)
        for digest in sorted(needed):
            pool.store.check(digest)  # exists and hashes to its name
        report = pool.verify(read_data=True)
        assert report.ok, report.problems[:5]

        # Released archives read back exactly or say they were released; never wrong data.
        released = [i.name for i in pool.find(state="released")]
        for name in random.Random(0).sample(released, min(20, len(released))):
            try:
                loaded = pool.open_archive(name).load_samples()
            except ArchiveReleasedError:
                continue
            assert [canon(s) for s in loaded] == expected[variant_of(name)], name

        pool.gc(grace=0)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems[:5]
        assert report.notices == [], report.notices[:5]
        files = {d for d, _, _ in pool.store.iter_stat()}
        assert files == owned_blobs(pool)
        with pool.catalog.read() as conn:
            states = set(conn.execute(select(blobs_table.c.state)).scalars())
            assert states <= {"live"}
            assert conn.execute(select(leases_table)).all() == []
        assert list((root / "tmp").iterdir()) == []
        for name in kept:
            loaded = pool.open_archive(name).load_samples()
            assert [canon(s) for s in loaded] == expected[variant_of(name)], name


@pytest.mark.timeout(240)
def test_dedup_race_short(tmp_path: Path) -> None:
    # At least 10 s, and on (up to 40 s) until the race has volume: on a loaded 2-core machine
    # 10 s alone sometimes saw no content blob reclaimed at all.
    _race(tmp_path, seconds=10)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dedup_race_long(tmp_path: Path) -> None:
    _race(tmp_path, seconds=25)  # tools/soak.py runs the long mixes; this keeps CI short


@pytest.mark.timeout(300)
def test_dedup_race_postgresql_8_savers(tmp_path: Path, pg_server) -> None:
    """The same race on a PostgreSQL catalog, with 8 savers (and the GC loop) at once."""
    url = pg_server.create_database()
    try:
        _race(tmp_path, seconds=15, savers=8, url=url, variants=8)
    finally:
        pg_server.drop_database(url)
