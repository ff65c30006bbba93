"""Named failpoints at the durable steps of save, publish, retain, release, gc and rebuild.

Each point marks a place where a crash leaves the pool in a distinct durable state (a file
written but not renamed, a transaction about to commit, a file unlinked whose row remains, ...).
They are inert unless the environment variable ``ARCHIVE_MANAGER_FAILPOINTS`` names them when
the library is imported (or a test calls `configure`)::

    ARCHIVE_MANAGER_FAILPOINTS="save.ownership.before_commit=kill"
    ARCHIVE_MANAGER_FAILPOINTS="blob.after_rename=raise@2;gc.after_unlink=kill@3"

An action is ``kill`` (SIGKILL to this process: nothing runs after it, as in a power cut or an
OOM kill), ``raise`` (`FailpointError`, to exercise the error paths), ``sigint`` (SIGINT to
this process: Ctrl-C, a KeyboardInterrupt in the main thread right there) or ``sleep:SECONDS``;
``@N`` fires it at the N-th time the point is reached (1-based) instead of the first.  A point
fires once.  Unknown point names are refused, so a typo cannot make a crash test pass by
testing nothing.  Off, a point costs one test of an empty dict.

`POINTS` lists every point with the step it marks; ``tools/crash_matrix.py`` kills a process
at each and checks the pool's invariants afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from ..errors import InvalidInputError

__all__ = ["ENV", "POINTS", "FailpointError", "configure", "failpoint", "hits"]

ENV = "ARCHIVE_MANAGER_FAILPOINTS"


def _commit(step: str, what: str) -> dict[str, str]:
    return {
        f"{step}.before_commit": f"{what}: its transaction about to commit",
        f"{step}.after_commit": f"{what}: just committed, before the next step",
    }


POINTS: dict[str, str] = {
    # save (docs/architecture/save-protocol.md "Save protocol"), in protocol order
    **_commit("save.lease", "save step 1, the lease"),
    **_commit("save.blobs", "save step 2, holding a chunk's blobs under the lease"),
    "blob.after_temp_write": "a blob's temp file written and fsynced, not yet renamed",
    "blob.after_rename": "a blob renamed to its final name, its folder not yet synced",
    "blob.after_dir_sync": "a batch of blobs durable, not yet marked live",
    **_commit(
        "save.ownership", "save step 3, name claimed: archive pending with its rows and owner"
    ),
    "save.manifest.after_write": "save step 4, the manifest blob durable, not yet published",
    **_commit("save.publish", "save step 5, archive published"),
    "save.rollback.after_unlink": "a failed save's own blob unlinked, its row not yet deleted",
    **_commit("save.rollback", "a failed save's rollback: lease and its own blobs' rows dropped"),
    "pointer.before_link": "a pointer file's temp written and fsynced, not yet linked",
    # retention
    **_commit("retain", "retain: an extra owner's row"),
    **_commit("release", "Archive.release: dropping the archive's own owner"),
    **_commit("release_owner", "release_owner: dropping every row of an owner"),
    # the retention journal (docs/architecture/retention-journal.md "Retention journal"): a
    # decision's record is written after its transaction commits (publish, retain, release,
    # release_owner)
    "journal.before_write": "a decision committed in the catalog, its journal record not written",
    "journal.after_write": "a journal record durable (file and folder synced), call not returned",
    **_commit("journal.checkpoint", "a journal checkpoint made the catalog's position"),
    **_commit("rebuild.journal", "rebuild_catalog: the journal's owners and states applied"),
    # GC (docs/architecture/gc-protocol.md "GC protocol")
    **_commit("gc.plan", "gc plan: leases expired, dead saves rolled back, blobs marked deleting"),
    "gc.after_unlink": "gc: a deleting blob unlinked, its row not yet deleted",
    **_commit("gc.delete", "gc: a batch of unlinked blobs' rows deleted"),
    "gc.orphan.after_unlink": "gc: an orphan file (no catalog row) unlinked",
    # pool identity (docs/architecture/pool-identity.md "Pool identity"); the identity file is
    # written before ``identity.bind`` commits and after ``identity.adopt``/``identity.rebind``
    # commit
    **_commit("identity.bind", "a new or older pool's identity: file written, catalog's row"),
    **_commit("identity.adopt", "recover: an empty catalog takes over a pool's blob root"),
    **_commit("identity.rebind", "rebind: a copied pool's new identity in its catalog"),
    **_commit("identity.move", "a pool moved as a whole: its catalog follows the new root"),
    # catalog recovery (incremental: only what the catalog lacks)
    **_commit("rebuild.archive", "rebuild_catalog: one archive restored from its manifest"),
    **_commit("rebuild.blobs", "rebuild_catalog: a batch of row-less blob files indexed"),
    **_commit("rebuild.finish", "rebuild_catalog: done; GC allowed again, save numbers raised"),
    # background saves (docs/architecture/save-protocol.md "Saving in the background"): where a
    # Ctrl-C must leave no save half started (the ``sigint`` action)
    "save_async.import": "save_async importing what a save runs (numpy, the writer): none registered",
    "save_async.register": "save_async registered its save (worker started), snapshot not taken",
}


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with ``raise``.

    Deliberately not an `ArchiveError`: no code path may mistake an injected fault for an
    expected library error and swallow it.
    """


