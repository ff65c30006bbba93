#!/usr/bin/env python3
"""Soak: several processes hammer one pool with a random mix of every operation, then every
invariant is checked.

``--processes`` workers (spawned processes) run for ``--seconds`` on the pool at ``--root``
(catalog: ``--catalog-url``, default SQLite in the root), each a seeded random mix of:

* **save** of a small realistic rollout, **stream** (the same through ``pool.writer``),
  **dedup** (a rollout some archive already holds, under a new name: its blobs are shared,
  and may be the very blobs a concurrent GC is reclaiming), **reference** (a new archive
  sharing another's chunks);
* **retain** (an external owner ``checkpoint:...``), **release** (an archive's own owner),
  **release-owner** (one of this worker's external owners);
* **gc** with a zero grace period, **verify** (sometimes rehashing), **owners**;
* **load** (whole archive), **load-sample** (by sample key), **load-task** (by task key).

Content comes from `make_rollout` with a seed drawn from a small set, so archives of
different workers often hold identical samples.  After each publication, the worker writes a
*record* (the archive's keys and a digest of each sample's canonical form) to a shared
folder; every load, by any worker, is compared with the record of what it must contain.

Errors are classified.  Expected: `ArchiveReleasedError` from loading, retaining or
referencing an archive that no owner retains any more (checked: an archive that still has an
owner must load).  Everything else is unexpected, as is a load that differs from its record,
a verify that reports damage, or a GC that aborts.

At the end: one GC (grace 0), ``verify(read_data=True)``, and every archive some owner still
retains must load identical to its record.  Prints operations by kind, errors by kind
(expected and unexpected), lost and corrupted samples and the final verify; exits 1 on any
unexpected error, loss or damage.

    python3 tools/soak.py [--processes 4] [--seconds 60] [--root DIR] [--catalog-url URL]
                          [--seed 0] [--json] [--two-hosts [--jfs-caches default|off]]

``--two-hosts`` (root, FUSE, ``juicefs``; issue 20): the pool on a JuiceFS volume mounted in
two mount namespaces at the same path (tests/jfshosts.py), metadata and catalog on a
throwaway PostgreSQL server; workers alternate between the two hosts, the final check runs
on the second.  The hosts keep JuiceFS's default metadata caches (``--jfs-caches off``: none,
``$ARCHIVE_MANAGER_JFS_CACHES`` by default).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from archive_manager import ArchiveManager, TensorRef
from archive_manager.errors import ArchiveReleasedError
from archive_manager.interop.synthetic import make_rollout

#: Small samples (a few dozen tokens) in chunks of 8, with routed-expert tensors above the
#: inline limit, so every archive has several chunks, tensor blobs and a manifest.
ROLLOUT = {"group_size": 4, "prompt_len": 16, "response_min": 8, "response_max": 48}
POOL_OPTIONS = {"chunk_size": 8, "inline_limit": 2048}
#: Half the saves draw their content from this many seeds, so identical rollouts recur across
#: workers; the other half save content of their own, which GC reclaims once released.
CONTENTS = 16
#: Relative weights of the operations.
MIX = {
    "save": 14,
    "stream": 8,
    "dedup": 10,
    "reference": 5,
    "retain": 8,
    "release": 12,
    "release-owner": 6,
    "gc": 5,
    "verify": 3,
    "owners": 2,
    "load": 12,
    "load-sample": 10,
    "load-task": 10,
}
MAX_TRACEBACKS = 10


# --------------------------------------------------------------------------- content


def canonical(value: Any) -> Any:
    """A JSON-able form of a sample that equal samples share: tensors (lazy or not) become
    dtype, shape and values, dataclasses their class name and attributes, enums their value."""
    if isinstance(value, TensorRef):
        value = value.materialize()
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), value.flatten().tolist()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__, canonical(vars(value))]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def sample_digest(sample: Any) -> str:
    """A digest of the canonical form of ``sample`` (floats by their exact repr)."""
    text = json.dumps(canonical(sample), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def content(seed: int, with_tensors: bool) -> list[Any]:
    """The rollout of content ``seed``: the same seed gives identical samples in any process."""
    n = 4 + seed * 5 % 37
    options = {**ROLLOUT, "r3_layers": 2 if with_tensors else None}
    return make_rollout(n, seed=seed, rollout_id=seed, **options)


# --------------------------------------------------------------------------- records


class Records:
    """The shared folder of records: what each published archive must contain."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, dict[str, Any]] = {}
        self._names: list[str] = []
        self._listed = 0.0

    def write(self, record: dict[str, Any]) -> None:
        """Publish ``record`` atomically (other workers may read it at any moment)."""
        path = self.folder / f"{record['name']}.json"
        tmp = self.folder / f".{record['name']}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        self._cache[record["name"]] = record
        self._names.append(record["name"])

    def names(self) -> list[str]:
        """Names with a record (the listing is refreshed at most twice a second)."""
        if time.monotonic() - self._listed > 0.5:
            self._names = sorted(p.stem for p in self.folder.glob("*.json"))
            self._listed = time.monotonic()
        return self._names

    def get(self, name: str) -> dict[str, Any]:
        """The record of archive ``name``."""
        if name not in self._cache:
            self._cache[name] = json.loads((self.folder / f"{name}.json").read_text())
        return self._cache[name]


