"""What the sample page shows of one loaded sample: pure functions, no I/O, no markup.

Tensor blobs are never read here: shapes and dtypes come from the lazy `TensorRef`s.
Everything returned is plain data that the templates escape.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import numpy as np

from .._util.lazy_torch import is_tensor, torch_module
from ..codec import TensorRef
from ..errors import InvalidInputError
from ..lens.tokenizer import TokenDecoder
from ..metadata import describe_sample
from ..samples import sample_to_fields
from .charts import Chart, logprob_chart

__all__ = [
    "DEFAULT_TOKENS_SHOWN",
    "NotShown",
    "SampleView",
    "TensorInfo",
    "TokenCell",
    "describe_value",
    "jsonable",
    "resolve_tensor",
    "sample_view",
    "tensor_summary",
]

#: Response tokens drawn by default; the rest on request (``?tokens=all``).
DEFAULT_TOKENS_SHOWN = 2048
#: Items of a list shown in the "other fields" JSON before it is cut.
LIST_PREVIEW = 32
#: Values of a tensor listed by its on-demand summary.
TENSOR_PREVIEW = 64
# Ints of up to this many bits have fewer than 4,300 digits, Python's limit for writing them.
_JSON_INT_BITS = 14_000

#: Fields the page shows in their own sections; the rest go to "other fields".
_SHOWN = frozenset(
    {
        "prompt",
        "response",
        "tokens",
        "loss_mask",
        "rollout_log_probs",
        "metadata",
        "train_metadata",
        "status",
        "reward",
        "index",
        "group_index",
        "rollout_id",
        "response_length",
        "label",
    }
)


def _is_tensor(value: object) -> bool:
    return isinstance(value, (TensorRef, np.ndarray)) or is_tensor(value)


def describe_value(value: object) -> str:
    """A tensor or array as ``dtype[shape]`` without loading it."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, TensorRef) or is_tensor(value):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return type(value).__name__


def jsonable(value: Any, *, preview: int | None = None) -> Any:
    """``value`` as JSON data: tensors and arrays described (never loaded), enums as their
    values, times in ISO 8601, non-finite floats as strings; with ``preview``, long lists
    are cut to that many items plus a note."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        # NOTE: JSON writes an int in decimal, which Python refuses past 4,300 digits (the
        # page failed with a ValueError): such ints are shown in hex.
        return value if value.bit_length() <= _JSON_INT_BITS else hex(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if _is_tensor(value):
        return {"tensor": describe_value(value)}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value), preview=preview)
    if isinstance(value, Mapping):
        return {_key_text(k): jsonable(v, preview=preview) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = list(value)
        if preview is not None and len(items) > preview:
            rest = len(items) - preview
            return [jsonable(v, preview=preview) for v in items[:preview]] + [f"… {rest} more"]
        return [jsonable(v, preview=preview) for v in items]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": len(value)}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return repr(value)


def _key_text(key: object) -> str:
    if isinstance(key, int) and not isinstance(key, bool) and key.bit_length() > _JSON_INT_BITS:
        return hex(key)
    try:
        return str(key)
    except ValueError:  # a tuple holding an int of over 4,300 digits
        return repr(jsonable(key))


def pretty_json(value: Any, *, preview: int | None = LIST_PREVIEW) -> str:
    """Indented JSON text of ``value`` for display."""
    return json.dumps(jsonable(value, preview=preview), indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class TokenCell:
    """One response token: its id, whether it is trained on (None: no mask), its log-prob,
    and its text when a tokenizer was given (None: no tokenizer, or an unknown id)."""

    token: int
    trained: bool | None
    log_prob: float | None
    text: str | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor field as the page lists it: no data is loaded."""

    name: str
    dtype: str | None
    shape: list[int] | None
    stored: str
    loaded: bool


@dataclass(frozen=True)
class NotShown:
    """Why a field the page would draw (tokens, loss mask, log-probs) is not drawn; with
    ``tensor``, the field is a tensor blob whose summary can be loaded on demand."""

    reason: str
    tensor: bool = False


@dataclass
class SampleView:
    """Everything the sample page shows, computed from the loaded sample."""

    class_name: str | None
    fields: dict[str, Any]
    status: str | None
    reward: Any
    prompt_text: str | None
    prompt_messages: list[dict[str, str]] | None
    response: str | None
    prompt_tokens: int | None
    response_tokens: int
    trained_tokens: int | None
    tokens: list[TokenCell]
    tokens_hidden: int
    mean_log_prob: float | None
    chart: Chart
    tensors: list[TensorInfo] = field(default_factory=list)
    metadata_json: str | None = None
    train_metadata_json: str | None = None
    other_json: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    #: Fields present but not drawn (tokens, loss_mask, rollout_log_probs) and why.
    not_shown: dict[str, NotShown] = field(default_factory=dict)