@dataclass
class _Arm:
    action: str
    seconds: float
    at: int
    hits: int = 0
    fired: bool = False


_armed: dict[str, _Arm] = {}
_lock = threading.Lock()


def _parse(spec: str) -> dict[str, _Arm]:
    armed: dict[str, _Arm] = {}
    for item in (part.strip() for part in spec.replace(",", ";").split(";")):
        if not item:
            continue
        name, sep, action = item.partition("=")
        name, action = name.strip(), action.strip()
        if not sep or name not in POINTS:
            known = ", ".join(sorted(POINTS))
            raise InvalidInputError(f"{ENV}: unknown failpoint in {item!r}; known: {known}")
        at = 1
        if "@" in action:
            action, _, count = action.partition("@")
            if not count.isdigit() or int(count) < 1:
                raise InvalidInputError(f"{ENV}: {item!r}: @N takes a positive integer")
            at = int(count)
        seconds = 0.0
        if action.startswith("sleep:"):
            try:
                seconds = float(action.removeprefix("sleep:"))
            except ValueError:
                seconds = -1.0
            if not seconds >= 0:
                raise InvalidInputError(f"{ENV}: {item!r}: sleep takes seconds >= 0")
            action = "sleep"
        if action not in ("kill", "raise", "sigint", "sleep"):
            raise InvalidInputError(
                f"{ENV}: {item!r}: the action must be kill, raise, sigint or sleep:SECONDS"
            )
        armed[name] = _Arm(action, seconds, at)
    return armed


def configure(spec: str | None) -> None:
    """Arm the points of ``spec`` (the `ENV` syntax), replacing any armed before; None disarms."""
    armed = _parse(spec) if spec else {}
    with _lock:
        _armed.clear()
        _armed.update(armed)


def hits(name: str) -> int:
    """How often an armed point was reached so far (0 if it is not armed)."""
    arm = _armed.get(name)
    return arm.hits if arm is not None else 0


def failpoint(name: str) -> None:
    """Mark a durable step; fires the action armed for ``name``, if any."""
    if _armed:
        _fire(name)


def _fire(name: str) -> None:
    with _lock:
        arm = _armed.get(name)
        if arm is None:
            return
        arm.hits += 1  # counted past the firing too: the crash matrix probes with sleep:0
        if arm.fired or arm.hits < arm.at:
            return
        arm.fired = True
    if arm.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # the signal is delivered asynchronously; never run past the point
    elif arm.action == "raise":
        raise FailpointError(f"failpoint {name} fired")
    elif arm.action == "sigint":
        # the handler (KeyboardInterrupt) runs in the main thread before its next bytecode
        signal.raise_signal(signal.SIGINT)
    else:
        time.sleep(arm.seconds)


configure(os.environ.get(ENV))
