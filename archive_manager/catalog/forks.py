"""A fork waits for the catalog write transactions of its process (`Catalog.write`).

A child of `os.fork` copies its parent's SQLite library state, and with it the lock a write
transaction in flight on another thread held: SQLite keeps one lock table per file per
process, so every connection the child opens to that catalog then finds the write lock
held, by a connection of its own process that will never release it, and each write of the
child waited the busy timeout and failed with `CatalogLockedError` (30 s; telling it to look
for another process).  A training process forks rollout workers, or DataLoader workers,
while its `save_async` worker commits; a worker that saves then failed so.

So every write transaction holds this gate from before it takes the lock until it ends, and
a fork (the ``before`` hook of `os.register_at_fork`) first waits for the transactions of
its process to end, new ones waiting meanwhile (a transaction is milliseconds; the wait is
bounded by `FORK_WAIT_S`, past which the fork goes on as it did before).  A thread that
forks inside its own write transaction waits for the others only.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["FORK_WAIT_S", "begin_write", "end_write"]

#: The longest a fork waits for the process's write transactions.
FORK_WAIT_S = 10.0


class _Gate:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.writes = 0  # write transactions in flight (or waiting for their lock)
        self.forking = False
        self.local = threading.local()


_gate = _Gate()


def _mine() -> int:
    return int(getattr(_gate.local, "writes", 0))


def begin_write() -> None:
    """Enter the gate before a write transaction takes its lock (waiting for a fork in
    progress on another thread)."""
    gate = _gate
    with gate.cond:
        while gate.forking:
            gate.cond.wait()
        gate.writes += 1
    gate.local.writes = _mine() + 1


def end_write() -> None:
    """Leave the gate once the transaction committed or rolled back."""
    gate = _gate
    gate.local.writes = _mine() - 1
    with gate.cond:
        gate.writes -= 1
        gate.cond.notify_all()


def _before_fork() -> None:
    gate = _gate
    own = _mine()
    deadline = time.monotonic() + FORK_WAIT_S
    with gate.cond:
        gate.forking = True
        while gate.writes > own:
            left = deadline - time.monotonic()
            if left <= 0:
                break  # a transaction stuck (its lock held elsewhere): fork as before
            gate.cond.wait(left)


def _after_in_parent() -> None:
    gate = _gate
    with gate.cond:
        gate.forking = False
        gate.cond.notify_all()


def _after_in_child() -> None:
    # the parent's threads are not here: their transactions are not the child's to wait for
    global _gate
    own = _mine()
    _gate = _Gate()
    _gate.writes = own
    _gate.local.writes = own


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_after_in_child
    )
