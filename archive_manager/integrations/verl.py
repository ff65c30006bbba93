"""verl: a `DataProto` batch as samples and back, a one-call save of a step's batch, and a
`RayPPOTrainer` mixin that saves every training step's batch (docs/integrations.md).

Supports verl 0.9 (0.9.1 and later 0.9 releases; tested against 0.9.1).  verl, tensordict and
torch are imported only by the calls that need them: `to_samples` and `save_batch` by none
(their batch was built by an imported verl), `from_samples` and `load_batch` by verl's
`DataProto` and tensordict's `TensorDict`.

One sample per row of the batch, a dict of three fields:

* ``batch``: the row of every tensor column, in its dtype.  A ``(B, L)`` column aligned with
  ``attention_mask`` (its full width, the prompt part for ``prompts``, the response part for
  the columns as wide as ``responses``) is stored *unpadded*, only the positions the row's
  mask keeps, when every position it drops holds one and the same value (bit for bit): that
  value goes into ``padding`` and the row is rebuilt exactly.  Otherwise (``old_log_probs``
  and ``position_ids`` hold varying values past the mask) the row is stored whole.
* ``padding``: ``{column: {"region": "full"|"prompt"|"response", "fill": 0-d tensor}}`` for
  the columns stored unpadded in this row.
* ``non_tensor_batch``: the row of every numpy column (``uid``, ``data_source``,
  ``reward_model``, ``raw_prompt``, reward infos, ...): an object column's item as it is,
  another dtype's numpy scalar (``numpy.str_`` for ``<U``), a row of a 2-d column as an array.

The task key is the row's ``uid`` (verl's prompt group); the catalog's reward is the row's
``token_level_scores`` sum (the score verl's own dump records) and its response length the
response part of ``attention_mask`` (verl's ``response_length`` metric); verl has no status,
so none is recorded.  The archive's ``attrs["verl"]`` records the batch size, every column's
dtype and shape in order, and the ``meta_info`` entries that are JSON values (str, int,
finite float, bool, None, lists and str-keyed dicts of them) exactly; other entries (a
tensor, a tuple, a numpy value) are dropped, named in ``meta_info_dropped`` and warned about.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    ArchiveRetainedError,
    InvalidInputError,
    MissingDependencyError,
    UnsupportedFormatError,
    UnsupportedVersionError,
)

if TYPE_CHECKING:
    from ..manager import ArchiveManager
    from ..pool.archive import Archive

__all__ = [
    "LAYOUT_FORMAT",
    "SUPPORTED_VERL",
    "ArchiveRolloutMixin",
    "VerlSamples",
    "from_samples",
    "load_batch",
    "save_batch",
    "to_samples",
]

#: The verl releases this module supports: 0.9.1 and later 0.9 releases.
SUPPORTED_VERL = ((0, 9, 1), (0, 10, 0))
#: ``attrs["verl"]["format"]`` of an archive `save_batch` wrote, and its one version.
LAYOUT_FORMAT = "archive_manager.verl-batch"
LAYOUT_VERSION = 1
ATTRS_KEY = "verl"

# numpy dtype kinds a non-tensor column may have: bool, ints, floats, complex, text, bytes and
# objects.  Record, void and datetime columns are refused (a stored dtype spelling is read
# back with np.dtype, so it must never name a record layout).
_NUMPY_KINDS = frozenset("biufcUSO")


@dataclass(frozen=True)
class VerlSamples:
    """A batch as `to_samples` gives it: one sample per row, each row's task key (its
    ``uid``) and catalog facts, and the layout `from_samples` rebuilds the batch from (what
    `save_batch` stores as ``attrs["verl"]``)."""

    samples: list[dict[str, Any]]
    task_keys: list[str | None]
    facts: list[dict[str, Any]]
    layout: dict[str, Any]


# --------------------------------------------------------------------------- versions


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_verl_version(version: str) -> str:
    """Return ``version`` if this module supports it.

    Raises:
        UnsupportedVersionError: another verl release is installed.
    """
    low, high = SUPPORTED_VERL
    if not low <= _version_tuple(version) < high:
        raise UnsupportedVersionError(
            f"archive_manager.integrations.verl supports verl 0.9 (0.9.1 or a later 0.9 "
            f"release); verl {version} is installed"
        )
    return version


def _import_verl() -> Any:
    try:
        verl = importlib.import_module("verl")
    except ImportError as exc:
        raise MissingDependencyError(
            f"archive_manager.integrations.verl needs verl 0.9 (pip install verl==0.9.1): {exc}"
        ) from exc
    check_verl_version(str(getattr(verl, "__version__", "unknown")))
    return verl


def _data_proto_class() -> Any:
    """verl's DataProto if verl is imported (a batch cannot exist before), else None."""
    protocol = sys.modules.get("verl.protocol")
    return None if protocol is None else getattr(protocol, "DataProto", None)


