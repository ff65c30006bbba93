"""The frameworks tests/integrations runs against: skipped where they are not installed (the main
environment never installs them), failed instead where ``$ARCHIVE_MANAGER_REQUIRE_INTEGRATIONS``
is set (.ci/integrations sets it in the environment it installs them into)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "ARCHIVE_MANAGER_REQUIRE_INTEGRATIONS"


def require(module: str) -> ModuleType:
    """Import ``module`` for a test module as ``pytest.importorskip`` does, except that where
    `REQUIRE_ENV` is set a missing package fails the run instead of skipping it."""
    if os.environ.get(REQUIRE_ENV):
        return importlib.import_module(module)  # an ImportError here fails the module
    return pytest.importorskip(module)
