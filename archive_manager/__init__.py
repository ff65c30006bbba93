"""archive_manager: immutable, indexed, content-addressed archives of RL rollout data."""

from __future__ import annotations

__version__ = "0.1.0"