# --------------------------------------------------------------------------- to samples


def to_samples(batch: Any, *, task_key_column: str | None = "uid") -> VerlSamples:
    """One sample per row of ``batch`` (a verl `DataProto`), with its task key (the row's
    ``task_key_column`` value, as text; None without that column), catalog facts and the
    layout that `from_samples` rebuilds the batch from exactly.

    Raises:
        InvalidInputError: ``batch`` is no `DataProto`, is empty, or holds a column that
            cannot be stored (a nested TensorDict, a record, void or datetime numpy column, a
            column whose length is not the batch size).
        MissingDependencyError: an unsupported verl release is installed.
    """
    cls = _data_proto_class()
    if cls is None or not isinstance(batch, cls):
        raise InvalidInputError(
            f"expected a verl DataProto, got {type(batch).__module__}.{type(batch).__qualname__}"
        )
    verl = sys.modules["verl"]
    version = check_verl_version(str(getattr(verl, "__version__", "unknown")))
    import numpy as np
    import torch

    tensors = _tensor_columns(batch, torch)
    arrays = _array_columns(batch, np)
    size = len(batch)
    if size == 0:
        raise InvalidInputError("the DataProto is empty: a batch of 0 rows saves nothing")
    for name, value in list(tensors.items()) + list(arrays.items()):
        if value.ndim == 0 or value.shape[0] != size:
            raise InvalidInputError(
                f"column {name!r} has shape {tuple(value.shape)}, not {size} rows"
            )
    meta, dropped = _json_meta_info(batch.meta_info)
    if dropped:
        warnings.warn(
            f"verl meta_info entries {', '.join(map(repr, dropped))} are no JSON values "
            "(a tensor, a tuple, a numpy value): not stored",
            UserWarning,
            stacklevel=2,
        )
    if task_key_column is not None and task_key_column not in arrays:
        task_key_column = None  # no uid column (a batch before the rollout): no task keys
    samples: list[dict[str, Any]] = [
        {"batch": {}, "padding": {}, "non_tensor_batch": {}} for _ in range(size)
    ]
    mask = tensors.get("attention_mask")
    response_width = _width(tensors.get("responses"))
    for name, column in tensors.items():
        region = _region(name, column, mask, response_width)
        if region is None:
            for i in range(size):
                samples[i]["batch"][name] = column[i]
            continue
        _unpad(name, column, _region_mask(mask, region, column.shape[1]), region, samples, torch)
    for name, array in arrays.items():
        for i in range(size):
            samples[i]["non_tensor_batch"][name] = array[i]
    task_keys: list[str | None] = [None] * size
    if task_key_column is not None:
        task_keys = [_task_key(v) for v in arrays[task_key_column]]
    facts = _facts(tensors, mask, response_width, size)
    layout = {
        "format": LAYOUT_FORMAT,
        "version": LAYOUT_VERSION,
        "verl_version": version,
        "batch_size": size,
        "batch": None
        if batch.batch is None
        else [
            {"name": n, "dtype": _torch_dtype_name(t.dtype), "shape": list(t.shape[1:])}
            for n, t in tensors.items()
        ],
        "non_tensor_batch": [
            {"name": n, "dtype": a.dtype.str, "shape": list(a.shape[1:])} for n, a in arrays.items()
        ],
        "meta_info": meta,
        "meta_info_dropped": dropped,
    }
    return VerlSamples(samples, task_keys, facts, layout)


