"""Saves handed off to a background thread (`ArchiveManager.save_async`;
docs/architecture/save-protocol.md, "Saving in the background").

The caller's thread takes the snapshot: a copy of each sample that encodes as the sample
does at the call (`codec.snapshot.take_samples`: its numeric lists converted to the arrays a
record stores, on several threads, the rest copied around its immutable leaves, tensors and
arrays cloned), so the caller may reuse or change its samples as soon as
`BackgroundSaves.submit` returns.  A sample the copy does not take is encoded right there
instead (`writer.prepare_sample`, which copies what it stores).  One worker thread per pool
then encodes and describes the copies (`writer.prepare_sample`, without copying again) and
runs the save protocol on them (`ArchiveWriter.add_prepared`, `commit`), one save at a time,
in the order the saves were handed over: what is durable, owned and visible, and when, is
exactly what `save` makes it.

Memory is bounded by a budget of bytes in flight: the copies (and samples prepared) handed
over and not yet taken by the worker's writer.  A caller that would exceed it waits until the
worker has taken enough (backpressure), except the caller of the save the worker is on when
the worker has nothing of it left to take: that one always goes on, so two callers can never
wait on each other.  The worker's writer holds at most a few chunks more, as any save does.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._util.failpoints import failpoint
from ..errors import ArchiveError, InvalidInputError
from ..samples import task_key_and_text
from .archive import Archive
from .context import PoolContext

# NOTE: the writer (and so the codec: numpy, zstandard) is imported where a save is handed
# over: opening a pool imports this module to register the exit hook (docs/architecture/start-up.md,
# "Start-up").
if TYPE_CHECKING:
    from .writer import PreparedSample

__all__ = ["DEFAULT_BUDGET", "BackgroundSaves", "PastExit", "SaveFuture", "register_exit_hook"]

_log = logging.getLogger("archive_manager")

#: Bytes of samples in flight, by default: the realistic 1,024-sample rollout's copies hold
#: about 40 MB (its numeric lists as arrays, texts, containers), so a couple of dozen such
#: saves, or one rollout with 1 GiB of routed-expert tensors, before a caller waits.
DEFAULT_BUDGET = 1 << 30


class SaveFuture(Future[Archive]):
    """The future of a background save: resolves to the `Archive` that `save` returns, or
    fails with the error `save` would have raised.

    It remembers whether its outcome was looked at (`result` or `exception` called), so that
    a failure nobody looked at is raised again by the pool's `close`, or, once the pool was
    dropped without `close`, logged when the future is collected (as asyncio does for a
    task's exception never retrieved)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.observed = False
        self.failure: BaseException | None = None

    def set_exception(self, exception: BaseException | None) -> None:
        self.failure = exception
        super().set_exception(exception)

    def __del__(self) -> None:
        if self.failure is not None and not self.observed:
            with contextlib.suppress(Exception):  # the interpreter may be tearing down
                _log.error(
                    "the save_async of %r failed and nobody looked at its future",
                    self.name,
                    exc_info=self.failure,
                )

    @classmethod
    def ran(cls, name: str, save: Callable[[], Archive]) -> SaveFuture:
        """The future of ``save()`` run on this thread, now: its archive or its error (an
        interrupt, such as Ctrl-C, is raised)."""
        from .._util.threads import run_into

        return run_into(cls(name), save)

    def result(self, timeout: float | None = None) -> Archive:
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        return super().exception(timeout)


class PastExit(Exception):
    """`BackgroundSaves.submit` once the exit hook has begun (a thread it joins, an `atexit`
    function, a daemon thread as the interpreter ends): the save is its caller's to run
    (`BackgroundSaves.run_here`)."""


#: How long the worker waits for its caller before it looks again (a wake-up lost to a
#: second Ctrl-C in the caller's `_seal` costs this, not a hang).
_POLL = 1.0

#: Samples taken at a time (`codec.snapshot.take_samples` converts their numeric lists
#: together, on several threads) before they are handed over one by one.
_BATCH = 128

#: No task key given: the sample's own (`writer.prepare_sample` reads it).
_UNSET: Any = object()


@dataclass(eq=False, slots=True)
class _Taken:
    """A sample as the caller's thread took it (`codec.snapshot.take_samples`), for the worker
    to prepare: a copy that encodes as the sample did, its position, its task key when it was
    given or read from what the copy left out, and the bytes it holds."""

    sample: Any
    position: int
    task_key: Any
    nbytes: int

    def prepare(self, pool: PoolContext, reward_key: str | None) -> PreparedSample:
        from .writer import prepare_sample

        # NOTE: without copying: the copy is the worker's alone
        if self.task_key is _UNSET:
            return prepare_sample(
                pool, self.sample, self.position, copy=False, reward_key=reward_key
            )
        return prepare_sample(
            pool, self.sample, self.position, self.task_key, copy=False, reward_key=reward_key
        )


@dataclass(eq=False)
class _Job:
    """One save handed over: its arguments, the samples prepared so far, and how it stands."""

    name: str
    future: SaveFuture
    rollout_id: int | None
    evaluation: bool
    attrs: dict[str, Any] | None
    supersede: bool
    reward_key: str | None
    # A save of a reference archive (no samples): the whole save, run on the worker.
    direct: Callable[[], Archive] | None = None
    items: deque[PreparedSample | _Taken] = field(default_factory=deque)
    registered: bool = False  # queued for the worker (`BackgroundSaves._register`)
    # set once every sample was handed over, ``(None,)``, or the snapshot failed or was
    # interrupted, ``(its error,)``: the save must not publish then
    outcome: tuple[BaseException | None] | None = None
    stalled: bool = False  # its caller waited for room: the worker must start on it
    dropped: bool = False  # the worker gave the save up: the caller stops preparing


class BackgroundSaves:
    """The background saves of one open pool: a byte budget and one worker thread.

    The worker is a non-daemon thread started when a save is handed over and ended when none
    is left (after waiting `_IDLE` seconds for the next one, unless the pool is closed or
    dropped or the interpreter exits), so an interpreter that exits with saves in flight
    waits for them (each ends published, or failed and rolled back, as `save`); `close`
    waits for them too.
    """

    def __init__(self, pool: PoolContext, budget: int = DEFAULT_BUDGET) -> None:
        self._pool = pool
        self._budget = _check_budget(budget)
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()  # handed over and not finished; the worker's first
        self._held = 0  # bytes of the samples in `_Job.items` (copies or prepared)
        self._worker: threading.Thread | None = None
        self._failed: list[SaveFuture] = []  # kept for `close` until it reports them
        self._taking: _Job | None = None  # the save whose next sample the worker waits for
        self._closed = False
        self._abandoned = False  # the pool was dropped: failures are logged, not kept
        _live.add(self)

    @property
    def budget(self) -> int:
        """Bytes of samples handed over (copies or prepared) that may wait for the worker
        before a caller waits."""
        return self._budget

    @budget.setter
    def budget(self, value: int) -> None:
        with self._cond:
            self._budget = _check_budget(value)
            self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        """Bytes of samples handed over now waiting for the worker."""
        with self._cond:
            return self._held

    @property
    def _stopping(self) -> bool:
        """Whether an idle worker ends at once (the pool closed or dropped, or the
        interpreter exiting) instead of waiting for the next save."""
        return self._closed or self._abandoned or _exit_started

    @property
    def pending(self) -> int:
        """Saves handed over and not yet finished."""
        with self._cond:
            return len(self._jobs)

    # ------------------------------------------------------------------ the caller's side

    def submit(
        self,
        name: str,
        samples: Sequence[Any] | None,
        *,
        rollout_id: int | None,
        evaluation: bool,
        task_keys: Sequence[Any] | None,
        attrs: dict[str, Any] | None,
        supersede: bool = False,
        direct: Callable[[], Archive] | None = None,
        reward_key: str | None = None,
    ) -> SaveFuture:
        """Snapshot ``samples`` on this thread and hand the save to the worker; return its
        future.  ``direct`` (a save with no samples to take, a reference save) is run whole by
        the worker instead.

        Every error of the save itself (bad input included) is set on the future; this raises
        only if the pool is closed, or re-raises what interrupts the snapshot (a
        ``KeyboardInterrupt``: the save is then given up, nothing published).
        """
        future = SaveFuture(name)
        # Running from the start: a save handed over cannot be cancelled (`cancel` is False),
        # as an executor's running task cannot; it ends published or failed.
        future.set_running_or_notify_cancel()
        job = _Job(name, future, rollout_id, evaluation, attrs, supersede, reward_key, direct)
        if direct is None:
            # NOTE: before the save is registered: the first call imports numpy and the
            # writer, and a Ctrl-C there must leave nothing behind (the worker would import
            # them again mid-save, or wait for a snapshot that never comes).
            _import_what_a_save_runs()
        try:
            self._register(job)
            failpoint("save_async.register")
            if direct is None:
                self._snapshot(job, samples, task_keys)
        except Exception as exc:
            if not job.registered:
                raise  # refused (the pool is closed): nothing to roll back
            self._seal(job, exc)
        except BaseException as exc:
            # Interrupted (Ctrl-C), wherever: the caller sees it here, so `close` does not
            # raise it again; a save registered is sealed failed and the worker rolls it back
            # (sealing one that was not is harmless).
            future.observed = True
            self._seal(job, exc)
            raise
        else:
            self._seal(job, None)
        return future

    def run_here(self, name: str, save: Callable[[], Archive]) -> SaveFuture:
        """``save()`` run on the caller's thread (once `submit` refused it: `PastExit`), its
        future returned done; a failure is kept for `close` as a worker's is."""
        future = SaveFuture.ran(name, save)
        if future.failure is not None:
            with self._cond:
                if not self._abandoned:
                    self._failed.append(future)
        return future

    def _register(self, job: _Job) -> None:
        """Queue ``job`` for the worker, starting the worker first if there is none.

        NOTE: ordered so that an interrupt at any point (``Thread.start`` waits, and a wait
        can raise KeyboardInterrupt) leaves either no job queued or a job the caller seals:
        the worker is started, then made the pool's, then given the job; a worker started
        whose start was interrupted is no one's and ends at once (`_run`).
        """
        with self._cond:
            if self._closed:
                raise ArchiveError(f"the pool is closed: save_async of {job.name!r} refused")
            if threading.current_thread() is self._worker:
                raise ArchiveError(
                    f"save_async of {job.name!r} from a callback of another background save: "
                    "it would wait for the thread that runs it"
                )
            # NOTE: under `_exit_lock`, as `_wait_at_exit` marks its start: a save is either
            # registered before it (and waited for there) or refused here
            with _exit_lock:
                if _exit_done:
                    raise PastExit(job.name)
                if self._worker is None:
                    worker = threading.Thread(
                        target=self._run, name="archive-save-async", daemon=False
                    )
                    worker.start()  # it waits for `_cond` before it looks for a job
                    self._worker = worker
                self._jobs.append(job)
                job.registered = True
                _callers.add(threading.current_thread())
                _live.add(self)  # (again in a forked child, which forgot its parent's)

    def _snapshot(
        self, job: _Job, samples: Sequence[Any] | None, task_keys: Sequence[Any] | None
    ) -> None:
        from ..codec.snapshot import take_samples
        from ..codec.values import _promote_young
        from ..metadata import check_reward_key
        from ..samples import task_key_of
        from .writer import prepare_sample

        keys = _checked(samples, task_keys)
        job.reward_key = check_reward_key(job.reward_key)
        assert samples is not None  # checked
        # NOTE: no garbage collection while taking, as `save` does (writer.save_samples): the
        # copies hold no cycles a collection could free, and a full one walks the caller's heap.
        # When it resumes, the copies join the oldest generation, as a load's objects do
        # (`_promote_young`): the young collection the pause ran up would otherwise start at
        # once, on this thread, and walk them all to free nothing (2-3 ms of the realistic
        # rollout's snapshot; docs/performance.md, "Saving in the background").
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            remaining = iter(samples)
            position = 0
            while batch := list(itertools.islice(remaining, _BATCH)):
                for sample, got in zip(batch, take_samples(batch), strict=True):
                    task_key = _UNSET if keys is None else keys[position]
                    item: PreparedSample | _Taken
                    if got is not None:
                        taken, nbytes, queue = got
                        if queue and task_key is _UNSET:
                            task_key = task_key_of(sample)  # read from what the copy left out
                        item = _Taken(taken, position, task_key, nbytes)
                    elif task_key is _UNSET:
                        item = prepare_sample(
                            self._pool, sample, position, reward_key=job.reward_key
                        )
                    else:
                        item = prepare_sample(
                            self._pool, sample, position, task_key, reward_key=job.reward_key
                        )
                    if not self._hand_over(job, item):
                        return  # the worker gave the save up; its future says why
                    position += 1
        finally:
            if was_enabled:
                _promote_young()
                gc.enable()

    def _hand_over(self, job: _Job, prepared: PreparedSample | _Taken) -> bool:
        """Queue ``prepared`` for the worker once the budget has room; False if the worker
        gave the save up."""
        size = prepared.nbytes
        with self._cond:
            while (
                not job.dropped
                and self._held
                and self._held + size > self._budget
                # The save the worker is on, with nothing of it queued: the worker waits for
                # this sample, so waiting here would wait for ever.
                and not (job is self._jobs[0] and not job.items)
            ):
                job.stalled = True
                self._cond.notify_all()
                self._cond.wait()
            if job.dropped:
                return False
            job.items.append(prepared)
            self._held += size
            if self._taking is job:
                # NOTE: only then: a wake-up the worker does not need takes the GIL from the
                # caller, whose time here is what `save_async` blocks
                self._cond.notify_all()
            return True

    def _seal(self, job: _Job, failure: BaseException | None) -> None:
        # NOTE: one store, before the lock: a second Ctrl-C while this waits for the lock
        # cannot leave the job unsealed (the worker's waits time out and look again)
        job.outcome = (failure,)
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                # NOTE: an idle worker waits a while for the next save (a training loop hands
                # one over a step) rather than end: starting a thread is part of the time
                # `save_async` blocks its caller, 3-4 ms on a busy machine (the new thread
                # waits for a core, then the GIL, before `start` returns).
                idle_until = time.monotonic() + _idle_seconds()
                while self._worker is me and not self._jobs and not self._stopping:
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._worker is not me or not self._jobs:
                    # no save left; or a worker whose start was interrupted (`_register`),
                    # which is no one's: the pool's own worker runs the saves
                    if self._worker is me:
                        self._worker = None
                    self._cond.notify_all()
                    return
                job = self._jobs[0]
            try:
                archive = job.direct() if job.direct is not None else self._save(job)
            except BaseException as exc:  # the save's failure is its future's
                self._drop(job)
                with self._cond:
                    if not self._abandoned:
                        self._failed.append(job.future)
                job.future.set_exception(exc)
            else:
                job.future.set_result(archive)
            finally:
                with self._cond:
                    self._jobs.popleft()
                    self._cond.notify_all()
            # NOTE: the idle wait holds no save: a reference save's job holds the pool
            # (`ArchiveManager.save_async`), which then was never collected, so never
            # `abandoned`, while the worker idled
            del job

    def _save(self, job: _Job) -> Archive:
        from .writer import ArchiveWriter

        # NOTE: the worker starts a save once its snapshot is whole, or once its caller waits
        # for room: before that it would take the GIL from the caller's snapshot, which is
        # the time a training loop is blocked (measured: tools/bench_async_save.py).
        with self._cond:
            while job.outcome is None and not job.stalled:
                self._cond.wait(_POLL)
        if job.outcome is not None and job.outcome[0] is not None and not job.items:
            raise job.outcome[0]  # failed (or interrupted) before any sample was handed over
        writer = ArchiveWriter(
            self._pool, job.name, rollout_id=job.rollout_id, evaluation=job.evaluation,
            attrs=job.attrs, supersede=job.supersede, reward_key=job.reward_key,
        )  # fmt: skip
        try:
            while (item := self._take(job)) is not None:
                writer.add_prepared(
                    item.prepare(self._pool, job.reward_key) if isinstance(item, _Taken) else item
                )
            return writer.commit()
        except BaseException:
            writer.abort()
            raise

    def _take(self, job: _Job) -> PreparedSample | _Taken | None:
        """The next sample of ``job``, prepared or taken; None once all were taken.

        Raises:
            BaseException: the snapshot's error (the save is then rolled back).
        """
        with self._cond:
            while not job.items and job.outcome is None:
                self._taking = job
                self._cond.wait(_POLL)
            self._taking = None
            if job.outcome is not None and job.outcome[0] is not None:
                raise job.outcome[0]
            if not job.items:
                return None
            prepared = job.items.popleft()
            self._held -= prepared.nbytes
            self._cond.notify_all()
            return prepared

    def _drop(self, job: _Job) -> None:
        """Give ``job`` up: free what it holds and stop its caller preparing more."""
        with self._cond:
            job.dropped = True
            self._held -= sum(p.nbytes for p in job.items)
            job.items.clear()
            self._cond.notify_all()

    # ------------------------------------------------------------------ closing

    def wait(self) -> None:
        """Wait until every save handed over so far has finished (published or failed); once
        the pool is closed or the interpreter exits, until the worker has ended too."""
        with self._cond:
            if threading.current_thread() is self._worker:
                raise ArchiveError("waiting for background saves from one of their callbacks")
            while self._jobs:
                self._cond.wait()
            worker = self._worker if self._stopping else None
        if worker is not None:
            worker.join()

    def close(self) -> BaseException | None:
        """Refuse new saves, wait for those in flight; return the first failure whose
        future nobody looked at (with a note naming the save), None if there is none."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # an idle worker ends
        self.wait()
        _live.discard(self)
        return self.unobserved_failure()

    def abandoned(self) -> None:
        """The pool was dropped (or the interpreter exits) without `close`: the saves in
        flight go on (each holds what it needs); a failure nobody looked at is logged when
        its future is collected (`SaveFuture.__del__`), not kept for a `close` to come."""
        with self._cond:
            self._abandoned = True
            self._failed.clear()
            self._cond.notify_all()  # an idle worker ends

    def unobserved_failure(self) -> BaseException | None:
        """The first failure of a finished save whose future nobody looked at, noted; each
        is reported once (it counts as looked at from then on)."""
        with self._cond:
            failed = [f for f in self._failed if not f.observed]
            self._failed.clear()
        if not failed:
            return None
        first = failed[0]
        exc = first.exception()
        for other in failed[1:]:
            other.observed = True
        assert exc is not None
        others = f"; {len(failed) - 1} more failed too: " if len(failed) > 1 else ""
        exc.add_note(
            f"(the save_async of {first.name!r}, whose future nobody looked at{others}"
            + ", ".join(repr(f.name) for f in failed[1:])
            + ")"
        )
        return exc


def _import_what_a_save_runs() -> None:
    """Import the snapshot's and the worker's modules (the codec and numpy, the writer)."""
    from ..codec import snapshot  # noqa: F401

    failpoint("save_async.import")
    from . import writer  # noqa: F401


def _check_budget(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError("the budget of background saves must be an int >= 1 (bytes)")
    return value


def _checked(samples: object, task_keys: object) -> list[str | None] | None:
    """The checks `save` makes of its arguments before it writes anything; the task keys."""
    if samples is None:
        raise InvalidInputError("samples is None and no reference was given")
    if isinstance(samples, (str, bytes, dict)) or not hasattr(samples, "__len__"):
        raise InvalidInputError("samples must be a sequence (a list) of samples")
    if task_keys is None:
        return None
    if isinstance(task_keys, (str, bytes, dict)) or not hasattr(task_keys, "__len__"):
        raise InvalidInputError("task_keys must be a sequence (a list) of keys, one per sample")
    if len(task_keys) != len(samples):
        raise InvalidInputError(
            f"task_keys has {len(task_keys)} keys for {len(samples)} samples; "
            "give one key (or None) per sample"
        )
    # Checked here; each key goes on as text (a long one whole: the writer keys it by its
    # digest and keeps the text, `samples.task_key_and_text`).
    checked = [task_key_and_text(k) for k in task_keys]  # type: ignore[attr-defined]
    return [key if text is None else text for key, text in checked]


# Every `BackgroundSaves` with saves that may be in flight, and every thread that handed one
# over, for the exit hook below.
_live: weakref.WeakSet[BackgroundSaves] = weakref.WeakSet()
_callers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _wait_at_exit() -> None:
    """At interpreter exit, before `concurrent.futures` stops taking work: let the threads
    that hand saves over finish, then wait for every save in flight, so that each ends
    published (or failed and rolled back) as `save` would.

    NOTE: `atexit` functions run only after the interpreter joined its non-daemon threads,
    and before that join `concurrent.futures` stops taking work (its hook, registered with
    ``threading._register_atexit``): a save still running then failed at its next chunk with
    "cannot schedule new futures after interpreter shutdown" and was rolled back.  This hook,
    registered after that one, runs before it.  A non-daemon thread that called `save_async`
    (a training loop the main thread did not join) is joined here first, as the interpreter
    would join it next: its later saves then run too, on its own thread.  Other threads are
    not waited for.
    """
    # NOTE: first, for every pool's saves, those made from now on included: an idle worker
    # ends at once from here.  A caller joined below may be another pool's worker (a done
    # callback that hands a save to a second pool), which would otherwise idle `_IDLE`
    # seconds before the join returned.
    global _exit_started, _exit_done
    _exit_started = True
    # NOTE: and from here a save handed over is run by its caller (`PastExit`): what this
    # waits for is then bounded, the saves registered before (a daemon thread handing saves
    # over faster than they were saved held the exit up for ever), and no save is handed to
    # a worker nobody waits for (one started after the wait below, stopped mid-save by the
    # interpreter: lost without a word).  Under `_exit_lock`, which registering a save takes
    # too: each save is either in a pool of `_live` below or refused.
    with _exit_lock:
        _exit_done = True
    for saves in list(_live):
        with saves._cond:
            saves._cond.notify_all()  # an idle worker ends (`_stopping`)
    me = threading.current_thread()
    pooled = _executor_threads()
    for thread in list(_callers):
        # NOTE: not a `concurrent.futures` worker: it ends only once that module's own exit
        # hook, which runs after this one, shuts its executor down, so joining it here hung
        # the exit for good (a trainer's ThreadPoolExecutor that handed saves over); the
        # saves it handed over are waited for below
        if thread is not me and not thread.daemon and thread not in pooled:
            thread.join()
    for saves in list(_live):
        try:
            saves.wait()
        except ArchiveError:  # the main thread ended inside a callback of a save: let it go
            _log.warning("background saves not waited for at exit", exc_info=True)


def _executor_threads() -> set[threading.Thread]:
    """The worker threads of the process's `concurrent.futures.ThreadPoolExecutor`s (the
    module's own registry of them; empty where it has none)."""
    import concurrent.futures.thread as executors

    registry = getattr(executors, "_threads_queues", None)
    try:
        return set(registry.keys()) if registry is not None else set()
    except (AttributeError, TypeError, RuntimeError):  # another layout, or changed meanwhile
        return set()


def _forget_in_child() -> None:
    """In a child of `os.fork`: the parent's saves are the parent's (their worker thread is
    not in the child), so the child neither waits for them at its exit nor keeps them."""
    for saves in list(_live):
        saves._cond = threading.Condition()  # the parent's may have been held at the fork
        saves._jobs.clear()
        saves._held = 0
        saves._worker = None
        saves._failed.clear()
    _live.clear()
    _callers.clear()
    global _exit_lock
    _exit_lock = threading.Lock()  # the parent's may have been held at the fork


os.register_at_fork(after_in_child=_forget_in_child)

_registered = False


def _idle_seconds() -> float:
    """How long an idle worker waits for the next save: a while where `_wait_at_exit` is
    registered to end it at exit, else not at all (an idle non-daemon thread would hold the
    interpreter's exit up that long)."""
    return _IDLE if _registered_hook and not _exit_started else 0.0


#: How long an idle worker waits for the next save before it ends (see `_run`).
_IDLE = 300.0
_registered_hook = False
#: `_wait_at_exit` has begun: no worker waits idle any more (`BackgroundSaves._stopping`).
_exit_started = False
#: `_wait_at_exit` has begun, or cannot run any more: a save handed over now is refused
#: (`PastExit`) and its caller saves it.
_exit_done = False
_exit_lock = threading.Lock()


def register_exit_hook() -> None:
    """Register `_wait_at_exit` once per process (an open pool does, so that it is there
    before a training thread hands its first save over)."""
    global _registered
    if _registered:
        return
    _registered = True
    import concurrent.futures.thread  # noqa: F401  (its hook first: ours runs before it)

    global _registered_hook
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_wait_at_exit)
        except RuntimeError:
            # Refused once the interpreter shuts down (a pool first opened in an `atexit`
            # function, or by a daemon thread as the interpreter ends): no worker started
            # now would be waited for, so every save is its caller's (`PastExit`).
            global _exit_done
            with _exit_lock:
                _exit_done = True
        else:
            _registered_hook = True
