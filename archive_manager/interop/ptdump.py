"""slime's ``torch.save`` debug dumps (``{"rollout_id": ..., "samples": [dict]}``): reading
them safely for `ArchiveManager.import_pt`, and the archive's facts an export adds to them.

An export by `Archive.export_pt` carries one more top-level key, ``"archive_manager"``
(`FACTS_KEY`): the archive's name, evaluation flag and attrs, and per sample its sample key,
task key and stored class, so an import gives the archive back whole
(docs/architecture/getting-data-out.md, "Exports and imports").  slime reads only ``rollout_id`` and
``samples`` and ignores it.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util.lazy_torch import torch_module
from ..errors import InvalidInputError, UnsupportedFormatError
from ..pool.facts import FACTS_FORMAT, FACTS_KEY, FACTS_VERSION
from ..samples import Sample, check_task_key, fields_to_sample, sample_key

__all__ = [
    "PtDump",
    "PtFacts",
    "read_pt_dump",
    "read_pt_file",
    "task_keys_from_field",
]

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


@dataclass(frozen=True)
class PtFacts:
    """What an export knows beyond slime's dump: the archive's facts and each sample's keys
    and stored class (the registry name, None for a dict, with the fields stored converted)."""

    name: str
    evaluation: bool
    attrs: dict[str, Any] | None
    sample_keys: list[str]
    task_keys: list[str | None]
    classes: list[str | None]
    converted: list[list[str] | None]


@dataclass(frozen=True)
class PtDump:
    """A dump read by `read_pt_file`: its rollout id, samples, and facts (None when the file
    is a plain slime dump)."""

    rollout_id: Any
    samples: list[Any]
    facts: PtFacts | None


def read_pt_dump(
    path: str | os.PathLike[str], *, trust_pickle: bool = False
) -> tuple[Any, list[Sample]]:
    """``(rollout_id, samples)`` of a dump: `read_pt_file` without the facts."""
    dump = read_pt_file(path, trust_pickle=trust_pickle)
    return dump.rollout_id, dump.samples


def read_pt_file(path: str | os.PathLike[str], *, trust_pickle: bool = False) -> PtDump:
    """Load a dump: its rollout id, its samples and, for an export, the archive's facts.

    Samples of a plain slime dump become `Sample` objects (slime's ``from_dict``); those of
    an export come back as the class they were stored as (a dict stays a dict, an
    unregistered class name gives a dict: a name never causes an import).

    The file is loaded with ``weights_only=True`` (tensors, lists, dicts, numbers, strings:
    no code can run).  A dump holding other objects needs full unpickling, which can run
    arbitrary code; that happens only when the caller passes ``trust_pickle=True``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        UnsupportedFormatError: the file is not such a dump (not a torch.save file, or it
            holds no ``samples`` list), needs pickle and ``trust_pickle`` is False, or its
            ``"archive_manager"`` block is malformed or disagrees with its samples.
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
    items = data["samples"]
    facts = _parse_facts(data.get(FACTS_KEY), len(items), source)
    if facts is None:
        samples = [_as_sample(item, i, source) for i, item in enumerate(items)]
    else:
        samples = [_as_stored(item, i, source, facts) for i, item in enumerate(items)]
        for i, sample in enumerate(samples):
            if sample_key(sample, i) != facts.sample_keys[i]:
                raise UnsupportedFormatError(
                    f"{source}: sample {i} has sample key {sample_key(sample, i)!r}, but the "
                    f"file records {facts.sample_keys[i]!r}: the samples were changed after "
                    "the export"
                )
    return PtDump(data.get("rollout_id"), samples, facts)


def _malformed(source: Path, what: str) -> UnsupportedFormatError:
    return UnsupportedFormatError(f"{source}: the {FACTS_KEY!r} block is malformed: {what}")


def _str_list(block: Mapping[str, Any], key: str, n: int, source: Path, *, none: bool) -> list[Any]:
    values = block.get(key)
    if not isinstance(values, list) or len(values) != n:
        raise _malformed(source, f"{key!r} must be a list of {n} items, one per sample")
    for i, v in enumerate(values):
        if not (isinstance(v, str) or (none and v is None)):
            raise _malformed(source, f"{key!r}[{i}] is a {type(v).__name__}")
    return values


def _parse_facts(block: Any, n: int, source: Path) -> PtFacts | None:
    """The facts of an export, checked (the file is untrusted input); None if absent."""
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise _malformed(source, f"a {type(block).__name__}, not a dict")
    if block.get("format") != FACTS_FORMAT or block.get("version") != FACTS_VERSION:
        raise UnsupportedFormatError(
            f"{source}: the {FACTS_KEY!r} block is format {block.get('format')!r} version "
            f"{block.get('version')!r}; this library reads {FACTS_FORMAT!r} version "
            f"{FACTS_VERSION}"
        )
    name, evaluation, attrs = block.get("name"), block.get("evaluation"), block.get("attrs")
    if not isinstance(name, str):
        raise _malformed(source, "'name' must be a str")
    if type(evaluation) is not bool:
        raise _malformed(source, "'evaluation' must be True or False")
    if attrs is not None and not isinstance(attrs, dict):
        raise _malformed(source, "'attrs' must be a dict or None")
    converted = block.get("converted")
    if not isinstance(converted, list) or len(converted) != n:
        raise _malformed(source, f"'converted' must be a list of {n} items, one per sample")
    for i, c in enumerate(converted):
        if c is not None and not (isinstance(c, list) and all(isinstance(f, str) for f in c)):
            raise _malformed(source, f"'converted'[{i}] must be None or a list of str")
    return PtFacts(
        name=name,
        evaluation=evaluation,
        attrs=attrs,
        sample_keys=_str_list(block, "sample_keys", n, source, none=False),
        task_keys=_str_list(block, "task_keys", n, source, none=True),
        classes=_str_list(block, "classes", n, source, none=True),
        converted=converted,
    )


def _as_stored(item: Any, position: int, source: Path, facts: PtFacts) -> Any:
    """An exported sample rebuilt as the class it was stored as (`fields_to_sample`)."""
    if not isinstance(item, Mapping):
        # a trusted pickle holding objects: they are what they are
        return _as_sample(item, position, source)
    try:
        return fields_to_sample(facts.classes[position], dict(item), facts.converted[position])
    except UnsupportedFormatError as exc:
        raise UnsupportedFormatError(f"{source}: sample {position}: {exc}") from exc


def task_keys_from_field(samples: Sequence[Any], field: object) -> list[str | None]:
    """Each sample's task key taken from ``field``: a field name (``index``,
    ``group_index``), or a dotted path into dicts below one (``metadata.prompt_id``).

    None stays None; ints become their decimal string (as task keys always do).

    Raises:
        InvalidInputError: ``field`` is empty, or a sample lacks it or holds what cannot be
            a task key there (naming the sample).
    """
    if not isinstance(field, str) or not field or "" in field.split("."):
        raise InvalidInputError(f"task key field {field!r} is not a field name or dotted path")
    path = field.split(".")
    keys: list[Any] = []
    for position, sample in enumerate(samples):
        value: Any = sample
        for depth, step in enumerate(path):
            if isinstance(value, Mapping):
                found = step in value
                value = value.get(step)
            elif depth == 0:
                found = hasattr(value, step)
                value = getattr(value, step, None)
            else:
                found = False
            if not found:
                raise InvalidInputError(
                    f"sample {position} has no field {'.'.join(path[: depth + 1])!r} "
                    f"(task key field {field!r})"
                )
        try:
            keys.append(check_task_key(value))
        except InvalidInputError as exc:
            raise InvalidInputError(f"sample {position}, task key field {field!r}: {exc}") from None
    return keys


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
