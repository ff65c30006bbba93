"""Helper threads that still work while the interpreter exits.

`concurrent.futures` refuses new work once its own exit hook has run (``RuntimeError:
cannot schedule new futures after interpreter shutdown``): in `atexit` functions, and in a
daemon thread as the interpreter ends.  A save, a streamed read or an export made there
(a training script that saves its last rollout on the way out) failed with that raw error
in the middle of its work.  `Helpers` is the `ThreadPoolExecutor` the library uses: from
then on it runs what it is given on the calling thread, which is slower (nothing
overlaps) but does the same work in the same order.
"""

from __future__ import annotations

import concurrent.futures.thread as _futures_thread
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

__all__ = ["Helpers", "interpreter_exiting", "ran_here", "run_into"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def interpreter_exiting() -> bool:
    """Whether `concurrent.futures` has stopped taking work for new threads (its exit hook
    ran: the interpreter joined its threads and is ending)."""
    return bool(getattr(_futures_thread, "_shutdown", False))


class Helpers(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` that runs a call on the caller's thread, returning its future
    done, once the interpreter no longer takes work for threads (`interpreter_exiting`);
    an executor shut down by its owner still refuses (that is a bug of the caller's)."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError:
            if not interpreter_exiting():
                raise
        return ran_here(fn, *args, **kwargs)


def ran_here(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> Future[_T]:
    """The future of ``fn(*args, **kwargs)`` run now, on this thread."""
    return run_into(Future(), fn, *args, **kwargs)


_F = TypeVar("_F", bound=Future[Any])


def run_into(future: _F, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _F:
    """``future``, a new one, done with what ``fn(*args, **kwargs)`` run now on this thread
    returned or raised (an interrupt, such as Ctrl-C, is raised, as from the call itself)."""
    future.set_running_or_notify_cancel()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        future.set_exception(exc)
    else:
        future.set_result(result)
    return future
