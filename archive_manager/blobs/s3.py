"""The S3 blob store: blobs as objects of an S3-compatible bucket
(docs/architecture/blob-store-contract.md, "Blob store contract", and
docs/architecture/object-stores.md, "Blobs on an object store").

A blob of digest ``d`` is the object ``<prefix>/blobs/<d[0:2]>/<d[2:4]>/<d>`` (`layout`); the
pool's few other files (the identity, the retention journal) are objects under ``<prefix>/``
too, read and written through `S3Root`.  No key outside the prefix is ever read, written,
listed or deleted.

Semantics (argued in the architecture document):

* no rename exists, so a blob becomes visible only when its upload completes: one PUT, or for
  a blob of `MULTIPART_THRESHOLD` bytes or more a multipart upload whose parts are invisible
  until `CompleteMultipartUpload`; a failed upload is aborted, and one left by a killed
  writer is an incomplete write (`incomplete_writes`) that GC's sweep aborts;
* digest-named keys make a repeated put harmless: a put first looks (HEAD) and compares sizes;
* a verified read rehashes; `read_range` is a ranged GET (a one-sample read fetches its
  record, not the chunk);
* transient failures (throttling, 5xx, timeouts, refused or dropped connections) are retried
  with bounded exponential backoff, then raised as `TransientBlobStoreError`; every other
  failure is a `BlobStoreError` naming the bucket and key.  No SDK exception and no
  credential ever leaves this module (messages are built here, from the error code);
* every call has a deadline (`DEFAULT_DEADLINE`, ``$ARCHIVE_MANAGER_S3_DEADLINE``): its tries
  and the waits between them never add up past it, and a store that stops answering fails
  the call with `BlobStoreTimeoutError` naming the endpoint and the deadline; for a while
  after that, calls fail at once instead of waiting again (`_Silence`).

The client is boto3, imported when the first store is made, never at module import: a pool on
a filesystem never pays for it (see the architecture document for the measurements behind the
choice).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import xxhash

from .._util.digest import Buffer
from .._util.threads import Helpers
from ..errors import (
    BlobStoreError,
    BlobStoreTimeoutError,
    InvalidInputError,
    InvalidNameError,
    TransientBlobStoreError,
)
from ._common import check_size as _check_size
from ._common import corrupt as _corrupt
from ._common import missing as _missing
from ._common import prepare as _prepare
from ._common import verify as _verify
from .base import (
    AbstractBlobStore,
    BlobStat,
    Capabilities,
    IncompleteWrite,
    ObjectRoot,
    PutItem,
    is_s3_url,
)
from .layout import BLOBS_DIR, blob_key, is_blob_name
from .readonly import ReadOnlyRoot

__all__ = [
    "DEADLINE_ENV",
    "DEFAULT_DEADLINE",
    "DELETE_BATCH",
    "MULTIPART_THRESHOLD",
    "PART_SIZE",
    "S3BlobStore",
    "S3Root",
    "is_s3_url",
    "parse_s3_url",
]

_log = logging.getLogger("archive_manager")

#: Blobs of at least this many bytes are uploaded in parts (chunks and most tensor blobs of
#: the rollout workload are smaller and go in one PUT, one request).
MULTIPART_THRESHOLD = 64 << 20
#: The size of one part (S3 wants at least 5 MiB for every part but the last).
PART_SIZE = 16 << 20
#: Keys per ``DeleteObjects`` request (S3's limit).
DELETE_BATCH = 1000
#: Seconds one call to the store may take over all its tries and the waits between them
#: (docs/architecture/object-stores.md, "Blobs on an object store", Deadlines);
#: ``$ARCHIVE_MANAGER_S3_DEADLINE`` or ``S3BlobStore(deadline=)`` sets another.  A transfer
#: whose bytes keep coming is not cut.
DEFAULT_DEADLINE = 30.0
DEADLINE_ENV = "ARCHIVE_MANAGER_S3_DEADLINE"

_T = TypeVar("_T")
# S3's rules for bucket names (the subset every provider accepts).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# A prefix segment and an object name below the prefix: no "..", no empty segment, no
# control characters, so a name can never lead out of the prefix.
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
# Error codes (and HTTP statuses) a retry may get past: throttling, server trouble, timeouts.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "XMinioServerNotInitialized",
        "XMinioStorageFull",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AuthorizationHeaderMalformed",
    }
)
# Claims of an exclusive write older than this (a claimer killed mid-claim) are ignored.
_CLAIM_TTL = 60.0
# The errors of a store that did not answer in time (as `_classify` names them).
_SILENT_CODES = frozenset({"ReadTimeoutError", "ConnectTimeoutError"})
# Upload threads a store keeps beside the caller's (`_Uploaders`): a save asks for 3.
_UPLOAD_THREADS = 8


def _deadline_from(value: float | None) -> float:
    """The deadline given, else ``$ARCHIVE_MANAGER_S3_DEADLINE``, else `DEFAULT_DEADLINE`.

    Raises:
        InvalidInputError: not a positive, finite number of seconds.
    """
    source = "deadline"
    given: object = value
    if value is None:
        text = os.environ.get(DEADLINE_ENV, "").strip()
        if not text:
            return DEFAULT_DEADLINE
        # The message quotes the text as given ("abc"), not what parsing made of it.
        source, given = f"${DEADLINE_ENV}", text
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise InvalidInputError(
            f"{source} must be a number of seconds above 0 and below 1e6, not {given!r:.40}"
        )
    return float(value)


class _Silence:
    """When the store last let a call run out its deadline without answering.

    Until ``until`` (monotonic seconds), calls fail at once with the same error instead of
    waiting out the deadline again: a failed save's rollback, GC's next batch or the next
    of many reads would each wait it out, one after another, some under the catalog's
    write lock.  Shared by a store and its read-only copies (one endpoint).
    """

    def __init__(self) -> None:
        self.until = 0.0
        self.message = ""


class _Uploaders:
    """The threads a store uploads on beside the caller (`S3BlobStore._put_all`): started at
    the first upload of several blobs and kept, shared by a store and its copies (`_at`); a
    forked child, which has none of its parent's threads, starts its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._executor: Helpers | None = None

    def executor(self) -> Helpers:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = Helpers(_UPLOAD_THREADS, thread_name_prefix="s3-upload")
                self._pid = os.getpid()
            return self._executor


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` (the prefix without slashes at its ends).

    Raises:
        InvalidNameError: not such a URL, a bucket name S3 refuses, or a prefix with an empty
            or ``..`` segment or characters outside ``[A-Za-z0-9._-/]``.
    """
    parts = urlsplit(url)
    if parts.scheme != "s3" or parts.query or parts.fragment or "@" in parts.netloc:
        raise InvalidNameError(f"not an s3://bucket/prefix URL: {url!r:.200}")
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise InvalidNameError(f"not a valid S3 bucket name: {bucket!r:.80}")
    if prefix:
        _check_relative(prefix, "prefix")
    return bucket, prefix


def _check_relative(name: str, what: str) -> str:
    segments = name.split("/")
    if not all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        raise InvalidNameError(
            f"not a valid object {what}: {name!r:.200} (segments of [A-Za-z0-9._-], no '..')"
        )
    return name


def _redact_endpoint(url: str | None) -> str:
    """The endpoint as messages show it: scheme, host and port, never user info."""
    if not url:
        return "the default AWS endpoint"
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True)
class _Config:
    """Where and how to reach the bucket; credentials never live here (boto3 resolves them
    from the environment, the shared config files and profiles, and keeps them)."""

    endpoint_url: str | None
    region: str | None
    profile: str | None
    connect_timeout: float
    read_timeout: float
    attempts: int
    backoff: float
    max_backoff: float
    deadline: float


def _classify(exc: BaseException) -> tuple[str, bool, int | None]:
    """``(code, transient, http status)`` of a boto3/botocore exception (by class and code,
    never by its text, which may echo request details)."""
    import botocore.exceptions as bx

    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {}) or {}
        meta = exc.response.get("ResponseMetadata", {}) or {}
        code = str(err.get("Code", "") or "")
        status = meta.get("HTTPStatusCode")
        transient = code in _TRANSIENT_CODES or (
            isinstance(status, int) and (status >= 500 or status == 429)
        )
        return code or str(status or "unknown"), transient, status
    if isinstance(
        exc,
        (
            bx.EndpointConnectionError,
            bx.ConnectionClosedError,
            bx.ReadTimeoutError,
            bx.ConnectTimeoutError,
            bx.ResponseStreamingError,
            bx.HTTPClientError,
        ),
    ):
        return type(exc).__name__, True, None
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return "NoCredentials", False, None
    if isinstance(exc, bx.ProfileNotFound):
        return "ProfileNotFound", False, None
    if isinstance(exc, bx.BotoCoreError):
        return type(exc).__name__, False, None
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return type(exc).__name__, True, None
    return type(exc).__name__, False, None


class S3Root:
    """The pool's place on the object store, ``s3://bucket/prefix``: what ``pool.root`` is for
    a pool on S3.  It reads and writes the pool's named objects below the prefix (the
    identity, the retention journal), as a filesystem root holds those files; names are
    checked so that none leads out of the prefix."""

    def __init__(self, store: S3BlobStore) -> None:
        self._store = store

    def __str__(self) -> str:
        return self._store.url

    def __repr__(self) -> str:
        return f"S3Root({self._store.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Root) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def store(self) -> S3BlobStore:
        """The blob store of this root."""
        return self._store

    def read(self, name: str) -> bytes | None:
        """The bytes of the object ``name`` below the prefix; None if there is none."""
        return self._store._read_named(name)

    def write(self, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write the object ``name``; with ``exclusive``, only if none exists (False then)."""
        return self._store._write_named(name, data, exclusive=exclusive)

    def list(self, folder: str, *, after: str | None = None) -> list[tuple[str, float]]:
        """``(name, mtime)`` of the objects directly in ``folder`` (not below its subfolders),
        only those whose names sort after ``after`` when given (the store skips the rest)."""
        return self._store._list_named(folder, after=after)

    def delete(self, name: str) -> bool:
        """Delete the object ``name``; False if there was none."""
        return self._store._delete_named(name)

    def other(self, url: str) -> ObjectRoot:
        """The root at ``url`` (another ``s3://bucket/prefix``) on this root's endpoint, with
        its settings, to be looked at only: it refuses every write (a `ReadOnlyRoot`).

        Raises:
            InvalidNameError: ``url`` is not a valid ``s3://bucket/prefix``.
        """
        return ReadOnlyRoot(S3Root(self._store._at(url)), "it is another root, only looked at")


_LOADER: Any = None
_LOADER_LOCK = threading.Lock()


def _botocore_session() -> Any:
    """A fresh botocore session (credentials and config read anew) sharing one model loader.

    NOTE: loading the S3 service model is most of a client's set-up (about 0.25 s, against
    0.04 s with the loader's cache warm); credentials are not shared, so a changed
    environment or profile is seen by the next store.
    """
    global _LOADER
    import botocore.session

    session = botocore.session.get_session()
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _LOADER)
    return session


class S3BlobStore(AbstractBlobStore):
    """Blobs as objects below ``s3://bucket/prefix/blobs/`` (see the module docstring).

    Endpoint, region and credentials come from the standard AWS environment and config
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``
    and the shared config files) unless given here; credentials are never shown.
    """

    capabilities = Capabilities(mmap=False, local_paths=False, persistent=True)
    read_extras = frozenset({"url", "endpoint", "bucket", "prefix", "deadline"})

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        connect_timeout: float = 4.0,
        read_timeout: float = 10.0,
        attempts: int = 5,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
        deadline: float | None = None,
        check_bucket: bool = True,
    ) -> None:
        """Connect to ``bucket`` (checked to exist and to be readable unless
        ``check_bucket=False``, which sends no request).

        ``attempts`` bounds the tries of one request that fails transiently; the waits between
        them grow from ``backoff`` seconds, doubling, up to ``max_backoff``, with jitter.
        ``deadline`` (seconds; None: ``$ARCHIVE_MANAGER_S3_DEADLINE``, else
        `DEFAULT_DEADLINE`) bounds one call over all its tries: a try waits at most
        ``connect_timeout`` to connect and ``read_timeout`` for each answer (both cut so that
        one try fits in the deadline), and no try begins that could end past it.

        Raises:
            InvalidNameError: a bucket or prefix S3 would refuse or that could escape.
            InvalidInputError: ``attempts`` below 1, or a deadline that is not a positive
                number of seconds.
            BlobStoreError: the bucket does not exist, the credentials are refused, or the
                client cannot be configured (`TransientBlobStoreError`: unreachable;
                `BlobStoreTimeoutError`: no answer within the deadline).
            MissingDependencyError: boto3 is not installed.
        """
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise InvalidNameError(f"not a valid S3 bucket name: {bucket!r:.80}")
        prefix = prefix.strip("/")
        if prefix:
            _check_relative(prefix, "prefix")
        if attempts < 1:
            raise InvalidInputError("attempts must be at least 1")
        deadline = _deadline_from(deadline)
        # One try fits in the deadline: half of it at most to connect, the rest to answer.
        connect_timeout = min(connect_timeout, deadline / 2)
        read_timeout = min(read_timeout, deadline - connect_timeout)
        self.bucket = bucket
        self.prefix = prefix
        self._base = f"{prefix}/" if prefix else ""
        self._blobs = f"{self._base}{BLOBS_DIR}/"
        self._config = _Config(
            endpoint_url=endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None,
            region=region,
            profile=profile,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            attempts=attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            deadline=deadline,
        )
        self._client = self._make_client()
        self._silence = _Silence()
        self._uploads = _Uploaders()
        if check_bucket:
            self._call("check the bucket", None, lambda c: c.head_bucket(Bucket=self.bucket))

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3BlobStore:
        """The store of ``s3://bucket/prefix`` (see `parse_s3_url`)."""
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, **kwargs)

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - boto3 is a dependency of the s3 extra
            from ..errors import MissingDependencyError, extra_hint

            raise MissingDependencyError("a pool on S3 needs boto3; " + extra_hint("s3")) from exc
        cfg = self._config
        try:
            session = boto3.session.Session(
                botocore_session=_botocore_session(), profile_name=cfg.profile
            )
            client = session.client(
                "s3",
                endpoint_url=cfg.endpoint_url,
                region_name=cfg.region or session.region_name or "us-east-1",
                config=Config(
                    connect_timeout=cfg.connect_timeout,
                    read_timeout=cfg.read_timeout,
                    # NOTE: retries are ours (`_call`): bounded, the same for every error
                    # kind, and the final error is worded here, not by botocore.
                    retries={"total_max_attempts": 1},
                    max_pool_connections=32,
                    tcp_keepalive=True,
                    # Checksums only where an operation requires them: servers that predate
                    # the flexible checksums (MinIO-based gateways) refuse the headers; reads
                    # are verified against their digest anyway.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
            # DeleteObjects requires an integrity header: botocore now sends a CRC32 one,
            # which those same servers do not know (MissingContentMD5); S3 takes either.
            client.meta.events.register("before-call.s3.DeleteObjects", _add_content_md5)
            return client
        except Exception as exc:
            code, _, _ = _classify(exc)
            raise BlobStoreError(
                f"cannot set up the S3 client for s3://{self.bucket}/{self.prefix} ({code}); "
                "check AWS_ENDPOINT_URL, AWS_PROFILE and the AWS config files"
            ) from None

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``: the pool's root as the user names it."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint(self) -> str:
        """The endpoint as messages show it (no user info)."""
        return _redact_endpoint(self._config.endpoint_url)

    def pool_root(self) -> S3Root:
        """The pool's root on the bucket (identity and journal objects)."""
        return S3Root(self)

    def _at(self, url: str) -> S3BlobStore:
        """The store of another ``s3://bucket/prefix`` on this store's endpoint, with this
        store's settings and client; no request is made (`S3Root.other` shows its root
        read-only).

        Raises:
            InvalidNameError: ``url`` is not a valid ``s3://bucket/prefix``.
        """
        bucket, prefix = parse_s3_url(url)
        other = copy.copy(self)
        other.bucket, other.prefix = bucket, prefix
        other._base = f"{prefix}/" if prefix else ""
        other._blobs = f"{other._base}{BLOBS_DIR}/"
        return other

    # ------------------------------------------------------------------ requests

    def _key(self, digest: str) -> str:
        return self._blobs + blob_key(digest)

    def _named_key(self, name: str) -> str:
        return self._base + _check_relative(name, "name")

    @property
    def deadline(self) -> float:
        """Seconds one call may take over all its tries (see the constructor)."""
        return self._config.deadline

    def _call(self, what: str, key: str | None, op: Callable[[Any], _T]) -> _T:
        """Run ``op(client)``, retrying transient failures with bounded, jittered backoff
        within the deadline; any failure comes out as `BlobStoreError`
        (`TransientBlobStoreError`, `BlobStoreTimeoutError`), naming the bucket and key,
        never the SDK's exception or the credentials."""
        cfg = self._config
        silence = self._silence
        started = time.monotonic()
        if started < silence.until:
            raise BlobStoreTimeoutError(silence.message)
        # A try may take this long when the store accepts and does not answer.
        one_try = cfg.connect_timeout + cfg.read_timeout
        delay = cfg.backoff
        for attempt in range(1, cfg.attempts + 1):
            try:
                return op(self._client)
            except Exception as exc:
                code, transient, status = _classify(exc)
                pause = random.uniform(delay / 2, delay)
                # NOTE: no try begins that could end past the deadline (a store that
                # answers nothing would otherwise hold the caller for tries x timeout: five
                # minutes with the SDK's defaults, some of it under the catalog's lock).
                fits = time.monotonic() - started + pause + one_try <= cfg.deadline
                if transient and attempt < cfg.attempts and fits:
                    # The code only: an SDK message may hold a signed URL.
                    _log.info(
                        "s3 %s: %s (try %d of %d); retrying", what, code, attempt, cfg.attempts
                    )
                    time.sleep(pause)
                    delay = min(delay * 2, cfg.max_backoff)
                    continue
                if code in _SILENT_CODES:
                    error = self._timed_out(what, key, code, attempt)
                    silence.message = str(error)
                    silence.until = time.monotonic() + min(cfg.deadline, 60.0)
                    raise error from None
                raise self._error(what, key, code, transient, status, attempt) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _timed_out(self, what: str, key: str | None, code: str, tries: int) -> BlobStoreError:
        where = f"s3://{self.bucket}/{key}" if key is not None else f"bucket {self.bucket!r}"
        return BlobStoreTimeoutError(
            f"cannot {what} at {where}: {self.endpoint} did not answer within the "
            f"{self._config.deadline:g} s deadline ({tries} tr{'y' if tries == 1 else 'ies'}, "
            f"{code}); check that the endpoint is up and reachable, or allow more time with "
            f"${DEADLINE_ENV}"
        )

    def _error(
        self, what: str, key: str | None, code: str, transient: bool, status: int | None, tries: int
    ) -> BlobStoreError:
        where = f"s3://{self.bucket}/{key}" if key is not None else f"bucket {self.bucket!r}"
        if code == "NoSuchBucket" or (key is None and code in _MISSING_CODES):
            return BlobStoreError(
                f"cannot {what}: the bucket {self.bucket!r} does not exist at {self.endpoint} "
                "(create it first, or check the bucket name and AWS_ENDPOINT_URL)"
            )
        if code in _DENIED_CODES:
            return BlobStoreError(
                f"cannot {what} at {where}: access denied by {self.endpoint} ({code}); check "
                "the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's policy"
            )
        if code in ("NoCredentials", "ProfileNotFound"):
            return BlobStoreError(
                f"cannot {what} at {where}: no usable AWS credentials ({code}); set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )
        if transient:
            return TransientBlobStoreError(
                f"cannot {what} at {where}: {self.endpoint} failed {tries} time(s) "
                f"({code}{'' if status is None else f', HTTP {status}'}); retry later"
            )
        return BlobStoreError(
            f"cannot {what} at {where}: {self.endpoint} answered {code}"
            + ("" if status is None else f" (HTTP {status})")
        )

    def _head(self, key: str, what: str) -> dict[str, Any] | None:
        """The object's metadata, or None if it does not exist."""
        import botocore.exceptions as bx

        try:
            head: dict[str, Any] = self._call(
                what, key, lambda c: c.head_object(Bucket=self.bucket, Key=key)
            )
            return head
        except BlobStoreError as exc:
            if isinstance(exc.__context__, bx.ClientError):
                code, _, _ = _classify(exc.__context__)
                if code in _MISSING_CODES:
                    return None
            raise

    def _get(self, key: str, what: str, range_: str | None = None) -> bytes | None:
        """The object's bytes (or a range of them); None if it does not exist; b"" for a
        range past its end."""
        import botocore.exceptions as bx

        def op(c: Any) -> bytes:
            kwargs = {"Bucket": self.bucket, "Key": key}
            if range_ is not None:
                kwargs["Range"] = range_
            body = c.get_object(**kwargs)["Body"]
            try:
                # Read inside the retried call: a connection dropped mid-body is transient.
                data: bytes = body.read()
                return data
            finally:
                body.close()

        try:
            return self._call(what, key, op)
        except BlobStoreError as exc:
            if isinstance(exc.__context__, bx.ClientError):
                code, _, _ = _classify(exc.__context__)
                if code in _MISSING_CODES:
                    return None
                if code == "InvalidRange":
                    return b""
            raise

    # ------------------------------------------------------------------ writing

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Store ``data`` once and return its digest (see `AbstractBlobStore.put`).

        A stored digest is not uploaded again: its size is compared with the data's.
        """
        return self._put(data, digest, look=True)

    def _put(self, data: Buffer | Sequence[Buffer], digest: str | None, *, look: bool) -> str:
        views, digest = _prepare(data, digest)
        key = self._key(digest)
        found = self._head(key, "look up a blob") if look else None
        if found is not None:
            _check_size(digest, int(found["ContentLength"]), views)
            return digest
        size = sum(v.nbytes for v in views)
        if size >= MULTIPART_THRESHOLD:
            self._put_multipart(key, digest, views, size)
        else:
            body = views[0].tobytes() if len(views) == 1 else b"".join(views)
            self._check_unchanged(digest, body)
            self._call(
                "upload a blob",
                key,
                lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=body),
            )
        return digest

    @staticmethod
    def _check_unchanged(digest: str, body: Buffer) -> None:
        # The bytes sent are a copy made after the digest pass: a buffer changed in between
        # must not be stored under the old digest.
        if xxhash.xxh3_128_hexdigest(body) != digest:
            from ..errors import IntegrityError

            raise IntegrityError(f"blob {digest}: the data changed while it was written")

    def _put_multipart(self, key: str, digest: str, views: list[memoryview], size: int) -> None:
        """Upload in `PART_SIZE` parts; the object appears only at the completion, and a
        failure aborts the upload (one that cannot be aborted is swept by GC)."""
        created = self._call(
            "begin a multipart upload",
            key,
            lambda c: c.create_multipart_upload(Bucket=self.bucket, Key=key),
        )
        upload_id = created["UploadId"]
        try:
            hasher = xxhash.xxh3_128()
            parts = []
            for number, body in enumerate(_parts(views, PART_SIZE), start=1):
                hasher.update(body)
                answer = self._call(
                    "upload a part",
                    key,
                    functools.partial(
                        _upload_part,
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body,
                    ),
                )
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
            if hasher.hexdigest() != digest:
                from ..errors import IntegrityError

                raise IntegrityError(f"blob {digest}: the data changed while it was written")
            try:
                self._call(
                    "complete a multipart upload",
                    key,
                    lambda c: c.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": parts},
                    ),
                )
            except BlobStoreError:
                # A completion whose answer was lost, then retried: the upload is gone and
                # the object is there.
                found = self._head(key, "look up a blob")
                if found is None or int(found["ContentLength"]) != size:
                    raise
        except BaseException:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """`put` each item on up to ``workers`` threads (requests wait on the network);
        return their digests in order.  On a failure the first error is raised once every
        started put ended; blobs already uploaded stay (each a valid blob of its digest)."""
        return self._put_all(items, workers, look=True)

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        """`put_many` without the HEAD before each upload (see `AbstractBlobStore.put_new`):
        a PUT of a digest-named key replaces the object whole, with the same bytes."""
        return self._put_all(items, 4 if workers is None else workers, look=False)

    def _put_all(self, items: Sequence[PutItem], workers: int, *, look: bool) -> list[str]:
        # put_many goes through `put` as it did before put_new: a subclass's put (metering,
        # logging) sees each item.
        put = self.put if look else functools.partial(self._put, look=False)
        if len(items) <= 1 or workers <= 1:
            return [put(data, digest) for data, digest in items]
        # NOTE: the calling thread uploads too, beside up to workers - 1 of the store's
        # kept threads, each taking the next item until none is left.  A pool made per call
        # started a thread per item (a save calls this once per pair of chunks): under load
        # each start waited for the GIL behind the encoder, and the last uploads of a save,
        # which nothing else overlaps, began up to 25 ms apart.
        results: list[str] = [""] * len(items)
        errors: list[BaseException | None] = [None] * len(items)
        left = list(range(len(items) - 1, -1, -1))
        lock = threading.Lock()

        def drain() -> None:
            while True:
                with lock:
                    if not left:
                        return
                    index = left.pop()
                data, digest = items[index]
                try:
                    results[index] = put(data, digest)
                except Exception as exc:  # raised below, the first in the items' order
                    errors[index] = exc

        uploader = self._uploads.executor()
        helpers = [uploader.submit(drain) for _ in range(min(workers, len(items)) - 1)]
        try:
            drain()
        finally:
            # An interrupted caller lets no more uploads begin, and returns once those
            # begun have ended, as it did with a pool of its own.  A helper still queued
            # (the threads busy with another save's uploads) has nothing left to take.
            with lock:
                left.clear()
            for helper in helpers:
                helper.cancel()
            concurrent.futures.wait(helpers)
        for error in [*errors, *(h.exception() for h in helpers if not h.cancelled())]:
            if error is not None:
                raise error
        return results

    # ------------------------------------------------------------------ reading

    def get(self, digest: str) -> bytes:
        """The verified bytes of ``digest``."""
        data = self._get(self._key(digest), "read a blob")
        if data is None:
            raise _missing(digest)
        _verify(digest, data)
        return data

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """A read-only view of ``digest``'s bytes (read whole: no mmap on an object store)."""
        data = self._get(self._key(digest), "read a blob")
        if data is None:
            raise _missing(digest)
        if verify:
            _verify(digest, data)
        return memoryview(data)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``digest`` from ``offset``: one ranged GET, unverified."""
        key = self._key(digest)
        if offset < 0 or length < 0:
            raise ValueError("offset and length must be >= 0")
        if length == 0:
            if self._head(key, "look up a blob") is None:
                raise _missing(digest)
            return b""
        data = self._get(key, "read a blob range", f"bytes={offset}-{offset + length - 1}")
        if data is None:
            raise _missing(digest)
        if data == b"" and self._head(key, "look up a blob") is None:
            raise _missing(digest)
        return data[:length]

    def check(self, digest: str) -> None:
        """Rehash ``digest``: BlobCorruptError or BlobNotFoundError on damage."""
        data = self._get(self._key(digest), "read a blob")
        if data is None:
            raise _missing(digest)
        actual = xxhash.xxh3_128_hexdigest(data)
        if actual != digest:
            raise _corrupt(digest, len(data), actual)

    def stat(self, digest: str) -> BlobStat:
        """The size and upload time of ``digest`` (a HEAD)."""
        found = self._head(self._key(digest), "look up a blob")
        if found is None:
            raise _missing(digest)
        return BlobStat(int(found["ContentLength"]), _seconds(found["LastModified"]))

    def has(self, digest: str) -> bool:
        """True when ``digest`` is stored (a HEAD)."""
        return self._head(self._key(digest), "look up a blob") is not None

    # ------------------------------------------------------------------ listing

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of each blob, page by page (1000 keys a request); keys
        that are not canonical blob names are ignored."""
        token: str | None = None
        while True:

            def op(c: Any, token: str | None = token) -> dict[str, Any]:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._blobs}
                if token is not None:
                    kwargs["ContinuationToken"] = token
                page: dict[str, Any] = c.list_objects_v2(**kwargs)
                return page

            page = self._call("list the blobs", self._blobs, op)
            for item in page.get("Contents", ()) or ():
                parts = item["Key"][len(self._blobs) :].split("/")
                if len(parts) == 3 and is_blob_name(*parts):
                    yield parts[2], int(item["Size"]), _seconds(item["LastModified"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # ------------------------------------------------------------------ deleting

    def delete(self, digest: str) -> bool:
        """Delete ``digest``'s object; False if it was not there (S3 does not say, so a HEAD
        asks first)."""
        key = self._key(digest)
        if self._head(key, "look up a blob") is None:
            return False
        self._call("delete a blob", key, lambda c: c.delete_object(Bucket=self.bucket, Key=key))
        return True

    def delete_many(self, digests: Iterable[str], *, workers: int = 8) -> int:
        """Delete each of ``digests``; return how many were stored.

        Every name is checked before anything is deleted.  The existence checks (HEADs, on
        up to ``workers`` threads: S3 reports a missing key deleted too) come first, then one
        ``DeleteObjects`` request per `DELETE_BATCH` keys instead of a DELETE each.  On an
        error, a batch may be partly deleted and later batches are not (GC keeps such rows
        'deleting' and finishes them next time; docs/architecture/object-stores.md, "Blobs on an
        object store").
        """
        keys = list(dict.fromkeys(self._key(d) for d in digests))
        if not keys:
            return 0

        def exists(key: str) -> bool:
            return self._head(key, "look up a blob") is not None

        if len(keys) == 1 or workers <= 1:
            found = [k for k in keys if exists(k)]
        else:
            with Helpers(min(workers, len(keys))) as pool:
                found = [k for k, there in zip(keys, pool.map(exists, keys), strict=True) if there]
        for start in range(0, len(found), DELETE_BATCH):
            batch = found[start : start + DELETE_BATCH]
            request = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
            answer = self._call(
                "delete blobs",
                batch[0],
                lambda c, r=request: c.delete_objects(Bucket=self.bucket, Delete=r),  # type: ignore[misc]
            )
            errors = [e for e in answer.get("Errors", ()) or () if e.get("Code") != "NoSuchKey"]
            if errors:
                code = str(errors[0].get("Code", "error"))
                raise self._error(
                    f"delete blobs ({len(errors)} of {len(batch)} refused)",
                    str(errors[0].get("Key")),
                    code,
                    code in _TRANSIENT_CODES,
                    None,
                    1,
                )
        return len(found)

    # ------------------------------------------------------------------ incomplete writes

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """Multipart uploads begun under ``<prefix>/blobs/`` and neither completed nor aborted
        (a writer killed mid-upload), named ``<key>#<upload id>``, timed by their start."""
        found: list[IncompleteWrite] = []
        key_marker: str | None = None
        id_marker: str | None = None
        while True:

            def op(c: Any, km: str | None = key_marker, im: str | None = id_marker) -> Any:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._blobs}
                if km:
                    kwargs["KeyMarker"] = km
                    if im:
                        kwargs["UploadIdMarker"] = im
                return c.list_multipart_uploads(**kwargs)

            page = self._call("list incomplete uploads", self._blobs, op)
            for up in page.get("Uploads", ()) or ():
                key = up["Key"]
                if key.startswith(self._blobs):
                    found.append(
                        IncompleteWrite(
                            f"{key[len(self._base) :]}#{up['UploadId']}",
                            _seconds(up["Initiated"]),
                            _upload_digest(key[len(self._blobs) :]),
                        )
                    )
            if not page.get("IsTruncated"):
                return found
            key_marker = page.get("NextKeyMarker")
            id_marker = page.get("NextUploadIdMarker")
            if not key_marker:
                return found

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Abort the multipart upload ``write`` names; False if it is gone or is not one of
        this store's (a name that does not parse, a key outside ``<prefix>/blobs/``)."""
        import botocore.exceptions as bx

        name, _, upload_id = write.name.rpartition("#")
        parts = name.split("/")
        if (
            not upload_id
            or len(parts) != 4
            or parts[0] != BLOBS_DIR
            or not is_blob_name(*parts[1:])
        ):
            return False
        key = self._base + name
        try:
            self._call(
                "abort an incomplete upload",
                key,
                lambda c: c.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id),
            )
        except BlobStoreError as exc:
            if isinstance(exc.__context__, bx.ClientError):
                code, _, _ = _classify(exc.__context__)
                if code in ("NoSuchUpload", *_MISSING_CODES):
                    return False
            raise
        return True

    # ------------------------------------------------------------------ named objects (S3Root)

    def _read_named(self, name: str) -> bytes | None:
        return self._get(self._named_key(name), "read a pool object")

    def _write_named(self, name: str, data: bytes, *, exclusive: bool) -> bool:
        key = self._named_key(name)
        if exclusive:
            return self._create_exclusive(name, key, data)
        self._call(
            "write a pool object",
            key,
            lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=data),
        )
        return True

    def _create_exclusive(self, name: str, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist; of racing creators at most one wins.

        NOTE: conditional PUTs (``If-None-Match: *``) are not honoured by every S3-compatible
        server (MinIO-based gateways ignore them), so creators *claim* first: each writes
        ``<name>.claims/<uuid>``, lists the claims, and backs off if another live claim is
        as old as its own (the server's clock orders them), or if the object appeared
        meanwhile.  A claim that saw no older one was written before any later claimer
        listed, so that claimer sees it and backs off (docs/architecture/object-stores.md, "Blobs on
        an object store").
        """
        if self._head(key, "look up a pool object") is not None:
            return False
        claims = f"{key}.claims/"
        mine = f"{claims}{uuid.uuid4().hex}"
        self._call(
            "claim a pool object",
            mine,
            lambda c: c.put_object(Bucket=self.bucket, Key=mine, Body=b""),
        )
        try:
            listed = self._call(
                "list claims",
                claims,
                lambda c: c.list_objects_v2(Bucket=self.bucket, Prefix=claims),
            )
            # Milliseconds here (a listing has them): claims of one second are still ordered.
            stamps = {i["Key"]: i["LastModified"].timestamp() for i in listed.get("Contents", ())}
            own = stamps.get(mine)
            if own is None:
                return False  # our claim is not listed: no ordering can be trusted
            for other, stamp in stamps.items():
                if other != mine and own - _CLAIM_TTL < stamp <= own:
                    return False
            if self._head(key, "look up a pool object") is not None:
                return False
            self._call(
                "write a pool object",
                key,
                lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=data),
            )
            return True
        finally:
            with contextlib.suppress(BlobStoreError):
                self._call(
                    "drop a claim",
                    mine,
                    lambda c: c.delete_object(Bucket=self.bucket, Key=mine),
                )

    def _list_named(self, folder: str, *, after: str | None = None) -> list[tuple[str, float]]:
        base = self._named_key(folder) + "/"
        found: list[tuple[str, float]] = []
        token: str | None = None
        while True:

            def op(c: Any, token: str | None = token) -> dict[str, Any]:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base, "Delimiter": "/"}
                if token is not None:
                    kwargs["ContinuationToken"] = token
                elif after is not None:
                    kwargs["StartAfter"] = base + after
                page: dict[str, Any] = c.list_objects_v2(**kwargs)
                return page

            page = self._call("list pool objects", base, op)
            for item in page.get("Contents", ()) or ():
                found.append((item["Key"][len(base) :], _seconds(item["LastModified"])))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def _delete_named(self, name: str) -> bool:
        key = self._named_key(name)
        if self._head(key, "look up a pool object") is None:
            return False
        self._call(
            "delete a pool object", key, lambda c: c.delete_object(Bucket=self.bucket, Key=key)
        )
        return True


def _add_content_md5(params: dict[str, Any], **_: Any) -> None:
    """Give a request body its Content-MD5 header (see `S3BlobStore._make_client`)."""
    body = params.get("body", b"")
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes):
        digest = hashlib.md5(body, usedforsecurity=False).digest()
        params["headers"]["Content-MD5"] = base64.b64encode(digest).decode()


def _parts(views: list[memoryview], size: int) -> Iterator[bytes]:
    """``views`` concatenated and cut into ``size``-byte parts (the last may be shorter)."""
    pending = bytearray()
    for view in views:
        start = 0
        while start < view.nbytes:
            take = min(size - len(pending), view.nbytes - start)
            pending += view[start : start + take]
            start += take
            if len(pending) == size:
                yield bytes(pending)
                pending = bytearray()
    if pending:
        yield bytes(pending)


def _upload_digest(name: str) -> str | None:
    """The digest of an upload's key below ``blobs/`` (None: not a blob's key)."""
    parts = name.split("/")
    return parts[2] if len(parts) == 3 and is_blob_name(*parts) else None


def _seconds(stamp: Any) -> float:
    """An S3 time as whole seconds since the epoch.

    NOTE: whole seconds, because HEAD answers with an HTTP date (seconds) while a listing
    has milliseconds: one blob must have one write time whichever way it is asked.
    """
    return float(int(stamp.timestamp()))


def _upload_part(client: Any, **request: Any) -> Any:
    return client.upload_part(**request)
