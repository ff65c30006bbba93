"""`RolloutArchive`: the seed's calls (slime/vime's straw-backed archive) on a pool.

Each saved rollout gets a small JSON *pointer file* where the caller asked for the archive
(``rollout_3.json``): it names the pool and the archive and carries the sample metadata, so a
metadata check against a training run's settings reads that one file and nothing else.

A pointer file is input, not configuration: it holds no password, and opening one never
connects to a database server it names, nor opens a SQLite file it names before a read-only
look proved that file a catalog.  A server catalog's URL, credentials included, comes from
the caller (``catalog_url=``, ``args.archive_catalog_url`` or ``$ARCHIVE_MANAGER_CATALOG_URL``),
and must reach the database the pointer was written for.

Pointer format version 2 records a server catalog as ``catalog`` (its URL without a
password, for identification only); version 1 recorded ``catalog_url``, password and all,
and is still read: that URL is reduced to the same identification at once and never used.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import shlex
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._util.atomic import write_atomic
from ._util.digest import check_digest
from ._util.failpoints import failpoint
from ._util.names import archive_name_for
from .catalog.engine import catalog_identity, parse_url, public_url, shown_url, sqlite_path
from .catalog.migrate import CATALOG_URL_ENV
from .catalog.probe import probe_sqlite_catalog
from .errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    CatalogError,
    ForeignCatalogError,
    InvalidInputError,
    MetadataError,
    PoolNotFoundError,
    ReadOnlyPoolError,
    UnsupportedFormatError,
)
from .interop.straw import CAPTURE_FIELDS, KEPT_QUEUE_PREFIX, LIVE_QUEUE_FIELDS, SEED_FORMATS
from .manager import ArchiveManager, default_catalog_url
from .pool.archive import Archive, pt_native
from .samples import QUEUE_PREFIX, is_queue_key

if TYPE_CHECKING:
    from .interop.straw import StrawArchive

__all__ = [
    "CAPTURE_FIELDS",
    "KEPT_QUEUE_PREFIX",
    "LIVE_QUEUE_FIELDS",
    "POINTER_FORMAT",
    "POINTER_VERSION",
    "READABLE_POINTER_VERSIONS",
    "SEED_FORMATS",
    "RolloutArchive",
    "SeedTensor",
    "archive_name_for",
    "validate_seed_metadata",
]

POINTER_FORMAT = "archive_manager.pointer"
POINTER_VERSION = 2
#: Version 1 recorded the catalog as ``catalog_url``, with its password when it had one.
READABLE_POINTER_VERSIONS = (1, 2)
_REQUIRED = ("format", "version", "pool_root", "archive", "manifest_digest")
#: A pointer holds a few hundred bytes of metadata per sample: 64 MiB is far beyond any
#: rollout, and a bigger file is not a pointer (nor read whole into memory to find out).
MAX_POINTER_BYTES = 64 << 20

#: The keys of the seed's per-sample metadata (vime ``describe_sample``).
_SEED_METADATA_KEYS = (
    "index",
    "group_index",
    "status",
    "tokens",
    "response_length",
    "loss_mask",
    "rollout_log_probs",
    "tensors",
)


def _configured(
    args: Any, root: str | os.PathLike[str] | None, catalog_url: str | None
) -> tuple[Path | None, str | None]:
    """The caller's pool root and catalog URL: arguments first, then ``args``'s."""
    if root is None and args is not None:
        root = getattr(args, "archive_root", None) or None
    if catalog_url is None and args is not None:
        catalog_url = getattr(args, "archive_catalog_url", None) or None
    if catalog_url is not None and not isinstance(catalog_url, str):
        raise InvalidInputError("catalog_url must be a str (a SQLAlchemy URL)")
    return (Path(root).expanduser().absolute() if root else None), catalog_url


def _pool_location(path: Path, args: Any) -> tuple[Path, str | None]:
    root, url = _configured(args, None, None)
    return root or path.parent / "archive-pool", url


def _free_name(pool: ArchiveManager, target: Path) -> str:
    """The name to save ``target``'s archive under: its first generation not yet taken.

    A released archive keeps its name (its rows stay for inspection), so a path saved again
    after its archive was released takes the next generation; the pointer records it.
    """
    for generation in itertools.count(1):
        name = archive_name_for(target, generation)
        try:
            archive = pool.open_archive(name)
        except ArchiveNotFoundError:
            return name  # free, or a save in flight, which pool.save then refuses
        if archive.state != "released":
            hint = "" if _is_default(pool) else " --catalog-url URL"
            raise ArchiveExistsError(
                f"pointer file {target} does not exist, but the archive {name!r} saved for it "
                f"is still {archive.state} in the pool at {pool.root}: another process is "
                "saving to this path right now, or the pointer file was deleted without "
                "releasing its archive; release it (archive-manager --root "
                f"{shlex.quote(str(pool.root))}{hint} release {shlex.quote(name)}, or "
                "Archive.release()) and save again, or save to another path"
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _is_default(pool: ArchiveManager) -> bool:
    return catalog_identity(pool.catalog_url) == catalog_identity(default_catalog_url(pool.root))


def _is_sqlite(url: str) -> bool:
    return parse_url(url).get_backend_name() == "sqlite"


def _open_pool(
    path: Path,
    pointer: dict[str, Any],
    root: Path | None,
    catalog_url: str | None,
    read_only: bool | None = None,
) -> ArchiveManager:
    """Open the pool of a pointer, connecting to nothing and opening nothing it alone names.

    The caller's root and catalog win over the pointer's.  A server catalog is reached only
    through a URL the caller configured, and only if it is the database the pointer was
    written for; a SQLite file the pointer names is looked at read-only first, and opened
    only if it is an archive_manager catalog.
    """
    pool_root = root if root is not None else Path(pointer["pool_root"]).expanduser()
    pool_root = pool_root.absolute()
    recorded = pointer.get("catalog") or default_catalog_url(pool_root.resolve())
    if catalog_url is None and not _is_sqlite(recorded):
        catalog_url = os.environ.get(CATALOG_URL_ENV) or None
        if catalog_url is None:
            raise ForeignCatalogError(
                f"pointer file {path} names the catalog {shown_url(recorded)}, and a pointer "
                "file does not choose the database server to connect to: pass that catalog's "
                "URL with its credentials as catalog_url= (or args.archive_catalog_url), or "
                f"set ${CATALOG_URL_ENV}"
            )
    if catalog_url is not None and catalog_identity(catalog_url) != catalog_identity(recorded):
        raise ForeignCatalogError(
            f"pointer file {path} was written for the catalog {shown_url(recorded)}, not "
            f"the configured {shown_url(catalog_url)}; nothing was opened: configure the "
            "catalog the pointer names, or open the archive by name with ArchiveManager"
        )
    if not pool_root.is_dir():
        raise PoolNotFoundError(f"no pool at {pool_root} (named by pointer file {path})")
    if catalog_url is None:
        file = sqlite_path(recorded)
        if file is None:
            raise ForeignCatalogError(f"pointer file {path} names an in-memory catalog")
        probe = probe_sqlite_catalog(file)
        if probe.kind in ("absent", "empty"):
            raise PoolNotFoundError(
                f"no pool at {pool_root}: no catalog at {file} (named by pointer file {path})"
            )
        if probe.kind in ("foreign", "not-sqlite"):
            raise ForeignCatalogError(
                f"pointer file {path} names {file}, which is not an archive_manager catalog "
                f"({probe.reason}); it was left untouched"
            )
        catalog_url = pointer.get("catalog")  # None: the pool root's own catalog
    return ArchiveManager.open(pool_root, catalog_url, create=False, read_only=read_only)


def _write_pointer(path: Path, content: dict[str, Any]) -> None:
    """Write ``path`` atomically and only if it does not exist (link(2) is exclusive).

    Raises:
        FileExistsError: ``path`` exists; nothing was written.
    """
    data = json.dumps(content, indent=1, allow_nan=False).encode()
    # NOTE: 0666 minus the umask, like any file the run writes (a 0600 pointer would hide it
    # from the rest of a team that shares the run folder).  Linked, never created in place:
    # a short pointer left by a crash would name an archive nobody can read or release.
    if not write_atomic(
        path,
        data,
        exclusive=True,
        mode=0o666,
        link_fallback=False,
        before_place=lambda: failpoint("pointer.before_link"),
    ):
        raise FileExistsError(f"pointer file {path} already exists")


def _read_text(path: Path) -> str:
    # NOTE: opened without blocking and checked to be a regular file of sane size before
    # reading: a FIFO at the path hung forever, /dev/zero filled memory.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsupportedFormatError(f"{path} is not a pointer file (not a regular file)")
        if st.st_size > MAX_POINTER_BYTES:
            raise UnsupportedFormatError(
                f"{path} is not a pointer file ({st.st_size} bytes; pointer files are at "
                f"most {MAX_POINTER_BYTES})"
            )
        return f.read(MAX_POINTER_BYTES + 1).decode("utf-8")


def _recorded_catalog(path: Path, pointer: dict[str, Any]) -> str | None:
    """The catalog a pointer records, as its URL without a password (None: the SQLite file in
    its pool root); removes version 1's ``catalog_url`` from ``pointer``."""
    key = "catalog_url" if pointer["version"] == 1 else "catalog"
    raw = pointer.pop("catalog_url", None) if key == "catalog_url" else pointer.get(key)
    pointer.pop("catalog_url", None)  # not a field of version 2: never read, never shown
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed {key}")
    try:
        return public_url(raw)
    except CatalogError:
        # The text is not echoed: it may hold a password.
        raise UnsupportedFormatError(
            f"pointer file {path} has a malformed {key} (not a SQLAlchemy URL)"
        ) from None