def _items(value: object) -> tuple[list[Any] | None, NotShown | None]:
    """The values of a list or an in-chunk tensor, flattened; never reads a blob."""
    if isinstance(value, TensorRef):
        return None, NotShown(
            f"stored as a tensor blob ({describe_value(value)}), not loaded with the page",
            tensor=True,
        )
    if is_tensor(value):
        if value.is_complex():
            return None, NotShown(f"its dtype is {str(value.dtype).removeprefix('torch.')}")
        return value.reshape(-1).tolist(), None
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            return None, NotShown(f"its dtype is {value.dtype}")
        return value.reshape(-1).tolist(), None
    if isinstance(value, (list, tuple)):
        return list(value), None
    return None, NotShown(f"it is a {type(value).__name__}, not a list")


def _brief(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # holds an int of over 4,300 digits
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:39] + "…"


def _int_list(value: object) -> tuple[list[int] | None, NotShown | None]:
    """Whole numbers (token ids, a loss mask), or why they cannot be shown."""
    if value is None:
        return None, None
    items, note = _items(value)
    if items is None:
        return None, note
    out = []
    for i, v in enumerate(items):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):  # bools are ints: a mask of True / False is fine
            return None, NotShown(f"item {i} is {_brief(v)}, not a whole number")
        if v.bit_length() > 64:  # no token id; and past 4,300 digits it cannot be printed
            return None, NotShown(f"item {i} is an int of {v.bit_length()} bits")
        out.append(int(v))
    return out, None


def _float_list(value: object) -> tuple[list[float] | None, NotShown | None]:
    """Numbers (log-probs; NaN and infinities kept), or why they cannot be shown."""
    if value is None:
        return None, None
    items, note = _items(value)
    if items is None:
        return None, note
    out = []
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, NotShown(f"item {i} is {_brief(v)}, not a number")
        try:
            out.append(float(v))
        except OverflowError:
            return None, NotShown(f"item {i} is too large for a float")
    return out, None


def _prompt(value: object) -> tuple[str | None, list[dict[str, str]] | None]:
    if isinstance(value, str):
        return value, None
    if isinstance(value, (list, tuple)) and all(isinstance(m, Mapping) for m in value):
        messages = []
        for m in value:
            content = m.get("content")
            text = content if isinstance(content, str) else pretty_json(content, preview=None)
            messages.append({"role": str(m.get("role", "")), "content": text})
        return None, messages
    if value is None:
        return None, None
    return pretty_json(value, preview=None), None


def _tensors(fields: dict[str, Any]) -> list[TensorInfo]:
    described = describe_sample(fields)["tensors"]
    out = []
    for name, info in described.items():
        top, _, key = name.partition(".")
        value = fields.get(name, fields.get(top))
        if key and isinstance(value, Mapping):
            value = value.get(key)
        parts = value if isinstance(value, (list, tuple)) else [value]
        refs = [p for p in parts if isinstance(p, TensorRef)]
        if refs:
            size = sum(r.nbytes for r in refs)
            stored = f"{len(refs)} tensor blob{'s' if len(refs) > 1 else ''}, {size:,} bytes"
        else:
            stored = "inside the chunk"
        loaded = all(r.loaded for r in refs) if refs else True
        out.append(TensorInfo(name, info.get("dtype"), info.get("shape"), stored, loaded))
    for name, value in fields.items():
        if isinstance(value, np.ndarray):
            out.append(
                TensorInfo(name, str(value.dtype), list(value.shape), "inside the chunk", True)
            )
    return sorted(out, key=lambda t: t.name)