def make_record(
    name: str, samples: list[Any], *, kind: str, seed: int | None, tensors: bool
) -> dict[str, Any]:
    """What archive ``name`` must contain: keys and sample digests, in archive order."""
    return {
        "name": name,
        "kind": kind,
        "seed": seed,
        "tensors": tensors,
        "digests": [sample_digest(s) for s in samples],
        "keys": [[f"sample:{s.index}", s.task_key] for s in samples],
    }


def differing(got: list[str], expected: list[str]) -> int:
    """How many samples differ between two lists of digests (missing and extra ones count)."""
    same_length = zip(got, expected, strict=False)
    return sum(a != b for a, b in same_length) + abs(len(got) - len(expected))


# --------------------------------------------------------------------------- worker


class Unexpected(Exception):
    """A check failed: a load differing from its record, damage, an impossible error."""


@dataclasses.dataclass
class Tally:
    """Operations and errors counted by kind."""

    ops: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    expected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    unexpected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    corrupted: int = 0
    tracebacks: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "ops": dict(self.ops),
            "expected": dict(self.expected),
            "unexpected": dict(self.unexpected),
            "corrupted": self.corrupted,
            "tracebacks": self.tracebacks,
        }


class Worker:
    """One process's random mix of operations on the shared pool."""

    def __init__(self, pool: ArchiveManager, records: Records, index: int, seed: int) -> None:
        self.pool = pool
        self.records = records
        self.index = index
        self.rng = random.Random(seed * 1_000_003 + index)
        self.tally = Tally()
        self.owners: list[str] = []
        self._seq = 0
        self.ops: dict[str, Callable[[], None]] = {
            "save": self.save,
            "stream": self.stream,
            "dedup": self.dedup,
            "reference": self.reference,
            "retain": self.retain,
            "release": self.release,
            "release-owner": self.release_owner,
            "gc": self.gc,
            "verify": self.verify,
            "owners": self.audit,
            "load": self.load,
            "load-sample": self.load_sample,
            "load-task": self.load_task,
        }

    def run(self, deadline: float) -> Tally:
        """Run random operations until ``deadline`` (``time.monotonic``)."""
        kinds, weights = list(MIX), list(MIX.values())
        # Every kind once first (a save leading, so the others find an archive), then the
        # weighted mix: a short run on a loaded machine still exercises each operation.
        first = [k for k in kinds if k != "save"]
        self.rng.shuffle(first)
        first.insert(0, "save")
        while time.monotonic() < deadline:
            kind = first.pop(0) if first else self.rng.choices(kinds, weights)[0]
            try:
                self.ops[kind]()
            except ArchiveReleasedError as exc:
                self.tally.expected[f"{kind}: {type(exc).__name__}"] += 1
                continue
            except Exception as exc:
                self.tally.unexpected[f"{kind}: {type(exc).__name__}"] += 1
                if len(self.tally.tracebacks) < MAX_TRACEBACKS:
                    self.tally.tracebacks.append(f"worker {self.index}, {kind}:\n" + _trace(exc))
                continue
            self.tally.ops[kind] += 1
        return self.tally

    # ------------------------------------------------------------- writes

    def _name(self, kind: str) -> str:
        self._seq += 1
        return f"w{self.index}-{self._seq:05d}-{kind}"

    def _publish(self, name: str, samples: list[Any], kind: str, seed: int, tensors: bool) -> None:
        record = make_record(name, samples, kind=kind, seed=seed, tensors=tensors)
        # Read back at once, before anyone can release it: a save must load as it was given.
        self.check(name, record)
        self.records.write(record)

    def _seed(self) -> int:
        if self.rng.random() < 0.5:
            return self.rng.randrange(CONTENTS)  # shared with other archives
        return self.rng.randrange(CONTENTS, 10**9)  # (almost surely) its own

    def save(self, kind: str = "save", seed: int | None = None) -> None:
        seed = self._seed() if seed is None else seed
        tensors = self.rng.random() < 0.5
        samples = content(seed, tensors)
        name = self._name(kind)
        self.pool.save(name, samples, rollout_id=seed)
        self._publish(name, samples, kind, seed, tensors)

    def stream(self) -> None:
        seed = self._seed()
        tensors = self.rng.random() < 0.5
        samples = content(seed, tensors)
        name = self._name("stream")
        with self.pool.writer(name, rollout_id=seed) as writer:
            for sample in samples:
                writer.add(sample)
        self._publish(name, samples, "stream", seed, tensors)

    def dedup(self) -> None:
        names = [n for n in self.records.names() if self.records.get(n)["seed"] is not None]
        if not names:
            return self.save("dedup")
        record = self.records.get(self.rng.choice(names))
        seed, tensors = record["seed"], record["tensors"]
        samples = content(seed, tensors)
        name = self._name("dedup")
        self.pool.save(name, samples, rollout_id=seed)
        self._publish(name, samples, "dedup", seed, tensors)

    def reference(self) -> None:
        source = self._pick()
        if source is None:
            return
        name = self._name("ref")
        try:
            self.pool.save(name, None, rollout_id=None, reference=source)
        except ArchiveReleasedError:
            self._expect_unowned(source)
            raise
        record = {**self.records.get(source), "name": name, "kind": "reference"}
        self.check(name, record)
        self.records.write(record)

    def retain(self) -> None:
        name = self._pick()
        if name is None:
            return
        self._seq += 1
        owner = f"checkpoint:w{self.index}-{self._seq}"  # unique: it retains one archive
        try:
            self.pool.retain(owner, name)
        except ArchiveReleasedError:
            self._expect_unowned(name)
            raise
        self.owners.append(owner)

    def release(self) -> None:
        name = self._pick()
        if name is not None:
            self.pool.open_archive(name).release()

    def release_owner(self) -> None:
        if self.owners:
            owner = self.owners.pop(self.rng.randrange(len(self.owners)))
            if self.pool.release_owner(owner) != 1:
                raise Unexpected(f"owner {owner} retained no archive when released")

    def gc(self) -> None:
        self.pool.gc(grace=0)

    def verify(self) -> None:
        report = self.pool.verify(read_data=self.rng.random() < 0.3)
        if not report.ok:
            raise Unexpected(
                "verify found damage: " + "; ".join(p.message for p in report.problems[:5])
            )

    def audit(self) -> None:
        self.pool.owners()

    # ------------------------------------------------------------- reads

    def _pick(self) -> str | None:
        names = self.records.names()
        return self.rng.choice(names) if names else None

    def load(self) -> None:
        name = self._pick()
        if name is not None:
            self.check(name, self.records.get(name))

    def _load_by(self, column: int) -> None:
        name = self._pick()
        if name is None:
            return
        record = self.records.get(name)
        key = self.rng.choice(record["keys"])[column]
        expected = [
            d for d, k in zip(record["digests"], record["keys"], strict=True) if k[column] == key
        ]
        archive = self.pool.open_archive(name)
        try:
            if column == 0:
                loaded = archive.load_samples(sample_key=key)
            else:
                loaded = archive.load_samples(task_key=key)
            got = [sample_digest(s) for s in loaded]
        except ArchiveReleasedError:
            self._expect_unowned(name)
            raise
        self._compare(name, got, expected, f"{('sample_key', 'task_key')[column]}={key!r}")

    def load_sample(self) -> None:
        self._load_by(0)

    def load_task(self) -> None:
        self._load_by(1)

    def check(self, name: str, record: dict[str, Any]) -> None:
        """Load archive ``name`` whole and compare it with ``record``."""
        archive = self.pool.open_archive(name)
        if [list(k) for k in archive.keys()] != record["keys"]:
            raise Unexpected(f"archive {name!r}: keys differ from its record")
        try:
            got = [sample_digest(s) for s in archive.load_samples()]
        except ArchiveReleasedError:
            self._expect_unowned(name)
            raise
        self._compare(name, got, record["digests"], "all samples")

    def _compare(self, name: str, got: list[str], expected: list[str], what: str) -> None:
        if got != expected:
            bad = differing(got, expected)
            self.tally.corrupted += bad
            raise Unexpected(f"archive {name!r}, {what}: {bad} sample(s) differ from the record")

    def _expect_unowned(self, name: str) -> None:
        """`ArchiveReleasedError` is expected only once nothing retains the archive.

        An archive that no owner retains can never be retained again, so owners seen now
        were there all along: the payload was theirs to keep.
        """
        owners = self.pool.open_archive(name).owners()
        if owners:
            raise Unexpected(f"archive {name!r} raised ArchiveReleasedError but {owners} retain it")


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))


