"""Run by tests/pool/test_two_hosts.py on one "host" (a mount namespace of tests/jfshosts.py) of a
pool on JuiceFS with a PostgreSQL catalog.  Prints JSON objects, one a line, the result last.
No tensors, so no torch: each of these processes costs the suite a second, not three.

Usage: python _host_worker.py MODE ROOT CATALOG_URL [ARGS...]

* ``save PREFIX COUNT SEED [refuse-sqlite]``: COUNT archives of the same content (seed SEED,
  identical on every host: the dedup race), odd ones through the streaming writer, every
  third released at once; a verify after each.  Prints ``{"kept": {name: fingerprint},
  "released": [...]}``.  ``refuse-sqlite``: then also try a SQLite catalog on the mount
  (``"sqlite"``: the refusal's message).
* ``gc-loop``: create the pool, print ``{}`` (ready), GC (grace 0) until a line arrives on
  stdin, pausing 20 ms between runs; that line is what the check expects (below).
* ``save-check PREFIX COUNT SEED SKEW``: ``save``, print its result, wait for a line on stdin
  (the check's expectation) and check with the clock SKEW seconds ahead.
* ``blobs``: blob store operations, one JSON command a line on stdin, one answer line each:
  ``{"op": "put"|"rewrite"|"read", "data": TEXT, "retry": SECONDS}`` (``rewrite``: unlink
  the blob and put it again, as GC and a writer do; ``read``: `get` and `check`); the
  answer is ``{"ok": true}`` or ``{"error": ...}``, with ``"s"``, the seconds it took.
* ``hold NAME SEED``: publish ``NAME-pub`` (its result line: ``{"fingerprint": ...}``), then
  stream ``NAME`` part way (40 samples added: more chunks than the writer may hold back),
  print ``{}`` and wait on stdin: the host crashes meanwhile.

Each result line also says ``read_retry``, the store's bound (seconds; 5 on this FUSE mount
unless ``$ARCHIVE_MANAGER_BLOB_READ_RETRY`` says otherwise), and ``reads_retried``, how many
blob reads of this process met a stale cache and succeeded on a later try
(docs/architecture/shared-pools.md, "Shared pools").

The check: GC twice (grace 60 s, after the clock's skew); then every expected archive loads
with its fingerprint, every name listed as ``absent`` is not found, no lease, pending
archive, ``writing``/``deleting`` row, temp or orphan file remains, the blob files are the
catalog's rows and ``verify(read_data=True)`` is clean with no notice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import sys
import time
from typing import Any, cast

from archive_manager import ArchiveManager
from archive_manager._util.digest import digest_of
from archive_manager.blobs import LocalBlobStore, local_pool_store
from archive_manager.catalog import archives_table, blobs_table, leases_table
from archive_manager.errors import ArchiveError, ArchiveNotFoundError, UnsupportedFilesystemError
from archive_manager.interop.synthetic import make_rollout

ROLLOUT = {"prompt_len": 8, "response_min": 4, "response_max": 12, "group_size": 2}
OPTIONS: dict[str, Any] = {"chunk_size": 4, "inline_limit": 256}


class RetriedReads(logging.Handler):
    """Counts the store's "read on try N" records: reads a stale cache made wait."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "read on try" in record.getMessage():
            self.count += 1


RETRIED = RetriedReads()