def _tensor_columns(batch: Any, torch: Any) -> dict[str, Any]:
    if batch.batch is None:
        return {}
    out: dict[str, Any] = {}
    for name in batch.batch.keys():
        value = batch.batch[name]
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise InvalidInputError(
                f"batch column {name!r} holds a {type(value).__qualname__}, not a tensor "
                "(nested TensorDicts and non-tensor data are not supported)"
            )
        out[name] = value.detach().cpu()
    return out


def _array_columns(batch: Any, np: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in (batch.non_tensor_batch or {}).items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise InvalidInputError(
                f"non_tensor_batch column {name!r} holds a {type(value).__qualname__}, "
                "not a numpy array"
            )
        if value.dtype.kind not in _NUMPY_KINDS or value.dtype.fields is not None:
            raise InvalidInputError(
                f"non_tensor_batch column {name!r} has dtype {value.dtype}: only bool, "
                "numeric, text, bytes and object columns can be stored"
            )
        out[name] = value
    return out


def _json_meta_info(meta: Any) -> tuple[dict[str, Any], list[str]]:
    if meta is None:
        return {}, []
    if not isinstance(meta, dict):
        raise InvalidInputError(f"meta_info is a {type(meta).__qualname__}, not a dict")
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in meta.items():
        if isinstance(key, str) and _is_json_value(value):
            kept[key] = value
        else:
            dropped.append(str(key))
    return kept, dropped


def _is_json_value(value: Any, depth: int = 0) -> bool:
    """True when JSON gives ``value`` back equal and of the same types (exact types: a
    tuple, a numpy scalar or a str subclass would come back as something else)."""
    if depth > 64:
        return False
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(_is_json_value(v, depth + 1) for v in value)
    if kind is dict:
        return all(type(k) is str and _is_json_value(v, depth + 1) for k, v in value.items())
    return False


def _width(tensor: Any) -> int | None:
    return int(tensor.shape[1]) if tensor is not None and tensor.ndim == 2 else None


def _region(name: str, column: Any, mask: Any, response_width: int | None) -> str | None:
    """Which part of ``attention_mask`` a ``(B, L)`` column is aligned with, or None (the
    column is stored whole).  Exactness does not depend on the choice being verl's meaning:
    the loader applies the same rule to the same stored mask."""
    if mask is None or mask.ndim != 2 or column.ndim != 2 or name == "attention_mask":
        return None
    width, full = int(column.shape[1]), int(mask.shape[1])
    if width == full:
        return "full"
    if response_width is None or response_width >= full:
        return None
    if name == "prompts" and width == full - response_width:
        return "prompt"
    if width == response_width:
        return "response"
    return None


def _region_mask(mask: Any, region: str, width: int) -> Any:
    """The part of ``mask`` (rows, or one row) that the region names, as bools."""
    if region == "full":
        part = mask
    elif region == "prompt":
        part = mask[..., :width]
    else:
        part = mask[..., mask.shape[-1] - width :]
    return part.bool()


def _unpad(
    name: str,
    column: Any,
    keep: Any,
    region: str,
    samples: list[dict[str, Any]],
    torch: Any,
) -> None:
    """Store each row of ``column`` unpadded where the positions ``keep`` drops hold one value
    (compared bit for bit: NaNs and -0.0 included), else whole."""
    rows, width = column.shape
    column = column.contiguous()
    raw = column.view(torch.uint8).reshape(rows, width, -1)
    dropped = ~keep
    has_pad = dropped.any(dim=1)
    first = dropped.to(torch.int8).argmax(dim=1)
    reference = raw[torch.arange(rows), first]
    same = (raw == reference[:, None, :]).all(dim=-1)
    packable = ((same | keep).all(dim=1) & has_pad).tolist()
    first_list = first.tolist()
    for i in range(rows):
        row = column[i]
        if packable[i]:
            samples[i]["batch"][name] = row[keep[i]]
            samples[i]["padding"][name] = {"region": region, "fill": row[first_list[i]]}
        else:
            samples[i]["batch"][name] = row


def _task_key(value: Any) -> str | None:
    if value is None:
        return None
    return str.__str__(value) if isinstance(value, str) else str(value)


def _facts(
    tensors: dict[str, Any], mask: Any, response_width: int | None, size: int
) -> list[dict[str, Any]]:
    facts: list[dict[str, Any]] = [{} for _ in range(size)]
    scores = tensors.get("token_level_scores")
    if scores is not None and scores.ndim == 2 and scores.dtype.is_floating_point:
        for i, score in enumerate(scores.sum(dim=-1).tolist()):
            if math.isfinite(score):
                facts[i]["reward"] = score
    if mask is not None and mask.ndim == 2 and response_width is not None:
        lengths = mask[:, mask.shape[1] - response_width :].bool().sum(dim=-1).tolist()
        for i, length in enumerate(lengths):
            facts[i]["response_length"] = int(length)
    return facts


def _torch_dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- back


def from_samples(samples: list[Any], layout: dict[str, Any]) -> Any:
    """The `DataProto` ``samples`` (rows `to_samples` made, in order, all or some) and the
    batch's ``layout`` rebuild: tensors equal in dtype and values (on the CPU), numpy columns
    equal in dtype, ``meta_info`` the entries the layout kept.

    Raises:
        UnsupportedFormatError: ``layout`` is no verl batch layout this version reads, or a
            sample does not match it.
        MissingDependencyError: verl is not installed, or is an unsupported release.
    """
    import numpy as np
    import torch

    _check_layout(layout)
    _import_verl()
    # importlib: neither ships type hints, and neither is installed where mypy runs
    TensorDict = importlib.import_module("tensordict").TensorDict
    DataProto = importlib.import_module("verl.protocol").DataProto

    rows = len(samples)
    for sample in samples:
        if not isinstance(sample, dict) or not {"batch", "padding", "non_tensor_batch"} <= set(
            sample
        ):
            raise UnsupportedFormatError("a sample is not a row of a verl batch")
    tensors: dict[str, Any] = {}
    spec_batch = layout["batch"]
    if spec_batch is not None:
        masks = [s["batch"].get("attention_mask") for s in samples]
        for spec in spec_batch:
            name = spec["name"]
            dtype = _torch_dtype(spec["dtype"], torch)
            shape = [int(n) for n in spec["shape"]]
            built = [
                _rebuild_row(name, s, masks[i], shape, dtype, torch) for i, s in enumerate(samples)
            ]
            tensors[name] = torch.stack(built) if built else torch.empty([0, *shape], dtype=dtype)
    arrays: dict[str, Any] = {}
    for spec in layout["non_tensor_batch"]:
        name = spec["name"]
        dtype = _numpy_dtype(spec["dtype"], np)
        array = np.empty([rows, *(int(n) for n in spec["shape"])], dtype=dtype)
        for i, sample in enumerate(samples):
            try:
                array[i] = sample["non_tensor_batch"][name]
            except KeyError:
                raise UnsupportedFormatError(
                    f"a row lacks non_tensor_batch column {name!r}"
                ) from None
        arrays[name] = array
    batch = TensorDict(source=tensors, batch_size=[rows]) if spec_batch is not None else None
    meta = dict(layout.get("meta_info") or {})
    return DataProto(batch=batch, non_tensor_batch=arrays, meta_info=meta)


def _rebuild_row(
    name: str, sample: dict[str, Any], mask: Any, shape: list[int], dtype: Any, torch: Any
) -> Any:
    try:
        value = sample["batch"][name]
    except KeyError:
        raise UnsupportedFormatError(f"a row lacks batch column {name!r}") from None
    if not isinstance(value, torch.Tensor) or value.dtype != dtype:
        raise UnsupportedFormatError(f"batch column {name!r} of a row is not a {dtype} tensor")
    pad = sample["padding"].get(name)
    if pad is None:
        if list(value.shape) != shape:
            raise UnsupportedFormatError(f"batch column {name!r} of a row has the wrong shape")
        return value
    if mask is None or len(shape) != 1 or pad.get("region") not in ("full", "prompt", "response"):
        raise UnsupportedFormatError(f"batch column {name!r} of a row cannot be unpadded")
    keep = _region_mask(mask, pad["region"], shape[0])
    if int(keep.sum()) != value.numel() or keep.numel() != shape[0]:
        raise UnsupportedFormatError(f"batch column {name!r} of a row does not fit its mask")
    row = pad["fill"].to(dtype).expand(shape[0]).clone()
    row[keep] = value
    return row


def _check_layout(layout: Any) -> None:
    if (
        not isinstance(layout, dict)
        or layout.get("format") != LAYOUT_FORMAT
        or layout.get("version") != LAYOUT_VERSION
    ):
        raise UnsupportedFormatError(
            "not the layout of a verl batch this version reads (attrs['verl'] of an archive "
            f"save_batch wrote: format {LAYOUT_FORMAT!r}, version {LAYOUT_VERSION})"
        )


def _torch_dtype(name: Any, torch: Any) -> Any:
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedFormatError(f"the layout names no torch dtype: {name!r}")
    return dtype


def _numpy_dtype(spec: Any, np: Any) -> Any:
    # Only the spellings dtype.str gives for the kinds a column may have ('<f4', '|b1',
    # '<U12', '|S3', '|O'): never a record layout, a comma list or a type name.
    if spec == "|O":
        return np.dtype(object)
    if (
        not isinstance(spec, str)
        or len(spec) < 3
        or spec[0] not in "<>|="
        or spec[1] not in _NUMPY_KINDS
        or not spec[2:].isdigit()
    ):
        raise UnsupportedFormatError(f"the layout names no numpy column dtype: {spec!r}")
    return np.dtype(spec)


# --------------------------------------------------------------------------- pool


def save_batch(
    pool: ArchiveManager,
    batch: Any,
    *,
    step: int,
    name: str | None = None,
    evaluation: bool = False,
    attrs: dict[str, Any] | None = None,
    resume: bool = True,
    task_key_column: str | None = "uid",
) -> Archive:
    """Save a verl `DataProto` as the archive of training step ``step`` (its rollout id),
    named ``name`` (default ``step-{step:06d}``), one sample per row (`to_samples`), the
    layout in ``attrs["verl"]`` beside the caller's ``attrs``.

    ``resume`` (the default) makes a save of a step saved before, by a run resumed from an
    earlier checkpoint that generates it again, supersede it: a published archive of that
    name retained by no other owner is released, and the new one takes the name; the earlier
    one stays on record as ``superseded`` (`ArchiveManager.history`).  With ``resume=False``
    a taken name is refused.

    Every row is encoded before anything is written or released, so a batch that cannot be
    stored leaves the pool as it was.

    Raises:
        InvalidInputError: no DataProto, a column that cannot be stored, ``attrs`` holding
            ``"verl"``.
        UnencodableError: a value of the batch cannot be stored (nothing was written).
        ArchiveRetainedError: other owners retain the step's earlier archive (named).
        ArchiveExistsError, SaveInFlightError: as `ArchiveManager.save`.
        MissingDependencyError: an unsupported verl release is installed.
    """
    from ..pool.writer import ArchiveWriter, prepare_sample

    if attrs is not None and (not isinstance(attrs, dict) or ATTRS_KEY in attrs):
        raise InvalidInputError(f"attrs must be a dict without the key {ATTRS_KEY!r}")
    if not isinstance(resume, bool):
        raise InvalidInputError("resume must be True or False")
    if name is None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInputError(f"step must be an int >= 0, got {step!r}")
        name = f"step-{step:06d}"
    converted = to_samples(batch, task_key_column=task_key_column)
    context = pool.context
    # Encoded first, aliasing the batch's memory (it outlives this call): a value the codec
    # refuses raises here, before a lease, a blob or a release.
    prepared = [
        prepare_sample(context, sample, i, key, copy=False, facts=facts)
        for i, (sample, key, facts) in enumerate(
            zip(converted.samples, converted.task_keys, converted.facts, strict=True)
        )
    ]
    all_attrs = {**(attrs or {}), ATTRS_KEY: converted.layout}

    def open_writer() -> ArchiveWriter:
        return ArchiveWriter(
            pool,
            name,
            rollout_id=step,
            evaluation=evaluation,
            attrs=all_attrs,
            supersede=resume,
        )

    try:
        writer = open_writer()
    except ArchiveRetainedError as exc:
        from .._util.names import archive_owner

        # Published, held by nobody but itself: the lost run's step, which no surviving
        # model trained on.  Released here, then superseded; a kill in between leaves it
        # released, which the next save supersedes the same way.
        if not resume or exc.owners != [archive_owner(name)]:
            raise
        pool.release([name])
        writer = open_writer()
    try:
        for item in prepared:
            writer.add_prepared(item)
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


def load_batch(pool: ArchiveManager, name: str, *, uid: str | None = None) -> Any:
    """The `DataProto` archive ``name`` holds (`save_batch`): all its rows, or with ``uid``
    only those of that prompt group, in batch order (read through the catalog's task keys:
    only the chunks holding them are read).

    Raises:
        ArchiveNotFoundError: no such archive.
        UnsupportedFormatError: the archive holds no verl batch (no ``attrs["verl"]``).
        KeyError: ``uid`` names no row of it.
        MissingDependencyError: verl is not installed, or is an unsupported release.
    """
    archive = pool.open_archive(name)
    layout: Any = (archive.attrs or {}).get(ATTRS_KEY)
    _check_layout(layout)
    samples = archive.load_samples(task_key=uid, materialize=True)
    return from_samples(samples, layout)


# --------------------------------------------------------------------------- trainer


def _is_main_process() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class ArchiveRolloutMixin:
    """Put before verl's ``RayPPOTrainer`` in a subclass's bases; each training step's batch
    is then saved (`save_batch`) as archive ``archive_name.format(step=...)`` (default
    ``step-000012``) with the step as its rollout id, by the main process only, where verl
    dumps its generations: verl calls ``_log_rollout_data`` once per step, after the update,
    when ``trainer.rollout_data_dir`` is set, with the batch holding everything the step
    computed (log-probs, scores, rewards, advantages, returns, reward infos).

    The pool is ``self.archive_pool`` if set, else the pool at ``rollout_data_dir`` (opened,
    created if missing, once).  verl's own JSONL dump is skipped unless
    ``archive_keep_jsonl`` is True (then give a pool of its own: the dump is written to
    ``rollout_data_dir``).  The save's time is added to ``timing_raw["archive_rollout"]``.
    """

    global_steps: int  # RayPPOTrainer's step counter
    archive_pool: ArchiveManager | None = None
    archive_name: str = "step-{step:06d}"
    archive_attrs: dict[str, Any] | None = None
    archive_keep_jsonl: bool = False

    def _log_rollout_data(
        self,
        batch: Any,
        reward_extra_infos_dict: dict[str, Any],
        timing_raw: dict[str, float],
        rollout_data_dir: str,
    ) -> None:
        if _is_main_process():
            started = time.perf_counter()
            pool = self.archive_pool
            if pool is None:
                if self.archive_keep_jsonl:
                    raise InvalidInputError(
                        "archive_keep_jsonl writes verl's JSONL dump to rollout_data_dir: set "
                        "archive_pool to a pool elsewhere"
                    )
                from ..manager import ArchiveManager

                pool = self.archive_pool = ArchiveManager.open(rollout_data_dir)
            step = int(self.global_steps)
            save_batch(
                pool,
                batch,
                step=step,
                name=self.archive_name.format(step=step),
                attrs=self.archive_attrs,
            )
            timing_raw["archive_rollout"] = (
                timing_raw.get("archive_rollout", 0.0) + time.perf_counter() - started
            )
        if self.archive_keep_jsonl:
            parent: Any = super()
            parent._log_rollout_data(batch, reward_extra_infos_dict, timing_raw, rollout_data_dir)
