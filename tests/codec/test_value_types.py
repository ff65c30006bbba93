"""Types are kept or refused, never downgraded (README, "What you save is what you load";
docs/architecture/samples-and-values.md, "Samples and values"): ndarray and Tensor subclasses are
refused at save, tensors are stored as data, a memory-mapped array as its data, a `Sample` subclass
keeps the types of the fields it declares again, a dict subclass sample keeps its type or is
refused.  Each test failed on the code it was written against, for the reason its docstring
gives ("Claim N" names the claim of the fix it broke).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import refused, round_trip

from archive_manager import ArchiveManager, Sample
from archive_manager.errors import UnencodableError
from archive_manager.samples import register_sample_class

_names = itertools.count()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path_factory.mktemp("fidelity") / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


class LoggedTensor(torch.Tensor):
    pass


class Meters(np.float64):
    pass


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize(
    ("value", "match"),
    [
        (lambda: np.matrix([[1, 2]]), r"numpy.matrix .* subclass.*np.asarray"),
        (lambda: np.ma.masked_array([1, 2], mask=[False, True]), r"MaskedArray .*np.asarray"),
        (lambda: torch.nn.Parameter(torch.ones(2)), r"Parameter .* subclass.*detach\(\)"),
        (lambda: torch.ones(2).as_subclass(LoggedTensor), r"LoggedTensor .*as_subclass"),
        (lambda: Meters(1.5), r"Meters"),
    ],
    ids=["np.matrix", "masked-array", "nn.Parameter", "tensor-subclass", "numpy-scalar-subclass"],
)
def test_claim3_subclasses_are_refused_not_downgraded(pool: ArchiveManager, value, match) -> None:
    """Claim 3: ``np.matrix`` and other ndarray subclasses, ``torch.nn.Parameter`` (its
    requires_grad dropped) and other Tensor subclasses loaded as their base class.  Refused
    at save, naming the field and what to store instead."""
    refused(pool, {"v": [value()]}, rf"sample field 'v'\[0\]: .*{match}")


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim3_tensors_are_stored_as_data(pool: ArchiveManager) -> None:
    """Siblings: a tensor that requires grad (log-probs with their graph) is stored as its
    data, as ``.detach()`` gives it: same values, no autograd state."""
    logits = torch.linspace(-1, 1, 6, requires_grad=True)
    log_probs = torch.log_softmax(logits, 0)  # a non-leaf with a grad_fn
    loaded = round_trip(pool, {"lp": log_probs, "leaf": logits})
    assert torch.equal(loaded["lp"], log_probs.detach()) and not loaded["lp"].requires_grad
    assert loaded["lp"].grad_fn is None and not loaded["leaf"].requires_grad


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim3_a_memory_mapped_array_is_stored_as_its_data(
    pool: ArchiveManager, tmp_path: Path
) -> None:
    """``np.load(..., mmap_mode="r")`` gives an ndarray subclass that only says where the
    bytes live: stored and loaded as a plain array, not refused."""
    np.save(tmp_path / "lp.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    mapped = np.load(tmp_path / "lp.npy", mmap_mode="r")
    loaded = round_trip(pool, {"lp": mapped, "row": mapped[1]})
    assert type(loaded["lp"]) is np.ndarray and type(loaded["row"]) is np.ndarray
    assert np.array_equal(loaded["lp"], mapped) and np.array_equal(loaded["row"], mapped[1])


@dataclasses.dataclass
class StrStatusSample(Sample):
    status: str = "ok"  # type: ignore[assignment]
    level: Level = Level.LOW
    spec_info: dict = dataclasses.field(default_factory=dict)  # type: ignore[assignment]


register_sample_class(StrStatusSample)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim3_sample_subclass_keeps_its_declared_field_types(pool: ArchiveManager) -> None:
    """Claim 3: a `Sample` subclass declaring ``status: str`` got a `Sample.Status` member
    on load (``"completed"``), and its own status values were refused at save (``"ok"`` is
    no Status); a redeclared helper field was turned into a helper.  A field the subclass
    declares again is its own: a plain field of its declared type (an enum field follows
    the registered dataclass rules)."""
    loaded = [
        round_trip(pool, StrStatusSample(status=s, level=Level.HIGH, spec_info={"a": 1}))
        for s in ("ok", "completed")
    ]
    assert [x.status for x in loaded] == ["ok", "completed"]
    assert all(type(x.status) is str and x.level is Level.HIGH for x in loaded)
    assert loaded[0].spec_info == {"a": 1} and type(loaded[0].spec_info) is dict
    # what it still inherits from Sample follows Sample's rules
    assert type(loaded[0].prefix_cache_info) is Sample.PrefixCacheInfo
    # and slime's from_dict, on the subclass
    assert StrStatusSample.from_dict({"status": "ok"}).status == "ok"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make",
    [
        lambda: collections.defaultdict(list, tokens=[1, 2]),
        lambda: collections.OrderedDict(tokens=[1, 2]),
        lambda: collections.Counter(tokens=2),
    ],
    ids=["defaultdict", "OrderedDict", "Counter"],
)
def test_a_dict_subclass_sample_keeps_its_type_or_is_refused(
    pool: ArchiveManager, make: Any
) -> None:
    """Claim 1 (no type lost): a ``defaultdict`` or ``OrderedDict`` *value* inside a sample
    is refused at save (it would load as a plain dict), and ndarray/Tensor subclasses are
    refused rather than loaded as their base class (README), but the same types as the
    *sample itself* are stored silently as ``dict(sample)``: a producer's
    ``defaultdict(list)`` sample loads as a dict, and ``s["missing"].append(...)`` that
    worked before the save raises KeyError after the load."""
    sample = make()
    name = f"map{next(_names)}"
    try:
        pool.save(name, [sample], rollout_id=1)
    except UnencodableError:
        return  # refused, naming the type: fine
    (back,) = pool.open_archive(name).load_samples()
    assert type(back) is type(sample)


# --------------------------------------------------------------------------- numpy text and objects


def same(a: Any, b: Any) -> bool:
    """Deep equality that also checks types, and numpy dtypes and shapes, at every depth."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(same(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
        return bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def objects(items: list[Any]) -> np.ndarray:
    """An object array of ``items`` as verl's collate builds its non-tensor columns
    (``np.fromiter(values, dtype=object)``): one Python object per row, never more dimensions."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def verl_non_tensor_batch(rows: int = 4) -> dict[str, np.ndarray]:
    """The non-tensor part of a verl GRPO batch, column shapes as verl's dataset, rollout and
    reward manager leave them: object arrays of ids, text, chat messages, reward-model dicts,
    token-id lists and per-turn scores; reward-info columns as ``np.array`` makes them."""
    return {
        "uid": objects([f"4f1c-{i // 2}" for i in range(rows)]),
        "data_source": objects(["openai/gsm8k"] * rows),
        "reward_model": objects(
            [{"ground_truth": str(i * 7), "style": "rule"} for i in range(rows)]
        ),
        "raw_prompt": objects(
            [[{"role": "user", "content": f"What is {i} * 7?"}] for i in range(rows)]
        ),
        "raw_prompt_ids": objects([[151644, 872, 198, 1000 + i] for i in range(rows)]),
        "extra_info": objects(
            [{"index": i, "split": "train", "answer": None} for i in range(rows)]
        ),
        "tools_kwargs": objects([{} for _ in range(rows)]),
        "turn_scores": objects([[0.5, 1.0][: i % 3] for i in range(rows)]),
        "index": objects(list(range(rows))),
        "__num_turns__": np.array([2] * rows, dtype=np.int32),
        "pred": np.array([str(i * 7) if i % 2 else "" for i in range(rows)]),  # "<U2"
        "acc": np.array([bool(i % 2) for i in range(rows)]),
        "raw_bytes": np.array([b"ab", b"c", b"", b"d"][:rows]),  # "|S2"
    }


def test_a_verl_batchs_non_tensor_columns_round_trip_with_dtype_and_shape(
    pool: ArchiveManager,
) -> None:
    """Issue 38: 20 of the 23 non-tensor columns of a verl batch were refused (object and
    unicode arrays); the whole ``non_tensor_batch`` is now one storable value."""
    batch = verl_non_tensor_batch()
    loaded = round_trip(pool, {"non_tensor_batch": batch})
    assert same(loaded["non_tensor_batch"], batch)
    assert loaded["non_tensor_batch"]["pred"].dtype.str == "<U2"


def test_a_row_of_a_verl_batch_keeps_numpy_strings(pool: ArchiveManager) -> None:
    """Indexing a reward-info array gives numpy.str_ (a str subclass the error said was
    allowed): stored, and loaded as numpy strings, exactly."""
    batch = verl_non_tensor_batch()
    row = {key: column[1] for key, column in batch.items()}
    assert type(row["pred"]) is np.str_ and type(row["raw_bytes"]) is np.bytes_
    loaded = round_trip(pool, row)
    assert same(loaded, row)
    assert type(loaded["pred"]) is np.str_ and type(loaded["acc"]) is np.bool_


@pytest.mark.parametrize(
    "value",
    [
        objects([objects(["a", 1]), np.arange(3), None]),  # object arrays inside object arrays
        np.array([[{"a": 1}, [1, 2]], [("t", 2), "x"]], dtype=object),  # 2-d
        np.array({"k": "v"}, dtype=object),  # 0-d
        np.empty((0, 3), dtype=object),
        np.array(["", ""]),  # "<U1" whose items are empty
        np.array([], dtype="<U5"),
        np.array([["longer text", "é"], ["ü", "x" * 300]]),
        np.str_("x" * 5000),  # a long text goes to the array section
        np.array(["à", "b"])[::-1],  # a strided view
    ],
    ids=["nested", "2d", "0d", "empty-2d", "empty-strings", "empty-U", "2d-U", "long-str", "view"],
)
def test_numpy_text_and_object_arrays_at_any_shape(pool: ArchiveManager, value: Any) -> None:
    loaded = round_trip(pool, {"v": value, "in": [{"deep": value}]})
    assert same(loaded["v"], value) and same(loaded["in"][0]["deep"], value)


def test_object_arrays_of_unstorable_items_are_refused(pool: ArchiveManager) -> None:
    refused(pool, {"col": objects([object()])}, "cannot store a value of type builtins.object")
    refused(pool, {"col": np.array(["2025-01-01"], dtype="datetime64[D]")}, "dtype datetime64")