def _read_document(path: Path, what: str = "pointer file") -> dict[str, Any]:
    """The JSON object at ``path`` (a pointer file, a seed index or, with ``what``, a
    sidecar), read safely; errors name ``what`` the file was read as."""
    try:
        text = _read_text(path)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsupportedFormatError(f"cannot read {what} {path}: {exc}") from exc
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UnsupportedFormatError(f"{path} is not a {what} (not JSON: {exc})") from exc
    if not isinstance(document, dict):
        raise UnsupportedFormatError(f"{path} is not a {what} (not a JSON object)")
    return document


def _is_seed_index(document: Mapping[str, Any]) -> bool:
    return document.get("format") in SEED_FORMATS


def _read_pointer(path: Path, document: dict[str, Any] | None = None) -> dict[str, Any]:
    pointer = _read_document(path) if document is None else document
    if pointer.get("format") != POINTER_FORMAT:
        raise UnsupportedFormatError(
            f"{path} is not an {POINTER_FORMAT} file (format {pointer.get('format')!r})"
        )
    version = pointer.get("version")
    if type(version) is not int or version not in READABLE_POINTER_VERSIONS:
        raise UnsupportedFormatError(
            f"{path} is pointer version {version!r}; this library reads versions "
            f"{', '.join(map(str, READABLE_POINTER_VERSIONS))}"
        )
    # NOTE: before anything else can fail and show the pointer: a version 1 pointer's
    # catalog_url may hold a password, which must not outlive this function.
    pointer["catalog"] = _recorded_catalog(path, pointer)
    missing = [k for k in _REQUIRED if k not in pointer]
    if missing:
        raise UnsupportedFormatError(f"pointer file {path} lacks {', '.join(missing)}")
    if (
        not isinstance(pointer["pool_root"], str)
        or "\x00" in pointer["pool_root"]
        or not isinstance(pointer["archive"], str)
    ):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed pool_root or archive")
    check_digest(pointer["manifest_digest"])
    metadata = pointer.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, list) and all(isinstance(m, dict) for m in metadata)
    ):
        raise UnsupportedFormatError(f"pointer file {path} has malformed metadata")
    return pointer


