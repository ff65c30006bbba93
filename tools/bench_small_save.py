#!/usr/bin/env python3
"""What a small save costs (docs/performance.md, "Small saves").

Times `pool.save` of 1 and of 8 realistic small samples (slime `Sample`s of a 256-token prompt
and a 768-1,280-token response: tokens, loss mask, log-probs, texts; a new reward each round,
so that every save writes its chunk), against `torch.save` of
the same samples to a file followed by an fsync of the file and of its folder (the least a
durable file needs), and a bare floor: a 40 kB write + fsync, and an fsync of its folder.
Real fsyncs: run it without eatmydata (its figures say so when ``LD_PRELOAD`` names it).

With ``--phases`` each save is also broken down: the time inside each catalog transaction
(its commit included, by step name), inside each fsync the library makes (files and folders
apart; SQLite's own fsync of its WAL is part of its transaction), and the threads started.

Each save's CPU time (the process's, its sync threads included) is reported beside its wall
time, and ``--phases`` also counts the SQL statements of each transaction.  ``--tree DIR``
times the archive_manager of another checkout (a tree before a change, whose own copy of this
tool may lack these figures), so before and after can be run by turns with one tool.

    python3 tools/bench_small_save.py [--rounds 40] [--root DIR] [--phases] [--catalog-url URL]
        [--tree DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import stat
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _tree(argv: list[str]) -> Path:
    """The checkout whose archive_manager is timed: ``--tree DIR``, else this one (read
    before the imports below, which it decides)."""
    for i, arg in enumerate(argv):
        if arg == "--tree" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if arg.startswith("--tree="):
            return Path(arg.split("=", 1)[1]).resolve()
    return Path(__file__).resolve().parents[1]


REPO = _tree(sys.argv)
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from sqlalchemy import event  # noqa: E402

from archive_manager import ArchiveManager  # noqa: E402
from archive_manager.catalog import Catalog  # noqa: E402
from archive_manager.interop.synthetic import make_rollout  # noqa: E402


def small_samples(n: int) -> list[Any]:
    return make_rollout(n, seed=7, prompt_len=256, response_min=768, response_max=1280)


def fresh(samples: list[Any], r: int) -> list[Any]:
    """The samples with a new reward each round: every save writes a new chunk, as a
    training run's do (the same samples again would be deduplicated, their chunk not
    written)."""
    for i, sample in enumerate(samples):
        sample.reward = float(r * 1000 + i)
    return samples


class Phases:
    """Attributes a save's wall time to catalog transactions, fsyncs and thread starts."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.statements: dict[str, int] = defaultdict(int)  # by transaction step
        self._tls = threading.local()

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] += seconds
        self.counts[key] += 1

    @contextlib.contextmanager
    def installed(self, pool: ArchiveManager) -> Iterator[None]:
        phases = self
        engine = pool.catalog.engine

        def count(*args: Any) -> None:
            phases.statements[getattr(phases._tls, "step", None) or "outside a write"] += 1

        fsync, start, write = os.fsync, threading.Thread.start, Catalog.write

        def timed_fsync(fd: int) -> None:
            what = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            began = time.perf_counter()
            try:
                fsync(fd)
            finally:
                # Inside a transaction (a blob taken back): counted there, not twice.
                if not getattr(phases._tls, "in_txn", False):
                    phases.add(f"fsync {what}", time.perf_counter() - began)

        def timed_start(thread: threading.Thread) -> None:
            began = time.perf_counter()
            start(thread)
            phases.add("thread start", time.perf_counter() - began)

        @contextlib.contextmanager
        def timed_write(catalog: Catalog, step: str | None = None, **kw: Any) -> Iterator[Any]:
            began = time.perf_counter()
            phases._tls.in_txn = True
            phases._tls.step = f"txn {step or 'renew'}"
            try:
                with write(catalog, step, **kw) as conn:
                    yield conn
            finally:
                phases._tls.in_txn = False
                phases._tls.step = None
                phases.add(f"txn {step or 'renew'}", time.perf_counter() - began)

        os.fsync = timed_fsync
        threading.Thread.start = timed_start  # type: ignore[method-assign]
        Catalog.write = timed_write  # type: ignore[assignment,method-assign]
        event.listen(engine, "before_cursor_execute", count)
        try:
            yield
        finally:
            event.remove(engine, "before_cursor_execute", count)
            os.fsync = fsync
            threading.Thread.start = start  # type: ignore[method-assign]
            Catalog.write = write  # type: ignore[method-assign]


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


