"""Whole-archive round trips through an export format: the formats and the comparison.

`FORMATS` names each export format with its export and its import; `assert_same_archive`
compares two archives whole: facts (name, rollout id, evaluation, attrs), keys (sample and
task key of every sample, in order), the catalog's per-sample metadata and the samples
themselves, exactly (`conftest.assert_same`).  A new format plugs in by adding an
`ArchiveFormat` to `FORMATS`; every test parametrized over it then covers the format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import assert_same_samples

from archive_manager import Archive, ArchiveManager


@dataclass(frozen=True)
class ArchiveFormat:
    """One export format: how to write an archive to a file and read one back.

    ``import_`` takes the keyword overrides every import has (``name``, ``rollout_id``,
    ``evaluation``, ``task_key_field``), each left out when not given.
    """

    name: str
    suffix: str
    export: Callable[[Archive, Path], Path]
    import_: Callable[..., Archive]


def _export_pt(arc: Archive, path: Path) -> Path:
    return arc.export_pt(path)


def _import_pt(pool: ArchiveManager, path: Path, **overrides: Any) -> Archive:
    return pool.import_pt(path, **overrides)


FORMATS: dict[str, ArchiveFormat] = {
    "pt": ArchiveFormat("pt", ".pt", _export_pt, _import_pt),
}


def archive_facts(arc: Archive) -> dict[str, Any]:
    """What an archive is, beyond its samples, for comparison (no digests, no times)."""
    return {
        "name": arc.name,
        "rollout_id": arc.rollout_id,
        "evaluation": arc.evaluation,
        "attrs": arc.attrs,
        "samples": len(arc),
        "state": arc.state,
    }


def assert_same_archive(actual: Archive, expected: Archive, **changed: Any) -> None:
    """``actual`` is ``expected`` whole: facts, keys, sample metadata and samples.

    ``changed`` names facts the import was told to override (``name="copy"``, or ``keys``,
    the list of ``(sample_key, task_key)`` expected): those are compared with the given
    value instead.
    """
    keys = changed.pop("keys", None)
    want = {**archive_facts(expected), **changed}
    assert archive_facts(actual) == want
    assert actual.keys() == (expected.keys() if keys is None else keys)
    assert actual.sample_metadata() == expected.sample_metadata()
    assert_same_samples(actual.load_samples(), expected.load_samples())
