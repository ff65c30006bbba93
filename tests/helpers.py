"""Shared test helpers: catalog backends, small realistic samples, deep sample equality,
pool snapshots (blob files, temp files and every catalog row) for "nothing changed", and
the crashed-writer seams. Fixtures stay in conftest.py; tests import these directly
(``from helpers import tiny_rollout``; pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import enum
import itertools
import math
import os
import stat
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from pgserver import (  # tests/pgserver.py: pytest puts tests/ on sys.path
    PgServer,
)
from sqlalchemy import inspect, select, text

import archive_manager.manager as manager_module
import archive_manager.pool.writer as writer_module
from archive_manager import ArchiveManager, ArchiveWriter, TensorRef
from archive_manager._util.names import check_archive_name, check_owner
from archive_manager.blobs import LocalBlobStore, RetryingReads
from archive_manager.catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    lease_blobs_table,
    leases_table,
    retention_table,
    sample_metadata_table,
)
from archive_manager.errors import UnencodableError
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool.identity import SPARE_FILE
from archive_manager.samples import sample_to_fields

BACKENDS = ["sqlite", "postgresql"]
REQUIRE_PG_ENV = "ARCHIVE_MANAGER_REQUIRE_PG"

#: A plausible "now" for fake clocks (2023-11-14), far from 0 so expiries are not negative.
EPOCH = 1_700_000_000.0

#: Small but realistically shaped rollouts: shared prompts per group, loss masks, float32
#: log-probs, truncated samples, ``task_key`` attributes.  Big enough for several chunks.
SMALL_ROLLOUT = {"prompt_len": 48, "response_min": 16, "response_max": 96}

#: Tiny rollouts (groups of 2, a few tokens each) for tests that save many archives.
TINY_ROLLOUT = {"prompt_len": 8, "response_min": 4, "response_max": 12, "group_size": 2}

#: Every catalog table, in creation order.
CATALOG_TABLES = (
    archives_table,
    chunks_table,
    entries_table,
    sample_metadata_table,
    archive_blobs_table,
    blobs_table,
    retention_table,
    leases_table,
    lease_blobs_table,
)


class FakeClock:
    """An injectable clock (``ArchiveManager.open(clock=...)``) that moves only when told."""

    def __init__(self, start: float = EPOCH) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds


def wall_clock() -> FakeClock:
    """A `FakeClock` starting at the real time, so it compares with file mtimes (GC grace)."""
    return FakeClock(time.time())


class Backend:
    """The catalog backend of one test: ``url(root)`` is the ``catalog_url`` of the pool at
    ``root`` (None on SQLite: the pool's own file; on PostgreSQL a new database per root,
    dropped at teardown)."""

    def __init__(self, name: str, server: PgServer | None) -> None:
        self.name = name
        self.server = server
        self._urls: dict[Path, str] = {}
        self._others: list[str] = []

    def url(self, root: str | os.PathLike[str]) -> str | None:
        if self.server is None:
            return None
        key = Path(root).expanduser().resolve()
        if key not in self._urls:
            self._urls[key] = self.server.create_database()
        return self._urls[key]

    def new_url(self) -> str:
        """A new empty database on the server (PostgreSQL only)."""
        assert self.server is not None, "new_url() needs the postgresql backend"
        url = self.server.create_database()
        self._others.append(url)
        return url

    def close(self) -> None:
        if self.server is not None:
            for url in [*self._urls.values(), *self._others]:
                self.server.drop_database(url)
        self._urls.clear()
        self._others.clear()


def open_on(backend: Backend, root: str | os.PathLike[str], **options: Any) -> ArchiveManager:
    """`ArchiveManager.open` on ``backend`` (an explicit ``catalog_url`` option wins)."""
    if "catalog_url" not in options:
        options["catalog_url"] = backend.url(root)
    return ArchiveManager.open(root, **options)


def small_rollout(n: int = 70, *, seed: int = 0, rollout_id: int = 0, **options: Any) -> list:
    """`make_rollout` with short prompts and responses (fast), seeded and realistic."""
    return make_rollout(n, seed=seed, rollout_id=rollout_id, **{**SMALL_ROLLOUT, **options})


def tiny_rollout(n: int = 6, seed: int = 0, **options: Any) -> list:
    """`small_rollout` with `TINY_ROLLOUT` shapes and two routed-expert layers by default."""
    return small_rollout(n, seed=seed, **{**TINY_ROLLOUT, "r3_layers": 2, **options})


# --------------------------------------------------------------------------- equality


def _float_bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return bytes(t.reshape(-1).view(torch.uint8).numpy())


def _same_plain_list(actual: list, expected: list) -> bool:
    """True if both are equal lists of one plain type (floats bit for bit); False when the
    element-wise comparison must decide."""
    kinds = set(map(type, expected))
    if len(kinds) != 1 or set(map(type, actual)) != kinds:
        return False
    (kind,) = kinds
    if kind is float:
        return array.array("d", actual).tobytes() == array.array("d", expected).tobytes()
    return kind in (int, str, bool) and actual == expected


def assert_same(actual: Any, expected: Any, path: str = "sample") -> None:
    """Assert that a loaded value equals the saved one exactly, field by field.

    Types must match exactly (an int stays an int, a list a list, a bool a bool), floats bit
    for bit (nan, -0.0), tensors in dtype, shape and bytes.  A `TensorRef` counts as its
    tensor (and is materialized).  Registered dataclass samples compare as their stored
    fields, so ``_queue_*`` attributes of the saved sample are ignored.
    """
    if isinstance(actual, TensorRef):
        actual = actual.materialize()
    if isinstance(expected, TensorRef):
        expected = expected.materialize()
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        a_name, a_fields = sample_to_fields(actual)
        e_name, e_fields = sample_to_fields(expected)
        assert a_name == e_name, path
        assert_same(a_fields, e_fields, path)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        assert _tensor_bytes(actual) == _tensor_bytes(expected), f"{path}: tensor values differ"
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual)} is not an ndarray"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        assert actual.tobytes() == expected.tobytes(), f"{path}: array values differ"
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if type(expected) is list and _same_plain_list(actual, expected):
        return  # fast path for token ids, masks and log-probs
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, float):
        same = _float_bits(actual) == _float_bits(expected)
        assert same or (math.isnan(actual) and math.isnan(expected)), (
            f"{path}: {actual!r} != {expected!r}"
        )
    elif isinstance(expected, enum.Enum) or expected is None:
        assert actual is expected, f"{path}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_same_samples(actual: list, expected: list) -> None:
    """`assert_same` over two lists of samples (saved ones as stored: no ``_queue_*``)."""
    assert len(actual) == len(expected), f"{len(actual)} samples loaded, {len(expected)} saved"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if isinstance(e, dict):
            e = sample_to_fields(e)[1]  # without the _queue_* keys, which are never stored
        assert_same(a, e, f"sample[{i}]")


def canon(value: Any) -> Any:
    """A comparable form of a sample: tensors (lazy or not) become dtype, shape and values."""
    if isinstance(value, TensorRef):
        value = value.materialize()
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, canon(vars(value)))
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def assert_loads(pool: ArchiveManager, name: str, expected: list[Any]) -> None:
    """Archive ``name`` of ``pool`` loads as ``expected`` (compared by `canon`)."""
    loaded = pool.open_archive(name).load_samples()
    assert [canon(s) for s in loaded] == [canon(s) for s in expected]


# --------------------------------------------------------------------------- files and rows


def blob_files(root: Path) -> list[str]:
    """Every file under ``root / "blobs"`` (canonical or not), relative, sorted."""
    base = root / "blobs"
    if not base.exists():
        return []
    return sorted(
        str(p.relative_to(base)) for p in base.rglob("*") if not p.is_dir() and p.name != SPARE_FILE
    )


def blob_names(pool: ArchiveManager) -> set[str]:
    """Names of every file under ``blobs/`` (canonical or not)."""
    return {
        p.name for p in (pool.root / "blobs").rglob("*") if p.is_file() and p.name != SPARE_FILE
    }


def blob_sizes(pool: ArchiveManager) -> dict[str, int]:
    """digest -> size of every ``blobs`` row."""
    with pool.catalog.read() as conn:
        return dict(conn.execute(select(blobs_table.c.digest, blobs_table.c.size)).all())


def owned_blobs(pool: ArchiveManager) -> set[str]:
    """The union of the blobs of every archive some owner retains."""
    ab, r = archive_blobs_table, retention_table
    with pool.catalog.read() as conn:
        return set(
            conn.execute(
                select(ab.c.digest).join(r, r.c.archive_id == ab.c.archive_id).distinct()
            ).scalars()
        )


def folder_store(pool: ArchiveManager) -> LocalBlobStore:
    """The filesystem store of a writable pool on a folder, behind its read retry wrapper
    (`local_pool_store`): a test that makes the store fail patches this one, whose every call
    the wrapper makes (a patch of ``pool.store.delete`` would not see GC's ``delete_many``)."""
    store = pool.store
    assert isinstance(store, RetryingReads) and isinstance(store.inner, LocalBlobStore), store
    return store.inner


def make_writable(path: Path) -> None:
    """Let the test change or delete a read-only blob file: chmod it and its folders."""
    for folder in (path.parent.parent, path.parent):
        folder.chmod(folder.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    if path.exists():
        path.chmod(0o644)


class BlobFiles:
    """The blob files of one pool, as a test sees and damages them behind the catalog."""

    def __init__(self, pool: ArchiveManager) -> None:
        self.pool = pool

    def files(self) -> list[str]:
        """Every file under ``blobs/``, relative, sorted."""
        return blob_files(self.pool.root)

    def digests(self, name: str, kind: str | None = None) -> list[str]:
        """The digests archive ``name``'s ``archive_blobs`` rows name (of one ``kind``)."""
        ab, a = archive_blobs_table, archives_table
        query = select(ab.c.digest).join(a, a.c.id == ab.c.archive_id).where(a.c.name == name)
        if kind is not None:
            query = query.where(ab.c.kind == kind)
        with self.pool.catalog.read() as conn:
            return sorted(conn.execute(query).scalars())

    def chunks(self, name: str) -> list[str]:
        """The chunk digests of archive ``name``, by ordinal."""
        c, a = chunks_table, archives_table
        with self.pool.catalog.read() as conn:
            return list(
                conn.execute(
                    select(c.c.digest)
                    .join(a, a.c.id == c.c.archive_id)
                    .where(a.c.name == name)
                    .order_by(c.c.ordinal)
                ).scalars()
            )

    def delete(self, digest: str) -> None:
        """Unlink a blob file behind the catalog's back."""
        path = local_store(self.pool).path(digest)
        make_writable(path)
        path.unlink()

    def delete_all(self) -> int:
        """Unlink every file under ``blobs/``; return how many."""
        files = [
            p
            for p in (self.pool.root / "blobs").rglob("*")
            if not p.is_dir() and p.name != SPARE_FILE
        ]
        for path in files:
            make_writable(path)
            path.unlink()
        return len(files)

    def flip_bit(self, digest: str, offset: int | None = None) -> None:
        """Flip one bit of a blob file in place (default: in its middle)."""
        path = local_store(self.pool).path(digest)
        make_writable(path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2 if offset is None else offset] ^= 0x10
        path.write_bytes(bytes(data))


def local_store(pool: ArchiveManager) -> LocalBlobStore:
    """The pool's filesystem store, for a test that reaches behind the store interface to its
    files (`LocalBlobStore.path`, `LocalBlobStore.temp_files`): the store itself, or a wrapper
    that passes those calls through to it (`RetryingReads`, a test's `FaultyBlobStore`)."""
    return cast(LocalBlobStore, pool.store)


def table_rows(pool: ArchiveManager) -> dict[str, list[tuple]]:
    """Every row of every catalog table, sorted, by table name.

    Except the save counter (``pool_info`` ``save_seq``): like a database sequence it is
    consumed by a save that then fails, and that is no change to what the pool holds.
    """
    names = sorted(inspect(pool.catalog.engine).get_table_names())
    out: dict[str, list[tuple]] = {}
    with pool.catalog.read() as conn:
        for name in names:
            rows = conn.execute(text(f'SELECT * FROM "{name}"')).all()
            if name == "pool_info":
                rows = [r for r in rows if r[0] != "save_seq"]
            out[name] = sorted((tuple(r) for r in rows), key=repr)
    return out


@dataclass(frozen=True)
class PoolSnapshot:
    """What a failed call must leave unchanged: blob files, temp files, catalog rows."""

    blobs: list[str]
    temp: list[str]
    rows: dict[str, list[tuple]]
    journal: list[str] = dataclasses.field(default_factory=list)  # retention journal files

    def row_counts(self) -> dict[str, int]:
        """Rows per catalog table."""
        return {name: len(rows) for name, rows in self.rows.items()}


def snapshot_pool(pool: ArchiveManager) -> PoolSnapshot:
    """Take a `PoolSnapshot` of ``pool``."""
    return PoolSnapshot(
        blobs=blob_files(pool.root),
        temp=sorted(str(p) for p, _ in local_store(pool).temp_files()),
        rows=table_rows(pool),
        journal=sorted(p.name for p in (pool.root / "journal").glob("*")),
    )


# --------------------------------------------------------------------------- interrupted saves


class Killed(BaseException):
    """Stands for the death of a saving process."""


def abandon_writer(
    pool: ArchiveManager, name: str, samples: list[Any], *, keep_io: bool = False
) -> ArchiveWriter:
    """A save that stored its first chunk(s), then stopped (paused or dead): its lease is no
    longer renewed, and it neither commits nor aborts."""
    w = pool.writer(name, rollout_id=0)
    for s in samples:
        w.add(s)
    w.wait_stored()
    if keep_io:
        w.stop_renewing()  # paused: it may wake up and try to finish
    else:
        w.abandon()
    return w


def die_before_publish(
    pool: ArchiveManager, name: str, samples: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save killed after it committed ownership (step 4) but before it published (step 5)."""

    def publish(self: ArchiveWriter, archive_id: int, manifest: str) -> None:
        raise Killed

    def abort(self: ArchiveWriter) -> None:
        self.abandon()  # a dead process renews nothing and rolls nothing back

    with monkeypatch.context() as m:
        m.setattr(ArchiveWriter, "_publish", publish)
        m.setattr(ArchiveWriter, "abort", abort)
        with pytest.raises(Killed):
            pool.save(name, samples, rollout_id=0)


@contextlib.contextmanager
def python_only() -> Iterator[None]:
    """The codec's Python paths alone, as without the C extension (the reference the native
    functions are held to)."""
    from archive_manager import codec

    saved = (
        codec._native_numbers,
        codec._native_first_leaves,
        codec._native_dict_items,
        codec._native_stored_list,
    )
    codec._native_numbers = codec._native_first_leaves = codec._native_dict_items = None
    codec._native_stored_list = None
    try:
        yield
    finally:
        (
            codec._native_numbers,
            codec._native_first_leaves,
            codec._native_dict_items,
            codec._native_stored_list,
        ) = saved


def python_array(value: list) -> tuple[str, bytes, bool] | None:
    """What `_Encoder._array` stores for ``value`` (dtype, bytes, shuffled) through the Python
    paths only: the reference the native ``numbers`` is held to."""
    from archive_manager import codec

    record = codec._Record(codec.DEFAULT_INLINE_LIMIT, {})
    with python_only():
        node = codec._Encoder(record)._array(value)
    if node is None:
        return None
    return node["d"], b"".join(map(bytes, record.arrays)), node["s"]


def _exact_archive_rows_by_name(conn: Any, name: str) -> tuple[tuple[str, ...], list[Any]]:
    a = archives_table
    states = ["published", "released", "pending"]
    return (name,), list(conn.execute(select(a).where(a.c.name == name, a.c.state.in_(states))))


@contextlib.contextmanager
def older_version(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Within the block, the pool takes names and owners as versions before this rule did
    (any spelling, invisible characters allowed, exact lookups): how such names come to be
    stored."""
    with monkeypatch.context() as patch:
        patch.setattr(writer_module, "check_new_archive_name", check_archive_name)
        patch.setattr(writer_module, "archive_rows_by_name", _exact_archive_rows_by_name)
        patch.setattr(manager_module, "check_new_owner", check_owner)
        patch.setattr(manager_module, "name_spellings", lambda text: [text])
        yield


def extract_legacy(tmp_path: Path) -> Path:
    """A pool written by the previous release (no identity), moved to ``tmp_path``."""
    with tarfile.open(Path(__file__).resolve().parent / "data" / "legacy-pool-r2.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "legacy-pool"


_saved_names = itertools.count()


def refused(pool: ArchiveManager, sample: Any, match: str) -> None:
    """``save`` and the writer's ``add`` refuse ``sample`` with an `UnencodableError`
    matching ``match``; the pool is as it was."""
    before = snapshot_pool(pool)
    with pytest.raises(UnencodableError, match=match):
        pool.save(f"refused-{next(_saved_names)}", [sample], rollout_id=1)
    with (
        pytest.raises(UnencodableError, match=match),
        pool.writer(f"refused-{next(_saved_names)}", rollout_id=1) as w,
    ):
        w.add(sample)
    assert snapshot_pool(pool) == before


def round_trip(pool: ArchiveManager, sample: Any) -> Any:
    """``sample`` saved alone into ``pool`` and loaded back."""
    name = f"round-trip-{next(_saved_names)}"
    pool.save(name, [sample], rollout_id=1)
    (loaded,) = pool.open_archive(name).load_samples()
    return loaded


# --------------------------------------------------------------------------- at exit

#: A script whose `atexit` function saves, saves in the background, streams, converts to
#: Arrow and exports, all over several chunks (argv: root, catalog URL or "", export path).
AT_EXIT_SCRIPT = """
import atexit, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

root, url, out = sys.argv[1], sys.argv[2] or None, sys.argv[3]
pool = ArchiveManager.open(root, catalog_url=url, chunk_size=4)

def rollout(seed):
    return make_rollout(12, seed=seed, prompt_len=8, response_min=4, response_max=12)

def last_words():
    print("save", pool.save("at-exit", rollout(1), rollout_id=1).name)
    print("async", pool.save_async("at-exit-async", rollout(2), rollout_id=2).result().name)
    print("iter", sum(1 for _ in pool.open_archive("a0").iter_samples()))
    print("arrow", pool.open_archive("a0").to_arrow().num_rows)
    print("export", pool.export("a0", out).name)
    pool.close()

atexit.register(last_words)
pool.save("a0", rollout(0), rollout_id=0)
"""


def run_at_exit(tmp_path: Path, root: str, catalog_url: str | None, env: dict[str, str]) -> None:
    """Run `AT_EXIT_SCRIPT` and check that all it did at exit worked and was published."""
    from archive_manager.interop.synthetic import make_rollout

    out = tmp_path / "a0.parquet"
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT_SCRIPT, root, catalog_url or "", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:5] == [
        "save at-exit",
        "async at-exit-async",
        "iter 12",
        "arrow 12",
        "export a0.parquet",
    ], done.stderr[-3000:]
    assert out.exists()
    with ArchiveManager.open(root, catalog_url=catalog_url) as pool:
        for name, seed in (("at-exit", 1), ("at-exit-async", 2)):
            rollout = make_rollout(12, seed=seed, prompt_len=8, response_min=4, response_max=12)
            assert_loads(pool, name, rollout)
