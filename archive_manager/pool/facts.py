"""The facts block an archive's ``.pt`` export carries beside slime's ``rollout_id`` and
``samples``: the archive's name, evaluation flag and attrs, and per sample its keys and stored
class, so that an import gives the archive back whole (docs/architecture/getting-data-out.md,
"Exports and imports").  `Archive.export_pt` writes it; `interop.ptdump` reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["FACTS_FORMAT", "FACTS_KEY", "FACTS_VERSION", "facts_block"]

#: The top-level key of an export that holds the archive's facts.
FACTS_KEY = "archive_manager"
#: The ``format`` of that block, and the one version this library writes and reads.
FACTS_FORMAT = "archive_manager.pt-facts"
FACTS_VERSION = 1


def facts_block(
    *,
    name: str,
    evaluation: bool,
    attrs: dict[str, Any] | None,
    keys: Sequence[tuple[str, str | None]],
    classes: Sequence[str | None],
    converted: Sequence[list[str] | None],
) -> dict[str, Any]:
    """The ``"archive_manager"`` block of an export: plain lists, strings, bools and None,
    which ``torch.load(weights_only=True)`` reads."""
    return {
        "format": FACTS_FORMAT,
        "version": FACTS_VERSION,
        "name": name,
        "evaluation": evaluation,
        "attrs": attrs,
        "sample_keys": [k for k, _ in keys],
        "task_keys": [t for _, t in keys],
        "classes": list(classes),
        "converted": [None if c is None else list(c) for c in converted],
    }