def emit(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


def with_retries(pool: ArchiveManager, value: dict[str, Any]) -> dict[str, Any]:
    return {
        **value,
        "read_retry": getattr(pool.store, "read_retry", None),
        "reads_retried": RETRIED.count,
    }


def content(seed: int, n: int = 10) -> list[Any]:
    return make_rollout(n, seed=seed, rollout_id=seed, **ROLLOUT)  # type: ignore[arg-type]


def fingerprint(samples: list[Any]) -> str:
    """A digest of samples' exact content (dataclass reprs: every field, floats exact)."""
    return hashlib.blake2b(repr(samples).encode(), digest_size=16).hexdigest()


def save(pool: ArchiveManager, prefix: str, count: int, seed: int) -> dict[str, Any]:
    samples = content(seed)
    kept: dict[str, str] = {}
    released: list[str] = []
    for i in range(count):
        name = f"{prefix}-{i}"
        if i % 2:
            with pool.writer(name, rollout_id=seed) as w:
                for sample in samples:
                    w.add(sample)
        else:
            pool.save(name, samples, rollout_id=seed)
        if i % 3 == 2:
            pool.open_archive(name).release()
            released.append(name)
        else:
            kept[name] = fingerprint(pool.open_archive(name).load_samples())
        report = pool.verify()
        if not report.ok:
            raise AssertionError([p.message for p in report.problems])
    return {"kept": kept, "released": released}


def gc_until_told(pool: ArchiveManager) -> tuple[int, str]:
    """GC until a line arrives on stdin; the number of runs and the line."""
    runs = 0
    while True:
        pool.gc(grace=0)
        runs += 1
        ready, _, _ = select.select([sys.stdin], [], [], 0.02)
        if ready:
            return runs, sys.stdin.readline()


def hold(pool: ArchiveManager, name: str, seed: int) -> None:
    pool.save(f"{name}-pub", content(seed + 1), rollout_id=seed)
    emit({"fingerprint": fingerprint(pool.open_archive(f"{name}-pub").load_samples())})
    with pool.writer(name, rollout_id=seed) as w:
        for sample in content(seed, n=40):
            w.add(sample)
        emit({})
        sys.stdin.readline()  # never answered: the host crashes
        raise SystemExit("the host was meant to crash before this")


def check(root: str, url: str, expected: dict[str, Any], skew: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ArchiveManager.open(root, url, clock=lambda: time.time() + skew, **OPTIONS) as pool:
        first = pool.gc(grace=60)
        out["gc"] = {
            "rolled_back": first.rolled_back,
            "expired_leases": first.expired_leases,
            "blobs": first.blobs,
            "orphans": first.orphans,
            "temp_files": first.temp_files,
        }
        again = pool.gc(grace=60)
        out["again"] = [again.blobs, again.orphans, again.temp_files]
        out["loaded"] = {
            name: fingerprint(pool.open_archive(name).load_samples()) == fp
            for name, fp in expected["kept"].items()
        }
        absent: dict[str, bool] = {}
        for name in expected.get("absent", []):
            try:
                pool.open_archive(name)
                absent[name] = False
            except ArchiveNotFoundError:
                absent[name] = True
        out["absent"] = absent
        with pool.catalog.read() as conn:
            out["leftovers"] = len(
                [
                    *conn.execute(leases_table.select()).all(),
                    *conn.execute(
                        archives_table.select().where(archives_table.c.state == "pending")
                    ).all(),
                    *conn.execute(
                        blobs_table.select().where(blobs_table.c.state.in_(("writing", "deleting")))
                    ).all(),
                ]
            )
            rows = set(
                conn.execute(blobs_table.select().with_only_columns(blobs_table.c.digest)).scalars()
            )
        out["files_are_rows"] = set(pool.store.iter_digests()) == rows
        store = cast(LocalBlobStore, pool.store)  # the folder store, behind its read retry
        out["temp_files"] = len(list(store.temp_files()))
        report = pool.verify(read_data=True)
        out["verify"] = [p.message for p in report.problems] + [n.message for n in report.notices]
        out["blobs_checked"] = report.blobs_checked
    return out


def refuse_sqlite(root: str) -> str:
    try:
        ArchiveManager.open(root + "-sqlite").close()
    except UnsupportedFilesystemError as exc:
        return str(exc)
    return "not refused"


def blob_ops(root: str) -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        store = local_pool_store(root, read_retry=cmd.get("retry"))
        data = cmd["data"].encode() * 1000
        out: dict[str, Any] = {}
        started = time.monotonic()
        try:
            if cmd["op"] == "put":
                store.put(data)
            elif cmd["op"] == "rewrite":
                os.unlink(store.path(store.put(data)))
                store.put(data)
            else:
                store.get(digest_of(data))
                store.check(digest_of(data))
            out["ok"] = True
        except (OSError, ArchiveError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["s"] = time.monotonic() - started
        emit(out)


def main() -> None:
    mode, root, url, *args = sys.argv[1:]
    logger = logging.getLogger("archive_manager")
    logger.setLevel(logging.INFO)
    logger.addHandler(RETRIED)
    if mode == "blobs":
        blob_ops(root)
        return
    if mode == "gc-loop":
        with ArchiveManager.open(root, url, **OPTIONS) as pool:
            emit({})
            runs, line = gc_until_told(pool)
            checked = check(root, url, json.loads(line), 0.0)
            emit(with_retries(pool, {"runs": runs, **checked}))
        return
    with ArchiveManager.open(root, url, **OPTIONS) as pool:
        if mode == "hold":
            hold(pool, args[0], int(args[1]))
            return
        if mode not in ("save", "save-check"):
            raise SystemExit(f"unknown mode {mode!r}")
        result = with_retries(pool, save(pool, args[0], int(args[1]), int(args[2])))
    if args[3:] == ["refuse-sqlite"]:
        result["sqlite"] = refuse_sqlite(root)
    emit(result)
    if mode == "save-check":
        emit(check(root, url, json.loads(sys.stdin.readline()), float(args[3])))


if __name__ == "__main__":
    main()
