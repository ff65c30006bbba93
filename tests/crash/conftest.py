"""Fixtures of the crash tests: no failpoint left armed in this process before or after a test.

The crash tests arm failpoints in child processes through the environment; a test that arms
one in-process (to raise rather than kill) must not leak it into the next test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from archive_manager._util import failpoints as _failpoints


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    _failpoints.configure(None)
    yield
    _failpoints.configure(None)
