#!/usr/bin/env python3
"""Scaling: how every CLI verb, the viewer's pages and the API calls grow with the pool.

Pools of 100, 1,000 and 10,000 archives (``--sizes``) of 1,024 samples each (10M entries at
the top), on SQLite and on PostgreSQL (``--backends``; PostgreSQL through the throwaway
server of ``tests/pgserver.py``).  The pool grows in place from one size to the next.

**The fill.**  A handful of *template* archives are saved for real (``pool.save``: the
shape of docs/architecture/workload.md "Workload", 4-token prompts, 4-8-token responses, each
template its own seed).  Every other archive is a *clone* of one template, written by
`clone_archives` in batches through the catalog: the same rows a save of those samples under its own
name, rollout id and task keys (``task_keys=``, one prompt group of 8 per key) would commit (its
archive row, chunks, entries with its own task keys, sample metadata, blob list, owner and
summary), its own manifest blob written before the publishing commit, and the publication
records of the retention journal.  Chunk blobs are shared with the template, as a reference
save shares them, so the disk holds a few chunks and one manifest per archive.  The rows are
copied in SQL from the template's (``INSERT ... SELECT``), so a clone costs what the catalog's
index upkeep costs, about 0.1 s on this machine at 1,000 archives, against a save's 1.2 s (a
reference save's 0.3 s): 10,000 archives fill in about 20 minutes.  A clone's keys, metadata
and summary equal those of a real save of its template's samples under its task keys (checked
when this tool was written).  Every tenth archive is an evaluation rollout.

At each size, medians of ``--repeat`` runs (lookups of 15 random keys):

* API: ``find`` by task key (one match), ``find()`` of every archive, ``find(limit=50)``
  and a deep page (``after=`` the archive at 90 %), ``stats()`` (first call in a newly opened
  pool: no cache), ``info()``, ``open_archive`` + one key, ``query(..., limit=100)`` for each
  filter the CLI and the viewer offer, ``gc()`` with nothing to do, ``verify()``;
* the viewer (Flask test client of a newly opened pool): the pool page's first request, a
  deep pool page by keyset, the pool page's JSON, the stats page (its charts draw every
  rollout, its table one page of them), its JSON's first page and a deep one by keyset, an
  archive page, a prompt-group page, a prompt's history;
* the CLI (a subprocess each, start-up included, as a user runs it): every verb that reads
  (``ls``, ``ls --limit``, ``info``, ``stats``, ``query``, ``show``, ``keys``, ``groups``,
  ``prompts``, ``owners``, ``verify``, ``gc --dry-run``, ``db current``) and a ``retain`` /
  ``release-owner`` pair.  ``init``, ``demo``, ``export``, ``import-pt``, ``rebind``,
  ``rebuild-catalog``, ``release`` and ``serve`` are not timed (they create, change or
  serve a pool rather than read one of size N);

each in total and per archive (a superlinear step shows as a growing per-archive cost), the
catalog's bytes per sample, and the query plans of the filtered queries at the largest size.

Run: ``python3 tools/bench_scaling.py [--sizes 100,1000,10000] [--backends sqlite,postgresql]
[--quick] [--json FILE]``.  ``--keep`` keeps the pools; ``--pool POOL`` measures a kept SQLite
pool again.  A PostgreSQL catalog lives on the tests' throwaway server unless ``--pg-data
DIR`` is given: the cluster is then kept in DIR (made on first use, stopped cleanly at the
end) with its pool in DIR/pool, and a later run with the same DIR grows or measures that
pool (``--sizes 10000`` once it holds 10,000 archives: no refill after a change).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, text

from archive_manager import ArchiveManager
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    insert_rows,
    retention_table,
    sample_metadata_table,
)
from archive_manager.catalog.queries import inserted_id, next_save_seq
from archive_manager.codec import digest_of
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool.journal import pool_id_of, publish_op, stage_record, write_committed
from archive_manager.pool.manifest import Manifest
from archive_manager.pool.summary import read_summaries, store_summaries

GROUP = 8
TEMPLATES = 4
REPO = Path(__file__).resolve().parents[1]


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def name_of(i: int) -> str:
    return f"rollout-{i:05d}"


def task_key(archive: int, group: int) -> str:
    return f"rollout-{archive}/group-{group}"


def _is_eval(i: int) -> bool:
    return i % 10 == 9


# --------------------------------------------------------------------------- the fill


def save_templates(pool: ArchiveManager, count: int, per_archive: int) -> None:
    """Archives 0 .. count-1, saved for real, each from its own seed."""
    for i in range(count):
        samples = make_rollout(
            per_archive, seed=i + 1, prompt_len=4, response_min=4, response_max=8
        )
        keys = [task_key(i, j // GROUP) for j in range(per_archive)]
        pool.save(name_of(i), samples, rollout_id=i, evaluation=_is_eval(i), task_keys=keys)


def _template(pool: ArchiveManager, i: int) -> dict[str, Any]:
    a, c, e, m, ab = (
        archives_table,
        chunks_table,
        entries_table,
        sample_metadata_table,
        archive_blobs_table,
    )
    with pool.catalog.read() as conn:
        row = conn.execute(select(a).where(a.c.name == name_of(i))).one()
        chunks = conn.execute(
            select(c.c.ordinal, c.c.digest, c.c.samples, c.c.size)
            .where(c.c.archive_id == row.id)
            .order_by(c.c.ordinal)
        ).all()
        entries = conn.execute(
            select(e.c.position, e.c.sample_key, e.c.chunk_ordinal, e.c.offset)
            .where(e.c.archive_id == row.id)
            .order_by(e.c.position)
        ).all()
        metadata = conn.execute(
            select(m.c.status, m.c.reward, m.c.response_length, m.c.description)
            .where(m.c.archive_id == row.id)
            .order_by(m.c.position)
        ).all()
        blobs = conn.execute(
            select(ab.c.digest, ab.c.kind, blobs_table.c.size)
            .join(blobs_table, blobs_table.c.digest == ab.c.digest)
            .where(ab.c.archive_id == row.id, ab.c.kind != "manifest")
        ).all()
        summary = read_summaries(conn, [row.id], sketches=True)[row.id]
    return {
        "row": row,
        "chunks": chunks,
        "entries": entries,
        "metadata": metadata,
        "blobs": blobs,
        "summary": summary,
    }


_COPY_CHUNKS = text(
    "INSERT INTO chunks (archive_id, ordinal, digest, samples, size) "
    "SELECT :new, ordinal, digest, samples, size FROM chunks WHERE archive_id = :old"
)
_COPY_METADATA = text(
    "INSERT INTO sample_metadata (archive_id, position, status, reward, response_length, "
    "description) SELECT :new, position, status, reward, response_length, description "
    "FROM sample_metadata WHERE archive_id = :old"
)
# task_key(i, position // GROUP), as `save_templates` gives them.
_COPY_ENTRIES = text(
    'INSERT INTO entries (archive_id, position, sample_key, task_key, chunk_ordinal, "offset") '
    f"SELECT :new, position, sample_key, :prefix || CAST(position / {GROUP} AS VARCHAR), "
    'chunk_ordinal, "offset" FROM entries WHERE archive_id = :old'
)


def clone_archives(pool: ArchiveManager, start: int, stop: int, batch: int = 250) -> None:
    """Archives ``start`` .. ``stop - 1``, each the rows a save of its template's samples
    under its own name, rollout id and task keys commits (see the module's docstring)."""
    templates = [_template(pool, t) for t in range(TEMPLATES)]
    for first in range(start, stop, batch):
        todo = list(range(first, min(stop, first + batch)))
        with pool.catalog.write("bench.fill") as conn:
            if conn.dialect.name == "sqlite":
                # The fill's own connection keeps the indexes' pages in memory (256 MiB):
                # the rows are the same, written in minutes instead of an hour.
                conn.exec_driver_sql("PRAGMA cache_size = -262144")
            now = pool.clock()
            manifests = []
            for i in todo:
                t = templates[i % TEMPLATES]
                keys = [task_key(i, pos // GROUP) for pos, *_ in t["entries"]]
                data = Manifest(
                    name=name_of(i),
                    rollout_id=i,
                    evaluation=_is_eval(i),
                    attrs=None,
                    reference=None,
                    created_at=now,
                    chunks=[(d, n, s) for _, d, n, s in t["chunks"]],
                    tensors=sorted(b.digest for b in t["blobs"] if b.kind == "tensor"),
                    entries=[
                        (sk, k, o, off)
                        for (_, sk, o, off), k in zip(t["entries"], keys, strict=True)
                    ],
                    metadata=[r.description for r in t["metadata"]],
                    save_seq=next_save_seq(conn, now, floor=0),
                ).encode()
                manifests.append((i, t, keys, data))
            # As a save: the manifest is durable before the commit that publishes it.
            digests = pool.store.put_many([([data], digest_of(data)) for *_, data in manifests])
            ops = []
            for (i, t, _, data), digest in zip(manifests, digests, strict=True):
                conn.execute(
                    blobs_table.insert().values(
                        digest=digest, size=len(data), kind="manifest", state="live", created_at=now
                    )
                )
                archive_id = inserted_id(
                    conn.execute(
                        archives_table.insert().values(
                            name=name_of(i),
                            rollout_id=i,
                            evaluation=_is_eval(i),
                            state="published",
                            manifest_digest=digest,
                            samples=len(t["entries"]),
                            bytes=sum(b.size for b in t["blobs"]) + len(data),
                            created_at=now,
                            published_at=now,
                        )
                    )
                )
                # Copied in SQL from the template's rows (byte for byte what its save
                # stored), the task keys made the clone's own.
                source = {"new": archive_id, "old": t["row"].id}
                conn.execute(_COPY_CHUNKS, source)
                conn.execute(_COPY_METADATA, source)
                conn.execute(_COPY_ENTRIES, {**source, "prefix": f"rollout-{i}/group-"})
                insert_rows(
                    conn,
                    archive_blobs_table,
                    ("archive_id", "digest", "kind"),
                    [(archive_id, b.digest, b.kind) for b in t["blobs"]]
                    + [(archive_id, digest, "manifest")],
                )
                conn.execute(
                    retention_table.insert().values(
                        owner=f"archive:{name_of(i)}", archive_id=archive_id, created_at=now
                    )
                )
                # The template's summary: the clone's samples are the template's, and its
                # prompt groups the same positions under other task keys.
                store_summaries(conn, [(archive_id, t["summary"])])
                ops.append(publish_op(name_of(i), digest, at=now, owned_at=now))
            staged = stage_record(conn, pool_id_of(conn), ops, now, floor=0)
        write_committed(pool.journal, staged)


def fill(pool: ArchiveManager, start: int, stop: int, per_archive: int) -> None:
    if start < TEMPLATES:
        save_templates(pool, min(stop, TEMPLATES), per_archive)
        start = min(stop, TEMPLATES)
    if start < stop:
        clone_archives(pool, start, stop)


# --------------------------------------------------------------------------- measurements


QUERIES: dict[str, dict[str, Any]] = {
    "status": {"status": "truncated"},
    "reward range": {"min_reward": 0.5, "max_reward": 1.0},
    "high reward": {"min_reward": 0.99},
    "length range": {"min_length": 6, "max_length": 7},
    "rollout range": {"min_rollout_id": 10, "max_rollout_id": 20},
    "evaluation": {"evaluation": True},
    "task key": {"task_key": "rollout-3/group-5"},
    "status + reward": {"status": "completed", "min_reward": 0.5},
}


def _open(root: Path, url: str | None) -> ArchiveManager:
    return ArchiveManager.open(root, catalog_url=url)


def measure_api(root: Path, url: str | None, archives: int, per: int, repeat: int) -> dict:
    rng = random.Random(archives)
    groups = per // GROUP
    out: dict[str, float] = {}
    with _open(root, url) as pool:
        # A newly opened pool: no statistics cached, as a new process or a dashboard restart.
        t0 = time.perf_counter()
        rows = pool.stats()
        out["stats (first call)"] = time.perf_counter() - t0
        assert sum(r.archives for r in rows) == archives
        out["find (every archive)"] = _median_time(lambda: pool.find(), repeat)
        out["stats (cached)"] = _median_time(lambda: pool.stats(), repeat)

        def find_key() -> None:
            i = rng.randrange(archives)
            found = pool.find(task_key=task_key(i, rng.randrange(groups)))
            assert [f.name for f in found] == [name_of(i)], found

        def load_one() -> None:
            arc = pool.open_archive(name_of(rng.randrange(archives)))
            assert len(arc.load_samples(sample_key=f"sample:{rng.randrange(per)}")) == 1

        deep = name_of(int(archives * 0.9))
        out["find (task key)"] = _median_time(find_key, 15)
        out["find (limit 50)"] = _median_time(lambda: pool.find(limit=50), 15)
        out["find (deep page)"] = _median_time(lambda: pool.find(limit=50, after=deep), 15)
        out["info"] = _median_time(pool.info, repeat)
        out["open + one key"] = _median_time(load_one, 15)
        for label, filters in QUERIES.items():
            out[f"query {label}"] = _median_time(
                lambda f=filters: pool.query(**f, limit=100), repeat
            )

        def gc() -> None:
            assert pool.gc().blobs == 0

        out["gc (nothing to do)"] = _median_time(gc, repeat)
        out["verify"] = _median_time(lambda: pool.verify(), repeat)
    return out


def measure_viewer(root: Path, url: str | None, archives: int, repeat: int) -> dict:
    from archive_manager.web import create_app

    out: dict[str, float] = {}
    name = name_of(archives // 2)
    deep = name_of(int(archives * 0.9))
    pages = {
        "pool page (deep, keyset)": f"/?after={deep}",
        "pool page JSON": "/?format=json",
        "stats page": "/stats",
        "stats page JSON": "/stats?format=json",
        "stats JSON (deep, keyset)": f"/stats?format=json&after={int(archives * 0.9)}:training",
        "archive page": f"/archive/{name}",
        "group page": f"/archive/{name}/group?task_key={task_key(archives // 2, 3)}",
        "prompt page": f"/prompt?task_key={task_key(archives // 2, 3)}",
    }
    with _open(root, url) as pool:
        client = create_app(pool).test_client()
        t0 = time.perf_counter()
        assert client.get("/").status_code == 200
        out["pool page (first request)"] = time.perf_counter() - t0
        for label, path in pages.items():

            def get(p: str = path) -> None:
                response = client.get(p)
                assert response.status_code == 200, (p, response.status_code)

            out[label] = _median_time(get, repeat)
    return out


CLI_VERBS: dict[str, list[str]] = {
    "ls": ["ls"],
    "ls --limit 50": ["ls", "--limit", "50"],
    "info": ["info"],
    "stats": ["stats"],
    "query": ["query", "--status", "truncated", "--limit", "100"],
    "show": ["show", "{name}"],
    "keys": ["keys", "{name}"],
    "groups": ["groups", "{name}"],
    "prompts": ["prompts", "--task-key", "{task}"],
    "owners": ["owners"],
    "verify": ["verify"],
    "gc --dry-run": ["gc", "--dry-run"],
    "db current": ["db", "current"],
    "retain": ["retain", "checkpoint:bench", "{name}"],
    "release-owner": ["release-owner", "checkpoint:bench", "--yes"],
}


def measure_cli(root: Path, url: str | None, archives: int, verbs: list[str]) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    base = [sys.executable, "-m", "archive_manager.cli", "--root", str(root)]
    if url is not None:
        base += ["--catalog-url", url]
    values = {"name": name_of(archives // 2), "task": task_key(archives // 2, 3)}
    out: dict[str, float] = {}
    for verb in verbs:
        args = [a.format(**values) for a in CLI_VERBS[verb]]
        t0 = time.perf_counter()
        done = subprocess.run([*base, *args], env=env, capture_output=True, text=True)
        out[f"cli {verb}"] = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"archive-manager {' '.join(args)} failed: {done.stderr.strip()}")
    return out


def catalog_bytes(root: Path, url: str | None) -> int:
    if url is None:
        return sum(p.stat().st_size for p in root.glob("catalog.db*"))
    with _open(root, url) as pool, pool.catalog.read() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def query_plans(root: Path, url: str | None) -> dict[str, list[str]]:
    """The plans of the statements each filtered query runs (EXPLAIN, on the live catalog)."""
    plans: dict[str, list[str]] = {}
    with _open(root, url) as pool:
        engine = pool.catalog.engine
        for label, filters in QUERIES.items():
            seen: list[tuple[str, Any]] = []

            def record(
                conn: Any,
                cursor: Any,
                statement: str,
                params: Any,
                *rest: Any,
                seen: list[tuple[str, Any]] = seen,
            ) -> None:
                if statement.lstrip().upper().startswith("SELECT"):
                    seen.append((statement, params))

            event.listen(engine, "before_cursor_execute", record)
            try:
                pool.query(**filters, limit=100)
            finally:
                event.remove(engine, "before_cursor_execute", record)
            lines: list[str] = []
            with engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                for statement, params in seen[:4]:
                    cursor = raw.cursor()
                    if url is None:
                        cursor.execute("EXPLAIN QUERY PLAN " + statement, params)
                        lines += [f"  {row[3]}" for row in cursor.fetchall()]
                    else:
                        cursor.execute("EXPLAIN " + statement, params)
                        lines += [f"  {row[0]}" for row in cursor.fetchall()]
                    lines.append("  --")
            plans[label] = lines
    return plans


# --------------------------------------------------------------------------- the report


def report(rows: list[dict], backend: str) -> str:
    ops = list(rows[0]["seconds"])
    sizes = [r["archives"] for r in rows]
    head = f"{'operation':28}" + "".join(f"{f'N={n:,}':>12}{'per archive':>13}" for n in sizes)
    lines = [
        f"[{backend}] "
        + ", ".join(
            f"N={r['archives']:,}: {r['entries']:,} entries, "
            f"{r['catalog_bytes_per_sample']:.0f} catalog bytes/sample"
            for r in rows
        ),
        head,
    ]
    for op in ops:
        cells = ""
        for r in rows:
            s = r["seconds"].get(op)
            cells += (
                f"{s * 1e3:9.1f} ms{s / r['archives'] * 1e6:10.2f} us"
                if s is not None
                else " " * 25
            )
        lines.append(f"{op:28}{cells}")
    return "\n".join(lines)


@contextmanager
def _backend(name: str, pg_data: Path | None = None) -> Iterator[Callable[[], str | None]]:
    if name == "sqlite":
        yield lambda: None
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PgServer  # tests/pgserver.py: the throwaway server the tests use

    if pg_data is None:
        with PgServer.start() as server:
            yield server.create_database
        return
    # A cluster kept in pg_data: its pool is measured again by later runs (--pg-data).
    with PgServer.start_kept(pg_data) as kept:
        yield lambda: kept.ensure_database("bench_scaling")


def _archives_in(root: Path, url: str | None) -> int:
    """How many archives the pool at ``root`` holds (made empty if there is none yet)."""
    with _open(root, url) as pool:
        return len(pool.find())


def run(
    backend: str,
    sizes: list[int],
    per: int,
    repeat: int,
    work: Path,
    verbs: list[str],
    plans: bool,
    root: Path | None = None,
    grow: bool = True,
    pg_data: Path | None = None,
) -> dict:
    rows = []
    with _backend(backend, pg_data) as new_url:
        url = new_url()
        root = root or work / f"pool-{backend}"
        # A kept pool grows from what it holds (sizes below it are skipped), or with
        # grow=False (--pool) is measured as it is.
        filled = _archives_in(root, url)
        sizes = [s for s in sizes if s >= filled] if grow else [filled]
        if not sizes:
            raise SystemExit(f"the pool at {root} holds {filled} archives, more than --sizes")
        for size in sizes:
            t0 = time.perf_counter()
            with _open(root, url) as pool:
                fill(pool, filled, size, per)
            print(
                f"[{backend}] filled to {size} archives in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
            )
            filled = size
            seconds = measure_api(root, url, size, per, repeat)
            seconds.update(measure_viewer(root, url, size, repeat))
            seconds.update(measure_cli(root, url, size, verbs))
            rows.append(
                {
                    "archives": size,
                    "entries": size * per,
                    "catalog_bytes_per_sample": catalog_bytes(root, url) / (size * per),
                    "seconds": seconds,
                }
            )
            print(report(rows, backend), file=sys.stderr)
        plan = query_plans(root, url) if plans else {}
    return {"rows": rows, "plans": plan}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="100,1000,10000", help="pool sizes in archives, ascending")
    ap.add_argument("--samples", type=int, default=1024, help="samples per archive")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--backends", default="sqlite", help="sqlite, postgresql or both (comma-separated)"
    )
    ap.add_argument(
        "--cli",
        default=",".join(CLI_VERBS),
        help="CLI verbs to time (comma-separated; '' for none)",
    )
    ap.add_argument("--no-plans", action="store_true", help="do not print the query plans")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="pools of 6 and 10 archives of 64 samples, two CLI verbs",
    )
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the pools (printed) when done")
    ap.add_argument(
        "--pool",
        type=Path,
        default=None,
        help="measure this pool a --keep run filled (its catalog on --pg-data's server if given)",
    )
    ap.add_argument(
        "--pg-data",
        type=Path,
        default=None,
        help="keep the PostgreSQL cluster in this folder (made on first use) and its pool in "
        "FOLDER/pool: a later run with the same folder measures (or grows) that pool",
    )
    args = ap.parse_args()
    root, grow = args.pool, args.pool is None
    if args.pg_data is not None:
        args.backends = "postgresql"
        root = root or args.pg_data.resolve() / "pool"
    elif args.pool is not None:
        args.backends = "sqlite"
    if args.quick:
        args.sizes, args.samples, args.repeat, args.cli = "6,10", 64, 1, "ls --limit 50,stats"
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error("--sizes takes comma-separated integers")
    verbs = [v for v in args.cli.split(",") if v]
    unknown = [v for v in verbs if v not in CLI_VERBS]
    backends = [b for b in args.backends.split(",") if b]
    if unknown or any(b not in ("sqlite", "postgresql") for b in backends) or not backends:
        ap.error(f"--cli takes verbs of {', '.join(CLI_VERBS)}; --backends sqlite,postgresql")
    if (
        sizes != sorted(sizes)
        or sizes[0] <= TEMPLATES
        or args.samples < 2 * GROUP
        or args.repeat < 1
    ):
        ap.error(f"--sizes must ascend from > {TEMPLATES}; --samples >= 16; --repeat >= 1")
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-", dir=args.dir))
    results: dict[str, Any] = {"samples": args.samples}
    try:
        for backend in backends:
            results[backend] = run(
                backend,
                sizes,
                args.samples,
                args.repeat,
                work,
                verbs,
                not args.no_plans,
                root,
                grow,
                args.pg_data,
            )
    finally:
        if args.keep:
            print(f"pools kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    measured = sorted({r["archives"] for b in backends for r in results[b]["rows"]})
    print(
        f"pools of {', '.join(f'{s:,}' for s in measured)} archives of {args.samples} samples "
        f"({TEMPLATES} saved, the rest cloned through the catalog); medians of {args.repeat} "
        "runs (lookups: of 15 random keys); CLI verbs are one subprocess run each"
    )
    for backend in backends:
        print(report(results[backend]["rows"], backend))
        for label, lines in results[backend]["plans"].items():
            print(f"[{backend}] plan of query {label} (limit 100):")
            print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