def bare_floor(folder: Path, rounds: int) -> dict[str, float]:
    """A 40 kB file written and fsynced, then its folder fsynced: what one durable file costs
    this disk, and each of its two fsyncs."""
    data = os.urandom(40_000)
    write_s, dir_s = [], []
    for i in range(rounds):
        began = time.perf_counter()
        fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        mid = time.perf_counter()
        dfd = os.open(folder, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        write_s.append(mid - began)
        dir_s.append(time.perf_counter() - mid)
    return {
        "write_fsync_ms": median_ms(write_s),
        "dir_fsync_ms": median_ms(dir_s),
        "durable_file_ms": median_ms([a + b for a, b in zip(write_s, dir_s, strict=True)]),
    }


def torch_save(folder: Path, samples: list[Any], i: int) -> None:
    path = folder / f"t{i}.pt"
    buffer = io.BytesIO()
    torch.save([s.to_dict() for s in samples], buffer)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, buffer.getbuffer())
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--root", type=Path, default=None, help="where the temp pool goes")
    ap.add_argument("--catalog-url", default=None, help="a PostgreSQL catalog (default SQLite)")
    ap.add_argument("--phases", action="store_true", help="break each save down")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tree", type=Path, help="time another checkout's archive_manager")
    args = ap.parse_args(argv)
    real_fsyncs = "eatmydata" not in os.environ.get("LD_PRELOAD", "")

    base = Path(tempfile.mkdtemp(prefix="bench-small-", dir=args.root))
    load_before = os.getloadavg()
    sets = {n: small_samples(n) for n in (1, 8)}
    out: dict[str, Any] = {
        "tokens_per_sample": statistics.median(len(s.tokens) for s in sets[8]),
        "rounds": args.rounds,
        "catalog": "postgresql" if args.catalog_url else "sqlite",
        "real_fsyncs": real_fsyncs,
        "tree": str(REPO),
    }
    try:
        (base / "floor").mkdir()
        (base / "torch").mkdir()
        times: dict[str, list[float]] = defaultdict(list)
        cpu: dict[str, list[float]] = defaultdict(list)
        phases = {n: Phases() for n in sets}
        with ArchiveManager.open(base / "pool", args.catalog_url) as pool:
            for n, samples in sets.items():  # warm-up: imports, first folders, connections
                pool.save(f"warm{n}", samples, rollout_id=0)
            for r in range(args.rounds):
                for n, samples in sets.items():
                    fresh(samples, r)
                    began_cpu = time.process_time()
                    times[f"save{n}"].append(
                        timed(lambda: pool.save(f"s{n}-{r}", samples, rollout_id=r))  # noqa: B023
                    )
                    cpu[f"save{n}"].append(time.process_time() - began_cpu)
                    times[f"torch{n}"].append(
                        timed(lambda: torch_save(base / "torch", samples, n * 10_000 + r))  # noqa: B023
                    )
            if args.phases:
                for r in range(args.rounds):
                    for n, samples in sets.items():
                        fresh(samples, args.rounds + r)
                        with phases[n].installed(pool):
                            pool.save(f"p{n}-{r}", samples, rollout_id=r)
        out["floor"] = bare_floor(base / "floor", args.rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["load_before"] = [round(x, 2) for x in load_before]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out["median_ms"] = {k: median_ms(v) for k, v in times.items()}
    out["cpu_median_ms"] = {k: median_ms(v) for k, v in cpu.items()}
    if args.phases:
        out["phases_ms_per_save"] = {
            n: {
                k: {
                    "ms": round(p.seconds[k] / args.rounds * 1e3, 2),
                    "count": p.counts[k] / args.rounds,
                }
                for k in sorted(p.seconds)
            }
            for n, p in phases.items()
        }
        out["statements_per_save"] = {
            n: {k: v / args.rounds for k, v in sorted(p.statements.items())}
            for n, p in phases.items()
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    m, floor = out["median_ms"], out["floor"]
    if not real_fsyncs:
        print("WARNING: eatmydata is loaded: fsyncs cost nothing, these are no disk's figures")
    print(
        f"small saves ({out['catalog']} catalog), medians of {args.rounds}; "
        f"{out['tokens_per_sample']:.0f} tokens a sample; load average "
        f"{out['load_before'][0]} before, {out['load_after'][0]} after; {REPO}"
    )
    for n in sets:
        print(
            f"  {n} sample(s): pool.save {m[f'save{n}']:7.2f} ms "
            f"(CPU {out['cpu_median_ms'][f'save{n}']:6.2f} ms)   torch.save+fsyncs "
            f"{m[f'torch{n}']:6.2f} ms   ratio {m[f'save{n}'] / m[f'torch{n}']:.1f}x"
        )
    print(
        f"  floor: 40 kB write+fsync {floor['write_fsync_ms']} ms, folder fsync "
        f"{floor['dir_fsync_ms']} ms, a durable file {floor['durable_file_ms']} ms"
    )
    if args.phases:
        for n, rows in out["phases_ms_per_save"].items():
            print(f"  phases of a save of {n} (ms per save, count per save):")
            for key, row in rows.items():
                print(f"    {key:24}{row['ms']:7.2f} ms  x{row['count']:g}")
            counted = out["statements_per_save"][n]
            print(
                f"  SQL statements of a save of {n}: {sum(counted.values()):g} ("
                + ", ".join(f"{k} {v:g}" for k, v in counted.items())
                + ")"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
