"""A fork waits for the catalog write transactions of its process (`Catalog.write`).

A child of `os.fork` copies its parent's SQLite library state, and with it the lock a write
transaction in flight on another thread held: SQLite keeps one lock table per file per
process, so every connection the child opens to that catalog then finds the write lock
held, by a connection of its own process that will never release it, and each write of the
child waited the busy timeout and failed with `CatalogLockedError` (30 s; telling it to look
for another process).  A training process forks rollout workers, or DataLoader workers,
while its `save_async` worker commits; a worker that saves then failed so.

So every write transaction passes this gate: it registers before it asks for the lock
(`begin_write`), says when it holds it (`holding`) and leaves when it ends (`end_write`); a
fork (the ``before`` hook of `os.register_at_fork`) holds new transactions back and waits
for those holding the lock to end, up to `FORK_WAIT_S`, and for those still asking for it
only `ASKING_WAIT_S` (they hold nothing a child could inherit; one waiting for another
process's lock made every fork wait the whole bound).  A transaction that gets its lock in
the instant between that wait and the fork itself is the one case left, as before.  A
thread that forks inside its own transaction, or writes from a signal handler that runs
during the fork's wait, is not waited for, and a transaction held back waits no longer
than the fork may.  A Ctrl-C during the wait is raised once the fork returned (CPython
ignores an exception of a fork hook).
"""

from __future__ import annotations

import _thread
import os
import threading
import time

__all__ = ["ASKING_WAIT_S", "FORK_WAIT_S", "begin_write", "end_write", "holding"]

#: The longest a fork waits for the process's write transactions that hold the lock.
FORK_WAIT_S = 10.0
#: ... and for those still asking for it (another process may hold it for long).
ASKING_WAIT_S = 0.2


class _Gate:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.asking = 0  # write transactions waiting for their lock
        self.holding = 0  # ... holding it
        self.forker: int | None = None  # the thread forking, while it waits
        self.interrupted = False
        self.local = threading.local()


_gate = _Gate()


def _mine() -> list[int]:
    """This thread's [asking, holding]."""
    got = getattr(_gate.local, "counts", None)
    if got is None:
        got = _gate.local.counts = [0, 0]
    return got


def begin_write() -> list[int]:
    """Register a write transaction about to ask for its lock (held back while another
    thread forks, at most `FORK_WAIT_S`); the token `holding` and `end_write` take."""
    gate = _gate
    me = threading.get_ident()
    deadline = time.monotonic() + FORK_WAIT_S
    with gate.cond:
        while gate.forker not in (None, me):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            gate.cond.wait(left)
        gate.asking += 1
    _mine()[0] += 1
    return [0]  # its slot: 0 asking, 1 holding


def holding(token: list[int]) -> None:
    """The transaction of ``token`` holds its lock now."""
    gate = _gate
    mine = _mine()
    with gate.cond:
        gate.asking -= 1
        gate.holding += 1
    mine[0] -= 1
    mine[1] += 1
    token[0] = 1


def end_write(token: list[int]) -> None:
    """The transaction of ``token`` ended (committed, rolled back, or never got its lock)."""
    gate = _gate
    slot = token[0]
    _mine()[slot] -= 1
    with gate.cond:
        if slot:
            gate.holding -= 1
        else:
            gate.asking -= 1
        gate.cond.notify_all()


def _before_fork() -> None:
    gate = _gate
    asking, holding_here = _mine()
    start = time.monotonic()
    with gate.cond:
        gate.forker = threading.get_ident()
        while True:
            waited = time.monotonic() - start
            held = gate.holding > holding_here
            asked = gate.asking > asking and waited < ASKING_WAIT_S
            if not (held or asked) or waited >= FORK_WAIT_S:
                break
            limit = FORK_WAIT_S if held else ASKING_WAIT_S
            try:
                gate.cond.wait(min(limit - waited, 0.05))
            except KeyboardInterrupt:
                gate.interrupted = True  # raised after the fork (`_after_in_parent`)


def _after_in_parent() -> None:
    gate = _gate
    with gate.cond:
        gate.forker = None
        interrupted, gate.interrupted = gate.interrupted, False
        gate.cond.notify_all()
    if interrupted:
        # NOTE: from another thread, a moment later: a Ctrl-C raised in this hook would be
        # ignored as the one it stands for was
        threading.Timer(0.01, _thread.interrupt_main).start()


def _after_in_child() -> None:
    # the parent's threads are not here: their transactions are not the child's to wait for
    global _gate
    mine = list(_mine())
    _gate = _Gate()
    _gate.asking, _gate.holding = mine
    _gate.local.counts = mine


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_after_in_child
    )
