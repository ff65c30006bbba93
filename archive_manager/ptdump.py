"""slime's ``torch.save`` debug dumps (``{"rollout_id": ..., "samples": [dict]}``): reading
them safely for `ArchiveManager.import_pt`."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._torch import torch_module
from .errors import InvalidInputError, UnsupportedFormatError
from .samples import Sample

__all__ = ["read_pt_dump"]

# How torch's weights_only loader words a refusal of a class or function (a global), as
# opposed to bytes it cannot parse (see torch.serialization.load's message rewriting).
_NEEDS_PICKLE = re.compile(
    r"GLOBAL (\S+) was not an allowed global|(\S+) whose module \S+ is blocked"
    r"|(\S+) must be \S+ to load"
)


def _reason(exc: BaseException) -> str:
    """The last line of torch's message that says what went wrong (not its advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith("Check the documentation")]
    return reasons[-1] if reasons else type(exc).__name__


def _what(exc: BaseException) -> str:
    """``Type: reason`` of an error from torch's legacy reader (its messages are terse)."""
    return f"{type(exc).__name__}: {_reason(exc)}" if str(exc).strip() else type(exc).__name__


def read_pt_dump(
    path: str | os.PathLike[str], *, trust_pickle: bool = False
) -> tuple[Any, list[Sample]]:
    """Load a dump and return ``(rollout_id, samples as Sample objects)``.

    The file is loaded with ``weights_only=True`` (tensors, lists, dicts, numbers, strings:
    no code can run).  A dump holding other objects needs full unpickling, which can run
    arbitrary code; that happens only when the caller passes ``trust_pickle=True``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        UnsupportedFormatError: the file is not such a dump (not a torch.save file, or it
            holds no ``samples`` list), or needs pickle and ``trust_pickle`` is False.
    """
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"no such file: {source}")
    if not source.is_file():
        raise InvalidInputError(f"{source} is not a file")
    torch = torch_module()  # a dump is a torch file: reading one is decoding tensors
    try:
        data = torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        # NOTE: torch reports *every* failure of a weights_only load as UnpicklingError,
        # random bytes included; only a refused global means "needs full unpickling".
        if not trust_pickle:
            refused = _NEEDS_PICKLE.search(str(exc))
            if refused is None:
                raise UnsupportedFormatError(
                    f"{source} is not a readable torch.save file: {_reason(exc)}"
                ) from exc
            what = next(g for g in refused.groups() if g)
            raise UnsupportedFormatError(
                f"{source} holds Python objects ({what}) that only full unpickling can "
                "rebuild, and unpickling a file can run arbitrary code; refusing. If you "
                "trust where it came from, import it with trust_pickle=True (CLI: "
                "--trust-pickle)"
            ) from exc
        # NOTE: opt-in only (trust_pickle=True): the caller vouched for this file.
        try:
            data = torch.load(source, weights_only=False, map_location="cpu")
        except Exception as full_exc:  # a broken or foreign pickle fails in many ways
            raise UnsupportedFormatError(
                f"{source} could not be unpickled: {_what(full_exc)}"
            ) from full_exc
    except Exception as exc:  # torch's legacy reader fails with KeyError, EOFError, ...
        raise UnsupportedFormatError(
            f"{source} is not a readable torch.save file: {_what(exc)}"
        ) from exc
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