class SeedTensor:
    """A capture field loaded through the facade: lazy, like the seed's ``straw`` TensorRef.

    ``load()`` gives the ``torch.Tensor`` (a stored tensor blob is read then, once); ``shape``
    (a tuple), ``dtype`` (its name, ``"int32"``), ``kind`` (the field's name), ``len()`` and
    contiguous row slices (``ref[a:b]``) need no read of a blob.  Like the seed's, it is not
    tensor-like: no ``==`` or attribute forwarding.
    """

    __slots__ = ("_value", "kind")

    def __init__(self, value: Any, kind: str) -> None:
        self._value = value
        self.kind = kind

    def load(self, *, pin_memory: bool = False, reader: Any = None) -> Any:
        """The tensor (``reader`` is the seed's, accepted and unused)."""
        from ._util.lazy_torch import torch_module

        torch = torch_module()
        value = self._value
        materialize = getattr(value, "materialize", None)
        if callable(materialize):
            tensor = materialize()
        elif torch.is_tensor(value):
            tensor = value
        elif isinstance(value, list) and value and all(torch.is_tensor(v) for v in value):
            tensor = torch.cat(value, dim=0) if len(value) > 1 else value[0]
        else:
            import numpy as np

            tensor = torch.as_tensor(np.asarray(value))
        return tensor.pin_memory() if pin_memory else tensor

    @property
    def shape(self) -> tuple[int, ...]:
        shape = getattr(self._value, "shape", None)
        if shape is None:
            return tuple(self.load().shape)
        return tuple(int(d) for d in shape)

    @property
    def dtype(self) -> str:
        dtype = getattr(self._value, "dtype", None)
        if dtype is None:
            dtype = self.load().dtype
        return str(dtype).removeprefix("torch.")

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a SeedTensor reads contiguous row slices only (ref[a:b])")
        return self.load()[key]

    def __repr__(self) -> str:
        return f"SeedTensor(kind={self.kind!r}, shape={list(self.shape)}, dtype={self.dtype!r})"


