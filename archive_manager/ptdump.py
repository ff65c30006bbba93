"""slime's ``torch.save`` debug dumps (``{"rollout_id": ..., "samples": [dict]}``): reading
them safely for `ArchiveManager.import_pt`."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .errors import InvalidInputError, UnsupportedFormatError
from .samples import Sample

__all__ = ["read_pt_dump"]


def read_pt_dump(
    path: str | os.PathLike[str], *, trust_pickle: bool = False
) -> tuple[Any, list[Sample]]:
    """Load a dump and return ``(rollout_id, samples as Sample objects)``.

    The file is loaded with ``weights_only=True`` (tensors, lists, dicts, numbers, strings:
    no code can run).  A dump holding other objects needs full unpickling, which can run
    arbitrary code; that happens only when the caller passes ``trust_pickle=True``.

    Raises:
        UnsupportedFormatError: the file is not such a dump, or needs pickle and
            ``trust_pickle`` is False.
    """
    source = Path(path)
    if not source.is_file():
        raise InvalidInputError(f"{source} is not a file")
    try:
        data = torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            raise UnsupportedFormatError(
                f"{source} holds Python objects that only full unpickling can rebuild, and "
                "unpickling a file can run arbitrary code; refusing. If you trust where it "
                "came from, import it with trust_pickle=True (CLI: --trust-pickle)"
            ) from exc
        # NOTE: opt-in only (trust_pickle=True): the caller vouched for this file.
        data = torch.load(source, weights_only=False, map_location="cpu")
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise UnsupportedFormatError(f"{source} is not a readable torch.save file: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("samples"), (list, tuple)):
        raise UnsupportedFormatError(
            f"{source} is not a rollout dump: expected a dict with a 'samples' list "
            "(slime's {'rollout_id': ..., 'samples': [...]})"
        )
    samples = [_as_sample(item, i, source) for i, item in enumerate(data["samples"])]
    return data.get("rollout_id"), samples


def _as_sample(item: Any, position: int, source: Path) -> Sample:
    if isinstance(item, Sample):
        return item
    if isinstance(item, Mapping):
        fields = dict(item)
    elif callable(getattr(item, "to_dict", None)):
        fields = dict(item.to_dict())
    elif hasattr(item, "__dict__"):
        fields = dict(vars(item))
    else:
        raise UnsupportedFormatError(
            f"{source}: sample {position} is a {type(item).__name__}, not a dict or sample"
        )
    status = fields.get("status")
    if status is not None and not isinstance(status, str):
        fields["status"] = getattr(status, "value", status)
    try:
        return Sample.from_dict(fields)
    except (TypeError, ValueError) as exc:
        raise UnsupportedFormatError(
            f"{source}: sample {position} does not fit Sample: {exc}"
        ) from exc
