"""What you save is what you load (issue 24): the holes a hostile search found, one regression
test per item, and Hypothesis round trips of the values those cases used through every way in
and out of a pool: ``save``, the streaming writer (with the producer changing its samples after
``add``), ``load_sample``, ``load_samples(as_arrays=True)``, ``export_pt``/``import_pt`` and the
viewer's JSON.  A value is either stored and loads equal, or refused at save time with an
`UnencodableError` naming the field, leaving the pool as it was
(docs/architecture/samples-and-values.md, "Samples and values").
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import snapshot_pool
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_codec import (
    FLOATS,
    INTS,
    LEAVES,
    NP_SCALARS,
    TEXT,
    VALUES,
    Color,
    assert_same,
    ndarrays,
    tensors,
)

from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.codec import decode_chunk, encode_chunk, materialize_tensor_refs
from archive_manager.errors import UnencodableError
from archive_manager.metadata import describe_sample
from archive_manager.samples import register_sample_class, sample_to_fields
from archive_manager.web import create_app

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
    pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning"),
]

PROPERTY: dict[str, Any] = dict(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fpool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    """One SQLite pool for the module (examples save many small archives into it)."""
    manager = ArchiveManager.open(tmp_path_factory.mktemp("fidelity") / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


_names = itertools.count()


def new_name() -> str:
    return f"f-{next(_names)}"


def load_all(pool: ArchiveManager, name: str, **kw: Any) -> list[Any]:
    return [materialize_tensor_refs(s) for s in pool.open_archive(name).load_samples(**kw)]


def refused_and_unchanged(pool: ArchiveManager, samples: list, match: str) -> None:
    """``save`` refuses with an `UnencodableError` matching ``match``; the pool is as it was."""
    before = snapshot_pool(pool)
    name = new_name()
    with pytest.raises(UnencodableError, match=match):
        pool.save(name, samples, rollout_id=1)
    assert snapshot_pool(pool) == before
    with pytest.raises(UnencodableError, match=match), pool.writer(name, rollout_id=1) as w:
        w.add(samples[0])
    assert snapshot_pool(pool) == before


# --------------------------------------------------------------------------- item 1


def test_writer_stores_what_add_saw_when_the_producer_reuses_its_sample(
    fpool: ArchiveManager,
) -> None:
    sample = Sample(index=0, tokens=[1, 2, 3], reward=0.0, metadata={"step": 0})
    sample.rollout_routed_experts = torch.zeros(4, 8, dtype=torch.int32)  # a tensor blob
    expected = []
    name = new_name()
    with fpool.writer(name, rollout_id=1) as w:
        for step in range(5):
            sample.index = step
            sample.reward = float(step)
            sample.tokens.append(step)
            sample.metadata["step"] = step
            sample.rollout_routed_experts += 1  # in place: the same memory every time
            w.add(sample)
            expected.append(copy.deepcopy(sample))
    loaded = load_all(fpool, name)
    assert_same(loaded, expected)
    arc = fpool.open_archive(name)
    assert [d["reward"] for d in arc.sample_metadata()] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [s.reward for s in arc.load_samples(sample_key="sample:3")] == [3.0]
    # the tensor blobs hold the bytes their digests were taken of, not later ones
    assert fpool.verify(read_data=True).ok


def test_writer_add_refuses_an_unencodable_sample_itself_and_goes_on(
    fpool: ArchiveManager,
) -> None:
    name = new_name()
    with fpool.writer(name, rollout_id=1) as w:
        w.add({"i": 0})
        with pytest.raises(UnencodableError, match=r"sample field 'bad'\[1\]: .*object"):
            w.add({"i": 1, "bad": [1, object()]})
        w.add({"i": 2})
    assert load_all(fpool, name) == [{"i": 0}, {"i": 2}]


# --------------------------------------------------------------------------- item 2


POST_INIT_CALLS: list[str] = []


@dataclasses.dataclass
class Normalised:
    tokens: list[int]
    eos: int = 2

    def __post_init__(self) -> None:
        POST_INIT_CALLS.append("Normalised")
        self.tokens = [*self.tokens, self.eos]  # appends on every construction


@dataclasses.dataclass(frozen=True)
class FrozenWithDerived:
    text: str
    length: int = dataclasses.field(init=False, default=-1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", len(self.text))


@dataclasses.dataclass
class WithInitVar:
    total: int
    bonus: dataclasses.InitVar[int]

    def __post_init__(self, bonus: int) -> None:
        self.total += bonus


@dataclasses.dataclass
class Unset:
    x: int = 0
    later: list = dataclasses.field(init=False)


@dataclasses.dataclass
class Tagged:
    color: Color = Color.RED
    anything: Any = None


@dataclasses.dataclass
class OwnStatus(Sample):
    """A `Sample` subclass that declares ``status`` anew, and an enum field of its own."""

    status: str = "ok"  # type: ignore[assignment]
    color: Color = Color.RED


for _cls in (Normalised, FrozenWithDerived, WithInitVar, Unset, Tagged, OwnStatus):
    register_sample_class(_cls, f"tests.test_fidelity.{_cls.__qualname__}")


def test_dataclasses_load_as_saved_without_running_their_code(fpool: ArchiveManager) -> None:
    saved: list[Any] = [Normalised([5, 6]), FrozenWithDerived("four"), WithInitVar(1, 2)]
    assert saved[0].tokens == [5, 6, 2] and saved[2].total == 3
    name = new_name()
    fpool.save(name, saved, rollout_id=1)
    POST_INIT_CALLS.clear()
    loaded = fpool.open_archive(name).load_samples()
    assert POST_INIT_CALLS == []
    assert loaded == saved
    assert [type(s) for s in loaded] == [Normalised, FrozenWithDerived, WithInitVar]
    assert loaded[0].tokens == [5, 6, 2]
    assert loaded[1].length == 4
    assert loaded[2].total == 3


def test_dataclass_values_that_cannot_load_as_saved_are_refused(fpool: ArchiveManager) -> None:
    refused_and_unchanged(fpool, [Unset()], r"'later' of .*Unset has no value")
    # A str where the class declares a Color: the value a save must refuse.
    wrong: Any = "red"
    refused_and_unchanged(fpool, [Tagged(color=wrong)], r"'color' .* would load as Color.RED")
    # a member of an enum the class declares is stored anywhere, as itself (registering
    # Tagged registered Color: docs/architecture/samples-and-values.md, "Samples and values")
    name = new_name()
    fpool.save(name, [Tagged(anything=Color.BLUE)], rollout_id=1)
    assert fpool.open_archive(name).load_samples()[0].anything is Color.BLUE


# --------------------------------------------------------------------------- item 3


def test_distinct_nan_keys_stay_distinct(fpool: ArchiveManager) -> None:
    a, b = float("nan"), float("nan")
    value = {"d": {a: "a", b: "b"}, "t": {(a, 1): "a", (b, 1): "b"}}
    name = new_name()
    fpool.save(name, [value], rollout_id=1)
    (loaded,) = load_all(fpool, name)
    assert len(loaded["d"]) == 2 and sorted(loaded["d"].values()) == ["a", "b"]
    assert len(loaded["t"]) == 2 and sorted(loaded["t"].values()) == ["a", "b"]


# --------------------------------------------------------------------------- item 4


def test_what_the_decoder_refuses_is_refused_at_save(fpool: ArchiveManager) -> None:
    refused_and_unchanged(
        fpool, [{"t": torch.zeros([1] * 65)}], r"field 't': .*65 dimensions \(at most 64\)"
    )
    big_key = {"d": {torch.arange(100): 1}}  # above the inline limit: a lazy ref as a key
    refused_and_unchanged(fpool, [big_key], r"field 'd'\[tensor.*a tensor cannot be .* key")
    refused_and_unchanged(fpool, [{"d": {(1, torch.ones(1)): 1}}], r"cannot be .* mapping key")
    name = new_name()
    fpool.save(name, [{"t": torch.zeros([1] * 64)}], rollout_id=1)
    assert load_all(fpool, name)[0]["t"].shape == (1,) * 64


# --------------------------------------------------------------------------- item 5


def dag(depth: int) -> list:
    v: list = []
    for _ in range(depth):
        v = [v, v]
    return v


@pytest.mark.timeout(120)
def test_shared_sub_lists_are_stored_as_copies_within_a_bound(fpool: ArchiveManager) -> None:
    name = new_name()
    fpool.save(name, [{"v": dag(10)}], rollout_id=1)  # 2,047 lists: stored as a tree
    assert load_all(fpool, name)[0]["v"] == dag(10)
    # 2**40 lists if expanded (on main this never finished); refused after ~2**20 items, which
    # takes about a second on an idle machine
    started = time.process_time()
    with pytest.raises(UnencodableError, match=r"field 'v'.*more than 1,048,576 items"):
        encode_chunk([{"v": dag(40)}])
    assert time.process_time() - started < 20
    refused_and_unchanged(fpool, [{"v": dag(40)}], r"field 'v'.*more than 1,048,576 items")


def test_the_same_tensor_twice_is_stored_once_and_loads_as_one(fpool: ArchiveManager) -> None:
    """Decided since (docs/architecture/samples-and-values.md, "Samples and values"): one tensor (or
    view) held in several places of a sample loads as one tensor held in those places; equal tensors
    that were distinct objects load as distinct tensors."""
    small, big = torch.arange(4), torch.arange(1000)
    name = new_name()
    saved = {"a": small, "b": small, "x": big, "y": [big], "c": big.clone()}
    fpool.save(name, [saved], rollout_id=1)
    (loaded,) = fpool.open_archive(name).load_samples()
    assert loaded["a"] is loaded["b"] and torch.equal(loaded["a"], small)
    assert loaded["x"] is loaded["y"][0] and torch.equal(loaded["x"].materialize(), big)
    assert loaded["c"] is not loaded["x"] and loaded["c"].digest == loaded["x"].digest


# --------------------------------------------------------------------------- item 6


def test_describe_and_save_raise_library_errors_only(fpool: ArchiveManager) -> None:
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    assert describe_sample({"t": nested})["tensors"]["t"]["shape"] is None
    refused_and_unchanged(fpool, [{"t": nested}], r"field 't': cannot store a nested tensor")
    mixed = [
        torch.ones(2, dtype=torch.float8_e4m3fn),
        torch.ones(2),
        torch.ones(1, dtype=torch.uint32),
    ]
    huge = 10**5000
    name = new_name()
    fpool.save(name, [{"chunks": mixed, "d": {huge: torch.ones(1)}, huge: 1}], rollout_id=1)
    (loaded,) = load_all(fpool, name)
    assert_same(loaded, {"chunks": mixed, "d": {huge: torch.ones(1)}, huge: 1})
    described = fpool.open_archive(name).sample_metadata()[0]["tensors"]
    assert described["chunks"] == {"shape": None, "dtype": None}
    assert "d.<int too large to print>" in described


# --------------------------------------------------------------------------- item 7


def test_show_sums_rewards_past_the_float_range(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("big", [Sample(index=i, reward=1e308) for i in range(2)], rollout_id=1)
    result = CliRunner().invoke(cli, ["--root", str(root), "show", "big"])
    assert result.exit_code == 0, result.output
    assert "mean 1e+308" in result.output
    result = CliRunner().invoke(cli, ["--root", str(root), "show", "big", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["metadata"]["reward"]["mean"] == 1e308


# --------------------------------------------------------------------------- item 8


def test_export_loads_with_weights_only_or_is_refused_naming_the_field(
    fpool: ArchiveManager, tmp_path: Path
) -> None:
    keys: dict[Any, Any] = {np.int64(3): "three", (np.float32(0.5), 1): "half"}  # not str
    sample = Sample(index=1, metadata=keys)
    name = new_name()
    fpool.save(name, [sample], rollout_id=1)
    path = fpool.open_archive(name).export_pt(tmp_path / "ok.pt")
    dumped = torch.load(path, weights_only=True)
    assert dumped["samples"][0]["metadata"] == {3: "three", (0.5, 1): "half"}
    (back,) = fpool.import_pt(path, name=new_name()).load_samples()
    assert back == sample

    name = new_name()
    fpool.save(name, [Sample(index=1, metadata={"n": [1, 2**2040]})], rollout_id=1)
    with pytest.raises(UnencodableError, match=r"sample 0 .* field 'metadata'\['n'\]\[1\]"):
        fpool.open_archive(name).export_pt(tmp_path / "refused.pt")
    assert not list(tmp_path.glob("refused*")) and not list(tmp_path.glob(".refused*"))


# --------------------------------------------------------------------------- format


def test_chunks_of_an_older_release_load_as_its_constructor_path_built_them(
    tmp_path: Path,
) -> None:
    """The chunk format did not change (version 1; nothing new is written): chunks saved by an
    older release load, and rebuilding Samples without their constructor gives what
    ``Sample.from_dict`` (the constructor path older releases used) gives."""
    from helpers import extract_legacy

    with ArchiveManager.open(extract_legacy(tmp_path)) as pool:
        loaded = pool.open_archive("kept").load_samples()
    assert len(loaded) == 6
    for sample in loaded:
        assert type(sample) is Sample
        sample = materialize_tensor_refs(sample)
        assert_same(vars(sample), vars(Sample.from_dict(sample.to_dict())))


# --------------------------------------------------------------------------- generators

FRESH_NAN = st.builds(lambda: float("nan"))  # a new object each time: distinct dict keys
HUGE_INTS = st.one_of(
    st.sampled_from([2**2039 - 1, -(2**2039), 2**63]),
    st.integers(4400, 5000).map(lambda n: 10**n + 7),
)
KEYS = st.one_of(
    TEXT,
    INTS,
    FLOATS,
    FRESH_NAN,
    HUGE_INTS,
    NP_SCALARS,
    st.tuples(FRESH_NAN, st.integers(0, 2)),
    st.tuples(HUGE_INTS, TEXT),
)
HIGH_RANK = st.integers(0, 64).flatmap(
    lambda rank: st.builds(
        lambda dims, dtype: torch.zeros(dims, dtype=dtype),
        st.lists(st.integers(1, 2), min_size=rank, max_size=rank).map(
            lambda d: d if math.prod(d) <= 64 else [1] * len(d)
        ),
        st.sampled_from([torch.float32, torch.int8, torch.bool]),
    )
)
TENSOR_LISTS = st.lists(tensors(), min_size=1, max_size=3)  # any dtypes mixed


@st.composite
def views(draw: st.DrawFn) -> list:
    """Views of one buffer (each a new object, some exactly the same view), held together."""
    base: Any = draw(st.one_of(tensors(), ndarrays()))
    made = [base]
    for kind in draw(st.lists(st.sampled_from(["same", "ellipsis", "slice", "again"]))):
        if kind == "same":
            made.append(base)
        elif kind == "ellipsis":
            made.append(base[...])  # a new object, exactly the same view
        elif kind == "slice" and base.ndim and base.shape[0]:
            made.append(base[1:])
        elif kind == "again":
            made.append(draw(st.sampled_from(made)))
    return made


# Tensors with autograd state: stored as data (what .detach() gives), loaded without it.
GRAD = tensors([torch.float32, torch.float64, torch.complex64]).map(
    lambda t: t.detach().clone().requires_grad_()
)


@st.composite
def shared(draw: st.DrawFn) -> Any:
    """One value placed several times in a list, a tuple and a dict (a DAG, no cycle)."""
    v = draw(st.one_of(VALUES, TENSOR_LISTS, views(), st.dictionaries(KEYS, LEAVES, max_size=3)))
    depth = draw(st.integers(0, 4))
    for _ in range(depth):
        v = draw(st.sampled_from([[v, v], (v, v), {"a": v, "b": [v]}]))
    return v


# Values save must refuse (each with the field named), never store unloadable.
REFUSED = st.one_of(
    st.builds(lambda: torch.zeros([1] * 65)),
    st.builds(lambda: {torch.arange(3): 1}),
    st.builds(lambda: [1, object()]),
    st.builds(lambda: dag(40)),
    st.builds(lambda: torch.nn.Parameter(torch.ones(2))),
    st.builds(lambda: np.ma.masked_array([1, 2], mask=[False, True])),
    st.builds(lambda: np.asmatrix(np.eye(2))),
)
FIELD_VALUES = st.one_of(
    VALUES,
    HUGE_INTS,
    HIGH_RANK,
    TENSOR_LISTS,
    shared(),
    views(),
    GRAD,
    st.dictionaries(KEYS, VALUES, max_size=4),
)


@st.composite
def dataclass_samples(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["normalised", "frozen", "initvar", "tagged", "own-status"]))
    if kind == "own-status":
        status = draw(st.sampled_from(["ok", "completed", *(s.value for s in Sample.Status)]))
        return OwnStatus(
            index=draw(st.integers(0, 9)), status=status, color=draw(st.sampled_from(Color))
        )
    if kind == "normalised":
        return Normalised(draw(st.lists(st.integers(-5, 5), max_size=5)), draw(st.integers()))
    if kind == "frozen":
        return FrozenWithDerived(draw(TEXT))
    if kind == "initvar":
        return WithInitVar(draw(st.integers()), draw(st.integers()))
    return Tagged(draw(st.sampled_from(Color)), draw(FIELD_VALUES))


@st.composite
def any_samples(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["dict", "sample", "dataclass"]))
    if kind == "dict":
        fields = draw(st.dictionaries(st.one_of(TEXT, KEYS), FIELD_VALUES, max_size=4))
        if draw(st.integers(0, 9)) == 0:
            fields["refused"] = draw(REFUSED)
        return fields
    if kind == "dataclass":
        return draw(dataclass_samples())
    sample = Sample(index=draw(st.integers(0, 100)), reward=draw(st.one_of(FLOATS, INTS)))
    for field_name in draw(st.lists(st.sampled_from(["metadata", "tokens", "x_extra"]))):
        setattr(sample, field_name, draw(FIELD_VALUES))
    # the fields a Sample record stores converted, holding what they are meant to or not
    if draw(st.integers(0, 3)) == 0:
        sample.status = draw(st.sampled_from([None, *Sample.Status, "completed"]))
    for helper in ("spec_info", "prefix_cache_info"):
        choice = draw(st.integers(0, 7))
        if choice == 0:
            setattr(sample, helper, None)
        elif choice == 1:
            setattr(sample, helper, draw(st.dictionaries(TEXT, INTS, max_size=3)))
        elif choice == 2:
            getattr(sample, helper).x_extra = draw(FIELD_VALUES)
        elif choice == 3:
            getattr(sample, helper).cached_tokens = draw(FLOATS)
    return sample


# --------------------------------------------------------------------------- oracles


def expected_arrays(sample: Any) -> Any:
    """What ``as_arrays=True`` returns: numeric list fields as ``np.array(that list)``, an
    empty list too (float64: it records no dtype)."""
    _, fields = sample_to_fields(sample)
    out = {}
    for key, value in fields.items():
        if type(value) is list and not value:
            value = np.array(value)
        elif type(value) is list:
            kinds = set(map(type, value))
            if kinds == {int} and min(value) >= -(2**63) and max(value) < 2**63:
                value = np.array(value, dtype=np.int64)
            elif kinds == {float}:
                value = np.array(value, dtype=np.float64)
        out[key] = value
    return out


def native(value: Any) -> Any:
    """What ``export_pt`` writes of a value: numpy as torch / Python numbers, keys included."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if type(value) is dict:
        return {native(k): native(v) for k, v in value.items()}
    if type(value) is list:
        return [native(v) for v in value]
    if type(value) is tuple:
        return tuple(native(v) for v in value)
    return value


