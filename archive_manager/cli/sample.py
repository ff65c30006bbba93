"""``archive-manager sample``: one sample, readable in a terminal (or one field raw)."""

from __future__ import annotations

import enum
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._util.lazy_torch import is_tensor
from ..errors import InvalidInputError
from ..lens.tokenizer import TokenDecoder, load_tokenizer
from ..samples import sample_to_fields
from ._complete import complete_archive_name
from ._context import json_option, pass_pool
from ._output import echo, echo_fields, echo_json, terminal_safe

# NOTE: numpy, the codec and the manager are imported by the verb, not by the module: loading
# the CLI (``--help``, a TAB completion) must not import them (docs/architecture/start-up.md,
# "Start-up").
if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = ["sample"]

_TEXTS = ("prompt", "response")


def _plain(value: Any) -> Any:
    """A field's value as JSON data; tensors described, never loaded."""
    import numpy as np

    from ..codec import TensorRef

    if isinstance(value, TensorRef) or is_tensor(value):
        return {"tensor": f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"}
    if isinstance(value, np.ndarray):
        return {"array": f"{value.dtype}{list(value.shape)}"}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": len(value)}
    return repr(value)


def _numbers(value: Any) -> list[float] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


def numeric_summary(fields: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per numeric list field: its length, min, max, mean (finite values), and for 0/1 lists
    the count of ones; per tensor field its dtype and shape (from `describe_sample`)."""
    from ..metadata import describe_sample

    out: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        numbers = _numbers(value)
        if numbers is None:
            continue
        finite = [v for v in numbers if math.isfinite(v)]
        entry: dict[str, Any] = {"length": len(numbers)}
        if finite:
            entry.update(
                min=min(finite), max=max(finite), mean=sum(v / len(finite) for v in finite)
            )
        if set(numbers) <= {0.0, 1.0}:
            entry["ones"] = int(sum(numbers))
        out[name] = entry
    for name, info in describe_sample(fields)["tensors"].items():
        out[name] = {"dtype": info.get("dtype"), "shape": info.get("shape")}
    return out


def response_tokens(fields: dict[str, Any]) -> list[tuple[int, bool | None, float | None]]:
    """``(id, trained, log-prob)`` of each response token (the last ``response_length``
    ids of ``tokens``), from plain lists; empty when the sample has none."""
    tokens = fields.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        return []
    mask = fields.get("loss_mask") if isinstance(fields.get("loss_mask"), list) else None
    log_probs = _numbers(fields.get("rollout_log_probs"))
    length = fields.get("response_length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        length = len(mask) if mask is not None else 0
    ids = tokens[len(tokens) - min(length, len(tokens)) :] if length else []
    return [
        (
            token,
            None if mask is None or i >= len(mask) else bool(mask[i]),
            log_probs[i] if log_probs is not None and i < len(log_probs) else None,
        )
        for i, token in enumerate(ids)
    ]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return "\n".join(f"[{m.get('role', '')}] {m.get('content', '')}" for m in value)
    return json.dumps(_plain(value), indent=2, ensure_ascii=False)


def _block(title: str, text: str | None) -> None:
    echo(f"{title}:")
    if text is None:
        echo("  -")
        return
    # Line by line, so a stored newline stays a line break and every other control
    # character is shown escaped.
    for line in text.split("\n"):
        echo("  " + line)


def _tokens_line(cells: list[tuple[int, bool | None, float | None]], decoder: TokenDecoder) -> str:
    pieces = decoder.pieces([c[0] for c in cells])
    shown = []
    for (token, trained, _), piece in zip(cells, pieces, strict=True):
        text = terminal_safe(piece) if piece is not None else f"<{token}?>"
        shown.append(f"[{text}]" if trained is False else text)
    return "|".join(shown)


@click.command()
@click.argument("name", shell_complete=complete_archive_name)
@click.option("--position", type=click.IntRange(min=0), help="The sample at this position.")
@click.option("--key", "sample_key", help="The sample with this sample key (sample:5).")
@click.option("--field", help="Print only this field, raw (text as stored, else JSON).")
@click.option(
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(path_type=Path),
    help="A local tokenizer.json (or a folder holding one): show the response tokens as "
    "text pieces. Never downloads.",
)
@json_option
@pass_pool
def sample(
    pool: ArchiveManager,
    name: str,
    position: int | None,
    sample_key: str | None,
    field: str | None,
    tokenizer_path: Path | None,
    as_json: bool,
) -> None:
    """One sample of archive NAME (the first, unless --position or --key says which): prompt,
    response, reward, status, keys and a summary of the numeric fields, with control
    characters escaped; --field prints one field raw."""
    if position is not None and sample_key is not None:
        raise click.UsageError("give --position N or --key sample:N, not both")
    if position is None and sample_key is None:
        position = 0  # a first look at an archive needs no option
    if field is not None and (as_json or tokenizer_path is not None):
        raise click.UsageError("--field prints one field raw: no --json or --tokenizer")
    import numpy as np

    from ..codec import TensorRef

    decoder = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    arc = pool.open_archive(name)
    keys = arc.keys()
    if sample_key is not None:
        found = [i for i, (k, _) in enumerate(keys) if k == sample_key]
        if not found:
            raise InvalidInputError(
                f"archive {name!r} has no sample with key {sample_key!r}"
                + ("" if ":" in sample_key else " (sample keys look like 'sample:5')")
            )
        if len(found) > 1:
            listed = ", ".join(map(str, found[:10])) + (", ..." if len(found) > 10 else "")
            raise InvalidInputError(
                f"{len(found)} samples of archive {name!r} have key {sample_key!r} "
                f"(positions {listed}): give --position"
            )
        position = found[0]
    assert position is not None
    if position >= len(keys):
        raise InvalidInputError(
            f"archive {name!r} has no sample at position {position} (it holds {len(keys)})"
        )
    loaded_class, fields = sample_to_fields(arc.load_sample(position))
    # the class the sample was saved as, from its record: the CLI registers no user class,
    # so what it loads is often a dict of the fields of a class it cannot rebuild
    class_name = arc.stored_class(position) or loaded_class
    if field is not None:
        if field not in fields:
            raise InvalidInputError(
                f"sample {position} has no field {field!r}; it has {', '.join(sorted(fields))}"
            )
        value = fields[field]
        if isinstance(value, TensorRef) or is_tensor(value) or isinstance(value, np.ndarray):
            raise InvalidInputError(
                f"field {field!r} is a tensor; export the archive to read its values"
            )
        text = value if isinstance(value, str) else json.dumps(_plain(value), ensure_ascii=False)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    key, task_key = keys[position]
    numeric = numeric_summary(fields)
    cells = response_tokens(fields) if decoder is not None else []
    if as_json:
        out: dict[str, Any] = {
            "archive": arc.name,
            "position": position,
            "sample_key": key,
            "task_key": task_key,
            "class": class_name,
            "status": _plain(fields.get("status")),
            "reward": _plain(fields.get("reward")),
            "prompt": _plain(fields.get("prompt")),
            "response": _plain(fields.get("response")),
            "numeric_fields": numeric,
            "metadata": _plain(fields.get("metadata")),
        }
        if decoder is not None:
            pieces = decoder.pieces([c[0] for c in cells])
            out["response_tokens"] = [
                {"id": t, "text": p, "trained": m, "log_prob": lp}
                for (t, m, lp), p in zip(cells, pieces, strict=True)
            ]
        echo_json(out)
        return
    echo_fields(
        [
            ("archive", arc.name),
            ("position", position),
            ("sample key", key),
            ("task key", task_key),
            ("class", class_name),
            ("status", _plain(fields.get("status"))),
            ("reward", json.dumps(_plain(fields.get("reward")), ensure_ascii=False)),
        ]
    )
    _block("prompt", _text(fields.get("prompt")))
    _block("response", _text(fields.get("response")))
    if numeric:
        echo("numeric fields:")
        for fname, entry in numeric.items():
            echo(f"  {fname}: " + ", ".join(f"{k} {_short(v)}" for k, v in entry.items()))
    if fields.get("metadata"):
        echo("metadata: " + json.dumps(_plain(fields["metadata"]), ensure_ascii=False))
    if decoder is not None:
        if cells:
            echo("response tokens (| between tokens, [..] not trained on: loss mask 0):")
            echo("  " + _tokens_line(cells, decoder))
        else:
            echo("response tokens: none stored as a list of ids")


def _short(value: Any) -> str:
    if isinstance(value, float):
        return format(value, ".4g")
    return str(value)