def sample_view(
    sample: Any,
    *,
    tokens: int | None = DEFAULT_TOKENS_SHOWN,
    decoder: TokenDecoder | None = None,
) -> SampleView:
    """What the sample page shows of ``sample`` (a loaded `Sample`, dataclass or dict).

    ``tokens`` caps the response tokens listed one by one (None: all of them); the log-prob
    chart always covers the whole response.  With ``decoder``, each token listed carries its
    text piece.
    """
    class_name, fields = sample_to_fields(sample)
    status = fields.get("status")
    status_text = None if status is None else str(jsonable(status))
    token_ids, tokens_note = _int_list(fields.get("tokens"))
    all_tokens = token_ids or []
    mask, mask_note = _int_list(fields.get("loss_mask"))
    log_probs, log_probs_note = _float_list(fields.get("rollout_log_probs"))
    notes = {"tokens": tokens_note, "loss_mask": mask_note, "rollout_log_probs": log_probs_note}
    length = fields.get("response_length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        length = len(mask) if mask is not None else 0
    length = min(length, len(all_tokens)) if all_tokens else length
    response_ids: Sequence[int] = all_tokens[len(all_tokens) - length :] if length else []
    shown = len(response_ids) if tokens is None else min(tokens, len(response_ids))
    pieces: list[str | None] = (
        decoder.pieces(response_ids[:shown]) if decoder is not None else [None] * shown
    )
    cells = []
    for i in range(shown):
        trained = None if mask is None or i >= len(mask) else bool(mask[i])
        lp = log_probs[i] if log_probs is not None and i < len(log_probs) else None
        cells.append(TokenCell(response_ids[i], trained, lp, pieces[i]))
    finite = [v for v in log_probs or () if math.isfinite(v)]
    prompt_text, messages = _prompt(fields.get("prompt"))
    response = fields.get("response")
    other = {k: v for k, v in fields.items() if k not in _SHOWN and not _is_tensor(v)}
    tensors = _tensors(fields)
    tensor_names = {t.name.partition(".")[0] for t in tensors}
    # Empty fields (None, "", [], {}) say nothing about this sample; slime's Sample has many.
    other = {
        k: v
        for k, v in other.items()
        if k not in tensor_names and not (v is None or (isinstance(v, (str, list, dict)) and not v))
    }
    metadata = fields.get("metadata")
    train_metadata = fields.get("train_metadata")
    reward = fields.get("reward")
    return SampleView(
        class_name=class_name,
        fields=fields,
        status=status_text,
        reward=jsonable(reward),
        prompt_text=prompt_text,
        prompt_messages=messages,
        response=response if isinstance(response, str) else pretty_json(response),
        prompt_tokens=len(all_tokens) - length if all_tokens else None,
        response_tokens=length,
        trained_tokens=sum(1 for v in mask if v) if mask is not None else None,
        tokens=cells,
        tokens_hidden=len(response_ids) - shown,
        # Each term divided first: a sum of huge log-probs would overflow.
        mean_log_prob=sum(v / len(finite) for v in finite) if finite else None,
        chart=logprob_chart(log_probs or [], mask),
        tensors=tensors,
        metadata_json=None if _empty(metadata) else pretty_json(metadata),
        train_metadata_json=None if _empty(train_metadata) else pretty_json(train_metadata),
        other_json=pretty_json(other) if other else None,
        summary={
            k: jsonable(fields.get(k))
            for k in ("index", "group_index", "rollout_id", "label")
            if fields.get(k) is not None
        },
        not_shown={k: note for k, note in notes.items() if note is not None},
    )


def _empty(value: object) -> bool:
    # NOTE: not ``not value``: a tensor of several values has no truth value
    return value is None or (isinstance(value, (str, list, tuple, dict)) and not value)


def resolve_tensor(sample: Any, name: str) -> Any:
    """The tensor field ``name`` of ``sample`` (``field`` or ``field.key`` for a dict of
    tensors), still lazy.

    Raises:
        KeyError: the sample has no tensor of that name.
    """
    _, fields = sample_to_fields(sample)
    top, dot, key = name.partition(".")
    value = fields.get(name) if name in fields else fields.get(top)
    if dot and name not in fields:
        value = value.get(key) if isinstance(value, Mapping) else None
    if _is_tensor(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(_is_tensor(v) for v in value):
        return list(value)
    raise KeyError(f"the sample has no tensor field {name!r}")


def tensor_summary(value: Any) -> dict[str, Any]:
    """Load a tensor (or a list of chunks, concatenated along dim 0) and summarize it:
    dtype, shape, elements, min / max / mean and the first values.  This reads its blob."""
    torch = torch_module()
    parts = value if isinstance(value, list) else [value]
    tensors = []
    for part in parts:
        if isinstance(part, TensorRef):
            part = part.materialize()
        if isinstance(part, np.ndarray):
            part = torch.from_numpy(np.ascontiguousarray(part))
        tensors.append(part)
    try:
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
    except RuntimeError as exc:
        raise InvalidInputError(f"the tensor chunks cannot be joined: {exc}") from exc
    flat = tensor.reshape(-1)
    out: dict[str, Any] = {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "elements": flat.numel(),
        "chunks": len(tensors),
    }
    if flat.numel() and not tensor.is_complex():
        numeric = flat.to(torch.float64)
        out.update(
            min=jsonable(numeric.min().item()),
            max=jsonable(numeric.max().item()),
            mean=jsonable(numeric.mean().item()),
        )
    out["first"] = jsonable(flat[:TENSOR_PREVIEW].tolist())
    return out