def _run_worker(
    root: str, url: str | None, records: str, index: int, seed: int, seconds: float
) -> dict[str, Any]:
    tally = Tally()
    try:
        with ArchiveManager.open(root, catalog_url=url, **POOL_OPTIONS) as pool:  # type: ignore[arg-type]
            worker = Worker(pool, Records(Path(records)), index, seed)
            tally = worker.run(time.monotonic() + seconds)
    except BaseException as exc:
        tally.unexpected[f"worker: {type(exc).__name__}"] += 1
        tally.tracebacks.append(f"worker {index}:\n" + _trace(exc))
    return tally.as_dict()


def _work(
    root: str, url: str | None, records: str, index: int, seed: int, seconds: float, results: Any
) -> None:
    results.put(_run_worker(root, url, records, index, seed, seconds))


# --------------------------------------------------------------------------- final check


def final_check(root: str, url: str | None, records: Records) -> dict[str, Any]:
    """GC, rehash everything, and load every owned archive against its record."""
    out: dict[str, Any] = {"unexpected": collections.Counter(), "tracebacks": []}
    with ArchiveManager.open(root, catalog_url=url, **POOL_OPTIONS) as pool:  # type: ignore[arg-type]
        gc = pool.gc(grace=0)
        report = pool.verify(read_data=True)
        out["gc"] = {"blobs": gc.blobs, "bytes": gc.bytes, "orphans": gc.orphans}
        out["verify"] = {
            "ok": report.ok,
            "blobs_checked": report.blobs_checked,
            "bytes_read": report.bytes_read,
            "problems": [p.message for p in report.problems[:20]],
            "notices": collections.Counter(n.kind for n in report.notices),
        }
        archives = {a.name: a for a in pool.find(state=None)}
        names = records.names()
        out["archives"] = len(archives)
        out["unrecorded"] = sorted(set(archives) - set(names))
        owned = released = lost = corrupted = owned_samples = 0
        for name in names:
            record = records.get(name)
            if name not in archives:
                out["unexpected"]["final: recorded archive missing"] += 1
                lost += len(record["digests"])
                continue
            archive = pool.open_archive(name)
            if not archive.owners():
                released += 1
                continue
            owned += 1
            owned_samples += len(record["digests"])
            try:
                got = [sample_digest(s) for s in archive.load_samples()]
            except Exception as exc:
                out["unexpected"][f"final load: {type(exc).__name__}"] += 1
                out["tracebacks"].append(f"final load of {name!r}:\n" + _trace(exc))
                lost += len(record["digests"])
                continue
            corrupted += differing(got, record["digests"])
        out.update(
            owned=owned,
            owned_samples=owned_samples,
            released=released,
            lost_samples=lost,
            corrupted_samples=corrupted,
        )
    return out