def _declared(sample: Any) -> frozenset[str]:
    if dataclasses.is_dataclass(sample) and not isinstance(sample, type):
        return frozenset(f.name for f in dataclasses.fields(sample))
    return frozenset()


def _for_pool(sample: Any) -> Any:
    """``sample`` as the facade hands it to the pool: its ``_queue_*`` attributes other than
    `LIVE_QUEUE_FIELDS` renamed to ``_kept_queue_*`` (on a shallow copy; the caller's sample
    is untouched), so they survive the pool's drop of live queue state."""
    if isinstance(sample, Mapping):
        state: Any = sample
    else:
        state = getattr(sample, "__dict__", None)
        if state is None:
            return sample
    declared = _declared(sample)
    kept = [
        k for k in state if is_queue_key(k) and k not in LIVE_QUEUE_FIELDS and k not in declared
    ]
    if not kept:
        return sample
    if isinstance(sample, Mapping):
        out: Any = dict(sample)
        target = out
    else:
        out = copy.copy(sample)
        target = out.__dict__
    for key in kept:
        target[KEPT_QUEUE_PREFIX + key[len(QUEUE_PREFIX) :]] = target.pop(key)
    return out


def _from_pool(sample: Any, lazy: bool) -> Any:
    """A loaded sample as the seed returns it: ``_kept_queue_*`` back to ``_queue_*`` and,
    when ``lazy``, the capture fields as `SeedTensor`."""
    state = sample if isinstance(sample, dict) else getattr(sample, "__dict__", None)
    if state is None:
        return sample
    for key in [k for k in state if isinstance(k, str) and k.startswith(KEPT_QUEUE_PREFIX)]:
        state[QUEUE_PREFIX + key[len(KEPT_QUEUE_PREFIX) :]] = state.pop(key)
    if lazy:
        for name in CAPTURE_FIELDS:
            value = state.get(name)
            if value is not None and not isinstance(value, SeedTensor):
                state[name] = SeedTensor(value, name)
    return sample


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def seed_task_key(sample: Any) -> Any:
    """The seed's task key: the ``task_id`` of ``_queue_receipt`` if truthy, else of
    ``_queue_lease`` if truthy, else None (no ``task_key`` attribute hook)."""
    context = _get(sample, "_queue_receipt") or _get(sample, "_queue_lease")
    if not context:
        return None
    # NOTE: the seed subscripts (a dict); an object with a ``task_id`` attribute is taken too.
    return _get(context, "task_id")


def _seed_description(description: Mapping[str, Any]) -> dict[str, Any]:
    """One sample's metadata with exactly the seed's keys and capture tensors."""
    out = {key: description.get(key) for key in _SEED_METADATA_KEYS}
    tensors = description.get("tensors") or {}
    out["tensors"] = {k: v for k, v in tensors.items() if k in CAPTURE_FIELDS}
    return out


_INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def validate_seed_metadata(samples: Sequence[Mapping[str, Any]], args: Any) -> None:
    """The seed's ``validate_sample_metadata``: its rules and messages, first violation only.

    Raises:
        MetadataError: (a ValueError) the first sample that does not fit ``args``.
    """
    for sample in samples:
        count = sample["response_length"]
        if not 0 <= count <= sample["tokens"]:
            raise MetadataError("Response length exceeds the token count")
        for name in ("loss_mask", "rollout_log_probs"):
            if sample[name] is not None and sample[name] != count:
                raise MetadataError(f"{name} length does not match the response length")
        tensors = sample["tensors"]
        routes = tensors.get("rollout_routed_experts")
        if getattr(args, "use_rollout_routing_replay", False) and routes is not None:
            expected = [max(0, sample["tokens"] - 1), int(args.num_layers), args.moe_router_topk]
            if routes["shape"] != expected or routes["dtype"] not in _INT_DTYPES:
                raise MetadataError("Routed-experts shape/dtype does not match tokens and model")
        if not getattr(args, "use_score_centering", False):
            continue
        top_p = getattr(args, "rollout_top_p", 1.0) < 1
        prefix = "rollout_top_p" if top_p else "rollout_topk"
        ids, logps = tensors.get(prefix + "_token_ids"), tensors.get(prefix + "_log_probs")
        if ids is None or logps is None:
            raise MetadataError("Missing sampler capture metadata")
        if (
            ids["shape"] != logps["shape"]
            or ids["dtype"] not in _INT_DTYPES
            or logps["dtype"] not in _FLOAT_DTYPES
        ):
            raise MetadataError("Sampler ids/logprobs shape/dtype mismatch")
        if top_p:
            offsets = tensors.get(prefix + "_token_offsets")
            if (
                len(ids["shape"]) != 1
                or offsets is None
                or offsets["shape"] != [count + 1]
                or offsets["dtype"] not in _INT_DTYPES
            ):
                raise MetadataError("Sampler top-p offsets/shape mismatch")
        elif ids["shape"] != [count, args.score_centering_top_k]:
            raise MetadataError("Sampler top-k shape mismatch")


def _sidecar(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".metadata.json")


def _sidecar_metadata(path: Path, manifest_digest: Any) -> Any:
    """The seed's legacy sidecar ``<index>.metadata.json``, bound to the archive by digest.

    Raises:
        FileNotFoundError: no sidecar (its ``filename`` is the sidecar's path).
        MetadataError: it belongs to another archive.
    """
    document = _read_document(_sidecar(path), "metadata sidecar")
    if document["manifest_digest"] != manifest_digest:
        raise MetadataError("Metadata sidecar belongs to a different archive")
    return document["sample_metadata"]


#: The fields the seed's ``Sample.to_dict()`` converts for a dump: the status to its value,
#: the two helpers to dicts of their fields.
def _export_seed_pt(straw: StrawArchive, rollout_id: Any, target: Path) -> Path:
    """The seed's ``export_pt`` of a seed index (see `RolloutArchive.export_pt`)."""
    from ._util.output import save_torch, write_output

    # As the seed's to_dict() gives them (status as its value, helpers as dicts), with numpy
    # as tensors and Python numbers: a dump this library writes loads with weights_only=True,
    # never needing the unpickling the seed's own dump needed (docs/dropin.md).
    samples = [
        pt_native(dict(s) if isinstance(s, Mapping) else dict(vars(s)))
        for s in straw.load_samples(lazy=False)
    ]
    dump = {"rollout_id": rollout_id, "samples": samples}
    return write_output(target, lambda output: save_torch(dump, output))