def exportable(value: Any) -> bool:
    if type(value) is int:
        return -(2**2039) <= value < 2**2039
    if isinstance(value, np.generic):
        return value.dtype.kind != "c"  # a Python complex, which import_pt cannot store
    if type(value) is dict:
        return all(exportable(k) and exportable(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(exportable(v) for v in value)
    return True


def slime_readable(sample: Any) -> bool:
    """Whether slime's ``from_dict`` (what import_pt reads a dump with) gives ``sample`` back."""
    if not isinstance(sample, Sample):
        return True
    helpers = {"spec_info": Sample.SpecInfo, "prefix_cache_info": Sample.PrefixCacheInfo}
    return sample.status is not None and all(
        type(getattr(sample, k)) is cls
        and set(vars(getattr(sample, k))) == {f.name for f in dataclasses.fields(cls)}
        for k, cls in helpers.items()
    )


def view_groups(value: Any) -> list[int]:
    """For each tensor and array in ``value`` (in order), the position of the first one that
    is the same view of the same buffer: what loads as one object
    (docs/architecture/samples-and-values.md, "Samples and values").  Loaded values share by
    identity, saved ones by view."""
    found: list[Any] = []

    def key(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            where = storage.data_ptr() if storage.nbytes() else id(x)
            return (where, x.storage_offset(), x.shape, x.stride(), x.dtype, x.is_conj())
        return (x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str)

    def walk(v: Any) -> None:
        if isinstance(v, (torch.Tensor, np.ndarray)):
            found.append(key(v))
        elif type(v) is dict:
            for item in v.values():
                walk(item)
        elif type(v) in (list, tuple):
            for item in v:
                walk(item)

    walk(value)
    return [found.index(k) for k in found]


def fields_of(sample: Any) -> dict:
    return sample_to_fields(materialize_tensor_refs(sample))[1]


def saved_or_refused(pool: ArchiveManager, samples: list, **kw: Any) -> str | None:
    """Save; on a refusal check it is an `UnencodableError` that left the pool as it was."""
    before = snapshot_pool(pool)
    name = new_name()
    try:
        pool.save(name, samples, rollout_id=1, **kw)
    except UnencodableError as exc:
        assert "sample field" in str(exc), exc
        assert snapshot_pool(pool) == before
        return None
    return name


def encodable(sample: Any) -> bool:
    try:
        encode_chunk([sample])
    except UnencodableError:
        return False
    return True


# --------------------------------------------------------------------------- properties


@settings(max_examples=60, **PROPERTY)
@given(batch=st.lists(any_samples(), min_size=1, max_size=3))
def test_every_value_save_accepts_loads_equal_everywhere(
    fpool: ArchiveManager, batch: list, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected = copy.deepcopy(batch)
    name = saved_or_refused(fpool, batch)
    if name is None:
        event("refused at save")
        assert not all(encodable(s) for s in expected)
        return
    for sample in expected:
        if (
            isinstance(sample, Sample)
            and not isinstance(sample, OwnStatus)
            and type(sample.status) is str
        ):
            # A status given as its value loads as the member
            # (docs/architecture/samples-and-values.md, "Samples and values"), as slime's own
            # from_dict makes it.
            sample.status = Sample.Status(sample.status)
    arc = fpool.open_archive(name)
    loaded = load_all(fpool, name)
    assert_same(loaded, expected)
    # one tensor or array (or the same view of one buffer) held in several places loads as one
    for got, saved in zip(loaded, batch, strict=True):
        assert view_groups(fields_of(got)) == view_groups(sample_to_fields(saved)[1])
    for position, sample in enumerate(expected):
        assert_same(materialize_tensor_refs(arc.load_sample(position)), sample)
    arrays = arc.load_samples(as_arrays=True)
    for loaded, sample in zip(arrays, expected, strict=True):
        assert_same(fields_of(loaded), expected_arrays(sample))
    # the viewer's JSON of every sample
    client = create_app(fpool).test_client()
    for position in range(len(expected)):
        response = client.get(f"/archive/{name}/sample/{position}?format=json")
        assert response.status_code == 200, response.get_data(as_text=True)[:300]
        json.loads(response.get_data(as_text=True))
    # export_pt: loads with weights_only; Sample objects import back equal
    path = tmp_path_factory.mktemp("export") / "dump.pt"
    if not all(exportable(fields_of(s)) and slime_readable(s) for s in expected):
        event("refused at export")
        with pytest.raises(UnencodableError, match="cannot export sample"):
            arc.export_pt(path)
        return
    arc.export_pt(path)
    dumped = torch.load(path, weights_only=True)["samples"]
    assert_same(dumped, [native(fields_of(s)) for s in expected])
    if all(type(s) is Sample for s in expected):
        event("imported back")
        imported = load_all(fpool, fpool.import_pt(path, name=new_name()).name)
        assert_same([fields_of(s) for s in imported], [native(fields_of(s)) for s in expected])


@settings(max_examples=30, **PROPERTY)
@given(steps=st.lists(st.tuples(FIELD_VALUES, st.floats(-10, 10), st.integers(0, 9)), max_size=6))
def test_writer_stores_each_add_as_it_was_then(fpool: ArchiveManager, steps: list) -> None:
    """A producer that reuses one sample and changes it in place after every ``add``."""
    sample = Sample(index=0, tokens=[], metadata={}, reward=0.0)
    sample.rollout_routed_experts = torch.zeros(2, 40, dtype=torch.int32)
    expected = []
    name = new_name()
    before = snapshot_pool(fpool)
    with fpool.writer(name, rollout_id=1) as w:
        for i, (value, reward, token) in enumerate(steps):
            sample.index = i
            sample.reward = reward
            sample.tokens.append(token)
            sample.rollout_routed_experts[0, 0] = i
            sample.metadata["v"] = value
            if not encodable(sample):
                with pytest.raises(UnencodableError, match="sample field 'metadata'"):
                    w.add(sample)
                continue
            w.add(sample)
            expected.append(copy.deepcopy(sample))
    if not expected:
        return
    assert snapshot_pool(fpool) != before
    assert_same(load_all(fpool, name), expected)
    rewards = [d["reward"] for d in fpool.open_archive(name).sample_metadata()]
    assert rewards == [s.reward for s in expected]


@settings(max_examples=40, **PROPERTY)
@given(sample=dataclass_samples())
def test_registered_dataclasses_round_trip_without_their_code(sample: Any) -> None:
    expected = copy.deepcopy(sample)
    if not encodable(sample):
        return
    POST_INIT_CALLS.clear()
    (loaded,) = decode_chunk(encode_chunk([sample]).data)
    assert POST_INIT_CALLS == []
    assert type(loaded) is type(expected)
    assert_same(materialize_tensor_refs(vars(loaded)), vars(expected))