# --------------------------------------------------------------------------- main


def soak(root: Path, url: str | None, processes: int, seconds: float, seed: int) -> dict[str, Any]:
    """Run the soak and the final check; return the summary."""
    ArchiveManager.open(root, catalog_url=url).close()  # create (and migrate) it once
    folder = Path(tempfile.mkdtemp(prefix="soak-records-"))
    try:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_work, args=(str(root), url, str(folder), i, seed, seconds, results))
            for i in range(processes)
        ]
        started = time.monotonic()
        for proc in procs:
            proc.start()
        tallies = [results.get(timeout=seconds + 600) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        elapsed = time.monotonic() - started
        final = final_check(str(root), url, Records(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    catalog = "sqlite" if url is None else url.split(":", 1)[0]
    return summarize(tallies, final, processes, elapsed, seed, catalog)


def soak_two_hosts(
    url: str | None, processes: int, seconds: float, seed: int, caches: bool | None = None
) -> dict[str, Any]:
    """The soak on two hosts (tests/jfshosts.py): a JuiceFS volume with its metadata on a
    throwaway PostgreSQL server, mounted through FUSE in two mount namespaces at the same
    path; workers alternate between the hosts, the final check runs on the second.  The
    catalog: ``url``, or a database on that server.  ``caches``: whether the mounts keep
    JuiceFS's default metadata caches (None: ``$ARCHIVE_MANAGER_JFS_CACHES``, default yes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from jfshosts import TwoHosts
    from pgserver import PgServer

    folder = Path(tempfile.mkdtemp(prefix="soak-records-"))
    try:
        with PgServer.start() as pg:
            meta = pg.create_database().rsplit("/", 1)[1]
            url = url or pg.create_database()
            meta_url = f"postgres://postgres@{pg.host}:{pg.port}/{meta}?sslmode=disable"
            with TwoHosts.start(meta_url, caches=caches) as hosts:
                root = str(hosts.mount_point / "pool")

                def on(host: int, *args: Any) -> subprocess.Popen[str]:
                    return hosts.hosts[host].python(
                        __file__, "--on-host", json.dumps(args), stdout=subprocess.PIPE
                    )

                def answer(proc: subprocess.Popen[str], timeout: float) -> Any:
                    out, _ = proc.communicate(timeout=timeout)
                    if proc.returncode != 0:
                        raise RuntimeError(f"a soak process on a host failed ({proc.returncode})")
                    return json.loads(out.strip().splitlines()[-1])

                answer(on(0, "create", root, url), 300)
                started = time.monotonic()
                procs = [
                    on(i % 2, "work", root, url, str(folder), i, seed, seconds)
                    for i in range(processes)
                ]
                tallies = [answer(p, seconds + 600) for p in procs]
                elapsed = time.monotonic() - started
                final = answer(on(1, "final", root, url, str(folder)), 3600)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return summarize(tallies, final, processes, elapsed, seed, "postgresql, two hosts on JuiceFS")


def _on_host(args: list[Any]) -> Any:
    """What one process of `soak_two_hosts` does on its host, as JSON."""
    what, root, url, *rest = args
    if what == "create":
        ArchiveManager.open(root, catalog_url=url).close()
        return {}
    if what == "work":
        return _run_worker(root, url, *rest)
    return final_check(root, url, Records(Path(rest[0])))


def summarize(
    tallies: list[dict[str, Any]],
    final: dict[str, Any],
    processes: int,
    elapsed: float,
    seed: int,
    catalog: str,
) -> dict[str, Any]:
    """The summary of a soak from its workers' tallies and the final check."""
    ops: collections.Counter[str] = collections.Counter()
    expected: collections.Counter[str] = collections.Counter()
    unexpected: collections.Counter[str] = collections.Counter(final.pop("unexpected"))
    corrupted = 0
    tracebacks: list[str] = final.pop("tracebacks")
    for tally in tallies:
        ops.update(tally["ops"])
        expected.update(tally["expected"])
        unexpected.update(tally["unexpected"])
        corrupted += tally["corrupted"]
        tracebacks.extend(tally["tracebacks"])
    return {
        "processes": processes,
        "seconds": round(elapsed, 1),
        "seed": seed,
        "catalog": catalog,
        "ops": dict(sorted(ops.items())),
        "ops_total": sum(ops.values()),
        "expected_errors": dict(sorted(expected.items())),
        "unexpected_errors": dict(sorted(unexpected.items())),
        "corrupted_during_run": corrupted,
        "final": final,
        "tracebacks": tracebacks,
    }


def passed(summary: dict[str, Any]) -> bool:
    """No unexpected error, no lost or corrupted sample, no damage found by verify."""
    final = summary["final"]
    return (
        not summary["unexpected_errors"]
        and summary["corrupted_during_run"] == 0
        and final["lost_samples"] == 0
        and final["corrupted_samples"] == 0
        and final["verify"]["ok"]
    )


def _print(summary: dict[str, Any]) -> None:
    final = summary["final"]
    print(
        f"soak: {summary['processes']} processes, {summary['seconds']} s, "
        f"catalog {summary['catalog']}, seed {summary['seed']}"
    )
    print(f"operations done: {summary['ops_total']}")
    for kind, n in summary["ops"].items():
        print(f"  {kind:<14} {n:>7}")
    print(f"expected errors: {sum(summary['expected_errors'].values())}")
    for kind, n in summary["expected_errors"].items():
        print(f"  {kind:<40} {n:>5}")
    print(f"unexpected errors: {sum(summary['unexpected_errors'].values())}")
    for kind, n in summary["unexpected_errors"].items():
        print(f"  {kind:<40} {n:>5}")
    print(
        f"samples corrupted during the run: {summary['corrupted_during_run']}; at the end: "
        f"lost {final['lost_samples']}, corrupted {final['corrupted_samples']} "
        f"(of {final['owned_samples']} in {final['owned']} owned archives; "
        f"{final['released']} released, {final['archives']} archives in the catalog)"
    )
    verify = final["verify"]
    print(
        f"final gc: {final['gc']['blobs']} blobs, {final['gc']['bytes']} bytes, "
        f"{final['gc']['orphans']} orphans; final verify(read_data=True): "
        f"{'ok' if verify['ok'] else 'DAMAGE'}, {verify['blobs_checked']} blobs, "
        f"{verify['bytes_read']} bytes rehashed, notices {dict(verify['notices']) or 'none'}"
    )
    for problem in verify["problems"]:
        print(f"  problem: {problem}")
    print("PASS" if passed(summary) else "FAIL")


def main(argv: list[str] | None = None) -> int:
    """Parse options, soak, print the summary; 0 if it passed, 1 if not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--root", type=Path, help="the pool (default: a new temp folder)")
    parser.add_argument("--catalog-url", help="SQLAlchemy URL (default: SQLite in the root)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--two-hosts",
        action="store_true",
        help="the pool on a JuiceFS volume mounted on two hosts (mount namespaces; root, "
        "FUSE, juicefs and PostgreSQL's binaries needed), workers alternating between them; "
        "catalog: --catalog-url or a throwaway PostgreSQL database",
    )
    parser.add_argument(
        "--jfs-caches",
        choices=("default", "off"),
        help="with --two-hosts: mount with JuiceFS's default metadata caches or with them off "
        "(default: $ARCHIVE_MANAGER_JFS_CACHES, else default)",
    )
    parser.add_argument("--on-host", help=argparse.SUPPRESS)  # one process of --two-hosts
    args = parser.parse_args(argv)
    if args.on_host is not None:
        print(json.dumps(_on_host(json.loads(args.on_host)), default=dict))
        return 0
    if args.processes < 1 or args.seconds <= 0:
        parser.error("--processes must be >= 1 and --seconds > 0")
    if args.two_hosts:
        if args.root is not None:
            parser.error("--two-hosts makes its own pool: no --root")
        caches = None if args.jfs_caches is None else args.jfs_caches == "default"
        summary = soak_two_hosts(args.catalog_url, args.processes, args.seconds, args.seed, caches)
        return _report(summary, args.json)
    temp = None
    if args.root is None:
        temp = Path(tempfile.mkdtemp(prefix="soak-pool-"))
        args.root = temp / "pool"
    try:
        summary = soak(args.root, args.catalog_url, args.processes, args.seconds, args.seed)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    return _report(summary, args.json)


def _report(summary: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(summary, indent=1, default=dict))
    else:
        _print(summary)
        for trace in summary["tracebacks"]:
            print(trace, file=sys.stderr)
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