class RolloutArchive:
    """An archive reached through its pointer file, with the seed's calls.

    ``RolloutArchive.save(path, samples, rollout_id=...)`` saves and writes the pointer;
    ``RolloutArchive(path)`` opens it (a context manager: `close` releases the pool's
    connections, not the data; `release` lets GC reclaim the data).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        root: str | os.PathLike[str] | None = None,
        *,
        catalog_url: str | None = None,
        args: Any = None,
        read_only: bool | None = None,
    ) -> None:
        """Open the archive a pointer file names.

        The caller's configuration wins over the pointer's: ``root`` (else
        ``args.archive_root``) over the pool root it records, ``catalog_url`` (else
        ``args.archive_catalog_url``) over its catalog.  A pointer whose pool has a server
        catalog needs that catalog's URL, with credentials, from the caller (those, or
        ``$ARCHIVE_MANAGER_CATALOG_URL``): the pointer holds none, and nothing it names
        alone is ever connected to.  ``read_only`` is `ArchiveManager.open`'s: None opens
        the pool read-only when this process cannot write it (then `release` raises
        `ReadOnlyPoolError`).

        Raises:
            FileNotFoundError: no pointer file at ``path``.
            UnsupportedFormatError: not a pointer file, or of another format or version.
            PoolNotFoundError: the pool it names does not exist.
            ForeignCatalogError: it names a server catalog and none was configured, or one
                other than the configured one, or a file that is no catalog (nothing was
                opened).
            MetadataError: the catalog's archive is not the one the pointer was written for.
            MissingDependencyError: a seed index, and straw-queue is not installed.

        A seed index (``"format": "vime.straw-debug"`` or ``"slime.straw-debug"``, version 1)
        opens read-only through straw-queue (`archive_manager.interop.straw`): ``root``
        replaces the pool root it records, as the seed's ``root=`` does; `release` refuses.
        """
        self.path = Path(path)
        document = _read_document(self.path)
        self._straw: StrawArchive | None = None
        if _is_seed_index(document):
            from .interop.straw import StrawArchive

            self.index = self.pointer = document
            self._straw = StrawArchive(self.path, root=root, index=document)
            # what the seed's callers read of an open seed archive (vime's rollout manager
            # reads manifest.manifest.segment.run_id and contents["chunks"]): straw's own
            self.manifest = self._straw.manifest
            self.contents = self._straw.contents
            self.store = self._straw.store
            return
        self.pointer = _read_pointer(self.path, document)
        #: The pointer file as a dict (the seed's ``index``): ``index["rollout_id"]``, ...
        self.index = self.pointer
        pool_root, url = _configured(args, root, catalog_url)
        self.pool = _open_pool(self.path, self.pointer, pool_root, url, read_only)
        try:
            self.archive: Archive = self.pool.open_archive(self.pointer["archive"])
            if self.archive.manifest_digest != self.pointer["manifest_digest"]:
                raise MetadataError(
                    f"pointer {self.path} names manifest {self.pointer['manifest_digest']} but "
                    f"archive {self.archive.name!r} has {self.archive.manifest_digest}: the "
                    "archive was replaced, or the pointer belongs to another pool"
                )
        except BaseException:
            self.pool.close()
            raise

    @classmethod
    def save(
        cls,
        path: str | os.PathLike[str],
        samples: Sequence[Any] | None,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        args: Any = None,
        reference: RolloutArchive | str | os.PathLike[str] | None = None,
    ) -> None:
        """Save ``samples`` into a pool and write a pointer file at ``path``.

        The pool is ``args.archive_root`` (or ``args.archive_catalog_url``) when given, else
        ``<path's folder>/archive-pool``, so archives saved in one folder share a pool and
        dedup.  ``reference`` (a `RolloutArchive` or its pointer path) shares its chunks.
        The pointer file records the catalog without its password.  Like the seed's, it
        returns None and leaves nothing open: open the archive with ``RolloutArchive(path)``.

        As the seed does, each sample's task key is the ``task_id`` of its ``_queue_receipt``
        (else its ``_queue_lease``), and its ``_queue_*`` attributes other than
        `LIVE_QUEUE_FIELDS` are kept (stored as ``_kept_queue_*``, loaded back by the facade).

        A path may be saved again once its pointer file is gone and its archive released:
        the new archive takes the next generation of the path's name (`archive_name_for`).

        Raises:
            FileExistsError: ``path`` exists (nothing is saved), or appeared meanwhile (the
                archive just saved is released again).
            ArchiveExistsError: (a FileExistsError) the path's archive is still published
                though its pointer file is gone; the message says how to release it.
        """
        target = Path(path).expanduser().absolute()
        if os.path.lexists(target):
            raise FileExistsError(
                f"Rollout archives are immutable; choose a new path: {target} "
                "(pointer file already exists)"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        pool_root, url = _pool_location(target, args)
        with ArchiveManager.open(pool_root, url) as pool:
            ref: Archive | None = None
            if reference is not None:
                ref_path = (
                    reference.path if isinstance(reference, RolloutArchive) else Path(reference)
                )
                with cls(ref_path, catalog_url=url) as source:
                    same = catalog_identity(source.pool.catalog_url) == catalog_identity(
                        pool.catalog_url
                    )
                    if not same or source.pool.root != pool.root:
                        raise InvalidInputError("a reference must live in the same pool")
                    ref = pool.open_archive(source.archive.name)
            name = _free_name(pool, target)
            if ref is not None:
                arc = pool.save(
                    name, None, rollout_id=rollout_id, evaluation=evaluation, reference=ref
                )
            else:
                if samples is None:
                    raise InvalidInputError("samples is None and no reference was given")
                arc = pool.save(
                    name,
                    [_for_pool(s) for s in samples],
                    rollout_id=rollout_id,
                    evaluation=evaluation,
                    task_keys=[seed_task_key(s) for s in samples],
                )
            pointer: dict[str, Any] = {
                "format": POINTER_FORMAT,
                "version": POINTER_VERSION,
                "pool_root": str(pool.root),
            }
            if not _is_default(pool):
                # Which database, for telling it apart: never a password, never a URL
                # that opening the pointer connects to (see _open_pool).
                pointer["catalog"] = public_url(pool.catalog_url)
            pointer |= {
                "archive": arc.name,
                "manifest_digest": arc.manifest_digest,
                "rollout_id": arc.rollout_id,
                "evaluation": arc.evaluation,
                "samples": len(arc),
                "metadata": arc.sample_metadata(),
            }
            try:
                _write_pointer(target, pointer)
            except FileExistsError:
                arc.release()
                raise FileExistsError(f"pointer file {target} appeared while saving") from None
            except BaseException:
                arc.release()  # no pointer names it: nothing could ever read or release it
                raise

    @staticmethod
    def check_metadata(path: str | os.PathLike[str], args: Any) -> list[dict[str, Any]]:
        """Check an archive's samples against a training run's settings as the seed does,
        reading only JSON: the pointer file or seed index, and for one without metadata the
        seed's legacy sidecar ``<path>.metadata.json`` — never a blob.

        Returns:
            The seed's per-sample metadata: a list of dicts with exactly its keys
            (``index, group_index, status, tokens, response_length, loss_mask,
            rollout_log_probs, tensors``; ``tensors`` holds the capture fields only).

        Raises:
            UnsupportedFormatError: (a ValueError) neither a pointer file nor a seed index,
                or an unsupported sample metadata version.
            FileNotFoundError: a seed index without metadata and no sidecar (a pointer file
                without either: the catalog answers, found as `RolloutArchive` finds it).
            MetadataError: (a ValueError) the sidecar belongs to another archive, or the
                first sample that does not fit ``args`` (the seed's rules and messages).
        """
        path = Path(path)
        document = _read_document(path)
        wrapped: Any
        if _is_seed_index(document):
            if document.get("version") != 1:
                raise UnsupportedFormatError(f"Unsupported rollout archive: {path}")
            wrapped = document.get("sample_metadata")
            if wrapped is None:
                wrapped = _sidecar_metadata(path, document["manifest"]["digest"])
        else:
            pointer = _read_pointer(path, document)
            listed = pointer.get("metadata")
            if listed is None and _sidecar(path).exists():
                wrapped = _sidecar_metadata(path, pointer["manifest_digest"])
            elif listed is None:
                # A pointer (never the seed's index) names its pool: the catalog answers.
                with RolloutArchive(path, args=args) as arc:
                    wrapped = {"version": 1, "samples": arc.archive.sample_metadata()}
            else:
                wrapped = {"version": 1, "samples": listed}
        if not isinstance(wrapped, dict) or wrapped.get("version") != 1:
            raise UnsupportedFormatError("Unsupported sample metadata version")
        samples = wrapped.get("samples")
        if not isinstance(samples, list) or not all(isinstance(m, dict) for m in samples):
            raise UnsupportedFormatError(f"{path} has malformed sample metadata")
        metadata = [_seed_description(m) for m in samples]
        validate_seed_metadata(metadata, args)
        return metadata

    # ------------------------------------------------------------------ reading

    @property
    def name(self) -> str:
        """The archive's name in its pool (a seed index: its path)."""
        if self._straw is not None:
            return str(self.path)
        return self.archive.name

    @property
    def rollout_id(self) -> Any:
        """The rollout id it was saved with."""
        if self._straw is not None:
            return self.index.get("rollout_id")
        return self.archive.rollout_id

    @property
    def evaluation(self) -> bool:
        """Whether it holds evaluation samples."""
        if self._straw is not None:
            return bool(self.index.get("evaluation", False))
        return self.archive.evaluation

    def __len__(self) -> int:
        if self._straw is not None:
            return len(self._straw)
        return len(self.archive)

    def keys(self) -> list[tuple[str, Any]]:
        """``(sample_key, task_key)`` per sample, in archive order, duplicates included."""
        if self._straw is not None:
            return self._straw.keys()
        return self.archive.keys()

    def load_samples(
        self,
        *,
        sample_key: str | None = None,
        task_key: Any = None,
        as_arrays: bool = False,
        materialize: bool = False,
    ) -> list[Any]:
        """All samples, or those matching every key given, in archive order (a list).

        As the seed's: the keys are keyword-only; no match raises
        ``KeyError((sample_key, task_key))``; the live queue fields are absent and other
        ``_queue_*`` attributes are back; the capture fields are lazy (`SeedTensor`, or
        straw's ``TensorRef`` for a seed index) with ``.load()``, unless ``materialize``.
        ``as_arrays`` is `Archive.load_samples`'s.
        """
        if self._straw is not None:
            found = self._straw.load_samples(
                sample_key=sample_key, task_key=task_key, lazy=not materialize
            )
            if not found and (sample_key is not None or task_key is not None):
                raise KeyError((sample_key, task_key))
            return found
        try:
            samples = self.archive.load_samples(
                sample_key=sample_key,
                task_key=task_key,
                as_arrays=as_arrays,
                materialize=materialize,
            )
        except KeyError as exc:
            raise KeyError((sample_key, task_key)) from exc
        return [_from_pool(s, not materialize) for s in samples]

    def iter_samples(
        self,
        *,
        sample_key: str | None = None,
        task_key: Any = None,
        as_arrays: bool = False,
        materialize: bool = False,
    ) -> Iterator[Any]:
        """The samples streamed in bounded memory (see `Archive.iter_samples`), as
        `load_samples` returns them."""
        if self._straw is not None:
            return iter(
                self.load_samples(sample_key=sample_key, task_key=task_key, materialize=materialize)
            )
        lazy = not materialize
        return (
            _from_pool(s, lazy)
            for s in self.archive.iter_samples(
                sample_key=sample_key,
                task_key=task_key,
                as_arrays=as_arrays,
                materialize=materialize,
            )
        )

    def sample_metadata(self) -> list[dict[str, Any]]:
        """Per-sample metadata (from the catalog; a seed index: from the index)."""
        if self._straw is not None:
            return self._straw.sample_metadata()
        return self.archive.sample_metadata()

    def export_pt(self, path: str | os.PathLike[str]) -> Path:
        """Write slime's ``torch.save`` dump format (see `Archive.export_pt`).

        A seed index is exported as the seed exports it: ``{"rollout_id", "samples"}``, each
        sample as its ``to_dict()`` gives it (``status`` as its value, ``spec_info`` and
        ``prefix_cache_info`` as dicts of their fields), tensors loaded, numpy arrays as
        tensors, so that it loads with ``torch.load(weights_only=True)`` (the seed's own dump
        kept numpy and needed unpickling); written atomically.
        """
        if self._straw is not None:
            return _export_seed_pt(self._straw, self.index.get("rollout_id"), Path(path))
        return self.archive.export_pt(path)

    def release(self) -> None:
        """Let GC reclaim the archive (its pointer file stays; rows stay for inspection).

        Returns None and is idempotent, like the seed's.

        Raises:
            ReadOnlyPoolError: a seed index (opened read-only) or a read-only pool.
        """
        if self._straw is not None:
            raise ReadOnlyPoolError(f"{self.path} is a seed (straw) archive, opened read-only")
        self.archive.release()

    def close(self) -> None:
        """Close the pool's connections; idempotent."""
        if self._straw is not None:
            self._straw.close()
            return
        self.pool.close()

    def __enter__(self) -> RolloutArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._straw is not None:
            return f"RolloutArchive({str(self.path)!r}, format={self.index.get('format')!r})"
        return f"RolloutArchive({str(self.path)!r}, archive={self.archive.name!r})"
